-- Canonical schema (equal to replaying migrations/ in order; a test checks it): the batch
-- tracking store, the seed's five tables with the fixes listed in
-- docs/schema.md, plus ledgerq's acceptance order (seq) and attempt columns.
-- Timestamps are INTEGER milliseconds since the Unix epoch (UTC); the default
-- expression is the millisecond clock (SQLite 3.40 has no unixepoch('subsec')).

-- seq is the rowid; AUTOINCREMENT keeps it from ever being reused after
-- clean_stale_records deleted the newest rows. (service_id, batch_id) is the
-- seed's primary key, kept as a UNIQUE key that the foreign keys reference.
CREATE TABLE batches (
    seq               INTEGER PRIMARY KEY AUTOINCREMENT,
    service_id        VARCHAR(64) NOT NULL
        CHECK (length(service_id) BETWEEN 1 AND 64),
    batch_id          VARCHAR(128) NOT NULL
        CHECK (length(batch_id) BETWEEN 1 AND 128),
    data_change_id    VARCHAR(256) CHECK (length(data_change_id) <= 256),
    signer_public_key VARCHAR(70) NOT NULL,
    trace             BOOLEAN NOT NULL,
    serialized_batch  BLOB NOT NULL,
    submitted         BOOLEAN NOT NULL DEFAULT 0,
    created_at        INTEGER NOT NULL
        DEFAULT (CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)),
    -- Mirror of batch_statuses.dlt_status, written in the same transaction, so
    -- the queuer reads one table and final batches drop out of batches_open_idx.
    status            VARCHAR(16)
        CHECK (status IN ('Unknown', 'Pending', 'Delayed', 'Invalid', 'Valid', 'Committed')),
    final             BOOLEAN NOT NULL DEFAULT 0,
    last_attempt_at   INTEGER,
    attempts          INTEGER NOT NULL DEFAULT 0,
    -- The parallel queuer: the latest earlier non-final batch of the service
    -- this one conflicts with; NULL if none (docs/queuer.md).
    blocked_by        INTEGER,
    CONSTRAINT batches_key UNIQUE (service_id, batch_id),
    CONSTRAINT batches_data_change_id_key UNIQUE (service_id, data_change_id),
    CONSTRAINT batches_final_check CHECK (
        final = (status IS NOT NULL AND status IN ('Invalid', 'Valid', 'Committed'))
    )
);

-- The queuer's working set: non-final batches per service in acceptance order.
CREATE INDEX batches_open_idx ON batches (service_id, seq) WHERE NOT final;
CREATE INDEX batches_service_seq_idx ON batches (service_id, seq);
CREATE INDEX batches_status_seq_idx ON batches (status, seq);
-- Non-final batches that lock their service or wait for resubmission.
CREATE INDEX batches_busy_idx ON batches (service_id, seq)
    WHERE NOT final AND (submitted OR status IS NOT NULL);

CREATE TABLE transactions (
    service_id        VARCHAR(64) NOT NULL,
    transaction_id    VARCHAR(128) NOT NULL,
    batch_id          VARCHAR(128) NOT NULL,
    -- Position of the transaction inside its batch (the seed lost the order).
    position          INTEGER NOT NULL,
    payload           BLOB NOT NULL,
    family_name       VARCHAR(128) NOT NULL,
    family_version    VARCHAR(16) NOT NULL,
    signer_public_key VARCHAR(70) NOT NULL,
    -- As the transaction header declares them, JSON arrays. NULL: not known
    -- (tracked before they were recorded), which the queuer reads as every
    -- address.
    inputs TEXT,
    outputs TEXT,
    dependencies TEXT,
    PRIMARY KEY (service_id, transaction_id),
    FOREIGN KEY (service_id, batch_id)
        REFERENCES batches (service_id, batch_id) ON DELETE CASCADE
);

CREATE INDEX transactions_batch_idx ON transactions (service_id, batch_id, position);

