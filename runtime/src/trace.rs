//! W3C Trace Context (`traceparent`) for messages, so that one trace spans a
//! sender, its receiver and every message the receiver's handler sends on.
//!
//! * [`TraceParent`] parses and formats the `traceparent` header
//!   (`00-<32 hex trace-id>-<16 hex parent-id>-<2 hex flags>`) as the
//!   [W3C Trace Context](https://www.w3.org/TR/trace-context/) recommendation
//!   says: lower-case hex only, all-zero ids and version `ff` refused, a
//!   higher version parsed by its version-00 prefix.
//! * Enqueueing (`Outbox::enqueue`, `Outbox::enqueue_postgres`,
//!   `Outbox::send`, and so generated clients) writes a `traceparent` into
//!   the message's [`headers`](crate::outbox::OutgoingMessage::headers),
//!   stored in the outbox row and sent in the envelope: one already there is
//!   kept as it is; otherwise a child (same trace id, new parent id) of the
//!   [current context](current), when there is one; otherwise a new trace.
//! * The receiver sets the current context to the incoming message's
//!   `traceparent` around its handler call (a new trace when the message
//!   carries none, or a malformed one: never an error), so a handler's
//!   follow-up messages continue the trace. Application code outside a
//!   handler sets it with [`with_traceparent`].
//!
//! The ids also appear as `trace_id` / `parent_id` fields of the runtime's
//! `tracing` spans (`enqueue`, `dispatch`, `receive`, `handler`); see
//! `docs/operations.md`, "Tracing".

use std::cell::Cell;
use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

/// The envelope header that carries the trace context.
pub const TRACEPARENT: &str = "traceparent";

/// A 16-byte trace id (never all zero), shown as 32 lower-case hex digits.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TraceId([u8; 16]);

/// An 8-byte span (parent) id (never all zero), shown as 16 lower-case hex
/// digits.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SpanId([u8; 8]);

/// A parsed `traceparent` header.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct TraceParent {
    trace_id: TraceId,
    parent_id: SpanId,
    flags: u8,
}

/// Why a `traceparent` value was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TraceParentError {
    /// Not `version-traceid-parentid-flags` with the right lengths and dashes.
    #[error("a traceparent is `00-<32 hex>-<16 hex>-<2 hex>`")]
    Shape,
    /// A digit that is not lower-case hex.
    #[error("a traceparent has lower-case hex digits only")]
    NotHex,
    /// Version `ff` (forbidden by the spec).
    #[error("traceparent version ff is invalid")]
    InvalidVersion,
    /// A trace id of 32 zeros.
    #[error("a traceparent's trace id must not be all zeros")]
    ZeroTraceId,
    /// A parent id of 16 zeros.
    #[error("a traceparent's parent id must not be all zeros")]
    ZeroParentId,
}

fn hex_digit(c: u8) -> Result<u8, TraceParentError> {
    match c {
        b'0'..=b'9' => Ok(c - b'0'),
        b'a'..=b'f' => Ok(c - b'a' + 10),
        _ => Err(TraceParentError::NotHex),
    }
}

fn decode<const N: usize>(text: &[u8]) -> Result<[u8; N], TraceParentError> {
    let mut out = [0u8; N];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = (hex_digit(text[2 * i])? << 4) | hex_digit(text[2 * i + 1])?;
    }
    Ok(out)
}

fn write_hex(f: &mut fmt::Formatter<'_>, bytes: &[u8]) -> fmt::Result {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut buffer = [0u8; 32];
    for (i, byte) in bytes.iter().enumerate() {
        buffer[2 * i] = DIGITS[(byte >> 4) as usize];
        buffer[2 * i + 1] = DIGITS[(byte & 0x0f) as usize];
    }
    // Only ASCII hex digits were written.
    f.write_str(std::str::from_utf8(&buffer[..2 * bytes.len()]).map_err(|_| fmt::Error)?)
}

