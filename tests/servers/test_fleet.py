"""The fleet speech service in one process: the shared queue (a real redis-server), the tiny model,
this worker's own Dispatcher and replica. What it must keep: the same audio as the local service,
refusals as 503s with both retry headers, slots freed however a stream ends, and serving on
through a Redis outage (degraded, then back on the queue). Multi-process fleets (`kokoro-fleet
serve`) are in tests/servers/test_fleet_serve.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import os

import numpy as np
import pytest

from api.errors import overloaded_error
from api.speech.redis_link import GAUGES, connect, decode_job, encode_job, read_stats
from api.speech.fleet import FleetPlan, FleetSpeechService
from api.metrics import Metrics
from api.embedded_redis import EmbeddedRedis
from cli.serve_cli import Mps, check_gpu_memory
from api.replica_table import parse_metrics, rows_from_metrics
from worker.replica import BaselineReplica, served
from api.speech.contract import Overloaded, SpeechRequest
from api.speech.local import SpeechService

TWO_CHUNKS = ("The first sentence is short. The second one goes on for a good while longer, so that the "
              "text needs more than one chunk of phonemes, and the fleet has several jobs to share out.")
# The same, its second sentence in another voice and faster (SSML): each job carries its own.
TWO_VOICES = (TWO_CHUNKS.replace("The second", '<voice name="bm_george"><prosody rate="fast">The second')
              + "</prosody></voice>")


@pytest.fixture(scope="module")
def tiny_engine(tiny_weights):
    from worker.engine import Engine, EngineConfig

    return Engine(tiny_weights, EngineConfig("cpu", "fp32"))


@pytest.fixture
def local_service(tiny_engine, tiny_weights):
    """A fresh replica per test (each test runs its own event loop, and a replica's lock belongs to
    the loop that first waited on it), over the module's one engine."""
    from worker.replica import Replica
    from api.settings import Settings
    from worker.voices import VoiceBank

    settings = Settings.from_env().replace(weights="tiny", first_chunk_phonemes=30, chunk_phonemes=60)
    return SpeechService(Replica(tiny_engine), VoiceBank(tiny_weights.voices), settings)


def fleet_for(local: SpeechService, url: str, name: str | None = None, **settings) -> FleetSpeechService:
    s = local.settings.replace(lease_seconds=2.0, **settings)
    return FleetSpeechService(local, url, s, replicas=1, name=name, owner_ttl_s=1.0, reap_interval_s=0.2)


async def collect(service, plan) -> list:
    return [p async for p in service.stream(plan)]


async def idle(url: str, timeout_s: float = 60.0):
    """The queue's stats once every gauge is back at zero. A job already running when its request was
    cancelled still finishes on its replica (a thread cannot be interrupted) before its lease is freed,
    and on a busy 2-core machine one chunk can take well over 10 s: wait for it, up to a minute."""
    client = connect(url)
    try:
        deadline = asyncio.get_running_loop().time() + timeout_s
        while True:
            stats = await read_stats(client)
            if all(stats[g] == 0 for g in GAUGES) or asyncio.get_running_loop().time() > deadline:
                return stats
            await asyncio.sleep(0.05)
    finally:
        await client.aclose()


def test_job_payload_round_trips():
    payload = encode_job([5, 16, 43], "af_heart(2)+am_adam(1)", 1.25)
    assert decode_job(payload) == ([5, 16, 43], "af_heart(2)+am_adam(1)", 1.25)


def test_the_queues_estimate_uses_the_speed_each_chunks_job_gives_the_replica(local_service, redis_server):
    """A <prosody rate> part's chunks run at their own speed: admit.lua's audio estimate (which orders
    the queue and bounds admission) divides by that same speed, not by the request's."""
    from worker.audio import SECONDS_PER_PHONEME

    async def go():
        fleet = await fleet_for(local_service, redis_server.url).start()
        try:
            plan = await fleet.admit(SpeechRequest('Normal pace for these words. <prosody rate="50%">And then '
                                                   'slowly, very slowly.</prosody>', "af_heart"))
            await collect(fleet, plan)
            return plan
        finally:
            await fleet.aclose()

    plan = asyncio.run(go())
    spoken = [c for c in plan.chunks if c.ids]
    assert len({plan.speed_of(c) for c in spoken}) == 2, "the test needs chunks at two speeds"
    speech_s = sum(len(c.ids) * SECONDS_PER_PHONEME / plan.speed_of(c) for c in spoken)
    assert plan.ticket.estimated_seconds == pytest.approx(speech_s, abs=0.001 * len(spoken))


