"""`python -m loadtest soak`: a mixed load held for a set time against real fleets, watching for leaks.

    python -m loadtest soak --duration 1800 --out loadtest/results/DATE-soak-cpu2

Starts one redis-server (api.embedded_redis's EmbeddedRedis) and two `kokoro-fleet serve` processes
joining it, as two containers of one deploy would: `sim` (`--sim-workers` replicas of the
simulated engine, which carry the rate) and `real` (`--real-workers` replicas of the torch engine
on `--real-weights`). With the shared queue every replica leases any request's chunks, so the real
engine synthesizes a share of every kind of request, and both front ends take requests. Then, for
`--duration` seconds, users run side by side, each alternating between the two front ends:

- streams: streamed speech requests, read to the end;
- downloads: non-streamed requests with `return_download_link`, then the link fetched;
- live: WS /v1/audio/speech/live sessions (loadtest.live_load's client);
- cancels: streamed long texts dropped after their first audio bytes;
- bursts: every `--burst-every` seconds, `--burst-size` requests at once, above the fleet's
  admission bound, so some must be answered 503 (which are counted apart, never as errors).

Every `--sample-every` seconds it samples the resident memory and open descriptors of every
server process (launchers, workers, redis-server), Redis's used_memory and key count, and the
fleets' /metrics error counters. At the end it fits a line to each series over the second half of
the load (after warm-up) and prints the slopes per minute, lets the fleet settle idle, and lists
the Redis keys left that belong to requests. It writes soak.json and soak.png into `--out` and
exits 1 on any error (a request answered neither as asked nor 503, a 5xx other than 503 or a
failed request in /metrics, a server process that died or was replaced, a traceback in a server
log), on request keys left behind, on descriptors grown from idle to idle beyond
`--max-fd-growth`, and, with `--fail-on-leak`, on a slope above its bound.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx

from loadtest.client import RequestResult, RequestSpec, make_client, send_speech
from loadtest.dispatch import FleetProcess, process_tree, start_all, stop_all
from loadtest.results import machine, now_iso
from loadtest.scenarios import SIM_CHUNK_MS, SIM_PHONEME_MS
from loadtest.texts import load_texts

# Keys a fleet keeps while idle (queue/PROTOCOL.md's table); every other key of the prefix belongs
# to a request, a download or something unknown, and must be gone once the fleet is idle.
FLEET_SCOPED_KEYS = re.compile(
    r"^\{kf\}:(stats|queue|leases|holders|requests|ready|replicas|keys|replica:.+|alive:.+)$")
# P:stats gauges that return to 0 when the fleet is idle.
IDLE_ZERO_GAUGES = ("admitted", "queued_jobs", "queued_work_ms", "inflight_jobs", "inflight_work_ms")
# /metrics counters watched for errors: a rise in any of these fails the soak.
ERROR_COUNTERS = ("kokoro_fleet_failed_total", "kokoro_fleet_worker_failed_total")
# ... and the ones reported beside them: a rise is worth reading about but is not an error by itself.
NOTICE_COUNTERS = ("kokoro_fleet_expired_total", "kokoro_fleet_requeued_total", "kokoro_fleet_orphaned_total",
                   "kokoro_fleet_lease_losses_total", "kokoro_fleet_batch_fallbacks_total",
                   "kokoro_client_stalls_total", "kokoro_client_disconnects_total",
                   "kokoro_fleet_degraded_seconds_total")
# Default leak bounds of --fail-on-leak, per minute over the second half of the load: generous,
# so that a flat series with noise never fails and a steady leak over half an hour does.
LEAK_BOUNDS = {"rss_mib": 4.0, "fds": 1.0, "redis_used_memory_mib": 2.0}
KINDS = ("stream", "download", "live", "cancel", "burst")


@dataclass
class SoakOutcome:
    """One request of the mixed load, as its user saw it."""

    at_s: float      # seconds since the load started, when it ended
    kind: str        # one of KINDS
    fleet: str       # which front end took it
    outcome: str     # ok | refused (503) | error
    status: int = 0
    error: str = ""


# --- processes and Redis ---------------------------------------------------------------------------

def _rss_mib(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def _fd_count(pid: int) -> int | None:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None


def _process_name(pid: int) -> str:
    try:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return "gone"
    if "spawn_main" in cmd and "resource_tracker" not in cmd:
        return "worker"
    if "resource_tracker" in cmd:
        return "resource-tracker"
    return "launcher" if "cli.main" in cmd else Path(cmd.split(" ", 1)[0]).name or "process"


def server_processes(fleets: list[FleetProcess], redis_pid: int) -> dict[str, int]:
    """Every server process by a stable label: fleet, role and pid (a replaced worker is a new series)."""
    out = {f"redis-server:{redis_pid}": redis_pid}
    for f in fleets:
        if f.proc is None:
            continue
        for pid in process_tree(f.proc.pid):
            out[f"{f.name}/{_process_name(pid)}:{pid}"] = pid
    return out


async def redis_figures(client) -> dict[str, Any]:
    info = await client.info("memory")
    return {"used_memory_mib": info["used_memory"] / 2**20, "keys": await client.dbsize()}


async def leftover_keys(client) -> tuple[list[str], dict[str, float]]:
    """Keys that are not the fleet's own (request-scoped ones, or unknown), and P:stats's idle gauges."""
    keys = sorted([k.decode() if isinstance(k, bytes) else k async for k in client.scan_iter(count=1000)])
    stats = {(k.decode() if isinstance(k, bytes) else k): v for k, v in (await client.hgetall("{kf}:stats")).items()}
    gauges = {g: float(stats.get(g, 0) or 0) for g in IDLE_ZERO_GAUGES}
    return [k for k in keys if not FLEET_SCOPED_KEYS.match(k)], gauges


async def metric_counters(http: httpx.AsyncClient, fleet: FleetProcess) -> dict[str, float]:
    """The watched /metrics figures of one fleet (its workers added up): 5xx other than 503, 503s,
    and the error and notice counters."""
    from api.replica_table import parse_metrics

    samples = parse_metrics((await http.get(fleet.url + "/metrics")).text)
    out = {"http_5xx_not_503": 0.0, "http_503": 0.0}
    for labels, value in samples.get("kokoro_requests_total", []):
        status = labels.get("status", "")
        if status == "503":
            out["http_503"] += value
        elif status.startswith("5"):
            out["http_5xx_not_503"] += value
    for name in ERROR_COUNTERS + NOTICE_COUNTERS:
        out[name] = sum(v for _, v in samples.get(name, []))
    return out


# --- the load --------------------------------------------------------------------------------------

class MixedLoad:
    """The users of every kind, each alternating between the fleets' front ends, until `stop` is set."""

    def __init__(self, args: argparse.Namespace, fleets: list[FleetProcess]):
        self.args, self.fleets = args, fleets
        self.short, self.paragraphs = load_texts("short"), load_texts("paragraphs")
        self.outcomes: list[SoakOutcome] = []
        self.stop = asyncio.Event()
        self.t0 = time.monotonic()
        self._serial = 0
        self._rng = random.Random(args.seed)

    def _record(self, kind: str, fleet: FleetProcess, outcome: str, status: int = 0, error: str = "") -> None:
        self.outcomes.append(SoakOutcome(time.monotonic() - self.t0, kind, fleet.name, outcome, status, error[:300]))

    def _fleet(self) -> FleetProcess:
        self._serial += 1
        return self.fleets[self._serial % len(self.fleets)]

    def _spec(self, fleet: FleetProcess, text: str, **kw) -> RequestSpec:
        return RequestSpec(url=fleet.url + "/v1/audio/speech", text=text, **kw)

    def _result(self, kind: str) -> RequestResult:
        self._serial += 1
        return RequestResult(target=kind, request_id=f"soak-{kind}-{self._serial}")

    async def _pause(self, seconds: float) -> None:
        """A user's think time, jittered so that users do not fall into step; ends early on stop."""
        try:
            await asyncio.wait_for(self.stop.wait(), seconds * self._rng.uniform(0.5, 1.5))
        except asyncio.TimeoutError:
            pass

    def _speech_outcome(self, kind: str, fleet: FleetProcess, r: RequestResult) -> None:
        self._record(kind, fleet, "refused" if r.outcome == "rejected" else r.outcome, r.status, r.error)

    async def stream_user(self) -> None:
        async with make_client(1) as client:
            while not self.stop.is_set():
                fleet = self._fleet()
                spec = self._spec(fleet, self._rng.choice(self.short))
                r = await send_speech(client, spec, self._result("stream"), total_timeout=self.args.timeout)
                self._speech_outcome("stream", fleet, r)
                await self._pause(self.args.think)

    async def download_user(self) -> None:
        async with make_client(1) as client:
            while not self.stop.is_set():
                await self.one_download(client, self._fleet())
                await self._pause(self.args.think)

    async def one_download(self, client: httpx.AsyncClient, fleet: FleetProcess) -> None:
        body = {"model": "kokoro", "input": self._rng.choice(self.short), "voice": "af_heart",
                "response_format": "mp3", "stream": False, "return_download_link": True}
        try:
            r = await client.post(fleet.url + "/v1/audio/speech", json=body, timeout=self.args.timeout)
            if r.status_code == 503:
                return self._record("download", fleet, "refused", 503)
            path = r.headers.get("x-download-path", "")
            if r.status_code != 200 or not r.content or not path:
                return self._record("download", fleet, "error", r.status_code,
                                    f"no audio or no X-Download-Path: {r.text[:200]}")
            got = await client.get(fleet.url + path, timeout=self.args.timeout)
            if got.status_code != 200 or got.content != r.content:
                return self._record("download", fleet, "error", got.status_code,
                                    f"GET {path}: {len(got.content)} bytes, the response had {len(r.content)}")
            self._record("download", fleet, "ok", 200)
        except httpx.HTTPError as e:
            self._record("download", fleet, "error", 0, f"{type(e).__name__}: {e}")

    async def live_user(self) -> None:
        from loadtest.live_load import run_session

        while not self.stop.is_set():
            await self.one_live(run_session, self._fleet())
            await self._pause(self.args.think)

    async def one_live(self, run_session, fleet: FleetProcess) -> None:
        url = fleet.url.replace("http://", "ws://") + "/v1/audio/speech/live"
        s = await run_session(url, self._rng.choice(self.paragraphs), self.args.live_words_per_second, "pcm",
                              "af_heart", timeout=self.args.timeout)
        if s.refused:
            self._record("live", fleet, "refused", 503)
        elif s.errors or s.audio_s <= 0:
            self._record("live", fleet, "error", 0, "; ".join(s.errors) or "no audio")
        else:
            self._record("live", fleet, "ok", 101)

    async def cancel_user(self) -> None:
        while not self.stop.is_set():
            await self.one_cancel(self._fleet())
            await self._pause(self.args.think)

    async def one_cancel(self, fleet: FleetProcess) -> None:
        """A streamed long text, dropped after its first audio bytes: the connection is closed mid-stream."""
        body = {"model": "kokoro", "input": self._rng.choice(self.paragraphs), "voice": "af_heart",
                "response_format": "pcm", "stream": True}
        try:
            async with make_client(1) as client:
                async with client.stream("POST", fleet.url + "/v1/audio/speech", json=body) as r:
                    if r.status_code != 200:
                        await r.aread()
                        outcome = "refused" if r.status_code == 503 else "error"
                        return self._record("cancel", fleet, outcome, r.status_code, r.text[:200])
                    async for data in r.aiter_bytes():
                        if data:
                            return self._record("cancel", fleet, "ok", 200)
                    self._record("cancel", fleet, "error", 200, "the stream ended with no audio")
        except httpx.HTTPError as e:
            self._record("cancel", fleet, "error", 0, f"{type(e).__name__}: {e}")

    async def burst_user(self) -> None:
        while not self.stop.is_set():
            await self._pause(self.args.burst_every)
            if not self.stop.is_set():
                await self.one_burst(self._fleet())

    async def one_burst(self, fleet: FleetProcess) -> None:
        """`--burst-size` streams at once on their own connections, beyond the fleet's admission bound."""
        clients = [make_client(1) for _ in range(self.args.burst_size)]
        try:
            results = await asyncio.gather(*(
                send_speech(c, self._spec(fleet, self._rng.choice(self.short)), self._result("burst"),
                            total_timeout=self.args.timeout) for c in clients))
        finally:
            await asyncio.gather(*(c.aclose() for c in clients))
        for r in results:
            self._speech_outcome("burst", fleet, r)

    async def warm_up(self) -> None:
        """One of every kind on each fleet, so that pools and lazily opened files exist before the
        idle baseline is taken."""
        from loadtest.live_load import run_session

        async with make_client(1) as client:
            for fleet in self.fleets:
                r = await send_speech(client, self._spec(fleet, self.short[0]), self._result("stream"))
                self._speech_outcome("stream", fleet, r)
                await self.one_download(client, fleet)
                await self.one_live(run_session, fleet)
                await self.one_cancel(fleet)
                await self.one_burst(fleet)

    async def run(self, seconds: float) -> None:
        a = self.args
        users = ([self.stream_user() for _ in range(a.stream_users)]
                 + [self.download_user() for _ in range(a.download_users)]
                 + [self.live_user() for _ in range(a.live_users)]
                 + [self.cancel_user() for _ in range(a.cancel_users)] + [self.burst_user()])
        tasks = [asyncio.create_task(u) for u in users]
        try:
            await asyncio.wait_for(self.stop.wait(), seconds)
        except asyncio.TimeoutError:
            pass
        self.stop.set()
        await asyncio.gather(*tasks)