impl TraceId {
    /// A random, non-zero trace id.
    pub fn random() -> Self {
        loop {
            let bytes: [u8; 16] = rand::random();
            if bytes != [0; 16] {
                return TraceId(bytes);
            }
        }
    }

    /// The 16 bytes.
    pub fn to_bytes(self) -> [u8; 16] {
        self.0
    }
}

impl SpanId {
    /// A random, non-zero span id.
    pub fn random() -> Self {
        loop {
            let bytes: [u8; 8] = rand::random();
            if bytes != [0; 8] {
                return SpanId(bytes);
            }
        }
    }

    /// The 8 bytes.
    pub fn to_bytes(self) -> [u8; 8] {
        self.0
    }
}

impl fmt::Display for TraceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_hex(f, &self.0)
    }
}

impl fmt::Debug for TraceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "TraceId({self})")
    }
}

impl fmt::Display for SpanId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_hex(f, &self.0)
    }
}

impl fmt::Debug for SpanId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SpanId({self})")
    }
}

impl TraceParent {
    /// The `sampled` flag (bit 0 of `trace-flags`).
    pub const SAMPLED: u8 = 0x01;

    /// A new trace: random trace and parent ids, flags `01` (sampled).
    pub fn new_root() -> Self {
        TraceParent {
            trace_id: TraceId::random(),
            parent_id: SpanId::random(),
            flags: Self::SAMPLED,
        }
    }

    /// A context from its parts; `None` when an id is all zeros.
    pub fn from_parts(trace_id: [u8; 16], parent_id: [u8; 8], flags: u8) -> Option<Self> {
        (trace_id != [0; 16] && parent_id != [0; 8]).then_some(TraceParent {
            trace_id: TraceId(trace_id),
            parent_id: SpanId(parent_id),
            flags,
        })
    }

    /// Parses a `traceparent` header value (surrounding blanks allowed).
    ///
    /// Version `00` must be exactly 55 characters. A higher version (not
    /// `ff`) is read by its version-00 prefix, which must then end the value
    /// or be followed by `-`, as the spec asks of forward compatibility.
    pub fn parse(text: &str) -> Result<Self, TraceParentError> {
        let bytes = text.trim_matches([' ', '\t']).as_bytes();
        if bytes.len() < 55 {
            return Err(TraceParentError::Shape);
        }
        let version = decode::<1>(&bytes[0..2])?[0];
        if version == 0xff {
            return Err(TraceParentError::InvalidVersion);
        }
        if bytes[2] != b'-' || bytes[35] != b'-' || bytes[52] != b'-' {
            return Err(TraceParentError::Shape);
        }
        if (version == 0 && bytes.len() != 55) || (bytes.len() > 55 && bytes[55] != b'-') {
            return Err(TraceParentError::Shape);
        }
        let trace_id = decode::<16>(&bytes[3..35])?;
        let parent_id = decode::<8>(&bytes[36..52])?;
        let flags = decode::<1>(&bytes[53..55])?[0];
        if trace_id == [0; 16] {
            return Err(TraceParentError::ZeroTraceId);
        }
        if parent_id == [0; 8] {
            return Err(TraceParentError::ZeroParentId);
        }
        Ok(TraceParent {
            trace_id: TraceId(trace_id),
            parent_id: SpanId(parent_id),
            flags,
        })
    }

    /// The trace context of `headers` (the `traceparent` entry, its name
    /// matched without case), if there is a valid one.
    pub fn from_headers(headers: &BTreeMap<String, String>) -> Option<Self> {
        header_value(headers).and_then(|text| Self::parse(text).ok())
    }

    /// The trace this context belongs to.
    pub fn trace_id(&self) -> TraceId {
        self.trace_id
    }

    /// The id of the span (here: the message) that this context names as
    /// the parent of what follows.
    pub fn parent_id(&self) -> SpanId {
        self.parent_id
    }

    /// The `trace-flags` byte.
    pub fn flags(&self) -> u8 {
        self.flags
    }

