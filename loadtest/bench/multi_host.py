"""Several machines, two ways, measured side by side on hosts that are really apart (issue 57).

    python -m loadtest.bench.multi_host [--fleets 3] [--workers 2] [--rtts 0,1,10] [--slice 20]
                                        [--out-dir loadtest/results/DATE-multi-host]

Every host is a network namespace of its own (loadtest/hosts.py): a client, a balancer, a Redis host
and `--fleets` fleet hosts, on one private /24. Each fleet host runs two `kokoro-fleet serve` fleets
of `--workers` simulated replicas (KOKORO_ENGINE=sim: a replica waits a cost model's time and uses no
CPU, so a 2-core machine can hold several fleets of "GPU" replicas; a real engine here would measure
the cores, not the fleets):

- **independent**: each fleet with its own embedded Redis, behind HAProxy with deploy/haproxy/haproxy.cfg
  (503 retried on another fleet, /ready health checks);
- **shared**: the fleets on one Redis on the Redis host, reached through a delaying link
  (loadtest/delay_link.py) set to each of `--rtts` in turn, behind the same HAProxy config.

The same seeded Poisson arrivals (the sim fleet's overload scenario: `--factor` x the measured
capacity; and a steady load: `--steady` x capacity) go to both shapes, interleaved per round trip,
and each slice records throughput, first audio p50/p95, the 503s' latency, the status codes, and the
Redis CPU and bytes per audio-second (the one shared Redis, or the sum of the fleets' own). Then:
the shared Redis is killed and restarted under the steady load (requests failed, time until every
replica is back on the queue), and, behind the balancer, one fleet is overloaded `--factor` x by
clients of its own while another is SIGKILLed mid-run (`fault_run`, which the CI test runs short).
Writes result.json, report.txt and multi_host.png into `--out-dir`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from loadtest import listener_metrics as metrics
from loadtest.dispatch import FleetProcess, start_all, stop_all, write_result
from loadtest.hosts import Hosts, DelayedLink
from loadtest.runner import Runner, Step, StepRun, Target, Workload, summarize
from loadtest.scenarios import SIM_CHUNK_MS, SIM_PHONEME_MS
from loadtest.texts import load_texts

REPO = Path(__file__).resolve().parents[2]
HAPROXY_CONFIG = REPO / "deploy" / "haproxy" / "haproxy.cfg"
BALANCER_PORTS = {"independent": 8000, "shared": 8001}
REDIS_PORT, REDIS_LINK_PORT = 6379, 6380


def fleet_hosts(count: int) -> list[str]:
    return [f"fleet{i + 1}" for i in range(count)]


@dataclass
class Site:
    """The hosts, the fleets of each shape, the shared Redis and its link, one HAProxy per shape."""

    fleets: int = 3
    workers: int = 2
    shapes: tuple[str, ...] = ("independent", "shared")
    env: dict[str, str] = field(default_factory=dict)
    rtt_ms: float = 1.0
    log_dir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="kokoro-multi-host-")))
    hosts: Hosts | None = None
    by_shape: dict[str, list[FleetProcess]] = field(default_factory=dict)
    redis: subprocess.Popen | None = None
    redis_link: DelayedLink | None = None
    balancers: dict[str, subprocess.Popen] = field(default_factory=dict)

    # --- start and stop ---------------------------------------------------------------------------------
    def start(self) -> "Site":
        self.hosts = Hosts(["client", "balancer", "redis", *fleet_hosts(self.fleets)]).start()
        try:
            if "shared" in self.shapes:
                self.start_redis()
                self.redis_link = self.hosts.delayed_link("redis", REDIS_LINK_PORT, to_port=REDIS_PORT,
                                                          rtt_ms=self.rtt_ms)
            for shape in self.shapes:
                self.by_shape[shape] = [self._fleet(shape, host) for host in fleet_hosts(self.fleets)]
            with self.hosts.entered("client"):  # readiness is asked over the network, as a client would
                start_all([f for fleets in self.by_shape.values() for f in fleets], timeout_s=600)
            for shape in self.shapes:
                self.balancers[shape] = self._balancer(shape)
        except BaseException:
            self.close()
            raise
        return self

    def _fleet(self, shape: str, host: str) -> FleetProcess:
        assert self.hosts is not None
        redis_url = f"redis://{self.hosts.address('redis')}:{REDIS_LINK_PORT}/0" if shape == "shared" else None
        return FleetProcess(self.workers, redis_url=redis_url, env={**self.env, "KOKORO_PLAYGROUND": "false"},
                            log_dir=self.log_dir, name=f"{shape}-{host}", host=self.hosts.address(host),
                            launch=self.hosts.command(host, []))

    def start_redis(self) -> None:
        assert self.hosts is not None
        self.redis = self.hosts.popen("redis", ["redis-server", "--port", str(REDIS_PORT), "--bind", "127.0.0.1",
                                                "--save", "", "--appendonly", "no", "--loglevel", "warning"],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while "PONG" not in self.redis_cli("redis", f"redis://127.0.0.1:{REDIS_PORT}/0", "ping"):
            if time.monotonic() > deadline:
                raise RuntimeError("the shared redis-server did not answer")
            time.sleep(0.05)

    def kill_redis(self) -> None:
        """A crash: SIGKILL, nothing flushed, every connection cut."""
        if self.redis is not None and self.redis.poll() is None:
            os.killpg(self.redis.pid, signal.SIGKILL)
            self.redis.wait(10)

    def _balancer(self, shape: str) -> subprocess.Popen:
        assert self.hosts is not None
        env = {**os.environ, "KOKORO_BALANCER_BIND": f"{self.hosts.address('balancer')}:{BALANCER_PORTS[shape]}"}
        for i, f in enumerate(self.by_shape[shape]):
            env[f"KOKORO_FLEET_{i + 1}"] = f.url.removeprefix("http://")
        log = open(self.log_dir / f"haproxy-{shape}.log", "wb")
        # The deployed config unchanged, plus a stats socket of the harness's own (a second global section).
        stats = self.log_dir / f"haproxy-{shape}-stats.cfg"
        stats.write_text(f"global\n    stats socket {self.stats_socket(shape)} mode 600 level admin\n")
        proc = self.hosts.popen("balancer", ["haproxy", "-db", "-f", str(HAPROXY_CONFIG), "-f", str(stats)],
                                env=env, stdout=log, stderr=subprocess.STDOUT)
        url = self.balancer_url(shape)
        deadline = time.monotonic() + 60
        with self.hosts.entered("client"):
            while True:  # until the health checks have brought every fleet in
                with contextlib.suppress(httpx.HTTPError):
                    if all(httpx.get(url + "/ready", timeout=2).status_code == 200 for _ in range(self.fleets)):
                        break
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"haproxy for {shape} did not come up: {(self.log_dir / f'haproxy-{shape}.log').read_text()[-2000:]}")
                time.sleep(0.2)
        time.sleep(2.5)  # rise 2 at inter 1s: every server counted up, not only the first
        return proc

    def stats_socket(self, shape: str) -> Path:
        return self.log_dir / f"haproxy-{shape}.sock"

    def balancer_counters(self, shape: str) -> dict[str, int]:
        """HAProxy's own counts for the shape's backend: retries (`wretr`), redispatches to another
        fleet (`wredis`), and the 5xx and connection errors it met at the fleets."""
        import socket

        with socket.socket(socket.AF_UNIX) as sock:
            sock.connect(str(self.stats_socket(shape)))
            sock.sendall(b"show stat\n")
            raw = b""
            while chunk := sock.recv(65536):
                raw += chunk
        lines = raw.decode().splitlines()
        header = lines[0].lstrip("# ").split(",")
        for line in lines[1:]:
            row = dict(zip(header, line.split(",")))
            if row.get("pxname") == "fleets" and row.get("svname") == "BACKEND":
                return {k: int(row[k] or 0) for k in ("wretr", "wredis", "hrsp_5xx", "econ", "eresp")}
        return {}

    def balancer_url(self, shape: str) -> str:
        assert self.hosts is not None
        return f"http://{self.hosts.address('balancer')}:{BALANCER_PORTS[shape]}"

    def close(self) -> None:
        stop_all([f for fleets in self.by_shape.values() for f in fleets])
        if self.hosts is not None:
            self.hosts.close()  # the balancers, Redis, the links, and anything left in the namespaces

    def __enter__(self) -> "Site":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    # --- Redis figures -------------------------------------------------------------------------------------
    def redis_cli(self, host: str, url: str, *args: str) -> str:
        assert self.hosts is not None
        done = subprocess.run(self.hosts.command(host, ["redis-cli", "-u", url, *args]), capture_output=True,
                              text=True, timeout=30)
        return done.stdout

    def redis_counters(self, shape: str) -> dict[str, float]:
        """CPU seconds and bytes in and out so far, of the shape's Redis servers together."""
        if shape == "shared":
            servers = [("redis", f"redis://127.0.0.1:{REDIS_PORT}/0")]
        else:
            servers = [(f"fleet{i + 1}", f.redis_url()) for i, f in enumerate(self.by_shape[shape])]
        total = {"cpu_s": 0.0, "bytes": 0.0}
        for host, url in servers:
            info = dict(line.split(":", 1) for line in self.redis_cli(host, url, "info", "all").splitlines()
                        if ":" in line and not line.startswith("#"))
            total["cpu_s"] += float(info.get("used_cpu_sys", 0)) + float(info.get("used_cpu_user", 0))
            total["bytes"] += float(info.get("total_net_input_bytes", 0)) + float(info.get("total_net_output_bytes", 0))
        total["t"] = time.monotonic()
        return total

    async def live_replicas(self) -> int:
        """Replicas registered live in the shared Redis (0 when it does not answer)."""
        from api.speech.redis_link import QueueUnavailable, connect, read_stats

        client = connect(f"redis://{self.hosts.address('redis')}:{REDIS_LINK_PORT}/0")
        try:
            return (await read_stats(client)).live_replicas
        except QueueUnavailable:
            return 0
        finally:
            await client.aclose()