-- No foreign key to transactions: receipts arrive for every transaction
-- committed on the circuit, including ones this store never tracked.
CREATE TABLE transaction_receipts (
    service_id             VARCHAR(64) NOT NULL,
    transaction_id         VARCHAR(128) NOT NULL,
    result_valid           BOOLEAN NOT NULL,
    error_message          TEXT,
    error_data             BLOB,
    serialized_receipt     BLOB NOT NULL,
    external_status        TEXT,
    external_error_message TEXT,
    created_at             INTEGER NOT NULL
        DEFAULT (CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)),
    updated_at             INTEGER NOT NULL
        DEFAULT (CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)),
    PRIMARY KEY (service_id, transaction_id)
);

CREATE TABLE submissions (
    service_id    VARCHAR(64) NOT NULL,
    batch_id      VARCHAR(128) NOT NULL,
    last_checked  INTEGER NOT NULL
        DEFAULT (CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)),
    times_checked INTEGER NOT NULL DEFAULT 1,
    error_type    VARCHAR(64),
    error_message TEXT,
    created_at    INTEGER NOT NULL
        DEFAULT (CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)),
    updated_at    INTEGER NOT NULL
        DEFAULT (CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)),
    PRIMARY KEY (service_id, batch_id),
    FOREIGN KEY (service_id, batch_id)
        REFERENCES batches (service_id, batch_id) ON DELETE CASCADE
);

CREATE TABLE batch_statuses (
    service_id VARCHAR(64) NOT NULL,
    batch_id   VARCHAR(128) NOT NULL,
    dlt_status VARCHAR(16) NOT NULL
        CHECK (dlt_status IN ('Unknown', 'Pending', 'Delayed', 'Invalid', 'Valid', 'Committed')),
    created_at INTEGER NOT NULL
        DEFAULT (CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)),
    updated_at INTEGER NOT NULL
        DEFAULT (CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)),
    PRIMARY KEY (service_id, batch_id),
    FOREIGN KEY (service_id, batch_id)
        REFERENCES batches (service_id, batch_id) ON DELETE CASCADE
);

-- updated_at on UPDATE. The store writes updated_at itself (with its injected
-- clock); the triggers only fill in when a statement left it unchanged.
CREATE TRIGGER transaction_receipts_touch_updated_at
AFTER UPDATE ON transaction_receipts FOR EACH ROW
WHEN NEW.updated_at = OLD.updated_at
BEGIN
    UPDATE transaction_receipts
    SET updated_at = CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)
    WHERE service_id = NEW.service_id AND transaction_id = NEW.transaction_id;
END;

CREATE TRIGGER submissions_touch_updated_at
AFTER UPDATE ON submissions FOR EACH ROW
WHEN NEW.updated_at = OLD.updated_at
BEGIN
    UPDATE submissions
    SET updated_at = CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)
    WHERE service_id = NEW.service_id AND batch_id = NEW.batch_id;
END;

CREATE TRIGGER batch_statuses_touch_updated_at
AFTER UPDATE ON batch_statuses FOR EACH ROW
WHEN NEW.updated_at = OLD.updated_at
BEGIN
    UPDATE batch_statuses
    SET updated_at = CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)
    WHERE service_id = NEW.service_id AND batch_id = NEW.batch_id;
END;

-- The lock entries of non-final batches (ledgerq.queue.parallel.BatchAccess):
-- 'r' may read and 'w' may write an address or prefix (lower-case hex, at most
-- 70 characters), 'd' depends on the transaction whose id is the entry.
-- Written with the batch, deleted when it becomes final.
CREATE TABLE batch_locks (
    seq        INTEGER NOT NULL,
    service_id VARCHAR(64) NOT NULL,
    mode       TEXT NOT NULL CHECK (mode IN ('r', 'w', 'd')),
    entry      TEXT NOT NULL,
    PRIMARY KEY (seq, mode, entry)
) WITHOUT ROWID;

-- Earlier entries equal to one, or under it (a range of the BINARY order).
CREATE INDEX batch_locks_entry_idx ON batch_locks (service_id, entry, mode, seq);
-- Entries shorter than an address: the prefixes that may begin an entry.
CREATE INDEX batch_locks_prefix_idx ON batch_locks (service_id, seq, mode, entry)
    WHERE length(entry) < 70 AND mode <> 'd';

