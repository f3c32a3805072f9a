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

-- Services already tracked get an unclaimed row, as new ones do in add_batches.
INSERT INTO service_id_claims (service_id, unclaimed_since)
SELECT DISTINCT service_id, ledgerq_now_ms() FROM batches;
