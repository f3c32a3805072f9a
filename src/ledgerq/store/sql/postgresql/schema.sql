-- Canonical schema (equal to replaying migrations/ in order; a test checks it): the batch
-- tracking store, the seed's five tables with the fixes listed in
-- docs/schema.md, plus ledgerq's acceptance order (seq) and attempt columns.
-- Timestamps are BIGINT milliseconds since the Unix epoch (UTC).

CREATE FUNCTION ledgerq_now_ms() RETURNS BIGINT
    LANGUAGE sql VOLATILE
    AS $$ SELECT floor(extract(epoch FROM clock_timestamp()) * 1000)::BIGINT $$;

-- Keeps updated_at current on UPDATE. The store writes updated_at itself (with
-- its injected clock); the trigger only fills in when a statement left it
-- unchanged, e.g. a manual UPDATE.
CREATE FUNCTION ledgerq_touch_updated_at() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    IF NEW.updated_at IS NOT DISTINCT FROM OLD.updated_at THEN
        NEW.updated_at := ledgerq_now_ms();
    END IF;
    RETURN NEW;
END
$$;

CREATE TABLE batches (
    seq               BIGINT GENERATED ALWAYS AS IDENTITY,
    service_id        VARCHAR(64) NOT NULL CHECK (service_id <> ''),
    batch_id          VARCHAR(128) NOT NULL CHECK (batch_id <> ''),
    data_change_id    VARCHAR(256),
    signer_public_key VARCHAR(70) NOT NULL,
    trace             BOOLEAN NOT NULL,
    serialized_batch  BYTEA NOT NULL,
    submitted         BOOLEAN NOT NULL DEFAULT FALSE,
    created_at        BIGINT NOT NULL DEFAULT ledgerq_now_ms(),
    -- Mirror of batch_statuses.dlt_status, written in the same transaction, so
    -- the queuer reads one table and final batches drop out of batches_open_idx.
    status            VARCHAR(16)
        CHECK (status IN ('Unknown', 'Pending', 'Delayed', 'Invalid', 'Valid', 'Committed')),
    final             BOOLEAN NOT NULL DEFAULT FALSE,
    last_attempt_at   BIGINT,
    attempts          INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (service_id, batch_id),
    CONSTRAINT batches_seq_key UNIQUE (seq),
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
    payload           BYTEA NOT NULL,
    family_name       VARCHAR(128) NOT NULL,
    family_version    VARCHAR(16) NOT NULL,
    signer_public_key VARCHAR(70) NOT NULL,
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
    error_data             BYTEA,
    serialized_receipt     BYTEA NOT NULL,
    external_status        TEXT,
    external_error_message TEXT,
    created_at             BIGINT NOT NULL DEFAULT ledgerq_now_ms(),
    updated_at             BIGINT NOT NULL DEFAULT ledgerq_now_ms(),
    PRIMARY KEY (service_id, transaction_id)
);

CREATE TABLE submissions (
    service_id    VARCHAR(64) NOT NULL,
    batch_id      VARCHAR(128) NOT NULL,
    last_checked  BIGINT NOT NULL DEFAULT ledgerq_now_ms(),
    times_checked INTEGER NOT NULL DEFAULT 1,
    error_type    VARCHAR(64),
    error_message TEXT,
    created_at    BIGINT NOT NULL DEFAULT ledgerq_now_ms(),
    updated_at    BIGINT NOT NULL DEFAULT ledgerq_now_ms(),
    PRIMARY KEY (service_id, batch_id),
    FOREIGN KEY (service_id, batch_id)
        REFERENCES batches (service_id, batch_id) ON DELETE CASCADE
);

CREATE TABLE batch_statuses (
    service_id VARCHAR(64) NOT NULL,
    batch_id   VARCHAR(128) NOT NULL,
    dlt_status VARCHAR(16) NOT NULL
        CHECK (dlt_status IN ('Unknown', 'Pending', 'Delayed', 'Invalid', 'Valid', 'Committed')),
    created_at BIGINT NOT NULL DEFAULT ledgerq_now_ms(),
    updated_at BIGINT NOT NULL DEFAULT ledgerq_now_ms(),
    PRIMARY KEY (service_id, batch_id),
    FOREIGN KEY (service_id, batch_id)
        REFERENCES batches (service_id, batch_id) ON DELETE CASCADE
);

CREATE TRIGGER transaction_receipts_touch_updated_at BEFORE UPDATE ON transaction_receipts
    FOR EACH ROW EXECUTE FUNCTION ledgerq_touch_updated_at();
CREATE TRIGGER submissions_touch_updated_at BEFORE UPDATE ON submissions
    FOR EACH ROW EXECUTE FUNCTION ledgerq_touch_updated_at();
CREATE TRIGGER batch_statuses_touch_updated_at BEFORE UPDATE ON batch_statuses
    FOR EACH ROW EXECUTE FUNCTION ledgerq_touch_updated_at();

-- High availability: gateway instances and their claims on service ids
-- (docs/ha.md). Times are BIGINT ms from the instances' injected clocks.

CREATE TABLE gateway_instances (
    instance_id  VARCHAR(128) PRIMARY KEY CHECK (instance_id <> ''),
    started_at   BIGINT NOT NULL,
    -- Written on every renewal; instances with a recent heartbeat count toward
    -- the fair share.
    heartbeat_at BIGINT NOT NULL,
    address      TEXT
);

CREATE TABLE service_id_claims (
    service_id      VARCHAR(64) PRIMARY KEY CHECK (service_id <> ''),
    -- NULL: unclaimed (never claimed, voided, handed over or released).
    claimant        VARCHAR(128),
    -- Grows by one every time the service is claimed; fenced writes carry the
    -- epoch they acted under.
    epoch           BIGINT NOT NULL DEFAULT 0,
    -- First expiry: void once passed unless the holder is mid-submission.
    expiry_1        BIGINT,
    -- Second expiry: void once passed, whatever the holder is doing.
    expiry_2        BIGINT,
    claimed_at      BIGINT,
    -- When the service last became unclaimed; drives the grace period.
    unclaimed_since BIGINT,
    created_at      BIGINT NOT NULL DEFAULT ledgerq_now_ms(),
    updated_at      BIGINT NOT NULL DEFAULT ledgerq_now_ms(),
    CONSTRAINT service_id_claims_state_check CHECK (
        (claimant IS NOT NULL AND expiry_1 IS NOT NULL AND expiry_2 IS NOT NULL
            AND claimed_at IS NOT NULL AND unclaimed_since IS NULL)
        OR (claimant IS NULL AND expiry_1 IS NULL AND expiry_2 IS NULL
            AND claimed_at IS NULL AND unclaimed_since IS NOT NULL)
    )
);

CREATE INDEX service_id_claims_claimant_idx ON service_id_claims (claimant);
