-- Named queries of the PostgreSQL backend. Parameters are %(named)s.
-- Batch rows are selected in the column order ledgerq.store.common.assemble expects.

-- name: schema_version_create
CREATE TABLE IF NOT EXISTS schema_version (
    version    INTEGER PRIMARY KEY,
    name       TEXT NOT NULL,
    applied_at BIGINT NOT NULL
);

-- name: schema_version_rows
SELECT version, name FROM schema_version;

-- name: schema_version_insert
INSERT INTO schema_version (version, name, applied_at)
VALUES (%(version)s, %(name)s, %(applied_at)s);

-- name: table_exists
SELECT count(*) FROM pg_catalog.pg_tables
WHERE schemaname = current_schema() AND tablename = %(name)s::text;

-- name: lock_migrations
SELECT pg_advisory_xact_lock(%(lock_class)s::int, 0);

-- Per-service advisory locks in key order (no deadlocks between writers).
-- name: lock_services
SELECT pg_advisory_xact_lock(%(lock_class)s::int, k)
FROM (SELECT DISTINCT hashtext(s) AS k FROM unnest(%(service_ids)s::text[]) AS s ORDER BY k) AS keys;

-- Whether lock entries and blockers are kept (lock_entries_kept): add_batches
-- reads it under this shared lock, the switch (keep_lock_entries) takes it
-- exclusively, so no batch committed after the switch lacks its entries.
-- name: share_lock_entries_switch
SELECT pg_advisory_xact_lock_shared(%(lock_class)s::int, 0);

-- name: lock_entries_switch
SELECT pg_advisory_xact_lock(%(lock_class)s::int, 0);

-- name: lock_entries_kept
SELECT kept FROM lock_entries_kept;

-- Turning lock entries on: every service's queue_heads row, in key order (as
-- add_batches and a group making batches final lock theirs), so no batch
-- becomes final or is added while the entries are computed.
-- name: lock_all_queue_heads
SELECT service_id FROM queue_heads ORDER BY service_id FOR UPDATE;

-- name: clear_batch_locks
DELETE FROM batch_locks;

-- The declared access of every open batch, for its lock entries.
-- name: open_batch_access
SELECT b.seq, b.service_id, b.batch_id, t.transaction_id, t.inputs, t.outputs, t.dependencies
FROM batches b
JOIN transactions t ON t.service_id = b.service_id AND t.batch_id = b.batch_id
WHERE NOT b.final
ORDER BY b.seq, t.position;

-- Every open batch's blocker, from the entries just written.
-- name: repoint_open_batches
UPDATE batches b
SET blocked_by = x.blocker
FROM (SELECT seq, ledgerq_blocker(service_id, seq) AS blocker FROM batches WHERE NOT final) x
WHERE b.seq = x.seq AND b.blocked_by IS DISTINCT FROM x.blocker;

-- name: keep_lock_entries
UPDATE lock_entries_kept SET kept = TRUE;

-- Seqs for one add_batches call, increasing; the caller assigns them in list order.
-- name: allocate_seqs
SELECT nextval(pg_get_serial_sequence('batches', 'seq'))
FROM generate_series(1, %(count)s::int);

-- New services get an unclaimed claim row (docs/ha.md), in the same transaction.
-- name: insert_service_claims
INSERT INTO service_id_claims (service_id, unclaimed_since, created_at, updated_at)
SELECT i.service_id, min(i.created_at), min(i.created_at), min(i.created_at)
FROM unnest(%(service_ids)s::text[], %(created_ats)s::bigint[]) AS i(service_id, created_at)
GROUP BY i.service_id
ORDER BY i.service_id
ON CONFLICT (service_id) DO NOTHING;

-- The queue_heads rows of the services an add_batches call adds to, locked in
-- key order before it looks for the new batches' blockers: a batch becoming
-- final locks the same row (ledgerq_release), so the two take turns per
-- service and each sees what the other committed. A new service's row starts
-- without a head; the insert trigger on batches sets it.
-- name: lock_queue_heads
INSERT INTO queue_heads AS q (service_id, head_seq)
SELECT DISTINCT s, NULL::bigint FROM unnest(%(service_ids)s::text[]) AS s ORDER BY 1
ON CONFLICT (service_id) DO UPDATE SET head_seq = q.head_seq;

-- The lock entries of new batches, as array literals (one element per row).
-- name: insert_lock_rows
INSERT INTO batch_locks (seq, service_id, mode, entry)
SELECT * FROM unnest(%(seqs)s::bigint[], %(service_ids)s::text[], %(modes)s::text[],
                     %(entries)s::text[]);

-- The blockers of new batches whose lock entries are written, in one
-- statement: ledgerq_blocker's rule (schema.sql) for every batch of %(seqs)s,
-- set-based: the function called once per batch (PL/pgSQL, five subqueries
-- per call) costs far more than its index probes. The two must say the same.
-- name: blockers_of
SELECT c.seq, max(c.hit)
FROM (
    -- The same entry, written before (each a backward index probe).
    SELECT n.seq, (SELECT max(l.seq) FROM batch_locks l
                   WHERE l.service_id = n.service_id AND l.entry = n.entry AND l.mode = 'w'
                     AND l.seq < n.seq) AS hit
    FROM batch_locks n WHERE n.seq = ANY(%(seqs)s::bigint[]) AND n.mode IN ('r', 'w')
    UNION ALL
    -- The same entry, read before, when this batch writes it.
    SELECT n.seq, (SELECT max(l.seq) FROM batch_locks l
                   WHERE l.service_id = n.service_id AND l.entry = n.entry AND l.mode = 'r'
                     AND l.seq < n.seq)
    FROM batch_locks n WHERE n.seq = ANY(%(seqs)s::bigint[]) AND n.mode = 'w'
    UNION ALL
    -- Longer entries that begin with one of ours: entries are hex, so they
    -- sort between it and it followed by 'g'.
    SELECT n.seq, (SELECT max(l.seq) FROM batch_locks l
                   WHERE l.service_id = n.service_id AND l.entry > n.entry
                     AND l.entry < n.entry || 'g'
                     AND (l.mode = 'w' OR (l.mode = 'r' AND n.mode = 'w')) AND l.seq < n.seq)
    FROM batch_locks n WHERE n.seq = ANY(%(seqs)s::bigint[]) AND n.mode IN ('r', 'w')
    UNION ALL
    -- Shorter entries that begin one of ours (prefixes: batch_locks_prefix_idx).
    SELECT n.seq, (SELECT max(l.seq) FROM batch_locks l
                   WHERE l.service_id = n.service_id AND length(l.entry) < 70 AND l.mode <> 'd'
                     AND l.seq < n.seq AND length(l.entry) < length(n.entry)
                     AND starts_with(n.entry, l.entry)
                     AND (l.mode = 'w' OR n.mode = 'w'))
    FROM batch_locks n WHERE n.seq = ANY(%(seqs)s::bigint[]) AND n.mode IN ('r', 'w')
    UNION ALL
    -- Transactions it depends on, in earlier non-final batches of the service.
    SELECT n.seq, (SELECT max(b.seq) FROM transactions t
                   JOIN batches b ON b.service_id = t.service_id AND b.batch_id = t.batch_id
                   WHERE t.service_id = n.service_id AND t.transaction_id = n.entry
                     AND b.seq < n.seq AND NOT b.final)
    FROM batch_locks n WHERE n.seq = ANY(%(seqs)s::bigint[]) AND n.mode = 'd'
) AS c
GROUP BY c.seq;

