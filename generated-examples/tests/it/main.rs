//! Tests of the checked-in generated code and the demo services.

mod drift;
mod processes;