# --- sampling --------------------------------------------------------------------------------------

class LeakSampler:
    """Every `every_s` seconds: RSS and descriptors of every server process, Redis's memory and
    key count, and the fleets' watched /metrics counters."""

    def __init__(self, fleets: list[FleetProcess], redis_pid: int, redis_client, every_s: float, t0: float):
        self.fleets, self.redis_pid, self.redis, self.every_s, self.t0 = fleets, redis_pid, redis_client, every_s, t0
        self.samples: list[dict[str, Any]] = []
        self.pids_seen: dict[str, int] = {}

    async def sample(self, phase: str) -> dict[str, Any]:
        procs = server_processes(self.fleets, self.redis_pid)
        self.pids_seen.update(procs)
        rss = {label: v for label, pid in procs.items() if (v := _rss_mib(pid)) is not None}
        fds = {label: v for label, pid in procs.items() if (v := _fd_count(pid)) is not None}
        async with httpx.AsyncClient(timeout=10.0, trust_env=False) as http:
            counters = {}
            for f in self.fleets:
                try:
                    counters[f.name] = await metric_counters(http, f)
                except httpx.HTTPError as e:
                    counters[f.name] = {"scrape_error": f"{type(e).__name__}: {e}"}
        s = {"t_s": time.monotonic() - self.t0, "phase": phase, "rss_mib": rss, "fds": fds,
             "redis": await redis_figures(self.redis), "metrics": counters}
        self.samples.append(s)
        return s

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await self.sample("load")
            try:
                await asyncio.wait_for(stop.wait(), self.every_s)
            except asyncio.TimeoutError:
                pass


