-- Lock entries and blockers only while some instance may run the parallel
-- queuer (docs/store.md, "Lock entries only for the parallel queuer").
--
-- Every batch got its lock entries (batch_locks) and its blocker (blocked_by)
-- at ingest, and lost them again when it or its blocker became final: for a
-- store whose services are all serial, work the serial round never reads
-- (ledgerq_blocker per new batch, a non-HOT update of the held batch per
-- batch made final). One row says whether they are kept. A store opened for
-- the parallel queuer turns it on, once, after computing the entries and
-- blockers of every open batch (the repair); it is never turned off by
-- ledgerq. add_batches reads it under a shared advisory lock, the switch
-- takes the same lock exclusively: no batch is added without its entries
-- after the switch committed.
CREATE TABLE lock_entries_kept (
    -- One row only.
    id   BOOLEAN PRIMARY KEY DEFAULT TRUE CHECK (id),
    kept BOOLEAN NOT NULL
);

-- A store migrated from an older version has every open batch's entries
-- and blockers: it keeps them.
INSERT INTO lock_entries_kept (kept) VALUES (TRUE);
