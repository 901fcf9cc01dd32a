//! The receiver on sqlx PostgreSQL: the statements of the async writers
//! (`receiver::async_writer`, which runs async handlers in transactions on
//! the caller's pool), and the committed-inbox look-up.
//!
//! A claim inserts the message's inbox row (`ON CONFLICT DO NOTHING`, which
//! waits for a concurrent copy's transaction, on this replica or another);
//! a copy processed already is answered from its row. Several writers
//! (`DEFAULT_WRITERS`) run side by side, each a connection of the pool.

use std::sync::Arc;

use sqlx::Row as _;
use sqlx::postgres::{PgConnection, Postgres};

use crate::BoxFuture;
use crate::inbox::{InboxEntry, InboxError, InboxLookup, RawEntry};
use crate::receiver::async_writer::AsyncInboxStep;
use crate::receiver::writer::{Claim, Delivery};
use crate::receiver::{ReceiverError, Started, WriterParts};
use crate::store::StoreError;

use super::{INBOX_CLAIM, INBOX_CLAIM_ALL, INBOX_LOOKUP, INBOX_RECORD, INBOX_UNCLAIM, PgStore};

/// Starts `writers` writer tasks on the current runtime (the pool's).
pub(crate) fn start(
    store: PgStore,
    writers: usize,
    parts: WriterParts<Postgres>,
) -> Result<Started, ReceiverError> {
    let runtime = tokio::runtime::Handle::try_current().map_err(|_| {
        ReceiverError::Database(StoreError::Postgres {
            target: store.target().to_owned(),
            cause: "a receiver on a sqlx pool must be built on the pool's tokio runtime".to_owned(),
        })
    })?;
    if let Some(lifecycle) = &parts.lifecycle {
        lifecycle.replace(super::lifecycle::read(&store)?);
    }
    crate::receiver::async_writer::start(PgStep(store.clone()), &runtime, writers, parts);
    let reader = SqlxInbox { store, runtime };
    Ok((Arc::new(reader) as Arc<dyn InboxLookup>, Vec::new()))
}

/// The writers' statements on the store.
struct PgStep(PgStore);

impl AsyncInboxStep for PgStep {
    type Store = Postgres;
    type Tx = sqlx::Transaction<'static, Postgres>;