-- New batches and their transactions from array literals (one element per
-- row), for lists small enough to bind on the client; held, and sent with the
-- COMMIT. A transaction's inputs, outputs and dependencies come as the text
-- of an array each (NULL: not known).
-- name: insert_batch_rows
INSERT INTO batches
    (seq, service_id, batch_id, data_change_id, signer_public_key, trace, serialized_batch,
     created_at, blocked_by)
SELECT * FROM unnest(%(seqs)s::bigint[], %(service_ids)s::text[], %(batch_ids)s::text[],
                     %(data_change_ids)s::text[], %(signer_public_keys)s::text[],
                     %(traces)s::bool[], %(serialized_batches)s::bytea[],
                     %(created_ats)s::bigint[], %(blocked_by)s::bigint[]);

-- name: insert_transaction_rows
INSERT INTO transactions
    (service_id, transaction_id, batch_id, position, payload, family_name, family_version,
     signer_public_key, inputs, outputs, dependencies)
SELECT i.service_id, i.transaction_id, i.batch_id, i.position, i.payload, i.family_name,
       i.family_version, i.signer_public_key, i.inputs::text[], i.outputs::text[],
       i.dependencies::text[]
FROM unnest(%(service_ids)s::text[], %(transaction_ids)s::text[], %(batch_ids)s::text[],
            %(positions)s::int[], %(payloads)s::bytea[], %(family_names)s::text[],
            %(family_versions)s::text[], %(signer_public_keys)s::text[], %(inputs)s::text[],
            %(outputs)s::text[], %(dependencies)s::text[])
     AS i(service_id, transaction_id, batch_id, position, payload, family_name, family_version,
          signer_public_key, inputs, outputs, dependencies);

-- Binary COPY, for large lists; column order and types must match the rows
-- ledgerq.store.postgres writes.
-- name: copy_batches
COPY batches
    (seq, service_id, batch_id, data_change_id, signer_public_key, trace, serialized_batch,
     created_at, blocked_by)
FROM STDIN (FORMAT BINARY);

-- name: copy_transactions
COPY transactions
    (service_id, transaction_id, batch_id, position, payload, family_name, family_version,
     signer_public_key, inputs, outputs, dependencies)
FROM STDIN (FORMAT BINARY);

-- A batch id names one batch in one service (batches_batch_id_key).
-- name: batch_owner
SELECT service_id FROM batches WHERE batch_id = %(batch_id)s;

-- name: data_change_id_owner
SELECT batch_id FROM batches
WHERE service_id = %(service_id)s AND data_change_id = %(data_change_id)s;

-- name: transaction_owner
SELECT batch_id FROM transactions
WHERE service_id = %(service_id)s AND transaction_id = %(transaction_id)s;

-- name: batch_state
SELECT batch_id, status, submitted
FROM batches
WHERE service_id = %(service_id)s AND batch_id = %(batch_id)s
FOR UPDATE;

-- Fencing: the claim row is share-locked until the write commits, so the
-- claim cannot be voided, handed over or taken while the write is under way.
-- name: lock_claim
SELECT epoch
FROM service_id_claims
WHERE service_id = %(service_id)s AND claimant = %(instance_id)s AND epoch = %(epoch)s
FOR SHARE;

-- name: batch_state_by_data_change_id
SELECT batch_id, status, submitted
FROM batches
WHERE service_id = %(service_id)s AND data_change_id = %(data_change_id)s
FOR UPDATE;

-- name: get_batch
SELECT b.seq, b.service_id, b.batch_id, b.data_change_id, b.signer_public_key, b.trace,
       b.serialized_batch, b.submitted, b.created_at, b.last_attempt_at, b.attempts,
       b.status, s.error_type, s.error_message
FROM batches b
LEFT JOIN submissions s ON s.service_id = b.service_id AND s.batch_id = b.batch_id
WHERE b.service_id = %(service_id)s AND b.batch_id = %(batch_id)s;

-- name: get_batch_by_data_change_id
SELECT b.seq, b.service_id, b.batch_id, b.data_change_id, b.signer_public_key, b.trace,
       b.serialized_batch, b.submitted, b.created_at, b.last_attempt_at, b.attempts,
       b.status, s.error_type, s.error_message
FROM batches b
LEFT JOIN submissions s ON s.service_id = b.service_id AND s.batch_id = b.batch_id
WHERE b.service_id = %(service_id)s AND b.data_change_id = %(data_change_id)s;

-- name: list_batches_by_status
SELECT b.seq, b.service_id, b.batch_id, b.data_change_id, b.signer_public_key, b.trace,
       b.serialized_batch, b.submitted, b.created_at, b.last_attempt_at, b.attempts,
       b.status, s.error_type, s.error_message
FROM batches b
LEFT JOIN submissions s ON s.service_id = b.service_id AND s.batch_id = b.batch_id
WHERE b.status = %(status)s::text
ORDER BY b.seq;

-- name: get_unsubmitted_batches
SELECT b.seq, b.service_id, b.batch_id, b.data_change_id, b.signer_public_key, b.trace,
       b.serialized_batch, b.submitted, b.created_at, b.last_attempt_at, b.attempts,
       b.status, s.error_type, s.error_message
FROM batches b
LEFT JOIN submissions s ON s.service_id = b.service_id AND s.batch_id = b.batch_id
WHERE NOT b.final AND NOT b.submitted
ORDER BY b.seq;

-- name: get_failed_batches
SELECT b.seq, b.service_id, b.batch_id, b.data_change_id, b.signer_public_key, b.trace,
       b.serialized_batch, b.submitted, b.created_at, b.last_attempt_at, b.attempts,
       b.status, s.error_type, s.error_message
FROM batches b
LEFT JOIN submissions s ON s.service_id = b.service_id AND s.batch_id = b.batch_id
WHERE b.status = 'Invalid'
   OR (s.error_type IS NOT NULL AND (b.status IS NULL OR b.status NOT IN ('Valid', 'Committed')))
ORDER BY b.seq;

-- list_batches: one query per filter combination, so each can use its index
-- (batches_seq, batches_service_seq_idx, batches_status_seq_idx). A status of
-- NULL selects batches without one.

-- name: list_batches
SELECT b.seq, b.service_id, b.batch_id, b.data_change_id, b.signer_public_key, b.trace,
       b.serialized_batch, b.submitted, b.created_at, b.last_attempt_at, b.attempts,
       b.status, s.error_type, s.error_message
FROM batches b
LEFT JOIN submissions s ON s.service_id = b.service_id AND s.batch_id = b.batch_id
WHERE b.seq > %(after_seq)s::bigint
ORDER BY b.seq
LIMIT %(limit)s::int;

-- name: list_batches_service
SELECT b.seq, b.service_id, b.batch_id, b.data_change_id, b.signer_public_key, b.trace,
       b.serialized_batch, b.submitted, b.created_at, b.last_attempt_at, b.attempts,
       b.status, s.error_type, s.error_message
FROM batches b
LEFT JOIN submissions s ON s.service_id = b.service_id AND s.batch_id = b.batch_id
WHERE b.service_id = %(service_id)s::text
  AND b.seq > %(after_seq)s::bigint
ORDER BY b.seq
LIMIT %(limit)s::int;

-- name: list_batches_status
SELECT b.seq, b.service_id, b.batch_id, b.data_change_id, b.signer_public_key, b.trace,
       b.serialized_batch, b.submitted, b.created_at, b.last_attempt_at, b.attempts,
       b.status, s.error_type, s.error_message
