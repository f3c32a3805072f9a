-- A batch id (the batch header's signature) names one batch, tracked in one
-- service: a second service cannot track it too, and a client's re-POST of a
-- batch it already sent is found by its id alone (the unique index serves
-- both).
ALTER TABLE batches ADD CONSTRAINT batches_batch_id_key UNIQUE (batch_id);
