//! The two seams between the broker consumers and a store, each written
//! once per store in its folder (`store/<name>/answers.rs`):
//!
//! * [`AnswerStore`]: an answers consumer records an answer (the row's
//!   marker, its response and the response handler's writes, in one
//!   transaction of the sender's database);
//! * [`TerminatedStore`]: an inbound consumer records a delivery it gave
//!   up on in `rf_terminated`.
//!
//! Both are async: the consumers await them whatever the store. A store
//! whose transactions block runs its statements on the blocking pool
//! ([`OnBlockingPool`], [`BlockingTerminated`]); a sqlx store awaits them
//! on its pool ([`OnPool`], over its [`AsyncAnswerStatements`]). The
//! inbox of an inbound delivery is the receiver's, on every store.

use std::sync::{Arc, Mutex};

use super::{BrokerError, Published, Recorded, TerminatedRow};
use crate::BoxFuture;
use crate::responses::ResponseHandler;
use crate::store::Store;

/// The sender's database, as an answers consumer uses it, with the
/// response handlers it runs.
pub(crate) trait AnswerStore: Send + Sync + 'static {
    /// In one transaction: the row's marker and response, and its
    /// handler's writes.
    fn record<'a>(&'a self, published: &'a Published) -> BoxFuture<'a, Recorded>;
    /// Keeps why an answer was given up in the row's `last_error`.
    fn note_failure<'a>(&'a self, message_id: &'a str, error: &'a str) -> BoxFuture<'a, ()>;
}

/// A blocking store's answers statements, run by [`OnBlockingPool`].
pub(crate) trait BlockingAnswers<S: Store>: Send + Sync + 'static {
    /// [`AnswerStore::record`], blocking.
    fn record(&self, handlers: &[Arc<dyn ResponseHandler<S>>], published: &Published) -> Recorded;
    /// [`AnswerStore::note_failure`], blocking.
    fn note_failure(&self, message_id: &str, error: &str);
}

/// A blocking store's [`AnswerStore`]: its statements and handlers on the
/// blocking pool.
pub(crate) struct OnBlockingPool<S: Store> {
    statements: Arc<dyn BlockingAnswers<S>>,
    handlers: Arc<[Arc<dyn ResponseHandler<S>>]>,
}

impl<S: Store> OnBlockingPool<S> {
    pub(crate) fn new(
        statements: impl BlockingAnswers<S>,
        handlers: Vec<Arc<dyn ResponseHandler<S>>>,
    ) -> Self {
        Self {
            statements: Arc::new(statements),
            handlers: handlers.into(),
        }
    }
}

impl<S: Store> AnswerStore for OnBlockingPool<S> {
    fn record<'a>(&'a self, published: &'a Published) -> BoxFuture<'a, Recorded> {
        let (statements, handlers) = (self.statements.clone(), self.handlers.clone());
        let published = published.clone();
        Box::pin(async move {
            tokio::task::spawn_blocking(move || statements.record(&handlers, &published))
                .await
                .unwrap_or_else(|_| Recorded::Failed("the response handler panicked".to_owned()))
        })
    }

    fn note_failure<'a>(&'a self, message_id: &'a str, error: &'a str) -> BoxFuture<'a, ()> {
        let statements = self.statements.clone();
        let (message_id, error) = (message_id.to_owned(), error.to_owned());
        Box::pin(async move {
            let _ =
                tokio::task::spawn_blocking(move || statements.note_failure(&message_id, &error))
                    .await;
        })
    }
}

/// Where an inbound consumer records the deliveries it gives up on.
pub(crate) trait TerminatedStore: Send + Sync + 'static {
    /// Writes the `rf_terminated` row (idempotent per stream and
    /// sequence).
    fn record(&self, row: TerminatedRow) -> BoxFuture<'_, Result<(), BrokerError>>;
}

/// A blocking store's [`TerminatedStore`]: one connection, its insert run
/// on the blocking pool.
pub(crate) struct BlockingTerminated<C> {
    conn: Arc<Mutex<C>>,
    insert: fn(&mut C, &TerminatedRow) -> Result<(), String>,
}

impl<C: Send + 'static> BlockingTerminated<C> {
    pub(crate) fn new(conn: C, insert: fn(&mut C, &TerminatedRow) -> Result<(), String>) -> Self {
        Self {
            conn: Arc::new(Mutex::new(conn)),
            insert,
        }
    }
}

impl<C: Send + 'static> TerminatedStore for BlockingTerminated<C> {
    fn record(&self, row: TerminatedRow) -> BoxFuture<'_, Result<(), BrokerError>> {
        let (conn, insert) = (self.conn.clone(), self.insert);
        Box::pin(async move {
            tokio::task::spawn_blocking(move || {
                let mut conn = conn.lock().map_err(|_| BrokerError::from("poisoned"))?;
                insert(&mut conn, &row).map_err(BrokerError)
            })
            .await
            .map_err(|e| BrokerError(e.to_string()))?
        })
    }
}

/// The terminated-deliveries table of `database`'s store.
pub(crate) fn open_terminated(
    database: &crate::Database,
) -> Result<Arc<dyn TerminatedStore>, crate::store::StoreError> {
    use crate::store::sealed::Common as _;
    match database {
        crate::Database::Sqlite(_) => crate::store::Sqlite::open_terminated(database),
        #[cfg(feature = "sqlx-postgres")]
        crate::Database::SqlxPostgres(_) => sqlx::Postgres::open_terminated(database),
        #[cfg(feature = "sqlx-sqlite")]
        crate::Database::SqlxSqlite(_) => sqlx::Sqlite::open_terminated(database),
    }
}

