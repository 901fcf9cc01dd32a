//! The schema as data: [`MIGRATIONS`], an ordered list of SQL scripts
//! (`PRAGMA user_version` records how many ran), the SQL fragments they and
//! the queries share (`attention!`, the `seq` of a message id), and the one
//! function that applies them.
//!
//! Never edits a released script (a change is a new entry at the end) and
//! never migrates a database written by a newer schema: that is refused as
//! [`StoreError::TooNew`].

use rusqlite::Connection;

use crate::store::StoreError;

/// The rows that need a human (`Failed`, `DeadLetter`, `Expired`), written
/// as the `outbox_attention` index's predicate: SQLite uses a partial index
/// only for a query that repeats its predicate term for term, so queries
/// splice this in with `concat!`.
macro_rules! attention {
    () => {
        "(status = 'Failed' OR status = 'DeadLetter' OR status = 'Expired')"
    };
}
pub(crate) use attention;

/// A `GLOB` pattern that matches a lower-case hyphenated UUID.
macro_rules! uuid_glob {
    () => {
        "[0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f]-\
         [0-9a-f][0-9a-f][0-9a-f][0-9a-f]-[0-9a-f][0-9a-f][0-9a-f][0-9a-f]-\
         [0-9a-f][0-9a-f][0-9a-f][0-9a-f]-\
         [0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f]"
    };
}

/// The value of the hexadecimal digit at 1-based `$position` of
/// `message_id`, shifted left `$shift` bits.
macro_rules! hex_digit_sql {
    ($position:literal, $shift:literal) => {
        concat!(
            "((instr('0123456789abcdef', substr(message_id, ",
            $position,
            ", 1)) - 1) << ",
            $shift,
            ")"
        )
    };
}

/// [`outbox_seq`] of the column `message_id` in SQL, for a value that
/// matches `uuid_glob!()`: the 12 hexadecimal digits of the time (text
/// positions 1-8 and 10-13) shifted left 15 bits, or'ed with the low 15
/// bits of the 4 digits at positions 25-28.
macro_rules! outbox_seq_sql {
    () => {
        concat!(
            "((",
            hex_digit_sql!(1, 44),
            " | ",
            hex_digit_sql!(2, 40),
            " | ",
            hex_digit_sql!(3, 36),
            " | ",
            hex_digit_sql!(4, 32),
            " | ",
            hex_digit_sql!(5, 28),
            " | ",
            hex_digit_sql!(6, 24),
            " | ",
            hex_digit_sql!(7, 20),
            " | ",
            hex_digit_sql!(8, 16),
            " | ",
            hex_digit_sql!(10, 12),
            " | ",
            hex_digit_sql!(11, 8),
            " | ",
            hex_digit_sql!(12, 4),
            " | ",
            hex_digit_sql!(13, 0),
            ") << 15) | ((",
            hex_digit_sql!(25, 12),
            " | ",
            hex_digit_sql!(26, 8),
            " | ",
            hex_digit_sql!(27, 4),
            " | ",
            hex_digit_sql!(28, 0),
            ") & 32767)"
        )
    };
}

// The tests check the fragments against the Rust they mirror.
#[cfg(test)]
pub(super) use {hex_digit_sql, outbox_seq_sql, uuid_glob};

