//! The exactly-once verdict of a run of the demo services, read from both
//! databases (the chaos harness prints it; see docs/guarantees.md).

use std::path::Path;

use rfidl_runtime::rusqlite::Connection;

/// Counted from both databases.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Verdict {
    pub hires: i64,
    /// Hires without a workflow, plus workflows without a laptop ticket.
    pub lost: i64,
    /// Workflows or tickets beyond one per hire.
    pub duplicated: i64,
    /// Effects whose message id is in no outbox.
    pub orphans: i64,
    /// Outbox rows `Failed`, `DeadLetter` or `Expired`, in either database.
    pub needs_a_human: i64,
}

impl Verdict {
    /// Nothing lost, doubled, orphaned or left for an operator.
    pub fn ok(&self) -> bool {
        self.lost == 0 && self.duplicated == 0 && self.orphans == 0 && self.needs_a_human == 0
    }
}

/// Reads the verdict: HR's database with the engine's attached.
pub fn verdict(hr_db: &Path, engine_db: &Path) -> anyhow::Result<Verdict> {
    let conn = Connection::open(hr_db)?;
    conn.execute("ATTACH DATABASE ?1 AS e", [engine_db.display().to_string()])?;
    let one = |sql: &str| -> anyhow::Result<i64> {
        Ok(conn
            .query_row(sql, [], |r| r.get::<_, Option<i64>>(0))?
            .unwrap_or(0))
    };
    Ok(Verdict {
        hires: one("SELECT COUNT(*) FROM employees")?,
        // `NOT IN (subquery)` builds one temporary index of the subquery:
        // the effect tables have no index on `employee_id`, and a correlated
        // `NOT EXISTS` would scan them once per row (hours at 100,000 hires).
        lost: one(
            "SELECT COUNT(*) FROM employees WHERE id NOT IN (SELECT employee_id FROM e.workflows)",
        )? + one("SELECT COUNT(*) FROM e.workflows \
             WHERE employee_id NOT IN (SELECT employee_id FROM laptop_tickets)")?,
        duplicated: one("SELECT COUNT(*) - COUNT(DISTINCT employee_id) FROM e.workflows")?
            + one("SELECT COUNT(*) - COUNT(DISTINCT employee_id) FROM laptop_tickets")?,
        orphans: one("SELECT COUNT(*) FROM e.workflows \
             WHERE message_id NOT IN (SELECT message_id FROM main.outbox_messages)")?
            + one("SELECT COUNT(*) FROM laptop_tickets \
             WHERE message_id NOT IN (SELECT message_id FROM e.outbox_messages)")?,
        needs_a_human: one(
            "SELECT COUNT(*) FROM main.outbox_messages WHERE status IN ('Failed', 'DeadLetter', 'Expired')",
        )? + one(
            "SELECT COUNT(*) FROM e.outbox_messages WHERE status IN ('Failed', 'DeadLetter', 'Expired')",
        )?,
    })
}

/// [`verdict`] for services on either store: a database that is not a
/// SQLite file (a PostgreSQL one) is first copied, the rows the verdict
/// reads, into a SQLite file in `scratch`, so the counting is the same SQL.
pub fn verdict_of(
    hr: &super::Database,
    engine: &super::Database,
    scratch: &Path,
) -> anyhow::Result<Verdict> {
    let hr_file = local_copy(hr, &scratch.join("verdict-hr.db"))?;
    let engine_file = local_copy(engine, &scratch.join("verdict-engine.db"))?;
    verdict(&hr_file, &engine_file)
}

/// The SQLite file of `database`, or a copy of the verdict's tables.
fn local_copy(database: &super::Database, copy: &Path) -> anyhow::Result<std::path::PathBuf> {
    if let Some(path) = database.sqlite_path() {
        return Ok(path.to_path_buf());
    }
    let _ = std::fs::remove_file(copy);
    let local = Connection::open(copy)?;
    local.execute_batch(
        "CREATE TABLE employees (id TEXT);
         CREATE TABLE workflows (employee_id TEXT, message_id TEXT);
         CREATE TABLE laptop_tickets (employee_id TEXT, message_id TEXT);
         CREATE TABLE outbox_messages (message_id TEXT, status TEXT);",
    )?;
    // Each table the services have; the others stay empty.
    let tables: [(&str, &str); 4] = [
        ("employees", "SELECT id, NULL::TEXT FROM employees"),
        ("workflows", "SELECT employee_id, message_id FROM workflows"),
        (
            "laptop_tickets",
            "SELECT employee_id, message_id FROM laptop_tickets",
        ),
        (
            "outbox_messages",
            "SELECT message_id, status FROM outbox_messages",
        ),
    ];
    let super::Database::Postgres(database) = database else {
        anyhow::bail!("{database} is neither a SQLite file nor a PostgreSQL database");
    };
    let rows = super::pg::rows_of(database, &tables)?;
    let tx = local.unchecked_transaction()?;
    for (table, a, b) in rows {
        match table {
            "employees" => tx.execute("INSERT INTO employees VALUES (?1)", [a])?,
            other => tx.execute(&format!("INSERT INTO {other} VALUES (?1, ?2)"), [a, b])?,
        };
    }
    tx.commit()?;
    Ok(copy.to_path_buf())
}
