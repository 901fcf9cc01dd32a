//! The warning a duplicate delivery gets: one line per message (its id and
//! source), at most [`LINES_PER_MINUTE`] a minute; past that, duplicates are
//! only counted, and the first one noted in a later minute writes one line
//! with how many were `suppressed`. A duplicate is harmless (answered from
//! the inbox, no second effect), but a stream of them says that a sender
//! keeps losing acknowledgements, which an operator wants to see. Never logs
//! a payload.
//!
//! Every way in reaches it through one place, the end of the receiver's
//! `process` (`pipeline.rs`): HTTP single and batch requests, gRPC,
//! in-process, the JetStream and AMQP consumers, and both inbox writers
//! (the blocking stores' writer thread and the sqlx stores' async writer),
//! whether the duplicate was found by the look-up before the writer or by
//! the writer itself (a copy that raced the first).

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
                    suppressed = state.left_out,
                    "duplicate deliveries not logged one by one since the last line (over \
                     {LINES_PER_MINUTE} a minute); rf_inbox_duplicates_total counts every one"
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
    use std::sync::Arc;

    use super::*;

    /// What a `fmt` subscriber writes while `run` runs on this thread, line
    /// by line (the text an operator reads).
    fn logged(run: impl FnOnce()) -> Vec<String> {
        #[derive(Clone, Default)]
        struct Text(Arc<Mutex<Vec<u8>>>);
        impl std::io::Write for Text {
            fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
                let mut text = self.0.lock().unwrap_or_else(|p| p.into_inner());
                text.extend_from_slice(bytes);
                Ok(bytes.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let text = Text::default();
        let writer = text.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .without_time()
            .finish();
        tracing::subscriber::with_default(subscriber, run);
        let text = text.0.lock().unwrap_or_else(|p| p.into_inner()).clone();
        String::from_utf8(text)
            .expect("UTF-8")
            .lines()
            .map(str::to_owned)
            .collect()
    }

    #[test]
    fn a_duplicate_is_one_warn_line_with_its_id_and_source() {
        let log = DuplicateLog::default();
        let start = Instant::now();
        let lines = logged(|| {
            for _ in 0..5 {
                log.note_at("billing", "0193-dup", start);
            }
        });
        assert_eq!(lines.len(), 1, "{lines:#?}");
        assert!(lines[0].starts_with(" WARN "), "{}", lines[0]);
        assert!(lines[0].contains("message_id=\"0193-dup\""), "{}", lines[0]);
        assert!(lines[0].contains("source=\"billing\""), "{}", lines[0]);
    }

    #[test]
    fn a_flood_is_bounded_and_what_was_left_out_is_counted() {
        let log = DuplicateLog::default();
        let start = Instant::now();
        let flood = 10_000;
        let lines = logged(|| {
            for i in 0..flood {
                log.note_at(
                    "billing",
                    &format!("m-{i}"),
                    start + Duration::from_millis(i),
                );
            }
        });
        assert_eq!(lines.len(), LINES_PER_MINUTE as usize, "one minute's lines");
        assert!(lines.iter().all(|line| line.contains("duplicate delivery")));
        // The next minute: the count of those left out, then the new one.
        let lines = logged(|| {
            log.note_at("billing", "later", start + 2 * WINDOW);
        });
        assert_eq!(lines.len(), 2, "{lines:#?}");
        let suppressed = flood - u64::from(LINES_PER_MINUTE);
        assert!(
            lines[0].contains(&format!("suppressed={suppressed}")),
            "{}",
            lines[0]
        );
        assert!(lines[1].contains("message_id=\"later\""), "{}", lines[1]);
    }

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
