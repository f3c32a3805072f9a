-- The updated_at triggers run their function only for an UPDATE that left
-- updated_at unchanged (a hand-written one, docs/schema.md): the store sets
-- updated_at itself on every write, and a PL/pgSQL call per row written
-- changed nothing there.
DROP TRIGGER transaction_receipts_touch_updated_at ON transaction_receipts;
DROP TRIGGER submissions_touch_updated_at ON submissions;
DROP TRIGGER batch_statuses_touch_updated_at ON batch_statuses;

CREATE TRIGGER transaction_receipts_touch_updated_at BEFORE UPDATE ON transaction_receipts
    FOR EACH ROW WHEN (NEW.updated_at IS NOT DISTINCT FROM OLD.updated_at)
    EXECUTE FUNCTION ledgerq_touch_updated_at();
CREATE TRIGGER submissions_touch_updated_at BEFORE UPDATE ON submissions
    FOR EACH ROW WHEN (NEW.updated_at IS NOT DISTINCT FROM OLD.updated_at)
    EXECUTE FUNCTION ledgerq_touch_updated_at();
CREATE TRIGGER batch_statuses_touch_updated_at BEFORE UPDATE ON batch_statuses
    FOR EACH ROW WHEN (NEW.updated_at IS NOT DISTINCT FROM OLD.updated_at)
    EXECUTE FUNCTION ledgerq_touch_updated_at();
