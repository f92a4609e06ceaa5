"""Shared-queue dispatch against blind assignment, measured side by side in one run.

    python -m loadtest.dispatch [--workers 2] [--load 0.8] [--duration 60] [--rounds 2]
                                [--texts short] [--weights tiny] [--connections reuse|close]
                                [--engine torch|sim] [--sim-slowdown 1]
                                [--out RESULT.json] [--plot TTFA.png]

Starts two copies of the same fleet (`kokoro-fleet serve --workers N`, each with its own embedded
Redis): one with `--dispatch shared` (any free replica runs the earliest-deadline chunk of any
request) and one with `--dispatch local` (each worker runs only the requests whose connection it
accepted). It measures the shared fleet's capacity (closed loop, as many users as replicas), then
offers both the same seeded Poisson arrivals at `--load` of that capacity, interleaved in rounds
(ABBA, so machine noise hits both alike), and prints p50/p95 time to first audio of each and the
ratio local / shared (the goal: >= 3x at 80 % load).

Where a request lands under blind assignment is not ours to choose: Uvicorn's workers share one
listening socket, so the kernel decides which worker accepts a connection, and a client that
keeps connections alive keeps sending to the same worker. `--connections reuse` (the default)
keeps them alive as the load generator and most HTTP clients do; `--connections close` opens a
new one per request (the kernel's accept distribution). The per-replica job counts printed at the
end show how the work was actually spread.

`--engine sim` serves both fleets with the simulated engine (worker/sim_engine.py: replicas that
sleep an assumed GPU time per chunk and use no CPU meanwhile), so 8 replicas are 8 independent
servers even on a 2-core machine. `--sim-slowdown N` multiplies its per-chunk cost (both terms) by N:
at the H100 assumption the fleet would serve thousands of audio-seconds per second, more than a
2-core front end can stream, and then the CPU, not the replicas, would be the queue being measured.
The slowdown is not neutral: a chunk's deadline is in audio time (queue/admit.lua), so the slower a
replica is against real time, the sooner an older request's later chunks fall due before a new
request's first chunk, and the more a worker's own queue behaves like first come, first served.
`python -m loadtest.queueing` models the scheduling at any cost, to put a run beside the ratio it
predicts at the real cost.

`FleetProcess` (a `kokoro-fleet serve` process tree that a test or script owns) is used by
tests/servers/test_fleet_serve.py too.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

from api.ports import free_port
from api.state import parse_api_keys
from loadtest import listener_metrics as metrics
from loadtest.report import format_summary_table
from loadtest.runner import Runner, Step, StepRun, Target, Workload, summarize
from loadtest.texts import load_texts

REPO = Path(__file__).resolve().parents[1]


class FleetProcess:
    """`kokoro-fleet serve` on a free loopback port, as its own process group, with its log kept."""

    def __init__(self, workers: int = 2, *, dispatch: str = "shared", weights: str = "tiny",
                 redis_url: str | None = None, baseline: bool = False, env: dict[str, str] | None = None,
                 log_dir: str | Path | None = None, name: str = "fleet", engine: str | None = None,
                 host: str = "127.0.0.1", launch: list[str] | None = None):
        """engine: `--engine` of serve (`sim`: the simulated engine, worker/sim_engine.py); None: the
        environment's KOKORO_ENGINE, else the real model. host, launch: another host's address and the
        command that runs a process there (loadtest/hosts.py: `ip netns exec NAME`)."""
        self.workers = 1 if baseline else workers
        self.port = free_port()
        self.url = f"http://{host}:{self.port}"
        self.name = name
        self.args = [*(launch or []), sys.executable, "-m", "cli.main", "serve", "--host", host,
                     "--port", str(self.port), "--weights", weights]
        self.args += ["--baseline"] if baseline else ["--workers", str(workers), "--dispatch", dispatch]
        if redis_url:
            self.args += ["--redis-url", redis_url]
        if engine:
            self.args += ["--engine", engine]
        # No synthesis cache unless asked for: a load test replays a few texts, and a replica that
        # answers them from its cache measures the cache, not the engine or the scheduling.
        self.env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONUNBUFFERED": "1",
                    "KOKORO_SYNTHESIS_CACHE_MIB": "0", **(env or {})}
        if not redis_url:
            self.env.pop("REDIS_URL", None)
        self.log_path = Path(log_dir or tempfile.mkdtemp(prefix="kokoro-fleet-")) / f"{name}.log"
        # a keyed fleet's /health names its worker and kernels only to a request with a key
        keys = parse_api_keys(self.env.get("KOKORO_API_KEYS", ""))
        self.probe_headers = {"Connection": "close", **({"Authorization": f"Bearer {keys[0][1]}"} if keys else {})}
        self.proc: subprocess.Popen | None = None
        self.warmed_up_s: float | None = None

    def start(self, ready_timeout: float = 240.0, warm_up: list[str] | None = None) -> "FleetProcess":
        """Start and wait until every worker is ready, then `warm_up` with these texts if given
        (`warmed_up_s` says how long that took). A fleet that fails either is stopped, not left behind."""
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(self.args, cwd=REPO, env=self.env, stdout=self._log, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        try:
            self.wait_ready(ready_timeout)
            if warm_up:
                self.warmed_up_s = self.warm_up(warm_up)
        except BaseException:
            self.stop()
            raise
        return self

    def wait_ready(self, timeout: float) -> None:
        """Until every worker says ready: probes on fresh connections until N distinct workers
        answered ready (each fleet worker names itself in /health)."""
        deadline = time.monotonic() + timeout
        ready: set[str] = set()
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}:\n{self.log()}")
            try:
                health = httpx.get(self.url + "/health", timeout=5, headers=self.probe_headers).json()
                if health.get("ready"):
                    ready.add(health.get("worker", "single"))
                    if len(ready) >= self.workers:
                        return
            except (httpx.HTTPError, ValueError):
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.name}: {len(ready)} of {self.workers} workers ready after {timeout} s:\n"
                                   f"{self.log()}")
            time.sleep(0.05)

    def warm_up(self, texts: list[str], timeout: float = 900.0) -> float:
        """Pay a fresh fleet's first-time work before anything is measured on it; the seconds it took.

        First every worker's compiled kernels: a worker that answers while it compiles its fused
        CPU kernels (issue 48) says `"kernels_compiling": true` in /health until it switches to them
        (or serves on eagerly after a failed compile, which it says too: `kernels_error`). Then each of `texts` spoken once,
        `workers` at a time, so every worker has run chunks of the sizes a test sends: a fused
        kernel met at a new size class compiles again, tens of seconds on a small CPU whose compile
        cache is empty, and a load step that pays for it measures the compile, not the fleet."""
        start = time.monotonic()
        deadline = start + timeout
        compiling: dict[str, bool] = {}
        while len(compiling) < self.workers or any(compiling.values()):
            if time.monotonic() > deadline:
                print(f"{self.name}: workers still compiling after {timeout:.0f} s: {compiling}", file=sys.stderr)
                break
            try:
                health = httpx.get(self.url + "/health", timeout=5, headers=self.probe_headers).json()
                compiling[health.get("worker", "single")] = bool(health.get("kernels_compiling"))
            except (httpx.HTTPError, ValueError):
                pass
            time.sleep(0.2)

        def speak(text: str) -> None:
            """`text` spoken to its end: again after a 503 (its retry-after-ms) or a failure (a chunk
            that timed out behind a long compile), until the deadline."""
            body = {"model": "kokoro", "voice": "af_heart", "input": text, "response_format": "pcm", "stream": True}
            while True:
                left = max(1.0, deadline - time.monotonic())
                try:
                    with httpx.stream("POST", self.url + "/v1/audio/speech", json=body, timeout=left) as response:
                        response.read()
                    if response.status_code == 200:
                        return
                    failure, pause = f"{response.status_code}: {response.text[:300]}", 1.0
                    if 400 <= response.status_code < 500 and response.status_code != 429:
                        raise RuntimeError(f"{self.name}: a warm-up request was refused ({failure})")
                    if response.status_code == 503:
                        pause = int(response.headers.get("retry-after-ms", "200")) / 1000
                except httpx.HTTPError as error:
                    failure, pause = f"{type(error).__name__}: {error}", 1.0
                if time.monotonic() + pause > deadline:
                    raise RuntimeError(f"{self.name}: a warm-up request failed until the deadline ({failure})")
                time.sleep(pause)

        with ThreadPoolExecutor(self.workers) as pool:
            list(pool.map(speak, texts))
        return time.monotonic() - start

    def worker_pids(self) -> list[int]:
        """The Uvicorn worker processes (children of the launcher running the app)."""
        pids = []
        for pid in _children(self.proc.pid):
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                continue
            if b"spawn_main" in cmdline and b"resource_tracker" not in cmdline:
                pids.append(pid)
        return sorted(pids) if pids else ([self.proc.pid] if self.workers == 1 else [])

    def rss_mib(self) -> float:
        """Resident memory of the launcher and all its descendants (Redis included)."""
        total = 0
        for pid in process_tree(self.proc.pid):
            try:
                for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1])
            except OSError:
                continue
        return total / 1024

    def cpu_seconds(self) -> float:
        """CPU seconds (user + system) used so far by the launcher and its live descendants (Redis
        included): the front end's cost, since a simulated replica's waits use none."""
        ticks = 0
        for pid in process_tree(self.proc.pid):
            try:
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
                ticks += int(fields[11]) + int(fields[12])  # utime, stime
            except (OSError, IndexError, ValueError):
                continue
        return ticks / os.sysconf("SC_CLK_TCK")

    def redis_url(self) -> str | None:
        """The embedded Redis's URL, as the launcher logged it."""
        m = re.search(r"embedded redis-server at (redis://\S+)", self.log_path.read_text(errors="replace"))
        return m.group(1) if m else None

    def log(self, tail: int = 8000) -> str:
        return self.log_path.read_text(errors="replace")[-tail:]

    def stop(self, timeout: float = 60.0) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        self._log.close()
        return self.proc.returncode

    def __enter__(self) -> "FleetProcess":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def start_all(fleets: list[FleetProcess], timeout_s: float = 300.0) -> None:
    """Start every fleet, then wait for each: their start-ups (model loads) overlap."""
    for f in fleets:
        f._log = open(f.log_path, "wb")
        f.proc = subprocess.Popen(f.args, cwd=REPO, env=f.env, stdout=f._log, stderr=subprocess.STDOUT,
                                  start_new_session=True)
    for f in fleets:
        f.wait_ready(timeout_s)


