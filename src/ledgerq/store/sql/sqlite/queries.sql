-- Named queries of the SQLite backend. Parameters are :named.
-- Batch rows are selected in the column order ledgerq.store.common.assemble expects.

-- name: schema_version_create
CREATE TABLE IF NOT EXISTS schema_version (
    version    INTEGER PRIMARY KEY,
    name       TEXT NOT NULL,
    applied_at INTEGER NOT NULL
);

-- name: schema_version_rows
SELECT version, name FROM schema_version;

-- name: schema_version_insert
INSERT INTO schema_version (version, name, applied_at) VALUES (:version, :name, :applied_at);

-- name: table_exists
SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = :name;

-- name: insert_batch
INSERT INTO batches
    (service_id, batch_id, data_change_id, signer_public_key, trace, serialized_batch, created_at)
VALUES
    (:service_id, :batch_id, :data_change_id, :signer_public_key, :trace, :serialized_batch,
     :created_at);

-- name: insert_transaction
INSERT INTO transactions
    (service_id, transaction_id, batch_id, position, payload, family_name, family_version,
     signer_public_key, inputs, outputs, dependencies)
VALUES
    (:service_id, :transaction_id, :batch_id, :position, :payload, :family_name, :family_version,
     :signer_public_key, :inputs, :outputs, :dependencies);

-- name: insert_lock
INSERT INTO batch_locks (seq, service_id, mode, entry) VALUES (:seq, :service_id, :mode, :entry);

-- The blockers of the batches just added (seqs :first to :last, their lock
-- entries written): the latest earlier non-final batch of the service each
-- conflicts with, by the rule of ledgerq.queue.parallel.conflict — the same
-- expression as the batches_release_locks_* triggers.
-- name: block_new_batches
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
WHERE seq BETWEEN :first AND :last
  AND EXISTS (SELECT 1 FROM batch_locks k WHERE k.seq = batches.seq);

-- Whether lock entries and blockers are kept (lock_entries_kept): add_batches
-- reads it in its write transaction; the switch (keep_lock_entries) is one.
-- name: lock_entries_kept
SELECT kept FROM lock_entries_kept;

-- name: keep_lock_entries
UPDATE lock_entries_kept SET kept = 1;

-- name: clear_batch_locks
DELETE FROM batch_locks;

-- The declared access of every open batch, for its lock entries.
-- name: open_batch_access
SELECT b.seq, b.service_id, b.batch_id, t.transaction_id, t.inputs, t.outputs, t.dependencies
FROM batches b INDEXED BY batches_open_idx
JOIN transactions t ON t.service_id = b.service_id AND t.batch_id = b.batch_id
WHERE NOT b.final
ORDER BY b.seq, t.position;

-- name: last_seq
SELECT last_insert_rowid();

-- A batch id names one batch in one service (batches_batch_id_key).
-- name: batch_owner
SELECT service_id FROM batches WHERE batch_id = :batch_id;

-- name: data_change_id_owner
SELECT batch_id FROM batches WHERE service_id = :service_id AND data_change_id = :data_change_id;

-- name: transaction_owner
SELECT batch_id FROM transactions WHERE service_id = :service_id AND transaction_id = :transaction_id;

-- name: batch_state
SELECT batch_id, status, submitted
FROM batches
WHERE service_id = :service_id AND batch_id = :batch_id;

-- name: batch_state_by_data_change_id
SELECT batch_id, status, submitted
FROM batches
WHERE service_id = :service_id AND data_change_id = :data_change_id;

-- name: get_batch
SELECT b.seq, b.service_id, b.batch_id, b.data_change_id, b.signer_public_key, b.trace,
       b.serialized_batch, b.submitted, b.created_at, b.last_attempt_at, b.attempts,
       b.status, s.error_type, s.error_message
FROM batches b
LEFT JOIN submissions s ON s.service_id = b.service_id AND s.batch_id = b.batch_id
WHERE b.service_id = :service_id AND b.batch_id = :batch_id;

-- name: get_batch_by_data_change_id
SELECT b.seq, b.service_id, b.batch_id, b.data_change_id, b.signer_public_key, b.trace,
       b.serialized_batch, b.submitted, b.created_at, b.last_attempt_at, b.attempts,
       b.status, s.error_type, s.error_message
FROM batches b
LEFT JOIN submissions s ON s.service_id = b.service_id AND s.batch_id = b.batch_id
WHERE b.service_id = :service_id AND b.data_change_id = :data_change_id;

-- name: list_batches_by_status
SELECT b.seq, b.service_id, b.batch_id, b.data_change_id, b.signer_public_key, b.trace,
       b.serialized_batch, b.submitted, b.created_at, b.last_attempt_at, b.attempts,
       b.status, s.error_type, s.error_message
