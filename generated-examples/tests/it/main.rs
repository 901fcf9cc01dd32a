//! Tests of the checked-in generated code and the demo services.

mod demo;
mod drift;
mod examples;
mod generated_aio;
// The engine's failure handler: a ticket for a human (issue 30).
mod human_tickets;
mod ops_access;
mod postgres_processes;
mod processes;
mod registration;
mod signals;
mod timers;
mod verdict;

/// Fresh databases on the tests' PostgreSQL (the runtime's support file).
#[allow(dead_code)] // the file serves several test crates
#[path = "../../../runtime/tests/it/support/postgres.rs"]
mod postgres;
