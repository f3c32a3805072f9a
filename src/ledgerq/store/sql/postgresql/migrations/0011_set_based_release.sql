-- Batches becoming final, released set-based: once per statement instead of
-- once per row. A group write makes many batches final in one UPDATE; the
-- two row-level triggers then ran once per batch each (the queue_heads row
-- written three times, the blocked batches re-pointed one release at a
-- time), a large share of a group write (docs/store.md).
--
-- PostgreSQL refuses transition tables on a trigger with a column list, so
-- the statement-level trigger runs after every UPDATE of batches; it finds
-- the rows whose final changed by joining the statement's old and new rows,
-- and returns at once when there are none (an attempt, a Pending status,
-- its own re-pointing of blocked_by).
DROP TRIGGER batches_queue_heads_update ON batches;
DROP TRIGGER batches_queue_heads_delete ON batches;
DROP TRIGGER batches_release_locks_update ON batches;
DROP TRIGGER batches_release_locks_delete ON batches;
DROP FUNCTION ledgerq_release_locks();
DROP FUNCTION ledgerq_queue_heads_refresh();

-- p_released (seqs of batches that became final or were deleted while open)
-- hold nothing any more: their lock entries go and the batches they held
-- look for another blocker; the heads of p_services (every service whose
-- batches changed final) are looked up again. The services' queue_heads
-- rows are locked first, in key order, as add_batches locks them before it
-- looks for the blockers of new batches (and as a group write locks them
-- before anything else, lock_finishing_heads): the two take turns per
-- service. Each statement after the lock takes a new snapshot (READ
-- COMMITTED, volatile function), so it sees what a concurrent add_batches
-- committed while this one waited.
--
-- A held batch's blocker is the latest earlier open batch it conflicts
-- with, so every other batch it conflicts with comes before that blocker:
-- when no open batch of the service comes before it any more (the usual
-- case, a service's head becoming final), the held batch is free without
-- asking ledgerq_blocker.
CREATE FUNCTION ledgerq_release(p_services TEXT[], p_released BIGINT[]) RETURNS void
    LANGUAGE plpgsql
    AS $$
BEGIN
    PERFORM 1 FROM queue_heads WHERE service_id = ANY(p_services)
    ORDER BY service_id FOR UPDATE;
    IF cardinality(p_released) > 0 THEN
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

-- After every UPDATE of batches: the batches whose final changed. Those
-- that became final release what they held; the heads of their services
-- move.
CREATE FUNCTION ledgerq_batches_updated() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
DECLARE
    services TEXT[];
    released BIGINT[];
BEGIN
    SELECT array_agg(DISTINCT o.service_id), array_agg(o.seq) FILTER (WHERE n.final)
    INTO services, released
    FROM old_batches o JOIN new_batches n ON n.seq = o.seq
    WHERE o.final IS DISTINCT FROM n.final;
    IF services IS NOT NULL THEN
        PERFORM ledgerq_release(services, coalesce(released, '{}'));
    END IF;
    RETURN NULL;
END
$$;

-- A batch deleted while open (a hand-written DELETE: cleaning deletes final
-- batches only) releases what it held. Row by row: cleaning deletes many
-- final batches, which a transition table would copy for nothing.
CREATE FUNCTION ledgerq_open_batch_deleted() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    PERFORM ledgerq_release(ARRAY[OLD.service_id]::TEXT[], ARRAY[OLD.seq]);
    RETURN NULL;
END
$$;

CREATE TRIGGER batches_release_update AFTER UPDATE ON batches
    REFERENCING OLD TABLE AS old_batches NEW TABLE AS new_batches
    FOR EACH STATEMENT EXECUTE FUNCTION ledgerq_batches_updated();
CREATE TRIGGER batches_release_delete AFTER DELETE ON batches
    FOR EACH ROW WHEN (NOT OLD.final)
    EXECUTE FUNCTION ledgerq_open_batch_deleted();