FROM batches b
LEFT JOIN submissions s ON s.service_id = b.service_id AND s.batch_id = b.batch_id
WHERE b.status = :status
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
WHERE b.seq > :after_seq
ORDER BY b.seq
LIMIT :limit;

-- name: list_batches_service
SELECT b.seq, b.service_id, b.batch_id, b.data_change_id, b.signer_public_key, b.trace,
       b.serialized_batch, b.submitted, b.created_at, b.last_attempt_at, b.attempts,
       b.status, s.error_type, s.error_message
FROM batches b
LEFT JOIN submissions s ON s.service_id = b.service_id AND s.batch_id = b.batch_id
WHERE b.service_id = :service_id
  AND b.seq > :after_seq
ORDER BY b.seq
LIMIT :limit;

-- name: list_batches_status
SELECT b.seq, b.service_id, b.batch_id, b.data_change_id, b.signer_public_key, b.trace,
       b.serialized_batch, b.submitted, b.created_at, b.last_attempt_at, b.attempts,
       b.status, s.error_type, s.error_message
FROM batches b
LEFT JOIN submissions s ON s.service_id = b.service_id AND s.batch_id = b.batch_id
WHERE b.status IS :status
  AND b.seq > :after_seq
ORDER BY b.seq
LIMIT :limit;

-- name: list_batches_service_status
SELECT b.seq, b.service_id, b.batch_id, b.data_change_id, b.signer_public_key, b.trace,
       b.serialized_batch, b.submitted, b.created_at, b.last_attempt_at, b.attempts,
       b.status, s.error_type, s.error_message
FROM batches b
LEFT JOIN submissions s ON s.service_id = b.service_id AND s.batch_id = b.batch_id
WHERE b.service_id = :service_id
  AND b.status IS :status
  AND b.seq > :after_seq
ORDER BY b.seq
LIMIT :limit;

-- name: hydrate_transactions
SELECT b.seq, t.transaction_id, t.family_name, t.family_version, t.payload,
       t.signer_public_key, t.service_id, t.inputs, t.outputs, t.dependencies
FROM batches b
JOIN transactions t ON t.service_id = b.service_id AND t.batch_id = b.batch_id
WHERE b.seq IN (SELECT value FROM json_each(:seqs))
ORDER BY b.seq, t.position;

-- name: hydrate_invalid
SELECT b.seq, r.transaction_id, r.error_message, r.error_data, r.external_status,
       r.external_error_message
FROM batches b
JOIN transactions t ON t.service_id = b.service_id AND t.batch_id = b.batch_id
JOIN transaction_receipts r
  ON r.service_id = t.service_id AND r.transaction_id = t.transaction_id
WHERE b.seq IN (SELECT value FROM json_each(:seqs)) AND NOT r.result_valid
ORDER BY b.seq, t.position;

-- Store writes keep updated_at strictly increasing (max(now, old + 1)), so the
-- updated_at triggers only fill in for statements that do not set it.

-- A named query may hold several statements: the SQLite session runs them in
-- order, in one trip to the connection's thread.

