-- reserve.lua: hold one admission slot for a request before its text is planned, or refuse it.
-- The owner calls it first, so a request the fleet cannot take is refused after one cheap round
-- trip, before its text is parsed into phonemes; the planned chunks follow with admit.lua (same
-- request id), or withdraw.lua gives the slot back (the text was invalid).
-- ARGV: prefix, request_id, owner_id, owner_ttl_ms, max_requests (<= 0: unbounded), key (the API
-- key's name, '' for none), key_max (the most requests one key may hold, <= 0: unbounded). Returns
--   reserved: {1, arrival_ms, live_replicas}
--   refused:  {0, "requests"|"key", admitted, queued_work_ms, inflight_work_ms, 0, live_replicas, rate}
--             (admit.lua's refusal, with no new work; "key": admitted is that key's requests)
local rid, owner = ARGV[2], ARGV[3]
local owner_ttl, max_requests = tonumber(ARGV[4]), tonumber(ARGV[5])
local key, key_max = ARGV[6] or '', tonumber(ARGV[7] or '0') or 0
local now = now_ms()
local rk = req_key(rid)

-- A retried call (the reply was lost on the wire) finds its own reservation: answer the same.
if redis.call('HGET', K_REQUESTS, rid) then
  return {1, num(redis.call('HGET', rk, 'arrival'), now), live_replicas(now)}
end

local admitted = num(redis.call('HGET', K_STATS, 'admitted'), 0)
local key_is_full, key_holds = key_full(key, key_max)
local reason = nil
if max_requests > 0 and admitted >= max_requests then
  reason = 'requests'
elseif key_is_full then
  reason, admitted = 'key', key_holds
  redis.call('HINCRBY', K_STATS, 'key_refused_total', 1)
end
if reason then
  redis.call('HINCRBY', K_STATS, 'refused_total', 1)
  return {0, reason, admitted, num(redis.call('HGET', K_STATS, 'queued_work_ms'), 0),
          num(redis.call('HGET', K_STATS, 'inflight_work_ms'), 0), 0, live_replicas(now),
          redis.call('HGET', K_STATS, 'rate') or ''}
end

-- The slot counts as admitted from now on (the bound and the reaper see it); the request has no
-- jobs until admit.lua enqueues them.
redis.call('HSET', K_REQUESTS, rid, owner .. '|' .. now)
redis.call('SET', alive_key(owner), '1', 'PX', owner_ttl)
redis.call('HSET', rk, 'owner', owner, 'arrival', now, 'n', 0, 'state', 'reserved')
hold_for_key(rk, key)
redis.call('HINCRBY', K_STATS, 'admitted', 1)
redis.call('HINCRBY', K_STATS, 'admitted_total', 1)
return {1, now, live_replicas(now)}
