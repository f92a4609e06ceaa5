-- lib.lua: the prelude every script starts with. The Python loader (api/speech/redis_link.py)
-- prepends this file to each script body before SCRIPT LOAD, so key names and the few shared
-- steps (unqueue, fail, drop) exist once. ARGV[1] is always the key prefix (default "{kf}": the
-- braces are a cluster hash tag, so every key of one fleet lives in one slot).
-- All times are Redis server time in milliseconds (redis.call('TIME')), never a client's clock.

local P = ARGV[1]
local K_STATS = P .. ':stats'        -- hash: gauges and counters (see PROTOCOL.md)
local K_QUEUE = P .. ':queue'        -- zset: job id -> deadline (ms)
local K_LEASES = P .. ':leases'      -- zset: job id -> lease expiry (ms)
local K_HOLDERS = P .. ':holders'    -- hash: job id -> "token|est_ms" of its current lease
local K_REQUESTS = P .. ':requests'  -- hash: request id -> "owner|arrival_ms" (one field per admitted request)
local K_READY = P .. ':ready'        -- list: wake-up tokens for idle replicas
local K_REPLICAS = P .. ':replicas'  -- zset: replica id -> liveness expiry (ms)
local K_KEYS = P .. ':keys'          -- hash: API key name -> its admitted requests (KOKORO_KEY_MAX_SHARE)

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local function req_key(rid) return P .. ':req:' .. rid end        -- hash: request meta
local function payload_key(rid) return P .. ':job:' .. rid end    -- hash: chunk index -> job payload
local function result_key(rid) return P .. ':res:' .. rid end     -- hash: pcm:<i>, dur:<i>, error
local function wake_key(rid) return P .. ':wake:' .. rid end      -- list: wake-ups for the owner
local function alive_key(wid) return P .. ':alive:' .. wid end    -- string with TTL: owner is alive
local function replica_key(id) return P .. ':replica:' .. id end  -- hash: per-replica figures
local function job_id(rid, idx) return rid .. '#' .. idx end
local function split_job(job)
  local rid, idx = string.match(job, '^(.*)#(%d+)$')
  return rid, tonumber(idx)
end
local function num(v, default)
  if v == false or v == nil then return default end
  return tonumber(v)
end
-- "token|est_ms" -> token, est_ms
local function split_holder(v)
  local token, est = string.match(v, '^(.*)|(%-?%d+)$')
  return token, tonumber(est)
end

-- Take every still-queued job of a request out of the queue, keeping the gauges in step.
local function unqueue_request(rid)
  local rk = req_key(rid)
  local n = num(redis.call('HGET', rk, 'n'), 0)
  local removed, work = 0, 0
  for i = 0, n - 1 do
    if redis.call('ZREM', K_QUEUE, job_id(rid, i)) == 1 then
      removed = removed + 1
      work = work + num(redis.call('HGET', rk, 'est:' .. i), 0)
    end
  end
  if removed > 0 then
    redis.call('HINCRBY', K_STATS, 'queued_jobs', -removed)
    redis.call('HINCRBY', K_STATS, 'queued_work_ms', -work)
  end
  return removed
end

-- End a request with an error its owner will read; its slot stays held until the owner releases
-- it (or the reaper does, if the owner died). Jobs still in flight finish and are dropped.
local function fail_request(rid, message)
  local rk = req_key(rid)
  if redis.call('HGET', rk, 'state') ~= 'active' then return 0 end
  redis.call('HSET', rk, 'state', 'failed')
  unqueue_request(rid)
  redis.call('HSET', result_key(rid), 'error', message)
  redis.call('RPUSH', wake_key(rid), 'e')
  redis.call('HINCRBY', K_STATS, 'failed_total', 1)
  return 1
end

-- Forget a request entirely and free its admission slot. Idempotent: 0 if it was already gone.
-- Leases of its in-flight jobs stay (the inflight gauge belongs to them); their results are
-- dropped on completion because the request no longer exists.
local function drop_request(rid)
  if redis.call('HDEL', K_REQUESTS, rid) == 0 then return 0 end
  unqueue_request(rid)
  local key = redis.call('HGET', req_key(rid), 'key')
  if key and redis.call('HINCRBY', K_KEYS, key, -1) <= 0 then
    redis.call('HDEL', K_KEYS, key)
  end
  redis.call('DEL', req_key(rid), payload_key(rid), result_key(rid), wake_key(rid))
  redis.call('HINCRBY', K_STATS, 'admitted', -1)
  return 1
end

-- Remove a lease, keeping the in-flight gauges in step; returns its token and estimate, or nil.
local function drop_lease(job)
  local holder = redis.call('HGET', K_HOLDERS, job)
  if not holder then return nil end
  redis.call('HDEL', K_HOLDERS, job)
  redis.call('ZREM', K_LEASES, job)
  local token, est = split_holder(holder)
  redis.call('HINCRBY', K_STATS, 'inflight_jobs', -1)
  redis.call('HINCRBY', K_STATS, 'inflight_work_ms', -est)
  return token, est
end

-- Put a job back in the shared queue at its original deadline and wake one idle replica.
local function requeue(rid, idx)
  local rk = req_key(rid)
  local est = num(redis.call('HGET', rk, 'est:' .. idx), 0)
  redis.call('ZADD', K_QUEUE, num(redis.call('HGET', rk, 'dl:' .. idx), 0), job_id(rid, idx))
  redis.call('HINCRBY', K_STATS, 'queued_jobs', 1)
  redis.call('HINCRBY', K_STATS, 'queued_work_ms', est)
  redis.call('RPUSH', K_READY, '1')
end

-- Whether `key` (an API key's name; '' for none) already holds `key_max` admitted requests (<= 0:
-- no per-key bound), and how many it holds.
local function key_full(key, key_max)
  if key == nil or key == '' or key_max == nil or key_max <= 0 then return false, 0 end
  local holds = num(redis.call('HGET', K_KEYS, key), 0)
  return holds >= key_max, holds
end

-- Count an admitted request against its key (drop_request gives it back).
local function hold_for_key(rk, key)
  if key == nil or key == '' then return end
  redis.call('HSET', rk, 'key', key)
  redis.call('HINCRBY', K_KEYS, key, 1)
end

local function live_replicas(now)
  return redis.call('ZCOUNT', K_REPLICAS, '(' .. now, '+inf')
end

-- Lease for `replica` (lease.lua's steps; admit.lua runs them too, for a replica the caller says
-- is idle): the earliest-deadline job, or its own owner's within own_slack of it, plus the batch
-- members that fit; {} when the queue is empty. See lease.lua for the rules and the reply.
local function lease_for(replica, lease_ms, replica_ttl, own_owner, own_slack, batch_max, batch_window, size_ratio)
  batch_max = math.max(1, batch_max)
  size_ratio = math.max(1, size_ratio)
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
  -- 'since': when this lease began, so `status` can count a running job's time before it completes
  redis.call('HSET', replica_key(replica), 'busy', 1, 'job', leased[1][1], 'batch', #leased, 'seen', now, 'since', now)
  return leased
end
