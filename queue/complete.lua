-- complete.lua: a replica hands back a job's result (or its error) and gives up the lease.
-- ARGV: prefix, replica_id, job_id, token, status ("ok"|"local"|"error"), pcm_bytes|error_message,
--       durations_bytes, audio_ms, busy_ms, ewma_alpha
-- "local": the replica lives in the owner's own process and handed the PCM over in memory; only
-- the durations and a `loc:i` marker are stored, so the audio never crosses Redis.
-- Optional ARGV[11] "release": the owner is this replica's own process and takes a "local" result
-- from memory, without reading it here (a job leased by admit.lua for that owner's idle replica):
-- when it is the request's last chunk, the request is released in the same call, since its owner
-- then holds all of its audio (release.lua's step; the owner makes no call of its own).
-- Returns 1: delivered to the owner; 0: stale (the lease was lost, the job belongs to another
-- attempt now: result discarded); 2: dropped (the request was cancelled, released or failed);
-- 3: delivered, and the request released.
local replica, job, token, status = ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local audio_ms, busy_ms, alpha = tonumber(ARGV[8]), tonumber(ARGV[9]), tonumber(ARGV[10])
local now = now_ms()

local holder = redis.call('HGET', K_HOLDERS, job)
if not holder or split_holder(holder) ~= token then
  redis.call('HINCRBY', K_STATS, 'stale_total', 1)
  redis.call('HSET', replica_key(replica), 'busy', 0, 'seen', now)
  return 0
end
drop_lease(job)

-- Per-replica figures (for `kokoro-fleet status`) and the fleet's service rate: an EWMA of
-- audio seconds produced per busy second of one replica, which the Retry-After estimate uses.
local rkey = replica_key(replica)
redis.call('HSET', rkey, 'busy', 0, 'seen', now)
redis.call('HDEL', rkey, 'job')
local ok = status == 'ok' or status == 'local'
if ok then
  redis.call('HINCRBY', rkey, 'jobs_done', 1)
  redis.call('HINCRBY', rkey, 'busy_ms', busy_ms)
  redis.call('HINCRBY', rkey, 'audio_ms', audio_ms)
  if busy_ms > 0 and audio_ms > 0 then
    local sample = audio_ms / busy_ms
    local rate = tonumber(redis.call('HGET', K_STATS, 'rate') or '')
    rate = rate and (rate + alpha * (sample - rate)) or sample
    redis.call('HSET', K_STATS, 'rate', tostring(rate))
  end
end

local rid, idx = split_job(job)
local rk = req_key(rid)
if redis.call('HGET', rk, 'state') ~= 'active' then
  redis.call('HINCRBY', K_STATS, 'dropped_total', 1)
  return 2
end
if not ok then
  fail_request(rid, ARGV[6])
  return 1
end

if status == 'local' then
  redis.call('HSET', result_key(rid), 'loc:' .. idx, 1, 'dur:' .. idx, ARGV[7])
  redis.call('HINCRBY', K_STATS, 'local_total', 1)
else
  redis.call('HSET', result_key(rid), 'pcm:' .. idx, ARGV[6], 'dur:' .. idx, ARGV[7])
  redis.call('HINCRBY', K_STATS, 'result_bytes_total', #ARGV[6])
end
redis.call('RPUSH', wake_key(rid), tostring(idx))
redis.call('HINCRBY', K_STATS, 'completed_total', 1)

-- Now that chunk idx's audio is measured, later chunks' deadlines move by the estimate's error,
-- and the fleet's audio-per-phoneme estimate learns from it.
local est = num(redis.call('HGET', rk, 'est:' .. idx), 0)
local delta = audio_ms - est
local n = num(redis.call('HGET', rk, 'n'), 0)
if delta ~= 0 then
  for j = idx + 1, n - 1 do
    redis.call('HINCRBY', rk, 'dl:' .. j, delta)
    if redis.call('ZSCORE', K_QUEUE, job_id(rid, j)) then
      redis.call('ZINCRBY', K_QUEUE, delta, job_id(rid, j))
    end
  end
end
local phonemes = num(redis.call('HGET', rk, 'ph:' .. idx), 0)
if phonemes > 0 and audio_ms > 0 then
  local sample = audio_ms * num(redis.call('HGET', rk, 'sp:' .. idx), 1) / phonemes
  local mpp = tonumber(redis.call('HGET', K_STATS, 'ms_per_phoneme') or '')
  mpp = mpp and (mpp + alpha * (sample - mpp)) or sample
  redis.call('HSET', K_STATS, 'ms_per_phoneme', tostring(mpp))
end
if ARGV[11] == '1' and status == 'local' and idx == n - 1 then
  drop_request(rid)
  redis.call('HINCRBY', K_STATS, 'released_total', 1)
  return 3
end
return 1
