//! Integration tests for rfidl-runtime (one binary: see house style).
mod interop;
// Receiver side (rt2).
mod exactly_once;
mod receiver_wire;
mod receiver_fixture;
