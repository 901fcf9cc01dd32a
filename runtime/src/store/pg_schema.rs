//! The PostgreSQL schema, shared by both PostgreSQL stores (the blocking
//! `postgres` client's and sqlx's): the same tables, so either can read
//! what the other wrote.

/// Schema migrations, applied in order; index + 1 is the resulting
/// `rfidl_schema.version`. Never edit a released entry: append a new one.
pub const MIGRATIONS: &[&str] = &[
    // 1: outbox and inbox, as on SQLite (both of its migrations).
    r#"
    CREATE TABLE outbox_messages (
        message_id      TEXT PRIMARY KEY NOT NULL,   -- UUID v7, time-ordered
        correlation_id  TEXT,
        message_type    TEXT NOT NULL,
        destination     TEXT NOT NULL,
        interface       TEXT NOT NULL,
        version         BIGINT NOT NULL,
        fingerprint     TEXT NOT NULL,
        endpoint        TEXT NOT NULL,
        payload         TEXT NOT NULL,
        headers         TEXT NOT NULL DEFAULT '{}',
        status          TEXT NOT NULL DEFAULT 'Pending'
                        CHECK (status IN ('Pending','Sending','Sent','Failed','DeadLetter','Expired')),
        retry_count     BIGINT NOT NULL DEFAULT 0,
        max_retries     BIGINT NOT NULL,
        next_retry_at   BIGINT NOT NULL,             -- due time (ms); for Sending: lease expiry
        lease_token     TEXT,
        last_attempt_at BIGINT,
        last_error      TEXT,
        response        TEXT,
        created_at      BIGINT NOT NULL,
        expires_at      BIGINT NOT NULL,
        sent_at         BIGINT
    );
    CREATE INDEX outbox_due ON outbox_messages (destination, next_retry_at)
        WHERE status IN ('Pending', 'Sending');
    CREATE INDEX outbox_sent ON outbox_messages (sent_at) WHERE status = 'Sent';
    CREATE INDEX outbox_attention ON outbox_messages (status, created_at)
        WHERE status IN ('Failed', 'DeadLetter', 'Expired');

    CREATE TABLE inbox_messages (
        source_service_id TEXT NOT NULL,
        message_id        TEXT NOT NULL,
        endpoint          TEXT NOT NULL,
        payload_sha256    BYTEA NOT NULL,
        processed_at      BIGINT NOT NULL,
        response          TEXT,
        expires_at        BIGINT NOT NULL,
        PRIMARY KEY (source_service_id, message_id)
    );
    CREATE INDEX inbox_expiry ON inbox_messages (expires_at);
    "#,
    // 2: decommissioned interface versions (`crate::lifecycle`).
    r#"
    CREATE TABLE rf_decommissioned (
        interface         TEXT NOT NULL,
        version           BIGINT NOT NULL,
        decommissioned_at BIGINT NOT NULL,
        PRIMARY KEY (interface, version)
    );
    "#,
    // 3: the JetStream transport (`crate::nats`), as SQLite's migration 4:
    //    the answer marker of an outbox row, and terminated deliveries.
    r#"
    ALTER TABLE outbox_messages ADD COLUMN answered_at BIGINT;
    CREATE TABLE rf_terminated (
        stream_sequence BIGINT NOT NULL,
        stream          TEXT NOT NULL,
        message_id      TEXT,
        subject         TEXT NOT NULL,
        error           TEXT NOT NULL,
        at              BIGINT NOT NULL,
        PRIMARY KEY (stream, stream_sequence)
    );
    "#,
    // 4: the last lifecycle command applied per interface version
    //    (`crate::lifecycle`), as SQLite's migration 7: a command older
    //    than it is refused (`stale_command`).
    r#"
    CREATE TABLE rf_lifecycle_applied (
        interface   TEXT NOT NULL,
        version     BIGINT NOT NULL,
        generation  BIGINT NOT NULL,
        command     TEXT NOT NULL,
        applied_at  BIGINT NOT NULL,
        PRIMARY KEY (interface, version)
    );
    "#,
    // DEAD LETTERS (the lead renumbers on merge), as SQLite's migration of
    //    the same name: the status `Discarded` and `discarded_at`.
    //    PostgreSQL changes the CHECK in place (its name is the one
    //    PostgreSQL gave the column constraint of migration 1).
    r#"
    ALTER TABLE outbox_messages ADD COLUMN discarded_at BIGINT;
    ALTER TABLE outbox_messages DROP CONSTRAINT outbox_messages_status_check;
    ALTER TABLE outbox_messages ADD CONSTRAINT outbox_messages_status_check
        CHECK (status IN ('Pending','Sending','Sent','Failed','DeadLetter','Expired','Discarded'));
    CREATE INDEX outbox_discarded ON outbox_messages (discarded_at)
        WHERE status = 'Discarded';
    "#,
];

/// The conditions of the failed list's filter (`diagnostics::RowFilter`),
/// `$1` to `$8`, in both PostgreSQL stores' statements; a NULL parameter
/// matches every row.
pub(crate) const ROW_FILTER: &str = "AND ($1::text IS NULL OR status = $1) \
     AND ($2::text IS NULL OR destination = $2) AND ($3::text IS NULL OR interface = $3) \
     AND ($4::text IS NULL OR endpoint = $4) \
     AND ($5::text IS NULL OR strpos(last_error, $5) > 0) \
     AND ($6::int8 IS NULL OR created_at < $6) \
     AND ($7::int8 IS NULL OR created_at > $7 OR (created_at = $7 AND message_id > $8))";

/// The advisory lock that serialises migrations across processes
/// (`pg_advisory_xact_lock`): the first eight bytes of "rfidl-migrations".
pub(crate) const MIGRATION_LOCK: i64 = 0x7266_6964_6c2d_6d69;
