"""The soak (`python -m loadtest soak`) in CI: a short run against real fleets, and its checks.

The half-hour soak on this CPU is in loadtest/results/ (its README gives the slopes). CI runs 90
seconds of the same mixed load, which is what a short run can honestly show: a leak per request
(a descriptor, a Redis key, a request the queue never frees) shows after the few hundred requests
of the run, and an error shows once; a slow growth of memory cannot be told from warm-up in 90
seconds, so the memory slopes are printed here, not checked.
"""

from __future__ import annotations

import argparse
import asyncio

import pytest

from loadtest import soak


def soak_args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    soak.configure(parser)
    return parser.parse_args(list(argv))


@pytest.mark.slow
def test_a_short_soak_ends_without_errors_request_keys_or_descriptors_left(tmp_path):
    # The torch fleet on the tiny weights: the real engine's code path, at a cost CI can carry.
    args = soak_args("--duration", "90", "--sample-every", "3", "--burst-every", "20", "--real-weights", "tiny",
                     "--log-dir", str(tmp_path))
    result = soak.soak(args)
    print()
    print(soak.report_soak(result))
    for kind, counts in result["by_kind"].items():
        assert counts["error"] == 0, (kind, counts["error_examples"])
        assert counts["ok"] > 0, kind
    assert result["by_kind"]["burst"]["refused"] > 0, "the bursts never passed the admission bound"
    rise = result["metrics_rise"]
    assert rise["http_5xx_not_503"] == 0 and rise["kokoro_fleet_failed_total"] == 0, rise
    assert not result["replaced_processes"] and not result["tracebacks"], (result["replaced_processes"],
                                                                           result["tracebacks"][:1])
    idle = result["idle"]
    assert idle["leftover_keys"] == [] and not any(idle["gauges"].values()), (idle["leftover_keys"], idle["gauges"])
    assert max(idle["fd_growth"].values()) <= args.max_fd_growth, idle["fd_growth"]
    assert result["failures"] == []


def test_the_idle_check_lists_request_keys_and_busy_gauges_but_not_the_fleets_own(redis_server):
    import redis.asyncio as aioredis

    async def scenario():
        client = aioredis.from_url(redis_server.url)
        try:
            await client.hset("{kf}:stats", mapping={"admitted": 0, "queued_jobs": 0, "completed_total": 40})
            await client.hset("{kf}:replica:sim-1", "jobs_done", 3)
            await client.set("{kf}:alive:owner-1", 1)
            await client.zadd("{kf}:replicas", {"sim-1": 1})
            first = await soak.leftover_keys(client)
            await client.hset("{kf}:req:abc", "state", "active")
            await client.rpush("{kf}:wake:abc", 1)
            await client.hset("{kf}:stats", "admitted", 1)
            second = await soak.leftover_keys(client)
        finally:
            await client.aclose()
        return first, second

    (clean, gauges), (left, busy) = asyncio.run(scenario())
    assert clean == [] and not any(gauges.values())
    assert left == ["{kf}:req:abc", "{kf}:wake:abc"]
    assert busy["admitted"] == 1


def test_a_steady_rise_fails_with_fail_on_leak_and_a_flat_noisy_series_does_not():
    flat = [(t, 500 + (3 if t % 10 else -3)) for t in range(0, 1800, 5)]
    rising = [(t, 500 + t / 60 * 10) for t in range(0, 1800, 5)]  # 10 MiB a minute
    assert abs(soak.slope_per_minute(flat)) < 0.1
    assert soak.slope_per_minute(rising) == pytest.approx(10.0)

    def result_with(points):
        samples = [{"t_s": t, "phase": "load", "rss_mib": {"sim/worker:1": v}, "fds": {"sim/worker:1": 50},
                    "redis": {"used_memory_mib": 2.0, "keys": 8}} for t, v in points]
        return {"by_kind": {k: {"ok": 1, "refused": int(k == "burst"), "error": 0, "error_examples": []}
                            for k in soak.KINDS},
                "metrics_rise": {}, "replaced_processes": [], "tracebacks": [],
                "idle": {"leftover_keys": [], "gauges": {}, "fd_growth": {"sim/worker:1": 0}},
                "slopes": soak.slopes_after_warmup(samples, 1800)}

    args = soak_args("--fail-on-leak")
    assert soak.soak_failures(args, result_with(flat)) == []
    failures = soak.soak_failures(args, result_with(rising))
    assert len(failures) == 1 and "rss_mib sim/worker:1" in failures[0]
    assert soak.soak_failures(soak_args(), result_with(rising)) == []  # without --fail-on-leak: printed, not failed
