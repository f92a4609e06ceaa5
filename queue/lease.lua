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
local replica, lease_ms, replica_ttl = ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
local own_owner, own_slack = ARGV[5] or '', tonumber(ARGV[6] or '0') or 0
local batch_max = math.max(1, tonumber(ARGV[7] or '1') or 1)
local batch_window = tonumber(ARGV[8] or '0') or 0
local size_ratio = math.max(1, tonumber(ARGV[9] or '1') or 1)
local OWN_SCAN = 16  -- how many of the earliest jobs are looked at for one of our own
local BATCH_SCAN = math.min(256, math.max(OWN_SCAN, 4 * batch_max))  -- and for batch members
local now = now_ms()
redis.call('ZADD', K_REPLICAS, now + replica_ttl, replica)
local own = own_slack > 0 and own_owner ~= ''

local function est_of(job)
  local rid, idx = split_job(job)
  return num(redis.call('HGET', req_key(rid), 'est:' .. idx), 0)
end

-- The earliest job, or the earliest of own_owner's requests within own_slack of it; returns
-- its position in `head`.
local function first_pick(head)
  local limit = tonumber(head[2]) + own_slack
  for i = 1, math.min(#head, 2 * OWN_SCAN), 2 do
    if not own or tonumber(head[i + 1]) > limit then break end
    local rid = split_job(head[i])
    local entry = redis.call('HGET', K_REQUESTS, rid)
    if entry and string.sub(entry, 1, #own_owner + 1) == own_owner .. '|' then return i end
  end
  return 1
end

-- Take `job` out of the queue and lease it; nil for a stray entry (request not active).
local function lease_job(job, deadline, est)
  redis.call('ZREM', K_QUEUE, job)
  local rid, idx = split_job(job)
  local rk = req_key(rid)
  redis.call('HINCRBY', K_STATS, 'queued_jobs', -1)
  redis.call('HINCRBY', K_STATS, 'queued_work_ms', -est)
  -- Cancel, release and fail unqueue their jobs, so a job in the queue belongs to an active
  -- request; the check only guards against a protocol bug leaving a stray entry.
  if redis.call('HGET', rk, 'state') ~= 'active' then
    redis.call('HINCRBY', K_STATS, 'stray_total', 1)
    return nil
  end
  local attempt = redis.call('HINCRBY', rk, 'att:' .. idx, 1)
  local token = replica .. '/' .. attempt
  redis.call('ZADD', K_LEASES, now + lease_ms, job)
  redis.call('HSET', K_HOLDERS, job, token .. '|' .. est)
  redis.call('HINCRBY', K_STATS, 'inflight_jobs', 1)
  redis.call('HINCRBY', K_STATS, 'inflight_work_ms', est)
  redis.call('HINCRBY', K_STATS, 'leased_total', 1)
  return {job, rid, idx, attempt, token, redis.call('HGET', payload_key(rid), idx),
          redis.call('HGET', rk, 'owner'), deadline, est, now}
end

local leased = {}
while #leased == 0 do
  local scan = (batch_max > 1 and BATCH_SCAN) or (own and OWN_SCAN) or 1
  local head = redis.call('ZRANGE', K_QUEUE, 0, scan - 1, 'WITHSCORES')
  if #head == 0 then
    redis.call('HSET', replica_key(replica), 'busy', 0, 'seen', now)
    return {}
  end
  local pick = first_pick(head)
  local first_deadline = tonumber(head[pick + 1])
  local smallest = est_of(head[pick])
  local largest = smallest
  local first = lease_job(head[pick], first_deadline, smallest)
  if first then
    leased[1] = first
    local horizon = math.max(first_deadline, now) + batch_window
    for i = 1, #head, 2 do
      if #leased >= batch_max or tonumber(head[i + 1]) > horizon then break end
      if i ~= pick then
        local est = est_of(head[i])
        local lo, hi = math.min(smallest, est), math.max(largest, est)
        if hi <= size_ratio * math.max(lo, 1) then
          local entry = lease_job(head[i], tonumber(head[i + 1]), est)
          if entry then
            leased[#leased + 1] = entry
            smallest, largest = lo, hi
          end
        end
      end
    end
  end
end
redis.call('HINCRBY', K_STATS, 'lease_batches_total', 1)
redis.call('HSET', replica_key(replica), 'busy', 1, 'job', leased[1][1], 'batch', #leased, 'seen', now)
return leased
