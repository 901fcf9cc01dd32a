//! Integration tests for rfidl-runtime (one binary: see house style). Real
//! SQLite files in temp dirs, real HTTP on 127.0.0.1.

mod directory;
mod dispatcher;
mod faults;
mod interop;
mod operations;
mod ops_access;
mod prometheus;
mod receiver;
mod support;
mod tls;
// Receiver side (rt2): exactly-once, the wire's order of checks, batches.
mod exactly_once;
mod receiver_fixture;
mod receiver_wire;
