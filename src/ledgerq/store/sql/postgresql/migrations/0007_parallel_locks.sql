-- The parallel queuer (docs/queuer.md): what each transaction declares it
-- reads, writes and depends on; the lock entries of every non-final batch;
-- and, per non-final batch, the latest earlier non-final batch of its service
-- it conflicts with (blocked_by), kept in the transaction of every write that
-- changes it.

-- As the transaction header declares them. NULL: not known (tracked before
-- this migration), which the queuer reads as every address.
ALTER TABLE transactions ADD COLUMN inputs TEXT[];
ALTER TABLE transactions ADD COLUMN outputs TEXT[];
ALTER TABLE transactions ADD COLUMN dependencies TEXT[];

-- The lock entries of non-final batches (ledgerq.queue.parallel.BatchAccess):
-- 'r' may read and 'w' may write an address or prefix (lower-case hex, at most
-- 70 characters), 'd' depends on the transaction whose id is the entry.
-- Written with the batch, deleted when it becomes final.
CREATE TABLE batch_locks (
    seq        BIGINT NOT NULL,
    service_id VARCHAR(64) NOT NULL,
    mode       TEXT NOT NULL CHECK (mode IN ('r', 'w', 'd')),
    entry      TEXT COLLATE "C" NOT NULL,
    PRIMARY KEY (seq, mode, entry)
);

-- Earlier entries equal to one, or under it (a range of the "C" order).
CREATE INDEX batch_locks_entry_idx ON batch_locks (service_id, entry, mode, seq);
-- Entries shorter than an address: the prefixes that may begin an entry.
CREATE INDEX batch_locks_prefix_idx ON batch_locks (service_id, seq) INCLUDE (mode, entry)
    WHERE length(entry) < 70 AND mode <> 'd';

-- NULL: no earlier non-final batch of the service conflicts with this one.
ALTER TABLE batches ADD COLUMN blocked_by BIGINT;

-- The parallel round's new picks: per service, its free new batches in order.
CREATE INDEX batches_ready_idx ON batches (service_id, seq)
    WHERE NOT final AND blocked_by IS NULL AND NOT submitted AND status IS NULL;
-- The batches a batch holds, looked up when it becomes final.
CREATE INDEX batches_blocked_by_idx ON batches (blocked_by)
    WHERE blocked_by IS NOT NULL AND NOT final;

-- The latest earlier non-final batch of p_service that conflicts with batch
-- p_seq, from their lock entries; NULL if none. The same rule as
-- ledgerq.queue.parallel.conflict: an earlier write overlapping one of its
-- entries, an earlier read overlapping one of its writes, or a transaction it
-- depends on. Two entries overlap when one begins the other.
CREATE FUNCTION ledgerq_blocker(p_service VARCHAR, p_seq BIGINT) RETURNS BIGINT
    LANGUAGE sql STABLE
    AS $$
SELECT max(found) FROM (
    -- The same entry, written before (each a backward index probe).
    SELECT (SELECT max(l.seq) FROM batch_locks l
            WHERE l.service_id = p_service AND l.entry = n.entry AND l.mode = 'w'
              AND l.seq < p_seq) AS found
    FROM batch_locks n WHERE n.seq = p_seq AND n.mode IN ('r', 'w')
    UNION ALL
    -- The same entry, read before, when this batch writes it.
    SELECT (SELECT max(l.seq) FROM batch_locks l
            WHERE l.service_id = p_service AND l.entry = n.entry AND l.mode = 'r'
              AND l.seq < p_seq)
    FROM batch_locks n WHERE n.seq = p_seq AND n.mode = 'w'
    UNION ALL
    -- Longer entries that begin with one of ours: entries are hex, so they
    -- sort between it and it followed by 'g'.
    SELECT (SELECT max(l.seq) FROM batch_locks l
            WHERE l.service_id = p_service AND l.entry > n.entry AND l.entry < n.entry || 'g'
              AND (l.mode = 'w' OR (l.mode = 'r' AND n.mode = 'w')) AND l.seq < p_seq)
    FROM batch_locks n WHERE n.seq = p_seq AND n.mode IN ('r', 'w')
    UNION ALL
    -- Shorter entries that begin one of ours (prefixes: batch_locks_prefix_idx).
    SELECT (SELECT max(l.seq) FROM batch_locks l
            WHERE l.service_id = p_service AND length(l.entry) < 70 AND l.mode <> 'd'
              AND l.seq < p_seq AND length(l.entry) < length(n.entry)
              AND starts_with(n.entry, l.entry)
              AND (l.mode = 'w' OR n.mode = 'w'))
    FROM batch_locks n WHERE n.seq = p_seq AND n.mode IN ('r', 'w')
    UNION ALL
    -- Transactions it depends on, in earlier non-final batches of the service.
    SELECT (SELECT max(b.seq) FROM transactions t
            JOIN batches b ON b.service_id = t.service_id AND b.batch_id = t.batch_id
            WHERE t.service_id = p_service AND t.transaction_id = n.entry
              AND b.seq < p_seq AND NOT b.final)
    FROM batch_locks n WHERE n.seq = p_seq AND n.mode = 'd'
) AS candidates
$$;

-- A batch that became final (or a non-final one deleted) holds nothing: its
-- entries go, and the batches it held look for another blocker. The service's
-- queue_heads row is locked first, as ledgerq_queue_heads_refresh does and as
-- add_batches does before it looks for the blockers of new batches: the two
-- take turns per service, and each sees what the other committed.
CREATE FUNCTION ledgerq_release_locks() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    IF TG_OP = 'UPDATE' AND NOT NEW.final THEN
        RETURN NULL;
    END IF;
    INSERT INTO queue_heads AS q (service_id, head_seq) VALUES (OLD.service_id, NULL)
    ON CONFLICT (service_id) DO UPDATE SET head_seq = q.head_seq;
    DELETE FROM batch_locks WHERE seq = OLD.seq;
    UPDATE batches SET blocked_by = ledgerq_blocker(service_id, seq)
    WHERE blocked_by = OLD.seq AND NOT final;
    RETURN NULL;
END
$$;

CREATE TRIGGER batches_release_locks_update AFTER UPDATE OF final ON batches
    FOR EACH ROW WHEN (OLD.final IS DISTINCT FROM NEW.final)
    EXECUTE FUNCTION ledgerq_release_locks();
CREATE TRIGGER batches_release_locks_delete AFTER DELETE ON batches
    FOR EACH ROW WHEN (NOT OLD.final)
    EXECUTE FUNCTION ledgerq_release_locks();

-- Batches tracked before: their access is not known, so each reads and writes
-- everything and is held by the non-final batch before it.
INSERT INTO batch_locks (seq, service_id, mode, entry)
SELECT seq, service_id, 'w', '' FROM batches WHERE NOT final;
UPDATE batches b SET blocked_by = p.previous
FROM (
    SELECT seq, lag(seq) OVER (PARTITION BY service_id ORDER BY seq) AS previous
    FROM batches WHERE NOT final
) p
WHERE b.seq = p.seq AND p.previous IS NOT NULL;