@pytest.mark.parametrize("runner, text", [("own replica", TWO_CHUNKS), ("another worker's replica", TWO_CHUNKS),
                                          ("another worker's replica", TWO_VOICES)])
def test_fleet_gives_the_same_audio_and_words_as_the_local_service(local_service, redis_server, runner, text):
    """The same audio whichever replica runs the jobs: this worker's own (the PCM is handed over in
    memory and never stored in Redis) or another worker's (16-bit PCM through Redis)."""
    async def go():
        fleet = await fleet_for(local_service, redis_server.url, name="owner").start()
        other = None
        if runner != "own replica":
            await fleet.dispatcher.close()  # this worker's replica leaves: only `other` runs jobs
            other = await fleet_for(local_service, redis_server.url, name="other").start()
        try:
            plan = local_service.plan(SpeechRequest(text, "af_heart"))
            assert sum(1 for c in plan.chunks if c.ids) >= 2, "the test needs several chunk jobs"
            assert (text == TWO_VOICES) == any(c.voice == "bm_george" and c.rate == 1.25 for c in plan.chunks)
            local = await collect(local_service, plan)
            admitted = await fleet.admit(plan.request)
            assert isinstance(admitted, FleetPlan) and admitted.ticket is not None
            via_queue = await collect(fleet, admitted)
            stats = await idle(redis_server.url)
            return local, via_queue, stats, (other or fleet).dispatcher.jobs_done, dict(fleet.admission.local_results)
        finally:
            for service in (fleet, other):
                if service is not None:
                    await service.aclose()

    local, via_queue, stats, jobs_done, left_in_memory = asyncio.run(go())
    assert [p.index for p in via_queue] == [p.index for p in local]
    assert via_queue[-1].is_last
    for a, b in zip(local, via_queue):
        np.testing.assert_array_equal(a.pcm, b.pcm)  # bit-identical either way
        assert [(w.word, w.start, w.end) for w in a.words] == [(w.word, w.start, w.end) for w in b.words]
    assert jobs_done == sum(1 for p in local if len(p.pcm))
    assert stats["completed_total"] == jobs_done and stats["released_total"] == 1
    assert all(stats[g] == 0 for g in GAUGES), stats.fields
    if runner == "own replica":
        assert stats["local_total"] == jobs_done and stats["result_bytes_total"] == 0
    else:
        # 16-bit PCM (2 bytes a sample) of every chunk crossed Redis (the pieces add their pauses on top)
        assert stats["local_total"] == 0
        assert 0.9 * 2 * sum(len(p.pcm) for p in local) < stats["result_bytes_total"] <= 2 * sum(len(p.pcm) for p in local)
    assert left_in_memory == {}


def test_a_full_fleet_refuses_with_both_retry_headers_and_frees_the_slot_after(local_service, redis_server):
    async def go():
        fleet = await fleet_for(local_service, redis_server.url, queue_max_requests=1).start()
        try:
            plan = local_service.plan(SpeechRequest(TWO_CHUNKS, "af_heart"))
            first = await fleet.admit(plan.request)
            with pytest.raises(Overloaded) as refused:
                await fleet.admit(SpeechRequest("Hello.", "af_heart"))
            await collect(fleet, first)
            again = await fleet.admit(SpeechRequest("Hello.", "af_heart"))
            await collect(fleet, again)
            return overloaded_error(refused.value), await idle(redis_server.url), fleet.counters
        finally:
            await fleet.aclose()

    error, stats, counters = asyncio.run(go())
    assert error.status == 503 and int(error.headers["Retry-After"]) >= 1
    assert int(error.headers["retry-after-ms"]) >= 100
    assert stats["refused_total"] == 1 and stats["admitted_total"] == 2 and stats["released_total"] == 2
    assert counters.refused == 1 and counters.admitted == 2


