-- Claim cycle queries (PostgreSQL). Every step runs in its own SERIALIZABLE
-- transaction; parameters: %(me)s the instance id, %(now)s its clock (ms).

-- name: void_expired
-- Maintenance. Void other instances' claims past the second expiry, or past
-- the first expiry when the service has nothing mid-submission (a batch
-- marked submitted that the ledger has not acknowledged: status None, or
-- Unknown/Delayed being resubmitted). Pending batches do not hold a claim:
-- the ledger has them and the next holder's monitor follows them.
UPDATE service_id_claims AS c
SET claimant = NULL,
    expiry_1 = NULL,
    expiry_2 = NULL,
    claimed_at = NULL,
    unclaimed_since = %(now)s,
    updated_at = %(now)s
FROM service_id_claims AS old
WHERE old.service_id = c.service_id
  AND c.claimant IS NOT NULL
  AND c.claimant <> %(me)s
  AND (
        c.expiry_2 <= %(now)s
     OR (c.expiry_1 <= %(now)s
         AND NOT EXISTS (
             SELECT 1 FROM batches AS b
             WHERE b.service_id = c.service_id
               AND b.submitted
               AND NOT b.final
               AND (b.status IS NULL OR b.status IN ('Unknown', 'Delayed'))))
  )
RETURNING c.service_id, old.claimant AS previous_claimant, old.expiry_2 <= %(now)s AS slow_path;

-- name: next_foreign_expiry
-- When the next claim of another instance can be voided, if it is not renewed:
-- its first expiry, or its second once the first has passed.
SELECT min(CASE WHEN expiry_1 > %(now)s THEN expiry_1 ELSE expiry_2 END) AS at
FROM service_id_claims
WHERE claimant IS NOT NULL AND claimant <> %(me)s AND expiry_2 > %(now)s;

-- name: forget_instances
DELETE FROM gateway_instances
WHERE heartbeat_at <= %(now)s - %(forget_ms)s AND instance_id <> %(me)s;

-- name: heartbeat
INSERT INTO gateway_instances (instance_id, started_at, heartbeat_at, address)
VALUES (%(me)s, %(now)s, %(now)s, %(address)s)
ON CONFLICT (instance_id) DO UPDATE
SET heartbeat_at = EXCLUDED.heartbeat_at, address = EXCLUDED.address;

-- name: renew
-- Renews what the database says this instance holds, never what it remembers.
UPDATE service_id_claims
SET expiry_1 = %(now)s + %(ttl_ms)s,
    expiry_2 = %(now)s + %(slow_ttl_ms)s,
    updated_at = %(now)s
WHERE claimant = %(me)s;

-- name: claim_share
-- Take unclaimed services up to the fair share ceil(S / K) (S services, K live
-- instances), oldest unclaimed first, plus every service unclaimed for longer
-- than the grace period whatever the share.
WITH live AS (
    SELECT greatest(count(*), 1) AS k
    FROM gateway_instances
    WHERE heartbeat_at > %(now)s - %(liveness_ms)s OR instance_id = %(me)s
), total AS (
    SELECT count(*) AS s FROM service_id_claims
), mine AS (
    SELECT count(*) AS m FROM service_id_claims WHERE claimant = %(me)s
), free AS (
    SELECT service_id,
           row_number() OVER (ORDER BY unclaimed_since, service_id) AS rn,
           unclaimed_since <= %(now)s - %(grace_ms)s AS overdue
    FROM service_id_claims
    WHERE claimant IS NULL
)
UPDATE service_id_claims AS c
SET claimant = %(me)s,
    epoch = c.epoch + 1,
    expiry_1 = %(now)s + %(ttl_ms)s,
    expiry_2 = %(now)s + %(slow_ttl_ms)s,
    claimed_at = %(now)s,
    unclaimed_since = NULL,
    updated_at = %(now)s
FROM free, live, total, mine
WHERE c.service_id = free.service_id
  AND c.claimant IS NULL
  AND (free.overdue OR free.rn <= ceil(total.s::numeric / live.k) - mine.m)
RETURNING c.service_id, c.epoch;

-- name: hand_over
-- Give up claims so that instances below the floor share floor(S / K) reach
-- it: at most this instance's excess over the floor share, at most what the
-- others lack beyond the services already free. Only services with nothing
-- in flight (no submitted, non-final batch), held for at least %(min_hold_ms)s
-- (so a service taken past its grace period is not handed straight back),
-- idle services first.
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
), held_by AS (
    SELECT claimant, count(*) AS n
    FROM service_id_claims
    WHERE claimant IS NOT NULL
    GROUP BY claimant
), need AS (
    SELECT greatest(coalesce(sum(greatest(counts.q - coalesce(h.n, 0), 0)), 0) - counts.free, 0)
           AS n
    FROM live
    CROSS JOIN counts
    LEFT JOIN held_by AS h ON h.claimant = live.instance_id
    WHERE live.instance_id <> %(me)s
    GROUP BY counts.q, counts.free
), spare AS (
    SELECT c.service_id,
           row_number() OVER (
               ORDER BY EXISTS (
                   SELECT 1 FROM batches AS b WHERE b.service_id = c.service_id AND NOT b.final),
               c.claimed_at DESC,
               c.service_id) AS rn
    FROM service_id_claims AS c
    WHERE c.claimant = %(me)s
      AND c.claimed_at <= %(now)s - %(min_hold_ms)s
      AND NOT EXISTS (
          SELECT 1 FROM batches AS b
          WHERE b.service_id = c.service_id AND b.submitted AND NOT b.final)
)
UPDATE service_id_claims AS c
SET claimant = NULL,
    expiry_1 = NULL,
    expiry_2 = NULL,
    claimed_at = NULL,
    unclaimed_since = %(now)s,
    updated_at = %(now)s
FROM spare, counts, need
WHERE c.service_id = spare.service_id
  AND c.claimant = %(me)s
  AND spare.rn <= least(counts.m - counts.q, need.n)
RETURNING c.service_id;

-- name: held
SELECT service_id, epoch, expiry_1
FROM service_id_claims
WHERE claimant = %(me)s
ORDER BY service_id;

-- name: release_all
-- Clean shutdown: give everything back, marked as past the grace period so
-- that any instance takes it at once, and leave the live set.
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
ON CONFLICT (service_id) DO NOTHING;

-- name: list_instances
SELECT i.instance_id, i.started_at, i.heartbeat_at, i.address,
       (SELECT count(*) FROM service_id_claims AS c WHERE c.claimant = i.instance_id) AS claims
FROM gateway_instances AS i
ORDER BY i.started_at, i.instance_id;

-- name: claims_for
SELECT service_id, claimant, epoch, expiry_1, expiry_2, claimed_at, unclaimed_since
FROM service_id_claims
WHERE service_id = ANY(%(service_ids)s::TEXT[])
ORDER BY service_id;