    /// Whether the caller sampled (recorded) this trace.
    pub fn sampled(&self) -> bool {
        self.flags & Self::SAMPLED != 0
    }

    /// A context for a new hop of the same trace: the same trace id and
    /// flags, a new random parent id.
    pub fn child(&self) -> Self {
        TraceParent {
            trace_id: self.trace_id,
            parent_id: SpanId::random(),
            flags: self.flags,
        }
    }
}

impl TraceParent {
    /// The version-00 header value, as `Display` writes it, built in one
    /// 55-byte buffer (this runs for every enqueued message; going through
    /// `fmt::write` into a growing `String` cost 2k instructions).
    fn header_value(&self) -> String {
        let mut text = Vec::with_capacity(55);
        text.extend_from_slice(b"00-");
        push_hex(&mut text, &self.trace_id.0);
        text.push(b'-');
        push_hex(&mut text, &self.parent_id.0);
        text.push(b'-');
        push_hex(&mut text, &[self.flags]);
        // Only ASCII was written.
        String::from_utf8(text).unwrap_or_else(|_| self.to_string())
    }
}

/// Appends `bytes` in lower-case hexadecimal.
fn push_hex(text: &mut Vec<u8>, bytes: &[u8]) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    for byte in bytes {
        text.push(DIGITS[(byte >> 4) as usize]);
        text.push(DIGITS[(byte & 0x0f) as usize]);
    }
}

impl fmt::Display for TraceParent {
    /// The version-00 header value.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "00-{}-{}-{:02x}",
            self.trace_id, self.parent_id, self.flags
        )
    }
}

impl fmt::Debug for TraceParent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "TraceParent({self})")
    }
}

impl FromStr for TraceParent {
    type Err = TraceParentError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        Self::parse(text)
    }
}

fn header_value(headers: &BTreeMap<String, String>) -> Option<&str> {
    if let Some(value) = headers.get(TRACEPARENT) {
        return Some(value);
    }
    headers
        .iter()
        .find(|(name, _)| name.eq_ignore_ascii_case(TRACEPARENT))
        .map(|(_, value)| value.as_str())
}

thread_local! {
    static CURRENT: Cell<Option<TraceParent>> = const { Cell::new(None) };
}

/// The trace context that messages enqueued on this thread continue: the one
/// set by [`with_traceparent`], or inside a receiver's handler the incoming
/// message's.
pub fn current() -> Option<TraceParent> {
    CURRENT.with(Cell::get)
}

/// Runs `f` with `traceparent` as the [current] context of this thread (and
/// restores the previous one afterwards, also when `f` panics): messages
/// enqueued inside `f` without a `traceparent` header of their own get a
/// child of it. For synchronous code; in `async` code set
/// `OutgoingMessage::headers["traceparent"]` instead.
pub fn with_traceparent<R>(traceparent: TraceParent, f: impl FnOnce() -> R) -> R {
    struct Restore(Option<TraceParent>);
    impl Drop for Restore {
        fn drop(&mut self) {
            CURRENT.with(|current| current.set(self.0));
        }
    }
    let _restore = Restore(CURRENT.with(|current| current.replace(Some(traceparent))));
    f()
}

/// `future`, with `traceparent` as the [current] context of the thread
/// polling it during each poll: what [`with_traceparent`] is for a closure,
/// for an async handler (messages it enqueues continue the trace).
#[cfg(any(feature = "sqlx-postgres", feature = "sqlx-sqlite"))]
pub(crate) fn scope_traceparent<F: std::future::Future>(
    traceparent: TraceParent,
    future: F,
) -> impl std::future::Future<Output = F::Output> {
    let mut future = Box::pin(future);
    std::future::poll_fn(move |cx| with_traceparent(traceparent, || future.as_mut().poll(cx)))
}

