"""The fleet queue's protocol against a real redis-server, with fake job runners (no model).

Each test starts its own redis-server (the `redis_server` fixture). Replicas are `Dispatcher`s in
this process, stepped by hand where order matters or looping where load matters; the SIGKILL test
(test_queue_faults.py) uses real subprocesses.
"""

from __future__ import annotations

import asyncio
import random
import time

import numpy as np
import pytest
from queue_fakes import MS_PER_PHONEME, fake_payload, fake_run_job

from api.speech.admission_client import (
    AdmissionBounds,
    AdmissionClient,
    ChunkJob,
    QueueUnavailable,
    first_audio_places,
    Refused,
    RequestFailed,
    RequestLost,
    ResultTimeout,
    place_spacing_ms,
    retry_after,
    retry_headers,
)
from api.speech.redis_link import GAUGES, connect, read_replicas
from api.speech.dispatcher import DELIVERED, DROPPED, STALE, Dispatcher, DispatcherConfig
from api.speech.worker_queue import WorkerQueueOwner


def jobs(*phonemes: int, work_s: float = 0.0, speed: float = 1.0) -> list[ChunkJob]:
    return [ChunkJob(fake_payload(p, work_s), p, speed) for p in phonemes]


def owner(url: str, worker_id: str = "w1", bounds: AdmissionBounds | None = None, *, worker_queue=None,
          **kw) -> AdmissionClient:
    return AdmissionClient(connect(url), worker_id, bounds or AdmissionBounds(0, 0),
                           worker_queue=worker_queue or WorkerQueueOwner(worker_id), ms_per_phoneme=MS_PER_PHONEME, **kw)


def replica(url: str, name: str, run_job=fake_run_job, *, run_batch=None, worker_queue=None, engine: str = "",
            **config) -> Dispatcher:
    return Dispatcher(connect(url), name, run_job, DispatcherConfig(**config), run_batch=run_batch,
                      worker_queue=worker_queue or WorkerQueueOwner(name), engine=engine)


async def assert_idle(client: AdmissionClient) -> None:
    stats = await client.stats()
    assert stats.gauges() == {g: 0 for g in GAUGES}, stats
    assert stats.consistent(), stats
    # Every admitted request was freed exactly once.
    assert stats["admitted_total"] == stats["released_total"] + stats["cancelled_total"] + stats["orphaned_total"] + stats["withdrawn_total"]


async def collect(client: AdmissionClient, ticket, timeout_s: float = 10.0):
    return [r async for r in client.results(ticket, timeout_s=timeout_s)]


# --- Retry-After arithmetic ---------------------------------------------------------------------

def test_retry_after_is_whole_seconds_at_least_one_and_scales_with_work_and_capacity():
    assert retry_after(0.0, 4, 10.0) == (1, 100)  # nothing to drain: the floor, never 0
    s, ms = retry_after(30.0, 2, 5.0)             # 30 audio-s over 2 replicas at 5x: 3 s
    assert (s, ms) == (3, 3000)
    s_more, ms_more = retry_after(60.0, 2, 5.0)
    s_wider, ms_wider = retry_after(30.0, 4, 5.0)
    assert ms_more == 2 * ms and ms_wider == ms // 2
    assert retry_after(3.3, 1, 1.0)[0] == 4        # rounded up: a client retrying early is refused again
    assert retry_after(1e9, 1, 1.0)[1] == 300_000  # clamped: a sane upper bound


def test_each_further_place_frees_after_one_average_request_or_this_requests_work():
    # 8 requests hold 40 audio-s: a slot frees per 5 audio-s drained, at 2 replicas x 10 audio-s/s
    assert place_spacing_ms("requests", 40_000, 8, 0, 2, 10.0) == pytest.approx(250.0)
    assert place_spacing_ms("key", 40_000, 8, 0, 2, 10.0) == pytest.approx(250.0)
    # over the work bound, room for one more such request once its own work has drained
    assert place_spacing_ms("work", 40_000, 8, 3_000, 2, 10.0) == pytest.approx(150.0)
    # a key's jobs drain at its share of the output: twice as slowly at half
    assert place_spacing_ms("key_work", 40_000, 8, 3_000, 2, 10.0, key_work_share=0.5) == pytest.approx(300.0)
    # unmeasured rate: the prior; nothing ahead: a floor of 1 ms, never 0 (every retry its own slot)
    assert place_spacing_ms("requests", 4_000, 1, 0, 1, None) == pytest.approx(4000.0)
    assert place_spacing_ms("requests", 0, 0, 0, 1, 5.0) == 1.0
    assert retry_headers(1234.2) == (2, 1235) and retry_headers(5) == (1, 100) and retry_headers(1e12)[1] == 300_000


def test_a_crowd_of_refused_clients_is_given_retry_times_one_place_apart(redis_server):
    """Each refusal is sent back one place's time after the one before it, not all after the time
    the first place takes: a crowd then returns about as fast as places free (issue 39: 48 refused
    clients came back about 440 times a second, each told 0.1 s)."""
    async def go():
        client = owner(redis_server.url, bounds=AdmissionBounds(max_requests=2, max_queued_seconds=0))
        rep = replica(redis_server.url, "r0")
        t0 = await client.admit(jobs(40, work_s=0.05))  # measures the rate
        assert await rep.step()
        await collect(client, t0)
        await client.release(t0.request_id)
        held = [await client.admit(jobs(100, 100)), await client.admit(jobs(100))]
        hints = []
        for _ in range(6):
            with pytest.raises(Refused) as refused:
                await client.reserve()
            hints.append(refused.value.retry_after_ms)
        stats = await client.stats()
        spacing = place_spacing_ms("requests", 1000 * refused.value.work_ahead_s, 2, 0, 1, stats.rate)
        for h in held:
            await client.release(h.request_id)
        return hints, spacing

    hints, spacing = asyncio.run(go())
    first, step = hints[0], np.ceil(spacing)  # retry.lua keeps whole milliseconds
    # the k-th refused client comes back k places after the first (a few ms pass between the calls)
    for k, h in enumerate(hints):
        assert first + k * step - 50 <= h <= first + k * step + 2
    assert hints == sorted(hints) and len(set(hints)) == len(hints)