FROM batches b
LEFT JOIN submissions s ON s.service_id = b.service_id AND s.batch_id = b.batch_id
WHERE (b.status = %(status)s::text OR (%(status)s::text IS NULL AND b.status IS NULL))
  AND b.seq > %(after_seq)s::bigint
ORDER BY b.seq
LIMIT %(limit)s::int;

-- name: list_batches_service_status
SELECT b.seq, b.service_id, b.batch_id, b.data_change_id, b.signer_public_key, b.trace,
       b.serialized_batch, b.submitted, b.created_at, b.last_attempt_at, b.attempts,
       b.status, s.error_type, s.error_message
FROM batches b
LEFT JOIN submissions s ON s.service_id = b.service_id AND s.batch_id = b.batch_id
WHERE b.service_id = %(service_id)s::text
  AND (b.status = %(status)s::text OR (%(status)s::text IS NULL AND b.status IS NULL))
  AND b.seq > %(after_seq)s::bigint
ORDER BY b.seq
LIMIT %(limit)s::int;

-- name: hydrate_transactions
SELECT b.seq, t.transaction_id, t.family_name, t.family_version, t.payload,
       t.signer_public_key, t.service_id, t.inputs, t.outputs, t.dependencies
FROM batches b
JOIN transactions t ON t.service_id = b.service_id AND t.batch_id = b.batch_id
WHERE b.seq = ANY(%(seqs)s::bigint[])
ORDER BY b.seq, t.position;

-- name: hydrate_invalid
SELECT b.seq, r.transaction_id, r.error_message, r.error_data, r.external_status,
       r.external_error_message
FROM batches b
JOIN transactions t ON t.service_id = b.service_id AND t.batch_id = b.batch_id
JOIN transaction_receipts r
  ON r.service_id = t.service_id AND r.transaction_id = t.transaction_id
WHERE b.seq = ANY(%(seqs)s::bigint[]) AND NOT r.result_valid
ORDER BY b.seq, t.position;

-- Store writes keep updated_at strictly increasing (GREATEST(now, old + 1)), so
-- the updated_at triggers only fill in for statements that do not set it.

-- Status and its mirror in batches (an attempt's status: no monitor check):
-- one statement (a data-modifying CTE on another table).
-- name: write_status
WITH status_row AS (
    INSERT INTO batch_statuses (service_id, batch_id, dlt_status, created_at, updated_at)
    VALUES (%(service_id)s, %(batch_id)s, %(status)s, %(now)s, %(now)s)
    ON CONFLICT (service_id, batch_id) DO UPDATE
    SET dlt_status = excluded.dlt_status,
        updated_at = GREATEST(excluded.updated_at, batch_statuses.updated_at + 1)
)
UPDATE batches
SET status = %(status)s::text,
    final = %(final)s,
    submitted = %(submitted)s,
    last_attempt_at = CASE WHEN %(status)s::text = 'Delayed' THEN %(now)s::bigint
                           ELSE last_attempt_at END
WHERE service_id = %(service_id)s AND batch_id = %(batch_id)s;

-- The same and the monitor's bookkeeping (a status the ledger was asked for).
-- name: write_status_checked
WITH status_row AS (
    INSERT INTO batch_statuses (service_id, batch_id, dlt_status, created_at, updated_at)
    VALUES (%(service_id)s, %(batch_id)s, %(status)s, %(now)s, %(now)s)
    ON CONFLICT (service_id, batch_id) DO UPDATE
    SET dlt_status = excluded.dlt_status,
        updated_at = GREATEST(excluded.updated_at, batch_statuses.updated_at + 1)
), checked AS (
    UPDATE submissions
    SET last_checked = %(now)s, times_checked = times_checked + 1,
        updated_at = GREATEST(%(now)s, updated_at + 1)
    WHERE service_id = %(service_id)s AND batch_id = %(batch_id)s
)
UPDATE batches
SET status = %(status)s::text,
    final = %(final)s,
    submitted = %(submitted)s,
    last_attempt_at = CASE WHEN %(status)s::text = 'Delayed' THEN %(now)s::bigint
                           ELSE last_attempt_at END
WHERE service_id = %(service_id)s AND batch_id = %(batch_id)s;

-- An attempt: the batch is submitted, counted and timed; the submission row
-- carries this attempt's error (or none).
-- name: record_attempt
WITH submission AS (
    INSERT INTO submissions
        (service_id, batch_id, last_checked, times_checked, error_type, error_message,
         created_at, updated_at)
    VALUES (%(service_id)s, %(batch_id)s, %(now)s, 1, %(error_type)s, %(error_message)s,
            %(now)s, %(now)s)
    ON CONFLICT (service_id, batch_id) DO UPDATE
    SET error_type = excluded.error_type,
        error_message = excluded.error_message,
        updated_at = GREATEST(excluded.updated_at, submissions.updated_at + 1)
)
UPDATE batches
SET submitted = TRUE, attempts = attempts + 1, last_attempt_at = %(now)s
WHERE service_id = %(service_id)s AND batch_id = %(batch_id)s;

-- name: upsert_submission_error
INSERT INTO submissions
    (service_id, batch_id, last_checked, times_checked, error_type, error_message, created_at,
     updated_at)
VALUES (%(service_id)s, %(batch_id)s, %(now)s, 1, %(error_type)s, %(error_message)s, %(now)s,
        %(now)s)
ON CONFLICT (service_id, batch_id) DO UPDATE
SET error_type = excluded.error_type,
    error_message = excluded.error_message,
    updated_at = GREATEST(excluded.updated_at, submissions.updated_at + 1);

-- name: upsert_receipt
INSERT INTO transaction_receipts
    (service_id, transaction_id, result_valid, error_message, error_data, serialized_receipt,
     external_status, external_error_message, created_at, updated_at)
VALUES
    (%(service_id)s, %(transaction_id)s, %(result_valid)s, %(error_message)s, %(error_data)s,
     %(serialized_receipt)s, %(external_status)s, %(external_error_message)s, %(now)s, %(now)s)
ON CONFLICT (service_id, transaction_id) DO UPDATE
SET result_valid = excluded.result_valid,
    error_message = excluded.error_message,
    error_data = excluded.error_data,
    serialized_receipt = excluded.serialized_receipt,
    external_status = excluded.external_status,
    external_error_message = excluded.external_error_message,
    updated_at = GREATEST(excluded.updated_at, transaction_receipts.updated_at + 1);

-- name: clean_stale_receipts
DELETE FROM transaction_receipts r
USING batches b, batch_statuses s, transactions t
WHERE s.service_id = b.service_id AND s.batch_id = b.batch_id
  AND t.service_id = b.service_id AND t.batch_id = b.batch_id
  AND r.service_id = t.service_id AND r.transaction_id = t.transaction_id
  AND b.final AND s.updated_at < %(cutoff)s;

-- name: clean_orphan_receipts
DELETE FROM transaction_receipts r
WHERE r.updated_at < %(cutoff)s
  AND NOT EXISTS (
      SELECT 1 FROM transactions t
      WHERE t.service_id = r.service_id AND t.transaction_id = r.transaction_id
  );

-- name: clean_stale_batches
DELETE FROM batches b
USING batch_statuses s
WHERE s.service_id = b.service_id AND s.batch_id = b.batch_id
  AND b.final AND s.updated_at < %(cutoff)s;

-- Page the services from batches_service_seq_idx first, then count and pick
-- from the partial batches_open_idx per service: final batches are read once
-- (for the total), not joined.
-- name: list_services
WITH page AS (
    SELECT service_id, count(*) AS total
    FROM batches
    -- The lower bound lets the index range start at the page (or the one service).
    WHERE service_id >= coalesce(%(service_id)s::text, %(after)s::text, '')
      AND (%(after)s::text IS NULL OR service_id > %(after)s::text)
      AND (%(service_id)s::text IS NULL OR service_id = %(service_id)s::text)
    GROUP BY service_id
    ORDER BY service_id
    LIMIT %(limit)s::int
)
SELECT p.service_id,
       (SELECT count(*) FROM batches o
        WHERE o.service_id = p.service_id AND NOT o.final) AS queue_depth,
       (SELECT h.batch_id FROM batches h
        WHERE h.service_id = p.service_id AND NOT h.final
        ORDER BY h.seq LIMIT 1) AS head_batch_id,
       (SELECT f.batch_id FROM batches f
        WHERE f.service_id = p.service_id AND NOT f.final AND f.submitted
        ORDER BY f.seq LIMIT 1) AS in_flight_batch_id,
       p.total,
       (SELECT count(*) FROM batches f
        WHERE f.service_id = p.service_id AND NOT f.final AND (f.submitted OR f.status IS NOT NULL)
          AND (f.submitted OR f.status = 'Pending')) AS in_flight,
       nx.seq, nx.batch_id, nx.blocked_by,
       (SELECT h.batch_id FROM batches h WHERE h.seq = nx.blocked_by) AS blocker_batch_id,
       c.paused, pa.actor AS paused_by, pa.at AS paused_at,
       c.halted_batch_id, c.halted_reason, c.halted_at,
       -- What the next batch waits for: its submission error of type
       -- 'dependency' (ledgerq.model.DEPENDENCY), while it is not taken.
       (SELECT s.error_message FROM submissions s
        WHERE s.service_id = p.service_id AND s.batch_id = nx.batch_id
          AND s.error_type = 'dependency') AS next_waits_for
FROM page p
LEFT JOIN LATERAL (
    SELECT n.seq, n.batch_id, n.blocked_by FROM batches n
    WHERE n.service_id = p.service_id AND NOT n.final AND NOT n.submitted
      AND n.status IS DISTINCT FROM 'Pending'
    ORDER BY n.seq
    LIMIT 1
) nx ON true
LEFT JOIN service_controls c ON c.service_id = p.service_id
-- Who paused a paused service: the latest pause that took effect (a pause of
-- a paused service is recorded with its detail).
LEFT JOIN service_actions pa ON c.paused AND pa.id = (
    SELECT max(a.id) FROM service_actions a
    WHERE a.service_id = p.service_id AND a.action = 'pause' AND a.detail IS NULL)
ORDER BY p.service_id;

-- The lock entries of some open batches (what holds the next batch of a service).
-- name: locks_of
SELECT seq, mode, entry FROM batch_locks WHERE seq = ANY(%(seqs)s::bigint[]);

-- name: transaction_ids_of
SELECT b.seq, t.transaction_id
FROM batches b
JOIN transactions t ON t.service_id = b.service_id AND t.batch_id = b.batch_id
WHERE b.seq = ANY(%(seqs)s::bigint[]);

-- name: status_counts
SELECT coalesce(status, 'none'), count(*) FROM batches GROUP BY 1;

-- name: get_batches_by_id
SELECT b.seq, b.service_id, b.batch_id, b.data_change_id, b.signer_public_key, b.trace,
       b.serialized_batch, b.submitted, b.created_at, b.last_attempt_at, b.attempts,
       b.status, s.error_type, s.error_message
FROM batches b
LEFT JOIN submissions s ON s.service_id = b.service_id AND s.batch_id = b.batch_id
WHERE b.batch_id = ANY(%(ids)s::text[])
ORDER BY b.seq;

-- get_batches_by_id without the bodies (an empty serialized_batch): what a
-- status answer needs, at a third of the cost of reading them.
-- name: get_batch_statuses_by_id
SELECT b.seq, b.service_id, b.batch_id, b.data_change_id, b.signer_public_key, b.trace,
       ''::bytea, b.submitted, b.created_at, b.last_attempt_at, b.attempts,
       b.status, s.error_type, s.error_message
FROM batches b
LEFT JOIN submissions s ON s.service_id = b.service_id AND s.batch_id = b.batch_id
WHERE b.batch_id = ANY(%(ids)s::text[])
ORDER BY b.seq;

-- get_batch_statuses_by_id, only the batches in a final state: what the
-- parked status requests' refresher reads (a pending batch, most of what it
-- watches, costs it no row).
-- name: get_final_batch_statuses_by_id
SELECT b.seq, b.service_id, b.batch_id, b.data_change_id, b.signer_public_key, b.trace,
       ''::bytea, b.submitted, b.created_at, b.last_attempt_at, b.attempts,
       b.status, s.error_type, s.error_message