# --- one slice of load ------------------------------------------------------------------------------------

def slice_figures(run: StepRun, redis_before: dict[str, float] | None, redis_after: dict[str, float] | None) -> dict[str, Any]:
    s = summarize([run])
    rows = [r for r in run.rows if r.phase == "measure"]
    refused = [r for r in rows if r.outcome == "rejected"]
    statuses: dict[str, int] = {}
    for r in rows:
        key = "dropped by the client" if r.outcome == "dropped" else (
            "200 cut short" if r.status == 200 and r.outcome == "error" else str(r.status or "no answer"))
        statuses[key] = statuses.get(key, 0) + 1
    audio = s["audio_s_per_wall_s"] * s["wall_s"]
    fig = {"ok": s["ok"], "rejected_503": s["rejected_503"], "errors": s["errors"], "dropped": s["dropped"],
           "statuses": statuses, "requests_per_s": s["requests_per_s"], "audio_s_per_s": s["audio_s_per_wall_s"],
           "ttfa_s": s["ttfa_s"], "refused_latency_s": metrics.distribution([r.e2e_s for r in refused if r.e2e_s]),
           "every_503_has_retry_after": all(r.retry_after.strip() != "" for r in refused),
           "wall_s": s["wall_s"]}
    if redis_before and redis_after:
        wall = max(1e-9, redis_after["t"] - redis_before["t"])
        cpu = redis_after["cpu_s"] - redis_before["cpu_s"]
        moved = redis_after["bytes"] - redis_before["bytes"]
        fig["redis"] = {"cpu_share": cpu / wall, "bytes_per_s": moved / wall,
                        "bytes_per_audio_s": moved / audio if audio else None,
                        "cpu_ms_per_audio_s": 1000 * cpu / audio if audio else None}
    return fig


