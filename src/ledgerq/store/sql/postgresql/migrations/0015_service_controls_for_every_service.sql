-- A service_controls row for every service with batches (docs/operations.md,
-- "Halting, pausing and cancelling"): what takes lock against a pause.

-- Every service with batches has its service_controls row, made with its
-- queue_heads row: a take locks that row (stopped_of, FOR SHARE) and a pause
-- or resume updates it, so a pause waits for the takes under way and every
-- take after it sees it. Without the row a take would lock nothing and could
-- commit after the first pause of its service had returned.
CREATE FUNCTION ledgerq_service_controls_insert() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    INSERT INTO service_controls (service_id, updated_at)
    VALUES (NEW.service_id, ledgerq_now_ms())
    ON CONFLICT (service_id) DO NOTHING;
    RETURN NULL;
END
$$;

CREATE TRIGGER queue_heads_service_controls_insert AFTER INSERT ON queue_heads
    FOR EACH ROW EXECUTE FUNCTION ledgerq_service_controls_insert();

INSERT INTO service_controls (service_id, updated_at)
SELECT service_id, ledgerq_now_ms() FROM queue_heads ORDER BY service_id
ON CONFLICT (service_id) DO NOTHING;
