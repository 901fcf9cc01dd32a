//! What one scenario came to ([`Report`]): its faults, the verdict from
//! both databases, how long the drain took, and its line in the table.
//! Data and formatting only; it never runs or measures anything itself.

use std::time::Duration;

use rfidl_examples::demo::verdict::Verdict;

/// What one scenario came to.
#[derive(Debug, Default)]
pub(crate) struct Report {
    pub(crate) messages: u32,
    pub(crate) faults: u64,
    pub(crate) verdict: Verdict,
    pub(crate) drained_in: Option<Duration>,
    pub(crate) notes: Vec<String>,
}

impl Report {
    pub(crate) fn ok(&self) -> bool {
        self.drained_in.is_some() && self.verdict.ok()
    }

    pub(crate) fn line(&self, name: &str) -> String {
        let drained = self.drained_in.map_or_else(
            || "NOT DRAINED".to_owned(),
            |d| format!("{:.1}s", d.as_secs_f64()),
        );
        let mut notes = vec![
            format!("failed={}", self.verdict.needs_a_human),
            format!("orphans={}", self.verdict.orphans),
        ];
        notes.extend(self.notes.iter().cloned());
        format!(
            "{name:<17} {:>8} {:>7} {:>5} {:>11} {:>11}  {}{}",
            self.messages,
            self.faults,
            self.verdict.lost,
            self.verdict.duplicated,
            drained,
            notes.join(" "),
            if self.ok() { "" } else { "  <- FAILED" }
        )
    }
}