-- Whether lock entries (batch_locks) and blockers (blocked_by) are kept: only once
-- some instance may run the parallel queuer. A new store starts without them;
-- a store opened for the parallel queuer computes them for every open batch
-- and turns this on, for good (docs/store.md).
CREATE TABLE lock_entries_kept (
    -- One row only.
    id   INTEGER PRIMARY KEY CHECK (id = 1),
    kept BOOLEAN NOT NULL
);

INSERT INTO lock_entries_kept (id, kept) VALUES (1, 0);

-- The parallel round's new picks: per service, its free new batches in order.
CREATE INDEX batches_ready_idx ON batches (service_id, seq)
    WHERE NOT final AND blocked_by IS NULL AND NOT submitted AND status IS NULL;
-- The batches a batch holds, looked up when it becomes final.
CREATE INDEX batches_blocked_by_idx ON batches (blocked_by)
    WHERE blocked_by IS NOT NULL AND NOT final;

-- A batch that became final (or a non-final one deleted) holds nothing: its
-- entries go, and the batches it held look for another blocker: the latest
-- earlier non-final batch of the service they conflict with, by the rule of
-- ledgerq.queue.parallel.conflict (the same expression as the named query
-- block_new_batches).
CREATE TRIGGER batches_release_locks_update AFTER UPDATE OF final ON batches
FOR EACH ROW WHEN NEW.final AND NOT OLD.final
BEGIN
    DELETE FROM batch_locks WHERE seq = OLD.seq;
    UPDATE batches SET blocked_by = nullif(max(
        -- The same entry, written before (each a backward index probe).
        coalesce((SELECT max((SELECT max(l.seq) FROM batch_locks l
                              WHERE l.service_id = n.service_id AND l.entry = n.entry
                                AND l.mode = 'w' AND l.seq < n.seq))
                  FROM batch_locks n WHERE n.seq = batches.seq AND n.mode IN ('r', 'w')), 0),
        -- The same entry, read before, when this batch writes it.
        coalesce((SELECT max((SELECT max(l.seq) FROM batch_locks l
                              WHERE l.service_id = n.service_id AND l.entry = n.entry
                                AND l.mode = 'r' AND l.seq < n.seq))
                  FROM batch_locks n WHERE n.seq = batches.seq AND n.mode = 'w'), 0),
        -- Longer entries that begin with one of ours: entries are hex, so they
        -- sort between it and it followed by 'g'.
        coalesce((SELECT max((SELECT max(l.seq) FROM batch_locks l
                              WHERE l.service_id = n.service_id AND l.entry > n.entry
                                AND l.entry < n.entry || 'g'
                                AND (l.mode = 'w' OR (l.mode = 'r' AND n.mode = 'w'))
                                AND l.seq < n.seq))
                  FROM batch_locks n WHERE n.seq = batches.seq AND n.mode IN ('r', 'w')), 0),
        -- Shorter entries that begin one of ours (prefixes: batch_locks_prefix_idx).
        coalesce((SELECT max((SELECT max(l.seq) FROM batch_locks l
                              WHERE l.service_id = n.service_id AND length(l.entry) < 70
                                AND l.mode <> 'd' AND l.seq < n.seq
                                AND length(l.entry) < length(n.entry)
                                AND substr(n.entry, 1, length(l.entry)) = l.entry
                                AND (l.mode = 'w' OR n.mode = 'w')))
                  FROM batch_locks n WHERE n.seq = batches.seq AND n.mode IN ('r', 'w')), 0),
        -- Transactions it depends on, in earlier non-final batches of the service.
        coalesce((SELECT max((SELECT max(d.seq) FROM transactions t
                              JOIN batches d ON d.service_id = t.service_id AND d.batch_id = t.batch_id
                              WHERE t.service_id = n.service_id AND t.transaction_id = n.entry
                                AND d.seq < n.seq AND NOT d.final))
                  FROM batch_locks n WHERE n.seq = batches.seq AND n.mode = 'd'), 0)
    ), 0)
    WHERE blocked_by = OLD.seq AND NOT final;
END;

