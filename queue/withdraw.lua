-- withdraw.lua: give back a reservation whose request never reached the queue (its text was
-- refused with a 400, or its owner could not plan it). Idempotent; a request that admit.lua has
-- already enqueued is left alone (the owner cancels or releases those).
-- ARGV: prefix, request_id. Returns 1 if withdrawn, 0 if there was no such reservation.
local rid = ARGV[2]
if redis.call('HGET', req_key(rid), 'state') ~= 'reserved' then return 0 end
local dropped = drop_request(rid)
if dropped == 1 then redis.call('HINCRBY', K_STATS, 'withdrawn_total', 1) end
return dropped
