-- lease.lua: a free replica takes the earliest-deadline job and holds a lease on it.
-- ARGV: prefix, replica_id, lease_ms, replica_ttl_ms, [own_owner, own_slack_ms]
-- With own_owner (the worker id of the process this replica lives in) and own_slack_ms > 0, a job
-- of that worker's own requests is taken instead of the earliest one when its deadline is at most
-- own_slack_ms later: its result then needs no trip through Redis ("keep the bytes cheap").
-- Returns {} when the queue is empty, else
--   {job_id, request_id, index, attempt, token, payload, owner, deadline_ms, est_ms, now_ms}
local replica, lease_ms, replica_ttl = ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
local own_owner, own_slack = ARGV[5] or '', tonumber(ARGV[6] or '0') or 0
local OWN_SCAN = 16  -- how many of the earliest jobs are looked at for one of our own
local now = now_ms()
redis.call('ZADD', K_REPLICAS, now + replica_ttl, replica)

-- The earliest job, or the earliest of own_owner's requests within own_slack of it.
local function take()
  local head = redis.call('ZRANGE', K_QUEUE, 0, own_slack > 0 and own_owner ~= '' and OWN_SCAN - 1 or 0,
                          'WITHSCORES')
  if #head == 0 then return nil end
  local pick = 1
  local limit = tonumber(head[2]) + own_slack
  for i = 1, #head, 2 do
    if own_slack <= 0 or own_owner == '' or tonumber(head[i + 1]) > limit then break end
    local rid = split_job(head[i])
    local entry = redis.call('HGET', K_REQUESTS, rid)
    if entry and string.sub(entry, 1, #own_owner + 1) == own_owner .. '|' then
      pick = i
      break
    end
  end
  redis.call('ZREM', K_QUEUE, head[pick])
  return head[pick], tonumber(head[pick + 1])
end

while true do
  local job, deadline = take()
  if not job then
    redis.call('HSET', replica_key(replica), 'busy', 0, 'seen', now)
    return {}
  end
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
