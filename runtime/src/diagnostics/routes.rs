//! The diagnostics routes: [`Diagnostics`] and its builder (which store,
//! which outbox, metrics, token, thresholds), the axum router and its
//! handlers. Each handler runs one closure on the store connection, on the
//! blocking pool, and shapes the answer.
//!
//! It never writes SQL (that is `queries` over `sqlite` or
//! `crate::store::sqlx_postgres::diagnostics`) nor decides a health status (that is `health`).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::{Path as UrlPath, Query, Request, State};
use axum::http::header;
use axum::middleware;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Serialize;
use tokio::sync::Notify;
use uuid::Uuid;

use super::access::{require_token, require_token_for_changes};
use super::backup::serve_backup;
use super::health::{fold_gauges, health, horizon_warning, with_decommissioned, with_destinations};
use super::queries::{
    DiagnosticsStore, attention_page_in, count_older, discard_matching_in, discard_message_in,
    failure_groups_in, outbox_stats_in, retry_matching_in, retry_message_in, unsent_stats_in,
};
use super::readiness::{serve_livez, serve_readyz};
use super::{
    AttentionFilter, AttentionMessage, DecommissionedVersion, DiagnosticsError, Health,
    HealthThresholds, InboxStats, OutboxStats, SendCounters, rfc3339,
};
use crate::backup::Backups;
use crate::circuit::Circuits;
use crate::config::Config;
use crate::liveness::Liveness;
use crate::metrics::{Gauges, Metrics};
use crate::outbox::Outbox;
use crate::store::Database;
use crate::store::StoreError;
use crate::store::sqlite as db;

/// Builds a [`Diagnostics`]; see [`Diagnostics::builder`].
pub struct DiagnosticsBuilder {
    database: Database,
    metrics: Arc<Metrics>,
    wake: Option<Arc<Notify>>,
    circuits: Option<Arc<Circuits>>,
    dedup_horizon: Duration,
    ttl: Duration,
    token: Option<String>,
    thresholds: HealthThresholds,
    destinations: Vec<String>,
    outbox: Option<Outbox>,
    workers: Vec<(String, Liveness)>,
    readiness_timeout: Duration,
    backups: Option<Backups>,
}

impl DiagnosticsBuilder {
    /// Takes the outbox's metrics and TTL, and wakes its dispatcher when a
    /// message is retried by hand.
    pub fn outbox<S: crate::store::AnyStore>(mut self, outbox: &Outbox<S>) -> Self {
        self.metrics = Arc::clone(outbox.metrics());
        self.wake = Some(outbox.wake_handle());
        self.circuits = Some(Arc::clone(outbox.circuits()));
        self.ttl = outbox.config().outbox.ttl;
        let inbox = &outbox.config().inbox;
        self.dedup_horizon = inbox.retention.saturating_sub(inbox.signature_tolerance);
        self.destinations = outbox.config().destinations.keys().cloned().collect();
        self.outbox = Some(outbox.untyped());
        self
    }

    /// `GET /_rf/readyz` also checks that the receiver's writer thread runs.
    /// (With [`outbox`](Self::outbox), it checks the dispatcher started on
    /// that outbox: none started is not ready.)
    pub fn receiver(self, receiver: &crate::receiver::Receiver) -> Self {
        self.worker("receiver_writer", receiver.liveness())
    }

    /// `GET /_rf/readyz` also checks this worker, reported under `name`.
    pub fn worker(mut self, name: impl Into<String>, liveness: Liveness) -> Self {
        self.workers.push((name.into(), liveness));
        self
    }

    /// How long `GET /_rf/readyz` waits for the database before it answers
    /// 503 (default 1 s; a probe must answer quickly): on SQLite, for the
    /// write lock; on PostgreSQL, for a new connection and for each of its
    /// statements (`statement_timeout`).
    pub fn readiness_timeout(mut self, timeout: Duration) -> Self {
        self.readiness_timeout = timeout;
        self
    }

    /// The counters `GET /_rf/metrics` and `GET /_rf/inbox/stats` report
    /// (share one `Arc<Metrics>` between the outbox and the receiver).
    pub fn metrics(mut self, metrics: Arc<Metrics>) -> Self {
        self.metrics = metrics;
        self
    }

