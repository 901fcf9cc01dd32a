//! Graph searches of the checker, kept apart from the language rules:
//! cycles of required record fields (rule 4). Iterative throughout, so a
//! contract with a very long chain of records cannot overflow the stack.

use std::collections::BTreeMap;

use crate::diagnostics::Span;

/// Required-field edges: record -> (record a required field holds, that field's span).
pub(crate) type RequiredEdges = BTreeMap<String, Vec<(String, Span)>>;

/// One cycle of required record fields per strongly connected group of
/// records, starting at the group's first record by name: each step is the
/// record and the span of its field that leads to the next. Iterative, so a
/// long chain of records cannot overflow the stack, and linear in the graph.
pub(crate) fn required_cycles(edges: &RequiredEdges) -> Vec<Vec<(String, Span)>> {
    strongly_connected(edges)
        .into_iter()
        .filter_map(|mut component| {
            component.sort_unstable();
            let start = *component.first()?;
            shortest_cycle(edges, start, &component)
        })
        .collect()
}

/// Strongly connected components (Tarjan), iteratively.
fn strongly_connected(edges: &RequiredEdges) -> Vec<Vec<&str>> {
    const UNVISITED: usize = usize::MAX;
    let nodes: Vec<&str> = edges.keys().map(String::as_str).collect();
    let index_of: BTreeMap<&str, usize> = nodes.iter().enumerate().map(|(i, n)| (*n, i)).collect();
    let successors: Vec<Vec<usize>> = nodes
        .iter()
        .map(|node| {
            edges[*node]
                .iter()
                .filter_map(|(target, _)| index_of.get(target.as_str()).copied())
                .collect()
        })
        .collect();
    let mut index = vec![UNVISITED; nodes.len()];
    let mut lowlink = vec![0; nodes.len()];
    let mut on_stack = vec![false; nodes.len()];
    let mut stack = Vec::new();
    let mut next_index = 0;
    let mut components = Vec::new();
    for root in 0..nodes.len() {
        if index[root] != UNVISITED {
            continue;
        }
        index[root] = next_index;
        lowlink[root] = next_index;
        next_index += 1;
        stack.push(root);
        on_stack[root] = true;
        // (node, position of the next successor to look at)
        let mut work = vec![(root, 0usize)];
        while let Some((node, position)) = work.last().copied() {
            if let Some(&next) = successors[node].get(position) {
                if let Some(top) = work.last_mut() {
                    top.1 += 1;
                }
                if index[next] == UNVISITED {
                    index[next] = next_index;
                    lowlink[next] = next_index;
                    next_index += 1;
                    stack.push(next);
                    on_stack[next] = true;
                    work.push((next, 0));
                } else if on_stack[next] {
                    lowlink[node] = lowlink[node].min(index[next]);
                }
                continue;
            }
            work.pop();
            if let Some(&(parent, _)) = work.last() {
                lowlink[parent] = lowlink[parent].min(lowlink[node]);
            }
            if lowlink[node] == index[node] {
                let mut component = Vec::new();
                while let Some(member) = stack.pop() {
                    on_stack[member] = false;
                    component.push(nodes[member]);
                    if member == node {
                        break;
                    }
                }
                components.push(component);
            }
        }
    }
    components
}

/// The shortest path of required fields from `start` back to itself within
/// `component` (breadth first); `None` for a lone record without a self-edge.
fn shortest_cycle(
    edges: &RequiredEdges,
    start: &str,
    component: &[&str],
) -> Option<Vec<(String, Span)>> {
    // record -> (record before it on the path, the field leading here)
    let mut previous: BTreeMap<&str, (&str, Span)> = BTreeMap::new();
    let mut queue = std::collections::VecDeque::from([start]);
    while let Some(node) = queue.pop_front() {
        for (target, span) in edges.get(node).map(Vec::as_slice).unwrap_or_default() {
            let target = target.as_str();
            if target == start {
                let mut path = vec![(node.to_owned(), *span)];
                let mut at = node;
                while at != start {
                    let (before, field) = previous[at];
                    path.push((before.to_owned(), field));
                    at = before;
                }
                path.reverse();
                return Some(path);
            }
            if component.binary_search(&target).is_ok() && !previous.contains_key(target) {
                previous.insert(target, (node, *span));
                queue.push_back(target);
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::diagnostics::FileId;

    fn span(start: usize) -> Span {
        Span::new(FileId::default(), start, start + 1)
    }

    #[test]
    fn required_cycles_are_found_once_per_group_without_deep_recursion() {
        // A chain of 50,000 records closing on itself: one cycle, and no
        // stack overflow (the search is iterative).
        let count = 50_000;
        let name = |i: usize| format!("p.R{i:06}");
        let mut edges: RequiredEdges = (0..count)
            .map(|i| (name(i), vec![(name((i + 1) % count), span(i))]))
            .collect();
        let cycles = required_cycles(&edges);
        assert_eq!(cycles.len(), 1);
        assert_eq!(cycles[0].len(), count);
        assert_eq!(cycles[0][0].0, name(0));
        // Open the chain: no cycle at all.
        edges.insert(name(count - 1), Vec::new());
        assert!(required_cycles(&edges).is_empty());
    }

    #[test]
    fn required_cycles_report_the_shortest_loop_and_self_references() {
        let edges: RequiredEdges = [
            ("p.A", vec![("p.B", span(1)), ("p.C", span(2))]),
            ("p.B", vec![("p.C", span(3))]),
            ("p.C", vec![("p.A", span(4))]),
            ("p.Selfish", vec![("p.Selfish", span(5))]),
            ("p.Leaf", vec![]),
        ]
        .into_iter()
        .map(|(from, to)| {
            (
                from.to_owned(),
                to.into_iter().map(|(t, s)| (t.to_owned(), s)).collect(),
            )
        })
        .collect();
        let mut cycles = required_cycles(&edges);
        cycles.sort();
        let names: Vec<Vec<&str>> = cycles
            .iter()
            .map(|c| c.iter().map(|(r, _)| r.as_str()).collect())
            .collect();
        assert_eq!(names, vec![vec!["p.A", "p.C"], vec!["p.Selfish"]]);
    }
}
