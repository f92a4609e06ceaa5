"""Schedules of requests: closed loop (a concurrency sweep) and open loop (Poisson arrivals).

A step is one load level held for a duration. Closed loop at concurrency c: c virtual users, each
sending its next request as soon as its last one ends. Open loop at rate r: arrivals drawn once
from a seeded Poisson process and sent on time whatever the server does (a slow response never
delays the next arrival); when as many requests are outstanding as `max_outstanding` allows, an
arrival is recorded as `dropped` by the client, counted in the summary rather than silently
queued. Warm-up requests run before the first step and never enter a summary.
"""

from __future__ import annotations

import asyncio
import gc
import itertools
import random
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable, TextIO

from loadtest import listener_metrics as metrics
from loadtest.client import ConnectionSlots, RequestResult, RequestSpec, send_speech


# Closed loop: how long a user waits after a request that got no HTTP answer at all.
TRANSPORT_ERROR_PAUSE_S = 0.1


@dataclass(frozen=True)
class Step:
    kind: str  # "closed" | "open"
    value: float  # concurrency (closed) or arrivals per second (open)
    duration: float  # seconds

    @property
    def label(self) -> str:
        return f"c={int(self.value)}" if self.kind == "closed" else f"rate={self.value:g}"


@dataclass
class Target:
    """One server under test."""

    url: str
    label: str = "server"
    headers: dict[str, str] = field(default_factory=dict)


@dataclass
class Workload:
    """What every request of a run asks for (all but the text and the URL)."""

    texts: list[str]
    voice: str = "af_heart"
    model: str = "kokoro"
    response_format: str = "pcm"
    speed: float = 1.0
    stream: bool = True
    sse: bool = False
    extra: dict[str, Any] = field(default_factory=dict)
    timeout: float = 300.0  # whole request
    read_timeout: float = 120.0  # longest silence between two reads
    connect_timeout: float = 10.0
    max_outstanding: int = 256  # open loop: arrivals beyond this are dropped (and counted)
    honor_retry_after: bool = True  # closed loop: a user refused with 503 waits its Retry-After
    seed: int = 0

    def spec(self, target: Target, text_id: int) -> RequestSpec:
        return RequestSpec(url=target.url, text=self.texts[text_id % len(self.texts)],
                           text_id=text_id % len(self.texts), voice=self.voice, model=self.model,
                           response_format=self.response_format, speed=self.speed, stream=self.stream,
                           sse=self.sse, extra=self.extra, headers=target.headers)


def speech_url(url: str) -> str:
    """Accept a base URL (`http://host:8880`) or the full endpoint."""
    base = url.rstrip("/")
    tail = base.split("://", 1)[-1]
    return base if "/" in tail else base + "/v1/audio/speech"


def health_url(url: str) -> str:
    """The server's /health beside its speech endpoint (used to open connections and wait for it)."""
    return url.split("/v1/audio/speech", 1)[0].rstrip("/") + "/health"


def poisson_arrivals(rate: float, duration: float, seed: int) -> list[float]:
    """Arrival offsets (seconds from step start) of a Poisson process of `rate` per second."""
    rng = random.Random(f"{seed}:{rate}:{duration}")  # same schedule for every target and rerun
    t, out = 0.0, []
    while True:
        t += rng.expovariate(rate)
        if t >= duration:
            return out
        out.append(t)


