//! The lifecycle's statements on sqlx SQLite (those of
//! `store/sqlite/lifecycle.rs`), and the control service as the async
//! receiver runs it, in the receiver's transaction.

use sqlx::Row as _;
use sqlx::sqlite::{Sqlite, SqliteConnection};

use crate::lifecycle::{Applied, HELD_DUE_MS, LifecycleService};
use crate::receiver::{AsyncHostedService, HandlerError, HostedInterface, IncomingCall};

const RECORD_APPLIED: &str = "INSERT INTO rf_lifecycle_applied \
     (interface, version, generation, command, applied_at) VALUES (?1, ?2, ?3, ?4, ?5) \
     ON CONFLICT (interface, version) DO UPDATE SET generation = excluded.generation, \
     command = excluded.command, applied_at = excluded.applied_at \
     WHERE rf_lifecycle_applied.generation < excluded.generation \
     OR (rf_lifecycle_applied.generation = excluded.generation \
         AND rf_lifecycle_applied.command = excluded.command)";
const APPLIED: &str = "SELECT generation, command FROM rf_lifecycle_applied \
     WHERE interface = ?1 AND version = ?2";
const DECOMMISSION: &str = "INSERT INTO rf_decommissioned (interface, version, \
     decommissioned_at) VALUES (?1, ?2, ?3) ON CONFLICT DO NOTHING";
const DECOMMISSIONED_AT: &str = "SELECT decommissioned_at FROM rf_decommissioned \
     WHERE interface = ?1 AND version = ?2";
const HOLD: &str = "UPDATE outbox_messages SET next_retry_at = ?3, last_error = ?4 \
     WHERE status IN ('Pending', 'Sending') AND status = 'Pending' \
     AND interface = ?1 AND version = ?2 AND next_retry_at < ?3";
const RECOMMISSION: &str = "DELETE FROM rf_decommissioned WHERE interface = ?1 \
     AND version = ?2 RETURNING decommissioned_at";
const RELEASE: &str = "UPDATE outbox_messages SET next_retry_at = ?3, \
     expires_at = expires_at + ?4, last_error = ?5 \
     WHERE status IN ('Pending', 'Sending') AND status = 'Pending' \
     AND interface = ?1 AND version = ?2 AND next_retry_at >= ?6";

/// The control service; it writes through the receiver's connection.
pub(crate) struct AsyncLifecycle {
    pub service: LifecycleService,
}

impl AsyncHostedService<Sqlite> for AsyncLifecycle {
    fn interfaces(&self) -> &[HostedInterface] {
        std::slice::from_ref(&crate::lifecycle::HOSTED)
    }

    fn handle<'a>(
        &'a self,
        call: &'a IncomingCall<'a>,
        conn: &'a mut SqliteConnection,
    ) -> crate::BoxFuture<'a, Result<serde_json::Value, HandlerError>> {
        Box::pin(async move {
            let (command, target, generation) = self.service.command(call)?;
            let now = crate::store::now_ms();
            let applied = Applied {
                interface: target.interface.as_str(),
                version: target.version,
                generation,
                command: command.endpoint(),
                at: now,
            };
            let failed = |e: sqlx::Error| HandlerError::from(super::SqliteStore::statement(&e));
            let version = i64::from(applied.version);
            let recorded = sqlx::query(RECORD_APPLIED)
                .bind(applied.interface)
                .bind(version)
                .bind(applied.generation)
                .bind(applied.command)
                .bind(applied.at)
                .execute(&mut *conn)
                .await
                .map_err(failed)?;
            if recorded.rows_affected() == 0 {
                let row = sqlx::query(APPLIED)
                    .bind(applied.interface)
                    .bind(version)
                    .fetch_one(&mut *conn)
                    .await
                    .map_err(failed)?;
                return Err(LifecycleService::stale(
                    command,
                    &target,
                    Some((row.get(0), row.get(1))),
                ));
            }
            let interface = applied.interface;
            if command == crate::lifecycle::Command::Decommission {
                sqlx::query(DECOMMISSION)
                    .bind(interface)
                    .bind(version)
                    .bind(now)
                    .execute(&mut *conn)
                    .await
                    .map_err(failed)?;
                let at: i64 = sqlx::query(DECOMMISSIONED_AT)
                    .bind(interface)
                    .bind(version)
                    .fetch_one(&mut *conn)
                    .await
                    .map_err(failed)?
                    .get(0);
                let held = sqlx::query(HOLD)
                    .bind(interface)
                    .bind(version)
                    .bind(HELD_DUE_MS)
                    .bind(crate::lifecycle::held_reason(interface, target.version))
                    .execute(&mut *conn)
                    .await
                    .map_err(failed)?
                    .rows_affected();
                Ok(self.service.done(command, &target, at, held))
            } else {
                let since: Option<i64> = sqlx::query(RECOMMISSION)
                    .bind(interface)
                    .bind(version)
                    .fetch_optional(&mut *conn)
                    .await
                    .map_err(failed)?
                    .map(|row| row.get(0));
                let shift = since.map_or(0, |since| (now - since).max(0));
                let released = sqlx::query(RELEASE)
                    .bind(interface)
                    .bind(version)
                    .bind(now)
                    .bind(shift)
                    .bind(format!(
                        "released: {interface} v{} was re-commissioned",
                        target.version
                    ))
                    .bind(HELD_DUE_MS)
                    .execute(&mut *conn)
                    .await
                    .map_err(failed)?
                    .rows_affected();
                Ok(self.service.done(command, &target, now, released))
            }
        })
    }
}