FROM batches b
LEFT JOIN submissions s ON s.service_id = b.service_id AND s.batch_id = b.batch_id
WHERE b.batch_id = ANY(%(ids)s::text[])
  AND b.status IN ('Committed', 'Valid', 'Invalid')
ORDER BY b.seq;

-- name: get_batches_by_seq
SELECT b.seq, b.service_id, b.batch_id, b.data_change_id, b.signer_public_key, b.trace,
       b.serialized_batch, b.submitted, b.created_at, b.last_attempt_at, b.attempts,
       b.status, s.error_type, s.error_message
FROM batches b
LEFT JOIN submissions s ON s.service_id = b.service_id AND s.batch_id = b.batch_id
WHERE b.seq = ANY(%(seqs)s::bigint[])
ORDER BY b.seq;

-- The rounds: one statement per kind of round, written once as a template
-- and filled in per scope (every service, a list of services, the services
-- an instance claims) — docs/queuer.md.
--
-- The columns of a picked batch. A narrow round (%(narrow)s true) leaves out
-- what the queue source loads only for the batches it hands out:
-- serialized_batch (empty), the submission error (no join) and, in the
-- store, the transactions.
-- template: round_batches
SELECT b.seq, b.service_id, b.batch_id, b.data_change_id, b.signer_public_key, b.trace,
       CASE WHEN %(narrow)s::bool THEN ''::bytea ELSE b.serialized_batch END,
       b.submitted, b.created_at, b.last_attempt_at, b.attempts,
       b.status, s.error_type, s.error_message
-- Picks in seq order: the heap is read in about its physical order.
FROM (SELECT * FROM picks ORDER BY seq) AS picks
JOIN batches b ON b.seq = picks.seq
LEFT JOIN submissions s
    ON NOT %(narrow)s::bool AND s.service_id = b.service_id AND s.batch_id = b.batch_id

-- The one-round serial queuer's round; the same round as
-- ledgerq.queue.serial.select_round (docs/queuer.md). queue_heads holds each
-- service's first non-final batch (kept by triggers on batches). busy: per
-- service, its batches that are not {submitted = false, None}, read from
-- batches_busy_idx alone (index-only); a service with one submitted or
-- Pending is in flight, otherwise its first busy batch is the Unknown/Delayed
-- one to resubmit. Other services queue their head. The slots scope_batches
-- and scope_heads join the scope to batches (b) and queue_heads (h): joined,
-- not filtered with IN (SELECT DISTINCT ...), so the planner knows how many
-- services are listed and reads batches_busy_idx and queue_heads whole,
-- hashing the list, when that is cheaper than probing them once per service.
-- template: queue_round
WITH busy AS (
    SELECT b.service_id, min(b.seq) AS first_seq,
           bool_or(b.submitted OR b.status IS NOT DISTINCT FROM 'Pending') AS in_flight
    FROM batches b
    {{scope_batches}}
    WHERE NOT b.final AND (b.submitted OR b.status IS NOT NULL)
    GROUP BY b.service_id
),
picks AS (
    SELECT first_seq AS seq FROM busy WHERE NOT in_flight
    UNION ALL
    SELECT h.head_seq FROM queue_heads h
    {{scope_heads}}
    WHERE h.head_seq IS NOT NULL
      AND NOT EXISTS (SELECT 1 FROM busy WHERE busy.service_id = h.service_id)
)
{{round_batches}}
WHERE b.status IS NULL OR b.status = 'Unknown' OR b.last_attempt_at IS NULL
   OR b.last_attempt_at <= %(now)s::bigint - %(delay_window_ms)s::bigint