# --- figures ---------------------------------------------------------------------------------------

def slope_per_minute(points: list[tuple[float, float]]) -> float | None:
    """Least-squares slope of (seconds, value) points, per minute; None with fewer than 3 points."""
    if len(points) < 3:
        return None
    n = len(points)
    mx, my = sum(t for t, _ in points) / n, sum(v for _, v in points) / n
    var = sum((t - mx) ** 2 for t, _ in points)
    if var <= 0:
        return None
    return 60.0 * sum((t - mx) * (v - my) for t, v in points) / var


def sampled_series(samples: list[dict[str, Any]]) -> dict[str, list[tuple[float, float]]]:
    """Every sampled figure as a named (seconds, value) series: `rss_mib <process>`, `fds <process>`,
    `redis_used_memory_mib`, `redis_keys`."""
    out: dict[str, list[tuple[float, float]]] = {}
    for s in samples:
        for kind in ("rss_mib", "fds"):
            for label, v in s[kind].items():
                out.setdefault(f"{kind} {label}", []).append((s["t_s"], float(v)))
        out.setdefault("redis_used_memory_mib", []).append((s["t_s"], s["redis"]["used_memory_mib"]))
        out.setdefault("redis_keys", []).append((s["t_s"], float(s["redis"]["keys"])))
    return out


