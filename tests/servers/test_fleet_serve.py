"""The fleet as users meet it: `kokoro-fleet serve --workers 2` (tiny weights) on a real
redis-server this test owns, driven over HTTP by the load generator (loadtest.runner) and hey.

One fleet for the module; the tests run in file order, the destructive ones (Redis restart,
SIGKILL of a worker) last. Every test prints the figures it measured. Each is marked slow: the
fleet takes ~30 s to load on this CPU, and the load steps run for tens of seconds. The fleet is
warmed up before the first test, so a cold machine's first-time work is never in a measurement.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from loadtest.dispatch import FleetProcess
from loadtest.runner import Runner, Step, Target, Workload, summarize
from loadtest.texts import load_texts
from api.speech.redis_link import GAUGES, connect, read_replicas, read_stats

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
WORKERS = 2
SHORT = load_texts("short")
PARAGRAPHS = load_texts("paragraphs")


@pytest.fixture(scope="module")
def redis(tmp_path_factory):
    from redis_server import RedisServer

    server = RedisServer().start()
    yield server
    server.close()


@pytest.fixture(scope="module")
def fleet(redis, tmp_path_factory):
    env = {
        "KOKORO_THREADS": "1",             # one core per replica: 2 replicas on this 2-core machine
        "KOKORO_LEASE_SECONDS": "3",       # a killed replica's jobs come back within a few seconds
        "KOKORO_CHUNK_TIMEOUT_SECONDS": "90",
        "KOKORO_DRAIN_SECONDS": "5",
    }
    f = FleetProcess(WORKERS, redis_url=redis.url, env=env, log_dir=tmp_path_factory.mktemp("fleet"), name="fleet")
    # First-time work (kernels compiled at the chunk sizes the tests send) before any test measures:
    # on an empty compile cache it would stall a replica in the middle of a load step. Minutes on a
    # busy 2-core machine whose cache is empty.
    f.start(ready_timeout=900, warm_up=PARAGRAPHS[:1] + SHORT[:6])
    print(f"\nfleet warmed up in {f.warmed_up_s:.1f} s")
    yield f
    f.stop()


def run_load(url: str, steps: list[Step], texts: list[str], *, timeout: float = 120.0, warmup: int = 0):
    """Run `steps` against the fleet; (summary, rows) per step."""
    workload = Workload(texts=texts, response_format="pcm", stream=True, timeout=timeout, read_timeout=timeout)

    async def go():
        runner = Runner(workload, steps, progress=False)
        target = Target(url + "/v1/audio/speech", "fleet")
        try:
            await runner.warmup(target, warmup, WORKERS)
            out = []
            for step in steps:
                run = await runner.run_step(step, target)
                out.append((summarize([run]), run.rows))
            return out
        finally:
            await runner.aclose()

    return asyncio.run(go())


async def _stats(url: str):
    client = connect(url)
    try:
        return await read_stats(client), await read_replicas(client)
    finally:
        await client.aclose()


def stats(url: str):
    return asyncio.run(_stats(url))


def settle(url: str, timeout_s: float = 30.0):
    """Wait until the queue is idle (the fleet's reapers free what dead owners left)."""
    deadline = time.monotonic() + timeout_s
    while True:
        s, _ = stats(url)
        if all(s[g] == 0 for g in GAUGES) or time.monotonic() > deadline:
            return s
        time.sleep(0.3)


def every_slot_freed_once(s) -> bool:
    return s["admitted_total"] == s["released_total"] + s["cancelled_total"] + s["orphaned_total"] + s["withdrawn_total"] + s["admitted"]


def health(url: str) -> dict:
    return httpx.get(url + "/health", timeout=5, headers={"Connection": "close"}).json()


def test_a_long_text_fans_out_over_both_replicas_and_status_shows_them(fleet, redis):
    before = {r.replica: r.jobs_done for r in stats(redis.url)[1]}
    response = httpx.post(fleet.url + "/v1/audio/speech", timeout=180, json={
        "model": "kokoro", "voice": "af_heart", "input": " ".join(PARAGRAPHS[:2]), "response_format": "wav",
        "stream": False})
    assert response.status_code == 200 and response.content[:4] == b"RIFF"
    after = {r.replica: r.jobs_done for r in stats(redis.url)[1]}
    did = {name: after[name] - before.get(name, 0) for name in after}
    print("jobs per replica for one non-streamed long text:", did)
    assert len(did) == WORKERS and all(n > 0 for n in did.values()), "both idle replicas should take its chunks"
    out = subprocess.run([sys.executable, "-m", "cli.main", "status", "--redis-url", redis.url, "--json"],
                         capture_output=True, text=True, timeout=60, cwd=ROOT)
    table = json.loads(out.stdout)
    assert sorted(r["replica"] for r in table["replicas"]) == sorted(after)
    assert all(r["engine"].startswith("torch cpu ") for r in table["replicas"]), table
    assert health(fleet.url)["mode"] == "fleet"


def test_no_underrun_with_as_many_long_streams_as_replicas(fleet, redis):
    # The default chunking (60 phonemes, then doubling to 400): each stream's simulated real-time
    # player must never wait more than 100 ms once its first byte arrived. A closed loop of WORKERS
    # users keeps exactly that many streams in the fleet for 15 s.
    ((summary, rows),) = run_load(fleet.url, [Step("closed", WORKERS, 15.0)], PARAGRAPHS, timeout=240)
    ok = [r for r in rows if r.outcome == "ok"]
    print("streams:", [(round(r.audio_s, 1), round(r.ttfa_s, 2), round(r.underrun_s * 1000)) for r in ok],
          "(audio s, TTFA s, underrun ms)")
    assert len(ok) >= WORKERS and len(ok) == len(rows), [r.error for r in rows]
    assert all(r.audio_s > 10 for r in ok)
    assert max(r.underrun_s for r in ok) < 0.100


def test_overload_gives_only_200_and_fast_503_and_keeps_admitted_latency(fleet, redis):
    ((at_capacity, _),) = run_load(fleet.url, [Step("closed", WORKERS, 10.0)], SHORT, warmup=WORKERS)
    capacity = at_capacity["requests_per_s"]
    rss_before = fleet.rss_mib()
    ((over, rows),) = run_load(fleet.url, [Step("open", 4 * capacity, 25.0)], SHORT)
    rss_after = fleet.rss_mib()
    refused = [r for r in rows if r.outcome == "rejected"]
    refused_ms = sorted(r.e2e_s * 1000 for r in refused)
    p95_503 = refused_ms[int(0.95 * (len(refused_ms) - 1))] if refused_ms else None
    print(f"capacity {capacity:.2f} req/s, TTFA p95 at capacity {at_capacity['ttfa_s']['p95']:.3f} s; "
          f"4x overload: {over['ok']} ok, {len(refused)} 503, {over['errors']} errors, admitted TTFA p95 "
          f"{over['ttfa_s']['p95']:.3f} s, 503 latency p50 {refused_ms[len(refused_ms) // 2] if refused_ms else 0:.1f} "
          f"p95 {p95_503 or 0:.1f} max {refused_ms[-1] if refused_ms else 0:.1f} ms; RSS {rss_before:.0f} -> "
          f"{rss_after:.0f} MiB")
    slowest = sorted(refused, key=lambda r: r.e2e_s)[-5:]
    print("slowest 503s (ms, seconds into the step, generator lag ms):",
          [(round(r.e2e_s * 1000, 1), round(r.scheduled_at or 0, 1), round((r.sched_lag_s or 0) * 1000, 1))
           for r in slowest], f"p99 {refused_ms[int(0.99 * (len(refused_ms) - 1))] if refused_ms else 0:.1f} ms")
    assert {r.outcome for r in rows} <= {"ok", "rejected"}, {r.error for r in rows if r.outcome == "error"}
    assert refused, "4x capacity should be refused in part"
    assert all(r.status == 503 and r.retry_after and r.retry_after_ms for r in refused)
    assert p95_503 < 50, "503s must be answered at once"
    assert over["ttfa_s"]["p95"] <= 2 * at_capacity["ttfa_s"]["p95"]
    assert rss_after < rss_before * 1.1 + 50
    s = settle(redis.url)
    assert all(s[g] == 0 for g in GAUGES) and s.consistent() and every_slot_freed_once(s), s.fields


def test_hey_sees_only_200_and_503(fleet):
    if shutil.which("hey") is None:
        pytest.skip("hey is not installed (apt-get install hey)")
    out = subprocess.run(["hey", "-n", "200", "-c", "20", "-t", "120", "-m", "POST", "-T", "application/json",
                          "-D", str(ROOT / "loadtest/bodies/short.json"), fleet.url + "/v1/audio/speech"],
                         capture_output=True, text=True, timeout=600)
    codes = out.stdout.split("Status code distribution:")[-1]
    print(codes.strip())
    seen = {int(line.split("]")[0].strip(" [")) for line in codes.splitlines() if line.strip().startswith("[")}
    assert seen and seen <= {200, 503}, out.stdout[-2000:]
    assert "Error distribution" not in out.stdout, out.stdout[-2000:]


def test_redis_stop_and_restart_mid_load_degrades_then_recovers(fleet, redis):
    import threading

    modes: list[str] = []
    result: dict = {}

    def load():
        result["out"] = run_load(fleet.url, [Step("closed", 3, 16.0)], SHORT, timeout=120)

    t = threading.Thread(target=load)
    t.start()
    time.sleep(4)
    redis.stop()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        modes.append(health(fleet.url).get("mode"))
        time.sleep(0.25)
    redis.start()
    t.join(200)
    assert not t.is_alive(), "a request hung past its timeout"
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and {health(fleet.url).get("mode") for _ in range(6)} != {"fleet"}:
        time.sleep(0.5)
    ((summary, rows),) = result["out"]
    print(f"during the outage /health said {sorted(set(modes))}; load: {summary['ok']} ok, "
          f"{summary['errors']} errors {summary['error_examples']}, {summary['rejected_503']} 503")
    assert "degraded" in modes
    assert {health(fleet.url).get("mode") for _ in range(6)} == {"fleet"}, "the fleet should be back on the queue"
    assert summary["ok"] > 0 and summary["errors"] <= 3  # at most the requests cut by the outage itself
    # Redis restarted empty: whatever ran since must balance.
    s = settle(redis.url)
    assert all(s[g] == 0 for g in GAUGES) and s.consistent() and every_slot_freed_once(s), s.fields


def test_sigkill_of_a_worker_mid_load(fleet, redis):
    import threading

    pids_before = fleet.worker_pids()
    assert len(pids_before) == WORKERS
    result: dict = {}

    def load():
        result["out"] = run_load(fleet.url, [Step("closed", 4, 14.0)], PARAGRAPHS[:3] + SHORT[:3], timeout=150)

    t = threading.Thread(target=load)
    t.start()
    time.sleep(5)
    victim = pids_before[0]
    leased = [r.replica for r in stats(redis.url)[1] if r.busy]
    os.kill(victim, signal.SIGKILL)
    t.join(300)
    assert not t.is_alive(), "a request hung"
    ((summary, rows),) = result["out"]
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        pids = fleet.worker_pids()
        if len(pids) == WORKERS and victim not in pids:
            break
        time.sleep(1)
    fleet.wait_ready(240)
    s = settle(redis.url, 30)
    print(f"killed {victim} (busy replicas then: {leased}); load: {summary['ok']} ok, {summary['errors']} errors "
          f"{summary['error_examples']}; workers now {fleet.worker_pids()}; expired {s['expired_total']}, "
          f"requeued {s['requeued_total']}, orphaned {s['orphaned_total']}, failed {s['failed_total']}")
    assert victim not in fleet.worker_pids() and len(fleet.worker_pids()) == WORKERS, "the worker was not replaced"
    assert summary["ok"] > 0
    assert summary["errors"] <= 4, "only the killed worker's own connections may drop"
    assert s["failed_total"] == 0, "a job leased by the killed replica must finish elsewhere, not fail its request"
    assert all(s[g] == 0 for g in GAUGES) and s.consistent() and every_slot_freed_once(s), s.fields
    # The fleet serves on afterwards.
    ok = httpx.post(fleet.url + "/v1/audio/speech", timeout=120, json={"input": SHORT[0], "voice": "af_heart",
                                                                       "response_format": "pcm", "stream": False})
    assert ok.status_code == 200 and len(ok.content) > 24000