ORDER BY CASE b.status WHEN 'Unknown' THEN 0 WHEN 'Delayed' THEN 1 ELSE 2 END, b.seq
LIMIT %(limit)s::bigint;

-- name: queue_round
-- fill: queue_round
--   scope_batches:
--   scope_heads:

-- The service ids in %(services)s, distinct (the store de-duplicates them).
-- name: queue_round_services
-- fill: queue_round
--   scope_batches: JOIN unnest(%(services)s::text[]) AS w(service_id) ON w.service_id = b.service_id
--   scope_heads: JOIN unnest(%(services)s::text[]) AS w(service_id) ON w.service_id = h.service_id

-- The services service_id_claims gives to the instance %(claimant)s: the
-- round of a high-availability instance, without shipping its (possibly
-- thousands of) service ids.
-- name: queue_round_claimed
-- fill: queue_round
--   scope_batches: JOIN service_id_claims c ON c.service_id = b.service_id AND c.claimant = %(claimant)s::text
--   scope_heads: JOIN service_id_claims c ON c.service_id = h.service_id AND c.claimant = %(claimant)s::text

-- The parallel queuer's free batches; the same round as
-- ledgerq.queue.parallel.select_parallel_round (docs/queuer.md). A batch is
-- free when no earlier non-final batch of its service conflicts with it
-- (blocked_by IS NULL, kept by add_batches and ledgerq_release): the
-- Unknown or window-expired Delayed ones (stalled) and the new ones.
-- %(exclude)s: seqs never picked.
-- template: parallel_stalled
SELECT service_id, seq, CASE status WHEN 'Unknown' THEN 0 ELSE 1 END AS class
FROM batches
WHERE NOT final AND (submitted OR status IS NOT NULL)
  AND NOT submitted AND status IN ('Unknown', 'Delayed') AND blocked_by IS NULL
  AND (status = 'Unknown' OR last_attempt_at IS NULL
       OR last_attempt_at <= %(now)s::bigint - %(delay_window_ms)s::bigint)
  AND seq <> ALL(%(exclude)s::bigint[])
  {{scope_stalled}}

-- template: parallel_fresh
SELECT r.seq FROM batches r
WHERE r.service_id = h.service_id
  AND NOT r.final AND r.blocked_by IS NULL AND NOT r.submitted AND r.status IS NULL
  AND r.seq <> ALL(%(exclude)s::bigint[])
ORDER BY r.seq

-- The parallel round: stalled, per service, its free stalled batches first
-- in (class, seq), from the busy batches; fresh, per service, its first free
-- new batches (batches_ready_idx, one probe per service of the scope). Of
-- both, the first %(per_service)s of each service in (class, seq); the round
-- is ordered by place in the service first. The slot services: the scope's
-- services (h); scope_stalled: its condition on stalled batches.
-- template: parallel_round
WITH {{wanted}}
stalled AS (
    {{parallel_stalled}}
),
fresh AS (
    SELECT h.service_id, f.seq, 2 AS class
    FROM {{services}}
    CROSS JOIN LATERAL (
        {{parallel_fresh}}
        LIMIT %(per_service)s::bigint
    ) f
),
picks AS (
    SELECT seq, class, place FROM (
        SELECT seq, class,
               row_number() OVER (PARTITION BY service_id ORDER BY class, seq) AS place
        FROM (SELECT * FROM stalled UNION ALL SELECT * FROM fresh) AS c
    ) AS ranked
    WHERE place <= %(per_service)s::bigint
)
{{round_batches}}
ORDER BY picks.place, picks.class, b.seq
LIMIT %(limit)s::bigint;

-- The parallel round with one pick per service (the store runs it whenever
-- per_service = 1): a service's stalled batch, or else its first free new
-- one, without ranking the candidates.
-- template: parallel_round_first
WITH {{wanted}}
stalled AS (
    SELECT DISTINCT ON (service_id) service_id, seq, class FROM (
        {{parallel_stalled}}
    ) AS candidates
    ORDER BY service_id, class, seq
),
fresh AS (
    SELECT f.seq
    FROM {{services}}
    CROSS JOIN LATERAL (
        {{parallel_fresh}}
        LIMIT 1
    ) f
    WHERE NOT EXISTS (SELECT 1 FROM stalled WHERE stalled.service_id = h.service_id)
),
picks AS (
    SELECT seq FROM stalled
    UNION ALL
    SELECT seq FROM fresh
)
{{round_batches}}
ORDER BY CASE b.status WHEN 'Unknown' THEN 0 WHEN 'Delayed' THEN 1 ELSE 2 END, b.seq
LIMIT %(limit)s::bigint;

-- name: parallel_round
-- fill: parallel_round
--   wanted:
--   services: (SELECT * FROM queue_heads WHERE head_seq IS NOT NULL) h
--   scope_stalled:

-- The service ids in %(services)s.
-- name: parallel_round_services
-- fill: parallel_round
--   wanted: wanted AS (SELECT DISTINCT service_id FROM unnest(%(services)s::text[]) AS w(service_id)),
--   services: wanted h
--   scope_stalled: AND service_id IN (SELECT service_id FROM wanted)

-- name: parallel_round_first
-- fill: parallel_round_first
--   wanted:
--   services: (SELECT * FROM queue_heads WHERE head_seq IS NOT NULL) h
--   scope_stalled:

-- name: parallel_round_services_first
-- fill: parallel_round_first
--   wanted: wanted AS (SELECT DISTINCT service_id FROM unnest(%(services)s::text[]) AS w(service_id)),
--   services: wanted h
--   scope_stalled: AND service_id IN (SELECT service_id FROM wanted)

-- What the DLT monitor follows: non-final batches the ledger has (Pending)
-- or may have (submitted: taken for a first attempt, or for a resubmission
-- after Unknown or Delayed), narrow (no blobs, no errors). The predicate
-- repeats batches_busy_idx's, so only busy batches are read.
-- name: list_in_flight
SELECT b.seq, b.service_id, b.batch_id, b.data_change_id, b.signer_public_key, b.trace,
       ''::bytea, b.submitted, b.created_at, b.last_attempt_at, b.attempts,
       b.status, NULL, NULL
FROM batches b
WHERE NOT b.final AND (b.submitted OR b.status IS NOT NULL)
  AND (b.status = 'Pending' OR b.submitted)
ORDER BY b.seq
LIMIT %(limit)s;

-- The same, of the services in %(services)s only (services just claimed):
-- one probe of batches_busy_idx per service.
-- name: list_in_flight_services
SELECT b.seq, b.service_id, b.batch_id, b.data_change_id, b.signer_public_key, b.trace,
       ''::bytea, b.submitted, b.created_at, b.last_attempt_at, b.attempts,
       b.status, NULL, NULL