    /// `POST /_rf/backup` writes a backup with `backups` (without it the
    /// route answers 409 `backup_not_configured`).
    pub fn backups(mut self, backups: Backups) -> Self {
        self.backups = Some(backups);
        self
    }

    /// Requires `Authorization: Bearer <token>` on every route.
    pub fn bearer_token(mut self, token: impl Into<String>) -> Self {
        self.token = Some(token.into());
        self
    }

    /// When `GET /_rf/health` turns `warning` (backlog size, oldest
    /// waiting message); [`HealthThresholds::default`] otherwise.
    pub fn thresholds(mut self, thresholds: HealthThresholds) -> Self {
        self.thresholds = thresholds;
        self
    }

    /// Opens the database (creating and migrating it if needed). On
    /// PostgreSQL, an unreachable server or a wrong URL is
    /// `StoreError::Postgres`, naming the host and the cause.
    pub fn build(self) -> Result<Diagnostics, StoreError> {
        let sqlite = |path: &std::path::Path| -> Result<(StoreBox, StoreBox), StoreError> {
            let conn = db::open(path, crate::config::Durability::Normal)?;
            // A connection of its own, so a probe never queues behind a
            // slow diagnostics query, with a short busy timeout.
            let ready_conn = db::open(path, crate::config::Durability::Normal)?;
            ready_conn
                .busy_timeout(self.readiness_timeout)
                .map_err(|source| StoreError::Sqlite {
                    path: path.display().to_string(),
                    source,
                })?;
            Ok((Box::new(conn) as StoreBox, Box::new(ready_conn) as StoreBox))
        };
        let (conn, ready_conn) = match &self.database {
            Database::Sqlite(path) => sqlite(path)?,
            // A file on a sqlx pool: read on connections of its own.
            #[cfg(feature = "sqlx-sqlite")]
            Database::SqlxSqlite(store) => sqlite(store.location())?,
            #[cfg(feature = "sqlx-postgres")]
            Database::SqlxPostgres(store) => {
                let (conn, ready_conn) =
                    crate::store::sqlx_postgres::diagnostics::open(store, self.readiness_timeout)?;
                (Box::new(conn) as StoreBox, Box::new(ready_conn) as StoreBox)
            }
        };
        Ok(Diagnostics {
            shared: Arc::new(Shared {
                conn: Mutex::new(conn),
                metrics: self.metrics,
                wake: self.wake,
                circuits: self.circuits,
                dedup_horizon: self.dedup_horizon,
                ttl: self.ttl,
                token: self.token,
                thresholds: self.thresholds,
                destinations: self.destinations,
                ready_conn: Mutex::new(ready_conn),
                readiness_timeout: self.readiness_timeout,
                outbox: self.outbox,
                workers: self.workers,
                backups: self.backups,
            }),
        })
    }
}

/// The diagnostics routes of one service database. Cheap to clone.
#[derive(Clone)]
pub struct Diagnostics {
    shared: Arc<Shared>,
}

/// A store's connection behind the routes.
type StoreBox = Box<dyn DiagnosticsStore + Send>;

pub(super) struct Shared {
    pub(super) conn: Mutex<StoreBox>,
    pub(super) metrics: Arc<Metrics>,
    pub(super) wake: Option<Arc<Notify>>,
    pub(super) circuits: Option<Arc<Circuits>>,
    /// The dedup horizon assumed for receivers (this service's own
    /// `inbox.retention` less its signature tolerance): a manual retry of an
    /// older message warns that it may be refused.
    pub(super) dedup_horizon: Duration,
    pub(super) ttl: Duration,
    pub(super) token: Option<String>,
    pub(super) thresholds: HealthThresholds,
    /// Configured destinations: their gauges are rendered even at zero.
    pub(super) destinations: Vec<String>,
    pub(super) ready_conn: Mutex<StoreBox>,
    pub(super) readiness_timeout: Duration,
    pub(super) outbox: Option<Outbox>,
    pub(super) workers: Vec<(String, Liveness)>,
    pub(super) backups: Option<Backups>,
}