class Progress:
    """A live one-line progress bar on stderr (redrawn in place on a terminal, a line every few
    seconds otherwise, so CI logs stay readable)."""

    def __init__(self, label: str, duration: float, stream: TextIO | None = None, enabled: bool = True) -> None:
        self.label, self.duration = label, duration
        self.stream = stream or sys.stderr
        self.enabled = enabled
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.t0 = time.perf_counter()
        self.in_flight = 0
        self.counts = {"ok": 0, "rejected": 0, "error": 0, "dropped": 0}
        self.ttfas: list[float] = []
        self._task: asyncio.Task | None = None
        self._last = ""

    def done(self, r: RequestResult) -> None:
        self.counts[r.outcome] = self.counts.get(r.outcome, 0) + 1
        if r.outcome == "ok" and r.ttfa_s is not None:
            self.ttfas.append(r.ttfa_s)

    def line(self) -> str:
        elapsed = time.perf_counter() - self.t0
        frac = min(1.0, elapsed / self.duration) if self.duration else 1.0
        width = 24
        bar = "#" * int(frac * width) + "." * (width - int(frac * width))
        c = self.counts
        p50 = metrics.percentile(self.ttfas[-200:], 50)
        ttfa = f" TTFA p50 {p50 * 1000:.0f} ms" if p50 is not None else ""
        dropped = f" dropped {c['dropped']}" if c["dropped"] else ""
        clock = (f"{elapsed:5.1f}/{self.duration:g}s" if elapsed <= self.duration
                 else f"draining {elapsed - self.duration:4.1f}s")  # the load has ended; waiting for the last responses
        return (f"{self.label:>14} [{bar}] {clock} "
                f"ok {c['ok']} 503 {c['rejected']} err {c['error']}{dropped} in-flight {self.in_flight}{ttfa}")

    async def _loop(self) -> None:
        every = 0.25 if self.tty else 5.0
        while True:
            await asyncio.sleep(every)
            self._draw()

    def _draw(self, final: bool = False) -> None:
        if not self.enabled:
            return
        line = self.line()
        if self.tty:
            self.stream.write("\r" + line + "\x1b[K" + ("\n" if final else ""))
        elif final or line != self._last:  # a log file gets a line only when something moved
            self.stream.write(line + "\n")
        self._last = line
        self.stream.flush()

    def start(self) -> None:
        self.t0 = time.perf_counter()
        if self.enabled:
            self._task = asyncio.get_running_loop().create_task(self._loop())

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
        self._draw(final=True)


@dataclass
class StepRun:
    """The raw outcome of one step against one target: rows and the wall-clock window."""

    step: Step
    target: Target
    rows: list[RequestResult]
    duration_s: float  # how long the load was held (a compare slice may be shorter than the step)
    wall_s: float  # from step start to the last response
    window_busy_s: float  # request-seconds in flight inside [start, start + duration]
    max_in_flight: int