FROM batches b
WHERE b.service_id = ANY(%(services)s::text[])
  AND NOT b.final AND (b.submitted OR b.status IS NOT NULL)
  AND (b.status = 'Pending' OR b.submitted)
ORDER BY b.seq
LIMIT %(limit)s;

-- A group of writes (apply_writes): the rows of its batches, locked in key
-- order, and the claims it writes under, share-locked (see lock_claim).
-- name: batch_states
SELECT b.service_id, b.batch_id, b.status, b.submitted
FROM batches b
JOIN unnest(%(service_ids)s::text[], %(batch_ids)s::text[]) AS k(service_id, batch_id)
    ON b.service_id = k.service_id AND b.batch_id = k.batch_id
ORDER BY b.service_id, b.batch_id
FOR UPDATE OF b;

-- name: lock_claims
SELECT c.service_id, c.claimant, c.epoch
FROM service_id_claims c
JOIN unnest(%(service_ids)s::text[], %(instance_ids)s::text[], %(epochs)s::bigint[])
    AS k(service_id, instance_id, epoch)
    ON c.service_id = k.service_id AND c.claimant = k.instance_id AND c.epoch = k.epoch
ORDER BY c.service_id
FOR SHARE OF c;

-- The rows a group that makes batches final writes, locked in key order
-- after lock_finishing_heads and before anything else: its own batches and
-- the non-final batches they block, which the release trigger
-- (ledgerq_release) re-points when a blocker becomes final. With the
-- service's queue_heads row held, what those batches are cannot change (a
-- blocker is re-pointed and a batch inserted only under it), so the trigger
-- writes rows already held, never waiting on a batch row out of order.
-- name: lock_group_rows
WITH own AS (
    SELECT b.seq
    FROM batches b
    JOIN unnest(%(service_ids)s::text[], %(batch_ids)s::text[]) AS k(service_id, batch_id)
        ON b.service_id = k.service_id AND b.batch_id = k.batch_id
), wanted AS (
    SELECT seq FROM own
    UNION
    SELECT n.seq FROM batches n
    WHERE n.blocked_by IN (SELECT seq FROM own) AND NOT n.final
)
SELECT b.service_id, b.batch_id, b.status, b.submitted, b.seq, b.blocked_by
FROM batches b
JOIN wanted w ON w.seq = b.seq
ORDER BY b.service_id, b.batch_id
FOR UPDATE OF b;

-- The queue_heads rows of the services whose batches a group makes final,
-- locked in key order before any batch row: the heads and release triggers
-- then find them locked by this transaction, whatever order the UPDATE
-- visits the batches in, and add_batches locks them in the same order (no
-- deadlock).
-- name: lock_finishing_heads
SELECT service_id
FROM queue_heads
WHERE service_id = ANY(%(service_ids)s::text[])
ORDER BY service_id
FOR UPDATE;

-- Set-based forms of the group writes (apply_writes): one statement for a
-- whole wave, each parameter an array with one element per row. A wave
-- touches each batch once. (Sent as one statement, not a pipelined
-- executemany: a paused client must leave its session idle in transaction,
-- where idle_in_transaction_session_timeout ends it.)
-- name: record_attempt_set
WITH k AS (
    SELECT *
    FROM unnest(%(service_id)s::text[], %(batch_id)s::text[], %(error_type)s::text[],
                %(error_message)s::text[], %(now)s::bigint[])
        AS k(service_id, batch_id, error_type, error_message, now)
), submission AS (
    INSERT INTO submissions
        (service_id, batch_id, last_checked, times_checked, error_type, error_message,
         created_at, updated_at)
    SELECT service_id, batch_id, now, 1, error_type, error_message, now, now FROM k
    ON CONFLICT (service_id, batch_id) DO UPDATE
    SET error_type = excluded.error_type,
        error_message = excluded.error_message,
        updated_at = GREATEST(excluded.updated_at, submissions.updated_at + 1)
)
UPDATE batches b
SET submitted = TRUE, attempts = b.attempts + 1, last_attempt_at = k.now
FROM k
WHERE b.service_id = k.service_id AND b.batch_id = k.batch_id;

-- The parallel queuer's final status → freed batches merge (docs/queuer.md,
-- "A final status takes the batches it frees"): after a group's writes, in
-- its transaction, record taken (an attempt, as record_attempt_set) the
-- candidates that are free now: not final, no blocker left, never taken, no
-- status. The candidates are the batches a batch made final in this group
-- held (their blocked_by named it before the group's writes; locked by
-- lock_group_rows), `req` numbers the final status that freed them and
-- `take` is how many of them it may take, first in acceptance order. Such a
-- batch was held until this transaction, so no round can have offered it:
-- nothing else takes it. Returns each taken batch as get_batches_by_seq
-- does, followed by its transactions' columns as hydrate_transactions
-- (one row per transaction).
-- name: take_freed
WITH c AS (
    SELECT *
    FROM unnest(%(seq)s::bigint[], %(req)s::bigint[], %(take)s::bigint[], %(now)s::bigint[])
        AS c(seq, req, take, now)
), picks AS (
    SELECT seq, now FROM (
        SELECT c.seq, c.now, c.take,
               row_number() OVER (PARTITION BY c.req ORDER BY c.seq) AS place
        FROM c
        JOIN batches b ON b.seq = c.seq
        WHERE NOT b.final AND b.blocked_by IS NULL AND NOT b.submitted AND b.status IS NULL
          -- A batch that declares dependencies goes through the queue, which
          -- checks them before its take.
          AND NOT EXISTS (
                SELECT 1 FROM transactions t
                WHERE t.service_id = b.service_id AND t.batch_id = b.batch_id
                  AND cardinality(t.dependencies) > 0
              )
    ) AS r
    WHERE place <= take
), submission AS (
    INSERT INTO submissions
        (service_id, batch_id, last_checked, times_checked, error_type, error_message,
         created_at, updated_at)
    SELECT b.service_id, b.batch_id, p.now, 1, NULL, NULL, p.now, p.now
    FROM picks p
    JOIN batches b ON b.seq = p.seq
    ON CONFLICT (service_id, batch_id) DO UPDATE
    SET error_type = NULL,
        error_message = NULL,
        updated_at = GREATEST(excluded.updated_at, submissions.updated_at + 1)
), taken AS (
    UPDATE batches b
    SET submitted = TRUE, attempts = b.attempts + 1, last_attempt_at = p.now
    FROM picks p
    WHERE b.seq = p.seq
    RETURNING b.seq, b.service_id, b.batch_id, b.data_change_id, b.signer_public_key, b.trace,
              b.serialized_batch, b.submitted, b.created_at, b.last_attempt_at, b.attempts,
              b.status
)
SELECT taken.seq, taken.service_id, taken.batch_id, taken.data_change_id,
       taken.signer_public_key, taken.trace, taken.serialized_batch, taken.submitted,
       taken.created_at, taken.last_attempt_at, taken.attempts, taken.status,
       NULL::text, NULL::text,
       t.transaction_id, t.family_name, t.family_version, t.payload, t.signer_public_key,
       t.service_id, t.inputs, t.outputs, t.dependencies
FROM taken
LEFT JOIN transactions t ON t.service_id = taken.service_id AND t.batch_id = taken.batch_id
ORDER BY taken.seq, t.position;

