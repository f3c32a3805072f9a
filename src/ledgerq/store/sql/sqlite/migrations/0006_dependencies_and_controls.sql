-- Declared dependencies and operator control of a service (docs/queuer.md,
-- "Declared dependencies"; docs/operations.md, "Halting, pausing and
-- cancelling").
--
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