def stop_all(fleets: list[FleetProcess]) -> None:
    for f in fleets:
        if f.proc is not None:
            f.stop()


def write_result(result: dict[str, Any], path: str | Path) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(result, indent=2, default=str) + "\n")
    print(f"result: {path}")


def _children(pid: int) -> list[int]:
    out = []
    try:
        for task in Path(f"/proc/{pid}/task").iterdir():
            out += [int(x) for x in (task / "children").read_text().split()]
    except OSError:
        pass
    return out


def process_tree(pid: int) -> list[int]:
    """pid and all its descendants (Linux /proc)."""
    out, todo = [pid], [pid]
    while todo:
        kids = _children(todo.pop())
        out += kids
        todo += kids
    return out


async def replica_jobs(redis_url: str | None) -> dict[str, int]:
    """Jobs done per replica, read from the fleet's Redis (every prefix: shared and per-worker)."""
    if not redis_url:
        return {}
    from api.speech.redis_link import connect

    client = connect(redis_url)
    try:
        jobs = {}
        async for key in client.scan_iter(match="{kf}*:replica:*"):
            name = key.decode().rsplit(":replica:", 1)[1]
            jobs[name] = int(await client.hget(key, "jobs_done") or 0)
        return jobs
    finally:
        await client.aclose()


