//! The programs in `examples/` run, as a user would run them: each is built
//! by `cargo test` (as every example is) and run here as a process; the
//! PostgreSQL ones on fresh databases of the throw-away cluster.

use std::path::PathBuf;
use std::process::Command;

use crate::postgres;

/// The built example `name` (`target/<profile>/examples/<name>`).
fn example(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary's path");
    // target/<profile>/deps/it-<hash> -> target/<profile>/examples/<name>
    let profile = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("target/<profile>");
    let path = profile.join("examples").join(name);
    assert!(
        path.exists(),
        "{} is not built: `cargo test -p rfidl-examples` builds the examples \
         (or `cargo build -p rfidl-examples --examples`)",
        path.display()
    );
    path
}

/// Runs `name` with `args`; its standard output, or a panic with both streams.
fn run(name: &str, args: &[&str]) -> String {
    let output = Command::new(example(name))
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run the example {name}: {e}"));
    let (stdout, stderr) = (
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    );
    assert!(
        output.status.success(),
        "example {name} failed ({}):\n{stdout}\n{stderr}",
        output.status
    );
    stdout
}

#[test]
fn hello_delivers_each_arrival_once_and_a_second_run_sends_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let dir = dir.path().to_str().expect("utf-8 path");
    for _ in 0..2 {
        let out = run("hello", &[dir]);
        assert!(out.contains("recorded 2 arrivals, each once"), "{out}");
    }
}

#[test]
fn answers_stores_the_typed_answer_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let dir = dir.path().to_str().expect("utf-8 path");
    for _ in 0..2 {
        let out = run("answers", &[dir]);
        assert_eq!(out.trim_end(), format!("Ada: desk 1, floor 1 ({dir})"));
    }
}

#[test]
fn the_postgres_example_runs_on_two_databases() {
    let (Some(greeter), Some(engine)) = (postgres::database(), postgres::database()) else {
        return;
    };
    for _ in 0..2 {
        let out = run("postgres", &[greeter.url(), engine.url()]);
        assert!(out.contains("recorded 2 arrivals, each once"), "{out}");
    }
    let arrivals: i64 = std::thread::scope(|scope| {
        scope
            .spawn(|| {
                engine
                    .connect()
                    .query_one("SELECT count(*) FROM arrivals", &[])
                    .expect("count")
                    .get(0)
            })
            .join()
            .expect("count thread")
    });
    assert_eq!(arrivals, 2, "two runs, each arrival recorded once");
}

#[test]
fn the_axum_sqlx_example_seats_each_newcomer_once_across_runs() {
    let Some(db) = postgres::database() else {
        return;
    };
    for _ in 0..2 {
        let out = run("axum_sqlx", &[db.url()]);
        assert_eq!(out, "Ada: desk 1\nGrace: desk 2\n", "{out}");
    }
    let (desks, requests, sent): (i64, i64, i64) = std::thread::scope(|scope| {
        scope
            .spawn(|| {
                let mut client = db.connect();
                let mut count =
                    |sql: &str| -> i64 { client.query_one(sql, &[]).expect("count").get(0) };
                (
                    count("SELECT count(*) FROM greeter.desks"),
                    count("SELECT count(*) FROM engine.requests"),
                    count("SELECT count(*) FROM engine.outbox_messages WHERE status = 'Sent'"),
                )
            })
            .join()
            .expect("count thread")
    });
    assert_eq!(
        (desks, requests, sent),
        (2, 2, 2),
        "two runs, one message and one desk per newcomer"
    );
}