async def measured_slice(site: Site, runner: Runner, shape: str, step: Step, text_offset: int) -> dict[str, Any]:
    before = await asyncio.to_thread(site.redis_counters, shape)
    run = await runner.run_step(step, Target(site.balancer_url(shape) + "/v1/audio/speech", shape),
                                text_offset=text_offset)
    after = await asyncio.to_thread(site.redis_counters, shape)
    return slice_figures(run, before, after)


async def link_rtt_ms(site: Site, samples: int = 20) -> float:
    """The Redis link's round trip as a client meets it: the median of PINGs through the relay."""
    from api.speech.redis_link import connect

    client = connect(f"redis://{site.hosts.address('redis')}:{REDIS_LINK_PORT}/0")
    try:
        await client.ping()
        times = []
        for _ in range(samples):
            t = time.perf_counter()
            await client.ping()
            times.append(time.perf_counter() - t)
        return 1000 * sorted(times)[len(times) // 2]
    finally:
        await client.aclose()


# --- the balancer under faults: one fleet overloaded, another SIGKILLed ---------------------------------

async def fault_run(site: Site, *, balancer_rate: float, overload_rate: float, duration: float,
                    texts: list[str], seed: int = 0, kill_at: float = 0.5) -> dict[str, Any]:
    """Behind the independent shape's balancer: Poisson arrivals at `balancer_rate` through HAProxy
    while clients of its own send `overload_rate` straight to fleet 1, and fleet 2 is SIGKILLed (the
    whole process tree) at `kill_at` of the run. What the balancer's clients saw, and which of them
    failed while fleet 2 held their streams."""
    fleets = site.by_shape["independent"]
    victim, overloaded = fleets[1], fleets[0]
    workload = Workload(texts=texts, response_format="pcm", stream=True, timeout=60, max_outstanding=512, seed=seed)
    through = Runner(workload, [Step("open", balancer_rate, duration)], progress=False)
    direct = Runner(Workload(texts=texts, response_format="pcm", stream=True, timeout=60, max_outstanding=512,
                             seed=seed + 1), [Step("open", overload_rate, duration)], progress=False)
    killed_at: list[float] = []

    async def kill_later() -> None:
        await asyncio.sleep(duration * kill_at)
        killed_at.append(time.perf_counter())
        os.killpg(victim.proc.pid, signal.SIGKILL)

    counters_before = site.balancer_counters("independent")
    try:
        balanced, overload, _ = await asyncio.gather(
            through.run_step(Step("open", balancer_rate, duration),
                             Target(site.balancer_url("independent") + "/v1/audio/speech", "balancer")),
            direct.run_step(Step("open", overload_rate, duration),
                            Target(overloaded.url + "/v1/audio/speech", "fleet1 direct")),
            kill_later())
    finally:
        await through.aclose()
        await direct.aclose()
    kill = killed_at[0]
    counters = site.balancer_counters("independent")
    balancer = {k: v - counters_before.get(k, 0) for k, v in counters.items()}
    rows = [r for r in balanced.rows if r.outcome != "dropped"]
    failed = [r for r in rows if r.status not in (200, 503) or (r.status == 200 and r.outcome != "ok")]
    refused = [r for r in rows if r.status == 503]
    return {
        "balancer_rate_per_s": balancer_rate, "fleet1_direct_rate_per_s": overload_rate, "duration_s": duration,
        "killed_fleet": victim.name, "kill_at_s": duration * kill_at,
        "balancer": slice_figures(balanced, None, None),
        "fleet1_direct": slice_figures(overload, None, None),
        "requests": len(rows),
        "refused_503": len(refused), "refused_share": len(refused) / len(rows) if rows else None,
        "refused_without_retry_after": sum(1 for r in refused if not r.retry_after.strip()),
        "failed": len(failed),
        # a failure is the killed fleet's only if its request was sent before the kill and ended after it
        "failed_open_at_kill": sum(1 for r in failed if r.t_send < kill <= r.t_send + (r.e2e_s or 1e9)),
        "failed_examples": [f"{r.status} {r.error[:120]}" for r in failed[:6]],
        "refused_examples": [f"{r.t_send - kill:+.2f} s from the kill: {r.error[:120]}" for r in refused[:6]],
        "haproxy": balancer,
    }


def fault_checks(fault: dict[str, Any]) -> dict[str, bool]:
    return {
        "every balancer response a 200 or a 503 with Retry-After, apart from the killed fleet's open streams":
            fault["failed"] == fault["failed_open_at_kill"] and fault["refused_without_retry_after"] == 0,
        "503s to the balancer's clients below 1%": (fault["refused_share"] or 0) < 0.01,
        "fleet 1 was overloaded (its own clients were refused)": fault["fleet1_direct"]["rejected_503"] > 0,
        "HAProxy sent refused or failed requests to another fleet": fault["haproxy"].get("wredis", 0) > 0,
    }


# --- the benchmark -----------------------------------------------------------------------------------------

async def measure(site: Site, args: argparse.Namespace) -> dict[str, Any]:
    texts = load_texts(args.texts)
    workload = Workload(texts=texts, response_format="pcm", stream=True, timeout=120,
                        max_outstanding=args.max_outstanding, seed=args.seed)
    replicas = site.fleets * site.workers
    calib = Step("closed", replicas, args.calibrate)
    runner = Runner(workload, [calib, Step("open", 1.0, args.slice)], progress=not args.quiet)
    result: dict[str, Any] = {"slices": []}
    try:
        for shape in site.shapes:
            await runner.warmup(Target(site.balancer_url(shape) + "/v1/audio/speech", shape), 2 * replicas, replicas)
        cap = summarize([await runner.run_step(calib, Target(site.balancer_url("independent") + "/v1/audio/speech",
                                                                "capacity"))])
        capacity = cap["requests_per_s"]
        result.update(capacity_requests_per_s=capacity, capacity_audio_s_per_s=cap["audio_s_per_wall_s"])
        print(f"capacity of {site.fleets} fleets of {site.workers} behind the balancer: {capacity:.2f} requests/s",
              flush=True)
        loads = {"steady": args.steady * capacity, "overload": args.factor * capacity}
        offset = 0
        for rtt_index, rtt in enumerate(args.rtts):
            site.redis_link.set_rtt(rtt)
            measured_rtt = await link_rtt_ms(site)
            order = site.shapes if rtt_index % 2 == 0 else tuple(reversed(site.shapes))
            for load, rate in loads.items():
                for shape in order:
                    offset += 1000
                    fig = await measured_slice(site, runner, shape, Step("open", rate, args.slice), offset)
                    fig.update(shape=shape, load=load, rate_per_s=rate, set_rtt_ms=rtt, link_rtt_ms=measured_rtt)
                    result["slices"].append(fig)
                    print(slice_line(fig), flush=True)
        site.redis_link.set_rtt(args.restart_rtt)
        result["redis_restart"] = await redis_restart(site, runner, Step("open", loads["steady"], args.restart_slice),
                                                      offset + 1000, args.restart_rtt)
        print(f"redis restart: {result['redis_restart']}", flush=True)
    finally:
        await runner.aclose()
    per_fleet = capacity / site.fleets
    result["fault"] = await fault_run(site, balancer_rate=args.fault_share * per_fleet,
                                      overload_rate=args.factor * per_fleet, duration=args.fault_slice,
                                      texts=texts, seed=args.seed)
    result["fault_checks"] = fault_checks(result["fault"])
    result["crossover"] = crossover(result["slices"])
    return result


async def redis_restart(site: Site, runner: Runner, step: Step, offset: int, rtt: float) -> dict[str, Any]:
    """Steady load on the shared shape; the shared Redis SIGKILLed at a quarter of the slice and
    started again (empty) a second later. Requests failed, and the seconds from the restart until
    every replica is registered live again."""
    replicas = site.fleets * site.workers

    async def crash() -> dict[str, float]:
        await asyncio.sleep(step.duration / 4)
        site.kill_redis()
        killed = time.monotonic()
        await asyncio.sleep(1.0)
        site.start_redis()
        restarted = time.monotonic()
        while await site.live_replicas() < replicas and time.monotonic() - restarted < step.duration:
            await asyncio.sleep(0.1)
        return {"down_s": restarted - killed, "replicas_back_after_s": time.monotonic() - restarted}

    run, times = await asyncio.gather(
        runner.run_step(step, Target(site.balancer_url("shared") + "/v1/audio/speech", "shared restart"),
                        text_offset=offset), crash())
    fig = slice_figures(run, None, None)
    return {"set_rtt_ms": rtt, "rate_per_s": step.value, "duration_s": step.duration, **times,
            "requests": sum(fig["statuses"].values()), "failed": fig["errors"], "statuses": fig["statuses"],
            "ttfa_s": fig["ttfa_s"]}


def crossover(slices: list[dict[str, Any]]) -> dict[str, Any]:
    """Per load: p95 first audio of the shared shape minus the independent one's (the mean of its
    slices) at each round trip the link was measured to have (PING through it: under a loaded
    machine the relay's wake-ups add to the set delay), and the round trip where the difference
    crosses zero (linear between measured points; None when it does not cross within them, with the
    side it stays on)."""
    out: dict[str, Any] = {}
    for load in sorted({s["load"] for s in slices}):
        indep = [s["ttfa_s"]["p95"] for s in slices if s["load"] == load and s["shape"] == "independent"
                 and s["ttfa_s"]["p95"] is not None]
        base = sum(indep) / len(indep) if indep else None
        points = sorted((s["link_rtt_ms"], s["ttfa_s"]["p95"] - base) for s in slices
                        if s["load"] == load and s["shape"] == "shared" and s["ttfa_s"]["p95"] is not None
                        and base is not None)
        # The independent shape's own p95 moves from slice to slice with the machine: a difference
        # within that spread is noise, not a crossing.
        spread = max(indep) - min(indep) if len(indep) > 1 else 0.0
        cross = None
        if not all(abs(d) <= spread for _, d in points):
            for (r0, d0), (r1, d1) in zip(points, points[1:]):
                if d0 <= 0 < d1:
                    cross = r0 + (r1 - r0) * (-d0) / (d1 - d0)
                    break
        if cross is not None or not points:
            side = None
        elif all(abs(d) <= spread for _, d in points):
            side = (f"no difference beyond the independent shape's own slice-to-slice spread "
                    f"({spread * 1000:.0f} ms) at any measured round trip")
        elif all(d > 0 for _, d in points):
            side = "shared slower at every measured round trip"
        elif all(d <= 0 for _, d in points):
            side = "shared faster at every measured round trip"
        else:
            side = "no single crossing: the sign changes back and forth (noise)"
        # The shared Redis's own ceiling: the audio-s/s at which its CPU would fill one core, and at
        # which its bytes would fill a 1 Gbit/s link, from what each audio-second cost it here.
        shared = [s["redis"] for s in slices if s["load"] == load and s["shape"] == "shared" and s.get("redis")
                  and s["redis"]["cpu_ms_per_audio_s"]]
        cpu_ms = sum(r["cpu_ms_per_audio_s"] for r in shared) / len(shared) if shared else None
        per_audio = sum(r["bytes_per_audio_s"] for r in shared) / len(shared) if shared else None
        out[load] = {"independent_p95_s": base, "independent_p95_spread_s": spread,
                     "shared_minus_independent_p95_s": points,
                     "crossover_rtt_ms": cross, "no_crossover": side,
                     "shared_redis_cpu_ms_per_audio_s": cpu_ms,
                     "shared_redis_core_full_at_audio_s_per_s": 1000 / cpu_ms if cpu_ms else None,
                     "shared_redis_bytes_per_audio_s": per_audio,
                     "gigabit_full_at_audio_s_per_s": 1e9 / 8 / per_audio if per_audio else None}
    return out


def slice_line(s: dict[str, Any]) -> str:
    t, lat = s["ttfa_s"], s["refused_latency_s"]
    r = s.get("redis") or {}
    return (f"{s['shape']:>11} {s['load']:>8} rtt {s['set_rtt_ms']:g} ms (PING {s['link_rtt_ms']:.1f} ms): "
            f"{s['requests_per_s']:.1f} req/s, {s['audio_s_per_s']:.1f} audio-s/s, first audio p50 {_ms(t['p50'])} "
            f"p95 {_ms(t['p95'])}, 503 {s['rejected_503']} in p50 {_ms(lat['p50'])} p95 {_ms(lat['p95'])}, "
            f"errors {s['errors']}; Redis CPU {r.get('cpu_share', 0):.1%} of a core, "
            f"{(r.get('bytes_per_audio_s') or 0) / 1000:.1f} kB per audio-s")


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x * 1000:.0f} ms"


