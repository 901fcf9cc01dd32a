//! rfidl-runtime