    fn begin(&self) -> BoxFuture<'_, Result<Self::Tx, sqlx::Error>> {
        Box::pin(self.0.pool().begin())
    }

    fn commit(tx: Self::Tx) -> BoxFuture<'static, Result<(), sqlx::Error>> {
        Box::pin(tx.commit())
    }

    fn rollback(tx: Self::Tx) -> BoxFuture<'static, Result<(), sqlx::Error>> {
        Box::pin(tx.rollback())
    }

    fn batch<'a>(
        conn: &'a mut PgConnection,
        sql: &'static str,
    ) -> BoxFuture<'a, Result<(), sqlx::Error>> {
        Box::pin(async move { sqlx::raw_sql(sql).execute(conn).await.map(drop) })
    }

    fn claim<'a>(
        &'a self,
        conn: &'a mut PgConnection,
        delivery: &'a Delivery,
        now: i64,
        expires_at: i64,
    ) -> BoxFuture<'a, Result<Claim, sqlx::Error>> {
        Box::pin(async move {
            let source = delivery.envelope.source_service_id.as_str();
            let claimed = sqlx::query(self.0.sql(INBOX_CLAIM))
                .bind(source)
                .bind(&delivery.message_id)
                .bind(&delivery.envelope.endpoint)
                .bind(&delivery.payload_sha256[..])
                .bind(now)
                .bind(expires_at)
                .execute(&mut *conn)
                .await?;
            if claimed.rows_affected() > 0 {
                return Ok(Claim::Fresh);
            }
            self.existing(conn, delivery).await
        })
    }

    fn claim_all<'a>(
        &'a self,
        conn: &'a mut PgConnection,
        deliveries: &'a [&'a Delivery],
        now: i64,
        expires_at: i64,
    ) -> BoxFuture<'a, Result<Option<Vec<Claim>>, sqlx::Error>> {
        Box::pin(async move {
            let column = |f: fn(&Delivery) -> &str| -> Vec<&str> {
                deliveries.iter().map(|d| f(d)).collect()
            };
            let hashes: Vec<&[u8]> = deliveries.iter().map(|d| &d.payload_sha256[..]).collect();
            let inserted: std::collections::HashSet<(String, String)> =
                sqlx::query_as(self.0.sql(INBOX_CLAIM_ALL))
                    .bind(column(|d| d.envelope.source_service_id.as_str()))
                    .bind(column(|d| d.message_id.as_str()))
                    .bind(column(|d| d.envelope.endpoint.as_str()))
                    .bind(hashes)
                    .bind(now)
                    .bind(expires_at)
                    .fetch_all(&mut *conn)
                    .await?
                    .into_iter()
                    .collect();
            let mut claims = Vec::with_capacity(deliveries.len());
            for delivery in deliveries {
                let key = (
                    delivery.envelope.source_service_id.clone(),
                    delivery.message_id.clone(),
                );
                claims.push(match inserted.contains(&key) {
                    true => Claim::Fresh,
                    false => self.existing(conn, delivery).await?,
                });
            }
            Ok(Some(claims))
        })
    }

    fn unclaim<'a>(
        &'a self,
        conn: &'a mut PgConnection,
        delivery: &'a Delivery,
    ) -> BoxFuture<'a, Result<(), sqlx::Error>> {
        Box::pin(async move {
            sqlx::query(self.0.sql(INBOX_UNCLAIM))
                .bind(delivery.envelope.source_service_id.as_str())
                .bind(&delivery.message_id)
                .execute(conn)
                .await
                .map(drop)
        })
    }

    fn record<'a>(
        &'a self,
        conn: &'a mut PgConnection,
        delivery: &'a Delivery,
        response: &'a str,
    ) -> BoxFuture<'a, Result<(), sqlx::Error>> {
        Box::pin(async move {
            sqlx::query(self.0.sql(INBOX_RECORD))
                .bind(delivery.envelope.source_service_id.as_str())
                .bind(&delivery.message_id)
                .bind(response)
                .execute(conn)
                .await
                .map(drop)
        })
    }
}

impl PgStep {
    /// What the inbox holds for a delivery whose claim inserted nothing: a
    /// committed row (processed before), or none visible yet.
    async fn existing(
        &self,
        conn: &mut PgConnection,
        delivery: &Delivery,
    ) -> Result<Claim, sqlx::Error> {
        let found = sqlx::query(self.0.sql(INBOX_LOOKUP))
            .bind(delivery.envelope.source_service_id.as_str())
            .bind(&delivery.message_id)
            .fetch_optional(conn)
            .await?;
        Ok(match found {
            Some(row) => Claim::Done(raw_entry(&row)),
            None => Claim::InProgress,
        })
    }
}

fn raw_entry(row: &sqlx::postgres::PgRow) -> RawEntry {
    RawEntry {
        endpoint: row.get(0),
        payload_sha256: row.get(1),
        processed_at_ms: row.get(2),
        response: row.get(3),
        expires_at_ms: row.get(4),
    }
}

/// The committed-inbox look-up, on the pool (called on the blocking pool).
struct SqlxInbox {
    store: PgStore,
    runtime: tokio::runtime::Handle,
}

impl InboxLookup for SqlxInbox {
    fn lookup(
        &self,
        source_service_id: &str,
        message_id: &str,
    ) -> Result<Option<InboxEntry>, InboxError> {
        let found = self
            .runtime
            .block_on(
                sqlx::query(self.store.sql(INBOX_LOOKUP))
                    .bind(source_service_id)
                    .bind(message_id)
                    .fetch_optional(self.store.pool()),
            )
            .map_err(|e| InboxError::Postgres {
                target: self.store.target().to_owned(),
                cause: super::error_text(&e),
            })?;
        match found {
            Some(row) => raw_entry(&row)
                .into_entry(source_service_id, message_id)
                .map(Some),
            None => Ok(None),
        }
    }
}
