"""Fleets at GPU-like rates on the simulated engine (KOKORO_ENGINE=sim), with real processes:
two `kokoro-fleet serve` fleets sharing one external redis-server, and one fleet of 8 pushed to
4x its capacity. Both drive the scenarios of `python -m loadtest.scenarios` (which prints the same
figures for docs/performance.md) and print what they measured.

The timing bounds of the issue (503s answered within 50 ms at p99, no player waiting 100 ms) are
checked when the machine had room to measure them: a separate probe process sleeps 10 ms at a time
through the load step, and when its p99 wake-up is more than 10 ms late, every process on the box
(server, generator, other people's jobs) was waiting for a core, so a 50 ms figure says more about
the machine than about the server; the test then reports the figures as an expected failure
instead of failing. Everything else (status codes, headers, memory, who ran the jobs) is checked
unconditionally.
"""

from __future__ import annotations

import argparse

import pytest

from loadtest import scenarios

pytestmark = pytest.mark.slow

# A probe's 10 ms sleep waking this much later at p99 means the cores were all taken.
BUSY_MACHINE_PROBE_P99_S = 0.010


def run(*argv: str) -> tuple[argparse.Namespace, dict]:
    """Run `python -m loadtest.scenarios ARGV` in this process; print its report as the CLI does."""
    args = scenarios.build_parser().parse_args([*argv, "--quiet"])
    two = args.command == "two-fleets"
    result = (scenarios.two_fleets if two else scenarios.overload)(args)
    print()
    print((scenarios.report_two_fleets if two else scenarios.report_overload)(result))
    return args, result


def test_two_fleets_on_one_redis_share_the_work_like_one_fleet_of_their_combined_size(tmp_path):
    args, result = run("two-fleets", "--workers", "2", "--duration", "20", "--rounds", "2", "--calibrate", "8",
                       "--log-dir", str(tmp_path))
    s = result["summaries"]
    assert s["two-fleets"]["errors"] == 0 and s["one-fleet"]["errors"] == 0, \
        (s["two-fleets"]["error_examples"], s["one-fleet"]["error_examples"])
    assert s["two-fleets"]["ok"] > 50 and s["one-fleet"]["ok"] > 50
    # At 80% of the combined capacity, fleet A's own replicas can carry at most 50 of the 80: the
    # rest (37.5% of the jobs) must be B's, whose server received no request at all.
    assert len(result["jobs_per_replica"]["B"]) == args.workers
    assert result["share_of_jobs_run_by_B"] >= 0.25, result["jobs_per_replica"]
    # The admission bound follows the live replicas of both fleets: refusals no more frequent than
    # the one big fleet's (with A's own bound alone, A would refuse at half the load).
    assert s["two-fleets"]["rejection_rate"] <= s["one-fleet"]["rejection_rate"] + 0.05
    # And first audio as fast as from one fleet of the combined size, measured in the same run.
    p95 = result["p95_ttfa_s"]
    assert p95["two-fleets"] <= 1.5 * p95["one-fleet"] + 0.050, p95


def test_four_times_capacity_gives_only_200_and_fast_503_with_flat_memory_and_no_underrun(tmp_path):
    _, result = run("overload", "--workers", "8", "--factor", "4", "--duration", "30", "--capacity-seconds", "10",
                    "--log-dir", str(tmp_path))
    checks = result["checks"]
    assert checks["only 200 and 503"], result["statuses"]
    assert result["refused"] > 0 and result["ok"] > 0
    assert checks[f"every 503 has Retry-After <= {scenarios.MAX_RETRY_AFTER_S} s and retry-after-ms"]
    assert checks["memory flat"], {k: v for k, v in result["rss"].items() if k != "series"}
    timed = {name: ok for name, ok in checks.items() if name.startswith(("503 p99", "at capacity"))}
    assert len(timed) == 2
    probe = max(result["probe_late_s"]["capacity"]["p99"], result["probe_late_s"]["overload"]["p99"])
    if not all(timed.values()) and probe > BUSY_MACHINE_PROBE_P99_S:
        pytest.xfail(f"timing bounds missed while the machine was busy (probe woke {probe * 1000:.0f} ms late at "
                     f"p99): 503 p99 {result['refused_latency_s']['p99'] * 1000:.0f} ms, longest player wait "
                     f"{(result['capacity_underrun_s']['max'] or 0) * 1000:.0f} ms")
    assert all(timed.values()), (timed, result["refused_latency_s"], result["capacity_underrun_s"])
