-- The release skips lock entries and blockers where none are kept
-- (lock_entries_kept): a serial-only database scanned batch_locks and the
-- empty batches_blocked_by_idx for every group of batches made final.
-- Read after the services' queue_heads locks, which the switch turning
-- entries on takes for every service: either the switch committed first and
-- this reads it on, or it waits for this transaction and computes the
-- blockers with its batches final.
CREATE OR REPLACE FUNCTION ledgerq_release(p_services TEXT[], p_released BIGINT[]) RETURNS void
    LANGUAGE plpgsql
    AS $$
BEGIN
    PERFORM 1 FROM queue_heads WHERE service_id = ANY(p_services)
    ORDER BY service_id FOR UPDATE;
    IF cardinality(p_released) > 0
       AND coalesce((SELECT kept FROM lock_entries_kept), TRUE) THEN
        DELETE FROM batch_locks WHERE seq = ANY(p_released);
        UPDATE batches b
        SET blocked_by = CASE
            WHEN EXISTS (
                SELECT 1 FROM batches e
                WHERE e.service_id = b.service_id AND NOT e.final AND e.seq < b.blocked_by
            ) THEN ledgerq_blocker(b.service_id, b.seq)
        END
        WHERE b.blocked_by = ANY(p_released) AND NOT b.final;
    END IF;
    UPDATE queue_heads q
    SET head_seq = h.head_seq
    FROM (
        SELECT s.service_id,
               (SELECT min(b.seq) FROM batches b
                WHERE b.service_id = s.service_id AND NOT b.final) AS head_seq
        FROM unnest(p_services) AS s(service_id)
    ) h
    WHERE q.service_id = h.service_id AND q.head_seq IS DISTINCT FROM h.head_seq;
END
$$;