class Runner:
    """Runs steps against targets; per target, one connection per request in flight."""

    def __init__(self, workload: Workload, steps: list[Step], progress: bool = True,
                 stream: TextIO | None = None, preconnect: bool = True) -> None:
        self.workload = workload
        self.preconnect = preconnect
        self.steps = steps
        self.progress = progress
        self.stream = stream
        self.epoch = time.perf_counter()
        most = max([int(s.value) for s in steps if s.kind == "closed"] + [1])
        if any(s.kind == "open" for s in steps):
            most = max(most, workload.max_outstanding)
        self.max_connections = most
        self._slots: dict[str, ConnectionSlots] = {}
        self._serial = itertools.count()

    def slots(self, target: Target) -> ConnectionSlots:
        if target.label not in self._slots:
            w = self.workload
            self._slots[target.label] = ConnectionSlots(self.max_connections, connect_timeout=w.connect_timeout,
                                                        read_timeout=w.read_timeout)
        return self._slots[target.label]

    async def aclose(self) -> None:
        for slots in self._slots.values():
            await slots.aclose()

    def _result(self, target: Target, step_label: str, phase: str, index: int) -> RequestResult:
        return RequestResult(target=target.label, step=step_label, phase=phase, index=index,
                             request_id=f"lt-{target.label}-{next(self._serial)}")

    async def _send(self, target: Target, result: RequestResult, text_id: int) -> RequestResult:
        slots = self.slots(target)
        client = slots.acquire()
        try:
            return await send_speech(client, self.workload.spec(target, text_id), result,
                                     total_timeout=self.workload.timeout, run_epoch=self.epoch)
        finally:
            slots.release(client)

    async def warmup(self, target: Target, requests: int, concurrency: int) -> list[RequestResult]:
        """Requests that open connections and warm the server; returned as rows marked `warmup`."""
        if requests <= 0:
            return []
        todo = iter(range(requests))
        rows: list[RequestResult] = []

        async def user() -> None:
            for i in todo:
                rows.append(await self._send(target, self._result(target, "warmup", "warmup", i), i))

        await asyncio.gather(*(user() for _ in range(max(1, min(concurrency, requests)))))
        return rows

    async def run_step(self, step: Step, target: Target, duration: float | None = None,
                       text_offset: int = 0, on_done: Callable[[RequestResult], None] | None = None) -> StepRun:
        """One step against one target. Everything already allocated is frozen out of the cyclic
        GC while it runs: a full collection in a big process (a test session that loaded models,
        say) can pause the generator for hundreds of ms, which would read as server latency."""
        gc.collect()
        gc.freeze()
        try:
            return await self._run_step(step, target, duration, text_offset, on_done)
        finally:
            gc.unfreeze()

    async def _run_step(self, step: Step, target: Target, duration: float | None,
                        text_offset: int, on_done: Callable[[RequestResult], None] | None) -> StepRun:
        duration = step.duration if duration is None else duration
        slots = self.slots(target)
        slots.reserve(int(step.value) if step.kind == "closed" else self.workload.max_outstanding)
        if self.preconnect:
            await slots.preconnect(health_url(target.url))
        prog = Progress(f"{target.label} {step.label}", duration, self.stream, self.progress)
        rows: list[RequestResult] = []
        in_flight = 0
        max_in_flight = 0
        spans: list[tuple[float, float]] = []
        t0 = time.perf_counter()
        prog.start()

        pending = 0  # open loop: tasks created for arrivals that have not started yet

        async def one(index: int, text_id: int, scheduled: float | None) -> RequestResult:
            nonlocal in_flight, max_in_flight, pending
            if scheduled is not None:
                pending -= 1
            r = self._result(target, step.label, "measure", index)
            if scheduled is not None:
                r.scheduled_at = scheduled
                r.sched_lag_s = time.perf_counter() - (t0 + scheduled)
            in_flight += 1
            max_in_flight = max(max_in_flight, in_flight)
            prog.in_flight = in_flight
            try:
                await self._send(target, r, text_id)
                if scheduled is not None:  # how late the request actually left, httpx's own time included
                    r.sched_lag_s = r.t_send - (t0 + scheduled)
            finally:
                in_flight -= 1
                prog.in_flight = in_flight
            spans.append((r.t_send, r.t_send + (r.e2e_s or (time.perf_counter() - r.t_send))))
            rows.append(r)
            prog.done(r)
            if on_done:
                on_done(r)
            return r

        if step.kind == "closed":
            counter = itertools.count()
            deadline = t0 + duration

            async def user() -> None:
                while time.perf_counter() < deadline:
                    i = next(counter)
                    r = await one(i, text_offset + i, None)
                    if r.outcome == "rejected" and self.workload.honor_retry_after:
                        # as the OpenAI client does: wait what the 503 asked before the next request
                        # (else a refused user spins, and the 503 rate says more about us than the server)
                        await asyncio.sleep(max(0.0, min(retry_after_s(r), deadline - time.perf_counter())))
                    elif r.outcome == "error" and r.status == 0:
                        # no server answered (refused, reset, timed out): pause briefly rather than
                        # spin thousands of instant failures a second and starve the other users
                        await asyncio.sleep(TRANSPORT_ERROR_PAUSE_S)

            await asyncio.gather(*(user() for _ in range(int(step.value))))
        else:
            tasks = []
            for i, at in enumerate(poisson_arrivals(step.value, duration, self.workload.seed)):
                delay = t0 + at - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
                if in_flight + pending >= self.workload.max_outstanding:
                    r = self._result(target, step.label, "measure", i)
                    r.scheduled_at, r.sched_lag_s = at, time.perf_counter() - (t0 + at)
                    r.started_at, r.text_id = time.perf_counter() - self.epoch, (text_offset + i) % len(self.workload.texts)
                    r.outcome, r.error = "dropped", f"client cap: {self.workload.max_outstanding} outstanding (--max-outstanding)"
                    rows.append(r)
                    prog.done(r)
                    continue
                pending += 1  # counted now: arrivals due at once are all created before any task runs
                tasks.append(asyncio.create_task(one(i, text_offset + i, at)))
            await asyncio.gather(*tasks)
        wall = time.perf_counter() - t0
        await prog.stop()
        window_end = t0 + duration
        busy = sum(max(0.0, min(b, window_end) - max(a, t0)) for a, b in spans)
        rows.sort(key=lambda r: r.index)
        return StepRun(step=step, target=target, rows=rows, duration_s=duration, wall_s=wall, window_busy_s=busy,
                       max_in_flight=max_in_flight)


