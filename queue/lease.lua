-- lease.lua: a free replica takes the earliest-deadline job, plus up to batch_max - 1 queued jobs
-- that fit the same forward pass, and holds one lease per job.
-- ARGV: prefix, replica_id, lease_ms, replica_ttl_ms, [own_owner, own_slack_ms,
--       batch_max, batch_window_ms, batch_size_ratio]
-- The first job: the earliest one; but with own_owner (the worker id of the process this replica
-- lives in) and own_slack_ms > 0, a job of that worker's own requests is taken instead when its
-- deadline is at most own_slack_ms later: its result then needs no trip through Redis ("keep the
-- bytes cheap").
-- The batch (batch_max > 1): the following queued jobs, in deadline order among the earliest
-- BATCH_SCAN, join while the batch has room if
--   * they are due: deadline <= max(first job's deadline, now) + batch_window_ms (every overdue job
--     is due; a later chunk of a stream that is not needed yet never lengthens a pass), and
--   * their size fits: with the joining job's estimate (audio ms, which sets the frames a pass
--     runs over), the batch's largest estimate is at most batch_size_ratio times its smallest, so
--     a 10-phoneme chunk never waits behind a 510-phoneme one.
-- Only what is queued now is taken: a batch never waits to fill.
-- Returns {} when the queue is empty, else one entry per leased job, the first job first:
--   {{job_id, request_id, index, attempt, token, payload, owner, deadline_ms, est_ms, now_ms}, ...}
return lease_for(ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4]), ARGV[5] or '', tonumber(ARGV[6] or '0') or 0,
                 tonumber(ARGV[7] or '1') or 1, tonumber(ARGV[8] or '0') or 0, tonumber(ARGV[9] or '1') or 1)
