//! Limits of the contract language that every layer applies the same way
//! (the parser to contracts, the manifest reader and validator to
//! manifests). The bottom layer: uses nothing.

/// How deep types and braces may nest. Deeper input is refused before any
/// recursive code sees it, so hostile input cannot overflow the stack.
pub const MAX_TYPE_DEPTH: usize = 64;