async def result_traffic(redis_url: str | None) -> dict[str, float]:
    """How the shared fleet's results travelled: handed over in memory (the owner's own replica ran
    the job) or as PCM through Redis."""
    if not redis_url:
        return {}
    from api.speech.redis_link import connect, read_stats

    client = connect(redis_url)
    try:
        stats = await read_stats(client)
    finally:
        await client.aclose()
    return {k: stats[k] for k in ("completed_total", "local_total", "result_bytes_total")}


async def measure(args: argparse.Namespace, shared: FleetProcess, local: FleetProcess) -> dict[str, Any]:
    texts = load_texts(args.texts)
    headers = {"Connection": "close"} if args.connections == "close" else {}
    workload = Workload(texts=texts, response_format="pcm", stream=True, timeout=args.timeout,
                        max_outstanding=args.max_outstanding, seed=args.seed)
    a = Target(shared.url + "/v1/audio/speech", "shared", dict(headers))
    b = Target(local.url + "/v1/audio/speech", "local", dict(headers))
    calib = Step("closed", args.workers, args.calibrate)
    runner = Runner(workload, [calib, Step("open", 1.0, args.duration)], progress=not args.quiet)
    try:
        cap = await warm_then_capacity(runner, (a, b), calib, a, "loadtest.dispatch: the shared fleet")
        capacity = cap["requests_per_s"]
        rate = args.load * capacity
        print(f"capacity (closed loop, {args.workers} users): {capacity:.2f} requests/s, "
              f"p50 E2E {cap['e2e_s']['p50']:.3f} s; offering {rate:.2f} requests/s ({args.load:.0%})", flush=True)
        step = Step("open", rate, args.duration)
        runs: dict[str, list] = {"shared": [], "local": []}
        fleets = {"shared": shared, "local": local}
        cpu = {"shared": 0.0, "local": 0.0}
        rounds = max(1, args.rounds)
        for r, t in interleaved(rounds, a, b):
            before = fleets[t.label].cpu_seconds()
            runs[t.label].append(await runner.run_step(step, t, duration=args.duration / rounds, text_offset=r * 1000))
            cpu[t.label] += fleets[t.label].cpu_seconds() - before
    finally:
        await runner.aclose()
    jobs = {"shared": await replica_jobs(shared.redis_url()), "local": await replica_jobs(local.redis_url())}
    return {"capacity_requests_per_s": capacity, "offered_rate_per_s": rate, "load": args.load,
            "workers": args.workers, "connections": args.connections, "texts": args.texts,
            "engine": args.engine, **({"sim_cost_ms": sim_cost_ms(args)} if args.engine == "sim" else {}),
            **side_by_side(runs, args.max_outstanding), "replica_jobs": jobs,
            "shared_result_traffic": await result_traffic(shared.redis_url()),
            "fleet_cpu_seconds": cpu, "cpu_cores": os.cpu_count()}


