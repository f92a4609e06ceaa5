"""Faults against the fleet queue: replicas SIGKILLed under load, Redis crashing and coming back.

What must hold afterwards: no request hangs (each ends in audio, a clean error or a refusal),
every gauge returns to zero, the counters agree with the structures they count, and every
admitted request was freed exactly once (released, cancelled or reaped).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import select
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from queue_fakes import MS_PER_PHONEME, fake_payload, fake_run_job

from api.speech.admission_client import (
    AdmissionBounds,
    AdmissionClient,
    ChunkJob,
    QueueUnavailable,
    Refused,
    RequestFailed,
    ResultTimeout,
)
from api.speech.redis_link import GAUGES, QueueStats, connect, read_stats
from api.speech.dispatcher import Dispatcher, DispatcherConfig
from api.speech.worker_queue import WorkerQueueOwner

REPO = Path(__file__).resolve().parents[2]
PROC = Path(__file__).resolve().parents[1] / "queue_proc.py"
# How long a client waits for its results; a failure must come well before it.
RESULT_TIMEOUT_S = 10


def every_slot_freed_once(stats: QueueStats) -> bool:
    return stats["admitted_total"] == stats["released_total"] + stats["cancelled_total"] + stats["orphaned_total"] + stats["withdrawn_total"]


async def settle(url: str, timeout_s: float) -> QueueStats:
    """Run the reaper (as any surviving worker would) until the queue is idle, or time out."""
    sweeper = Dispatcher(connect(url), "sweeper", fake_run_job, worker_queue=WorkerQueueOwner("sweeper"))
    deadline = time.monotonic() + timeout_s
    while True:
        await sweeper.reap()
        stats = await read_stats(sweeper.client)
        if all(v == 0 for v in stats.gauges().values()) or time.monotonic() > deadline:
            return stats
        await asyncio.sleep(0.2)


def read_line(proc: subprocess.Popen, timeout_s: float) -> str:
    ready, _, _ = select.select([proc.stdout], [], [], timeout_s)
    assert ready, f"worker {proc.pid} said nothing within {timeout_s} s"
    return proc.stdout.readline().decode().strip()


def spawn(url: str, name: str, seed: int, batch_max: int = 1) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, str(PROC), "--url", url, "--worker", name, "--seed", str(seed),
                             "--max-requests", "7",  # below the 9 clients of 3 workers: some refusals
                             "--batch-max", str(batch_max)],
                            stdout=subprocess.PIPE, cwd=REPO, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert read_line(proc, 30) == "ready"
    return proc


@pytest.mark.slow
@pytest.mark.parametrize("batch_max", [1, 4], ids=["one-job-leases", "batch-leases"])
def test_sigkilled_replicas_leave_no_hung_request_and_no_leaked_slot(redis_server, batch_max):
    rng = random.Random(11)
    workers = {f"w{i}": spawn(redis_server.url, f"w{i}", i, batch_max) for i in range(3)}
    killed = 0
    try:
        # Under load, kill a random worker at a random point every ~0.7-1.4 s and replace it.
        for generation in range(3, 8):
            time.sleep(rng.uniform(0.7, 1.4))
            victim = rng.choice(sorted(workers))
            workers.pop(victim).send_signal(signal.SIGKILL)
            killed += 1
            workers[f"w{generation}"] = spawn(redis_server.url, f"w{generation}", generation, batch_max)
        time.sleep(1.0)
        for proc in workers.values():  # survivors: stop their clients, keep their replicas serving
            proc.send_signal(signal.SIGTERM)
        outcomes: Counter[str] = Counter()
        for proc in workers.values():
            outcomes.update(json.loads(read_line(proc, 40)))
        for proc in workers.values():
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=20) == 0
    finally:
        for proc in workers.values():
            if proc.poll() is None:
                proc.kill()

    assert outcomes["hung"] == 0, outcomes
    assert outcomes["ok"] >= 20 and outcomes["refused"] >= 1, outcomes  # the load was real, past the bound
    assert outcomes.get("unavailable", 0) == 0, outcomes

    stats = asyncio.run(settle(redis_server.url, timeout_s=10))
    assert stats.gauges() == {g: 0 for g in GAUGES}, stats
    assert stats.consistent(), stats
    assert every_slot_freed_once(stats), stats
    assert stats["expired_total"] >= 1, stats  # some kills did land mid-job
    if batch_max > 1:
        assert stats["leased_total"] > stats["lease_batches_total"], stats  # some leases took a batch
    print(f"\nSIGKILL x{killed}, batch_max {batch_max}: outcomes {dict(outcomes)}; queue counters {stats.fields}")


def test_redis_crash_and_restart_mid_run_fails_fast_recovers_and_stays_consistent(redis_server):
    async def go():
        rng = random.Random(3)
        admission = AdmissionClient(connect(redis_server.url), "w0", AdmissionBounds(8, 0), worker_queue=WorkerQueueOwner("w0"),
                                    owner_ttl_s=2.0, ms_per_phoneme=MS_PER_PHONEME, poll_s=0.3)
        await admission.start()
        config = DispatcherConfig(lease_s=1.0, reap_interval_s=0.2, idle_wait_s=0.3, retry_backoff_s=0.1)
        replicas = [Dispatcher(connect(redis_server.url), f"r{i}", fake_run_job, config,
                               worker_queue=WorkerQueueOwner(f"r{i}")) for i in range(3)]
        for r in replicas:
            r.start()
        phase = "before"
        outcomes: Counter[tuple[str, str]] = Counter()
        slowest_failure_s = 0.0
        stop = asyncio.Event()

        async def client():
            nonlocal slowest_failure_s
            while not stop.is_set():
                sizes = [rng.randint(5, 40) for _ in range(rng.randint(1, 3))]
                started, seen = time.monotonic(), phase
                try:
                    # The outer bound only detects a hang: the client must never need it.
                    async with asyncio.timeout(20):
                        async with admission.session([ChunkJob(fake_payload(p, p / 1500), p) for p in sizes]) as t:
                            async for _ in admission.results(t, timeout_s=RESULT_TIMEOUT_S):
                                pass
                    outcomes[seen, "ok"] += 1
                except Refused:
                    outcomes[seen, "refused"] += 1
                    await asyncio.sleep(0.05)
                except (QueueUnavailable, RequestFailed) as e:
                    # Refused fast, or the request vanished with Redis's data: either way promptly.
                    if phase != "before" and not isinstance(e, ResultTimeout):
                        slowest_failure_s = max(slowest_failure_s, time.monotonic() - max(started, crash_at))
                    outcomes[seen, type(e).__name__] += 1
                    await asyncio.sleep(0.05)

        crash_at = float("inf")
        clients = [asyncio.create_task(client()) for _ in range(4)]
        await asyncio.sleep(1.5)
        redis_server.stop()
        crash_at, phase = time.monotonic(), "down"
        await asyncio.sleep(1.0)  # the clients keep trying while Redis is down
        noticed_by = time.monotonic() + 60  # each notices within its poll; a loaded machine is slower
        while not (all(r.degraded for r in replicas) and admission.degraded) and time.monotonic() < noticed_by:
            await asyncio.sleep(0.05)
        assert all(r.degraded for r in replicas) and admission.degraded
        redis_server.start()
        phase = "after"
        await asyncio.sleep(2.0)
        stop.set()
        await asyncio.gather(*clients)

        assert not any(kind == "ResultTimeout" for _, kind in outcomes), outcomes
        assert outcomes["before", "ok"] > 0 and outcomes["after", "ok"] > 0, outcomes
        assert outcomes["down", "QueueUnavailable"] > 0, outcomes
        # Failing fast: well before the result timeout a request would otherwise wait out.
        assert slowest_failure_s < 0.5 * RESULT_TIMEOUT_S, (slowest_failure_s, outcomes)
        assert not any(r.degraded for r in replicas) and not admission.degraded

        stats = await settle(redis_server.url, timeout_s=5)
        assert stats.gauges() == {g: 0 for g in GAUGES}, stats
        assert stats.consistent() and every_slot_freed_once(stats), stats
        for r in replicas:
            await r.close()
        await admission.close()
    asyncio.run(go())