impl Diagnostics {
    /// Diagnostics of the service database `database`: a SQLite file
    /// path, a sqlx store (`&PgStore`, `&SqliteStore`), or a
    /// [`Database`] chosen at run time. The same routes and answers on
    /// every store.
    pub fn builder(database: impl Into<Database>) -> DiagnosticsBuilder {
        DiagnosticsBuilder {
            database: database.into(),
            metrics: Arc::new(Metrics::default()),
            wake: None,
            circuits: None,
            dedup_horizon: Duration::MAX,
            ttl: Config::default().outbox.ttl,
            token: None,
            thresholds: HealthThresholds::default(),
            destinations: Vec::new(),
            outbox: None,
            workers: Vec::new(),
            readiness_timeout: Duration::from_secs(1),
            backups: None,
        }
    }

    /// The routes, ready to merge with [`crate::receiver::Receiver::router`]
    /// (which answers a JSON 404 for other paths under `/_rf/`) or into an
    /// application router.
    pub fn router(&self) -> Router {
        // A wrong method gets the JSON 405 every other error has (axum's
        // own is an empty body).
        Router::new()
            .route(
                "/_rf/health",
                get(serve_health).fallback(method_not_allowed),
            )
            .route(
                "/_rf/outbox/stats",
                get(serve_outbox_stats).fallback(method_not_allowed),
            )
            .route(
                "/_rf/outbox/failed",
                get(serve_failed).fallback(method_not_allowed),
            )
            .route(
                "/_rf/outbox/failed/groups",
                get(serve_failed_groups).fallback(method_not_allowed),
            )
            .merge(
                Router::new()
                    .route(
                        "/_rf/outbox/retry",
                        post(serve_retry_matching).fallback(method_not_allowed),
                    )
                    .route(
                        "/_rf/outbox/{message_id}/retry",
                        post(serve_retry).fallback(method_not_allowed),
                    )
                    .route(
                        "/_rf/outbox/discard",
                        post(serve_discard_matching).fallback(method_not_allowed),
                    )
                    .route(
                        "/_rf/outbox/{message_id}/discard",
                        post(serve_discard).fallback(method_not_allowed),
                    )
                    .route(
                        "/_rf/backup",
                        post(serve_backup).fallback(method_not_allowed),
                    )
                    .route_layer(middleware::from_fn_with_state(
                        Arc::clone(&self.shared),
                        require_token_for_changes,
                    )),
            )
            .route(
                "/_rf/inbox/stats",
                get(serve_inbox_stats).fallback(method_not_allowed),
            )
            .route(
                "/_rf/metrics",
                get(serve_metrics).fallback(method_not_allowed),
            )
            .route_layer(middleware::from_fn_with_state(
                Arc::clone(&self.shared),
                require_token,
            ))
            // Probes need no token: they show no data, and an orchestrator's
            // probe rarely carries credentials.
            .route("/_rf/livez", get(serve_livez))
            .route("/_rf/readyz", get(serve_readyz))
            .with_state(Arc::clone(&self.shared))
    }

    /// Runs `query` on the diagnostics connection, on the blocking pool.
    async fn query<T: Send + 'static>(
        shared: &Arc<Shared>,
        query: impl FnOnce(&dyn DiagnosticsStore) -> Result<T, DiagnosticsError> + Send + 'static,
    ) -> Result<T, DiagnosticsError> {
        let shared = Arc::clone(shared);
        tokio::task::spawn_blocking(move || {
            let conn = shared
                .conn
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            query(conn.as_ref())
        })
        .await
        .map_err(|error| DiagnosticsError::Unavailable(error.to_string()))?
    }
}

async fn method_not_allowed(request: Request) -> DiagnosticsError {
    DiagnosticsError::MethodNotAllowed {
        method: request.method().to_string(),
        path: request.uri().path().to_owned(),
    }
}