def test_the_retry_slots_of_a_crowd_that_has_gone_leave_nothing_behind(redis_server):
    async def go():
        client = owner(redis_server.url, bounds=AdmissionBounds(max_requests=1, max_queued_seconds=0))
        held = await client.admit(jobs(1))  # nothing measured: one tiny request, the prior rate
        with pytest.raises(Refused) as refused:
            await client.reserve()
        left = await client.client.keys("*:retry:*")
        await asyncio.sleep(refused.value.retry_after_ms / 1000 + 0.5)  # its slot, then one spacing, passed
        gone = await client.client.keys("*:retry:*")
        await client.release(held.request_id)
        return left, gone

    left, gone = asyncio.run(go())
    assert len(left) == 1 and gone == []


# --- Admission ----------------------------------------------------------------------------------

def test_request_bound_refuses_with_a_retry_estimate_from_the_measured_rate(redis_server):
    async def go():
        client = owner(redis_server.url, bounds=AdmissionBounds(max_requests=2, max_queued_seconds=0))
        rep = replica(redis_server.url, "r0")
        # Measure the service rate first: one chunk of 40 phonemes (42 tokens of 3 frames: 3.15 s)
        # in a little over 0.1 s.
        t0 = await client.admit(jobs(40, work_s=0.1))
        assert await rep.step()
        await collect(client, t0)
        await client.release(t0.request_id)
        measured_rate = (await client.stats()).rate
        # 3.15 s of audio in 0.1 s plus Redis/loop overhead (and a busy CPU); asyncio may wake a sleeper
        # up to its clock resolution early, so 0.1 s can measure a hair short.
        assert 10 < measured_rate < 31.5 * 1.02

        a = await client.admit(jobs(100, 100))
        b = await client.admit(jobs(100))
        with pytest.raises(Refused) as refused:
            await client.admit(jobs(10))
        r = refused.value
        assert r.reason == "requests" and r.admitted == 2 and r.live_replicas == 1
        # Work ahead: three chunks of 100 phonemes, at the learnt audio per phoneme.
        per_phoneme_s = (await client.stats())["ms_per_phoneme"] / 1000
        assert r.work_ahead_s == pytest.approx(300 * per_phoneme_s, rel=0.01)
        # One slot frees when an average request (half the work) has run on the one replica.
        expected_s = (r.work_ahead_s / 2) / measured_rate
        assert r.retry_after_ms == pytest.approx(expected_s * 1000, rel=0.05)
        assert r.retry_after_s == max(1, int(np.ceil(r.retry_after_ms / 1000)))
        assert "capacity" in str(r)

        await client.release(a.request_id)
        await client.admit(jobs(10))  # a slot is free again
        stats = await client.stats()
        assert stats["refused_total"] == 1 and stats["admitted"] == 2
        await client.release(b.request_id)
    asyncio.run(go())


def test_work_bound_refuses_beyond_queued_audio_but_an_empty_queue_admits_anything(redis_server):
    async def go():
        client = owner(redis_server.url, bounds=AdmissionBounds(max_requests=0, max_queued_seconds=10))
        big = await client.admit(jobs(200))          # 15 s estimated > 10 s bound, but the queue was empty
        assert big.estimated_seconds == pytest.approx(200 * MS_PER_PHONEME / 1000)
        with pytest.raises(Refused) as refused:
            await client.admit(jobs(20))
        assert refused.value.reason == "work"
        assert refused.value.retry_after_s >= 1
        # Speed scales the estimate: at 2x, audio is half as long.
        rep = replica(redis_server.url, "r0")
        job = await rep.lease()                      # the big job leaves the queue (now in flight)
        assert job is not None and job.estimated_seconds == pytest.approx(15.0)
        fast = await client.admit(jobs(100, speed=2.0))
        assert fast.estimated_seconds == pytest.approx(100 * MS_PER_PHONEME / 2000)
        for t in (big, fast):
            await client.cancel(t.request_id)
        assert await rep.run_one(job) == DROPPED
        await assert_idle(client)
    asyncio.run(go())


def test_work_bound_credits_what_the_replicas_make_before_a_long_texts_later_chunks_are_due(redis_server):
    """The work bound is a schedule check: a long text's later chunks, due only as its listener
    reaches them, count only beyond what the replicas make by then (at 0.8 of the measured rate),
    so short requests behind a long one are admitted; work due now still fits in the bound alone;
    without a measured rate, all queued work counts."""
    async def go():
        client = owner(redis_server.url, bounds=AdmissionBounds(max_requests=0, max_queued_seconds=10))
        await replica(redis_server.url, "r0").lease()   # one live replica (the queue is empty)
        stats_key = f"{client.prefix}:stats"
        before_long = time.monotonic()
        long = await client.admit(jobs(100, 100, 100, 100))   # 4 chunks of 7.5 s, due 7.5 s apart
        assert long.estimated_seconds == pytest.approx(30.0)
        with pytest.raises(Refused) as unmeasured:       # no rate yet: 30 + 1.5 s queued > 10 s
            await client.admit(jobs(20))
        assert unmeasured.value.reason == "work"

        await client.client.hset(stats_key, "rate", "20")  # 20 audio-s per s: 16 audio-ms per ms credited
        short = await client.admit(jobs(20))              # due now: 7.5 + 1.5 s; the rest is due later
        # the refused client above holds the crowd's first retry slot (retry.lua); forget it, so the
        # hints below are each the first place's time alone
        await client.client.delete(f"{client.prefix}:retry:fleet")
        with pytest.raises(Refused) as due_now:           # 7.5 + 1.5 + 1.5 s due now: over by 0.5 s
            await client.admit(jobs(20))
        assert due_now.value.reason == "work"
        assert due_now.value.retry_after_ms == 100        # 0.5 s at 20x: 25 ms, clamped to the 100 ms floor

        await client.client.hset(stats_key, "rate", "0.5")  # a slow fleet: 0.4 audio-ms per ms credited
        with pytest.raises(Refused) as later:  # chunks of 0.75 s (due now) and 7.5 s (due 0.75 s on)
            await client.admit(jobs(10, 100))
        assert later.value.reason == "work"
        # The worst deadline is the long text's last chunk, 22.5 s on: 30 + 1.5 + 0.75 + 7.5 = 39.75 s
        # due by then against 10 + 0.4 x 22.5 = 19 s allowed, 20.75 s over; at 0.5x that drains in 41.5 s.
        # Each ms since the long text arrived credits 0.4 ms less before its deadline: 0.8 ms more to wait.
        since_long_ms = 1000 * (time.monotonic() - before_long)
        assert 41_500 <= later.value.retry_after_ms <= 41_500 + 0.8 * since_long_ms + 2
        for t in (long, short):
            await client.cancel(t.request_id)
        await assert_idle(client)
    asyncio.run(go())


