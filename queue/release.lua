-- release.lua: the owner has streamed the last chunk (or read the error): free the slot and
-- delete what is left of the request. Idempotent.
-- ARGV: prefix, request_id. Returns 1 if released, 0 if it was already gone.
local dropped = drop_request(ARGV[2])
if dropped == 1 then redis.call('HINCRBY', K_STATS, 'released_total', 1) end
return dropped