def test_a_burst_beyond_the_bound_is_refused_without_planning_its_texts(local_service, redis_server, monkeypatch):
    """A short text is planned before its one admission call only while the worker is not crowded:
    in a burst beyond the fleet's bound, the refused requests must not each cost a text plan on the
    event loop first (issue 14: every 503 of a burst within 100 ms)."""
    planned = []
    plan = local_service.plan
    monkeypatch.setattr(local_service, "plan",
                        lambda request, *voice: planned.append(request.text) or plan(request, *voice))

    async def burst(fleet, n: int):
        return await asyncio.gather(*(fleet.admit(SpeechRequest(f"Hello number {i}.", "af_heart")) for i in range(n)),
                                    return_exceptions=True)

    async def go():
        fleet = await fleet_for(local_service, redis_server.url, queue_max_requests=2).start()
        try:
            first = await burst(fleet, 12)
            admitted = [p for p in first if isinstance(p, FleetPlan)]
            planned_first = len(planned)
            for p in admitted:
                await collect(fleet, p)
            return first, planned_first, await idle(redis_server.url)
        finally:
            await fleet.aclose()

    first, planned_first, stats = asyncio.run(go())
    refused = [r for r in first if isinstance(r, Overloaded)]
    assert len(refused) == 10 and len(first) - len(refused) == 2, first
    # At most the worker's share of the bound (2) planned before admission, plus the admitted ones
    # planned after their reservation (which of the burst's calls reaches Redis first is a race);
    # planning every text first would make it 12.
    assert planned_first <= 4, f"{planned_first} texts planned for 2 admitted requests: refusals waited on planning"
    assert stats["refused_total"] == 10 and stats["admitted_total"] == 2 and stats["released_total"] == 2


def test_admission_bounds_follow_the_replicas_alive_on_the_queue(local_service, redis_server):
    """Two fleets on one Redis (two containers) share one `admitted` counter: each one's derived
    bound must count the other's replicas too, or the second container's replicas idle behind 503s
    at the first one's size; and it shrinks back when the other fleet leaves."""
    from api.speech.admission_client import AdmissionBounds

    async def until(predicate, timeout_s: float = 15.0) -> bool:
        deadline = asyncio.get_running_loop().time() + timeout_s
        while not predicate() and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.05)
        return predicate()

    async def go():
        # the replica count alone (however fast the tiny model runs here, no first-audio sizing)
        a = await fleet_for(local_service, redis_server.url, name="a", first_audio_target_ms=0).start()
        b = await fleet_for(local_service, redis_server.url, name="b", first_audio_target_ms=0).start()
        seen = [a.admission.bounds]
        fleets = [a, b]
        try:
            grew = await until(lambda: a.admission.bounds.max_requests == 4)
            seen.append(a.admission.bounds)
            if not grew:
                return grew, False, seen
            plans = [await a.admit(SpeechRequest("Hello.", "af_heart")) for _ in range(3)]
            for plan in plans:
                await collect(a, plan)
            await fleets.pop().aclose()  # b leaves: its replica quits the table
            shrank = await until(lambda: a.admission.bounds.max_requests == 2)
            seen.append(a.admission.bounds)
            return grew, shrank, seen
        finally:
            for fleet in fleets:
                await fleet.aclose()

    grew, shrank, seen = asyncio.run(go())
    assert seen[0] == AdmissionBounds(2, 20.0), "one replica of its own: two requests"
    assert grew and seen[1] == AdmissionBounds(4, 40.0), seen
    assert shrank and seen[2] == AdmissionBounds(2, 20.0), seen


def test_a_request_refused_with_a_400_gives_its_reserved_slot_back(local_service, redis_server):
    async def go():
        fleet = await fleet_for(local_service, redis_server.url, queue_max_requests=1).start()
        try:
            long_text = TWO_CHUNKS * 2  # planned in the text-frontend thread: its slot is reserved first
            assert not local_service.plans_inline(SpeechRequest(long_text))
            with pytest.raises(ValueError) as invalid:  # the slot was reserved before the voice was checked
                await fleet.admit(SpeechRequest(long_text, "no_such_voice"))
            with pytest.raises(ValueError):  # a short text is planned before anything is asked of Redis
                await fleet.admit(SpeechRequest("Hello.", "no_such_voice"))
            plan = await fleet.admit(SpeechRequest("Hello.", "af_heart"))  # the one slot is free again
            await collect(fleet, plan)
            return invalid.value, await idle(redis_server.url)
        finally:
            await fleet.aclose()

    error, stats = asyncio.run(go())
    assert getattr(error, "param", None) == "voice"
    assert stats["withdrawn_total"] == 1 and stats["admitted_total"] == 2 and stats["released_total"] == 1


