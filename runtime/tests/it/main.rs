//! Integration tests for rfidl-runtime (one binary: see house style). Real
//! SQLite files in temp dirs, real HTTP on 127.0.0.1.

// The AMQP 1.0 transport against a RabbitMQ node of the test's own.
#[cfg(feature = "amqp")]
mod amqp;
mod config_env;
mod dead_letters;
mod decommission;
mod directory;
mod dispatcher;
// A duplicate delivery's warn line, once per message and bounded (issue 30).
mod duplicate_log;
// Code that reacts to Failed, DeadLetter and Expired messages (issue 30).
mod failures;
mod failures_sqlx;
mod faults;
// The gRPC transport: the HTTP table over gRPC, byte-for-byte answers.
mod grpc;
// rfidl_runtime::Host: the parts started, served and stopped together.
mod host;
// Backups, the restore drill and the incremental vacuum (issue 30, point 5).
mod housekeeping;
mod interop;
mod issued_keys;
// The NATS JetStream transport against a real nats-server.
mod nats;
// A 3-node JetStream cluster losing a node, or the stream's leader (issue 31).
mod nats_cluster;
mod operations;
mod ops_access;
mod postgres_harness;
mod probes;
mod prometheus;
mod receiver;
mod responses;
mod spread;
// The JetStream and AMQP consumers on the sqlx stores.
#[cfg(feature = "amqp")]
mod sqlx_brokers;
// PostgreSQL's own failures on the sqlx store: lost connections
// mid-transaction, replicas migrating one database together.
mod sqlx_faults;
mod sqlx_postgres;
// The async SQLite store on sqlx: the blocking store's file and schema.
mod sqlx_sqlite;
// Durable timers on both sqlx stores.
mod sqlx_timers;
mod support;
// The same bodies on SQLite and PostgreSQL (`stores::on_every_store!`; also
// used by exactly_once, faults, responses and spread); PostgreSQL's own
// failures in sqlx_faults.
mod store_delivery;
mod store_operations;
mod stores;
mod tls;
// Durable timers (`deliver_at`): due-time wake-ups, a SIGKILL before due.
mod timers;
// One W3C trace across sender, receiver and the next hop; the tracing spans.
mod trace_context;
// Receiver side (rt2): exactly-once, the wire's order of checks, batches.
mod exactly_once;
mod hostile;
// What the fuzz found, one test each.
mod hostile_regressions;
// Read timeouts and bounded signature checks (issue 26).
mod hostile_network;
mod receiver_fixture;
mod receiver_wire;
// Faults under SQLite: power loss and a full disk (a fault-injecting VFS).
mod disk_full;
mod faultfs;
mod powerloss;