#[cfg(any(feature = "sqlx-postgres", feature = "sqlx-sqlite"))]
pub(crate) use on_pool::{AsyncAnswerStatements, OnPool, row_of};

#[cfg(any(feature = "sqlx-postgres", feature = "sqlx-sqlite"))]
mod on_pool {
    use std::ops::DerefMut;
    use std::sync::Arc;

    use super::AnswerStore;
    use crate::BoxFuture;
    use crate::broker::{Published, Recorded, Row, answer_of, precheck, traceparent_of};
    use crate::responses::AsyncResponseHandler;
    use crate::store::AsyncStore;

    /// The connection of `T`'s store.
    type Conn<T> = <<T as AsyncAnswerStatements>::Store as AsyncStore>::Connection;

    /// A sqlx store's answers statements, awaited by [`OnPool`] in one
    /// transaction of its pool.
    pub(crate) trait AsyncAnswerStatements: Send + Sync + 'static {
        /// The store whose response handlers run here.
        type Store: AsyncStore;
        /// A write transaction on a connection of the pool.
        type Tx: DerefMut<Target = Conn<Self>> + Send;

        /// Begins a write transaction.
        fn begin(&self) -> BoxFuture<'_, Result<Self::Tx, sqlx::Error>>;

        fn commit(tx: Self::Tx) -> BoxFuture<'static, Result<(), sqlx::Error>>;

        /// The outbox row of `message_id`, locked against a concurrent
        /// recording of the same answer until the transaction ends.
        fn row<'a>(
            &'a self,
            conn: &'a mut Conn<Self>,
            message_id: &'a str,
        ) -> BoxFuture<'a, Result<Option<Row>, sqlx::Error>>;

        /// Sets the row's marker and stores its response.
        fn mark<'a>(
            &'a self,
            conn: &'a mut Conn<Self>,
            message_id: &'a str,
            now: i64,
            response: &'a str,
        ) -> BoxFuture<'a, Result<(), sqlx::Error>>;

        /// Keeps `error` in the row's `last_error` (on the pool, in no
        /// transaction of the caller's).
        fn note_failure<'a>(
            &'a self,
            message_id: &'a str,
            error: &'a str,
        ) -> BoxFuture<'a, Result<(), sqlx::Error>>;
    }

    /// The outbox row of an answer, from its columns `status, answered,
    /// interface, version, endpoint, correlation_id, headers` (the same
    /// on both sqlx stores).
    pub(crate) fn row_of<R: sqlx::Row>(r: &R) -> Result<Row, sqlx::Error>
    where
        usize: sqlx::ColumnIndex<R>,
        for<'r> String: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
        for<'r> bool: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
        for<'r> i64: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    {
        Ok(Row {
            status: r.try_get(0)?,
            answered: r.try_get(1)?,
            interface: r.try_get(2)?,
            version: u32::try_from(r.try_get::<i64, _>(3)?).unwrap_or(0),
            endpoint: r.try_get(4)?,
            correlation_id: r.try_get(5)?,
            headers: r.try_get(6)?,
        })
    }

    /// A sqlx store's [`AnswerStore`]: its statements and async handlers
    /// in one transaction of its pool.
    pub(crate) struct OnPool<T: AsyncAnswerStatements> {
        statements: T,
        handlers: Vec<Arc<dyn AsyncResponseHandler<T::Store>>>,
    }

    impl<T: AsyncAnswerStatements> OnPool<T> {
        pub(crate) fn new(
            statements: T,
            handlers: Vec<Arc<dyn AsyncResponseHandler<T::Store>>>,
        ) -> Self {
            Self {
                statements,
                handlers,
            }
        }

        async fn try_record(&self, published: &Published) -> Result<Recorded, sqlx::Error> {
            let id = published.message_id.as_str();
            let mut tx = self.statements.begin().await?;
            let row = self.statements.row(&mut tx, id).await?;
            let (row, payload) = match precheck(row, published) {
                Ok(ready) => ready,
                // Dropping `tx` rolls it back.
                Err(done) => return Ok(done),
            };
            let response = serde_json::to_string(&payload).unwrap_or_default();
            let now = crate::store::now_ms();
            self.statements.mark(&mut tx, id, now, &response).await?;
            let handler = self
                .handlers
                .iter()
                .find(|h| h.interface() == (row.interface.as_str(), row.version));
            if let Some(handler) = handler {
                let answer = answer_of(&row, id, &payload);
                let handled = handler.handle(&answer, &mut tx);
                let handled = match traceparent_of(&row) {
                    Some(traceparent) => {
                        crate::trace::scope_traceparent(traceparent, handled).await
                    }
                    None => handled.await,
                };
                if let Err(error) = handled {
                    // Dropping `tx` rolls the marker back too.
                    return Ok(Recorded::Failed(format!("response handler: {error}")));
                }
            }
            T::commit(tx).await?;
            Ok(Recorded::Done)
        }
    }

    impl<T: AsyncAnswerStatements> AnswerStore for OnPool<T> {
        fn record<'a>(&'a self, published: &'a Published) -> BoxFuture<'a, Recorded> {
            Box::pin(async move {
                self.try_record(published).await.unwrap_or_else(|error| {
                    Recorded::Failed(format!(
                        "database: {}",
                        crate::store::sqlx_error_text(&error)
                    ))
                })
            })
        }

        fn note_failure<'a>(&'a self, message_id: &'a str, error: &'a str) -> BoxFuture<'a, ()> {
            Box::pin(async move {
                if let Err(failed) = self.statements.note_failure(message_id, error).await {
                    tracing::warn!(%message_id, error = %crate::store::sqlx_error_text(&failed), "cannot keep why an answer was given up");
                }
            })
        }
    }
}