def test_a_reservation_holds_a_slot_before_planning_and_gives_it_back_when_withdrawn_or_refused(redis_server):
    async def go():
        client = owner(redis_server.url, bounds=AdmissionBounds(max_requests=2, max_queued_seconds=10))
        rep = replica(redis_server.url, "r0")
        first = await client.reserve()
        second = await client.reserve()
        with pytest.raises(Refused) as refused:       # two reservations fill the request bound
            await client.reserve()
        assert refused.value.reason == "requests" and refused.value.admitted == 2
        with pytest.raises(Refused):                  # and a one-step admission sees them too
            await client.admit(jobs(10))
        assert (await client.stats())["queued_jobs"] == 0  # reservations have no jobs yet

        ticket = await client.admit(jobs(200), request_id=first)  # enqueues into its own slot
        assert ticket.request_id == first and (await client.stats())["admitted"] == 2
        job = await rep.lease()
        assert job is not None and job.request_id == first
        await client.admit(jobs(20), request_id=second)  # queue empty again (the job is in flight): admitted
        await client.cancel(second)
        third = await client.reserve()
        await client.admit(jobs(140), request_id=third)  # 10.5 s queued: fills the 10 s work bound
        await client.release(first)
        fourth = await client.reserve()
        with pytest.raises(Refused) as fourth_refused:   # the work bound, checked when the jobs arrive
            await client.admit(jobs(20), request_id=fourth)
        assert fourth_refused.value.reason == "work"
        assert not await client.withdraw(fourth)        # admit.lua already gave the slot back
        fifth = await client.reserve()                  # a 400 after reserving: the slot comes straight back
        assert await client.withdraw(fifth) and not await client.withdraw(fifth)
        assert not await client.withdraw(third)         # an enqueued request is not withdrawn
        stats = await client.stats()
        assert stats["withdrawn_total"] == 2 and stats["admitted"] == 1 and stats["refused_total"] == 3
        await client.cancel(third)
        assert await rep.run_one(job) == DROPPED
        await assert_idle(client)
    asyncio.run(go())


def test_one_api_key_holds_at_most_its_share_and_every_way_out_gives_its_place_back(redis_server):
    """KOKORO_KEY_MAX_SHARE: a key at its bound is refused ("key", while other keys are admitted);
    withdraw, cancel, release, a refused reservation and the reaper each give its place back."""
    async def go():
        bounds = AdmissionBounds(max_requests=6, max_queued_seconds=10, key_max_requests=2)
        client = owner(redis_server.url, bounds=bounds)
        dead = owner(redis_server.url, "dead-worker", bounds=bounds, owner_ttl_s=0.3)  # no heartbeat
        rep = replica(redis_server.url, "r0")

        async def keys() -> dict[str, int]:
            raw = await client.client.hgetall(f"{client.prefix}:keys")
            return {k.decode(): int(v) for k, v in raw.items()}

        first = await client.reserve(key="reader")
        second = (await client.admit(jobs(10), key="reader")).request_id  # one step: both bounds
        for attempt in (client.reserve(key="reader"), client.admit(jobs(10), key="reader")):
            with pytest.raises(Refused) as refused:
                await attempt
            assert refused.value.reason == "key" and refused.value.admitted == 2
            assert "This API key holds its share of the server (2 requests in progress" in str(refused.value)
        bot = await client.reserve(key="support-bot")  # another key is admitted meanwhile
        anonymous = await client.reserve()               # and a request with no key at all
        assert await keys() == {"reader": 2, "support-bot": 1}

        assert await client.withdraw(first)             # a 400 after reserving
        third = await client.reserve(key="reader")
        await client.cancel(second)                      # the client left
        fourth = (await client.admit(jobs(10), key="reader")).request_id
        await client.admit(jobs(120), request_id=anonymous)  # 9.75 s queued: the work bound is 10 s
        with pytest.raises(Refused) as refused:          # a reservation refused by the work bound
            await client.admit(jobs(20), request_id=third)
        assert refused.value.reason == "work"
        assert await keys() == {"reader": 1, "support-bot": 1}
        await client.cancel(anonymous)
        await client.release(fourth)
        await client.withdraw(bot)

        await dead.reserve(key="reader")                 # its worker dies: the reaper frees it
        await dead.admit(jobs(10), key="reader")
        assert await keys() == {"reader": 2}
        await asyncio.sleep(0.5)
        assert (await rep.reap()).orphaned == 2
        assert await keys() == {}
        stats = await client.stats()
        assert stats["key_refused_total"] == 2
        assert not await rep.step()                      # no job of theirs is left queued
        await assert_idle(client)
    asyncio.run(go())