/// Gives `headers` a `traceparent` unless it has one (valid or not: what the
/// application wrote is kept): a child of the current context, else a new
/// trace. Returns the context the message carries, if valid.
pub(crate) fn stamp(headers: &mut BTreeMap<String, String>) -> Option<TraceParent> {
    if let Some(text) = header_value(headers) {
        return TraceParent::parse(text).ok();
    }
    let traceparent = current().map_or_else(TraceParent::new_root, |parent| parent.child());
    headers.insert(TRACEPARENT.to_owned(), traceparent.header_value());
    Some(traceparent)
}

/// The context a received message's handler runs in, and the one the
/// message carried: its valid `traceparent`, else a new trace. A malformed
/// value is ignored (logged at `debug`), never an error.
pub(crate) fn received(headers: &BTreeMap<String, String>) -> (TraceParent, Option<TraceParent>) {
    let carried = header_value(headers).and_then(|text| match TraceParent::parse(text) {
        Ok(traceparent) => Some(traceparent),
        Err(reason) => {
            tracing::debug!(%reason, "ignoring a malformed traceparent; a new trace starts");
            None
        }
    });
    (carried.unwrap_or_else(TraceParent::new_root), carried)
}

/// A `tracing` field value that shows an optional id, or nothing.
pub(crate) struct OptionalId<T>(pub Option<T>);

