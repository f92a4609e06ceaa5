-- lease.lua: a free replica takes the earliest-deadline job and holds a lease on it.
-- ARGV: prefix, replica_id, lease_ms, replica_ttl_ms
-- Returns {} when the queue is empty, else
--   {job_id, request_id, index, attempt, token, payload, owner, deadline_ms, est_ms, now_ms}
local replica, lease_ms, replica_ttl = ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
local now = now_ms()
redis.call('ZADD', K_REPLICAS, now + replica_ttl, replica)

while true do
  local popped = redis.call('ZPOPMIN', K_QUEUE)
  if #popped == 0 then
    redis.call('HSET', replica_key(replica), 'busy', 0, 'seen', now)
    return {}
  end
  local job, deadline = popped[1], tonumber(popped[2])
  local rid, idx = split_job(job)
  local rk = req_key(rid)
  local est = num(redis.call('HGET', rk, 'est:' .. idx), 0)
  redis.call('HINCRBY', K_STATS, 'queued_jobs', -1)
  redis.call('HINCRBY', K_STATS, 'queued_work_ms', -est)
  -- Cancel, release and fail unqueue their jobs, so a job in the queue belongs to an active
  -- request; the check only guards against a protocol bug leaving a stray entry.
  if redis.call('HGET', rk, 'state') == 'active' then
    local attempt = redis.call('HINCRBY', rk, 'att:' .. idx, 1)
    local token = replica .. '/' .. attempt
    redis.call('ZADD', K_LEASES, now + lease_ms, job)
    redis.call('HSET', K_HOLDERS, job, token .. '|' .. est)
    redis.call('HINCRBY', K_STATS, 'inflight_jobs', 1)
    redis.call('HINCRBY', K_STATS, 'inflight_work_ms', est)
    redis.call('HINCRBY', K_STATS, 'leased_total', 1)
    redis.call('HSET', replica_key(replica), 'busy', 1, 'job', job, 'seen', now)
    return {job, rid, idx, attempt, token, redis.call('HGET', payload_key(rid), idx),
            redis.call('HGET', rk, 'owner'), deadline, est, now}
  end
  redis.call('HINCRBY', K_STATS, 'stray_total', 1)
end
