-- A batch's data change id is unique in its service only when it has one:
-- a partial unique index instead of the unique constraint. NULLs never
-- clashed, but the constraint's index held an entry for every batch, and
-- every non-HOT update of batches (taken, accepted, final: each changes an
-- indexed column) wrote one more entry there (docs/store.md). The lookups
-- by data change id (data_change_id_owner, batch_state_by_data_change_id,
-- get_batch_by_data_change_id) compare it with =, which implies NOT NULL:
-- they use the partial index.
ALTER TABLE batches DROP CONSTRAINT batches_data_change_id_key;
CREATE UNIQUE INDEX batches_data_change_id_key ON batches (service_id, data_change_id)
    WHERE data_change_id IS NOT NULL;