def slopes_after_warmup(samples: list[dict[str, Any]], load_s: float) -> dict[str, dict[str, float | None]]:
    """Per series, over the load's second half: the slope per minute and the mean."""
    fit = [s for s in samples if s["phase"] == "load" and s["t_s"] >= load_s / 2]
    out = {}
    for name, points in sampled_series(fit).items():
        out[name] = {"per_min": slope_per_minute(points), "mean": sum(v for _, v in points) / len(points),
                     "points": len(points)}
    return out


def leak_bound(name: str, bounds: dict[str, float]) -> float | None:
    head = name.split(" ", 1)[0]
    return bounds.get(head if head in bounds else name)


def counter_deltas(first: dict[str, Any], last: dict[str, Any]) -> dict[str, float]:
    """How much each watched /metrics counter rose, over the fleets (fleet-wide ones from one fleet)."""
    out: dict[str, float] = {}
    for fleet, values in last["metrics"].items():
        before = first["metrics"].get(fleet, {})
        for name, v in values.items():
            if not isinstance(v, (int, float)):
                continue
            rise = v - float(before.get(name, 0.0))
            fleet_wide = name.startswith("kokoro_fleet_") and not name.startswith("kokoro_fleet_worker_")
            if fleet_wide:
                out[name] = max(out.get(name, 0.0), rise)  # every front end reads the same Redis figures
            else:
                out[name] = out.get(name, 0.0) + rise
    return out


