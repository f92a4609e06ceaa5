-- fetch.lua: the owner reads chunk idx of its request, in order. Idempotent (a retried call
-- returns the same): chunk idx-1's result, which the owner has by now, is deleted here.
-- ARGV: prefix, request_id, idx, owner_id, owner_ttl_ms, [release]
-- Returns {"ok", pcm, durations} | {"local", durations} (the owner's own replica ran it and kept
-- the PCM in the owner's memory) | {"error", message} | {"pending"} | {"gone"} (released by the
-- reaper or lost with a Redis restart).
-- With release = "1" and idx the request's last chunk, an "ok" or "local" answer also releases the
-- request (release.lua's step: the owner now holds all of its audio), and says so as a last element
-- ("released"). A retried call (its reply lost on the wire) then answers "gone", and the owner
-- makes that chunk on its own replica, as after a Redis restart.
local rid, idx = ARGV[2], tonumber(ARGV[3])
local rk = req_key(rid)
if redis.call('EXISTS', rk) == 0 then return {'gone'} end
redis.call('SET', alive_key(ARGV[4]), '1', 'PX', tonumber(ARGV[5]))
local res = result_key(rid)
if idx > 0 then redis.call('HDEL', res, 'pcm:' .. (idx - 1), 'dur:' .. (idx - 1), 'loc:' .. (idx - 1)) end
local got = redis.call('HMGET', res, 'pcm:' .. idx, 'dur:' .. idx, 'error', 'loc:' .. idx)
local reply
if got[1] then reply = {'ok', got[1], got[2]}
elseif got[4] then reply = {'local', got[2]}
elseif got[3] then return {'error', got[3]}
else return {'pending'} end
if ARGV[6] == '1' and idx == num(redis.call('HGET', rk, 'n'), 0) - 1 then
  drop_request(rid)
  redis.call('HINCRBY', K_STATS, 'released_total', 1)
  reply[#reply + 1] = 'released'
end
return reply
