"""Fleet scenarios with real processes: two fleets on one Redis, and overload / underrun.

    python -m loadtest.scenarios two-fleets [--workers 4] [--load 0.8] [--duration 60] [--rounds 2]
                                            [--engine sim] [--env KEY=VALUE ...] [--out R.json] [--plot P.png]
    python -m loadtest.scenarios overload [--workers 8] [--factor 4] [--duration 60] [--capacity-seconds 20]
                                          [--engine sim] [--env KEY=VALUE ...] [--out R.json]

`two-fleets` runs what two Modal containers of one app would: two `kokoro-fleet serve` processes of
`--workers` each on their own ports, sharing one external redis-server (REDIS_URL), and beside
them one fleet of twice the size on its own Redis. It measures the big fleet's capacity (closed
loop, one user per replica), then offers the same seeded Poisson arrivals at `--load` of it to the
first of the two fleets only and to the big fleet, interleaved (ABBA), and prints both p95 times
to first audio, how many chunk jobs each replica ran (from `kokoro-fleet status --json`: the
second fleet's replicas must have taken the first one's jobs), and Redis's figures.

`overload` runs one fleet of `--workers`: a closed loop of one long-text stream per replica
("at capacity": each player's longest wait, the underrun), then Poisson arrivals at `--factor`
times that capacity for `--duration` seconds, sampling the resident memory of the whole process
tree every second. It prints the status codes seen, the 503s' latency and headers, memory over
the run, and checks the issue's bounds (only 200 and 503; each 503 with `Retry-After` <= 60 s and
`retry-after-ms`; 503 p99 under 50 ms; memory flat; no stream's player waiting 100 ms or more).

Both print, per load step, Redis's commands and bytes per second and its CPU share (from
`INFO stats` / `INFO cpu` before and after the step), the server tree's CPU share, and how late a
separate probe process woke from 10 ms sleeps during the step: the machine's own scheduling
noise, so a timing figure taken while other jobs held the cores can be told from a slow server.
`--engine sim` (the default) runs the simulated engine (KOKORO_ENGINE=sim), whose replicas wait a
cost model's time instead of computing, at `--sim-chunk-ms` + `--sim-phoneme-ms` x phonemes per
chunk (defaults: SIM_CHUNK_MS, SIM_PHONEME_MS below, and why); `--env KEY=VALUE` sets any other
setting of every fleet.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from loadtest import listener_metrics as metrics
from loadtest.dispatch import REPO, FleetProcess, interleaved, start_all, stop_all, warm_then_capacity, write_result
from loadtest.runner import Runner, Step, StepRun, Target, Workload, summarize
from loadtest.texts import load_texts

# The bounds (issue 13, point 6): what `overload` checks and prints.
MAX_RETRY_AFTER_S = 60          # the OpenAI client will not wait past 120 s
MAX_503_P99_S = 0.050
MAX_UNDERRUN_S = 0.100
# Memory is "flat" when the last quarter of the overload holds at most this much above its first.
FLAT_RSS_FACTOR, FLAT_RSS_SLACK_MIB = 1.05, 32.0
# The simulated replicas' cost here, t = 20 ms + 5 ms x phonemes per chunk, far slower than a GPU,
# so that capacity is set by the replicas and not by a small box's front end: at GPU speed "4x
# capacity" would measure the CPU, not admission (figures: loadtest/README.md, the overload section).
SIM_CHUNK_MS, SIM_PHONEME_MS = 20.0, 5.0
# The probe's sleeps: a process that only sleeps 10 ms at a time and records how late it woke.
PROBE_SLEEP_S = 0.010


# --- what the machine and Redis did during a step --------------------------------------------------

REDIS_COUNTERS = ("total_commands_processed", "total_net_input_bytes", "total_net_output_bytes",
                  "used_cpu_sys", "used_cpu_user", "used_cpu_sys_main_thread", "used_cpu_user_main_thread")


async def redis_snapshot(url: str) -> dict[str, Any]:
    """Redis's cumulative counters (INFO stats, INFO cpu, INFO commandstats) at one moment."""
    from api.speech.redis_link import connect

    client = connect(url)
    try:
        info = {**await client.info("stats"), **await client.info("cpu")}
        commands = await client.info("commandstats")
    finally:
        await client.aclose()
    snap = {k: float(info.get(k, 0)) for k in REDIS_COUNTERS}
    snap["t"] = time.monotonic()
    snap["commands"] = {k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in commands.items()}
    return snap