def log_tracebacks(fleets: list[FleetProcess]) -> list[str]:
    found = []
    for f in fleets:
        text = f.log_path.read_text(errors="replace")
        for m in re.finditer(r"Traceback \(most recent call last\)", text):
            found.append(f"{f.name}: " + text[max(0, m.start() - 300): m.start() + 1500].replace("\n", " | "))
    return found


def soak_failures(args: argparse.Namespace, result: dict[str, Any]) -> list[str]:
    """The reasons the soak failed (empty: it passed)."""
    failures = []
    for kind, c in result["by_kind"].items():
        if c["error"]:
            failures.append(f"{c['error']} {kind} errors, e.g. {c['error_examples'][:2]}")
        if not c["ok"]:
            failures.append(f"no {kind} succeeded")
    if not result["by_kind"]["burst"]["refused"]:
        failures.append("no burst got a 503: the bursts never passed the admission bound (--burst-size)")
    for name in ("http_5xx_not_503",) + ERROR_COUNTERS:
        if result["metrics_rise"].get(name, 0) > 0:
            failures.append(f"/metrics: {name} rose by {result['metrics_rise'][name]:g}")
    if result["replaced_processes"]:
        failures.append(f"server processes gone or replaced: {result['replaced_processes']}")
    if result["tracebacks"]:
        failures.append(f"{len(result['tracebacks'])} tracebacks in the server logs")
    idle = result["idle"]
    if idle["leftover_keys"]:
        failures.append(f"{len(idle['leftover_keys'])} request keys left in Redis: {idle['leftover_keys'][:20]}")
    if any(idle["gauges"].values()):
        failures.append(f"Redis's idle gauges not back to 0: {idle['gauges']}")
    for label, growth in idle["fd_growth"].items():
        if growth > args.max_fd_growth:
            failures.append(f"descriptors of {label} grew by {growth} from idle to idle (bound {args.max_fd_growth})")
    if args.fail_on_leak:
        for name, fit in result["slopes"].items():
            bound = leak_bound(name, LEAK_BOUNDS)
            if bound is not None and fit["per_min"] is not None and fit["per_min"] > bound:
                failures.append(f"{name} grows {fit['per_min']:.2f}/min over the second half (bound {bound:g})")
    return failures


