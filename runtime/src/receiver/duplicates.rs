//! The warning a duplicate delivery gets: one line per message (its id and
//! source), at most [`LINES_PER_MINUTE`] a minute, then one line saying how
//! many were left out. A duplicate is harmless (answered from the inbox, no
//! second effect), but a stream of them says that a sender keeps losing
//! acknowledgements, which an operator wants to see. Never logs a payload.

use std::collections::{HashSet, VecDeque};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Lines a minute, beyond which duplicates are only counted.
pub(crate) const LINES_PER_MINUTE: u32 = 60;
/// How many logged messages are remembered, so that one message delivered
/// again and again is logged once.
const REMEMBERED: usize = 4096;
const WINDOW: Duration = Duration::from_secs(60);

#[derive(Default)]
pub(crate) struct DuplicateLog {
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    order: VecDeque<(String, String)>,
    logged: HashSet<(String, String)>,
    window_started: Option<Instant>,
    lines: u32,
    left_out: u64,
}

impl DuplicateLog {
    /// Notes a duplicate delivery of `message_id` from `source`; returns
    /// whether a line was written for it.
    pub(crate) fn note(&self, source: &str, message_id: &str) -> bool {
        self.note_at(source, message_id, Instant::now())
    }

    fn note_at(&self, source: &str, message_id: &str, now: Instant) -> bool {
        let mut state = self
            .state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let key = (source.to_owned(), message_id.to_owned());
        if state.logged.contains(&key) {
            return false;
        }
        if state
            .window_started
            .is_none_or(|started| now.duration_since(started) >= WINDOW)
        {
            if state.left_out > 0 {
                tracing::warn!(
                    left_out = state.left_out,
                    "more duplicate deliveries in the last minute were not logged one by one"
                );
            }
            state.window_started = Some(now);
            state.lines = 0;
            state.left_out = 0;
        }
        if state.lines >= LINES_PER_MINUTE {
            state.left_out += 1;
            return false;
        }
        state.lines += 1;
        if state.order.len() == REMEMBERED
            && let Some(oldest) = state.order.pop_front()
        {
            state.logged.remove(&oldest);
        }
        state.order.push_back(key.clone());
        state.logged.insert(key);
        tracing::warn!(
            message_id,
            source,
            "duplicate delivery: processed before, answered from the inbox without a second \
             effect (the sender did not get the first acknowledgement)"
        );
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn once_per_message_and_at_most_the_limit_a_minute() {
        let log = DuplicateLog::default();
        let start = Instant::now();
        assert!(log.note_at("hr", "m-1", start));
        assert!(!log.note_at("hr", "m-1", start), "the same message again");
        assert!(log.note_at("engine", "m-1", start), "another source");
        for i in 2..(LINES_PER_MINUTE as usize) {
            assert!(log.note_at("hr", &format!("m-{i}"), start));
        }
        assert!(!log.note_at("hr", "over", start), "over the minute's limit");
        assert!(
            log.note_at("hr", "next", start + WINDOW),
            "a new minute logs again"
        );
    }
}