async def warm_then_capacity(runner: Runner, targets, step: Step, on: Target, what: str) -> dict[str, Any]:
    """Warm every target up (two requests per user of `step`), then hold the closed-loop `step` on
    `on`: its summary, whose requests/s is the capacity the open-loop steps are offered a share of."""
    users = int(step.value)
    for t in targets:
        await runner.warmup(t, 2 * users, users)
    cap = summarize([await runner.run_step(step, on)])
    if cap["requests_per_s"] <= 0:
        raise SystemExit(f"{what} completed nothing in {step.duration:g} s: {cap['error_examples']}")
    return cap


def interleaved(rounds: int, a: Target, b: Target) -> list[tuple[int, Target]]:
    """(round, target) in ABBA order, so drift over the run hits both alike."""
    return [(r, t) for r in range(rounds) for t in ((a, b) if r % 2 == 0 else (b, a))]


def side_by_side(runs: dict[str, list[StepRun]], max_outstanding: int | None = None) -> dict[str, Any]:
    """Both sides' summaries, their TTFA samples (sorted, successful requests), p95s and the ratio."""
    summaries = {label: summarize(rs) for label, rs in runs.items()}
    for s in summaries.values():
        s["max_outstanding"] = max_outstanding
    ttfa = {label: sorted(r.ttfa_s for run in rs for r in run.rows
                          if r.phase == "measure" and r.outcome == "ok" and r.ttfa_s is not None)
            for label, rs in runs.items()}
    p95 = {k: s["ttfa_s"]["p95"] for k, s in summaries.items()}
    return {"summaries": summaries, "p95_ttfa_s": p95, "ttfa_s": ttfa,
            "ratio_local_over_shared": metrics.ratio(p95["local"], p95["shared"])}


def report(result: dict[str, Any]) -> str:
    s = result["summaries"]
    lines = [format_summary_table([s["shared"], s["local"]]), ""]
    for label in ("shared", "local"):
        t = s[label]["ttfa_s"]
        lines.append(f"{label:>6}: TTFA p50 {_ms(t['p50'])}  p95 {_ms(t['p95'])}  p99 {_ms(t['p99'])}  "
                     f"ok {s[label]['ok']}  503 {s[label]['rejected_503']}  errors {s[label]['errors']}  "
                     f"jobs per replica {sorted(result['replica_jobs'][label].values(), reverse=True)}")
    traffic = result.get("shared_result_traffic")
    if traffic and traffic.get("completed_total"):
        lines.append(f"shared: {traffic['local_total']:.0f} of {traffic['completed_total']:.0f} chunk results handed "
                     f"over in memory (own replica), {traffic['result_bytes_total'] / 1e6:.1f} MB of PCM through Redis")
    if result.get("fleet_cpu_seconds"):
        lines.append("server CPU while measuring (all processes of the fleet, Redis included): " + ", ".join(
            f"{label} {cpu:.0f} s ({cpu / s[label]['wall_s'] / (result.get('cpu_cores') or 1):.0%} of "
            f"{result.get('cpu_cores')} cores)" for label, cpu in result["fleet_cpu_seconds"].items()))
    ratio = result["ratio_local_over_shared"]
    lines.append(f"p95 TTFA local / shared = {'-' if ratio is None else f'{ratio:.2f}x'} "
                 f"(target >= 3x) at {result['load']:.0%} of {result['capacity_requests_per_s']:.2f} requests/s, "
                 f"{result['workers']} workers, connections {result['connections']}{_engine_note(result)}")
    return "\n".join(lines)