async fn serve_health(State(shared): State<Arc<Shared>>) -> Result<Json<Health>, DiagnosticsError> {
    let thresholds = shared.thresholds;
    let (stats, decommissioned) = Diagnostics::query(&shared, |store| {
        Ok((
            unsent_stats_in(store, db::now_ms())?,
            store.decommissioned()?,
        ))
    })
    .await?;
    let decommissioned = decommissioned
        .into_iter()
        .map(|(interface, version, at, held)| DecommissionedVersion {
            interface,
            version: u32::try_from(version.max(0)).unwrap_or(u32::MAX),
            decommissioned_at: rfc3339(at),
            held: held.max(0) as u64,
        })
        .collect();
    let states = shared
        .circuits
        .as_ref()
        .map(|circuits| circuits.states())
        .unwrap_or_default();
    let mut answer = with_decommissioned(
        with_destinations(health(stats, thresholds), states),
        decommissioned,
    );
    answer.sends = SendCounters::of(&shared.metrics);
    Ok(Json(answer))
}

async fn serve_outbox_stats(
    State(shared): State<Arc<Shared>>,
) -> Result<Json<OutboxStats>, DiagnosticsError> {
    let stats = Diagnostics::query(&shared, |store| outbox_stats_in(store, db::now_ms())).await?;
    Ok(Json(stats))
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct AttentionList {
    messages: Vec<AttentionMessage>,
    /// Pass it as `cursor` (with the same filter) for the next page;
    /// absent on the last page.
    #[serde(skip_serializing_if = "Option::is_none")]
    next_cursor: Option<String>,
}

async fn serve_failed(
    State(shared): State<Arc<Shared>>,
    filter: Result<Query<AttentionFilter>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<impl Serialize>, DiagnosticsError> {
    let Query(filter) = filter.map_err(|e| DiagnosticsError::BadRequest(e.body_text()))?;
    let (messages, next_cursor) = Diagnostics::query(&shared, move |store| {
        attention_page_in(store, &filter, db::now_ms())
    })
    .await?;
    Ok(Json(AttentionList {
        messages,
        next_cursor,
    }))
}

#[derive(Serialize)]
struct GroupList {
    groups: Vec<super::FailureGroup>,
}

async fn serve_failed_groups(
    State(shared): State<Arc<Shared>>,
    filter: Result<Query<AttentionFilter>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<impl Serialize>, DiagnosticsError> {
    let Query(filter) = filter.map_err(|e| DiagnosticsError::BadRequest(e.body_text()))?;
    if filter.limit.is_some() {
        return Err(DiagnosticsError::BadRequest(
            "`limit` pages the list only; the groups are never cut".to_owned(),
        ));
    }
    let groups = Diagnostics::query(&shared, move |store| {
        failure_groups_in(store, &filter, db::now_ms())
    })
    .await?;
    Ok(Json(GroupList { groups }))
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Retried {
    retried: usize,
    /// Set when some of them are older than the dedup horizon receivers are
    /// assumed to keep: they may be refused (422 `beyond_dedup_horizon`)
    /// and come back `Failed`. They are never processed twice.
    #[serde(skip_serializing_if = "Option::is_none")]
    warning: Option<String>,
}

/// The message id of a `/_rf/outbox/{messageId}/…` path.
fn path_id(
    message_id: Result<UrlPath<String>, axum::extract::rejection::PathRejection>,
) -> Result<Uuid, DiagnosticsError> {
    // A segment that does not decode (`%FF`) is a bad id like any other,
    // answered as JSON (axum's own rejection is plain text).
    let UrlPath(message_id) =
        message_id.map_err(|e| DiagnosticsError::BadRequest(e.body_text()))?;
    Uuid::parse_str(&message_id).map_err(|_| {
        DiagnosticsError::BadRequest(format!("`{message_id}` is not a message id (a UUID)"))
    })
}

async fn serve_retry(
    State(shared): State<Arc<Shared>>,
    message_id: Result<UrlPath<String>, axum::extract::rejection::PathRejection>,
) -> Result<Json<impl Serialize>, DiagnosticsError> {
    let id = path_id(message_id)?;
    let ttl = shared.ttl;
    let horizon = shared.dedup_horizon;
    let old = Diagnostics::query(&shared, move |store| {
        let now = db::now_ms();
        let key = id.to_string();
        let old = count_older(store, Some(&key), &AttentionFilter::default(), now, horizon)?;
        retry_message_in(store, &id, ttl, now)?;
        Ok(old)
    })
    .await?;
    wake_dispatcher(&shared);
    Ok(Json(Retried {
        retried: 1,
        warning: horizon_warning(old, horizon),
    }))
}

async fn serve_retry_matching(
    State(shared): State<Arc<Shared>>,
    filter: Result<Query<AttentionFilter>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<impl Serialize>, DiagnosticsError> {
    let Query(filter) = filter.map_err(|e| DiagnosticsError::BadRequest(e.body_text()))?;
    let ttl = shared.ttl;
    let horizon = shared.dedup_horizon;
    let shown = filter.describe();
    let (retried, old) = Diagnostics::query(&shared, move |store| {
        let now = db::now_ms();
        let old = count_older(store, None, &filter, now, horizon)?;
        Ok((retry_matching_in(store, &filter, ttl, now)?, old))
    })
    .await?;
    tracing::info!(retried, filter = %shown, "outbox messages retried by an operator");
    if retried > 0 {
        wake_dispatcher(&shared);
    }
    Ok(Json(Retried {
        retried,
        warning: horizon_warning(old, horizon),
    }))
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Discarded {
    discarded: usize,
}

async fn serve_discard(
    State(shared): State<Arc<Shared>>,
    message_id: Result<UrlPath<String>, axum::extract::rejection::PathRejection>,
) -> Result<Json<impl Serialize>, DiagnosticsError> {
    let id = path_id(message_id)?;
    Diagnostics::query(&shared, move |store| {
        discard_message_in(store, &id, db::now_ms())
    })
    .await?;
    shared.metrics.outbox_discarded.inc();
    tracing::info!(message_id = %id, "outbox message discarded by an operator");
    Ok(Json(Discarded { discarded: 1 }))
}

async fn serve_discard_matching(
    State(shared): State<Arc<Shared>>,
    filter: Result<Query<AttentionFilter>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<impl Serialize>, DiagnosticsError> {
    let Query(filter) = filter.map_err(|e| DiagnosticsError::BadRequest(e.body_text()))?;
    let shown = filter.describe();
    let discarded = Diagnostics::query(&shared, move |store| {
        discard_matching_in(store, &filter, db::now_ms())
    })
    .await?;
    shared.metrics.outbox_discarded.add(discarded as u64);
    tracing::info!(
        discarded,
        filter = %shown,
        "outbox messages discarded by an operator"
    );
    Ok(Json(Discarded { discarded }))
}

fn wake_dispatcher(shared: &Shared) {
    if let Some(wake) = &shared.wake {
        wake.notify_one();
    }
}

async fn serve_inbox_stats(
    State(shared): State<Arc<Shared>>,
) -> Result<Json<InboxStats>, DiagnosticsError> {
    let size = Diagnostics::query(&shared, |store| store.inbox_size()).await?;
    let metrics = &shared.metrics;
    let processed = metrics.inbox_processed.get();
    let duplicates = metrics.inbox_duplicates.get();
    let seen = processed + duplicates;
    Ok(Json(InboxStats {
        size,
        processed,
        duplicates,
        duplicate_rate: if seen == 0 {
            0.0
        } else {
            duplicates as f64 / seen as f64
        },
        signature_failures: metrics.inbox_signature_failures.get(),
        rejected: metrics.inbox_rejected.get(),
    }))
}

async fn serve_metrics(State(shared): State<Arc<Shared>>) -> Result<Response, DiagnosticsError> {
    let configured = shared.destinations.clone();
    let gauges = Diagnostics::query(&shared, move |store| {
        Ok(Gauges {
            destinations: {
                let now = db::now_ms();
                fold_gauges(store.unsent_groups(now)?, now, &configured)
            },
            inbox_size: Some(store.inbox_size()?),
        })
    })
    .await?;
    let text = shared.metrics.render(&gauges);
    Ok((
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        text,
    )
        .into_response())
}
