"""Batch leases with the model in real processes: `kokoro-fleet serve --workers 2` (tiny weights)
with KOKORO_BATCH_MAX=4 on a redis-server this test owns.

The reference for every comparison is the same fleet's unbatched path: a chunk leased alone runs
through `Replica.synthesize`, a batch through `Replica.synthesize_batch`, so the comparison stays
meaningful once the batched forward pass replaces today's loop. The parity bound is the engine's
(issue 15): durations equal, waveform at least 30 dB SNR; today the audio is also bit-identical,
which each test prints.

The queue-level tests act as an owner of their own (an AdmissionClient in this process) and hold
the workers with SIGSTOP, so a batch forms deterministically: jobs are admitted while every replica
is stopped, then one replica is let go and leases them all at once.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import time

import httpx
import numpy as np
import pytest

from api.speech.admission_client import AdmissionBounds, AdmissionClient, ChunkJob, RequestLost
from api.speech.redis_link import GAUGES, connect, encode_job, read_stats
from api.speech.worker_queue import WorkerQueueOwner
from loadtest.dispatch import FleetProcess
from loadtest.texts import load_texts
from test_fleet_serve import redis  # noqa: F401  (the module's redis-server fixture)
from worker.audio import SECONDS_PER_PHONEME
from worker.weights.tiny import tiny_config

pytestmark = pytest.mark.slow

BATCH_MAX = 4
MIN_SNR_DB = 30.0
VOICES = ("af_heart", "af_bella", "af_nova", "af_kore")
SHORT = load_texts("short")
PARAGRAPHS = load_texts("paragraphs")


@pytest.fixture(scope="module")
def fleet(redis, tmp_path_factory):
    env = {
        "KOKORO_BATCH_MAX": str(BATCH_MAX),
        "KOKORO_THREADS": "1",             # one core per replica: 2 replicas on this 2-core machine
        "KOKORO_LEASE_SECONDS": "3",       # a killed replica's jobs come back within a few seconds
        "KOKORO_CHUNK_TIMEOUT_SECONDS": "90",
        "KOKORO_DRAIN_SECONDS": "5",
        "KOKORO_QUEUE_MAX_REQUESTS": "16",           # the concurrent test's 8 requests are all admitted
        "KOKORO_QUEUE_MAX_AUDIO_SECONDS": "1000",
    }
    f = FleetProcess(2, redis_url=redis.url, env=env, log_dir=tmp_path_factory.mktemp("fleet"), name="fleet-batch")
    f.start(ready_timeout=300)
    yield f
    f.stop()


def snr_db(reference: np.ndarray, other: np.ndarray) -> float:
    reference, other = reference.astype(np.float64), other.astype(np.float64)
    noise = float(np.sum((reference - other) ** 2))
    return float("inf") if noise == 0 else 10 * np.log10(float(np.sum(reference ** 2)) / noise)


def stats(url: str):
    async def go():
        client = connect(url)
        try:
            return await read_stats(client)
        finally:
            await client.aclose()
    return asyncio.run(go())


def multi_job_leases(before, after) -> int:
    """Jobs leased beside another job of the same lease, between two snapshots."""
    return int((after["leased_total"] - before["leased_total"])
               - (after["lease_batches_total"] - before["lease_batches_total"]))


def settle(url: str, timeout_s: float = 30.0):
    deadline = time.monotonic() + timeout_s
    while True:
        s = stats(url)
        if all(s[g] == 0 for g in GAUGES) or time.monotonic() > deadline:
            return s
        time.sleep(0.2)


# --- over HTTP ------------------------------------------------------------------------------------

def test_concurrent_requests_batch_and_give_the_same_audio_as_each_alone(fleet, redis):
    cases = [(text, VOICES[i % len(VOICES)], (1.0, 1.25, 0.8)[i % 3]) for i, text in enumerate(SHORT[:6] + PARAGRAPHS[:2])]

    async def speak(client: httpx.AsyncClient, text: str, voice: str, speed: float) -> bytes:
        r = await client.post(fleet.url + "/v1/audio/speech", json={
            "input": text, "voice": voice, "speed": speed, "response_format": "pcm", "stream": False})
        assert r.status_code == 200, r.text
        return r.content

    async def alone():
        async with httpx.AsyncClient(timeout=120) as client:
            return [await speak(client, *case) for case in cases]

    async def together():
        async with httpx.AsyncClient(timeout=120) as client:
            return await asyncio.gather(*(speak(client, *case) for case in cases))

    before = stats(redis.url)
    reference = asyncio.run(alone())
    between = settle(redis.url)
    # The reference really is unbatched: no lease took two jobs while requests came one by one.
    assert multi_job_leases(before, between) == 0, "a reference chunk ran in a batch"
    batched = asyncio.run(together())
    after = settle(redis.url)
    together_jobs = multi_job_leases(between, after)
    identical, worst = 0, float("inf")
    for (text, voice, speed), ref, got in zip(cases, reference, batched):
        ref16, got16 = np.frombuffer(ref, dtype="<i2"), np.frombuffer(got, dtype="<i2")
        assert len(got16) == len(ref16), f"{voice} x{speed}: durations differ ({len(got16)} vs {len(ref16)} samples)"
        snr = snr_db(ref16, got16)
        worst = min(worst, snr)
        identical += ref == got
        assert snr >= MIN_SNR_DB, f"{voice} x{speed} {text[:40]!r}: {snr:.1f} dB"
    leases = after["lease_batches_total"] - between["lease_batches_total"]
    jobs = after["leased_total"] - between["leased_total"]
    print(f"{len(cases)} concurrent requests: {jobs:g} jobs in {leases:g} leases ({together_jobs} jobs shared a "
          f"lease); {identical}/{len(cases)} responses bit-identical to the request alone, worst SNR {worst:.1f} dB")
    assert together_jobs > 0, "no batch formed: the comparison would say nothing"
    assert all(after[g] == 0 for g in GAUGES) and after.consistent(), after.fields
    metrics = httpx.get(fleet.url + "/metrics", timeout=10, headers={"Connection": "close"}).text
    assert "kokoro_fleet_lease_batch_size_count" in metrics and "kokoro_fleet_lease_batches_total" in metrics


# --- at the queue, with the workers held by SIGSTOP ------------------------------------------------

def payloads(seed: int, n: int = BATCH_MAX) -> list[bytes]:
    """n single-chunk jobs of 140-160 phonemes (sizes within the batch ratio, a second or so of
    work each for a tiny replica on one core), on different voices and speeds."""
    rng = random.Random(seed)
    vocab = sorted(set(tiny_config()["vocab"].values()))
    return [encode_job([rng.choice(vocab) for _ in range(rng.randint(140, 160))], VOICES[i % len(VOICES)],
                       (1.0, 1.2, 0.9, 1.1)[i % 4]) for i in range(n)]


def job(payload: bytes) -> ChunkJob:
    return ChunkJob(payload, len(json.loads(payload)["ids"]))


def replica_pid(replica_id: str) -> int:
    return int(replica_id.rsplit("-", 1)[1])


class Owner:
    """An owner in this process, outside the fleet, so a killed worker takes no request with it."""

    def __init__(self, url: str):
        self.url = url

    async def __aenter__(self) -> AdmissionClient:
        self.client = AdmissionClient(connect(self.url), "test-owner", AdmissionBounds(0, 0),
                                      worker_queue=WorkerQueueOwner("test-owner"),
                                      ms_per_phoneme=SECONDS_PER_PHONEME * 1000)
        await self.client.start()
        return self.client

    async def __aexit__(self, *exc) -> None:
        await self.client.close()
        await self.client.client.aclose()


async def results_alone(url: str, jobs: list[bytes]) -> list:
    """Each job as its own request, one at a time: leased alone, run through `synthesize`."""
    out = []
    async with Owner(url) as owner:
        for payload in jobs:
            ticket = await owner.admit([job(payload)])
            [result] = [r async for r in owner.results(ticket, timeout_s=60)]
            await owner.release(ticket.request_id)
            out.append(result)
    return out


async def wait_for(predicate, timeout_s: float, what: str, poll_s: float = 0.002):
    deadline = time.monotonic() + timeout_s
    while not await predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(poll_s)


async def lease_one_batch(owner: AdmissionClient, fleet: FleetProcess, jobs: list[bytes]):
    """Admit `jobs` while every worker is stopped, let one worker go, and stop it again as soon as
    it holds them all in one lease (its forward pass takes about a second). Returns (tickets,
    that worker's pid, the other workers' pids), every worker stopped."""
    pids = fleet.worker_pids()
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    before = await read_stats(owner.client)
    tickets = [await owner.admit([job(p)]) for p in jobs]

    async def all_leased():
        return (await read_stats(owner.client))["inflight_jobs"] == len(jobs)

    for pid in pids:
        os.kill(pid, signal.SIGCONT)
        try:
            await wait_for(all_leased, 3.0, "a lease")
        except AssertionError:
            os.kill(pid, signal.SIGSTOP)  # this one did not wake in time: try the next
            continue
        os.kill(pid, signal.SIGSTOP)
        holders = {k.decode(): v.decode() for k, v in (await owner.client.hgetall("{kf}:holders")).items()}
        leased_by = {replica_pid(v.split("/")[0]) for v in holders.values()}
        after = await read_stats(owner.client)
        assert leased_by == {pid}, holders
        assert after["lease_batches_total"] - before["lease_batches_total"] == 1, "the jobs came in more than one lease"
        assert after["completed_total"] == before["completed_total"], "the batch finished before it could be held"
        return tickets, pid, [p for p in pids if p != pid]
    for pid in pids:
        os.kill(pid, signal.SIGCONT)
    raise AssertionError("no worker leased the queued jobs")


def assert_parity(reference, results, label: str) -> None:
    identical, worst = 0, float("inf")
    for ref, got in zip(reference, results):
        assert np.array_equal(got.durations, ref.durations), f"{label}: durations differ"
        a, b = np.frombuffer(ref.pcm, dtype="<i2"), np.frombuffer(got.pcm, dtype="<i2")
        snr = snr_db(a, b)
        worst = min(worst, snr)
        identical += ref.pcm == got.pcm
        assert snr >= MIN_SNR_DB, f"{label}: {snr:.1f} dB"
    print(f"{label}: {identical}/{len(results)} bit-identical to the job alone, worst SNR {worst:.1f} dB")


def test_a_cancelled_request_leaves_a_batch_without_harming_the_others(fleet, redis):
    jobs = payloads(seed=1)

    async def go():
        reference = await results_alone(redis.url, jobs)
        async with Owner(redis.url) as owner:
            before = await read_stats(owner.client)
            tickets, runner, others = await lease_one_batch(owner, fleet, jobs)
            try:
                assert await owner.cancel(tickets[1].request_id)       # its job is in the held pass
            finally:
                for pid in [runner, *others]:
                    os.kill(pid, signal.SIGCONT)
            with pytest.raises(RequestLost):
                [r async for r in owner.results(tickets[1], timeout_s=5)]
            results = await read_all(owner, [t for k, t in enumerate(tickets) if k != 1], timeout_s=60)
            after = await read_stats(owner.client)
        assert after["dropped_total"] - before["dropped_total"] == 1, "the cancelled job's result was not dropped"
        assert after["failed_total"] == before["failed_total"]
        assert after.consistent(), after.fields
        assert_parity([r for k, r in enumerate(reference) if k != 1], results,
                      f"batch of {BATCH_MAX} with one request cancelled mid-pass")
    asyncio.run(go())


def test_a_replica_killed_mid_batch_has_every_job_requeued_and_the_requests_complete(fleet, redis):
    jobs = payloads(seed=2)

    async def go():
        reference = await results_alone(redis.url, jobs)
        async with Owner(redis.url) as owner:
            before = await read_stats(owner.client)
            tickets, victim, others = await lease_one_batch(owner, fleet, jobs)
            os.kill(victim, signal.SIGKILL)
            for pid in others:
                os.kill(pid, signal.SIGCONT)
            # The survivor's reaper re-queues each job once its lease (3 s) expires.
            results = await read_all(owner, tickets, timeout_s=90)
            after = await read_stats(owner.client)
        delta = {k: after[k] - before[k] for k in ("expired_total", "requeued_total", "failed_total", "completed_total")}
        print(f"killed worker {victim} holding a batch of {len(jobs)}: {delta}")
        assert delta["expired_total"] == len(jobs) and delta["requeued_total"] == len(jobs), delta
        assert delta["failed_total"] == 0 and delta["completed_total"] == len(jobs), delta
        assert_parity(reference, results, f"batch of {BATCH_MAX} re-queued after its replica was killed")
    asyncio.run(go())
    fleet.wait_ready(300)  # the launcher replaces the killed worker


async def read_all(owner: AdmissionClient, tickets, timeout_s: float) -> list:
    """Each single-chunk request's result, released once read; then wait for an idle queue."""
    results = []
    for t in tickets:
        [r] = [r async for r in owner.results(t, timeout_s=timeout_s)]
        results.append(r)
        await owner.release(t.request_id)

    async def idle() -> bool:
        s = await read_stats(owner.client)
        return all(s[g] == 0 for g in GAUGES)

    await wait_for(idle, 30, "the queue to empty", poll_s=0.1)
    return results
