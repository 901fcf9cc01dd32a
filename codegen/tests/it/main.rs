//! Integration tests for rfidl-codegen (one binary: see house style).