def outcomes_by_kind(outcomes: list[SoakOutcome]) -> dict[str, dict[str, Any]]:
    out = {}
    for kind in KINDS:
        mine = [o for o in outcomes if o.kind == kind]
        out[kind] = {"ok": sum(o.outcome == "ok" for o in mine), "refused": sum(o.outcome == "refused" for o in mine),
                     "error": sum(o.outcome == "error" for o in mine),
                     "error_examples": [f"{o.fleet} {o.status} {o.error}" for o in mine if o.outcome == "error"][:5]}
    return out


# --- the run ---------------------------------------------------------------------------------------

async def soak_fleets(args: argparse.Namespace, fleets: list[FleetProcess], redis_server) -> dict[str, Any]:
    import redis.asyncio as aioredis

    started_iso = now_iso()
    client = aioredis.from_url(redis_server.url)
    load = MixedLoad(args, fleets)
    sampler = LeakSampler(fleets, redis_server.process.pid, client, args.sample_every, load.t0)
    try:
        await load.warm_up()
        await asyncio.sleep(args.settle)
        await sampler.sample("idle-before")
        load.outcomes.clear()
        load.t0 = sampler.t0 = time.monotonic()
        sampler.samples[0]["t_s"] = 0.0
        started = time.monotonic()
        sampling = asyncio.create_task(sampler.run(load.stop))
        await load.run(args.duration)
        await sampling
        load_s = time.monotonic() - started
        await sampler.sample("stopped")
        await asyncio.sleep(args.settle)
        idle_after = await sampler.sample("idle-after")
        keys, gauges = await leftover_keys(client)
    finally:
        await client.aclose()
    before = sampler.samples[0]
    still = server_processes(fleets, redis_server.process.pid)
    replaced = sorted(label for label in sampler.pids_seen if label not in still
                      and not label.split("/", 1)[-1].startswith(("gone", "process")))
    fd_growth = {label: idle_after["fds"].get(label, 0) - n for label, n in before["fds"].items()
                 if label in idle_after["fds"]}
    return {
        "command": "soak", "argv": sys.argv, "started": started_iso, "ended": now_iso(), "machine": machine(),
        "config": {k: v for k, v in vars(args).items() if not k.startswith("_")},
        "load_s": load_s, "by_kind": outcomes_by_kind(load.outcomes),
        "outcomes": [asdict(o) for o in load.outcomes],
        "samples": sampler.samples, "slopes": slopes_after_warmup(sampler.samples, load_s),
        "metrics_rise": counter_deltas(before, idle_after),
        "replaced_processes": replaced, "tracebacks": log_tracebacks(fleets),
        "idle": {"leftover_keys": keys, "gauges": gauges, "fd_growth": fd_growth,
                 "fds_before": before["fds"], "fds_after": idle_after["fds"],
                 "redis_keys_before": before["redis"]["keys"], "redis_keys_after": idle_after["redis"]["keys"]},
    }


def start_fleets(args: argparse.Namespace, log_dir: Path):
    from api.embedded_redis import EmbeddedRedis

    redis = EmbeddedRedis().start()
    # Set so the bursts pass it on any machine; the default follows the live replicas.
    common = {"KOKORO_PLAYGROUND": "false", "KOKORO_QUEUE_MAX_REQUESTS": str(args.fleet_max_requests)}
    sim_env = {**common, "KOKORO_ENGINE": "sim", "KOKORO_SIM_CHUNK_MS": f"{args.sim_chunk_ms:g}",
               "KOKORO_SIM_PHONEME_MS": f"{args.sim_phoneme_ms:g}"}
    real_env = {**common, "KOKORO_ENGINE": "torch", "KOKORO_THREADS": str(args.real_threads)}
    fleets = [FleetProcess(args.sim_workers, redis_url=redis.url, weights="tiny", env=sim_env, log_dir=log_dir,
                           name="sim")]
    if args.real_workers > 0:
        fleets.append(FleetProcess(args.real_workers, redis_url=redis.url, weights=args.real_weights, env=real_env,
                                   log_dir=log_dir, name="real"))
    try:
        start_all(fleets, timeout_s=args.start_timeout)
    except BaseException:
        stop_all(fleets)
        redis.stop()
        raise
    return redis, fleets