def test_one_api_key_queues_at_most_its_share_of_the_work_bound_so_another_key_still_fits(redis_server):
    """KOKORO_KEY_MAX_SHARE also shares out the work bound: a key whose own jobs would hold more
    than its share of queued audio is refused ("key_work", a 429), so another key's request still
    fits where, without the share, the first key's would have filled the bound and the other's been
    a 503. The key's later chunks are credited at its share of what the replicas make."""
    async def go():
        shared = owner(redis_server.url, bounds=AdmissionBounds(0, max_queued_seconds=10, key_max_queued_seconds=5))
        unshared = owner(redis_server.url, bounds=AdmissionBounds(0, max_queued_seconds=10))
        await replica(redis_server.url, "r0").lease()   # one live replica (the queue is empty)
        stats_key = f"{shared.prefix}:stats"
        assert shared.bounds.key_work_share == 0.5

        reading = await shared.admit(jobs(40), key="reader")          # 3 s queued
        with pytest.raises(Refused) as over_share:                      # 7.5 s of the reader's > its 5 s
            await shared.admit(jobs(60), key="reader")
        assert over_share.value.reason == "key_work"
        assert "This API key holds its share of the server's queued audio" in str(over_share.value)
        # 2.5 s over its share, which drains at half the prior's 1 audio-s per s: 5 s.
        assert over_share.value.retry_after_ms == 5000
        bot = await shared.admit(jobs(40), key="support-bot")          # 6 s of 10: the bot still fits
        anonymous_over = shared.admit(jobs(60))                         # no key: only the fleet's bound
        with pytest.raises(Refused) as full:
            await anonymous_over
        assert full.value.reason == "work"
        await shared.cancel(bot.request_id)

        # Without the share, the reader's second text is admitted and the bot's request is the 503.
        second = await unshared.admit(jobs(60), key="reader")
        with pytest.raises(Refused) as crowded_out:
            await unshared.admit(jobs(40), key="support-bot")
        assert crowded_out.value.reason == "work"
        await unshared.cancel(second.request_id)

        # A reservation refused by its key's share gives its slot back, as the work bound's does.
        reserved = await shared.reserve(key="reader")
        with pytest.raises(Refused) as refused_reservation:
            await shared.admit(jobs(60), request_id=reserved, key="reader")
        assert refused_reservation.value.reason == "key_work"
        assert not await shared.withdraw(reserved)
        assert await shared.client.hgetall(f"{shared.prefix}:keys") == {b"reader": b"1"}

        # Measured rate: the key's later chunks are credited at its share of the replicas' output.
        # A text of 1.5 s (due now), 4.5 s (due 1.5 s on) and 4.5 s (6 s on) behind the reader's 3 s:
        # at 5 audio-s/s the key is credited 0.5 x 0.8 x 5 = 2 audio-ms per ms, so 9 s due by 1.5 s on
        # against 5 + 3 s allowed: 1 s over (the whole fleet's credit would have let it in), draining
        # at 2.5 audio-s/s (its half of 5): 400 ms.
        await shared.client.hset(stats_key, "rate", "5")
        await shared.client.delete(f"{shared.prefix}:retry:key:reader")  # the first place's time alone
        with pytest.raises(Refused) as half_credit:
            await shared.admit(jobs(20, 60, 60), key="reader")
        assert half_credit.value.reason == "key_work" and half_credit.value.retry_after_ms == 400
        await shared.client.hset(stats_key, "rate", "20")               # 8 audio-ms per ms: it fits
        later = await shared.admit(jobs(20, 60, 60), key="reader")

        stats = await shared.stats()
        assert stats["key_refused_total"] == 3 and stats["withdrawn_total"] == 1
        for t in (reading, later):
            await shared.cancel(t.request_id)
        await assert_idle(shared)
    asyncio.run(go())


# --- Dispatch order and results -----------------------------------------------------------------

def test_earliest_deadline_first_puts_a_new_first_chunk_before_older_later_chunks(redis_server):
    async def go():
        client = owner(redis_server.url)
        rep = replica(redis_server.url, "r0")
        a = await client.admit(jobs(80, 80, 80))       # deadlines: arrival, +6 s, +12 s
        first = await rep.lease()
        assert (first.request_id, first.index) == (a.request_id, 0)
        await asyncio.sleep(0.05)
        b = await client.admit(jobs(80))               # arrives later, but needs its audio now
        order = [first]
        while (job := await rep.lease()) is not None:
            order.append(job)
        assert [(j.request_id, j.index) for j in order] == [
            (a.request_id, 0), (b.request_id, 0), (a.request_id, 1), (a.request_id, 2)]
        assert order[2].deadline_ms - order[0].deadline_ms == round(80 * MS_PER_PHONEME)
        for j in order:
            assert await rep.run_one(j) == DELIVERED
        assert [r.index for r in await collect(client, a)] == [0, 1, 2]
        await client.release(a.request_id)
        await client.release(b.request_id)
        await assert_idle(client)
    asyncio.run(go())


def test_own_jobs_due_within_the_slack_are_leased_first_and_their_audio_skips_redis(redis_server):
    """Keep the bytes cheap: worker w1's replica prefers w1's own job when it is due within the
    slack of the earliest, hands its PCM over in memory (nothing stored in Redis but durations),
    and still takes another worker's job through Redis when that one is due first."""
    async def go():
        state = WorkerQueueOwner("w1")
        shared = state.results_view()
        w1 = owner(redis_server.url, "w1", worker_queue=state)
        w2 = owner(redis_server.url, "w2")
        rep = replica(redis_server.url, "w1", worker_queue=state, own_slack_ms=5_000)
        theirs = await w2.admit(jobs(30))
        await asyncio.sleep(0.02)
        mine = await w1.admit(jobs(30))                 # due 20 ms after theirs: within the slack
        job = await rep.lease()
        assert (job.request_id, job.owner) == (mine.request_id, "w1")
        assert await rep.run_one(job) == DELIVERED
        stored = await rep.client.hgetall(f"{{kf}}:res:{mine.request_id}")
        assert not any(k.startswith(b"pcm:") for k in stored) and b"loc:0" in stored
        assert list(shared) == [f"{mine.request_id}#0"]
        [result] = await collect(w1, mine)
        pcm = np.frombuffer(result.pcm, dtype=np.int16)
        assert len(pcm) == 32 * 3 * 600 and (pcm == 0).all() and len(result.durations) == 32
        assert shared == {}                             # read once, then gone from memory
        job = await rep.lease()                         # w2's job goes through Redis as before
        assert job.request_id == theirs.request_id and await rep.run_one(job) == DELIVERED
        [result] = await collect(w2, theirs)
        assert len(result.pcm) == 32 * 3 * 600 * 2
        stats = await w1.stats()
        assert stats["local_total"] == 1 and stats["result_bytes_total"] == len(result.pcm)
        for client, ticket in ((w1, mine), (w2, theirs)):
            await client.release(ticket.request_id)
        await assert_idle(w1)
    asyncio.run(go())


@pytest.mark.parametrize("slack_ms", [0, 1])
def test_without_slack_the_earliest_deadline_wins_over_an_own_job(redis_server, slack_ms):
    async def go():
        state = WorkerQueueOwner("w1")
        shared = state.results_view()
        w1 = owner(redis_server.url, "w1", worker_queue=state)
        w2 = owner(redis_server.url, "w2")
        rep = replica(redis_server.url, "w1", worker_queue=state, own_slack_ms=slack_ms)
        theirs = await w2.admit(jobs(30))
        await asyncio.sleep(0.05)                       # mine is due 50 ms later: beyond the slack
        mine = await w1.admit(jobs(30))
        assert (await rep.lease()).request_id == theirs.request_id
        job = await rep.lease()
        assert job.request_id == mine.request_id and await rep.run_one(job) == DELIVERED
        assert len(shared) == 1                         # own results still skip Redis
        await w1.cancel(mine.request_id)                # never read: dropped from memory too
        assert shared == {}
        await w2.cancel(theirs.request_id)
    asyncio.run(go())


