-- A batch id (the batch header's signature) names one batch, tracked in one
-- service: a second service cannot track it too, and a client's re-POST of a
-- batch it already sent is found by its id alone (the unique index serves
-- both).
CREATE UNIQUE INDEX batches_batch_id_key ON batches (batch_id);
