//! The tests' PostgreSQL harness (support/postgres.rs) on a real server:
//! each test gets a database of its own, and it is gone after the test.

use crate::support::postgres::database;

/// Whether a database named `name` exists on the server at `admin_url`.
fn exists(admin_url: &str, name: &str) -> bool {
    let mut admin = postgres::Client::connect(admin_url, postgres::NoTls).expect("connect");
    admin
        .query_one(
            "SELECT count(*) FROM pg_database WHERE datname = $1",
            &[&name],
        )
        .expect("pg_database")
        .get::<_, i64>(0)
        == 1
}

#[test]
fn each_test_database_is_isolated_and_dropped_with_its_guard() {
    let Some(first) = database() else { return };
    let second = database().expect("the server of the first database");
    assert_ne!(first.name(), second.name());
    assert_ne!(first.url(), second.url());
    let admin_url = std::env::var("RFIDL_POSTGRES_URL").expect("set, as database() returned");

    // The same table in both; a row written in the first only.
    let mut one = first.connect();
    let mut two = second.connect();
    for client in [&mut one, &mut two] {
        client
            .batch_execute("CREATE TABLE probe (id bigint PRIMARY KEY, note text NOT NULL)")
            .expect("create table");
    }
    one.execute("INSERT INTO probe VALUES (1, 'first')", &[])
        .expect("insert");
    let count = |client: &mut postgres::Client| -> i64 {
        client
            .query_one("SELECT count(*) FROM probe", &[])
            .expect("count")
            .get(0)
    };
    assert_eq!(count(&mut one), 1, "the row is where it was written");
    assert_eq!(
        count(&mut two),
        0,
        "the row is absent from the other database"
    );
    let database_of = |client: &mut postgres::Client| -> String {
        client
            .query_one("SELECT current_database()", &[])
            .expect("current_database")
            .get(0)
    };
    assert_eq!(database_of(&mut one), first.name());
    assert_eq!(database_of(&mut two), second.name());

    // Dropped with its guard, even with a session still open on it.
    let name = first.name().to_owned();
    let url = first.url().to_owned();
    assert!(exists(&admin_url, &name));
    drop(first);
    assert!(!exists(&admin_url, &name), "{name} outlived its guard");
    assert!(
        postgres::Client::connect(&url, postgres::NoTls).is_err(),
        "{url} still accepts sessions"
    );
    assert!(
        one.execute("SELECT 1", &[]).is_err(),
        "the session open on the dropped database was ended"
    );
    // The other database is untouched.
    assert_eq!(count(&mut two), 0);
    assert!(exists(&admin_url, second.name()));
}

/// `database()` and the guard's drop run on a tokio runtime thread (the sync
/// client would panic there if they did not use a thread of their own).
#[tokio::test]
async fn a_test_database_works_from_an_async_test() {
    let Some(db) = database() else { return };
    let admin_url = std::env::var("RFIDL_POSTGRES_URL").expect("set, as database() returned");
    let name = db.name().to_owned();
    let url = db.url().to_owned();
    let current = tokio::task::spawn_blocking(move || {
        let mut client = postgres::Client::connect(&url, postgres::NoTls).expect("connect");
        client
            .query_one("SELECT current_database()", &[])
            .expect("current_database")
            .get::<_, String>(0)
    })
    .await
    .expect("join");
    assert_eq!(current, name);
    drop(db);
    let gone = tokio::task::spawn_blocking(move || !exists(&admin_url, &name))
        .await
        .expect("join");
    assert!(gone, "the database outlived its guard");
}