def test_an_own_result_refused_as_stale_is_not_kept_in_memory(redis_server):
    async def go():
        state = WorkerQueueOwner("w1")
        shared = state.results_view()
        w1 = owner(redis_server.url, "w1", worker_queue=state)
        rep = replica(redis_server.url, "w1", worker_queue=state, own_slack_ms=20)
        ticket = await w1.admit(jobs(30))
        job = await rep.lease()
        await w1.cancel(ticket.request_id)              # the request goes while its job runs
        assert await rep.run_one(job) == DROPPED
        assert shared == {}
        await asyncio.sleep(0)
        await assert_idle(w1)
    asyncio.run(go())


def _no_redis_reads(client: AdmissionClient) -> None:
    """Make any fetch.lua or release.lua call of this owner fail the test."""
    async def refuse(*args):
        raise AssertionError("this read should not have needed Redis")
    client.scripts.fetch = client.scripts.release = refuse


def test_an_admission_leases_for_the_idle_own_replica_and_its_audio_never_crosses_redis(redis_server):
    """When this worker's replica is waiting for work, admit.lua leases for it in the same call;
    the replica runs the job in this process, its completion releases the one-chunk request, and
    the owner reads the chunk from memory: two round trips in all (admit, complete), no fetch, no
    wake-up, no release, no PCM in Redis."""
    async def go():
        state = WorkerQueueOwner("w1")
        shared, delivered = state.results_view(), state.accepted_view()
        w1 = owner(redis_server.url, "w1", worker_queue=state)
        rep = replica(redis_server.url, "w1", worker_queue=state, own_slack_ms=20)
        ticket = await w1.admit(jobs(30), lease_for=rep.lease_arguments())
        assert [entry[0].decode() for entry in ticket.leased] == [f"{ticket.request_id}#0"]
        assert await rep.client.llen("{kf}:ready") == 0     # nothing left to wake another replica for
        run = rep.run_claimed(ticket.leased, ticket.request_id)
        _no_redis_reads(w1)
        [result] = [r async for r in w1.results(ticket, timeout_s=5, local_run=run)]
        assert run.done() and len(result.pcm) == 32 * 3 * 600 * 2 and len(result.durations) == 32
        stats = await w1.stats()
        assert stats["admitted"] == 0 and stats["released_total"] == 1 and stats["local_total"] == 1
        assert stats["result_bytes_total"] == 0
        assert await w1.release(ticket.request_id)          # already released: no call
        assert shared == {} and delivered == {}
        await assert_idle(w1)
    asyncio.run(go())


def test_an_admission_that_leases_still_takes_the_earliest_deadline_first(redis_server):
    """The lease in admit.lua is lease.lua's: another worker's job due first (beyond the slack)
    goes to the idle replica, and this request's job waits in the queue with its wake-up token."""
    async def go():
        state = WorkerQueueOwner("w1")
        shared, delivered = state.results_view(), state.accepted_view()
        w1 = owner(redis_server.url, "w1", worker_queue=state)
        w2 = owner(redis_server.url, "w2")
        rep = replica(redis_server.url, "w1", worker_queue=state, own_slack_ms=5)
        theirs = await w2.admit(jobs(30))
        await asyncio.sleep(0.05)
        mine = await w1.admit(jobs(30), lease_for=rep.lease_arguments())
        assert [entry[1].decode() for entry in mine.leased] == [theirs.request_id]
        assert await rep.client.llen("{kf}:ready") == 1
        await rep.run_claimed(mine.leased, mine.request_id)  # theirs: its result goes through Redis
        [result] = await collect(w2, theirs)                # through Redis, as before
        assert len(result.pcm) == 32 * 3 * 600 * 2
        job = await rep.lease()
        assert job.request_id == mine.request_id and await rep.run_one(job) == DELIVERED
        [result] = await collect(w1, mine)
        assert len(result.pcm) == 32 * 3 * 600 * 2
        for client, ticket in ((w1, mine), (w2, theirs)):
            assert await client.release(ticket.request_id)
        await assert_idle(w1)
    asyncio.run(go())


def test_the_read_of_the_last_chunk_releases_the_request(redis_server):
    async def go():
        client = owner(redis_server.url)
        rep = replica(redis_server.url, "r0")
        ticket = await client.admit(jobs(10, 10))
        assert await rep.run_one(await rep.lease()) == DELIVERED
        assert await rep.run_one(await rep.lease()) == DELIVERED
        assert [r.index for r in await collect(client, ticket)] == [0, 1]
        stats = await client.stats()
        assert stats["admitted"] == 0 and stats["released_total"] == 1
        _no_redis_reads(client)
        assert await client.release(ticket.request_id)      # nothing left to do in Redis
        assert not await client.cancel(ticket.request_id)
        await assert_idle(client)
    asyncio.run(go())


def test_a_claimed_replica_leases_nothing_else_until_its_claimed_run_ends(redis_server):
    """The replica's loop and the owner side never run two leases at once on one replica: a claim
    is granted only while the loop waits for work, and the loop leases again only after the run."""
    async def go():
        state = WorkerQueueOwner("w1")
        shared, delivered = state.results_view(), state.accepted_view()
        w1 = owner(redis_server.url, "w1", worker_queue=state)
        w2 = owner(redis_server.url, "w2")
        rep = replica(redis_server.url, "w1", worker_queue=state, own_slack_ms=20,
                      idle_wait_s=0.2)
        rep.start()
        while not rep._idle:
            await asyncio.sleep(0.01)
        assert rep.claim() and not rep.claim()              # one claim at a time
        mine = await w1.admit(jobs(10, work_s=0.3), lease_for=rep.lease_arguments())
        run = rep.run_claimed(mine.leased, mine.request_id)
        await asyncio.sleep(0.05)
        theirs = await w2.admit(jobs(10))                    # wakes the loop while the replica is claimed
        await asyncio.sleep(0.1)
        assert (await w1.stats())["queued_jobs"] == 1 and not run.done()
        assert len([r async for r in w1.results(mine, timeout_s=5, local_run=run)]) == 1
        [result] = await collect(w2, theirs)                 # the loop's turn after the claimed run
        assert len(result.pcm) == 12 * 3 * 600 * 2
        await w2.release(theirs.request_id)
        await w1.release(mine.request_id)
        await rep.close()
        await assert_idle(w1)
    asyncio.run(go())