impl<T: fmt::Display> fmt::Display for OptionalId<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            Some(id) => id.fmt(f),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The example of the W3C recommendation, section 3.2.
    const SPEC_EXAMPLE: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn the_spec_examples_parse_and_format_back() {
        let tp = TraceParent::parse(SPEC_EXAMPLE).expect("valid");
        assert_eq!(
            tp.trace_id().to_string(),
            "4bf92f3577b34da6a3ce929d0e0e4736"
        );
        assert_eq!(tp.parent_id().to_string(), "00f067aa0ba902b7");
        assert_eq!(tp.flags(), 1);
        assert!(tp.sampled());
        assert_eq!(tp.to_string(), SPEC_EXAMPLE);
        // The spec's not-sampled example.
        let unsampled = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00";
        let tp: TraceParent = unsampled.parse().expect("valid");
        assert!(!tp.sampled());
        assert_eq!(tp.to_string(), unsampled);
        // Surrounding blanks (OWS) are allowed.
        assert_eq!(
            TraceParent::parse(&format!(" {SPEC_EXAMPLE}\t")).expect("valid"),
            TraceParent::parse(SPEC_EXAMPLE).expect("valid")
        );
    }

    #[test]
    fn invalid_values_are_refused_with_their_reason() {
        use TraceParentError::*;
        let cases: &[(&str, TraceParentError)] = &[
            ("", Shape),
            (
                "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
                Shape,
            ),
            (
                "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-",
                Shape,
            ),
            (
                "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-010",
                Shape,
            ),
            (
                "00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
                Shape,
            ),
            (
                "00-4bf92f3577b34da6a3ce929d0e0e473-600f067aa0ba902b7-01",
                Shape,
            ),
            (
                "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
                NotHex,
            ),
            (
                "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902bz-01",
                NotHex,
            ),
            (
                "0g-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
                NotHex,
            ),
            (
                "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0x",
                NotHex,
            ),
            (
                "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
                InvalidVersion,
            ),
            (
                "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
                ZeroTraceId,
            ),
            (
                "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
                ZeroParentId,
            ),
            // A higher version must not continue without a dash.
            (
                "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01x",
                Shape,
            ),
        ];
        for (text, reason) in cases {
            assert_eq!(TraceParent::parse(text), Err(*reason), "{text:?}");
        }
    }

    #[test]
    fn no_input_makes_the_parser_panic() {
        let valid = SPEC_EXAMPLE.as_bytes();
        let alphabet = ["0", "f", "F", "-", " ", "é", "\u{0}", "ff"];
        for length in 0..=80 {
            for (i, filler) in alphabet.iter().enumerate() {
                // A prefix of a valid value padded with odd characters.
                let mut text: String =
                    String::from_utf8_lossy(&valid[..length.min(valid.len())]).into_owned();
                while text.len() < length {
                    text.push_str(alphabet[(i + text.len()) % alphabet.len()]);
                }
                text.push_str(filler);
                let _ = TraceParent::parse(&text);
            }
        }
    }

    #[test]
    fn a_higher_version_is_read_by_its_version_00_prefix() {
        let tp = TraceParent::parse(
            "cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-what-the-future-holds",
        )
        .expect("forward compatible");
        assert_eq!(tp.to_string(), SPEC_EXAMPLE, "re-emitted as version 00");
        let tp = TraceParent::parse("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
            .expect("exactly 55 characters");
        assert_eq!(tp.to_string(), SPEC_EXAMPLE);
    }

    #[test]
    fn a_child_keeps_the_trace_and_flags_with_a_new_parent() {
        let parent = TraceParent::parse(SPEC_EXAMPLE).expect("valid");
        let child = parent.child();
        assert_eq!(child.trace_id(), parent.trace_id());
        assert_eq!(child.flags(), parent.flags());
        assert_ne!(child.parent_id(), parent.parent_id());
        assert_eq!(TraceParent::parse(&child.to_string()), Ok(child));
        let root = TraceParent::new_root();
        assert_ne!(root.trace_id(), parent.trace_id());
        assert!(root.sampled());
        assert_eq!(TraceParent::parse(&root.to_string()), Ok(root));
    }

    #[test]
    fn the_header_value_is_what_display_writes() {
        for traceparent in [
            TraceParent::parse(SPEC_EXAMPLE).expect("spec"),
            TraceParent::new_root(),
            TraceParent::new_root().child(),
        ] {
            assert_eq!(traceparent.header_value(), traceparent.to_string());
            assert_eq!(traceparent.header_value().len(), 55);
        }
        assert_eq!(
            TraceParent::parse(SPEC_EXAMPLE)
                .expect("spec")
                .header_value(),
            SPEC_EXAMPLE
        );
    }

    #[test]
    fn stamping_keeps_an_existing_header_else_continues_the_current_context() {
        let mut headers = BTreeMap::new();
        headers.insert("TraceParent".to_owned(), SPEC_EXAMPLE.to_owned());
        assert_eq!(stamp(&mut headers), TraceParent::parse(SPEC_EXAMPLE).ok());
        assert_eq!(headers.len(), 1, "not overwritten, not duplicated");

        let mut headers = BTreeMap::from([("traceparent".to_owned(), "garbage".to_owned())]);
        assert_eq!(stamp(&mut headers), None);
        assert_eq!(
            headers["traceparent"], "garbage",
            "the application's value is kept"
        );

        let outer = TraceParent::parse(SPEC_EXAMPLE).expect("valid");
        let stamped = with_traceparent(outer, || {
            assert_eq!(current(), Some(outer));
            let mut headers = BTreeMap::new();
            let stamped = stamp(&mut headers).expect("stamped");
            assert_eq!(headers[TRACEPARENT], stamped.to_string());
            stamped
        });
        assert_eq!(stamped.trace_id(), outer.trace_id());
        assert_ne!(stamped.parent_id(), outer.parent_id());
        assert_eq!(current(), None, "restored after the closure");

        let fresh = stamp(&mut BTreeMap::new()).expect("stamped");
        assert_ne!(
            fresh.trace_id(),
            outer.trace_id(),
            "no context: a new trace"
        );
    }

    #[test]
    fn the_context_is_restored_when_the_closure_panics() {
        let outer = TraceParent::new_root();
        let inner = TraceParent::new_root();
        with_traceparent(outer, || {
            let result = std::panic::catch_unwind(|| with_traceparent(inner, || panic!("boom")));
            assert!(result.is_err());
            assert_eq!(current(), Some(outer));
        });
        assert_eq!(current(), None);
    }
}
