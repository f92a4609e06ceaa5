-- cancel.lua: the client went away. Remove the request's queued jobs and free its slot; results
-- of its jobs still in flight are dropped when they complete. Idempotent.
-- ARGV: prefix, request_id. Returns 1 if the request was cancelled, 0 if it was already gone.
local dropped = drop_request(ARGV[2])
if dropped == 1 then redis.call('HINCRBY', K_STATS, 'cancelled_total', 1) end
return dropped
