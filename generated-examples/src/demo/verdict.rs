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