def test_measured_audio_moves_later_deadlines(redis_server):
    async def go():
        client = owner(redis_server.url)
        rep = replica(redis_server.url, "r0")
        t = await client.admit(jobs(40, 40, 40))
        job0 = await rep.lease()
        before = await rep.client.zscore("{kf}:queue", f"{t.request_id}#2")
        await rep.run_one(job0)  # 42 tokens * 3 frames * 25 ms = 3150 ms measured vs 3000 ms estimated
        after = await rep.client.zscore("{kf}:queue", f"{t.request_id}#2")
        assert after - before == 3150 - 40 * MS_PER_PHONEME
        await client.cancel(t.request_id)
        await assert_idle(client)
    asyncio.run(go())


def test_results_come_back_in_chunk_order_when_replicas_finish_out_of_order(redis_server):
    async def go():
        client = owner(redis_server.url)
        replicas = [replica(redis_server.url, f"r{i}") for i in range(4)]
        for r in replicas:
            r.start()
        # Chunk 0 takes longest, so chunks 1..3 finish first on the other replicas.
        work = [0.4, 0.05, 0.1, 0.02]
        t = await client.admit([ChunkJob(fake_payload(30 + i, w), 30 + i) for i, w in enumerate(work)])
        results = await collect(client, t)
        assert [r.index for r in results] == [0, 1, 2, 3]
        for r in results:
            pcm = np.frombuffer(r.pcm, dtype=np.int16)
            assert len(pcm) == (30 + r.index + 2) * 3 * 600 and (pcm == r.index).all()
            assert r.durations.dtype == np.int64 and len(r.durations) == 30 + r.index + 2
        await client.release(t.request_id)
        assert sum(r.jobs_done for r in replicas) == 4
        assert sum(1 for r in replicas if r.jobs_done) >= 3  # the chunks fanned out over idle replicas
        table = await read_replicas(client.client)
        assert sorted(row.replica for row in table) == ["r0", "r1", "r2", "r3"]
        assert sum(row.jobs_done for row in table) == 4 and all(row.alive for row in table)
        for r in replicas:
            await r.close()
        await assert_idle(client)
    asyncio.run(go())


def test_the_replica_table_names_each_replicas_engine_even_after_a_reaper_dropped_its_row(redis_server):
    async def go():
        real = replica(redis_server.url, "real", engine="torch cuda bf16", reap_interval_s=0.1)
        sim = replica(redis_server.url, "sim", engine="sim")
        silent = replica(redis_server.url, "old")  # a replica that writes no engine
        for r in (real, sim, silent):
            r.start()

        async def table() -> dict:
            return {row.replica: row.engine for row in await read_replicas(real.client)}

        deadline = time.monotonic() + 60
        while await table() != {"real": "torch cuda bf16", "sim": "sim", "old": None}:
            assert time.monotonic() < deadline, await table()
            await asyncio.sleep(0.05)
        # A reaper that finds a replica's liveness expired deletes its row; once the replica lives
        # again (its next lease re-adds it), its reaper tick writes the engine back.
        await real.client.delete("{kf}:replica:real")
        deadline = time.monotonic() + 60
        while (await table()).get("real") != "torch cuda bf16":
            assert time.monotonic() < deadline, await table()
            await asyncio.sleep(0.05)
        for r in (real, sim, silent):
            await r.close()
        assert await table() == {}
    asyncio.run(go())


def test_status_watch_reads_redis_again_and_measures_busy_over_each_interval(redis_server):
    """`kokoro-fleet status --redis-url URL --watch S`: Redis holds running totals only, so the first
    frame has no busy%; each later one has the replica's busy seconds over the interval."""
    import subprocess
    import sys
    from pathlib import Path

    async def go():
        rep = replica(redis_server.url, "r0", engine="sim")
        rep.start()
        client = owner(redis_server.url)
        ticket = await client.admit(jobs(*[40] * 40, work_s=0.1))  # 4 s of back-to-back jobs
        status = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "cli.main", "status", "--redis-url", redis_server.url, "--watch", "0.6",
            "--count", "3", stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=Path(__file__).parents[2])
        out, err = await status.communicate()
        await collect(client, ticket)
        await client.release(ticket.request_id)
        await rep.close()
        return status.returncode, out.decode(), err.decode()

    returncode, out, err = asyncio.run(go())
    assert returncode == 0, err
    busy = [line.split()[4] for line in out.splitlines() if line.startswith("r0 ")]
    assert len(busy) == 3 and busy[0] == "-", out
    assert all(b != "-" and 30 <= int(b) <= 100 for b in busy[1:]), out  # busy nearly all of each interval


def test_status_counts_the_running_job_so_a_watch_shorter_than_a_job_reads_busy(redis_server):
    """One job far longer than the watch interval: Redis adds its busy time only when it completes,
    so without the running lease's time every frame during it would read 0%."""
    import subprocess
    import sys
    from pathlib import Path

    async def go():
        rep = replica(redis_server.url, "r0", engine="sim")
        rep.start()
        client = owner(redis_server.url)
        ticket = await client.admit(jobs(40, work_s=8.0))
        rows = []
        for _ in range(100):  # until the replica holds the job
            rows = await read_replicas(client.client)
            if rows and rows[0].busy:
                break
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.5)
        running = (await read_replicas(client.client))[0]
        status = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "cli.main", "status", "--redis-url", redis_server.url, "--watch", "0.5",
            "--count", "3", stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=Path(__file__).parents[2])
        out, err = await status.communicate()
        await collect(client, ticket, timeout_s=30)
        await client.release(ticket.request_id)
        await rep.close()
        return running, status.returncode, out.decode(), err.decode()

    running, returncode, out, err = asyncio.run(go())
    assert running.busy and running.busy_seconds == 0 and 0.4 <= running.running_seconds < 8, running
    assert returncode == 0, err
    busy = [line.split()[4] for line in out.splitlines() if line.startswith("r0 ")]
    assert len(busy) == 3 and busy[0] == "-", out
    assert all(b != "-" and int(b) >= 80 for b in busy[1:]), out  # the whole interval inside the job


def test_many_requests_on_several_replicas_all_complete_and_counters_return_to_zero(redis_server):
    async def go():
        rng = random.Random(5)
        owners = [owner(redis_server.url, f"w{i}") for i in range(2)]
        replicas = [replica(redis_server.url, f"r{i}") for i in range(3)]
        for r in replicas:
            r.start()

        async def one_request(client: AdmissionClient):
            sizes = [rng.randint(5, 60) for _ in range(rng.randint(1, 4))]
            async with client.session([ChunkJob(fake_payload(p, p / 2000), p) for p in sizes]) as t:
                got = await collect(client, t)
            assert [len(r.durations) for r in got] == [p + 2 for p in sizes]

        await asyncio.gather(*(one_request(owners[i % 2]) for i in range(24)))
        stats = await owners[0].stats()
        assert stats["completed_total"] == sum(r.jobs_done for r in replicas)
        assert stats["released_total"] == 24
        for r in replicas:
            await r.close()
        await assert_idle(owners[0])
    asyncio.run(go())