def soak(args: argparse.Namespace) -> dict[str, Any]:
    log_dir = Path(args.log_dir or tempfile.mkdtemp(prefix="kokoro-soak-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    redis, fleets = start_fleets(args, log_dir)
    try:
        result = asyncio.run(soak_fleets(args, fleets, redis))
    finally:
        stop_all(fleets)
        redis.stop()
    result["server_logs"] = str(log_dir)
    result["failures"] = soak_failures(args, result)
    return result


def report_soak(result: dict[str, Any]) -> str:
    lines = [f"soak: {result['load_s']:.0f} s of mixed load on fleets "
             f"{', '.join(sorted({s.split('/')[0] for s in result['samples'][0]['rss_mib'] if '/' in s}))} "
             f"and one redis-server; CPU {result['machine'].get('cpu', '?')}"]
    for kind, c in result["by_kind"].items():
        lines.append(f"  {kind:>8}: {c['ok']:>6} ok {c['refused']:>5} refused (503) {c['error']:>4} errors")
    lines.append("slopes per minute over the load's second half (mean beside):")
    for name, fit in sorted(result["slopes"].items()):
        per_min = "-" if fit["per_min"] is None else f"{fit['per_min']:+.3f}"
        lines.append(f"  {name:<60} {per_min:>9}/min  (mean {fit['mean']:.1f})")
    rise = {k: v for k, v in result["metrics_rise"].items() if v}
    lines.append(f"/metrics counters that rose: {rise or 'none'}")
    idle = result["idle"]
    lines.append(f"idle after the settle: Redis keys {idle['redis_keys_before']} -> {idle['redis_keys_after']}, "
                 f"request keys left: {idle['leftover_keys'] or 'none'}; gauges {idle['gauges']}")
    lines.append("descriptors idle before -> after: " + ", ".join(
        f"{label} {idle['fds_before'][label]}->{idle['fds_after'].get(label, '-')}"
        for label in sorted(idle["fds_before"])))
    passed = "PASS: no errors, no request keys left, descriptors back to idle" + (
        ", every slope within its bound" if result["config"].get("fail_on_leak") else "")
    lines += [f"FAIL: {f}" for f in result["failures"]] or [passed]
    return "\n".join(lines)


def plot_soak(result: dict[str, Any], path: str | Path) -> Path:
    """RSS and descriptors per process, Redis memory and keys, and the outcomes over time."""
    from loadtest.report import _plt, _save

    plt = _plt()
    fig, axes = plt.subplots(2, 2, figsize=(13, 8), sharex=True)
    all_series = sampled_series(result["samples"])
    half = result["load_s"] / 2
    for ax, kind, unit in ((axes[0][0], "rss_mib", "RSS (MiB)"), (axes[0][1], "fds", "open descriptors")):
        for name, points in sorted(all_series.items()):
            if name.startswith(kind + " "):
                ax.plot([t / 60 for t, _ in points], [v for _, v in points], label=name.split(" ", 1)[1], lw=1)
        ax.set_ylabel(unit)
        ax.legend(fontsize=6, loc="upper left", ncol=2)
    ax = axes[1][0]
    mem = all_series["redis_used_memory_mib"]
    ax.plot([t / 60 for t, _ in mem], [v for _, v in mem], color="tab:red", lw=1, label="used_memory (MiB)")
    ax.set_ylabel("Redis used_memory (MiB)")
    keys_ax = ax.twinx()
    keys = all_series["redis_keys"]
    keys_ax.plot([t / 60 for t, _ in keys], [v for _, v in keys], color="tab:blue", lw=1, label="keys (DBSIZE)")
    keys_ax.set_ylabel("Redis keys")
    ax.legend(loc="upper left", fontsize=7)
    keys_ax.legend(loc="upper right", fontsize=7)
    ax = axes[1][1]
    for kind, color in zip(KINDS, ("tab:blue", "tab:green", "tab:purple", "tab:brown", "tab:orange")):
        for outcome, style in (("ok", "-"), ("refused", ":"), ("error", "--")):
            ts = sorted(o["at_s"] / 60 for o in result["outcomes"] if o["kind"] == kind and o["outcome"] == outcome)
            if ts:
                ax.step(ts, range(1, len(ts) + 1), style, color="tab:red" if outcome == "error" else color,
                        where="post", lw=1, label=f"{kind} {outcome}")
    ax.set_ylabel("requests so far")
    ax.set_yscale("symlog")
    ax.legend(fontsize=6, loc="upper left", ncol=2)
    for row in axes:
        for a in row:
            a.axvspan(half / 60, result["load_s"] / 60, color="0.9", zorder=0)
            a.grid(alpha=0.3)
    for a in axes[1]:
        a.set_xlabel("minutes (shaded: the second half, where slopes are fitted)")
    fig.suptitle(f"soak, {result['load_s'] / 60:.0f} min: {'PASS' if not result['failures'] else 'FAIL'}; "
                 f"CPU {result['machine'].get('cpu', '?')}", fontsize=9)
    return _save(fig, path, plt)


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("--duration", type=float, default=1800.0, help="seconds of mixed load (default 1800)")
    p.add_argument("--out", default="", help="soak.json and soak.png go here (default loadtest-results/soak-<time>)")
    p.add_argument("--sample-every", type=float, default=5.0, help="seconds between samples (default 5)")
    p.add_argument("--settle", type=float, default=10.0,
                   help="seconds idle after the warm-up and after the load, before the idle samples (default 10)")
    fleet = p.add_argument_group("fleets")
    fleet.add_argument("--sim-workers", type=int, default=2, help="simulated-engine replicas (default 2)")
    fleet.add_argument("--real-workers", type=int, default=1, help="torch-engine replicas; 0: none (default 1)")
    fleet.add_argument("--real-weights", default="offline",
                       help="KOKORO_WEIGHTS of the torch fleet: offline (the real model), tiny (default offline)")
    fleet.add_argument("--real-threads", type=int, default=1, help="torch threads of each real replica (default 1)")
    fleet.add_argument("--sim-chunk-ms", type=float, default=SIM_CHUNK_MS)
    fleet.add_argument("--sim-phoneme-ms", type=float, default=SIM_PHONEME_MS)
    fleet.add_argument("--fleet-max-requests", type=int, default=8,
                       help="KOKORO_QUEUE_MAX_REQUESTS: requests admitted at once fleet-wide (default 8)")
    fleet.add_argument("--start-timeout", type=float, default=600.0, help="seconds for the fleets to be ready")
    fleet.add_argument("--log-dir", help="keep the servers' logs here (default: a temporary directory)")
    load = p.add_argument_group("load (users run side by side, each alternating between the fleets)")
    load.add_argument("--stream-users", type=int, default=2)
    load.add_argument("--download-users", type=int, default=1)
    load.add_argument("--live-users", type=int, default=1)
    load.add_argument("--cancel-users", type=int, default=1)
    load.add_argument("--think", type=float, default=1.0, help="seconds a user waits between requests, jittered")
    load.add_argument("--live-words-per-second", type=float, default=20.0)
    load.add_argument("--burst-every", type=float, default=30.0, help="seconds between bursts, jittered")
    load.add_argument("--burst-size", type=int, default=24, help="requests at once in a burst")
    load.add_argument("--timeout", type=float, default=180.0, help="longest a request may take")
    load.add_argument("--seed", type=int, default=0)
    check = p.add_argument_group("checks")
    check.add_argument("--max-fd-growth", type=int, default=16,
                       help="descriptors a process may hold more when idle after the load than idle before it")
    check.add_argument("--fail-on-leak", action="store_true",
                       help="also fail when a series grows faster than its bound over the second half: "
                            + ", ".join(f"{k} {v:g}/min" for k, v in LEAK_BOUNDS.items())
                            + " (RSS and fds per process)")


def run(args: argparse.Namespace) -> int:
    result = soak(args)
    out = Path(args.out or f"loadtest-results/soak-{time.strftime('%Y%m%d-%H%M%S')}")
    out.mkdir(parents=True, exist_ok=True)
    (out / "soak.json").write_text(json.dumps(result, default=str) + "\n")
    print(report_soak(result))
    print(f"result: {out / 'soak.json'}; plot: {plot_soak(result, out / 'soak.png')}; "
          f"server logs: {result['server_logs']}")
    return 1 if result["failures"] else 0
