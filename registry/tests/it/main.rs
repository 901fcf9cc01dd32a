//! Integration tests for rfidl-registry (one binary): the HTTP API on a real
//! SQLite file and real HTTP on 127.0.0.1, the `rfidl-codegen` client and
//! CLI functions against it, and the registry as a process killed with
//! SIGKILL while builds go on from the lock file and the offline cache.

mod api;
mod bounded;
mod browser;
mod cli_formats;
mod client;
mod closed;
mod dashboard;
mod dashboard_actions;
mod decommission;
mod deploy_check;
mod directory;
mod hostile;
mod issued_keys;
mod liveness;
mod process;
mod replay;
mod routes;
mod signals;
mod support;
