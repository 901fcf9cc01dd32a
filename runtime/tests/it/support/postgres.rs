//! A fresh, isolated PostgreSQL database per test, on the real server named
//! by `RFIDL_POSTGRES_URL` (`cargo xtask test` starts a throw-away cluster
//! and sets it; `cargo xtask postgres <command>` does the same for one
//! command; or point it at your own server). See docs/testing.md.
//!
//! [`database`] creates `rfidl_test_<random>` and hands out its URL; the
//! [`TestDatabase`] guard drops it (`WITH (FORCE)`, so open sessions do not
//! keep it) when the test ends, passed or failed. Without the variable a
//! test is skipped loudly, unless `RFIDL_REQUIRE_POSTGRES=1` (set by
//! `cargo xtask test`), which makes it a failure.
//!
//! This file depends on nothing but std and the `postgres` crate, so another
//! test crate can include it instead of copying it:
//! `#[path = "<relative path>/runtime/tests/it/support/postgres.rs"] mod postgres;`.
//!
//! It must never touch a database it did not create. Its administrative
//! statements run on a thread of their own, because the sync `postgres`
//! client cannot run inside a tokio runtime (a `#[tokio::test]` may create
//! a database).

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};

/// An empty database of its own on the tests' PostgreSQL, dropped with the
/// guard.
#[must_use = "the database is dropped with the guard"]
pub struct TestDatabase {
    name: String,
    url: String,
    /// The server's URL as given: where the database is created and dropped.
    admin_url: String,
}

/// A fresh database on the server of `RFIDL_POSTGRES_URL`, or `None` (the
/// test returns, having printed why) when the variable is not set.
///
/// Panics when `RFIDL_REQUIRE_POSTGRES=1` and the variable is missing, or
/// when the server does not accept the `CREATE DATABASE`.
pub fn database() -> Option<TestDatabase> {
    let admin_url = match std::env::var("RFIDL_POSTGRES_URL") {
        Ok(url) if !url.is_empty() => url,
        _ if std::env::var("RFIDL_REQUIRE_POSTGRES").as_deref() == Ok("1") => panic!(
            "RFIDL_REQUIRE_POSTGRES=1 but RFIDL_POSTGRES_URL is not set: run `cargo xtask test` \
             (it starts a throw-away PostgreSQL) or set it to your server's URL"
        ),
        _ => {
            eprintln!(
                "SKIPPED: no PostgreSQL (run `cargo xtask test`, or set RFIDL_POSTGRES_URL; \
                 docs/testing.md)"
            );
            return None;
        }
    };
    let name = unique_name();
    let url = with_database(&admin_url, &name).unwrap_or_else(|| {
        panic!("RFIDL_POSTGRES_URL={admin_url} is not a postgres:// or postgresql:// URL")
    });
    if let Err(e) = administer(&admin_url, format!("CREATE DATABASE \"{name}\"")) {
        panic!("cannot create the test database {name} on RFIDL_POSTGRES_URL={admin_url}: {e}");
    }
    Some(TestDatabase {
        name,
        url,
        admin_url,
    })
}

impl TestDatabase {
    /// The database's URL: the server's URL with the database name replaced.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The database's name, `rfidl_test_<16 hex digits>`.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// A new session on the database. Not on a tokio runtime's thread: the
    /// sync client runs a runtime of its own (use `spawn_blocking`).
    pub fn connect(&self) -> postgres::Client {
        postgres::Client::connect(&self.url, postgres::NoTls)
            .unwrap_or_else(|e| panic!("cannot connect to the test database {}: {e}", self.name))
    }
}

impl Drop for TestDatabase {
    fn drop(&mut self) {
        let sql = format!("DROP DATABASE IF EXISTS \"{}\" WITH (FORCE)", self.name);
        if let Err(e) = administer(&self.admin_url, sql) {
            let message = format!("cannot drop the test database {}: {e}", self.name);
            // A second panic while unwinding would abort and hide the first.
            if std::thread::panicking() {
                eprintln!("{message}");
            } else {
                panic!("{message}");
            }
        }
    }
}

/// Runs `sql` on a session of its own to `admin_url`, on a thread of its
/// own (see the module docs).
fn administer(admin_url: &str, sql: String) -> Result<(), postgres::Error> {
    let admin_url = admin_url.to_owned();
    std::thread::spawn(move || {
        let mut client = postgres::Client::connect(&admin_url, postgres::NoTls)?;
        client.batch_execute(&sql)
    })
    .join()
    .expect("the PostgreSQL administration thread panicked")
}

/// `rfidl_test_` and 64 random bits: distinct across the parallel tests of
/// one binary (the counter) and across test binaries sharing the server
/// (std's per-process random hash keys, and the process id).
fn unique_name() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut hasher = RandomState::new().build_hasher();
    hasher.write_u32(std::process::id());
    hasher.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
    format!("rfidl_test_{:016x}", hasher.finish())
}

/// `url` with its database (the path) replaced by `name`, its query kept;
/// `None` when it is not a `postgres://` or `postgresql://` URL.
fn with_database(url: &str, name: &str) -> Option<String> {
    let (scheme, rest) = url.split_once("://")?;
    if scheme != "postgres" && scheme != "postgresql" {
        return None;
    }
    let (location, query) = match rest.split_once('?') {
        Some((location, query)) => (location, Some(query)),
        None => (rest, None),
    };
    let authority = location.split_once('/').map_or(location, |(a, _)| a);
    let mut result = format!("{scheme}://{authority}/{name}");
    if let Some(query) = query {
        result.push('?');
        result.push_str(query);
    }
    Some(result)
}

#[test]
fn the_database_replaces_the_path_and_keeps_the_rest() {
    let cases = [
        (
            "postgres://rfidl@127.0.0.1:5432/postgres",
            "postgres://rfidl@127.0.0.1:5432/t1",
        ),
        (
            "postgresql://u:p@localhost/postgres?sslmode=disable",
            "postgresql://u:p@localhost/t1?sslmode=disable",
        ),
        ("postgres://localhost", "postgres://localhost/t1"),
        ("postgres://localhost?x=1", "postgres://localhost/t1?x=1"),
    ];
    for (url, expected) in cases {
        assert_eq!(with_database(url, "t1").as_deref(), Some(expected), "{url}");
    }
    assert_eq!(with_database("host=localhost dbname=x", "t1"), None);
    assert_eq!(with_database("mysql://localhost/x", "t1"), None);
}
