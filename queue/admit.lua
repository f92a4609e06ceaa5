-- admit.lua: admit one request and enqueue its chunk jobs, or refuse it, atomically.
-- ARGV: prefix, request_id, owner_id, owner_ttl_ms, max_requests, max_queued_work_ms,
--       default_ms_per_phoneme, n, key (the API key's name, '' for none), key_max (the
--       most requests one key may hold), key_max_work_ms (that key's share of the work bound),
--       then n triples (phonemes_i, speed_i, payload_i) (speed_i: the one its payload gives the replica).
-- A request id that reserve.lua holds already has its slot: only the work bound is checked, and a
-- refusal gives the reservation back (withdrawn_total), and so does its key's share of the work
-- bound. Any other id is checked against all of them.
-- A bound <= 0 means unbounded.
-- Optionally, after the triples: replica_id, lease_ms, replica_ttl_ms, own_owner, own_slack_ms,
-- batch_max, batch_window_ms, batch_size_ratio (lease.lua's arguments): the caller's own replica is
-- idle, so once the jobs are queued the same call leases for it exactly as lease.lua would (the
-- earliest deadline, its own owner's within the slack, a batch): when that is this request's first
-- chunk, the job never waits for a wake-up or crosses processes. Returns
--   admitted: {1, arrival_ms, total_est_ms, live_replicas, leased} (leased: lease.lua's reply, {}
--             without a replica)
--   refused:  {0, reason ("requests"|"key"|"key_work"|"work"), admitted, queued_work_ms,
--              inflight_work_ms, new_work_ms, live_replicas, rate ("" until measured: audio s per
--              busy s per replica), over_ms (the work that must drain before this request fits;
--              0 unless "work" or "key_work": then the key's own work, at its share of the fleet)}
--             ("key": admitted is that key's requests)
local rid, owner = ARGV[2], ARGV[3]
local owner_ttl = tonumber(ARGV[4])
local max_requests, max_work = tonumber(ARGV[5]), tonumber(ARGV[6])
local n = tonumber(ARGV[8])
local key, key_max = ARGV[9], tonumber(ARGV[10]) or 0
local key_max_work = tonumber(ARGV[11]) or 0
local JOBS = 12  -- ARGV index of the first triple
local now = now_ms()
local rk = req_key(rid)

-- A retried call (the reply was lost on the wire) finds its own request: answer the same.
local existing = redis.call('HGET', K_REQUESTS, rid)
local reserved = existing and redis.call('HGET', rk, 'state') == 'reserved'
if existing and not reserved then
  return {1, num(redis.call('HGET', rk, 'arrival'), 0), num(redis.call('HGET', rk, 'total_est'), 0),
          live_replicas(now), {}}
end

-- Until a completion has measured it, the audio per phoneme is the caller's prior.
local mpp = num(redis.call('HGET', K_STATS, 'ms_per_phoneme'), tonumber(ARGV[7]))
local est = {}
local new_work = 0
for i = 0, n - 1 do
  local phonemes, speed = tonumber(ARGV[JOBS + 3 * i]), tonumber(ARGV[JOBS + 3 * i + 1])
  est[i] = math.floor(phonemes * mpp / speed + 0.5)
  new_work = new_work + est[i]
end

-- The work bound as a schedule check: walking the queued jobs and this request's in deadline order,
-- the work due by each deadline may exceed what the live replicas make before that deadline (at
-- UTILIZATION of their measured rate) by at most max_work. Work due now must fit in max_work itself,
-- as every first chunk must; a long text's later chunks, due only as its listener reaches them,
-- count against what the replicas make until then, so one long request no longer shuts out every
-- short one. Until a completion has measured the rate nothing is credited, and the check is the
-- plain one: all queued work plus this request's within max_work. Returns how far the worst
-- deadline is over the bound (<= 0: the request fits).
-- With `of_key` (an API key's name) the same check runs on that key's jobs alone, against its share
-- of the bound and of what the replicas make (`share`): one product's long texts then fill at most
-- its share of the queue, and another key's requests still find room. A key with nothing queued
-- (among the jobs looked at) fits, as an empty queue admits any one request.
local UTILIZATION = 0.8  -- of the measured rate: headroom for estimates and uneven chunks
local WORK_SCAN = 512    -- queued jobs looked at one by one; the rest count as due with the last
local function work_over(now, queued_work, new_est, n, max_work, of_key, share)
  local rate = tonumber(redis.call('HGET', K_STATS, 'rate') or '') or 0
  local made_per_ms = UTILIZATION * rate * live_replicas(now) * (share or 1)  -- audio ms made per ms
  local head = redis.call('ZRANGE', K_QUEUE, 0, WORK_SCAN - 1, 'WITHSCORES')
  local key_of = {}  -- request id -> its API key's name ('' for none), read once per request
  local function counted(rid)
    if not of_key then return true end
    if key_of[rid] == nil then key_of[rid] = redis.call('HGET', req_key(rid), 'key') or '' end
    return key_of[rid] == of_key
  end
  local due, scanned, worst, queued_here = 0, 0, -math.huge, 0
  local i, j, new_deadline = 1, 0, now
  while i <= #head or j < n do
    local deadline, est
    if j < n and (i > #head or new_deadline <= tonumber(head[i + 1])) then
      deadline, est = new_deadline, new_est[j]
      new_deadline, j = new_deadline + est, j + 1
    else
      local rid, idx = split_job(head[i])
      deadline = tonumber(head[i + 1])
      est = num(redis.call('HGET', req_key(rid), 'est:' .. idx), 0)
      scanned, i = scanned + est, i + 2
      -- The jobs beyond the scan: all of them count for the fleet; a key's are not told apart.
      if i > #head and not of_key then est = est + math.max(0, queued_work - scanned) end
      if not counted(rid) then est = 0 end
      queued_here = queued_here + est
    end
    due = due + est
    worst = math.max(worst, due - max_work - made_per_ms * math.max(0, deadline - now))
  end
  if of_key and queued_here == 0 then return -math.huge end
  return worst
end

local admitted = num(redis.call('HGET', K_STATS, 'admitted'), 0)
local queued_work = num(redis.call('HGET', K_STATS, 'queued_work_ms'), 0)
local reason = nil
local over_ms = 0
local key_is_full, key_holds = false, 0
if not reserved then key_is_full, key_holds = key_full(key, key_max) end
if not reserved and max_requests > 0 and admitted >= max_requests then
  reason = 'requests'
elseif key_is_full then
  reason = 'key'
  redis.call('HINCRBY', K_STATS, 'key_refused_total', 1)
elseif key ~= '' and key_max_work > 0 and max_work > 0 and queued_work > 0 then
  -- The key's share of the work bound first: a key over it hears so (429), not that the fleet is full.
  over_ms = work_over(now, queued_work, est, n, key_max_work, key, key_max_work / max_work)
  if over_ms > 0 then
    reason = 'key_work'
    redis.call('HINCRBY', K_STATS, 'key_refused_total', 1)
  end
end
if not reason and max_work > 0 and queued_work > 0 then
  -- An empty queue admits any single request, however long: otherwise it could never run.
  over_ms = work_over(now, queued_work, est, n, max_work)
  if over_ms > 0 then reason = 'work' end
end
if reason then
  redis.call('HINCRBY', K_STATS, 'refused_total', 1)
  if reserved then
    drop_request(rid)
    redis.call('HINCRBY', K_STATS, 'withdrawn_total', 1)
    admitted = admitted - 1
  end
  if reason == 'key' then admitted = key_holds end
  return {0, reason, admitted, queued_work, num(redis.call('HGET', K_STATS, 'inflight_work_ms'), 0),
          new_work, live_replicas(now), redis.call('HGET', K_STATS, 'rate') or '', math.ceil(over_ms)}
end

-- Register the request and its owner, who must keep alive:<owner> fresh or the reaper frees it.
-- A reserved request keeps the arrival of its reservation: the time spent planning its text is
-- part of the wait its listener sees, so its deadlines count from then.
if reserved then
  now = num(redis.call('HGET', rk, 'arrival'), now)
else
  redis.call('HSET', K_REQUESTS, rid, owner .. '|' .. now)
  redis.call('HINCRBY', K_STATS, 'admitted', 1)
  redis.call('HINCRBY', K_STATS, 'admitted_total', 1)
  hold_for_key(rk, key)
end
redis.call('SET', alive_key(owner), '1', 'PX', owner_ttl)
redis.call('HSET', rk, 'owner', owner, 'arrival', now, 'n', n, 'state', 'active', 'total_est', new_work)

-- Chunk i's deadline: arrival plus the (estimated) audio of chunks 0..i-1, i.e. when a listener
-- who started at arrival needs it. Earliest deadline first puts every first chunk up front.
local deadline = now
for i = 0, n - 1 do
  local job = job_id(rid, i)
  redis.call('HSET', rk, 'est:' .. i, est[i], 'dl:' .. i, deadline, 'ph:' .. i, ARGV[JOBS + 3 * i],
             'sp:' .. i, ARGV[JOBS + 3 * i + 1])
  redis.call('HSET', payload_key(rid), i, ARGV[JOBS + 3 * i + 2])
  redis.call('ZADD', K_QUEUE, deadline, job)
  redis.call('RPUSH', K_READY, '1')
  deadline = deadline + est[i]
end
redis.call('HINCRBY', K_STATS, 'queued_jobs', n)
redis.call('HINCRBY', K_STATS, 'queued_work_ms', new_work)

local leased = {}
local at = JOBS + 3 * n  -- the optional lease arguments
if ARGV[at] and ARGV[at] ~= '' then
  leased = lease_for(ARGV[at], tonumber(ARGV[at + 1]), tonumber(ARGV[at + 2]), ARGV[at + 3] or '',
                     tonumber(ARGV[at + 4] or '0') or 0, tonumber(ARGV[at + 5] or '1') or 1,
                     tonumber(ARGV[at + 6] or '0') or 0, tonumber(ARGV[at + 7] or '1') or 1)
end
-- Wake-up tokens only need to cover the queued jobs; stale ones (a busy replica took the job
-- directly, or the lease above did) would only cause empty leases, so none are kept beyond them.
local queued_jobs = num(redis.call('HGET', K_STATS, 'queued_jobs'), 0)
if queued_jobs > 0 then
  redis.call('LTRIM', K_READY, -queued_jobs, -1)
else
  redis.call('DEL', K_READY)
end
return {1, now, new_work, live_replicas(now), leased}