def test_a_client_that_leaves_cancels_its_remaining_jobs(local_service, redis_server):
    async def go():
        fleet = await fleet_for(local_service, redis_server.url).start()
        try:
            # Many chunks: the tiny model makes one in tens of ms, so the client must leave early.
            plan = await fleet.admit(SpeechRequest(TWO_CHUNKS * 8, "af_heart"))
            got = []

            async def consume():
                async for piece in fleet.stream(plan):
                    got.append(piece)
                    # The client leaves right after its first piece: the HTTP layer cancels the
                    # stream's task. Cancelled from inside, so a loaded machine cannot let the rest
                    # of the chunks arrive before a poll would notice the first.
                    asyncio.current_task().cancel()

            task = asyncio.create_task(consume())
            with contextlib.suppress(asyncio.CancelledError):
                await task
            return len(got), len(plan.chunks), await idle(redis_server.url), fleet.counters.cancelled
        finally:
            await fleet.aclose()

    received, chunks, stats, cancelled = asyncio.run(go())
    assert received < chunks
    assert cancelled == 1 and stats["cancelled_total"] == 1
    assert stats["completed_total"] < chunks, "the cancelled request's later jobs should not have run"
    assert all(stats[g] == 0 for g in GAUGES), stats.fields


def test_redis_outage_serves_locally_then_returns_to_the_queue(local_service, redis_server):
    async def go():
        fleet = await fleet_for(local_service, redis_server.url).start()
        try:
            # Redis dies while a stream is running: its remaining chunks run on this replica.
            plan = await fleet.admit(SpeechRequest(TWO_CHUNKS, "af_heart"))
            pieces = []
            async for piece in fleet.stream(plan):
                pieces.append(piece)
                if len(pieces) == 1:
                    redis_server.stop()
            midway = (len(pieces), len(plan.chunks), fleet.counters.finished_locally)
            # New requests while Redis is down: served locally, health says degraded.
            during = await fleet.admit(SpeechRequest("Still here.", "af_heart"))
            degraded = (fleet.degraded, fleet.health()["mode"], during.ticket is None)
            audio = await collect(fleet, during)
            redis_server.start()
            for _ in range(100):  # the owner heartbeat (every ~0.3 s here) notices Redis is back
                if not fleet.degraded:
                    break
                await asyncio.sleep(0.1)
            back = await fleet.admit(SpeechRequest("Back on the queue.", "af_heart"))
            await collect(fleet, back)
            return midway, degraded, len(audio), back.ticket is not None, fleet.health()["mode"], \
                await idle(redis_server.url), fleet.counters
        finally:
            await fleet.aclose()

    (received, chunks, finished_locally), degraded, local_pieces, queued_again, mode, stats, counters = asyncio.run(go())
    assert received == chunks and finished_locally == 1, "the stream should finish on the local replica"
    assert degraded == (True, "degraded", True) and local_pieces >= 1
    assert queued_again and mode == "fleet"
    assert counters.served_locally == 1 and counters.degraded_since is None and counters.degraded_seconds > 0
    assert stats["admitted_total"] == 1 and stats["released_total"] == 1 and all(stats[g] == 0 for g in GAUGES)


def test_a_fleet_worker_that_has_not_read_the_replica_table_yet_says_fleet_not_single(local_service, redis_server):
    """Before its first read of Redis a fleet worker's /metrics has no replica rows; `status` and the
    playground must not take its own replica's figures for a single worker's."""
    from cli.status_cli import format_replica_table

    fleet = fleet_for(local_service, redis_server.url)  # not started: nothing read from Redis
    metrics = Metrics()
    fleet.register_metrics(metrics)
    rows, summary = rows_from_metrics(parse_metrics(metrics.render()))
    assert rows == [] and summary["mode"] == "fleet"
    assert "not read the fleet's replica table" in format_replica_table(rows, summary)


def test_a_started_fleet_worker_reads_the_fleets_figures_at_once(local_service, redis_server):
    """The first read of Redis comes when the worker starts, not one refresh (a second) later: a
    worker that has just started shows the replica table in /metrics and `status` straight away."""
    from api.speech.fleet_figures import STATS_REFRESH_S

    async def go():
        fleet = await fleet_for(local_service, redis_server.url).start()
        try:
            await asyncio.sleep(STATS_REFRESH_S / 3)
            return fleet.snapshot.read_at, fleet.snapshot.stats
        finally:
            await fleet.aclose()

    read_at, stats = asyncio.run(go())
    assert read_at > 0 and stats is not None


