-- Claim cycle queries (PostgreSQL). Parameters: %(me)s the instance id,
-- %(now)s its clock (ms). Every step runs at READ COMMITTED.
--
-- Lock order (docs/ha.md, "Lock order"): the store's fenced writes lock batch
-- rows, then share-lock claim rows, both in key order, and wait for them. The
-- claim cycle never waits for a claim row: every statement below that locks
-- claim rows takes them in service order with SKIP LOCKED (a row held by a
-- write or by another instance is left for the next cycle), and the renewal
-- writes the instance's own row only. So no wait of a claim cycle can close a
-- cycle of waits: no deadlock, whatever runs at the same time.
--
-- Expiry: a claim expires at the later of its own expiry (set when it was
-- taken) and its holder's lease (gateway_instances.expiry_1/2, renewed by
-- every heartbeat): greatest() ignores a NULL lease.
--
-- Mid-submission (a batch submitted, not final, its status None, Unknown or
-- Delayed) is tested per service as `coalesce(b.status, 'Unknown') IN
-- ('Unknown', 'Delayed')`, the same set, so that no plan can read it
-- through the index on status: with `status IS NULL OR status IN (...)` the
-- planner (statistics stale, as in a database filling up) intersected each
-- service's open batches with every batch of status NULL -- every batch
-- not yet submitted, thousands in a failover -- once per candidate, many
-- times slower, the claim rows locked and the renewal waiting meanwhile
-- (docs/design-notes.md).