# --- Leases, failures, cancellation -------------------------------------------------------------

def test_lease_expiry_requeues_once_then_fails_the_request_with_a_clear_error(redis_server):
    async def go():
        client = owner(redis_server.url)
        dying = replica(redis_server.url, "dying", lease_s=0.2)
        also_dying = replica(redis_server.url, "also-dying", lease_s=0.2)
        t = await client.admit(jobs(20, 20))
        first = await dying.lease()                   # ...and never heartbeats or completes
        assert first.attempt == 1 and first.index == 0
        await asyncio.sleep(0.3)
        report = await also_dying.reap()
        assert (report.expired, report.requeued, report.failed) == (1, 1, 0)
        again = await also_dying.lease()              # the same chunk, before chunk 1 (earlier deadline)
        assert (again.job_id, again.attempt) == (first.job_id, 2)
        await asyncio.sleep(0.3)
        report = await dying.reap()
        assert (report.expired, report.requeued, report.failed) == (1, 0, 1)
        with pytest.raises(RequestFailed, match=r"chunk 0 .* lost 2 times.*also-dying"):
            await collect(client, t)
        # A replica that comes back late finds its lease gone: its result is discarded.
        assert await dying.run_one(first) == STALE
        stats = await client.stats()
        assert stats["failed_total"] == 1 and stats["queued_jobs"] == 0  # chunk 1 left the queue with the failure
        await client.release(t.request_id)
        await assert_idle(client)
    asyncio.run(go())


def test_heartbeats_keep_a_long_job_leased(redis_server):
    async def go():
        client = owner(redis_server.url)
        rep = replica(redis_server.url, "slow", lease_s=0.3, heartbeat_s=0.05)
        other = replica(redis_server.url, "other", lease_s=0.3)
        t = await client.admit([ChunkJob(fake_payload(10, 1.0), 10)])  # runs 3x longer than a lease
        job = await rep.lease()
        running = asyncio.create_task(rep.run_one(job))
        for _ in range(8):
            await asyncio.sleep(0.1)
            assert (await other.reap()).expired == 0
        assert await running == DELIVERED
        assert len(await collect(client, t)) == 1
        await client.release(t.request_id)
        await assert_idle(client)
    asyncio.run(go())


def test_a_failing_job_fails_its_request_with_the_reason(redis_server):
    async def go():
        client = owner(redis_server.url)
        rep = replica(redis_server.url, "r0")
        t = await client.admit([ChunkJob(fake_payload(10, 0), 10), ChunkJob(fake_payload(10, 0, fail=True), 10),
                                ChunkJob(fake_payload(10, 0), 10)])
        assert await rep.step() and await rep.step()
        got = []
        with pytest.raises(RequestFailed, match="chunk 1 failed on replica r0: RuntimeError: the fake model refused"):
            async for r in client.results(t, timeout_s=5):
                got.append(r.index)
        assert got == [0]                             # what was made before the failure still streams
        assert not await rep.step()                   # chunk 2 left the queue with the failure
        await client.release(t.request_id)
        await assert_idle(client)
    asyncio.run(go())


def test_cancel_removes_queued_jobs_frees_the_slot_and_drops_in_flight_results(redis_server):
    async def go():
        client = owner(redis_server.url, bounds=AdmissionBounds(max_requests=1, max_queued_seconds=0))
        rep = replica(redis_server.url, "r0")
        t = await client.admit(jobs(30, 30, 30))
        in_flight = await rep.lease()
        with pytest.raises(Refused):
            await client.admit(jobs(5))
        assert await client.cancel(t.request_id)
        stats = await client.stats()
        assert (stats["admitted"], stats["queued_jobs"], stats["queued_work_ms"]) == (0, 0, 0)
        assert stats["inflight_jobs"] == 1 and stats["cancelled_total"] == 1
        other = await client.admit(jobs(5))           # the slot is free at once
        assert await rep.run_one(in_flight) == DROPPED
        with pytest.raises(RequestLost):
            await collect(client, t)
        assert not await client.cancel(t.request_id)  # idempotent
        await client.release(other.request_id)
        await assert_idle(client)
    asyncio.run(go())


def test_session_cancels_when_the_reader_goes_away(redis_server):
    async def go():
        client = owner(redis_server.url)
        rep = replica(redis_server.url, "r0")
        rep.start()
        with pytest.raises(asyncio.TimeoutError):
            async with client.session(jobs(10, 10, 10, 10, work_s=0.2)) as t:
                async with asyncio.timeout(0.3):      # the client disconnects mid-stream
                    await collect(client, t)
        stats = await client.stats()
        assert stats["cancelled_total"] == 1 and stats["admitted"] == 0
        await rep.close()
        await assert_idle(client)
    asyncio.run(go())


def test_requests_of_a_dead_owner_are_released_by_the_reaper(redis_server):
    async def go():
        dead = owner(redis_server.url, "dead-worker", owner_ttl_s=0.3)  # never starts its heartbeat
        alive = owner(redis_server.url, "live-worker", owner_ttl_s=0.3)
        await alive.start()
        rep = replica(redis_server.url, "r0")
        await dead.admit(jobs(10, 10))
        kept = await alive.admit(jobs(10))
        assert (await rep.reap()).orphaned == 0
        await asyncio.sleep(0.5)
        assert (await rep.reap()).orphaned == 1
        stats = await alive.stats()
        assert stats["admitted"] == 1 and stats["queued_jobs"] == 1  # only the live owner's request is left
        await rep.step()
        assert len(await collect(alive, kept)) == 1
        await alive.release(kept.request_id)
        await alive.close()
        await assert_idle(alive)
    asyncio.run(go())