def test_status_asks_a_worker_that_has_not_read_the_replica_table_again(monkeypatch):
    """The kernel may hand `status --url` to a worker that has just started; an empty fleet table is
    asked again (up to a few seconds) before it is shown, and a single worker is never asked twice."""
    import argparse

    from cli import status_cli

    answers = [([], {"mode": "fleet"}), ([], {"mode": "fleet"}),
               ([status_cli.ReplicaRow("w0-r0", True, False, None, 0, 0.0, 0.0, "sim")], {"mode": "fleet"})]
    monkeypatch.setattr(status_cli, "read_status", lambda args: answers.pop(0))
    monkeypatch.setattr(status_cli.time, "sleep", lambda s: None)
    rows, _ = status_cli.read_status_settled(argparse.Namespace())
    assert [r.replica for r in rows] == ["w0-r0"] and answers == []

    single = [([], {"mode": "single"}), ([], {"mode": "fleet"})]
    monkeypatch.setattr(status_cli, "read_status", lambda args: single.pop(0))
    assert status_cli.read_status_settled(argparse.Namespace()) == ([], {"mode": "single"}) and len(single) == 1

    monkeypatch.setattr(status_cli, "read_status", lambda args: ([], {"mode": "fleet"}))
    assert status_cli.read_status_settled(argparse.Namespace(), patience_s=0.0) == ([], {"mode": "fleet"})


def test_fleet_metrics_and_the_status_table_agree(local_service, redis_server):
    async def go():
        fleet = await fleet_for(local_service, redis_server.url).start()
        try:
            metrics = Metrics()
            fleet.register_metrics(metrics)
            await collect(fleet, await fleet.admit(SpeechRequest(TWO_CHUNKS, "af_heart")))
            # The figures come from the fleet's periodic housekeeping reads (about one a second, later on
            # a busy CPU): wait until they include the finished request, up to half a minute.
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 30
            while True:
                await asyncio.sleep(0.5)
                text = metrics.render()
                rows, summary = rows_from_metrics(parse_metrics(text))
                caught_up = rows and rows[0].jobs_done == fleet.dispatcher.jobs_done and summary.get("admitted_total") == 1
                if (caught_up and loop.time() > deadline - 28) or loop.time() > deadline:
                    return text, fleet.dispatcher.jobs_done
        finally:
            await fleet.aclose()

    text, jobs = asyncio.run(go())
    samples = parse_metrics(text)
    rows, summary = rows_from_metrics(samples)
    assert len(rows) == 1 and rows[0].jobs_done == jobs and rows[0].audio_seconds > 0 and rows[0].alive
    assert rows[0].engine == "torch cpu fp32"  # the tiny engine's device and precision, from Redis
    assert summary["mode"] == "fleet" and summary["admitted_total"] == 1 and summary["live_replicas"] == 1
    # one worker: every result was its own replica's, handed over in memory
    assert summary["local_total"] == jobs and summary["result_bytes_total"] == 0
    assert samples["kokoro_fleet_first_chunk_wait_seconds_count"][0][1] == 1
    assert samples["kokoro_fleet_degraded"][0][1] == 0


def test_baseline_runs_up_to_four_chunks_at_once_with_the_same_audio(tiny_weights):
    from worker.engine import Engine, EngineConfig

    engine = Engine(tiny_weights, EngineConfig("cpu", "fp32"))
    baseline = BaselineReplica(engine)
    style = tiny_weights.voices["af_heart"][20]
    ids = list(range(16, 60))
    expected = served(engine.synthesize(ids, style))  # what a replica hands out: 16-bit PCM levels

    async def go():
        peak = 0

        async def watch():
            nonlocal peak
            while True:
                peak = max(peak, baseline.running)
                await asyncio.sleep(0.001)

        watcher = asyncio.create_task(watch())
        results = await asyncio.gather(*(baseline.synthesize(ids, style) for _ in range(6)))
        watcher.cancel()
        return results, peak

    results, peak = asyncio.run(go())
    assert 1 < peak <= 4
    for r in results:  # each slot has its own noise buffers: concurrent runs do not disturb each other
        np.testing.assert_array_equal(r.audio, expected.audio)
    assert baseline.jobs_done == 6 and not baseline.busy


async def _ping(url: str) -> bool:
    client = connect(url)
    try:
        return await client.ping()
    finally:
        await client.aclose()


