-- heartbeat.lua: a replica proves it is alive and, while running a job, extends that job's lease.
-- ARGV: prefix, replica_id, replica_ttl_ms, [job_id, token, lease_ms]
-- Returns 1: lease extended (or no job given); 0: the lease is lost (expired and re-queued, or
-- the job completed elsewhere): the replica's result will be dropped; 2: lease extended but the
-- request is gone or failed (cancelled): the result will be dropped, the replica may stop early.
local replica, replica_ttl = ARGV[2], tonumber(ARGV[3])
local now = now_ms()
redis.call('ZADD', K_REPLICAS, now + replica_ttl, replica)
redis.call('HSET', replica_key(replica), 'seen', now)
local job = ARGV[4]
if not job or job == '' then return 1 end
local holder = redis.call('HGET', K_HOLDERS, job)
if not holder then return 0 end
local token = split_holder(holder)
if token ~= ARGV[5] then return 0 end
redis.call('ZADD', K_LEASES, 'XX', now + tonumber(ARGV[6]), job)
local rid = split_job(job)
if redis.call('HGET', req_key(rid), 'state') ~= 'active' then return 2 end
return 1
