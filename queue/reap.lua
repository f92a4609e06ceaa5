-- reap.lua: every worker calls this periodically; it repairs what dead processes left behind.
-- ARGV: prefix, max_attempts, max_request_age_ms, batch
-- 1. Leases past expiry: the job is re-queued at its old deadline while it has attempts left,
--    otherwise its request fails with an error entry the owner reads.
-- 2. Requests whose owner's alive key has expired (the process holding the connection died),
--    or older than max_request_age_ms (a last backstop), are dropped: their slots are freed.
-- 3. Replicas whose liveness expired leave the replica table.
-- Returns {expired, requeued, failed, orphaned}.
local max_attempts, max_age, batch = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local now = now_ms()
local expired, requeued, failed, orphaned = 0, 0, 0, 0

for _, job in ipairs(redis.call('ZRANGEBYSCORE', K_LEASES, '-inf', now, 'LIMIT', 0, batch)) do
  local token = drop_lease(job)
  expired = expired + 1
  redis.call('HINCRBY', K_STATS, 'expired_total', 1)
  local rid, idx = split_job(job)
  local rk = req_key(rid)
  if redis.call('HGET', rk, 'state') == 'active' then
    local attempts = num(redis.call('HGET', rk, 'att:' .. idx), 0)
    if attempts < max_attempts then
      requeue(rid, idx)
      requeued = requeued + 1
      redis.call('HINCRBY', K_STATS, 'requeued_total', 1)
    else
      local replica = token and string.match(token, '^(.*)/%d+$') or '?'
      fail_request(rid, 'chunk ' .. idx .. ' of request ' .. rid .. ' was lost ' .. attempts ..
                   ' times: the replica running it (last: ' .. replica .. ') stopped responding ' ..
                   'and its lease expired')
      failed = failed + 1
    end
  end
end

local alive = {}
local entries = redis.call('HGETALL', K_REQUESTS)
for i = 1, #entries, 2 do
  local rid = entries[i]
  local owner, arrival = string.match(entries[i + 1], '^(.*)|(%d+)$')
  if alive[owner] == nil then alive[owner] = redis.call('EXISTS', alive_key(owner)) == 1 end
  if not alive[owner] or (max_age > 0 and now - tonumber(arrival) > max_age) then
    drop_request(rid)
    orphaned = orphaned + 1
    redis.call('HINCRBY', K_STATS, 'orphaned_total', 1)
  end
end

for _, replica in ipairs(redis.call('ZRANGEBYSCORE', K_REPLICAS, '-inf', now)) do
  redis.call('ZREM', K_REPLICAS, replica)
  redis.call('DEL', replica_key(replica))
end
return {expired, requeued, failed, orphaned}