def test_launcher_pieces():
    with pytest.raises(SystemExit, match=r"--workers 3"):
        check_gpu_memory(8, 3000, 10_000)
    assert "fit" in check_gpu_memory(2, 3000, 10_000)
    assert "not checked" in check_gpu_memory(2, 3000, None)
    assert "off" in Mps("off").ensure()
    with pytest.raises(SystemExit, match="auto, on or off"):
        Mps("sometimes")
    redis = EmbeddedRedis().start()
    try:
        assert redis.ping() and redis.url.startswith("redis://127.0.0.1:")
        # the workers' own way in: the Unix socket, in a directory only this user may enter
        assert redis.worker_url.startswith("unix://") and os.stat(redis.socket_path).st_mode & 0o077 == 0
        assert asyncio.run(_ping(redis.worker_url))
        socket_dir = os.path.dirname(redis.socket_path)
    finally:
        redis.stop()
    assert not redis.ping() and not os.path.exists(socket_dir)


def test_the_test_redis_restarts_on_the_same_addresses_and_leaves_no_directory_behind():
    from redis_server import RedisServer

    with RedisServer() as server:
        socket_path = server.socket_path
        server.stop()  # a crash: the directory stays for the restart
        assert not server.ping() and os.path.isdir(os.path.dirname(socket_path))
        server.start()
        assert server.ping() and server.socket_path == socket_path
        assert asyncio.run(_ping(server.worker_url))
    assert not os.path.exists(os.path.dirname(socket_path))


def test_a_repeated_prompt_is_answered_from_the_cache_without_the_queue(tiny_engine, tiny_weights, redis_server):
    from worker.replica import Replica
    from api.settings import Settings
    from worker.voices import VoiceBank

    settings = Settings.from_env().replace(weights="tiny", first_chunk_phonemes=30, chunk_phonemes=60)
    cached = SpeechService(Replica(tiny_engine, cache_bytes=1 << 20), VoiceBank(tiny_weights.voices), settings)

    async def go():
        fleet = await fleet_for(cached, redis_server.url).start()
        try:
            first = await fleet.admit(SpeechRequest("Please hold while I connect you.", "af_heart"))
            heard_first = await collect(fleet, first)
            again = await fleet.admit(SpeechRequest("Please hold while I connect you.", "af_heart"))
            heard_again = await collect(fleet, again)
            other = await fleet.admit(SpeechRequest("Please hold while I connect you.", "am_adam"))  # not cached
            await collect(fleet, other)
            return first, heard_first, again, heard_again, other, await idle(redis_server.url), fleet.counters
        finally:
            await fleet.aclose()

    first, heard_first, again, heard_again, other, stats, counters = asyncio.run(go())
    assert first.ticket is not None and again.ticket is None and other.ticket is not None
    for a, b in zip(heard_first, heard_again, strict=True):
        np.testing.assert_array_equal(a.pcm, b.pcm)
    assert counters.from_cache == 1 and counters.served_locally == 0 and not counters.degraded_since
    assert stats["admitted_total"] == 2 and all(stats[g] == 0 for g in GAUGES)  # the repeat never queued


def test_the_admission_side_and_the_lease_side_share_no_mutable_container(local_service, redis_server):
    """What the two sides of a worker have in common belongs to its queue owner alone: after a request
    has run through the queue (so each side has filled what it holds), no object the admission client
    holds is also held by the dispatcher, except the owner itself, and the owner hands out read-only views."""
    from api.speech.worker_queue import WorkerQueueOwner

    def held(obj) -> dict[int, object]:
        return {id(v): v for v in vars(obj).values()
                if not isinstance(v, (str, bytes, int, float, bool, type(None), tuple, frozenset))}

    async def go():
        fleet = await fleet_for(local_service, redis_server.url).start()
        try:
            admitted = await fleet.admit(SpeechRequest("Hello there.", "af_heart"))
            await collect(fleet, admitted)
            admission, dispatcher = held(fleet.admission), held(fleet.dispatcher)
            return [admission[k] for k in admission.keys() & dispatcher.keys()], fleet.admission.local_results
        finally:
            await fleet.aclose()

    shared, view = asyncio.run(go())
    assert [type(v) for v in shared] == [WorkerQueueOwner], shared
    with pytest.raises(TypeError):
        view["job"] = b""  # type: ignore[index]