def report(result: dict[str, Any]) -> str:
    lines = [f"machine: {result['machine']}; load average before {result['load_before']}, after {result['load_after']}",
             f"command: {result['command']}",
             f"{result['fleets']} fleets of {result['workers']} sim replicas ({result['sim']}), texts "
             f"'{result['texts']}'; capacity {result['capacity_requests_per_s']:.2f} requests/s "
             f"({result['capacity_audio_s_per_s']:.1f} audio-s/s)"]
    lines += [slice_line(s) for s in result["slices"]]
    for load, c in result["crossover"].items():
        pts = ", ".join(f"{r:.1f} ms: {d * 1000:+.0f} ms" for r, d in c["shared_minus_independent_p95_s"])
        where = (f"crossover at {c['crossover_rtt_ms']:.1f} ms round trip" if c["crossover_rtt_ms"] is not None
                 else c["no_crossover"])
        lines.append(f"{load}: shared minus independent p95 first audio by round trip: {pts}; {where}")
        if c["shared_redis_cpu_ms_per_audio_s"]:
            lines.append(f"  the shared Redis spent {c['shared_redis_cpu_ms_per_audio_s']:.2f} ms CPU and moved "
                         f"{c['shared_redis_bytes_per_audio_s'] / 1000:.0f} kB per audio-second: one core full at "
                         f"{c['shared_redis_core_full_at_audio_s_per_s']:.0f} audio-s/s, a 1 Gbit/s link at "
                         f"{c['gigabit_full_at_audio_s_per_s']:.0f}")
    rr = result["redis_restart"]
    lines.append(f"shared Redis killed and restarted (down {rr['down_s']:.1f} s) under {rr['rate_per_s']:.1f} "
                 f"req/s at {rr['set_rtt_ms']:g} ms: {rr['failed']} of {rr['requests']} requests failed "
                 f"({rr['statuses']}); every replica back on the queue {rr['replicas_back_after_s']:.1f} s after the restart")
    f = result["fault"]
    lines.append(f"balancer under faults: {f['balancer_rate_per_s']:.1f} req/s through HAProxy, fleet1 offered "
                 f"{f['fleet1_direct_rate_per_s']:.1f} req/s of its own (statuses {f['fleet1_direct']['statuses']}), "
                 f"{f['killed_fleet']} SIGKILLed at {f['kill_at_s']:.0f} s: balancer clients saw "
                 f"{f['balancer']['statuses']}; 503 share {100 * (f['refused_share'] or 0):.2f}%; "
                 f"{f['failed']} failed, {f['failed_open_at_kill']} of them streams open on the killed fleet; "
                 f"HAProxy's counts {f['haproxy']}")
    for name, ok in result["fault_checks"].items():
        lines.append(f"  [{'PASS' if ok else 'FAIL'}] {name}")
    return "\n".join(lines)