/// Schema migrations, applied in order; index + 1 is the resulting `user_version`.
/// Never edit a released entry: append a new one.
pub const MIGRATIONS: &[&str] = &[
    // 1: outbox and inbox.
    r#"
    CREATE TABLE outbox_messages (
        message_id      TEXT PRIMARY KEY NOT NULL,   -- UUID v7, time-ordered
        correlation_id  TEXT,
        message_type    TEXT NOT NULL,               -- Signal | Command | PushCall | Response
        destination     TEXT NOT NULL,               -- logical peer name, mapped to a transport
        interface       TEXT NOT NULL,               -- package.Service
        version         INTEGER NOT NULL,
        fingerprint     TEXT NOT NULL,
        endpoint        TEXT NOT NULL,
        payload         TEXT NOT NULL,               -- JSON object, one member per parameter
        headers         TEXT NOT NULL DEFAULT '{}',  -- JSON object of string -> string
        status          TEXT NOT NULL DEFAULT 'Pending'
                        CHECK (status IN ('Pending','Sending','Sent','Failed','DeadLetter','Expired')),
        retry_count     INTEGER NOT NULL DEFAULT 0,
        max_retries     INTEGER NOT NULL,
        next_retry_at   INTEGER NOT NULL,            -- due time (ms); for Sending: lease expiry
        lease_token     TEXT,                        -- set by a claim; later updates are fenced on it
        last_attempt_at INTEGER,
        last_error      TEXT,
        response        TEXT,                        -- the receiver's answer payload (JSON)
        created_at      INTEGER NOT NULL,
        expires_at      INTEGER NOT NULL,
        sent_at         INTEGER
    ) STRICT, WITHOUT ROWID;  -- one b-tree keyed on the time-ordered id: appends stay sequential
    -- The dispatcher's claim query: due rows that are Pending or whose lease ran out.
    CREATE INDEX outbox_due ON outbox_messages (next_retry_at)
        WHERE status IN ('Pending', 'Sending');
    -- Retention: delete Sent rows by age.
    CREATE INDEX outbox_sent ON outbox_messages (sent_at) WHERE status = 'Sent';
    -- Diagnostics: list rows that need a human.
    CREATE INDEX outbox_attention ON outbox_messages (status, created_at)
        WHERE status IN ('Failed', 'DeadLetter', 'Expired');

    CREATE TABLE inbox_messages (
        source_service_id TEXT NOT NULL,
        message_id        TEXT NOT NULL,
        endpoint          TEXT NOT NULL,
        payload_sha256    BLOB NOT NULL,             -- to detect a reused id with another payload
        processed_at      INTEGER NOT NULL,
        response          TEXT,                      -- cached answer payload (JSON)
        expires_at        INTEGER NOT NULL,
        PRIMARY KEY (source_service_id, message_id)
    ) STRICT, WITHOUT ROWID;
    CREATE INDEX inbox_expiry ON inbox_messages (expires_at);
    "#,
    // 2: the dispatcher claims destination by destination (circuit
    //    breakers, fairness between destinations), so the index of waiting
    //    rows leads with the destination. Same number of indexes: enqueue
    //    costs the same.
    r#"
    DROP INDEX outbox_due;
    CREATE INDEX outbox_due ON outbox_messages (destination, next_retry_at)
        WHERE status IN ('Pending', 'Sending');
    "#,
    // 3: decommissioned interface versions (`crate::lifecycle`): the
    // versions this service must not dispatch, set by the registry's
    // `Decommission` command.
    r#"
    CREATE TABLE rf_decommissioned (
        interface         TEXT NOT NULL,
        version           INTEGER NOT NULL,
        decommissioned_at INTEGER NOT NULL,
        PRIMARY KEY (interface, version)
    ) STRICT;
    "#,
    // 4: the same outbox without IN-lists of more than two values in its
    //    CHECK and partial indexes. SQLite evaluates such a list (outside a
    //    WHERE clause) through a temporary b-tree it builds for every row
    //    written: two per enqueue (the status CHECK and the attention index's
    //    predicate), and more per status update, about a quarter of an
    //    enqueue's instructions (BENCHMARKS.md, "Outbox::enqueue"). Equality
    //    chains are evaluated in place. SQLite cannot change a CHECK in
    //    place: the table is rebuilt (same columns in the same order), as its
    //    documented procedure for schema changes says.
    concat!(
        r#"
    CREATE TABLE outbox_messages_v4 (
        message_id      TEXT PRIMARY KEY NOT NULL,
        correlation_id  TEXT,
        message_type    TEXT NOT NULL,
        destination     TEXT NOT NULL,
        interface       TEXT NOT NULL,
        version         INTEGER NOT NULL,
        fingerprint     TEXT NOT NULL,
        endpoint        TEXT NOT NULL,
        payload         TEXT NOT NULL,
        headers         TEXT NOT NULL DEFAULT '{}',
        status          TEXT NOT NULL DEFAULT 'Pending'
                        CHECK (status = 'Pending' OR status = 'Sending' OR status = 'Sent'
                               OR status = 'Failed' OR status = 'DeadLetter' OR status = 'Expired'),
        retry_count     INTEGER NOT NULL DEFAULT 0,
        max_retries     INTEGER NOT NULL,
        next_retry_at   INTEGER NOT NULL,
        lease_token     TEXT,
        last_attempt_at INTEGER,
        last_error      TEXT,
        response        TEXT,
        created_at      INTEGER NOT NULL,
        expires_at      INTEGER NOT NULL,
        sent_at         INTEGER
    ) STRICT, WITHOUT ROWID;
    INSERT INTO outbox_messages_v4 SELECT * FROM outbox_messages;
    DROP TABLE outbox_messages;
    ALTER TABLE outbox_messages_v4 RENAME TO outbox_messages;
    CREATE INDEX outbox_due ON outbox_messages (destination, next_retry_at)
        WHERE status IN ('Pending', 'Sending');
    CREATE INDEX outbox_sent ON outbox_messages (sent_at) WHERE status = 'Sent';
    -- Queries that want this index repeat its predicate: `attention!()`.
    CREATE INDEX outbox_attention ON outbox_messages (status, created_at)
        WHERE "#,
        attention!(),
        r#";
    "#
    ),
    // 5: the JetStream transport (`crate::nats`). `answered_at`: when the
    //    answer to a message sent through a broker arrived and its response
    //    handler ran (the marker that makes a redelivered answer a no-op).
    //    `rf_terminated`: broker deliveries refused for good (never
    //    redelivered), kept for an operator.
    r#"
    ALTER TABLE outbox_messages ADD COLUMN answered_at INTEGER;
    CREATE TABLE rf_terminated (
        stream_sequence INTEGER NOT NULL,
        stream          TEXT NOT NULL,
        message_id      TEXT,                -- Nats-Msg-Id, when the message had one
        subject         TEXT NOT NULL,
        error           TEXT NOT NULL,       -- `<status> <code>: <message>`
        at              INTEGER NOT NULL,
        PRIMARY KEY (stream, stream_sequence)
    ) STRICT;
    "#,
    // 6: the outbox as a rowid table. A `WITHOUT ROWID` table is an index
    //    b-tree: a full leaf splits by redistributing cells over up to three
    //    siblings (`balance_nonroot`), and with about six 650-byte rows to a
    //    4 KiB page an enqueue wrote 3.6 WAL frames per commit. A rowid
    //    table appended at its right edge splits by adding one page
    //    (`balance_quick`): 2.4 frames, as the raw-insert reference writes.
    //    The rowid `seq` is derived from the message id (`outbox_seq`:
    //    the id's millisecond time and the low 15 bits of its counter, so
    //    time-ordered ids append), and every look-up by id binds both, so
    //    no index on `message_id` is needed and an enqueue still writes two
    //    b-trees (the table and `outbox_due`). Same columns, `seq` last;
    //    rows whose id is not a lower-case UUID get a rowid past all others
    //    (look-ups by id do not find them; the dispatcher, which works on
    //    `seq`, still sends them). Rebuilt as SQLite's documented procedure
    //    for schema changes says.
    concat!(
        r#"
    CREATE TABLE outbox_messages_v6 (
        message_id      TEXT NOT NULL,
        correlation_id  TEXT,
        message_type    TEXT NOT NULL,
        destination     TEXT NOT NULL,
        interface       TEXT NOT NULL,
        version         INTEGER NOT NULL,
        fingerprint     TEXT NOT NULL,
        endpoint        TEXT NOT NULL,
        payload         TEXT NOT NULL,
        headers         TEXT NOT NULL DEFAULT '{}',
        status          TEXT NOT NULL DEFAULT 'Pending'
                        CHECK (status = 'Pending' OR status = 'Sending' OR status = 'Sent'
                               OR status = 'Failed' OR status = 'DeadLetter' OR status = 'Expired'),
        retry_count     INTEGER NOT NULL DEFAULT 0,
        max_retries     INTEGER NOT NULL,
        next_retry_at   INTEGER NOT NULL,
        lease_token     TEXT,
        last_attempt_at INTEGER,
        last_error      TEXT,
        response        TEXT,
        created_at      INTEGER NOT NULL,
        expires_at      INTEGER NOT NULL,
        sent_at         INTEGER,
        answered_at     INTEGER,
        seq             INTEGER PRIMARY KEY   -- outbox_seq(message_id), see above
    ) STRICT;
    WITH keyed AS (
        SELECT *, CASE WHEN message_id GLOB '"#,
        uuid_glob!(),
        r#"' THEN "#,
        outbox_seq_sql!(),
        r#" END AS k FROM outbox_messages
    ), shared AS (
        SELECT k FROM keyed WHERE k IS NOT NULL GROUP BY k HAVING COUNT(*) > 1
    )
    INSERT INTO outbox_messages_v6 (message_id, correlation_id, message_type, destination,
        interface, version, fingerprint, endpoint, payload, headers, status, retry_count,
        max_retries, next_retry_at, lease_token, last_attempt_at, last_error, response,
        created_at, expires_at, sent_at, answered_at, seq)
    SELECT message_id, correlation_id, message_type, destination, interface, version,
        fingerprint, endpoint, payload, headers, status, retry_count, max_retries,
        next_retry_at, lease_token, last_attempt_at, last_error, response, created_at,
        expires_at, sent_at, answered_at, CASE WHEN k IN shared THEN NULL ELSE k END
    FROM keyed ORDER BY (k IS NULL OR k IN shared), message_id;
    DROP TABLE outbox_messages;
    ALTER TABLE outbox_messages_v6 RENAME TO outbox_messages;
    CREATE INDEX outbox_due ON outbox_messages (destination, next_retry_at)
        WHERE status IN ('Pending', 'Sending');
    CREATE INDEX outbox_sent ON outbox_messages (sent_at) WHERE status = 'Sent';
    -- Queries that want this index repeat its predicate: `attention!()`.
    CREATE INDEX outbox_attention ON outbox_messages (status, created_at)
        WHERE "#,
        attention!(),
        r#";
    "#
    ),
    // 7: the last lifecycle command applied per interface version
    //    (`crate::lifecycle`): the registry's generation and which command,
    //    so that a command older than the state held (a replay, a late
    //    retry) is refused (`stale_command`), also after a restart.
    r#"
    CREATE TABLE rf_lifecycle_applied (
        interface   TEXT NOT NULL,
        version     INTEGER NOT NULL,
        generation  INTEGER NOT NULL,
        command     TEXT NOT NULL,
        applied_at  INTEGER NOT NULL,
        PRIMARY KEY (interface, version)
    ) STRICT;
    "#,
    // DEAD LETTERS (the lead renumbers on merge): the status `Discarded`
    //    (an operator put a Failed, DeadLetter or Expired message aside:
    //    `POST /_rf/outbox/{id}/discard`) and when that happened,
    //    `discarded_at`, from which retention counts
    //    `outbox.failed_retention` before it deletes the row. The CHECK
    //    names every status, and SQLite cannot change a CHECK in place: the
    //    table is rebuilt (every column and every row, `seq` kept, the new
    //    column last) as its documented procedure for schema changes says,
    //    in the one transaction `migrate` runs every script in.
    r#"
    CREATE TABLE outbox_messages_discard (
        message_id      TEXT NOT NULL,
        correlation_id  TEXT,
        message_type    TEXT NOT NULL,
        destination     TEXT NOT NULL,
        interface       TEXT NOT NULL,
        version         INTEGER NOT NULL,
        fingerprint     TEXT NOT NULL,
        endpoint        TEXT NOT NULL,
        payload         TEXT NOT NULL,
        headers         TEXT NOT NULL DEFAULT '{}',
        status          TEXT NOT NULL DEFAULT 'Pending'
                        CHECK (status = 'Pending' OR status = 'Sending' OR status = 'Sent'
                               OR status = 'Failed' OR status = 'DeadLetter' OR status = 'Expired'
                               OR status = 'Discarded'),
        retry_count     INTEGER NOT NULL DEFAULT 0,
        max_retries     INTEGER NOT NULL,
        next_retry_at   INTEGER NOT NULL,
        lease_token     TEXT,
        last_attempt_at INTEGER,
        last_error      TEXT,
        response        TEXT,
        created_at      INTEGER NOT NULL,
        expires_at      INTEGER NOT NULL,
        sent_at         INTEGER,
        answered_at     INTEGER,
        seq             INTEGER PRIMARY KEY,  -- outbox_seq(message_id), see migration 6
        discarded_at    INTEGER               -- set with status = 'Discarded'
    ) STRICT;
    INSERT INTO outbox_messages_discard (message_id, correlation_id, message_type, destination,
        interface, version, fingerprint, endpoint, payload, headers, status, retry_count,
        max_retries, next_retry_at, lease_token, last_attempt_at, last_error, response,
        created_at, expires_at, sent_at, answered_at, seq)
    SELECT message_id, correlation_id, message_type, destination, interface, version,
        fingerprint, endpoint, payload, headers, status, retry_count, max_retries,
        next_retry_at, lease_token, last_attempt_at, last_error, response, created_at,
        expires_at, sent_at, answered_at, seq
    FROM outbox_messages ORDER BY seq;
    DROP TABLE outbox_messages;
    ALTER TABLE outbox_messages_discard RENAME TO outbox_messages;
    CREATE INDEX outbox_due ON outbox_messages (destination, next_retry_at)
        WHERE status IN ('Pending', 'Sending');
    CREATE INDEX outbox_sent ON outbox_messages (sent_at) WHERE status = 'Sent';
    CREATE INDEX outbox_attention ON outbox_messages (status, created_at)
        WHERE (status = 'Failed' OR status = 'DeadLetter' OR status = 'Expired');
    -- Retention of discarded rows, by the time of the discard.
    CREATE INDEX outbox_discarded ON outbox_messages (discarded_at)
        WHERE status = 'Discarded';
    "#,
];