def test_closing_ends_the_owner_heartbeat_even_when_redis_py_swallows_its_cancellation(redis_server):
    """redis-py 8 can finish a command it was cancelled during as if nothing had happened; the
    owner heartbeat then kept beating after close() cancelled it, and close() waited forever (a CI
    run hung so in tests/servers/test_fleet.py). The loop now stops after any such call."""
    async def go():
        client = owner(redis_server.url, owner_ttl_s=0.15)
        real_set = client.client.set
        swallowed = []

        async def set_swallowing_cancellation(*args, **kwargs):
            try:
                await asyncio.sleep(0.02)  # the command in flight when the cancel arrives
            except asyncio.CancelledError:
                swallowed.append(True)  # as redis-py may: the reply comes back as if not cancelled
            return await real_set(*args, **kwargs)

        client.client.set = set_swallowing_cancellation
        await client.start()
        for _ in range(100):  # cancel while a heartbeat's SET is in flight
            await asyncio.sleep(0.005)
            closing = asyncio.ensure_future(client.close())
            done, _ = await asyncio.wait({closing}, timeout=2.0)
            assert done, "close() waited for a heartbeat that never ended"
            if swallowed:
                break
            await client.start()
        assert swallowed, "no cancellation arrived during a SET: the test did not test"
    asyncio.run(go())


def test_a_missing_result_times_out_instead_of_hanging(redis_server):
    async def go():
        client = owner(redis_server.url, poll_s=0.1)
        t = await client.admit(jobs(10))             # no replica anywhere
        started = time.monotonic()
        with pytest.raises(ResultTimeout, match="chunk 0"):
            await collect(client, t, timeout_s=0.5)
        assert time.monotonic() - started < 1.5
        await client.cancel(t.request_id)
        await assert_idle(client)
    asyncio.run(go())


def test_no_redis_at_start_raises_queue_unavailable_promptly():
    from redis_server import free_port

    async def go():
        client = owner(f"redis://127.0.0.1:{free_port()}/0")   # nothing listens there
        started = time.monotonic()
        with pytest.raises(QueueUnavailable, match="admission"):
            await client.admit(jobs(10))
        assert time.monotonic() - started < 1.0 and client.degraded
        rep = replica(f"redis://127.0.0.1:{free_port()}/0", "r0",
                      retry_backoff_s=0.05, reap_interval_s=0.05)
        rep.start()                                             # the loop survives, marked degraded
        await asyncio.sleep(0.3)
        assert rep.degraded and not rep._tasks[0].done()
        await asyncio.wait_for(rep.close(), 2)
    asyncio.run(go())


def test_bounds_default_from_the_replica_count_and_settings_override_them():
    from api.settings import Settings

    derived = AdmissionBounds.from_settings(Settings.from_env({}), replicas=4)
    assert derived == AdmissionBounds(8, 80.0)
    configured = AdmissionBounds.from_settings(Settings.from_env(
        {"KOKORO_QUEUE_MAX_REQUESTS": "3", "KOKORO_QUEUE_MAX_AUDIO_SECONDS": "12.5"}), replicas=4)
    assert configured == AdmissionBounds(3, 12.5)
    shared = AdmissionBounds.from_settings(Settings.from_env({"KOKORO_KEY_MAX_SHARE": "0.5"}), replicas=4)
    assert shared == AdmissionBounds(8, 80.0, key_max_requests=4, key_max_queued_seconds=40.0)
    assert shared.key_work_share == 0.5 and derived.key_work_share == 1.0
    least = AdmissionBounds.from_settings(Settings.from_env({"KOKORO_KEY_MAX_SHARE": "0.1"}), replicas=2)
    assert least.key_max_requests == 1  # a key may always run one request
    assert least.key_max_queued_seconds == pytest.approx(4.0)


def test_the_request_bound_follows_the_measured_rate_and_the_first_audio_target():
    """Issue 39: about 21 requests in flight at c = 64 on the GPU, too few to fill batches. Without
    KOKORO_QUEUE_MAX_REQUESTS the bound is what the replicas can start within the first-audio target
    at their measured rate, when that is more than two per replica or a batch each."""
    from api.settings import Settings

    # 8 replicas at 375 audio-s/s each (3,000 together) make 750 audio-s in 250 ms: 166 first chunks of 4.5 s
    assert first_audio_places(8, 375.0, 0.25, 4.5) == 166
    assert first_audio_places(8, None, 0.25, 4.5) == 0 and first_audio_places(8, 375.0, 0.0, 4.5) == 0
    settings = Settings.from_env({"KOKORO_BATCH_MAX": "8"})
    assert settings.first_audio_target_ms == 250.0
    unmeasured = AdmissionBounds.from_settings(settings, replicas=8, seconds_per_phoneme=0.075)
    assert unmeasured.max_requests == 64  # a full batch for each replica, until a rate is measured
    fast = AdmissionBounds.from_settings(settings, replicas=8, rate=375.0, seconds_per_phoneme=0.075)
    assert fast.max_requests == 166 and fast.max_queued_seconds == 160.0
    slow = AdmissionBounds.from_settings(Settings.from_env({}), replicas=8, rate=5.0, seconds_per_phoneme=0.075)
    assert slow.max_requests == 16  # a CPU's rate: two per replica stays the floor
    pinned = AdmissionBounds.from_settings(Settings.from_env({"KOKORO_QUEUE_MAX_REQUESTS": "12"}), replicas=8,
                                           rate=375.0, seconds_per_phoneme=0.075)
    assert pinned.max_requests == 12
    off = AdmissionBounds.from_settings(Settings.from_env({"KOKORO_FIRST_AUDIO_TARGET_MS": "0"}), replicas=8,
                                        rate=375.0, seconds_per_phoneme=0.075)
    assert off.max_requests == 16


def test_a_crowd_is_spread_over_at_most_thirty_seconds(redis_server):
    """Under an open-loop overload new arrivals take the places that free, so the crowd's line would
    grow as long as the overload lasts: past RETRY_CROWD_MAX_MS every refused client is told that."""
    from api.speech.admission_client import RETRY_CROWD_MAX_MS

    async def go():
        client = owner(redis_server.url, bounds=AdmissionBounds(max_requests=1, max_queued_seconds=0))
        held = await client.admit(jobs(100))  # 7.5 s of work, at the prior 1 audio-s/s: 7.5 s a place
        hints = []
        for _ in range(6):
            with pytest.raises(Refused) as refused:
                await client.reserve()
            hints.append(refused.value.retry_after_ms)
        await client.release(held.request_id)
        return hints

    hints = asyncio.run(go())
    assert hints[:4] == sorted(hints[:4]) and hints[0] >= 7_000 and hints[3] >= 3 * 7_500
    assert hints[4] == hints[5] == RETRY_CROWD_MAX_MS