def redis_rates(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """Per second between two snapshots: commands, bytes in and out, and Redis's CPU share (CPU
    seconds of the redis-server process, all threads, per wall second: 1.0 is one core)."""
    wall = max(1e-9, after["t"] - before["t"])

    def rate(key: str) -> float:
        return (after[key] - before[key]) / wall

    calls = {name: n - before["commands"].get(name, 0) for name, n in after["commands"].items()}
    top = sorted(((n, name) for name, n in calls.items() if n > 0), reverse=True)[:6]
    return {"wall_s": wall, "ops_per_s": rate("total_commands_processed"),
            "in_bytes_per_s": rate("total_net_input_bytes"), "out_bytes_per_s": rate("total_net_output_bytes"),
            "cpu_share": rate("used_cpu_sys") + rate("used_cpu_user"),
            "main_thread_cpu_share": rate("used_cpu_sys_main_thread") + rate("used_cpu_user_main_thread"),
            "top_commands_per_s": {name: n / wall for n, name in top}}


_PROBE = f"""
import sys, time
end = time.monotonic() + float(sys.argv[1])
late = []
while time.monotonic() < end:
    t = time.monotonic()
    time.sleep({PROBE_SLEEP_S})
    late.append(time.monotonic() - t - {PROBE_SLEEP_S})
print(" ".join(f"{{x:.6f}}" for x in late))
"""


class SchedulingProbe:
    """A separate process that sleeps 10 ms at a time for `seconds` and reports how late it woke:
    near 0 on an idle machine, tens of ms when every core is taken (by the server, the load
    generator, or other people's jobs)."""

    def __init__(self, seconds: float):
        self.proc = subprocess.Popen([sys.executable, "-c", _PROBE, str(seconds)], stdout=subprocess.PIPE, text=True)

    def result(self) -> dict[str, float | None]:
        out, _ = self.proc.communicate(timeout=120)
        return metrics.distribution([float(x) for x in out.split()])


class RssSampler:
    """Resident memory of some process trees (launchers, workers, their Redis), summed, every
    `every_s` seconds on a thread: (seconds since start, MiB)."""

    def __init__(self, fleets: list[FleetProcess], every_s: float = 1.0):
        self.fleets, self.every_s = fleets, every_s
        self.samples: list[tuple[float, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="rss-sampler")
        self._t0 = time.monotonic()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.samples.append((time.monotonic() - self._t0, sum(f.rss_mib() for f in self.fleets)))
            self._stop.wait(self.every_s)

    def __enter__(self) -> "RssSampler":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(5)
        self.samples.append((time.monotonic() - self._t0, sum(f.rss_mib() for f in self.fleets)))


def rss_figures(samples: list[tuple[float, float]]) -> dict[str, Any]:
    """First and last quarter's mean, the peak, and whether the last stayed within the flat bound."""
    values = [v for _, v in samples]
    quarter = max(1, len(values) // 4)
    first, last = statistics.fmean(values[:quarter]), statistics.fmean(values[-quarter:])
    return {"first_quarter_mib": first, "last_quarter_mib": last, "peak_mib": max(values), "samples": len(values),
            "flat": last <= first * FLAT_RSS_FACTOR + FLAT_RSS_SLACK_MIB, "series": samples}


@dataclass
class Observed:
    """A load step plus what the machine, the servers and Redis did meanwhile."""

    run: StepRun
    summary: dict[str, Any]
    redis: dict[str, Any] | None
    server_cpu_share: float                 # CPU seconds of the server trees per wall second
    probe_late_s: dict[str, float | None]   # the scheduling probe's lateness
    extra: dict[str, Any] = field(default_factory=dict)


async def observed_step(runner: Runner, step: Step, target: Target, *, servers: list[FleetProcess],
                        redis_url: str | None, duration: float | None = None, text_offset: int = 0) -> Observed:
    seconds = step.duration if duration is None else duration
    before = await redis_snapshot(redis_url) if redis_url else None
    cpu0, t0 = sum(f.cpu_seconds() for f in servers), time.monotonic()
    probe = SchedulingProbe(seconds)
    run = await runner.run_step(step, target, duration=duration, text_offset=text_offset)
    cpu1, t1 = sum(f.cpu_seconds() for f in servers), time.monotonic()
    late = await asyncio.to_thread(probe.result)
    after = await redis_snapshot(redis_url) if redis_url else None
    return Observed(run, summarize([run]), redis_rates(before, after) if before else None,
                    (cpu1 - cpu0) / max(1e-9, t1 - t0), late)


# --- fleets ----------------------------------------------------------------------------------------

def engine_env(args: argparse.Namespace) -> dict[str, str]:
    env = {"KOKORO_ENGINE": args.engine}
    if args.engine == "sim":
        env.update(KOKORO_SIM_CHUNK_MS=f"{args.sim_chunk_ms:g}", KOKORO_SIM_PHONEME_MS=f"{args.sim_phoneme_ms:g}")
    for item in args.env or []:
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"--env wants KEY=VALUE, got {item!r}")
        env[key] = value
    return env


def replica_table(url: str) -> list[dict[str, Any]]:
    """`kokoro-fleet status --url URL --json`'s replica rows (the fleet-wide table a server shows)."""
    out = subprocess.run([sys.executable, "-m", "cli.main", "status", "--url", url, "--json"], cwd=REPO,
                         capture_output=True, text=True, timeout=60)
    if out.returncode != 0:
        raise RuntimeError(f"kokoro-fleet status failed: {out.stderr[-2000:]}")
    return json.loads(out.stdout)["replicas"]


def replica_owner(name: str, fleets: dict[str, FleetProcess]) -> str:
    """Which fleet a replica belongs to: replica names end in their worker's pid."""
    pid = int(name.rsplit("-", 1)[1])
    for label, f in fleets.items():
        if pid in f.worker_pids():
            return label
    return "?"


def jobs_by_replica(before: list[dict], after: list[dict]) -> dict[str, int]:
    done = {r["replica"]: r["jobs_done"] for r in before}
    return {r["replica"]: r["jobs_done"] - done.get(r["replica"], 0) for r in after}


# --- two fleets, one Redis -------------------------------------------------------------------------

async def measure_two_fleets(args: argparse.Namespace, a: FleetProcess, b: FleetProcess, big: FleetProcess,
                             shared_redis: str) -> dict[str, Any]:
    texts = load_texts(args.texts)
    workload = Workload(texts=texts, response_format="pcm", stream=True, timeout=args.timeout,
                        max_outstanding=args.max_outstanding, seed=args.seed)
    two = Target(a.url + "/v1/audio/speech", "two-fleets")
    one = Target(big.url + "/v1/audio/speech", "one-fleet")
    replicas = 2 * args.workers
    calib = Step("closed", replicas, args.calibrate)
    runner = Runner(workload, [calib, Step("open", 1.0, args.duration)], progress=not args.quiet)
    observed: dict[str, list[Observed]] = {"two-fleets": [], "one-fleet": []}
    try:
        cap = await warm_then_capacity(runner, (two, one), calib, one,
                                       f"loadtest.scenarios: the {replicas}-worker fleet")
        capacity = cap["requests_per_s"]
        rate = args.load * capacity
        print(f"capacity of one fleet of {replicas} (closed loop, {replicas} users): {capacity:.2f} requests/s; "
              f"offering {rate:.2f} requests/s ({args.load:.0%}) to the first of two fleets of {args.workers} "
              f"and to the fleet of {replicas}", flush=True)
        step = Step("open", rate, args.duration)
        before = await asyncio.to_thread(replica_table, b.url)
        rounds = max(1, args.rounds)
        for r, t in interleaved(rounds, two, one):
            servers, redis_url = ([a, b], shared_redis) if t is two else ([big], big.redis_url())
            observed[t.label].append(await observed_step(
                runner, step, t, servers=servers, redis_url=redis_url, duration=args.duration / rounds,
                text_offset=r * 1000))
        after = await asyncio.to_thread(replica_table, b.url)
    finally:
        await runner.aclose()
    jobs = jobs_by_replica(before, after)
    fleets = {"A": a, "B": b}
    per_fleet = {"A": {}, "B": {}}
    for name, n in jobs.items():
        per_fleet.setdefault(replica_owner(name, fleets), {})[name] = n
    summaries = {label: summarize([o.run for o in obs]) for label, obs in observed.items()}
    p95 = {label: s["ttfa_s"]["p95"] for label, s in summaries.items()}
    total = sum(jobs.values())
    return {
        "workers_per_fleet": args.workers, "load": args.load, "texts": args.texts, "engine": args.engine,
        "capacity_requests_per_s": capacity, "offered_rate_per_s": rate,
        "summaries": summaries, "p95_ttfa_s": p95,
        "ratio_two_over_one": metrics.ratio(p95["two-fleets"], p95["one-fleet"]),
        "ttfa_s": {label: sorted(r.ttfa_s for o in obs for r in o.run.rows if r.outcome == "ok" and r.ttfa_s)
                   for label, obs in observed.items()},
        "jobs_per_replica": per_fleet, "jobs_total": total,
        "share_of_jobs_run_by_B": (sum(per_fleet["B"].values()) / total) if total else None,
        "steps": {label: [step_record(o) for o in obs] for label, obs in observed.items()},
    }


def step_record(o: Observed) -> dict[str, Any]:
    s = o.summary
    return {"ok": s["ok"], "rejected_503": s["rejected_503"], "errors": s["errors"], "ttfa_p95_s": s["ttfa_s"]["p95"],
            "redis": o.redis, "server_cpu_share": o.server_cpu_share, "probe_late_s": o.probe_late_s}


def report_two_fleets(result: dict[str, Any]) -> str:
    s = result["summaries"]
    lines = []
    for label in ("two-fleets", "one-fleet"):
        t = s[label]["ttfa_s"]
        lines.append(f"{label:>10}: TTFA p50 {_ms(t['p50'])}  p95 {_ms(t['p95'])}  p99 {_ms(t['p99'])}  "
                     f"ok {s[label]['ok']}  503 {s[label]['rejected_503']}  errors {s[label]['errors']}")
    for fleet in ("A", "B"):
        counts = result["jobs_per_replica"].get(fleet, {})
        lines.append(f"fleet {fleet} ({'offered the load' if fleet == 'A' else 'offered nothing'}): chunk jobs "
                     f"per replica {sorted(counts.values(), reverse=True)}, {sum(counts.values())} in all")
    share = result["share_of_jobs_run_by_B"]
    lines.append(f"fleet B's replicas ran {'-' if share is None else f'{share:.0%}'} of the two fleets' "
                 f"{result['jobs_total']} chunk jobs")
    for label, steps in result["steps"].items():
        for i, st in enumerate(steps):
            lines.append(f"{label:>10} slice {i}: {redis_line(st['redis'])}; servers' CPU "
                         f"{st['server_cpu_share']:.2f} cores; probe late p99 {_ms(st['probe_late_s']['p99'])}")
    ratio = result["ratio_two_over_one"]
    lines.append(f"p95 TTFA two fleets of {result['workers_per_fleet']} (load on one) / one fleet of "
                 f"{2 * result['workers_per_fleet']} = {'-' if ratio is None else f'{ratio:.2f}x'} at "
                 f"{result['load']:.0%} of {result['capacity_requests_per_s']:.2f} requests/s")
    return "\n".join(lines)


def plot_two_fleets(result: dict[str, Any], path: str | Path) -> Path:
    """TTFA CDFs of the two setups on one log axis, and the chunk jobs each replica ran (A: the
    fleet the load was offered to, B: the other one)."""
    from loadtest.report import _plt, _save, ttfa_cdfs

    plt = _plt()
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(11, 4.2), gridspec_kw={"width_ratios": [3, 2]})
    w = result["workers_per_fleet"]
    ttfa_cdfs(ax, [(result["ttfa_s"][label], result["p95_ttfa_s"][label], color, name)
                   for label, color, name in (("two-fleets", "tab:blue", f"two fleets of {w}, one Redis, load on one"),
                                              ("one-fleet", "tab:green", f"one fleet of {2 * w}"))])
    names, counts, colors = [], [], []
    for fleet, color in (("A", "tab:blue"), ("B", "tab:orange")):
        for i, n in enumerate(sorted(result["jobs_per_replica"].get(fleet, {}).values(), reverse=True)):
            names.append(f"{fleet}{i}")
            counts.append(n)
            colors.append(color)
    bx.bar(names, counts, color=colors)
    bx.set_ylabel("chunk jobs run")
    share = result["share_of_jobs_run_by_B"]
    bx.set_title(f"per replica: A (load offered) blue, B (none) orange; B ran "
                 f"{'-' if share is None else f'{share:.0%}'}", fontsize=8)
    ratio = result["ratio_two_over_one"]
    fig.suptitle(f"Poisson arrivals at {result['load']:.0%} of the {2 * w}-replica capacity "
                 f"({result['offered_rate_per_s']:.1f} requests/s), engine {result['engine']}: p95 ratio "
                 f"{'-' if ratio is None else f'{ratio:.2f}x'}", fontsize=9)
    return _save(fig, path, plt)


def two_fleets(args: argparse.Namespace) -> dict[str, Any]:
    from api.embedded_redis import EmbeddedRedis

    env = {**engine_env(args), "KOKORO_PLAYGROUND": "false"}
    log_dir = Path(args.log_dir or tempfile.mkdtemp(prefix="kokoro-two-fleets-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    redis = EmbeddedRedis().start()
    a = FleetProcess(args.workers, redis_url=redis.url, weights=args.weights, env=env, log_dir=log_dir, name="A")
    b = FleetProcess(args.workers, redis_url=redis.url, weights=args.weights, env=env, log_dir=log_dir, name="B")
    big = FleetProcess(2 * args.workers, weights=args.weights, env=env, log_dir=log_dir, name="one")
    fleets = [a, b, big]
    try:
        start_all(fleets)
        result = asyncio.run(measure_two_fleets(args, a, b, big, redis.url))
    finally:
        stop_all(fleets)
        redis.stop()
    result["server_logs"] = str(log_dir)
    return result


# --- overload and underrun -------------------------------------------------------------------------

async def measure_overload(args: argparse.Namespace, fleet: FleetProcess) -> dict[str, Any]:
    long_texts, texts = load_texts(args.capacity_texts), load_texts(args.texts)
    redis_url = fleet.redis_url()
    streams = Workload(texts=long_texts, response_format="pcm", stream=True, timeout=args.timeout)
    calib = Step("closed", args.workers, args.capacity_seconds)
    runner = Runner(streams, [calib], progress=not args.quiet)
    try:
        await runner.warmup(Target(fleet.url + "/v1/audio/speech", "warmup"), 2 * args.workers, args.workers)
        at_capacity = await observed_step(runner, calib, Target(fleet.url + "/v1/audio/speech", "capacity"),
                                          servers=[fleet], redis_url=redis_url)
    finally:
        await runner.aclose()
    cap = at_capacity.summary
    capacity = cap["requests_per_s"]
    if capacity <= 0:
        raise SystemExit(f"loadtest.scenarios: the fleet completed nothing at capacity: {cap['error_examples']}")
    # Open loop at `factor` x the requests/s measured at capacity, on the overload's own texts: with
    # the same texts that is `factor` x the audio the fleet can make; the default uses the same set.
    rate = args.factor * capacity
    over_load = Workload(texts=texts, response_format="pcm", stream=True, timeout=args.timeout,
                         max_outstanding=args.max_outstanding, seed=args.seed)
    step = Step("open", rate, args.duration)
    runner = Runner(over_load, [step], progress=not args.quiet)
    try:
        with RssSampler([fleet]) as rss:
            over = await observed_step(runner, step, Target(fleet.url + "/v1/audio/speech", "overload"),
                                       servers=[fleet], redis_url=redis_url)
    finally:
        await runner.aclose()
    return overload_figures(args, at_capacity, over, rss.samples, capacity, rate)


def overload_figures(args: argparse.Namespace, at_capacity: Observed, over: Observed,
                     rss_samples: list[tuple[float, float]], capacity: float, rate: float) -> dict[str, Any]:
    rows = over.run.rows
    refused = [r for r in rows if r.outcome == "rejected"]
    statuses: dict[str, int] = {}
    for r in rows:
        key = "dropped by the client" if r.outcome == "dropped" else str(r.status or f"no answer: {r.error[:80]}")
        statuses[key] = statuses.get(key, 0) + 1
    retry_s = [float(r.retry_after) for r in refused if r.retry_after.strip().isdigit()]
    headers_ok = all(r.status == 503 and r.retry_after.strip().isdigit() and r.retry_after_ms.strip().isdigit()
                     for r in refused)
    refused_latency = metrics.distribution([r.e2e_s for r in refused if r.e2e_s is not None])
    underruns = [r.underrun_s for r in at_capacity.run.rows if r.outcome == "ok" and r.underrun_s is not None]
    rss = rss_figures(rss_samples)
    cap = at_capacity.summary
    checks = {
        "only 200 and 503": set(statuses) <= {"200", "503"},
        f"every 503 has Retry-After <= {MAX_RETRY_AFTER_S} s and retry-after-ms":
            bool(refused) and headers_ok and max(retry_s, default=0) <= MAX_RETRY_AFTER_S,
        f"503 p99 < {MAX_503_P99_S * 1000:.0f} ms": refused_latency["p99"] is not None
            and refused_latency["p99"] < MAX_503_P99_S,
        "memory flat": rss["flat"],
        f"at capacity, longest player wait < {MAX_UNDERRUN_S * 1000:.0f} ms": bool(underruns)
            and max(underruns) < MAX_UNDERRUN_S and cap["errors"] == 0 and cap["rejected_503"] == 0,
    }
    return {
        "workers": args.workers, "engine": args.engine, "factor": args.factor,
        "capacity_texts": args.capacity_texts, "texts": args.texts,
        "capacity_requests_per_s": capacity, "capacity_audio_s_per_s": cap["audio_s_per_wall_s"],
        "offered_rate_per_s": rate, "duration_s": args.duration,
        "statuses": statuses, "ok": over.summary["ok"], "refused": len(refused),
        "refused_latency_s": refused_latency,
        "slowest_503s": [{"ms": r.e2e_s * 1000, "at_s": r.scheduled_at, "generator_lag_ms": (r.sched_lag_s or 0) * 1000,
                          "request_id": r.request_id}
                         for r in sorted(refused, key=lambda r: r.e2e_s or 0)[-8:]],
        "retry_after_s": metrics.distribution(retry_s),
        "retry_after_ms": metrics.distribution([float(r.retry_after_ms) for r in refused
                                                 if r.retry_after_ms.strip().isdigit()]),
        "admitted_ttfa_s": over.summary["ttfa_s"], "capacity_ttfa_s": cap["ttfa_s"],
        "capacity_underrun_s": metrics.distribution(underruns), "capacity_streams": len(underruns),
        "capacity_audio_s_per_stream": metrics.distribution([r.audio_s for r in at_capacity.run.rows
                                                             if r.outcome == "ok"]),
        "rss": rss, "sched_lag_s": over.summary.get("sched_lag_s"),
        "redis": {"capacity": at_capacity.redis, "overload": over.redis},
        "server_cpu_share": {"capacity": at_capacity.server_cpu_share, "overload": over.server_cpu_share},
        "probe_late_s": {"capacity": at_capacity.probe_late_s, "overload": over.probe_late_s},
        "checks": checks,
    }


def report_overload(result: dict[str, Any]) -> str:
    r = result
    lat, under = r["refused_latency_s"], r["capacity_underrun_s"]
    lines = [
        f"at capacity ({r['workers']} workers, engine {r['engine']}, closed loop of {r['workers']} "
        f"'{r['capacity_texts']}' streams): {r['capacity_requests_per_s']:.2f} requests/s, "
        f"{r['capacity_audio_s_per_s']:.1f} audio-s/s; TTFA p95 {_ms(r['capacity_ttfa_s']['p95'])}; longest player "
        f"wait over {r['capacity_streams']} streams: {_ms(under['max'])} (p99 {_ms(under['p99'])})",
        f"overload: {r['factor']:g}x = {r['offered_rate_per_s']:.1f} requests/s for {r['duration_s']:g} s "
        f"('{r['texts']}'): status codes {r['statuses']}",
        f"  503s: {r['refused']}, answered in p50 {_ms(lat['p50'])} p95 {_ms(lat['p95'])} p99 {_ms(lat['p99'])} "
        f"max {_ms(lat['max'])} (slowest: " + ", ".join(f"{x['ms']:.0f} ms at {x['at_s']:.1f} s"
                                                         for x in r["slowest_503s"][-4:]) + "); Retry-After "
        f"{_range(r['retry_after_s'], 's')}, retry-after-ms "
        f"{_range(r['retry_after_ms'], 'ms')}",
        f"  admitted: {r['ok']}, TTFA p50 {_ms(r['admitted_ttfa_s']['p50'])} p95 {_ms(r['admitted_ttfa_s']['p95'])}; "
        f"generator lag p99 {_ms((r['sched_lag_s'] or {}).get('p99'))}",
        f"  memory (RSS of the server tree, {r['rss']['samples']} samples): first quarter "
        f"{r['rss']['first_quarter_mib']:.0f} MiB, last quarter {r['rss']['last_quarter_mib']:.0f} MiB, "
        f"peak {r['rss']['peak_mib']:.0f} MiB",
    ]
    for phase in ("capacity", "overload"):
        lines.append(f"{phase:>9}: {redis_line(r['redis'][phase])}; server tree CPU "
                     f"{r['server_cpu_share'][phase]:.2f} cores; probe woke late p50 "
                     f"{_ms(r['probe_late_s'][phase]['p50'])} p99 {_ms(r['probe_late_s'][phase]['p99'])}")
    for name, ok in r["checks"].items():
        lines.append(f"  [{'PASS' if ok else 'FAIL'}] {name}")
    return "\n".join(lines)


def overload(args: argparse.Namespace) -> dict[str, Any]:
    env = {**engine_env(args), "KOKORO_PLAYGROUND": "false"}
    log_dir = Path(args.log_dir or tempfile.mkdtemp(prefix="kokoro-overload-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    fleet = FleetProcess(args.workers, weights=args.weights, env=env, log_dir=log_dir, name="fleet")
    try:
        start_all([fleet])
        result = asyncio.run(measure_overload(args, fleet))
    finally:
        stop_all([fleet])
    result["server_logs"] = str(log_dir)
    return result


# --- shared ----------------------------------------------------------------------------------------

def redis_line(r: dict[str, Any] | None) -> str:
    if not r:
        return "Redis: -"
    top = ", ".join(f"{name} {n:.0f}/s" for name, n in list(r["top_commands_per_s"].items())[:4])
    return (f"Redis {r['ops_per_s']:.0f} ops/s ({top}), in {r['in_bytes_per_s'] / 1e6:.2f} MB/s, out "
            f"{r['out_bytes_per_s'] / 1e6:.2f} MB/s, CPU {r['cpu_share']:.1%} of a core")


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x * 1000:.0f} ms" if x >= 0.01 else f"{x * 1000:.1f} ms"


def _range(d: dict[str, float | None], unit: str) -> str:
    if not d or not d.get("n"):
        return "-"
    return f"p50 {d['p50']:g}, max {d['max']:g} {unit}"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m loadtest.scenarios", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--engine", default="sim", help="KOKORO_ENGINE of every fleet (sim: the simulated engine)")
    common.add_argument("--weights", default="tiny", help="KOKORO_WEIGHTS of every fleet")
    common.add_argument("--sim-chunk-ms", type=float, default=SIM_CHUNK_MS, help="sim cost per chunk (ms)")
    common.add_argument("--sim-phoneme-ms", type=float, default=SIM_PHONEME_MS, help="sim cost per phoneme (ms)")
    common.add_argument("--env", action="append", metavar="KEY=VALUE", help="more settings for every fleet")
    common.add_argument("--duration", type=float, default=60.0, help="seconds of Poisson arrivals")
    common.add_argument("--max-outstanding", type=int, default=256,
                        help="open loop: requests in flight at most (the client holds this many connections)")
    common.add_argument("--timeout", type=float, default=120.0)
    common.add_argument("--seed", type=int, default=0)
    common.add_argument("--log-dir", help="keep the servers' logs here (default: a temporary directory)")
    common.add_argument("--out", help="write the result JSON here")
    common.add_argument("--quiet", action="store_true")
    t = sub.add_parser("two-fleets", parents=[common], help="two fleets on one Redis vs one of the combined size")
    t.add_argument("--workers", type=int, default=4, help="workers in each of the two fleets")
    t.add_argument("--load", type=float, default=0.8, help="offered load, fraction of the combined fleet's capacity")
    t.add_argument("--rounds", type=int, default=2, help="interleaved slices per side (ABBA)")
    t.add_argument("--calibrate", type=float, default=15.0, help="seconds of the capacity measurement")
    t.add_argument("--texts", default="short")
    t.add_argument("--plot", help="TTFA CDFs and jobs per replica, into this PNG")
    o = sub.add_parser("overload", parents=[common], help="4x capacity: 200s and fast 503s; no underrun at capacity")
    o.add_argument("--workers", type=int, default=8)
    o.add_argument("--factor", type=float, default=4.0, help="offered load, multiple of the measured capacity")
    o.add_argument("--capacity-seconds", type=float, default=20.0, help="seconds of the closed loop at capacity")
    o.add_argument("--capacity-texts", default="paragraphs", help="texts of the at-capacity streams (underrun)")
    o.add_argument("--texts", default="paragraphs", help="texts of the overload")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "two-fleets":
        result = two_fleets(args)
        print(report_two_fleets(result))
        if args.plot:
            print(f"plot: {plot_two_fleets(result, args.plot)}")
    else:
        result = overload(args)
        print(report_overload(result))
    print(f"server logs: {result['server_logs']}")
    if args.out:
        write_result(result, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