-- name: write_status_set
WITH k AS (
    SELECT *
    FROM unnest(%(service_id)s::text[], %(batch_id)s::text[], %(status)s::text[],
                %(final)s::bool[], %(submitted)s::bool[], %(now)s::bigint[])
        AS k(service_id, batch_id, status, final, submitted, now)
), status_row AS (
    INSERT INTO batch_statuses (service_id, batch_id, dlt_status, created_at, updated_at)
    SELECT service_id, batch_id, status, now, now FROM k
    ON CONFLICT (service_id, batch_id) DO UPDATE
    SET dlt_status = excluded.dlt_status,
        updated_at = GREATEST(excluded.updated_at, batch_statuses.updated_at + 1)
)
UPDATE batches b
SET status = k.status,
    final = k.final,
    submitted = k.submitted,
    last_attempt_at = CASE WHEN k.status = 'Delayed' THEN k.now ELSE b.last_attempt_at END
FROM k
WHERE b.service_id = k.service_id AND b.batch_id = k.batch_id;

-- name: write_status_checked_set
WITH k AS (
    SELECT *
    FROM unnest(%(service_id)s::text[], %(batch_id)s::text[], %(status)s::text[],
                %(final)s::bool[], %(submitted)s::bool[], %(now)s::bigint[])
        AS k(service_id, batch_id, status, final, submitted, now)
), status_row AS (
    INSERT INTO batch_statuses (service_id, batch_id, dlt_status, created_at, updated_at)
    SELECT service_id, batch_id, status, now, now FROM k
    ON CONFLICT (service_id, batch_id) DO UPDATE
    SET dlt_status = excluded.dlt_status,
        updated_at = GREATEST(excluded.updated_at, batch_statuses.updated_at + 1)
), checked AS (
    UPDATE submissions s
    SET last_checked = k.now, times_checked = s.times_checked + 1,
        updated_at = GREATEST(k.now, s.updated_at + 1)
    FROM k
    WHERE s.service_id = k.service_id AND s.batch_id = k.batch_id
)
UPDATE batches b
SET status = k.status,
    final = k.final,
    submitted = k.submitted,
    last_attempt_at = CASE WHEN k.status = 'Delayed' THEN k.now ELSE b.last_attempt_at END
FROM k
WHERE b.service_id = k.service_id AND b.batch_id = k.batch_id;

-- name: upsert_submission_error_set
INSERT INTO submissions
    (service_id, batch_id, last_checked, times_checked, error_type, error_message, created_at,
     updated_at)
SELECT service_id, batch_id, now, 1, error_type, error_message, now, now
FROM unnest(%(service_id)s::text[], %(batch_id)s::text[], %(error_type)s::text[],
            %(error_message)s::text[], %(now)s::bigint[])
    AS k(service_id, batch_id, error_type, error_message, now)
ON CONFLICT (service_id, batch_id) DO UPDATE
SET error_type = excluded.error_type,
    error_message = excluded.error_message,
    updated_at = GREATEST(excluded.updated_at, submissions.updated_at + 1);

-- name: upsert_receipt_set
INSERT INTO transaction_receipts
    (service_id, transaction_id, result_valid, error_message, error_data, serialized_receipt,
     external_status, external_error_message, created_at, updated_at)
SELECT service_id, transaction_id, result_valid, error_message, error_data, serialized_receipt,
       external_status, external_error_message, now, now
FROM unnest(%(service_id)s::text[], %(transaction_id)s::text[], %(result_valid)s::bool[],
            %(error_message)s::text[], %(error_data)s::bytea[], %(serialized_receipt)s::bytea[],
            %(external_status)s::text[], %(external_error_message)s::text[], %(now)s::bigint[])
    AS k(service_id, transaction_id, result_valid, error_message, error_data,
         serialized_receipt, external_status, external_error_message, now)
ON CONFLICT (service_id, transaction_id) DO UPDATE
SET result_valid = excluded.result_valid,
    error_message = excluded.error_message,
    error_data = excluded.error_data,
    serialized_receipt = excluded.serialized_receipt,
    external_status = excluded.external_status,
    external_error_message = excluded.external_error_message,
    updated_at = GREATEST(excluded.updated_at, transaction_receipts.updated_at + 1);

