-- fetch.lua: the owner reads chunk idx of its request, in order. Idempotent (a retried call
-- returns the same): chunk idx-1's result, which the owner has by now, is deleted here.
-- ARGV: prefix, request_id, idx, owner_id, owner_ttl_ms
-- Returns {"ok", pcm, durations} | {"local", durations} (the owner's own replica ran it and kept
-- the PCM in the owner's memory) | {"error", message} | {"pending"} | {"gone"} (released by the
-- reaper or lost with a Redis restart).
local rid, idx = ARGV[2], tonumber(ARGV[3])
if redis.call('EXISTS', req_key(rid)) == 0 then return {'gone'} end
redis.call('SET', alive_key(ARGV[4]), '1', 'PX', tonumber(ARGV[5]))
local res = result_key(rid)
if idx > 0 then redis.call('HDEL', res, 'pcm:' .. (idx - 1), 'dur:' .. (idx - 1), 'loc:' .. (idx - 1)) end
local got = redis.call('HMGET', res, 'pcm:' .. idx, 'dur:' .. idx, 'error', 'loc:' .. idx)
if got[1] then return {'ok', got[1], got[2]} end
if got[4] then return {'local', got[2]} end
if got[3] then return {'error', got[3]} end
return {'pending'}
