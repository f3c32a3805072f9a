-- The planner's estimate of queue_round's busy batches (NOT final AND
-- (submitted OR status IS NOT NULL)) multiplies the columns' selectivities as
-- if independent: on a large store it expects hundreds of thousands of rows
-- where there are a few thousand, and plans parallel scans and JIT compilation
-- that cost more than the query. Joint statistics of the three columns fix it.
CREATE STATISTICS batches_queue_state (mcv) ON final, submitted, status FROM batches;
