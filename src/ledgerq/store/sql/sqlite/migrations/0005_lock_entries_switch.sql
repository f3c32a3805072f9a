-- Lock entries and blockers only while some instance may run the parallel
-- queuer, as PostgreSQL 12 (docs/store.md, "Lock entries only for the
-- parallel queuer").
--
-- Every batch got its lock entries (batch_locks) and its blocker (blocked_by)
-- at ingest, and lost them again when it or its blocker became final: for a
-- store whose services are all serial, work the serial round never reads
-- (an entry and a row update per new batch, an entry deleted and the held
-- batch's row re-pointed per batch made final). One row says whether they
-- are kept. A store opened for the parallel queuer turns it on, once, after
-- computing the entries and blockers of every open batch; it is never turned
-- off by ledgerq. add_batches reads it in its write transaction, the switch
-- is a write transaction too: SQLite's one writer orders them, so no batch
-- is added without its entries after the switch committed.
CREATE TABLE lock_entries_kept (
    -- One row only.
    id   INTEGER PRIMARY KEY CHECK (id = 1),
    kept BOOLEAN NOT NULL
);

-- A store migrated from an older version has every open batch's entries
-- and blockers: it keeps them.
INSERT INTO lock_entries_kept (id, kept) VALUES (1, 1);
