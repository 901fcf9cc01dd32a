//! Integration tests for rfidl-runtime (one binary: see house style).
mod interop;
// Receiver side (rt2).
mod exactly_once;
mod receiver;
mod receiver_fixture;