def retry_after_s(r: RequestResult, default: float = 1.0) -> float:
    """What a 503 asked the client to wait: retry-after-ms when sent (finer), else Retry-After."""
    try:
        if r.retry_after_ms:
            return float(r.retry_after_ms) / 1000
        if r.retry_after:
            return float(r.retry_after)
    except ValueError:  # an HTTP-date Retry-After; our servers send seconds
        pass
    return default


def summarize(runs: list[StepRun]) -> dict[str, Any]:
    """One step's summary (the JSON record) from one or more runs of it against one target.

    Latency figures cover successful requests only: 503s (rejected), errors and client drops are
    counted apart, so a server that refuses fast never looks fast.
    """
    step = runs[0].step
    rows = [r for run in runs for r in run.rows if r.phase == "measure"]
    wall = sum(run.wall_s for run in runs)
    window = sum(r.window_busy_s for r in runs)
    held = sum(run.duration_s for run in runs)
    ok = [r for r in rows if r.outcome == "ok"]
    rejected = [r for r in rows if r.outcome == "rejected"]
    errors = [r for r in rows if r.outcome == "error"]
    dropped = [r for r in rows if r.outcome == "dropped"]
    attempted = len(rows) - len(dropped)
    audio = sum(r.audio_s for r in ok)
    underruns = [r.underrun_s for r in ok if r.underrun_s is not None]

    def dist(name: str, among: list[RequestResult] = ok) -> dict[str, float | None]:
        return metrics.distribution([getattr(r, name) for r in among if getattr(r, name) is not None])

    retry = [retry_after_s(r, default=float("nan")) for r in rejected]
    summary: dict[str, Any] = {
        "target": runs[0].target.label,
        "url": runs[0].target.url,
        "step": step.label,
        "kind": step.kind,
        "value": step.value,
        "duration_s": held,
        "wall_s": wall,
        "requests": len(rows),
        "attempted": attempted,
        "ok": len(ok),
        "rejected_503": len(rejected),
        "errors": len(errors),
        "dropped": len(dropped),
        "rejection_rate": len(rejected) / attempted if attempted else 0.0,
        "error_rate": len(errors) / attempted if attempted else 0.0,
        "drop_rate": len(dropped) / len(rows) if rows else 0.0,
        "requests_per_s": len(ok) / wall if wall else 0.0,
        "audio_s": audio,
        "audio_s_per_wall_s": audio / wall if wall else 0.0,
        "offered_rate_per_s": (len(rows) / held) if held else 0.0,
        "mean_in_flight": window / held if held else 0.0,
        "max_in_flight": max(run.max_in_flight for run in runs),
        "ttfa_s": dist("ttfa_s"),
        "e2e_s": dist("e2e_s"),
        "headers_s": dist("headers_s"),
        "rtf": dist("rtf"),
        "underrun_s": metrics.distribution(underruns),
        "continuous_fraction": (sum(u < metrics.CONTINUOUS_UNDERRUN_S for u in underruns) / len(underruns)
                                if underruns else None),
        "retry_after_s": metrics.distribution(retry),
        "rejected_latency_s": dist("e2e_s", rejected),
        "error_examples": sorted({r.error for r in errors})[:5],
    }
    if step.kind == "open":
        summary["max_outstanding"] = None  # filled by the caller, which knows the cap
        summary["sched_lag_s"] = metrics.distribution([r.sched_lag_s for r in rows if r.sched_lag_s is not None])
    return summary


def parse_steps(concurrency: str | None, rate: str | None, duration: float) -> list[Step]:
    if concurrency and rate:
        raise ValueError("give --concurrency (closed loop) or --rate (open loop), not both")
    if rate:
        values = [float(v) for v in rate.split(",") if v.strip()]
        if any(v <= 0 for v in values):
            raise ValueError("--rate values must be positive arrivals per second")
        return [Step("open", v, duration) for v in values]
    values = [int(v) for v in (concurrency or "1,4,16,64").split(",") if v.strip()]
    if any(v <= 0 for v in values):
        raise ValueError("--concurrency values must be positive")
    return [Step("closed", v, duration) for v in values]