-- The commit → next POST merge (docs/gateway.md, "The commit → next POST
-- gap"): per (service_id, after) pair (one per service), the service's next
-- open batch once batch `after` is final, when the serial queuer's choice
-- would be exactly that batch: the first non-final batch other than
-- `after`, never taken (not submitted, no status), and no non-final batch
-- of the service but `after` submitted or with a status. Nothing for the
-- pair otherwise.
-- name: next_open_batches
-- With the batches' transactions (hydrate_transactions' columns after the
-- batch's), one row per transaction: one statement for the read-ahead's miss.
WITH p AS (
    SELECT k.service_id, k.after, (
        SELECT o.seq FROM batches o
        WHERE o.service_id = k.service_id AND NOT o.final AND o.batch_id <> k.after
        ORDER BY o.seq LIMIT 1
    ) AS seq
    FROM unnest(%(service_ids)s::text[], %(afters)s::text[]) AS k(service_id, after)
), n AS (
    SELECT b.seq, b.service_id, b.batch_id, b.data_change_id, b.signer_public_key, b.trace,
           b.serialized_batch, b.submitted, b.created_at, b.last_attempt_at, b.attempts,
           b.status, s.error_type, s.error_message
    FROM p
    JOIN batches b ON b.seq = p.seq
    LEFT JOIN submissions s ON s.service_id = b.service_id AND s.batch_id = b.batch_id
    WHERE NOT b.submitted AND b.status IS NULL
      AND NOT EXISTS (
            SELECT 1 FROM batches o
            WHERE o.service_id = p.service_id AND NOT o.final
              AND (o.submitted OR o.status IS NOT NULL) AND o.batch_id <> p.after
        )
)
SELECT n.*, t.transaction_id, t.family_name, t.family_version, t.payload,
       t.signer_public_key, t.service_id, t.inputs, t.outputs, t.dependencies
FROM n
LEFT JOIN transactions t ON t.service_id = n.service_id AND t.batch_id = n.batch_id
ORDER BY n.seq, t.position;

-- Inside a group (apply_writes), read with its other rows before any of its
-- writes: which conditional takes may land. A row comes back for each
-- (service, batch, after) whose batch is what the serial queuer would pick
-- once `after` is final (the first non-final batch of the service other than
-- `after`, while no non-final batch of the service other than `after` is
-- submitted or has a status).
-- name: next_open_checks
SELECT k.service_id, k.batch_id
FROM unnest(%(service_ids)s::text[], %(batch_ids)s::text[], %(afters)s::text[])
    AS k(service_id, batch_id, after)
WHERE k.batch_id = (
        SELECT o.batch_id FROM batches o
        WHERE o.service_id = k.service_id AND NOT o.final AND o.batch_id <> k.after
        ORDER BY o.seq LIMIT 1
    )
  AND NOT EXISTS (
        SELECT 1 FROM batches o
        WHERE o.service_id = k.service_id AND NOT o.final
          AND (o.submitted OR o.status IS NOT NULL) AND o.batch_id <> k.after
    );

-- Declared dependencies: for each transaction id of %(ids)s, the batch that
-- tracks it (in any service) and its state, with the submission error that
-- says how it ended (a cancelled batch's is 'cancelled').
-- name: dependency_states
SELECT t.transaction_id, b.service_id, b.batch_id, b.seq, b.status, b.submitted, s.error_type
FROM transactions t
JOIN batches b ON b.service_id = t.service_id AND b.batch_id = t.batch_id
LEFT JOIN submissions s ON s.service_id = b.service_id AND s.batch_id = b.batch_id
WHERE t.transaction_id = ANY(%(ids)s::text[]);

-- Declared dependencies: what decides whether batch %(batch_id)s (of %(service_id)s) may go
-- (DependencyPath in store/base.py). From it, each batch's first dependency
-- outside itself (transaction, then declaration order) that a batch tracks
-- and none committed, with its batch of lowest seq; followed while that batch
-- is open (not submitted, no status or Delayed/Unknown), %(max_steps)s steps at most.
-- A row per batch on the path (the batch itself at depth 0) with the
-- transaction that led to it; the last also its dependencies no batch tracks.
-- name: dependency_path
WITH RECURSIVE path(depth, seq, via) AS (
    SELECT 0, seq, NULL::text
    FROM batches WHERE service_id = %(service_id)s AND batch_id = %(batch_id)s
    UNION ALL
    SELECT p.depth + 1, nb.seq, nt.transaction_id::text
    FROM path p
    JOIN batches pb ON pb.seq = p.seq
    JOIN transactions nt ON nt.transaction_id = (
        SELECT d.id
        FROM transactions t, unnest(t.dependencies) WITH ORDINALITY AS d(id, k)
        WHERE t.service_id = pb.service_id AND t.batch_id = pb.batch_id
          AND NOT EXISTS (
                SELECT 1 FROM transactions o
                WHERE o.service_id = pb.service_id AND o.transaction_id = d.id
                  AND o.batch_id = pb.batch_id)
          AND EXISTS (SELECT 1 FROM transactions x WHERE x.transaction_id = d.id)
          AND NOT EXISTS (
                SELECT 1 FROM transactions x
                JOIN batches xb ON xb.service_id = x.service_id AND xb.batch_id = x.batch_id
                WHERE x.transaction_id = d.id AND xb.status IN ('Committed', 'Valid'))
        ORDER BY t.position, d.k
        LIMIT 1)
    JOIN batches nb ON nb.service_id = nt.service_id AND nb.batch_id = nt.batch_id
    WHERE p.depth < %(max_steps)s::int
      AND (p.depth = 0
           OR (NOT pb.submitted AND (pb.status IS NULL OR pb.status IN ('Delayed', 'Unknown'))))
      AND NOT EXISTS (
            SELECT 1 FROM transactions y
            JOIN batches yb ON yb.service_id = y.service_id AND yb.batch_id = y.batch_id
            WHERE y.transaction_id = nt.transaction_id AND yb.seq < nb.seq)
)
SELECT p.via, b.service_id, b.batch_id, b.seq, b.status, b.submitted, s.error_type,
       CASE WHEN p.depth = (SELECT max(depth) FROM path) THEN ARRAY(
           SELECT d.id
           FROM transactions t, unnest(t.dependencies) WITH ORDINALITY AS d(id, k)
           WHERE t.service_id = b.service_id AND t.batch_id = b.batch_id
             AND NOT EXISTS (SELECT 1 FROM transactions x WHERE x.transaction_id = d.id)
           ORDER BY t.position, d.k)
       END
FROM path p
JOIN batches b ON b.seq = p.seq
LEFT JOIN submissions s ON s.service_id = b.service_id AND s.batch_id = b.batch_id
ORDER BY p.depth;

-- Operator control (docs/operations.md): every service paused or halted.
-- name: stopped_services
SELECT service_id, paused, halted_batch_id, halted_reason, halted_at
FROM service_controls
WHERE paused OR halted_batch_id IS NOT NULL
ORDER BY service_id;

-- name: service_controls_of
SELECT service_id, paused, halted_batch_id, halted_reason, halted_at
FROM service_controls
WHERE service_id = ANY(%(service_ids)s::text[]) AND (paused OR halted_batch_id IS NOT NULL)
ORDER BY service_id;

-- Whether each service of %(service_ids)s takes nothing new (paused or
-- halted), read with a group's rows. Every row is locked until commit, the
-- stopped and the others (a lock applies to the rows a query returns): a
-- pause waits for the takes under way.
-- name: stopped_of
SELECT service_id, paused OR halted_batch_id IS NOT NULL
FROM service_controls
WHERE service_id = ANY(%(service_ids)s::text[])
ORDER BY service_id
FOR SHARE;

-- name: lock_service_control
SELECT paused, halted_batch_id, halted_reason, halted_at
FROM service_controls
WHERE service_id = %(service_id)s
FOR UPDATE;

-- name: service_exists
SELECT 1 FROM batches WHERE service_id = %(service_id)s LIMIT 1;

-- name: set_paused
INSERT INTO service_controls (service_id, paused, updated_at)
VALUES (%(service_id)s, %(paused)s, %(now)s)
ON CONFLICT (service_id) DO UPDATE SET paused = EXCLUDED.paused, updated_at = EXCLUDED.updated_at;

-- name: set_halted
INSERT INTO service_controls (service_id, halted_batch_id, halted_reason, halted_at, updated_at)
VALUES (%(service_id)s, %(batch_id)s, %(reason)s, %(now)s, %(now)s)
ON CONFLICT (service_id) DO UPDATE SET
    halted_batch_id = EXCLUDED.halted_batch_id, halted_reason = EXCLUDED.halted_reason,
    halted_at = EXCLUDED.halted_at, updated_at = EXCLUDED.updated_at;

-- name: clear_halted
UPDATE service_controls
SET halted_batch_id = NULL, halted_reason = NULL, halted_at = NULL, updated_at = %(now)s
WHERE service_id = %(service_id)s;

-- name: insert_service_action
INSERT INTO service_actions (service_id, action, actor, at, batch_ids, detail)
VALUES (%(service_id)s, %(action)s, %(actor)s, %(now)s, %(batch_ids)s::text[], %(detail)s)
RETURNING id;

-- name: service_actions
SELECT id, service_id, action, actor, at, batch_ids, detail
FROM service_actions
WHERE service_id = %(service_id)s AND (%(before)s::bigint IS NULL OR id < %(before)s::bigint)
ORDER BY id DESC
LIMIT %(limit)s::int;

-- name: transaction_ids_of_batch
SELECT transaction_id FROM transactions
WHERE service_id = %(service_id)s AND batch_id = %(batch_id)s
ORDER BY position;

-- The pipelined strategy (docs/queuer.md): the first %(limit)s non-final batches of
-- %(service_id)s after batch %(after)s (NULL: from its first), in its order, whatever their
-- state, with their transactions (one row each).
-- name: batches_following
WITH n AS (
    SELECT b.seq, b.service_id, b.batch_id, b.data_change_id, b.signer_public_key, b.trace,
           b.serialized_batch, b.submitted, b.created_at, b.last_attempt_at, b.attempts,
           b.status, s.error_type, s.error_message
    FROM batches b
    LEFT JOIN submissions s ON s.service_id = b.service_id AND s.batch_id = b.batch_id
    WHERE b.service_id = %(service_id)s AND NOT b.final
      AND (%(after)s::text IS NULL OR b.seq > (SELECT a.seq FROM batches a
                   WHERE a.service_id = %(service_id)s AND a.batch_id = %(after)s))
    ORDER BY b.seq
    LIMIT %(limit)s::int
)
SELECT n.*, t.transaction_id, t.family_name, t.family_version, t.payload,
       t.signer_public_key, t.service_id, t.inputs, t.outputs, t.dependencies
FROM n
LEFT JOIN transactions t ON t.service_id = n.service_id AND t.batch_id = n.batch_id
ORDER BY n.seq, t.position;