CREATE TRIGGER batches_release_locks_delete AFTER DELETE ON batches
FOR EACH ROW WHEN NOT OLD.final
BEGIN
    DELETE FROM batch_locks WHERE seq = OLD.seq;
    UPDATE batches SET blocked_by = nullif(max(
        -- The same entry, written before (each a backward index probe).
        coalesce((SELECT max((SELECT max(l.seq) FROM batch_locks l
                              WHERE l.service_id = n.service_id AND l.entry = n.entry
                                AND l.mode = 'w' AND l.seq < n.seq))
                  FROM batch_locks n WHERE n.seq = batches.seq AND n.mode IN ('r', 'w')), 0),
        -- The same entry, read before, when this batch writes it.
        coalesce((SELECT max((SELECT max(l.seq) FROM batch_locks l
                              WHERE l.service_id = n.service_id AND l.entry = n.entry
                                AND l.mode = 'r' AND l.seq < n.seq))
                  FROM batch_locks n WHERE n.seq = batches.seq AND n.mode = 'w'), 0),
        -- Longer entries that begin with one of ours: entries are hex, so they
        -- sort between it and it followed by 'g'.
        coalesce((SELECT max((SELECT max(l.seq) FROM batch_locks l
                              WHERE l.service_id = n.service_id AND l.entry > n.entry
                                AND l.entry < n.entry || 'g'
                                AND (l.mode = 'w' OR (l.mode = 'r' AND n.mode = 'w'))
                                AND l.seq < n.seq))
                  FROM batch_locks n WHERE n.seq = batches.seq AND n.mode IN ('r', 'w')), 0),
        -- Shorter entries that begin one of ours (prefixes: batch_locks_prefix_idx).
        coalesce((SELECT max((SELECT max(l.seq) FROM batch_locks l
                              WHERE l.service_id = n.service_id AND length(l.entry) < 70
                                AND l.mode <> 'd' AND l.seq < n.seq
                                AND length(l.entry) < length(n.entry)
                                AND substr(n.entry, 1, length(l.entry)) = l.entry
                                AND (l.mode = 'w' OR n.mode = 'w')))
                  FROM batch_locks n WHERE n.seq = batches.seq AND n.mode IN ('r', 'w')), 0),
        -- Transactions it depends on, in earlier non-final batches of the service.
        coalesce((SELECT max((SELECT max(d.seq) FROM transactions t
                              JOIN batches d ON d.service_id = t.service_id AND d.batch_id = t.batch_id
                              WHERE t.service_id = n.service_id AND t.transaction_id = n.entry
                                AND d.seq < n.seq AND NOT d.final))
                  FROM batch_locks n WHERE n.seq = batches.seq AND n.mode = 'd'), 0)
    ), 0)
    WHERE blocked_by = OLD.seq AND NOT final;
END;

-- A batch id names one batch in one service; also the lookup by id alone.
CREATE UNIQUE INDEX batches_batch_id_key ON batches (batch_id);

-- A batch's transactions may depend on transactions of any service: they are
-- looked up by id alone.
CREATE INDEX transactions_id_idx ON transactions (transaction_id);

-- Per service, whether an operator paused it and where it halted (a batch
-- INVALID under on_invalid = halt). A service without a row is neither.
CREATE TABLE service_controls (
    service_id      VARCHAR(64) PRIMARY KEY CHECK (service_id <> ''),
    paused          BOOLEAN NOT NULL DEFAULT 0,
    halted_batch_id VARCHAR(128),
    halted_reason   TEXT,
    halted_at       INTEGER,
    updated_at      INTEGER NOT NULL
);

-- Every operator action, and every halt, as it happened.
CREATE TABLE service_actions (
    id         INTEGER PRIMARY KEY AUTOINCREMENT,
    service_id VARCHAR(64) NOT NULL,
    action     VARCHAR(16) NOT NULL
        CHECK (action IN ('pause', 'resume', 'cancel', 'halt', 'skip')),
    actor      TEXT NOT NULL,
    at         INTEGER NOT NULL,
    -- A JSON array of batch ids.
    batch_ids  TEXT NOT NULL DEFAULT '[]',
    detail     TEXT
);
CREATE INDEX service_actions_service_idx ON service_actions (service_id, id);