/// The `seq` (rowid) of an outbox row whose `message_id` is `message_id`:
/// for a lower-case hyphenated UUID, its 48-bit millisecond time shifted
/// left 15 bits, or'ed with the low 15 bits of its 32 bits after the
/// variant field, where `Uuid::now_v7`'s 42-bit counter ends (so that the
/// ids one process makes within a millisecond get distinct, increasing
/// values); `None` for any other text, which no enqueued row carries.
/// Migration 6 computes the same in SQL (`outbox_seq_sql!`); a unit test
/// checks that the two agree.
pub(crate) fn outbox_seq(message_id: &str) -> Option<i64> {
    let bytes = message_id.as_bytes();
    if bytes.len() != 36 {
        return None;
    }
    let mut value: u128 = 0;
    for (index, &byte) in bytes.iter().enumerate() {
        if matches!(index, 8 | 13 | 18 | 23) {
            if byte != b'-' {
                return None;
            }
            continue;
        }
        let digit = match byte {
            b'0'..=b'9' => byte - b'0',
            b'a'..=b'f' => byte - b'a' + 10,
            _ => return None,
        };
        value = value << 4 | u128::from(digit);
    }
    let millis = (value >> 80) as i64;
    let counter = ((value >> 32) & 0x7FFF) as i64;
    Some(millis << 15 | counter)
}

/// Runs the scripts `conn` has not run yet, in one transaction; a newer
/// schema than this build knows is refused untouched.
pub(super) fn migrate(conn: &mut Connection, shown: &str) -> Result<(), StoreError> {
    let wrap = |source| StoreError::Sqlite {
        path: shown.to_owned(),
        source,
    };
    let supported = MIGRATIONS.len() as i64;
    let tx = conn
        .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
        .map_err(wrap)?;
    let found: i64 = tx
        .query_row("PRAGMA user_version", [], |row| row.get(0))
        .map_err(wrap)?;
    if found > supported {
        return Err(StoreError::TooNew {
            path: shown.to_owned(),
            found,
            supported,
        });
    }
    for (index, script) in MIGRATIONS.iter().enumerate().skip(found as usize) {
        tx.execute_batch(script).map_err(wrap)?;
        tx.pragma_update(None, "user_version", index as i64 + 1)
            .map_err(wrap)?;
    }
    tx.commit().map_err(wrap)
}
