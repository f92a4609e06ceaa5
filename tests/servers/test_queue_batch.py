"""Batch leases (KOKORO_BATCH_MAX > 1) against a real redis-server, with fake job runners (no model).

lease.lua's rule: the first job is the earliest (or an own job within the slack, as without
batching); queued jobs join while the batch has room if they are due within the window of the
first job's deadline (or of now, when it is overdue) and keep the batch's largest estimate within
the size ratio of its smallest. Each job keeps its own lease, heartbeat, completion and failure.
The same rule with the model in real processes: tests/servers/test_fleet_batch.py.
"""

from __future__ import annotations

import asyncio
import json

import pytest
from queue_fakes import MS_PER_PHONEME, fake_payload, fake_run_batch
from test_queue import assert_idle, collect, jobs, owner, replica

from api.speech.admission_client import ChunkJob, RequestFailed, RequestLost
from api.speech.dispatcher import DELIVERED, DROPPED, STALE
from api.speech.worker_queue import WorkerQueueOwner


def keys(batch) -> list[tuple[str, int]]:
    return [(job.request_id, job.index) for job in batch]


async def admit_in_order(client, *requests):
    """Admit each request a few ms after the one before, so their deadlines keep this order."""
    tickets = []
    for r in requests:
        tickets.append(await client.admit(r))
        await asyncio.sleep(0.005)
    return tickets


def test_a_batch_takes_the_earliest_job_then_due_jobs_of_a_fitting_size_up_to_the_maximum(redis_server):
    async def go():
        client = owner(redis_server.url)
        rep = replica(redis_server.url, "r0", batch_max=4, run_batch=fake_run_batch)
        # Estimates at 75 ms per phoneme: a 3 s, b 2.25 s, c 0.375 s (8x smaller than a: it must not
        # ride in a's pass), d#0 3.75 s and d#1 due 3.75 s after d#0 (not due yet), e 2.6 s, f 3.4 s.
        a, b, c, d, e, f = await admit_in_order(client, jobs(40), jobs(30), jobs(5), jobs(50, 50), jobs(35), jobs(45))
        first = await rep.lease_batch()
        assert keys(first) == [(a.request_id, 0), (b.request_id, 0), (d.request_id, 0), (e.request_id, 0)]
        assert all(job.attempt == 1 and job.token == "r0/1" for job in first)
        for job in first:                                         # one lease (and holder) per job
            assert await rep.client.zscore("{kf}:leases", job.job_id) is not None
            assert await rep.client.hget("{kf}:holders", job.job_id) is not None
        stats = await client.stats()
        assert (stats["inflight_jobs"], stats["queued_jobs"]) == (4, 3) and stats.consistent()
        assert stats["inflight_work_ms"] == (40 + 30 + 50 + 35) * MS_PER_PHONEME
        # What is queued now goes at once, alone if nothing fits: a lease never waits for a batch to fill.
        assert keys(await rep.lease_batch()) == [(c.request_id, 0)]      # f is 9x c's size
        assert keys(await rep.lease_batch()) == [(f.request_id, 0)]      # d#1 is not due yet
        assert keys(await rep.lease_batch()) == [(d.request_id, 1)]
        assert await rep.lease_batch() == []
        stats = await client.stats()
        assert (stats["leased_total"], stats["lease_batches_total"]) == (7, 4)
        assert rep.batch_sizes.count == 4 and rep.batch_sizes.sum == 7
        assert stats["queued_jobs"] == 0 and stats["inflight_jobs"] == 7
        for ticket in (a, b, c, d, e, f):
            await client.release(ticket.request_id)
    asyncio.run(go())


def test_an_overdue_job_joins_the_batch_but_a_job_due_later_than_the_window_waits(redis_server):
    async def go():
        client = owner(redis_server.url)
        rep = replica(redis_server.url, "r0", batch_max=8, batch_window_ms=0)
        a, b = await admit_in_order(client, jobs(10, 10), jobs(10))   # a#1 is due 750 ms after a#0
        # b#0 is due a few ms after a#0, past the 0 ms window, so it joins only as overdue: the
        # admission order's sleep has made it so, however fast the lease comes.
        assert keys(await rep.lease_batch()) == [(a.request_id, 0), (b.request_id, 0)]
        c = await client.admit(jobs(10))            # due before a#1
        await asyncio.sleep(10 * MS_PER_PHONEME / 1000 + 0.1)   # now a#1 is overdue too
        assert keys(await rep.lease_batch()) == [(c.request_id, 0), (a.request_id, 1)]
        for ticket in (a, b, c):
            await client.release(ticket.request_id)
    asyncio.run(go())


def test_the_first_job_of_a_batch_is_still_an_own_job_within_the_slack(redis_server):
    async def go():
        state = WorkerQueueOwner("w1")
        shared = state.results_view()
        w1 = owner(redis_server.url, "w1", worker_queue=state)
        w2 = owner(redis_server.url, "w2")
        rep = replica(redis_server.url, "w1", worker_queue=state, own_slack_ms=5_000, batch_max=4,
                      run_batch=fake_run_batch)
        theirs = await w2.admit(jobs(30))
        await asyncio.sleep(0.02)
        mine = await w1.admit(jobs(30))
        batch = await rep.lease_batch()
        assert keys(batch) == [(mine.request_id, 0), (theirs.request_id, 0)]
        assert await rep.run_jobs(batch) == [DELIVERED, DELIVERED]
        assert list(shared) == [f"{mine.request_id}#0"]          # the own result stays in memory
        assert [r.index for r in await collect(w1, mine)] == [0]
        [result] = await collect(w2, theirs)
        assert len(result.pcm) == 32 * 3 * 600 * 2               # the other crossed Redis
        for client, ticket in ((w1, mine), (w2, theirs)):
            await client.release(ticket.request_id)
        await assert_idle(w1)
    asyncio.run(go())


