//! Integration tests for rfidl-runtime (one binary: see house style).
mod interop;