-- Status and its mirror in batches (an attempt's status: no monitor check).
-- name: write_status
INSERT INTO batch_statuses (service_id, batch_id, dlt_status, created_at, updated_at)
VALUES (:service_id, :batch_id, :status, :now, :now)
ON CONFLICT (service_id, batch_id) DO UPDATE
SET dlt_status = excluded.dlt_status,
    updated_at = max(excluded.updated_at, batch_statuses.updated_at + 1);
UPDATE batches
SET status = :status,
    final = :final,
    submitted = :submitted,
    last_attempt_at = CASE WHEN :status = 'Delayed' THEN :now ELSE last_attempt_at END
WHERE service_id = :service_id AND batch_id = :batch_id;

-- The same and the monitor's bookkeeping (a status the ledger was asked for).
-- name: write_status_checked
INSERT INTO batch_statuses (service_id, batch_id, dlt_status, created_at, updated_at)
VALUES (:service_id, :batch_id, :status, :now, :now)
ON CONFLICT (service_id, batch_id) DO UPDATE
SET dlt_status = excluded.dlt_status,
    updated_at = max(excluded.updated_at, batch_statuses.updated_at + 1);
UPDATE batches
SET status = :status,
    final = :final,
    submitted = :submitted,
    last_attempt_at = CASE WHEN :status = 'Delayed' THEN :now ELSE last_attempt_at END
WHERE service_id = :service_id AND batch_id = :batch_id;
UPDATE submissions
SET last_checked = :now, times_checked = times_checked + 1,
    updated_at = max(:now, updated_at + 1)
WHERE service_id = :service_id AND batch_id = :batch_id;

-- An attempt: the batch is submitted, counted and timed; the submission row
-- carries this attempt's error (or none).
-- name: record_attempt
INSERT INTO submissions
    (service_id, batch_id, last_checked, times_checked, error_type, error_message, created_at,
     updated_at)
VALUES (:service_id, :batch_id, :now, 1, :error_type, :error_message, :now, :now)
ON CONFLICT (service_id, batch_id) DO UPDATE
SET error_type = excluded.error_type,
    error_message = excluded.error_message,
    updated_at = max(excluded.updated_at, submissions.updated_at + 1);
UPDATE batches
SET submitted = 1, attempts = attempts + 1, last_attempt_at = :now
WHERE service_id = :service_id AND batch_id = :batch_id;

-- name: upsert_submission_error
INSERT INTO submissions
    (service_id, batch_id, last_checked, times_checked, error_type, error_message, created_at,
     updated_at)
VALUES (:service_id, :batch_id, :now, 1, :error_type, :error_message, :now, :now)
ON CONFLICT (service_id, batch_id) DO UPDATE
SET error_type = excluded.error_type,
    error_message = excluded.error_message,
    updated_at = max(excluded.updated_at, submissions.updated_at + 1);

-- name: upsert_receipt
INSERT INTO transaction_receipts
    (service_id, transaction_id, result_valid, error_message, error_data, serialized_receipt,
     external_status, external_error_message, created_at, updated_at)
VALUES
    (:service_id, :transaction_id, :result_valid, :error_message, :error_data,
     :serialized_receipt, :external_status, :external_error_message, :now, :now)
ON CONFLICT (service_id, transaction_id) DO UPDATE
SET result_valid = excluded.result_valid,
    error_message = excluded.error_message,
    error_data = excluded.error_data,
    serialized_receipt = excluded.serialized_receipt,
    external_status = excluded.external_status,
    external_error_message = excluded.external_error_message,
    updated_at = max(excluded.updated_at, transaction_receipts.updated_at + 1);

-- name: clean_stale_receipts
DELETE FROM transaction_receipts
WHERE (service_id, transaction_id) IN (
    SELECT t.service_id, t.transaction_id
    FROM batches b
    JOIN batch_statuses s ON s.service_id = b.service_id AND s.batch_id = b.batch_id
    JOIN transactions t ON t.service_id = b.service_id AND t.batch_id = b.batch_id
    WHERE b.final AND s.updated_at < :cutoff
);

-- name: clean_orphan_receipts
DELETE FROM transaction_receipts
WHERE updated_at < :cutoff
  AND NOT EXISTS (
      SELECT 1 FROM transactions t
      WHERE t.service_id = transaction_receipts.service_id
        AND t.transaction_id = transaction_receipts.transaction_id
  );

-- name: clean_stale_batches
DELETE FROM batches
WHERE final
  AND EXISTS (
      SELECT 1 FROM batch_statuses s
      WHERE s.service_id = batches.service_id
        AND s.batch_id = batches.batch_id
        AND s.updated_at < :cutoff
  );

-- Page the services from batches_service_seq_idx first, then count and pick
-- from the partial batches_open_idx per service: final batches are read once
-- (for the total), not joined.
-- name: list_services
WITH page AS (
    SELECT service_id, count(*) AS total
    FROM batches
    -- The lower bound lets the index range start at the page (or the one service).
    WHERE service_id >= coalesce(:service_id, :after, '')
      AND (:after IS NULL OR service_id > :after)
      AND (:service_id IS NULL OR service_id = :service_id)
    GROUP BY service_id
    ORDER BY service_id
    LIMIT :limit
),
nexts AS (
    SELECT p.service_id, p.total,
           (SELECT n.seq FROM batches n
            WHERE n.service_id = p.service_id AND NOT n.final AND NOT n.submitted
              AND n.status IS NOT 'Pending'
            ORDER BY n.seq LIMIT 1) AS next_seq
    FROM page p
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
       n.seq, n.batch_id, n.blocked_by,
       (SELECT h.batch_id FROM batches h WHERE h.seq = n.blocked_by) AS blocker_batch_id,
       c.paused, pa.actor AS paused_by, pa.at AS paused_at,
       c.halted_batch_id, c.halted_reason, c.halted_at,
       -- What the next batch waits for: its submission error of type
       -- 'dependency' (ledgerq.model.DEPENDENCY), while it is not taken.
       (SELECT s.error_message FROM submissions s
        WHERE s.service_id = n.service_id AND s.batch_id = n.batch_id
          AND s.error_type = 'dependency') AS next_waits_for
FROM nexts p
LEFT JOIN batches n ON n.seq = p.next_seq
LEFT JOIN service_controls c ON c.service_id = p.service_id
-- Who paused a paused service: the latest pause that took effect (a pause of
-- a paused service is recorded with its detail).
LEFT JOIN service_actions pa ON c.paused AND pa.id = (
    SELECT max(a.id) FROM service_actions a
    WHERE a.service_id = p.service_id AND a.action = 'pause' AND a.detail IS NULL)
ORDER BY p.service_id;

-- The lock entries of some open batches (what holds the next batch of a service).
-- name: locks_of
SELECT seq, mode, entry FROM batch_locks WHERE seq IN (SELECT value FROM json_each(:seqs));

-- name: transaction_ids_of
SELECT b.seq, t.transaction_id
FROM batches b
JOIN transactions t ON t.service_id = b.service_id AND t.batch_id = b.batch_id
WHERE b.seq IN (SELECT value FROM json_each(:seqs));

-- name: status_counts
SELECT coalesce(status, 'none'), count(*) FROM batches GROUP BY 1;

-- name: get_batches_by_id
SELECT b.seq, b.service_id, b.batch_id, b.data_change_id, b.signer_public_key, b.trace,
       b.serialized_batch, b.submitted, b.created_at, b.last_attempt_at, b.attempts,
       b.status, s.error_type, s.error_message
FROM batches b
LEFT JOIN submissions s ON s.service_id = b.service_id AND s.batch_id = b.batch_id
WHERE b.batch_id IN (SELECT value FROM json_each(:ids))
ORDER BY b.seq;

-- get_batches_by_id without the bodies (an empty serialized_batch): what a
-- status answer needs, at a third of the cost of reading them.
-- name: get_batch_statuses_by_id
SELECT b.seq, b.service_id, b.batch_id, b.data_change_id, b.signer_public_key, b.trace,
       X'', b.submitted, b.created_at, b.last_attempt_at, b.attempts,
       b.status, s.error_type, s.error_message
FROM batches b
LEFT JOIN submissions s ON s.service_id = b.service_id AND s.batch_id = b.batch_id
WHERE b.batch_id IN (SELECT value FROM json_each(:ids))
ORDER BY b.seq;

-- get_batch_statuses_by_id, only the batches in a final state: what the
-- parked status requests' refresher reads (a pending batch, most of what it
-- watches, costs it no row).
-- name: get_final_batch_statuses_by_id
SELECT b.seq, b.service_id, b.batch_id, b.data_change_id, b.signer_public_key, b.trace,
       X'', b.submitted, b.created_at, b.last_attempt_at, b.attempts,
       b.status, s.error_type, s.error_message
FROM batches b
LEFT JOIN submissions s ON s.service_id = b.service_id AND s.batch_id = b.batch_id
WHERE b.batch_id IN (SELECT value FROM json_each(:ids))
  AND b.status IN ('Committed', 'Valid', 'Invalid')
ORDER BY b.seq;

-- name: get_batches_by_seq
SELECT b.seq, b.service_id, b.batch_id, b.data_change_id, b.signer_public_key, b.trace,
       b.serialized_batch, b.submitted, b.created_at, b.last_attempt_at, b.attempts,
       b.status, s.error_type, s.error_message
FROM batches b
LEFT JOIN submissions s ON s.service_id = b.service_id AND s.batch_id = b.batch_id
WHERE b.seq IN (SELECT value FROM json_each(:seqs))
ORDER BY b.seq;

-- The rounds: one statement per kind of round, written once as a template
-- and filled in per scope (every service, a list of services) —
-- docs/queuer.md.
--
-- The columns of a picked batch. A narrow round (:narrow true) leaves out
-- what the queue source loads only for the batches it hands out:
-- serialized_batch (empty), the submission error (no join) and, in the
-- store, the transactions.
-- template: round_batches
SELECT b.seq, b.service_id, b.batch_id, b.data_change_id, b.signer_public_key, b.trace,
       CASE WHEN :narrow THEN X'' ELSE b.serialized_batch END,
       b.submitted, b.created_at, b.last_attempt_at, b.attempts,
       b.status, s.error_type, s.error_message
FROM picks
JOIN batches b ON b.seq = picks.seq
LEFT JOIN submissions s
    ON NOT :narrow AND s.service_id = b.service_id AND s.batch_id = b.batch_id

-- Every service with a batch that is not final: a skip scan of
-- batches_open_idx (one index probe per service).
-- template: open_services
open_services(service_id) AS (
    SELECT min(service_id) FROM batches WHERE NOT final
    UNION ALL
    SELECT (
        SELECT min(o.service_id) FROM batches AS o
        WHERE NOT o.final AND o.service_id > open_services.service_id
    )
    FROM open_services
    WHERE open_services.service_id IS NOT NULL
)

-- The service ids in :services (a JSON array; an instance's claimed
-- services), distinct.
-- template: wanted_services
wanted(service_id) AS (
    SELECT DISTINCT value FROM json_each(:services)
)

-- The one-round serial queuer's round; the same round as
-- ledgerq.queue.serial.select_round (docs/queuer.md). The slot services is
-- the scope's services (CTE named by the slot scope), each service's head
-- one more index probe. busy: per service, its batches that are not
-- {submitted = false, None} (batches_busy_idx); a service with one
-- submitted or Pending is in flight, otherwise its first busy batch is the
-- Unknown/Delayed one to resubmit. Other services queue their head.
-- template: queue_round
WITH RECURSIVE {{services}},
busy AS (
    SELECT service_id, min(seq) AS first_seq,
           max(submitted OR status IS 'Pending') AS in_flight
    FROM batches
    WHERE NOT final AND (submitted OR status IS NOT NULL)
      {{scope_busy}}
    GROUP BY service_id
),
picks(seq) AS (
    SELECT first_seq FROM busy WHERE NOT in_flight
    UNION ALL
    SELECT (
        SELECT min(o.seq) FROM batches AS o
        WHERE NOT o.final AND o.service_id = scope.service_id
    )
    FROM {{scope}} AS scope
    WHERE scope.service_id IS NOT NULL
      AND NOT EXISTS (SELECT 1 FROM busy WHERE busy.service_id = scope.service_id)
)
{{round_batches}}
WHERE b.status IS NULL OR b.status = 'Unknown' OR b.last_attempt_at IS NULL
   OR b.last_attempt_at <= :now - :delay_window_ms
ORDER BY CASE b.status WHEN 'Unknown' THEN 0 WHEN 'Delayed' THEN 1 ELSE 2 END, b.seq
LIMIT coalesce(:limit, -1);

-- name: queue_round
-- fill: queue_round
--   services: {{open_services}}
--   scope: open_services
--   scope_busy:

-- name: queue_round_services
-- fill: queue_round
--   services: {{wanted_services}}
--   scope: wanted
--   scope_busy: AND service_id IN (SELECT service_id FROM wanted)

-- Every service with a free new batch: a skip scan of batches_ready_idx.
-- template: ready_services
ready_services(service_id) AS (
    SELECT min(service_id) FROM batches
    WHERE NOT final AND blocked_by IS NULL AND NOT submitted AND status IS NULL
    UNION ALL
    SELECT (
        SELECT min(r.service_id) FROM batches AS r
        WHERE NOT r.final AND r.blocked_by IS NULL AND NOT r.submitted AND r.status IS NULL
          AND r.service_id > ready_services.service_id
    )
    FROM ready_services
    WHERE ready_services.service_id IS NOT NULL
)

-- The parallel queuer's free batches; the same round as
-- ledgerq.queue.parallel.select_parallel_round (docs/queuer.md). A batch is
-- free when no earlier non-final batch of its service conflicts with it
-- (blocked_by IS NULL, kept by add_batches and the batches_release_locks_*
-- triggers): the Unknown or window-expired Delayed ones (stalled, from the
-- busy batches) and the new ones. :exclude: seqs never picked (JSON).
-- template: parallel_stalled
SELECT service_id, seq, CASE status WHEN 'Unknown' THEN 0 ELSE 1 END AS class
FROM batches
WHERE NOT final AND (submitted OR status IS NOT NULL)
  AND NOT submitted AND status IN ('Unknown', 'Delayed') AND blocked_by IS NULL
  AND (status = 'Unknown' OR last_attempt_at IS NULL
       OR last_attempt_at <= :now - :delay_window_ms)
  AND seq NOT IN (SELECT seq FROM excluded)
  {{scope_stalled}}

-- template: parallel_fresh
SELECT min(r.seq) FROM batches AS r
WHERE NOT r.final AND r.blocked_by IS NULL AND NOT r.submitted AND r.status IS NULL
  AND r.seq NOT IN (SELECT seq FROM excluded)

-- The parallel round: per service of the scope, its free stalled batches
-- and its first free new ones, one probe each. Of both, the first
-- :per_service of each service in (class, seq); the round is ordered by
-- place in the service first.
-- template: parallel_round
WITH RECURSIVE excluded(seq) AS (
    SELECT value FROM json_each(:exclude)
),
{{services}},
stalled AS (
    {{parallel_stalled}}
),
fresh(service_id, seq, n) AS (
    SELECT scope.service_id, (
        {{parallel_fresh}}
          AND r.service_id = scope.service_id
    ), 1
    FROM {{scope}} AS scope
    WHERE scope.service_id IS NOT NULL
    UNION ALL
    SELECT f.service_id, (
        {{parallel_fresh}}
          AND r.service_id = f.service_id AND r.seq > f.seq
    ), f.n + 1
    FROM fresh AS f
    WHERE f.seq IS NOT NULL AND f.n < :per_service
),
picks(seq, class, place) AS (
    SELECT seq, class, place FROM (
        SELECT seq, class,
               row_number() OVER (PARTITION BY service_id ORDER BY class, seq) AS place
        FROM (
            SELECT service_id, seq, class FROM stalled
            UNION ALL
            SELECT service_id, seq, 2 FROM fresh WHERE seq IS NOT NULL
        )
    )
    WHERE place <= :per_service
)
{{round_batches}}
ORDER BY picks.place, picks.class, b.seq
LIMIT coalesce(:limit, -1);

-- The parallel round with one pick per service (the store runs it whenever
-- per_service = 1): a service's first stalled batch, or else its first free
-- new one, without ranking the candidates.
-- template: parallel_round_first
WITH RECURSIVE excluded(seq) AS (
    SELECT value FROM json_each(:exclude)
),
{{services}},
stalled AS (
    SELECT service_id, seq FROM (
        SELECT service_id, seq,
               row_number() OVER (PARTITION BY service_id ORDER BY class, seq) AS place
        FROM (
            {{parallel_stalled}}
        )
    )
    WHERE place = 1
),
fresh(seq) AS (
    SELECT (
        {{parallel_fresh}}
          AND r.service_id = scope.service_id
    )
    FROM {{scope}} AS scope
    WHERE scope.service_id IS NOT NULL
      AND NOT EXISTS (SELECT 1 FROM stalled WHERE stalled.service_id = scope.service_id)
),
picks(seq) AS (
    SELECT seq FROM stalled
    UNION ALL
    SELECT seq FROM fresh WHERE seq IS NOT NULL
)
{{round_batches}}
ORDER BY CASE b.status WHEN 'Unknown' THEN 0 WHEN 'Delayed' THEN 1 ELSE 2 END, b.seq
LIMIT coalesce(:limit, -1);

-- name: parallel_round
-- fill: parallel_round
--   services: {{ready_services}}
--   scope: ready_services
--   scope_stalled:

-- name: parallel_round_services
-- fill: parallel_round
--   services: {{wanted_services}}
--   scope: wanted
--   scope_stalled: AND service_id IN (SELECT service_id FROM wanted)

-- name: parallel_round_first
-- fill: parallel_round_first
--   services: {{ready_services}}
--   scope: ready_services
--   scope_stalled:

-- name: parallel_round_services_first
-- fill: parallel_round_first
--   services: {{wanted_services}}
--   scope: wanted
--   scope_stalled: AND service_id IN (SELECT service_id FROM wanted)

-- What the DLT monitor follows: non-final batches the ledger has (Pending)
-- or may have (submitted: taken for a first attempt, or for a resubmission
-- after Unknown or Delayed), narrow (no blobs, no errors). The predicate
-- repeats batches_busy_idx's, so only busy batches are read.
-- name: list_in_flight
-- INDEXED BY: without it the planner walks the whole table in seq order
-- (ORDER BY seq is the rowid's order) rather than sort the few busy rows;
-- the follower runs this every poll interval.
SELECT b.seq, b.service_id, b.batch_id, b.data_change_id, b.signer_public_key, b.trace,
       X'', b.submitted, b.created_at, b.last_attempt_at, b.attempts,
       b.status, NULL, NULL
FROM batches b INDEXED BY batches_busy_idx
WHERE NOT b.final AND (b.submitted OR b.status IS NOT NULL)
  AND (b.status = 'Pending' OR b.submitted)
ORDER BY b.seq
LIMIT :limit;

-- The same, of the services in :services (a JSON array; services just
-- claimed) only: one probe of batches_busy_idx per service.
-- name: list_in_flight_services
SELECT b.seq, b.service_id, b.batch_id, b.data_change_id, b.signer_public_key, b.trace,
       X'', b.submitted, b.created_at, b.last_attempt_at, b.attempts,
       b.status, NULL, NULL
FROM batches b INDEXED BY batches_busy_idx
WHERE b.service_id IN (SELECT value FROM json_each(:services))
  AND NOT b.final AND (b.submitted OR b.status IS NOT NULL)
  AND (b.status = 'Pending' OR b.submitted)
ORDER BY b.seq
LIMIT :limit;

-- A group of writes (apply_writes): the rows of its batches (the write lock
-- is the transaction's already).
-- :keys is a JSON array of [service_id, batch_id]; CROSS JOIN keeps the
-- planner from scanning a service's batches per key: one key lookup each.
-- name: batch_states
SELECT b.service_id, b.batch_id, b.status, b.submitted
FROM json_each(:keys) AS k
CROSS JOIN batches b
WHERE b.service_id = json_extract(k.value, '$[0]') AND b.batch_id = json_extract(k.value, '$[1]');

-- The commit → next POST merge (docs/gateway.md, "The commit → next POST
-- gap"): per [service_id, after] of :keys (a JSON array; one pair per
-- service), the service's next open batch once batch `after` is final, when
-- the serial queuer's choice would be exactly that batch: the first
-- non-final batch other than `after`, never taken (not submitted, no
-- status), and no non-final batch of the service but `after` submitted or
-- with a status. Nothing for the pair otherwise.
-- name: next_open_batches
-- With the batches' transactions (hydrate_transactions' columns after the
-- batch's), one row per transaction: one statement for the read-ahead's miss.
WITH k AS (
    SELECT json_extract(value, '$[0]') AS service_id, json_extract(value, '$[1]') AS after
    FROM json_each(:keys)
),
p AS (
    SELECT k.service_id, k.after, (
        SELECT o.seq FROM batches o INDEXED BY batches_open_idx
        WHERE o.service_id = k.service_id AND NOT o.final AND o.batch_id <> k.after
        ORDER BY o.seq LIMIT 1
    ) AS seq
    FROM k
),
n AS (
    SELECT b.seq, b.service_id, b.batch_id, b.data_change_id, b.signer_public_key, b.trace,
           b.serialized_batch, b.submitted, b.created_at, b.last_attempt_at, b.attempts,
           b.status, s.error_type, s.error_message
    FROM p
    CROSS JOIN batches b
    LEFT JOIN submissions s ON s.service_id = b.service_id AND s.batch_id = b.batch_id
    WHERE b.seq = p.seq AND NOT b.submitted AND b.status IS NULL
      AND NOT EXISTS (
            SELECT 1 FROM batches o INDEXED BY batches_busy_idx
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
-- writes: which conditional takes may land. :keys is a JSON array of
-- [service_id, batch_id, after]; a row comes back for each batch that is what
-- the serial queuer would pick once `after` is final (the first non-final
-- batch of the service other than `after`, while no non-final batch of the
-- service other than `after` is submitted or has a status).
-- name: next_open_checks
SELECT k.service_id, k.batch_id
FROM (
    SELECT json_extract(value, '$[0]') AS service_id, json_extract(value, '$[1]') AS batch_id,
           json_extract(value, '$[2]') AS after
    FROM json_each(:keys)
) AS k
WHERE k.batch_id = (
        SELECT o.batch_id FROM batches o INDEXED BY batches_open_idx
        WHERE o.service_id = k.service_id AND NOT o.final AND o.batch_id <> k.after
        ORDER BY o.seq LIMIT 1
    )
  AND NOT EXISTS (
        SELECT 1 FROM batches o INDEXED BY batches_busy_idx
        WHERE o.service_id = k.service_id AND NOT o.final
          AND (o.submitted OR o.status IS NOT NULL) AND o.batch_id <> k.after
    );

-- Declared dependencies: for each transaction id of :ids (a JSON array), the
-- batch that tracks it (in any service) and its state, with the submission
-- error that says how it ended (a cancelled batch's is 'cancelled').
-- name: dependency_states
SELECT t.transaction_id, b.service_id, b.batch_id, b.seq, b.status, b.submitted, s.error_type
FROM transactions t
JOIN batches b ON b.service_id = t.service_id AND b.batch_id = t.batch_id
LEFT JOIN submissions s ON s.service_id = b.service_id AND s.batch_id = b.batch_id
WHERE t.transaction_id IN (SELECT value FROM json_each(:ids));

-- Declared dependencies: what decides whether batch :batch_id (of :service_id) may go
-- (DependencyPath in store/base.py). From it, each batch's first dependency
-- outside itself (transaction, then declaration order) that a batch tracks
-- and none committed, with its batch of lowest seq; followed while that batch
-- is open (not submitted, no status or Delayed/Unknown), :max_steps steps at most.
-- A row per batch on the path (the batch itself at depth 0) with the
-- transaction that led to it; the last also its dependencies no batch tracks.
-- name: dependency_path
WITH RECURSIVE path(depth, seq, via) AS (
    SELECT 0, seq, NULL FROM batches WHERE service_id = :service_id AND batch_id = :batch_id
    UNION ALL
    SELECT p.depth + 1, nb.seq, nt.transaction_id
    FROM path p
    JOIN batches pb ON pb.seq = p.seq
    JOIN transactions nt ON nt.transaction_id = (
        SELECT d.value
        FROM transactions t, json_each(t.dependencies) d
        WHERE t.service_id = pb.service_id AND t.batch_id = pb.batch_id
          AND NOT EXISTS (
                SELECT 1 FROM transactions o
                WHERE o.service_id = pb.service_id AND o.transaction_id = d.value
                  AND o.batch_id = pb.batch_id)
          AND EXISTS (SELECT 1 FROM transactions x WHERE x.transaction_id = d.value)
          AND NOT EXISTS (
                SELECT 1 FROM transactions x
                JOIN batches xb ON xb.service_id = x.service_id AND xb.batch_id = x.batch_id
                WHERE x.transaction_id = d.value AND xb.status IN ('Committed', 'Valid'))
        ORDER BY t.position, d.key
        LIMIT 1)
    JOIN batches nb ON nb.service_id = nt.service_id AND nb.batch_id = nt.batch_id
    WHERE p.depth < :max_steps
      AND (p.depth = 0
           OR (NOT pb.submitted AND (pb.status IS NULL OR pb.status IN ('Delayed', 'Unknown'))))
      AND NOT EXISTS (
            SELECT 1 FROM transactions y
            JOIN batches yb ON yb.service_id = y.service_id AND yb.batch_id = y.batch_id
            WHERE y.transaction_id = nt.transaction_id AND yb.seq < nb.seq)
)
SELECT p.via, b.service_id, b.batch_id, b.seq, b.status, b.submitted, s.error_type,
       CASE WHEN p.depth = (SELECT max(depth) FROM path) THEN (
           SELECT json_group_array(u.value) FROM (
               SELECT d.value
               FROM transactions t, json_each(t.dependencies) d
               WHERE t.service_id = b.service_id AND t.batch_id = b.batch_id
                 AND NOT EXISTS (SELECT 1 FROM transactions x WHERE x.transaction_id = d.value)
               ORDER BY t.position, d.key) u)
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
WHERE service_id IN (SELECT value FROM json_each(:service_ids))
  AND (paused OR halted_batch_id IS NOT NULL)
ORDER BY service_id;

-- The services of :service_ids that take nothing new: paused or halted.
-- name: stopped_of
SELECT service_id, paused OR halted_batch_id IS NOT NULL
FROM service_controls
WHERE service_id IN (SELECT value FROM json_each(:service_ids));

-- name: lock_service_control
SELECT paused, halted_batch_id, halted_reason, halted_at
FROM service_controls
WHERE service_id = :service_id;

-- name: service_exists
SELECT 1 FROM batches WHERE service_id = :service_id LIMIT 1;

-- name: set_paused
INSERT INTO service_controls (service_id, paused, updated_at)
VALUES (:service_id, :paused, :now)
ON CONFLICT (service_id) DO UPDATE SET paused = excluded.paused, updated_at = excluded.updated_at;

-- name: set_halted
INSERT INTO service_controls (service_id, halted_batch_id, halted_reason, halted_at, updated_at)
VALUES (:service_id, :batch_id, :reason, :now, :now)
ON CONFLICT (service_id) DO UPDATE SET
    halted_batch_id = excluded.halted_batch_id, halted_reason = excluded.halted_reason,
    halted_at = excluded.halted_at, updated_at = excluded.updated_at;

-- name: clear_halted
UPDATE service_controls
SET halted_batch_id = NULL, halted_reason = NULL, halted_at = NULL, updated_at = :now
WHERE service_id = :service_id;

-- name: insert_service_action
INSERT INTO service_actions (service_id, action, actor, at, batch_ids, detail)
VALUES (:service_id, :action, :actor, :now, :batch_ids, :detail)
RETURNING id;

-- name: service_actions
SELECT id, service_id, action, actor, at, batch_ids, detail
FROM service_actions
WHERE service_id = :service_id AND (:before IS NULL OR id < :before)
ORDER BY id DESC
LIMIT :limit;

-- name: transaction_ids_of_batch
SELECT transaction_id FROM transactions
WHERE service_id = :service_id AND batch_id = :batch_id
ORDER BY position;

-- The pipelined strategy (docs/queuer.md): the first :limit non-final batches of
-- :service_id after batch :after (NULL: from its first), in its order, whatever their
-- state, with their transactions (one row each).
-- name: batches_following
WITH n AS (
    SELECT b.seq, b.service_id, b.batch_id, b.data_change_id, b.signer_public_key, b.trace,
           b.serialized_batch, b.submitted, b.created_at, b.last_attempt_at, b.attempts,
           b.status, s.error_type, s.error_message
    FROM batches b INDEXED BY batches_open_idx
    LEFT JOIN submissions s ON s.service_id = b.service_id AND s.batch_id = b.batch_id
    WHERE b.service_id = :service_id AND NOT b.final
      AND (:after IS NULL OR b.seq > (SELECT a.seq FROM batches a
                   WHERE a.service_id = :service_id AND a.batch_id = :after))
    ORDER BY b.seq
    LIMIT :limit
)
SELECT n.*, t.transaction_id, t.family_name, t.family_version, t.payload,
       t.signer_public_key, t.service_id, t.inputs, t.outputs, t.dependencies
FROM n
LEFT JOIN transactions t ON t.service_id = n.service_id AND t.batch_id = n.batch_id
ORDER BY n.seq, t.position;