-- name: take_candidates
-- Take-over, first statement: lock the claims of other instances whose
-- lease and own first expiry passed, and the holder's row (share: its
-- renewal waits until this transaction ends; an instance renewing right now
-- is skipped) -- only those that fall to this instance. Each expired claim
-- goes to its rendezvous winner: of the instances whose lease is valid, the
-- one with the highest hashtext(service || '/' || instance). Every live
-- instance computes the same split (a dead holder's lease has passed for all
-- of them), so survivors waking for the same expiry lock disjoint rows and
-- none skips the rows another is taking. A claim its winner left alone for a
-- renewal interval past its second expiry (the winner is paused or lagging)
-- falls to anyone. This instance counts among the live ones whatever its
-- lease (it renews in this cycle; the claims it takes carry their own
-- expiry): one whose lease lapsed while it was paused may take what another
-- takes too, and the second statement's re-check makes the later one a no-op.
-- At most `limit` rows at a time (the next cycle comes at once for more), those of
-- services with work waiting first.
-- `mid`: past the second expiry (the slow path), the batches left
-- mid-submission, for the ledger to be asked about while the claim is taken
-- (a read: what is recorded is decided under the new claim's fence); `work`:
-- the service has a batch not final.
WITH others AS MATERIALIZED (
    SELECT coalesce(array_agg(instance_id::TEXT), '{}') AS ids
    FROM gateway_instances
    WHERE expiry_1 > %(now)s AND instance_id <> %(me)s
)
SELECT c.service_id,
       CASE WHEN greatest(c.expiry_2, i.expiry_2) <= %(now)s THEN ARRAY(
           SELECT b.batch_id FROM batches AS b
           WHERE b.service_id = c.service_id
             AND b.submitted
             AND NOT b.final
             AND coalesce(b.status, 'Unknown') IN ('Unknown', 'Delayed')
           ORDER BY b.seq)
       END AS mid,
       EXISTS (SELECT 1 FROM queue_heads AS h
               WHERE h.service_id = c.service_id AND h.head_seq IS NOT NULL) AS work
FROM others
CROSS JOIN gateway_instances AS i
JOIN service_id_claims AS c ON c.claimant = i.instance_id
WHERE i.instance_id <> %(me)s
  AND coalesce(i.expiry_1, 0) <= %(now)s
  AND c.expiry_1 <= %(now)s
  AND (
        greatest(c.expiry_2, i.expiry_2) <= %(now)s - %(fallback_ms)s
        -- No live instance outranks this one (higher hash; on a tie, the
        -- smaller id): this one is the winner.
     OR NOT EXISTS (
             SELECT 1 FROM unnest(others.ids) AS o(id)
             WHERE (hashtext(c.service_id || '/' || o.id), %(me)s::TEXT)
                 > (hashtext(c.service_id || '/' || %(me)s), o.id))
  )
  -- What take_expired will take (it checks again, on a later snapshot).
  AND (
        greatest(c.expiry_2, i.expiry_2) <= %(now)s
     OR NOT EXISTS (
             SELECT 1 FROM batches AS b
             WHERE b.service_id = c.service_id
               AND b.submitted
               AND NOT b.final
               AND coalesce(b.status, 'Unknown') IN ('Unknown', 'Delayed'))
  )
-- Services with work waiting first (a batch not final): taken in a first,
-- small transaction, their work resumes before the idle ones are moved.
ORDER BY work DESC, c.service_id
LIMIT %(limit)s
FOR UPDATE OF c SKIP LOCKED
FOR SHARE OF i SKIP LOCKED;

-- name: take_expired
-- Take-over, second statement (a new snapshot, taken once the rows are
-- locked, so it sees every write that committed before): take those claims
-- over -- void and claimed again by this instance in one statement, with a
-- new epoch -- once past the second expiry, or past the first when the
-- service has nothing mid-submission (a batch marked submitted that the
-- ledger has not acknowledged: status None, or Unknown/Delayed being
-- resubmitted). Pending batches do not hold a claim: the ledger has them and
-- the new holder's monitor follows them.
UPDATE service_id_claims AS c
SET claimant = %(me)s,
    epoch = nextval('service_id_claims_epoch_seq'),
    expiry_1 = %(now)s + %(ttl_ms)s,
    expiry_2 = %(now)s + %(slow_ttl_ms)s,
    claimed_at = %(now)s,
    unclaimed_since = NULL,
    updated_at = %(now)s
FROM service_id_claims AS old
JOIN gateway_instances AS i ON i.instance_id = old.claimant
WHERE old.service_id = c.service_id
  AND c.service_id = ANY(%(service_ids)s::TEXT[])
  AND c.claimant IS NOT NULL
  AND c.claimant <> %(me)s
  AND greatest(c.expiry_1, i.expiry_1) <= %(now)s
  AND (
        greatest(c.expiry_2, i.expiry_2) <= %(now)s
     OR NOT EXISTS (
             SELECT 1 FROM batches AS b
             WHERE b.service_id = c.service_id
               AND b.submitted
               AND NOT b.final
               AND coalesce(b.status, 'Unknown') IN ('Unknown', 'Delayed'))
  )
RETURNING c.service_id, c.epoch, old.claimant AS previous_claimant,
          greatest(old.expiry_2, i.expiry_2) <= %(now)s AS slow_path;

-- name: next_foreign_expiry
-- When the next claim of another instance can be voided, if its holder does
-- not renew: the holder's lease, its second expiry once the first passed.
SELECT min(CASE WHEN i.expiry_1 > %(now)s THEN i.expiry_1 ELSE i.expiry_2 END) AS at
FROM gateway_instances AS i
WHERE i.instance_id <> %(me)s
  AND i.expiry_2 > %(now)s
  AND EXISTS (SELECT 1 FROM service_id_claims AS c WHERE c.claimant = i.instance_id);

-- name: forget_instances
-- Instances silent for forget_ms that hold nothing (their claims were voided
-- first: a claim always has its holder's row).
DELETE FROM gateway_instances AS i
WHERE i.heartbeat_at <= %(now)s - %(forget_ms)s
  AND i.instance_id <> %(me)s
  AND NOT EXISTS (SELECT 1 FROM service_id_claims AS c WHERE c.claimant = i.instance_id);

-- name: idle_candidates
-- Clean-up, first statement: claim rows, unclaimed or this instance's, older
-- than forget_ms, of services with no open batch and no batch accepted within
-- forget_ms; locked in service order, skipping rows in use.
SELECT c.service_id
FROM service_id_claims AS c
WHERE (c.claimant IS NULL OR c.claimant = %(me)s)
  AND c.created_at <= %(now)s - %(forget_ms)s
  AND NOT EXISTS (
      SELECT 1 FROM queue_heads AS h
      WHERE h.service_id = c.service_id AND h.head_seq IS NOT NULL)
  AND coalesce((SELECT b.created_at FROM batches AS b
                WHERE b.service_id = c.service_id
                ORDER BY b.seq DESC LIMIT 1), 0) <= %(now)s - %(forget_ms)s
ORDER BY c.service_id
LIMIT %(limit)s
FOR UPDATE OF c SKIP LOCKED;

-- name: forget_idle
-- Clean-up, second statement (new snapshot): delete those still idle. The
-- store's add_batches holds the service's advisory lock (class 0x6C710001,
-- ledgerq.store.postgres.ADVISORY_CLASS_SERVICE) until it commits, and
-- inserts the claim row after taking it: a service being written to right
-- now is skipped, and one written to after this commits gets its row back.
DELETE FROM service_id_claims AS c
WHERE c.service_id = ANY(%(service_ids)s::TEXT[])
  AND (c.claimant IS NULL OR c.claimant = %(me)s)
  AND c.created_at <= %(now)s - %(forget_ms)s
  AND pg_try_advisory_xact_lock(1819344897, hashtext(c.service_id))
  AND NOT EXISTS (
      SELECT 1 FROM batches AS b
      WHERE b.service_id = c.service_id
        AND (NOT b.final OR b.created_at > %(now)s - %(forget_ms)s))
RETURNING c.service_id;

-- name: heartbeat
-- The renewal: this instance's row, with the lease every claim it holds
-- follows. One row, however many claims.
INSERT INTO gateway_instances (instance_id, started_at, heartbeat_at, address, expiry_1, expiry_2)
VALUES (%(me)s, %(now)s, %(now)s, %(address)s, %(now)s + %(ttl_ms)s, %(now)s + %(slow_ttl_ms)s)
ON CONFLICT (instance_id) DO UPDATE
SET heartbeat_at = EXCLUDED.heartbeat_at,
    address = EXCLUDED.address,
    expiry_1 = EXCLUDED.expiry_1,
    expiry_2 = EXCLUDED.expiry_2;

-- name: claim_share
-- Take unclaimed services up to the fair share ceil(S / K) (S services, K live
-- instances), oldest unclaimed first, and at least every service unclaimed for
-- longer than the grace period whatever the share; only while this instance's
-- lease is valid. SKIP LOCKED: instances claiming at once take disjoint
-- services; a row claimed by another meanwhile fails the re-check.
WITH holder AS (
    SELECT 1 FROM gateway_instances
    WHERE instance_id = %(me)s AND expiry_1 > %(now)s
), live AS (
    SELECT greatest(count(*), 1) AS k
    FROM gateway_instances
    WHERE heartbeat_at > %(now)s - %(liveness_ms)s OR instance_id = %(me)s
), total AS (
    SELECT count(*) AS s FROM service_id_claims
), mine AS (
    SELECT count(*) AS m FROM service_id_claims WHERE claimant = %(me)s
), overdue AS (
    SELECT count(*) AS o FROM service_id_claims
    WHERE claimant IS NULL AND unclaimed_since <= %(now)s - %(grace_ms)s
), free AS (
    SELECT c.service_id
    FROM service_id_claims AS c
    WHERE c.claimant IS NULL AND EXISTS (SELECT 1 FROM holder)
    ORDER BY c.unclaimed_since, c.service_id
    LIMIT (SELECT greatest(ceil(total.s::numeric / live.k) - mine.m, overdue.o, 0)
           FROM total, live, mine, overdue)
    FOR UPDATE SKIP LOCKED
)
UPDATE service_id_claims AS c
SET claimant = %(me)s,
    epoch = nextval('service_id_claims_epoch_seq'),
    expiry_1 = %(now)s + %(ttl_ms)s,
    expiry_2 = %(now)s + %(slow_ttl_ms)s,
    claimed_at = %(now)s,
    unclaimed_since = NULL,
    updated_at = %(now)s
FROM free
WHERE c.service_id = free.service_id
RETURNING c.service_id, c.epoch;

-- name: hand_over_need
-- How many claims to give up so that instances below the floor share
-- floor(S / K) reach it: at most this instance's excess over the floor share,
-- at most what the others lack beyond the services already free.
WITH live AS (
    SELECT instance_id
    FROM gateway_instances
    WHERE heartbeat_at > %(now)s - %(liveness_ms)s OR instance_id = %(me)s
), counts AS (
    SELECT count(*) AS s,
           count(*) FILTER (WHERE claimant IS NULL) AS free,
           count(*) FILTER (WHERE claimant = %(me)s) AS m,
           count(*) / greatest((SELECT count(*) FROM live), 1) AS q
    FROM service_id_claims
), claims_of AS (
    SELECT claimant, count(*) AS n
    FROM service_id_claims
    WHERE claimant IS NOT NULL
    GROUP BY claimant
), need AS (
    SELECT greatest(coalesce(sum(greatest(counts.q - coalesce(h.n, 0), 0)), 0) - counts.free, 0)
           AS n
    FROM live
    CROSS JOIN counts
    LEFT JOIN claims_of AS h ON h.claimant = live.instance_id
    WHERE live.instance_id <> %(me)s
    GROUP BY counts.q, counts.free
)
SELECT greatest(least(counts.m - counts.q, coalesce((SELECT n FROM need), 0)), 0) AS n
FROM counts;

-- name: hand_over_candidates
-- Claims to give up, locked: only services with nothing in flight (no
-- submitted, non-final batch), held for at least %(min_claimed_ms)s (so a
-- service taken past its grace period is not handed straight back), idle
-- services (no open batch) first.
SELECT c.service_id
FROM service_id_claims AS c
LEFT JOIN queue_heads AS h ON h.service_id = c.service_id
WHERE c.claimant = %(me)s
  AND c.claimed_at <= %(now)s - %(min_claimed_ms)s
  AND NOT EXISTS (
      SELECT 1 FROM batches AS b
      WHERE b.service_id = c.service_id AND b.submitted AND NOT b.final)
ORDER BY h.head_seq IS NOT NULL, c.claimed_at DESC, c.service_id
LIMIT %(limit)s
FOR UPDATE OF c SKIP LOCKED;

-- name: hand_over
-- Give them up, checking again (new snapshot) that nothing is in flight.
UPDATE service_id_claims AS c
SET claimant = NULL,
    expiry_1 = NULL,
    expiry_2 = NULL,
    claimed_at = NULL,
    unclaimed_since = %(now)s,
    updated_at = %(now)s
WHERE c.service_id = ANY(%(service_ids)s::TEXT[])
  AND c.claimant = %(me)s
  AND NOT EXISTS (
      SELECT 1 FROM batches AS b
      WHERE b.service_id = c.service_id AND b.submitted AND NOT b.final)
RETURNING c.service_id;

-- name: claimed_digest
-- What this instance holds, summed up: how many claims, the sum of their
-- epochs (epochs only grow, and only this instance claims for itself, so the
-- pair changes whenever the set does), and its lease.
SELECT count(c.service_id) AS n,
       coalesce(sum(c.epoch), 0) AS epochs,
       (SELECT i.expiry_1 FROM gateway_instances AS i WHERE i.instance_id = %(me)s) AS lease
FROM service_id_claims AS c
WHERE c.claimant = %(me)s;

-- name: claimed
SELECT service_id, epoch
FROM service_id_claims
WHERE claimant = %(me)s
ORDER BY service_id;

-- name: with_work
-- Of services this instance took over idle, those with a batch not final
-- now (one was accepted since the take-over read them): the pipeline is
-- told to look at these.
SELECT h.service_id
FROM queue_heads AS h
WHERE h.service_id = ANY(%(service_ids)s::TEXT[])
  AND h.head_seq IS NOT NULL;

-- name: lock_all
-- Clean shutdown, first statement: lock every claim of this instance in
-- service order, the order every other claim statement locks in (it waits:
-- the submitter has drained by now).
SELECT service_id FROM service_id_claims
WHERE claimant = %(me)s
ORDER BY service_id
FOR UPDATE;

-- name: release_all
-- Clean shutdown, second statement (the rows are this transaction's now):
-- give everything back, marked as past the grace period so that any
-- instance takes it at once. One UPDATE without a join: joined on the
-- locking CTE, the planner took a nested loop whenever the table's
-- statistics still said this instance had almost nothing (every claim taken
-- since the last ANALYZE), which over thousands of claims runs past
-- db_timeout_ms.
UPDATE service_id_claims
SET claimant = NULL,
    expiry_1 = NULL,
    expiry_2 = NULL,
    claimed_at = NULL,
    unclaimed_since = %(now)s - %(grace_ms)s,
    updated_at = %(now)s
WHERE claimant = %(me)s
RETURNING service_id;

-- name: deregister
DELETE FROM gateway_instances WHERE instance_id = %(me)s;

-- name: register_services
-- New service ids get an unclaimed row (the store does the same inside
-- add_batches).
INSERT INTO service_id_claims (service_id, unclaimed_since, created_at, updated_at)
SELECT DISTINCT s, %(now)s::BIGINT, %(now)s::BIGINT, %(now)s::BIGINT
FROM unnest(%(service_ids)s::TEXT[]) AS s
ORDER BY 1
ON CONFLICT (service_id) DO NOTHING;

-- name: list_instances
SELECT i.instance_id, i.started_at, i.heartbeat_at, i.address,
       (SELECT count(*) FROM service_id_claims AS c WHERE c.claimant = i.instance_id) AS claims
FROM gateway_instances AS i
ORDER BY i.started_at, i.instance_id;

-- name: claims_for
-- The claims of some services, with the expiries that apply (lease included).
SELECT c.service_id, c.claimant, c.epoch,
       greatest(c.expiry_1, i.expiry_1) AS expiry_1,
       greatest(c.expiry_2, i.expiry_2) AS expiry_2,
       c.claimed_at, c.unclaimed_since
FROM service_id_claims AS c
LEFT JOIN gateway_instances AS i ON i.instance_id = c.claimant
WHERE c.service_id = ANY(%(service_ids)s::TEXT[])
ORDER BY c.service_id;
