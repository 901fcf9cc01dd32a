//! Integration tests for rfidl-runtime (one binary: see house style). Real
//! SQLite files in temp dirs, real HTTP on 127.0.0.1.

mod dispatcher;
mod interop;
mod receiver;
mod support;