def plot(result: dict[str, Any], path: Path) -> Path:
    """p95 first audio by round trip, both shapes and both loads; Redis bytes and CPU per audio-second."""
    from loadtest.report import _plt, _save

    plt = _plt()
    fig, axes = plt.subplots(1, 3, figsize=(14, 4.2))
    colors = {"independent": "tab:green", "shared": "tab:blue"}
    for ax, load in zip(axes[:2], ("steady", "overload")):
        for shape in ("independent", "shared"):
            pts = sorted((s["link_rtt_ms"], s["ttfa_s"]["p95"] * 1000) for s in result["slices"]
                         if s["load"] == load and s["shape"] == shape and s["ttfa_s"]["p95"] is not None)
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", color=colors[shape], label=shape)
        c = result["crossover"].get(load, {})
        if c.get("crossover_rtt_ms") is not None:
            ax.axvline(c["crossover_rtt_ms"], color="grey", ls=":", label=f"crossover {c['crossover_rtt_ms']:.1f} ms")
        ax.set_xlabel("Redis link round trip, measured by PING (ms)")
        ax.set_ylabel("first audio p95 (ms)")
        ax.set_title(f"{load} load", fontsize=9)
        ax.legend(fontsize=8)
    bx = axes[2]
    labels, kb, cpu = [], [], []
    for s in result["slices"]:
        if s["load"] == "steady" and s.get("redis"):
            labels.append(f"{s['shape'][:5]} {s['set_rtt_ms']:g}")
            kb.append((s["redis"]["bytes_per_audio_s"] or 0) / 1000)
            cpu.append(s["redis"]["cpu_ms_per_audio_s"] or 0)
    bx.bar(range(len(labels)), kb, color="tab:orange", label="kB per audio-s")
    bx.set_xticks(range(len(labels)), labels, rotation=30, fontsize=7)
    bx.set_ylabel("Redis kB per audio-second (steady)")
    cx = bx.twinx()
    cx.plot(range(len(labels)), cpu, "ks", label="CPU ms per audio-s")
    cx.set_ylabel("Redis CPU ms per audio-second")
    bx.set_title("Redis cost (all the shape's Redis servers)", fontsize=9)
    fig.suptitle(f"{result['fleets']} fleets x {result['workers']} sim replicas behind HAProxy, "
                 f"{result['machine']}", fontsize=9)
    return _save(fig, path, plt)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m loadtest.bench.multi_host", description=__doc__.splitlines()[0])
    p.add_argument("--fleets", type=int, default=3)
    p.add_argument("--workers", type=int, default=2, help="workers (sim replicas) per fleet")
    p.add_argument("--rtts", type=lambda v: [float(x) for x in v.split(",")], default=[0.0, 1.0, 10.0],
                   help="round trips of the shared Redis's link, ms")
    p.add_argument("--texts", default="short")
    p.add_argument("--sim-chunk-ms", type=float, default=SIM_CHUNK_MS)
    p.add_argument("--sim-phoneme-ms", type=float, default=SIM_PHONEME_MS)
    p.add_argument("--steady", type=float, default=0.6, help="the steady load, fraction of capacity")
    p.add_argument("--factor", type=float, default=4.0, help="the overload, multiple of capacity")
    p.add_argument("--slice", type=float, default=20.0, help="seconds of each measured slice")
    p.add_argument("--calibrate", type=float, default=15.0, help="seconds of the closed-loop capacity measurement")
    p.add_argument("--restart-rtt", type=float, default=10.0, help="the link's round trip during the Redis restart")
    p.add_argument("--restart-slice", type=float, default=24.0)
    p.add_argument("--fault-slice", type=float, default=24.0)
    p.add_argument("--fault-share", type=float, default=0.5,
                   help="balancer load in the fault run, fraction of one fleet's capacity (what one fleet left can carry)")
    p.add_argument("--max-outstanding", type=int, default=512)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out-dir", default=None, help="result.json, report.txt, multi_host.png (default: none written)")
    p.add_argument("--quiet", action="store_true")
    p.add_argument("--from-result", metavar="RESULT.json",
                   help="measure nothing: rebuild the crossover, report.txt and the plot of an earlier run")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.from_result:
        result = json.loads(Path(args.from_result).read_text())
        result["crossover"] = crossover(result["slices"])
        return write_outputs(result, args.out_dir or str(Path(args.from_result).parent))
    from loadtest.hosts import namespaces_available

    if (why := namespaces_available()) is not None:
        raise SystemExit(f"loadtest.bench.multi_host: {why}")
    env = {"KOKORO_ENGINE": "sim", "KOKORO_SIM_CHUNK_MS": f"{args.sim_chunk_ms:g}",
           "KOKORO_SIM_PHONEME_MS": f"{args.sim_phoneme_ms:g}"}
    load_before = os.getloadavg()
    started = time.monotonic()
    with Site(fleets=args.fleets, workers=args.workers, env=env, rtt_ms=args.rtts[0]) as site:
        print(f"{site.fleets} fleets of each shape ready ({time.monotonic() - started:.0f} s); logs {site.log_dir}",
              flush=True)
        with site.hosts.entered("client"):
            result = asyncio.run(measure(site, args))
    result.update(machine=_machine(), load_before=[round(x, 2) for x in load_before],
                  load_after=[round(x, 2) for x in os.getloadavg()], command="python -m loadtest.bench.multi_host "
                  + " ".join(argv if argv is not None else sys.argv[1:]), fleets=args.fleets, workers=args.workers,
                  texts=args.texts, sim=f"{args.sim_chunk_ms:g} ms + {args.sim_phoneme_ms:g} ms x phonemes per chunk",
                  haproxy=subprocess.run(["haproxy", "-v"], capture_output=True, text=True).stdout.splitlines()[0],
                  wall_s=time.monotonic() - started)
    return write_outputs(result, args.out_dir)


def write_outputs(result: dict[str, Any], out_dir: str | None) -> int:
    text = report(result)
    print(text)
    if out_dir:
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        write_result(result, out / "result.json")
        (out / "report.txt").write_text(text + "\n")
        print(f"plot: {plot(result, out / 'multi_host.png')}")
    return 0


def _machine() -> str:
    model = platform.processor() or ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return f"{model}, {os.cpu_count()} cores"


if __name__ == "__main__":
    sys.exit(main())
