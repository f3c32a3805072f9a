-- ledgerq_blocker in PL/pgSQL with one generic plan per session (the same
-- query as before). As a LANGUAGE sql function it was planned again in every
-- statement that called it, for each batch becoming final (the release
-- trigger's UPDATE runs once per row), most of the time of a group commit
-- on PostgreSQL (docs/store.md).
CREATE OR REPLACE FUNCTION ledgerq_blocker(p_service VARCHAR, p_seq BIGINT) RETURNS BIGINT
    LANGUAGE plpgsql STABLE
    SET plan_cache_mode = force_generic_plan
    AS $$
BEGIN
    RETURN (
    SELECT max(hit) FROM (
        -- The same entry, written before (each a backward index probe).
        SELECT (SELECT max(l.seq) FROM batch_locks l
                WHERE l.service_id = p_service AND l.entry = n.entry AND l.mode = 'w'
                  AND l.seq < p_seq) AS hit
        FROM batch_locks n WHERE n.seq = p_seq AND n.mode IN ('r', 'w')
        UNION ALL
        -- The same entry, read before, when this batch writes it.
        SELECT (SELECT max(l.seq) FROM batch_locks l
                WHERE l.service_id = p_service AND l.entry = n.entry AND l.mode = 'r'
                  AND l.seq < p_seq)
        FROM batch_locks n WHERE n.seq = p_seq AND n.mode = 'w'
        UNION ALL
        -- Longer entries that begin with one of ours: entries are hex, so they
        -- sort between it and it followed by 'g'.
        SELECT (SELECT max(l.seq) FROM batch_locks l
                WHERE l.service_id = p_service AND l.entry > n.entry AND l.entry < n.entry || 'g'
                  AND (l.mode = 'w' OR (l.mode = 'r' AND n.mode = 'w')) AND l.seq < p_seq)
        FROM batch_locks n WHERE n.seq = p_seq AND n.mode IN ('r', 'w')
        UNION ALL
        -- Shorter entries that begin one of ours (prefixes: batch_locks_prefix_idx).
        SELECT (SELECT max(l.seq) FROM batch_locks l
                WHERE l.service_id = p_service AND length(l.entry) < 70 AND l.mode <> 'd'
                  AND l.seq < p_seq AND length(l.entry) < length(n.entry)
                  AND starts_with(n.entry, l.entry)
                  AND (l.mode = 'w' OR n.mode = 'w'))
        FROM batch_locks n WHERE n.seq = p_seq AND n.mode IN ('r', 'w')
        UNION ALL
        -- Transactions it depends on, in earlier non-final batches of the service.
        SELECT (SELECT max(b.seq) FROM transactions t
                JOIN batches b ON b.service_id = t.service_id AND b.batch_id = t.batch_id
                WHERE t.service_id = p_service AND t.transaction_id = n.entry
                  AND b.seq < p_seq AND NOT b.final)
        FROM batch_locks n WHERE n.seq = p_seq AND n.mode = 'd'
    ) AS candidates
    );
END
$$;
