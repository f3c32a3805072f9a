-- queue_round without a skip scan: per service, the seq of its first non-final
-- batch, kept by triggers in the transaction of every write that can change
-- it. A round then reads ~one narrow row per service instead of probing
-- batches_open_idx once per service.
CREATE TABLE queue_heads (
    service_id VARCHAR(64) PRIMARY KEY,
    -- NULL: the service has no non-final batch.
    head_seq   BIGINT
);

INSERT INTO queue_heads (service_id, head_seq)
SELECT service_id, min(seq) FILTER (WHERE NOT final) FROM batches GROUP BY service_id;

-- New batches: set-based, once per statement (add_batches COPYs many). A new
-- batch is the head only if its seq is below the current head's, or there is
-- none (LEAST ignores NULL).
CREATE FUNCTION ledgerq_queue_heads_insert() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    INSERT INTO queue_heads AS q (service_id, head_seq)
    SELECT service_id, min(seq) FROM new_batches WHERE NOT final
    GROUP BY service_id ORDER BY service_id
    ON CONFLICT (service_id) DO UPDATE SET head_seq = LEAST(q.head_seq, excluded.head_seq);
    RETURN NULL;
END
$$;

-- A batch became final (or not), or a non-final batch was deleted: look the
-- head up again. The row is locked first and the head read by a second
-- statement, which (READ COMMITTED, volatile function) takes a new snapshot:
-- a concurrent insert into the service has committed by then and is seen.
CREATE FUNCTION ledgerq_queue_heads_refresh() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    INSERT INTO queue_heads AS q (service_id, head_seq) VALUES (OLD.service_id, NULL)
    ON CONFLICT (service_id) DO UPDATE SET head_seq = q.head_seq;
    UPDATE queue_heads
    SET head_seq = (
        SELECT min(seq) FROM batches WHERE service_id = OLD.service_id AND NOT final
    )
    WHERE service_id = OLD.service_id;
    RETURN NULL;
END
$$;

CREATE TRIGGER batches_queue_heads_insert AFTER INSERT ON batches
    REFERENCING NEW TABLE AS new_batches
    FOR EACH STATEMENT EXECUTE FUNCTION ledgerq_queue_heads_insert();
CREATE TRIGGER batches_queue_heads_update AFTER UPDATE OF final ON batches
    FOR EACH ROW WHEN (OLD.final IS DISTINCT FROM NEW.final)
    EXECUTE FUNCTION ledgerq_queue_heads_refresh();
CREATE TRIGGER batches_queue_heads_delete AFTER DELETE ON batches
    FOR EACH ROW WHEN (NOT OLD.final)
    EXECUTE FUNCTION ledgerq_queue_heads_refresh();

-- The busy batches' lock state in the index itself: queue_round reads them
-- with an index-only scan instead of one heap page per busy batch.
DROP INDEX batches_busy_idx;
CREATE INDEX batches_busy_idx ON batches (service_id, seq) INCLUDE (submitted, status)
    WHERE NOT final AND (submitted OR status IS NOT NULL);
