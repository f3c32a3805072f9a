-- Claims at scale (docs/ha.md): each instance holds a lease on its own row,
-- and every claim it holds lasts as long as that lease (or its own expiry,
-- whichever is later), so a renewal writes one row however many services the
-- instance holds. Epochs come from one sequence, so a claim row deleted once
-- its service has nothing left to do never hands an old fence back out.
ALTER TABLE gateway_instances
    ADD COLUMN expiry_1 BIGINT,
    ADD COLUMN expiry_2 BIGINT;

CREATE SEQUENCE service_id_claims_epoch_seq AS BIGINT;
SELECT setval('service_id_claims_epoch_seq',
              (SELECT coalesce(max(epoch), 0) + 1 FROM service_id_claims), false);

-- Maintenance finds expired claims through their holder's row: a claim whose
-- holder has no row left is made unclaimed now (only instances of an older
-- ledgerq, which renewed claim rows one by one, could leave one).
UPDATE service_id_claims
SET claimant = NULL, expiry_1 = NULL, expiry_2 = NULL, claimed_at = NULL, unclaimed_since = 0
WHERE claimant IS NOT NULL
  AND claimant NOT IN (SELECT instance_id FROM gateway_instances);

-- What an instance holds, with the epochs, read from the index alone; the
-- free services in the order they are taken.
DROP INDEX service_id_claims_claimant_idx;
CREATE INDEX service_id_claims_claimant_idx ON service_id_claims (claimant, service_id)
    INCLUDE (epoch);
CREATE INDEX service_id_claims_free_idx ON service_id_claims (unclaimed_since, service_id)
    WHERE claimant IS NULL;
