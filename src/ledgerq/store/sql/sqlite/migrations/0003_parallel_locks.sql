-- The parallel queuer (docs/queuer.md): what each transaction declares it
-- reads, writes and depends on; the lock entries of every non-final batch;
-- and, per non-final batch, the latest earlier non-final batch of its service
-- it conflicts with (blocked_by), kept in the transaction of every write that
-- changes it.

-- As the transaction header declares them, JSON arrays. NULL: not known
-- (tracked before this migration), which the queuer reads as every address.
ALTER TABLE transactions ADD COLUMN inputs TEXT;
ALTER TABLE transactions ADD COLUMN outputs TEXT;
ALTER TABLE transactions ADD COLUMN dependencies TEXT;

-- The lock entries of non-final batches (ledgerq.queue.parallel.BatchAccess):
-- 'r' may read and 'w' may write an address or prefix (lower-case hex, at most
-- 70 characters), 'd' depends on the transaction whose id is the entry.
-- Written with the batch, deleted when it becomes final.
CREATE TABLE batch_locks (
    seq        INTEGER NOT NULL,
    service_id VARCHAR(64) NOT NULL,
    mode       TEXT NOT NULL CHECK (mode IN ('r', 'w', 'd')),
    entry      TEXT NOT NULL,
    PRIMARY KEY (seq, mode, entry)
) WITHOUT ROWID;

-- Earlier entries equal to one, or under it (a range of the BINARY order).
CREATE INDEX batch_locks_entry_idx ON batch_locks (service_id, entry, mode, seq);
-- Entries shorter than an address: the prefixes that may begin an entry.
CREATE INDEX batch_locks_prefix_idx ON batch_locks (service_id, seq, mode, entry)
    WHERE length(entry) < 70 AND mode <> 'd';

-- NULL: no earlier non-final batch of the service conflicts with this one.
ALTER TABLE batches ADD COLUMN blocked_by INTEGER;

-- The parallel round's new picks: per service, its free new batches in order.
CREATE INDEX batches_ready_idx ON batches (service_id, seq)
    WHERE NOT final AND blocked_by IS NULL AND NOT submitted AND status IS NULL;
-- The batches a batch holds, looked up when it becomes final.
CREATE INDEX batches_blocked_by_idx ON batches (blocked_by)
    WHERE blocked_by IS NOT NULL AND NOT final;

-- A batch that became final (or a non-final one deleted) holds nothing: its
-- entries go, and the batches it held look for another blocker: the latest
-- earlier non-final batch of the service they conflict with, by the rule of
-- ledgerq.queue.parallel.conflict (the same expression as the named query
-- block_new_batches).
CREATE TRIGGER batches_release_locks_update AFTER UPDATE OF final ON batches
FOR EACH ROW WHEN NEW.final AND NOT OLD.final
BEGIN
    DELETE FROM batch_locks WHERE seq = OLD.seq;
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
    WHERE blocked_by = OLD.seq AND NOT final;
END;

CREATE TRIGGER batches_release_locks_delete AFTER DELETE ON batches
FOR EACH ROW WHEN NOT OLD.final
BEGIN
    DELETE FROM batch_locks WHERE seq = OLD.seq;
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
    WHERE blocked_by = OLD.seq AND NOT final;
END;

-- Batches tracked before: their access is not known, so each reads and writes
-- everything and is held by the non-final batch before it.
INSERT INTO batch_locks (seq, service_id, mode, entry)
SELECT seq, service_id, 'w', '' FROM batches WHERE NOT final;
UPDATE batches SET blocked_by = (
    SELECT max(p.seq) FROM batches p
    WHERE p.service_id = batches.service_id AND p.seq < batches.seq AND NOT p.final
)
WHERE NOT final;