@pytest.mark.parametrize("batched", [True, False], ids=["one-pass", "job-by-job"])
def test_a_cancelled_request_leaves_a_batch_without_harming_the_others(redis_server, batched):
    async def go():
        client = owner(redis_server.url)
        rep = replica(redis_server.url, "r0", batch_max=4, run_batch=fake_run_batch if batched else None)
        a, b, c = await admit_in_order(client, *(jobs(30, work_s=0.3) for _ in range(3)))
        batch = await rep.lease_batch()
        assert keys(batch) == [(t.request_id, 0) for t in (a, b, c)]
        running = asyncio.create_task(rep.run_jobs(batch))
        await asyncio.sleep(0.1)
        assert await client.cancel(b.request_id)                 # while its job is in the pass
        assert await running == [DELIVERED, DROPPED, DELIVERED]
        for t in (a, c):
            [result] = await collect(client, t)
            assert result.index == 0 and len(result.durations) == 32
            await client.release(t.request_id)
        with pytest.raises(RequestLost):
            await collect(client, b)
        stats = await client.stats()
        assert stats["dropped_total"] == 1 and stats["completed_total"] == 2
        await assert_idle(client)
    asyncio.run(go())


def test_a_failed_batch_runs_again_job_by_job_and_only_the_bad_job_fails_its_request(redis_server):
    passes = []

    async def fragile_run_batch(batch):
        passes.append(len(batch))
        if any(json.loads(job.payload).get("fail") for job in batch):
            raise RuntimeError("the fake batch pass failed")
        return await fake_run_batch(batch)

    async def go():
        client = owner(redis_server.url)
        rep = replica(redis_server.url, "r0", batch_max=4, run_batch=fragile_run_batch)
        a, b, c = await admit_in_order(client, jobs(20), [ChunkJob(fake_payload(20, 0, fail=True), 20)], jobs(20))
        batch = await rep.lease_batch()
        assert len(batch) == 3
        assert await rep.run_jobs(batch) == [DELIVERED, DELIVERED, DELIVERED]   # b's error is delivered too
        assert passes == [3] and rep.batch_fallbacks == 1
        with pytest.raises(RequestFailed, match="chunk 0 failed on replica r0: RuntimeError: the fake model refused"):
            await collect(client, b)
        for t in (a, c):
            assert len(await collect(client, t)) == 1
        stats = await client.stats()
        assert stats["failed_total"] == 1 and stats["completed_total"] == 2
        for t in (a, b, c):
            await client.release(t.request_id)
        await assert_idle(client)
    asyncio.run(go())


def test_heartbeats_keep_every_lease_of_a_long_batch(redis_server):
    async def go():
        client = owner(redis_server.url)
        rep = replica(redis_server.url, "slow", lease_s=0.3, heartbeat_s=0.05, batch_max=2)
        other = replica(redis_server.url, "other", lease_s=0.3)
        a, b = await admit_in_order(client, jobs(10, work_s=0.4), jobs(10, work_s=0.4))  # 0.8 s job by job
        batch = await rep.lease_batch()
        assert len(batch) == 2
        running = asyncio.create_task(rep.run_jobs(batch))
        for _ in range(8):
            await asyncio.sleep(0.1)
            assert (await other.reap()).expired == 0
        assert await running == [DELIVERED, DELIVERED]
        for t in (a, b):
            assert len(await collect(client, t)) == 1
            await client.release(t.request_id)
        await assert_idle(client)
    asyncio.run(go())


def test_a_replica_dying_mid_batch_leaves_each_job_to_the_reaper_which_requeues_it(redis_server):
    async def go():
        client = owner(redis_server.url)
        dying = replica(redis_server.url, "dying", lease_s=0.2, batch_max=4)
        survivor = replica(redis_server.url, "survivor", batch_max=4, run_batch=fake_run_batch)
        tickets = await admit_in_order(client, jobs(20), jobs(25), jobs(30))
        lost = await dying.lease_batch()                          # ...and never heartbeats or completes
        assert len(lost) == 3
        await asyncio.sleep(0.3)
        report = await survivor.reap()
        assert (report.expired, report.requeued, report.failed) == (3, 3, 0)
        again = await survivor.lease_batch()
        assert keys(again) == keys(lost) and all(job.attempt == 2 for job in again)
        assert await survivor.run_jobs(again) == [DELIVERED] * 3
        for t in tickets:
            assert len(await collect(client, t)) == 1
        # The dead replica's late results are refused, each on its own lease.
        assert await dying.run_jobs(lost) == [STALE] * 3
        stats = await client.stats()
        assert (stats["expired_total"], stats["requeued_total"], stats["stale_total"]) == (3, 3, 3)
        for t in tickets:
            await client.release(t.request_id)
        await assert_idle(client)
    asyncio.run(go())


def test_batch_max_below_one_is_refused():
    with pytest.raises(ValueError, match="batch_max"):
        replica("redis://127.0.0.1:1/0", "r0", batch_max=0)