def _engine_note(result: dict[str, Any]) -> str:
    cost = result.get("sim_cost_ms")
    if result.get("engine") != "sim" or not cost:
        return ""
    return (f", SIMULATED engine ({cost['per_chunk']:g} ms + {cost['per_phoneme']:g} ms x phonemes per chunk, "
            f"{cost['slowdown']:g}x the assumed H100 cost)")


def plot(result: dict[str, Any], path: str | Path) -> Path:
    """The two TTFA distributions as CDFs on one log-time axis, p95 marked: where the tails part."""
    from loadtest.report import _plt, _save, ttfa_cdfs

    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 4.2))
    ttfa_cdfs(ax, [(result["ttfa_s"][label], result["p95_ttfa_s"][label], color, name)
                   for label, color, name in (("shared", "tab:blue", "shared queue"),
                                              ("local", "tab:orange", "blind assignment (local)"))])
    ratio = result["ratio_local_over_shared"]
    ax.set_title(f"{result['workers']} workers, Poisson arrivals at {result['load']:.0%} of capacity, "
                 f"connections {result['connections']}{', sim engine' if result.get('engine') == 'sim' else ''}: "
                 f"p95 ratio {'-' if ratio is None else f'{ratio:.2f}x'}",
                 fontsize=9)
    return _save(fig, path, plt)


def sim_cost_ms(args: argparse.Namespace) -> dict[str, float]:
    """The simulated engine's cost both fleets run with: the settings' (environment or defaults)
    times --sim-slowdown."""
    from api.settings import Settings

    settings = Settings.from_env(only=("sim_chunk_ms", "sim_phoneme_ms"))
    return {"per_chunk": settings.sim_chunk_ms * args.sim_slowdown,
            "per_phoneme": settings.sim_phoneme_ms * args.sim_slowdown, "slowdown": args.sim_slowdown}


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x * 1000:.0f} ms"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m loadtest.dispatch", description=__doc__.splitlines()[0])
    p.add_argument("--workers", type=int, default=2, help="workers (replicas) in each fleet")
    p.add_argument("--load", type=float, default=0.8, help="offered load as a fraction of measured capacity")
    p.add_argument("--duration", type=float, default=60.0, help="seconds of Poisson arrivals per fleet")
    p.add_argument("--rounds", type=int, default=2, help="interleaved slices per fleet (ABBA)")
    p.add_argument("--calibrate", type=float, default=15.0, help="seconds of the capacity measurement")
    p.add_argument("--texts", default="short", help="short | paragraphs | long | FILE")
    p.add_argument("--weights", default="tiny", help="KOKORO_WEIGHTS of both fleets")
    p.add_argument("--connections", choices=["reuse", "close"], default="reuse")
    p.add_argument("--engine", choices=["torch", "sim"], default="torch",
                   help="KOKORO_ENGINE of both fleets (sim: the simulated engine, no model)")
    p.add_argument("--sim-slowdown", type=float, default=1.0,
                   help="with --engine sim: multiply the simulated cost per chunk (KOKORO_SIM_CHUNK_MS, "
                        "KOKORO_SIM_PHONEME_MS) by this, so the replicas, not this machine's CPU, bound capacity")
    p.add_argument("--max-outstanding", type=int, default=256)
    p.add_argument("--timeout", type=float, default=300.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", help="write the result JSON here")
    p.add_argument("--plot", help="draw both TTFA distributions (CDF) into this PNG")
    p.add_argument("--quiet", action="store_true")
    args = p.parse_args(argv)
    # No refusals: this measures queueing, and a 503 never enters the latency figures.
    env = {"KOKORO_QUEUE_MAX_REQUESTS": "100000", "KOKORO_QUEUE_MAX_AUDIO_SECONDS": "1000000",
           "KOKORO_MAX_REQUESTS": "100000", "KOKORO_LIMIT_CONCURRENCY": "100000"}
    log_dir = tempfile.mkdtemp(prefix="kokoro-dispatch-")
    if args.engine == "sim":
        cost = sim_cost_ms(args)
        env |= {"KOKORO_SIM_CHUNK_MS": f"{cost['per_chunk']:g}", "KOKORO_SIM_PHONEME_MS": f"{cost['per_phoneme']:g}"}
    fleets = [FleetProcess(args.workers, dispatch=d, weights=args.weights, env=env, log_dir=log_dir, name=d,
                           engine=args.engine)
              for d in ("shared", "local")]
    try:
        start_all(fleets)
        result = asyncio.run(measure(args, *fleets))
    finally:
        stop_all(fleets)
    print(report(result))
    print(f"server logs: {log_dir}")
    if args.out:
        write_result(result, args.out)
    if args.plot:
        print(f"plot: {plot(result, args.plot)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
