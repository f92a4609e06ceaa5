"""`python -m loadtest selftest`: how much the generator itself adds to the TTFA it reports.

Starts `loadtest.stub` in its own process (so the two event loops do not share a GIL), drives it
in closed loop at the concurrency asked for, then reads the stub's log: for every stream, the
time the generator saw the first audio minus the time the stub wrote it, on the one monotonic
clock of the machine (time.perf_counter is CLOCK_MONOTONIC on Linux). That difference is the
instrument's error: the event-loop and httpx time between the bytes reaching the socket and the
generator's clock read. Also prints the load actually held (mean and max requests in flight).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import re
import subprocess
import sys
from typing import Any, Iterator

import httpx
import numpy as np

from loadtest.runner import Runner, Step, Target, Workload, summarize


@contextlib.contextmanager
def stub_process(*stub_args: str) -> Iterator[str]:
    """`python -m loadtest.stub` on a free port in a child process; yields its base URL."""
    proc = subprocess.Popen([sys.executable, "-m", "loadtest.stub", "--port", "0", *stub_args],
                            stdout=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline() if proc.stdout else ""
        found = re.search(r"(http://\S+)", line)
        if not found:
            raise RuntimeError(f"stub did not start: {line!r}")
        yield found.group(1)
    finally:
        proc.terminate()
        proc.wait(10)


def measure_overhead(concurrency: int = 64, duration: float = 10.0, first_byte_delay: float = 0.1,
                     audio_seconds: float = 1.0, chunk_seconds: float = 0.1, chunk_gap: float = 0.05,
                     jitter: float = 0.05, progress: bool = False) -> dict[str, Any]:
    """Run the generator against a stub process and return its error figures (milliseconds)."""
    with stub_process("--first-byte-delay", str(first_byte_delay), "--audio-seconds", str(audio_seconds),
                      "--chunk-seconds", str(chunk_seconds), "--chunk-gap", str(chunk_gap),
                      "--jitter", str(jitter)) as url:
        step = Step("closed", concurrency, duration)

        async def go():
            runner = Runner(Workload(texts=["stub"]), [step], progress=progress)
            try:
                await runner.warmup(Target(url + "/v1/audio/speech", "stub"), concurrency, concurrency)
                return await runner.run_step(step, Target(url + "/v1/audio/speech", "stub"))
            finally:
                await runner.aclose()

        run = asyncio.run(go())
        log = httpx.get(url + "/stub/log", trust_env=False).json()
    s = summarize([run])
    ok = [r for r in run.rows if r.outcome == "ok"]
    events = log["events"]
    recv = np.array([events[r.request_id]["recv"] for r in ok])
    wrote = np.array([events[r.request_id]["first_audio"] for r in ok])
    sent = np.array([r.t_send for r in ok])
    seen = np.array([r.t_first_audio for r in ok])
    ttfa = np.array([r.ttfa_s for r in ok])

    def q(a: np.ndarray) -> dict[str, float]:
        a = a * 1000
        return {"p50": float(np.percentile(a, 50)), "p95": float(np.percentile(a, 95)),
                "p99": float(np.percentile(a, 99)), "min": float(a.min()), "max": float(a.max())} if len(a) else {}

    return {
        "concurrency": concurrency, "duration_s": duration, "streams": len(ok), "errors": s["errors"],
        "mean_in_flight": s["mean_in_flight"], "max_in_flight": run.max_in_flight,
        "stub_max_in_flight": log["max_in_flight"], "stub_connections": log["connections"],
        # reported TTFA minus the TTFA the stub produced (request received -> first audio written):
        # everything the generator added, on its way out and on its way back
        "ttfa_error_ms": q(ttfa - (wrote - recv)),
        "send_lag_ms": q(recv - sent),  # the request left (clock start) -> the stub had read it
        "prep_ms": q(np.array([r.prep_s for r in ok])),  # httpx building the request: excluded from TTFA
        "receive_lag_ms": q(seen - wrote),  # the stub wrote the first audio -> the generator's clock read
        "ttfa_minus_delay_ms": q(ttfa - first_byte_delay),  # adds the stub's own lag (and its jitter)
    }


def format_overhead(m: dict[str, Any]) -> str:
    def line(name: str, d: dict[str, float]) -> str:
        return (f"  {name:<52} p50 {d['p50']:7.2f}  p95 {d['p95']:7.2f}  p99 {d['p99']:7.2f}  "
                f"max {d['max']:7.2f} ms")

    return "\n".join([
        f"c={m['concurrency']}: {m['streams']} streams in {m['duration_s']:g} s, {m['errors']} errors, "
        f"in flight mean {m['mean_in_flight']:.1f} max {m['max_in_flight']} (stub saw {m['stub_max_in_flight']}, "
        f"{m['stub_connections']} connections)",
        line("TTFA error (reported - what the stub produced)", m["ttfa_error_ms"]),
        line("  of which: send -> stub received the request", m["send_lag_ms"]),
        line("  of which: stub wrote first audio -> generator saw it", m["receive_lag_ms"]),
        line("reported TTFA - configured delay (adds stub's lag)", m["ttfa_minus_delay_ms"]),
        line("(not in TTFA) httpx building each request", m["prep_ms"]),
    ])


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("--concurrency", default="64", help="comma-separated concurrencies (default 64)")
    p.add_argument("--duration", type=float, default=10.0)
    p.add_argument("--first-byte-delay", type=float, default=0.1)
    p.add_argument("--chunk-gap", type=float, default=0.05)
    p.add_argument("--audio-seconds", type=float, default=1.0)
    p.add_argument("--jitter", type=float, default=0.05,
                   help="the stub's first-byte delay varies by +- this (0: all clients in lockstep, the worst case)")


def run(args: argparse.Namespace) -> int:
    for c in (int(v) for v in args.concurrency.split(",")):
        m = measure_overhead(c, args.duration, first_byte_delay=args.first_byte_delay,
                             audio_seconds=args.audio_seconds, chunk_gap=args.chunk_gap, jitter=args.jitter)
        print(format_overhead(m), flush=True)
    return 0
