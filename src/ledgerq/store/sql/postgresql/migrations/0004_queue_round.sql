-- The queuer's locked and stalled batches: every non-final batch that is not
-- {submitted = false, status = None}. Few rows (about one per busy service),
-- so queue_round finds the services to lock or resubmit without reading the
-- waiting batches.
CREATE INDEX batches_busy_idx ON batches (service_id, seq)
    WHERE NOT final AND (submitted OR status IS NOT NULL);
