"""The replica side's client of the fleet queue: lease the earliest-deadline job (or a batch of
jobs that fit one forward pass), run it, complete each job.

One `Dispatcher` per model replica. Its loop:

    lease (queue/lease.lua) -> run_job(job), or run_batch(jobs) for several, while heartbeating
    each lease -> complete each job (complete.lua)
    nothing queued -> wait on the ready list (woken by admissions and re-queues)

and, beside it, a reaper tick (reap.lua) that re-queues jobs whose replica died, fails jobs that
died twice and frees the slots of requests whose owner died. Every worker runs one, so the fleet
repairs itself as long as any worker lives.

The job runner is any `async def run_job(job: Job) -> JobOutput | (pcm_bytes, durations)`: the
real one (`ReplicaJobRunner`, below) decodes the payload and calls `Replica.synthesize`; tests use
one that sleeps and returns silence. With `batch_max > 1` a lease may bring several jobs; they go
to `run_batch(jobs) -> [JobOutput | (pcm, durations) | Exception per job]` (the real one calls
`Replica.synthesize_batch`: one forward pass), or, without one, to `run_job` one after another.
Each job of a batch keeps its own lease, heartbeat, completion and failure. This module imports
neither torch nor FastAPI. When Redis is unreachable the loop marks itself `degraded`, backs off
and tries again; it never crashes on a Redis outage.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

import numpy as np
import redis.asyncio as aioredis

from api.metrics import ReadableHistogram
from api.speech.redis_link import (DEFAULT_PREFIX, QueueUnavailable, Scripts, TracksAvailability, decode_job,
                                   unavailable_as_error)
from api.speech.worker_queue import REPLICA, WorkerQueueOwner
from worker.audio import FRAME_SECONDS, SAMPLE_RATE, to_pcm16

log = logging.getLogger("kokoro_fleet.dispatch")


@dataclass(frozen=True)
class Job:
    job_id: str                 # "<request_id>#<index>"
    request_id: str
    index: int                  # chunk index within the request
    attempt: int                # 1 on first lease, 2 after one lease expiry
    token: str                  # proves this replica holds the lease when completing
    payload: bytes              # as the owner enqueued it
    owner: str                  # worker id holding the client's connection
    deadline_ms: int            # when a real-time listener needs this chunk (Redis time)
    estimated_seconds: float    # estimated audio duration of this chunk
    leased_at_ms: int


@dataclass
class JobOutput:
    pcm: bytes
    durations: np.ndarray | Sequence[int]       # int frames per token
    audio_seconds: float | None = None          # default: sum(durations) frames of 25 ms


RunJob = Callable[[Job], Awaitable["JobOutput | tuple[bytes, np.ndarray | Sequence[int]]"]]
# One output per job, in the jobs' order; an exception in place of an output fails only that job.
RunBatch = Callable[[Sequence[Job]], Awaitable[Sequence["JobOutput | tuple[bytes, np.ndarray | Sequence[int]] | Exception"]]]

# How a free replica fills a batch (queue/lease.lua, queue/PROTOCOL.md): jobs due within this
# window of the first job's deadline (or of now, when it is overdue) ...
BATCH_WINDOW_MS = 1000
# ... whose estimated audio keeps the batch's largest item at most this many times its smallest,
# so padding is at most half of any item's pass.
BATCH_SIZE_RATIO = 2.0
# Histogram buckets for the jobs per lease (/metrics).
BATCH_SIZE_BUCKETS = (1, 2, 3, 4, 6, 8, 12, 16, 32)


@dataclass(frozen=True)
class ReapReport:
    expired: int      # leases past expiry
    requeued: int     # of those, put back in the queue
    failed: int       # of those, on their last attempt: their request failed
    orphaned: int     # requests freed because their owner died (or outlived the age backstop)


# complete.lua's answers (RELEASED: delivered, and the request released with it)
DELIVERED, STALE, DROPPED, RELEASED = 1, 0, 2, 3


@dataclass(frozen=True)
class DispatcherConfig:
    """How a replica leases, heartbeats, batches and reaps (`from_settings` builds it from the settings)."""

    prefix: str = DEFAULT_PREFIX
    lease_s: float = 10.0
    heartbeat_s: float | None = None        # default: a third of lease_s
    own_slack_ms: int = 0                   # prefer an own request's job due within this of the earliest
    replica_ttl_s: float = 5.0
    reap_interval_s: float = 1.0
    max_attempts: int = 2
    max_request_age_s: float = 3600.0
    idle_wait_s: float = 1.0                # longest BLPOP on the ready list; below the socket timeout
    ewma_alpha: float = 0.2
    retry_backoff_s: float = 0.5
    batch_max: int = 1
    batch_window_ms: int = BATCH_WINDOW_MS
    batch_size_ratio: float = BATCH_SIZE_RATIO

    def __post_init__(self):
        if self.batch_max < 1:
            raise ValueError(f"batch_max must be at least 1, got {self.batch_max}")

    @classmethod
    def from_settings(cls, settings, *, prefix: str = DEFAULT_PREFIX, replica_ttl_s: float = 5.0,
                      reap_interval_s: float = 1.0) -> "DispatcherConfig":
        """KOKORO_BATCH_MAX, KOKORO_LEASE_SECONDS and KOKORO_OWN_JOB_SLACK_MS; the liveness TTL and
        reaper tick of the fleet service."""
        # an idle replica refreshes its liveness once per wait: well within the TTL, or a reaper
        # would drop its row (and its counters)
        return cls(prefix=prefix, lease_s=settings.lease_seconds, own_slack_ms=settings.own_job_slack_ms,
                   replica_ttl_s=replica_ttl_s, reap_interval_s=reap_interval_s,
                   idle_wait_s=min(1.0, replica_ttl_s / 3), batch_max=settings.batch_max)


class Dispatcher(TracksAvailability):
    """One replica's lease loop. `worker_queue` is its worker's `WorkerQueueOwner`: a job of a
    request this worker owns (job.owner == replica_id) hands its PCM over there, in memory, the owner
    side may claim the replica there, and whether Redis answers is reported there."""

    side = REPLICA

    def __init__(self, client: aioredis.Redis, replica_id: str, run_job: RunJob,
                 config: DispatcherConfig = DispatcherConfig(), *, worker_queue: WorkerQueueOwner,
                 run_batch: RunBatch | None = None, engine: str = "", leases: bool = True):
        self.client = client
        self.replica_id = replica_id
        self.config = config
        self.engine = engine  # shown in the replica table ("torch cuda bf16", "sim"); "" writes none
        self.run_job = run_job
        self.run_batch = run_batch
        # False in a worker that holds no replica (KOKORO_REPLICAS below the workers): its loop
        # only reaps, it is never claimed, and it never joins the replica table.
        self.leases = leases
        self.batch_max = config.batch_max
        self.prefix = config.prefix
        self.lease_ms = int(config.lease_s * 1000)
        self.heartbeat_s = config.heartbeat_s if config.heartbeat_s is not None else config.lease_s / 3
        self.replica_ttl_ms = int(config.replica_ttl_s * 1000)
        self.scripts = Scripts(client)
        # "Keep the bytes cheap": a job of a request this worker owns (job.owner == replica_id)
        # leaves its PCM with the worker's queue owner instead of in Redis, and leasing prefers such
        # jobs when they are due within own_slack_ms of the fleet's earliest.
        self.worker_queue = worker_queue
        self.own_slack_ms = int(config.own_slack_ms)
        # Figures for /metrics, named as worker/replica.py's Replica names them.
        self.busy = False
        self.jobs_done = 0
        self.busy_seconds = 0.0
        self.audio_seconds = 0.0
        self.lease_losses = 0       # completions refused because the lease had expired
        self.batch_sizes = ReadableHistogram("kokoro_fleet_lease_batch_size", "Chunk jobs per lease this worker's "
                                             "replica took (at most KOKORO_BATCH_MAX).", buckets=BATCH_SIZE_BUCKETS,
                                             registry=None)
        self.batch_fallbacks = 0    # batches whose pass failed and ran again one job at a time
        self._stopping = asyncio.Event()
        self._tasks: list[asyncio.Task] = []

    @property
    def _idle(self) -> bool:
        """In the ready-list wait (safe to cancel: holds no lease)."""
        return self.worker_queue.idle

    # --- one step at a time (the loop below, and tests) ------------------------------------
    async def lease(self) -> Job | None:
        """Lease the earliest-deadline job alone, or None when the queue is empty."""
        jobs = await self._lease(1)
        return jobs[0] if jobs else None

    async def lease_batch(self) -> list[Job]:
        """Lease the earliest-deadline job and up to `batch_max - 1` queued jobs that fit its
        forward pass (queue/lease.lua says which); [] when the queue is empty."""
        return await self._lease(self.batch_max)

    async def run_one(self, job: Job) -> int:
        """Run `job` through the job runner, heartbeating its lease, then complete it. Returns
        DELIVERED, STALE (the lease was lost meanwhile) or DROPPED (the request went away)."""
        return (await self.run_jobs([job]))[0]

    async def run_jobs(self, jobs: Sequence[Job], release_request: str | None = None) -> list[int]:
        """Run leased jobs, one alone or several as one batch, heartbeating every lease, then
        complete each on its own. Returns each job's DELIVERED, STALE or DROPPED; RELEASED for the
        last chunk of `release_request`, an own request whose owner awaits this run and reads the
        chunk from memory without asking Redis: its completion also releases the request."""
        self.busy = True
        started = time.perf_counter()
        heartbeat = asyncio.create_task(self._heartbeat_leases(jobs), name=f"lease-heartbeat-{jobs[0].job_id}")
        try:
            outputs = await self._outputs(jobs)
            busy_s = time.perf_counter() - started
            audio = [self._audio_seconds(o) if not isinstance(o, Exception) else 0.0 for o in outputs]
            total_audio = sum(audio)
            statuses = []
            for job, output, audio_s in zip(jobs, outputs, audio):
                # A batch's busy time is shared by audio, so every job reports the batch's rate
                # (audio per busy second), which is what the fleet's capacity estimate wants.
                share = busy_s * audio_s / total_audio if total_audio > 0 else busy_s / len(jobs)
                statuses.append(await self._deliver(job, output, audio_s, share,
                                                      release=job.request_id == release_request))
            return statuses
        finally:
            heartbeat.cancel()
            with contextlib.suppress(asyncio.CancelledError, QueueUnavailable):
                await heartbeat
            self.busy = False

    # --- the owner side's turn: this process's request first, nothing crossing processes -----
    def claim(self) -> bool:
        """Take the replica for this process's owner side if it is waiting for work: the owner's
        next admission then leases for it (`lease_arguments()` to admit.lua) and `run_claimed`
        runs what that leased. False when the replica is busy (or already claimed, or stopping)."""
        return self.worker_queue.claim(self.leases)

    def unclaim(self) -> None:
        self.worker_queue.unclaim()

    def lease_arguments(self) -> list:
        """lease.lua's arguments after the prefix (also admit.lua's optional tail)."""
        return [self.replica_id, self.lease_ms, self.replica_ttl_ms, self.replica_id, self.own_slack_ms,
                self.batch_max, self.config.batch_window_ms, self.config.batch_size_ratio]

    def run_claimed(self, leased: Sequence, request_id: str) -> asyncio.Task | None:
        """Run the jobs admit.lua leased for the claimed replica (lease.lua's reply) when it
        admitted `request_id` (whose owner awaits this run before reading those chunks), in a task
        of its own (a client that leaves must not cut a leased job short), then give the replica
        back to the loop. None, and the replica given back at once, when nothing was leased."""
        jobs = self._jobs(leased)
        if not jobs:
            self.unclaim()
            return None

        async def run() -> None:
            try:
                await self.run_jobs(jobs, release_request=request_id)
            except QueueUnavailable as e:  # leases are left to expire and be re-queued
                log.warning("replica %s: %s", self.replica_id, e)

        return self.worker_queue.run_claimed(run(), name=f"claimed-{jobs[0].job_id}")

    async def step(self) -> bool:
        """Lease and run one job or one batch; False when there was none."""
        jobs = await self.lease_batch()
        if not jobs:
            return False
        await self.run_jobs(jobs)
        return True

    async def reap(self) -> ReapReport:
        """One reaper pass (any worker may run it at any time; the script is atomic)."""
        reply = await self._call("reap", self.scripts.reap, self.prefix, self.config.max_attempts,
                                 int(self.config.max_request_age_s * 1000), 100)
        return ReapReport(*(int(x) for x in reply))

    # --- the replica's loop ----------------------------------------------------------------
    async def run(self) -> None:
        """Serve jobs until `stop()`; runs the reaper tick beside it."""
        reaper = asyncio.create_task(self._reap_forever(), name=f"reaper-{self.replica_id}")
        if self.leases:
            with contextlib.suppress(QueueUnavailable):
                await self._announce_engine()
        try:
            while not self.leases and not self._stopping.is_set():
                await self._stopping.wait()
            while not self._stopping.is_set():
                try:
                    if self.worker_queue.claimed:  # the owner side is running jobs on the replica
                        await self.worker_queue.lease_turn()
                        continue
                    if not await self.step():
                        # Admissions and re-queues push one token per job onto the ready list.
                        with self.worker_queue.waiting_for_work():
                            await self._call("idle wait", self.client.blpop, [f"{self.prefix}:ready"],
                                             self.config.idle_wait_s)
                except QueueUnavailable as e:
                    log.warning("replica %s: %s; retrying in %.1f s", self.replica_id, e, self.config.retry_backoff_s)
                    await self._sleep_or_stop(self.config.retry_backoff_s)
        finally:
            reaper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reaper

    def start(self) -> asyncio.Task:
        task = asyncio.create_task(self.run(), name=f"dispatch-{self.replica_id}")
        self._tasks.append(task)
        return task

    def stop(self) -> None:
        """Finish the job in hand, then leave the loop."""
        self._stopping.set()
        self.worker_queue.stop_claims()

    async def close(self) -> None:
        """Stop, wait for the job in hand, and leave the replica table."""
        self.stop()
        for task in self._tasks:
            if self._idle:  # waiting for work holds nothing: no need to sit out the wait
                task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()
        await self.worker_queue.claimed_runs_done()  # jobs leased for the owner side finish and complete too
        with contextlib.suppress(QueueUnavailable):
            with unavailable_as_error("leaving the replica table"):
                await self.client.zrem(f"{self.prefix}:replicas", self.replica_id)
                await self.client.delete(f"{self.prefix}:replica:{self.replica_id}")

    # --- internals -------------------------------------------------------------------------
    async def _lease(self, batch_max: int) -> list[Job]:
        args = self.lease_arguments()
        args[5] = batch_max
        return self._jobs(await self._call("lease", self.scripts.lease, self.prefix, *args))

    def _jobs(self, reply) -> list[Job]:
        """lease.lua's reply as jobs."""
        jobs = [Job(job_id.decode(), rid.decode(), int(idx), int(attempt), token.decode(), payload or b"",
                    (owner or b"").decode(), int(deadline), est / 1000, int(now))
                for job_id, rid, idx, attempt, token, payload, owner, deadline, est, now in reply or ()]
        if jobs:
            self.batch_sizes.observe(len(jobs))
        return jobs

    async def _outputs(self, jobs: Sequence[Job]) -> list:
        """Each job's output, or the exception that failed it."""
        if len(jobs) > 1 and self.run_batch is not None:
            try:
                outputs = list(await self.run_batch(jobs))
                if len(outputs) != len(jobs):
                    raise RuntimeError(f"run_batch returned {len(outputs)} outputs for {len(jobs)} jobs")
                return outputs
            except asyncio.CancelledError:
                raise
            except Exception:
                # One bad item (or a batch too big for the device) must not fail the others'
                # requests: each job runs again alone and fails only if it fails alone.
                self.batch_fallbacks += 1
                log.exception("batch of %d jobs failed on replica %s; running them one at a time",
                              len(jobs), self.replica_id)
        outputs = []
        for job in jobs:
            try:
                outputs.append(await self.run_job(job))
            except asyncio.CancelledError:
                raise
            except Exception as e:
                outputs.append(e)
        return outputs

    @staticmethod
    def _audio_seconds(output) -> float:
        if isinstance(output, tuple):
            return float(np.asarray(output[1]).sum()) * FRAME_SECONDS
        if output.audio_seconds is not None:
            return output.audio_seconds
        return float(np.asarray(output.durations).sum()) * FRAME_SECONDS

    async def _deliver(self, job: Job, output, audio_s: float, busy_s: float, release: bool = False) -> int:
        """Complete one job with its output, or with the error that failed it."""
        if isinstance(output, Exception):  # the job itself failed: the owner gets the reason, not a hang
            log.error("job %s failed on replica %s", job.job_id, self.replica_id, exc_info=output)
            message = (f"synthesis of chunk {job.index} failed on replica {self.replica_id}: "
                       f"{type(output).__name__}: {output}")
            return await self._complete(job, "error", message.encode(), b"", 0.0, 0.0)
        if isinstance(output, tuple):
            output = JobOutput(*output)
        durations = np.asarray(output.durations, dtype="<i8")
        if job.owner == self.replica_id:
            # The owner is this process: hand the PCM over in memory, before the completion
            # makes the result visible; take it back if the completion is refused.
            status = STALE
            try:
                self.worker_queue.hand_over(job.job_id, bytes(output.pcm))
                status = await self._complete(job, "local", b"", durations.tobytes(), audio_s, busy_s,
                                              release=release)
            finally:
                if status not in (DELIVERED, RELEASED):
                    self.worker_queue.completion_refused(job.job_id)
                else:
                    self.worker_queue.completion_accepted(job.job_id, durations, status == RELEASED)
        else:
            status = await self._complete(job, "ok", bytes(output.pcm), durations.tobytes(), audio_s, busy_s)
        if status in (DELIVERED, RELEASED):
            self.jobs_done += 1
            self.busy_seconds += busy_s
            self.audio_seconds += audio_s
        return status

    async def _complete(self, job: Job, status: str, data: bytes, durations: bytes,
                        audio_s: float, busy_s: float, release: bool = False) -> int:
        result = int(await self._call("complete", self.scripts.complete, self.prefix, self.replica_id,
                                      job.job_id, job.token, status, data, durations,
                                      int(round(audio_s * 1000)), int(round(busy_s * 1000)), self.config.ewma_alpha,
                                      int(release)))
        if result == STALE:
            self.lease_losses += 1
            log.warning("replica %s: lease on %s was lost before completion; result discarded",
                        self.replica_id, job.job_id)
        return result

    async def _heartbeat_leases(self, jobs: Sequence[Job]) -> None:
        held = list(jobs)
        while held:
            await asyncio.sleep(self.heartbeat_s)
            for job in list(held):
                try:
                    alive = await self._call("lease heartbeat", self.scripts.heartbeat, self.prefix, self.replica_id,
                                             self.replica_ttl_ms, job.job_id, job.token, self.lease_ms)
                except QueueUnavailable:
                    break  # keep trying next beat: the leases may survive a short outage
                if alive == 0:
                    held.remove(job)  # lost: nothing left to extend; its completion will report it

    async def _reap_forever(self) -> None:
        while not self._stopping.is_set():
            # Jitter keeps a fleet's reapers from running in lockstep.
            await self._sleep_or_stop(self.config.reap_interval_s * random.uniform(0.75, 1.25))
            if self._stopping.is_set():
                return
            try:
                report = await self.reap()
                if report.expired or report.orphaned:
                    log.warning("replica %s reaper: %s", self.replica_id, report)
                await self._announce_engine()
            except QueueUnavailable:
                pass

    async def _announce_engine(self) -> None:
        """Write the engine into this replica's row, if the row lacks it: at start, and again on
        every reaper tick, because a reaper that found this replica stalled past its TTL deleted
        the row, which the next lease re-creates without it."""
        if self.engine:
            await self._call("engine", self.client.hsetnx, f"{self.prefix}:replica:{self.replica_id}", "engine",
                             self.engine)

    async def _sleep_or_stop(self, seconds: float) -> None:
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._stopping.wait(), seconds)


class NoReplica:
    """The replica of a worker that is an HTTP front only (KOKORO_REPLICAS below the workers): text,
    admission and encoding here, every chunk on the replicas of other workers through the queue."""

    simulated = False
    busy = False
    jobs_done = 0
    busy_seconds = 0.0
    audio_seconds = 0.0
    engine = type("NoEngine", (), {"label": "none"})()

    async def warmup(self) -> None:
        """Nothing to warm: the text readers are the speech service's."""

    async def synthesize(self, *args, **kwargs):
        raise RuntimeError("this worker holds no replica (KOKORO_REPLICAS): its chunks run on other workers' "
                           "replicas through the queue, which is unreachable")

    synthesize_batch = synthesize


class ReplicaJobRunner:
    """The Dispatcher's `run_job` (one chunk job: `Replica.synthesize`) and `run_batch` (several:
    `Replica.synthesize_batch`, one forward pass) on this worker's replica."""

    def __init__(self, replica, voices, wait_histogram=None):
        self.replica = replica
        self.voices = voices
        self.wait_histogram = wait_histogram  # of first chunks' queue waits, for /metrics

    async def __call__(self, job: Job) -> JobOutput:
        ids, style, speed = self._decode(job)
        return self._output(await self.replica.synthesize(ids, style, speed))

    async def run_batch(self, jobs: Sequence[Job]) -> list[JobOutput | Exception]:
        """One output per job; a job whose payload or voice cannot be read fails alone, before
        the others' forward pass."""
        from worker.engine import BatchItem  # the engine's module needs torch, loaded by now

        outputs: dict[int, JobOutput | Exception] = {}  # by the job's place in `jobs`
        items, slots = [], []
        for k, job in enumerate(jobs):
            try:
                ids, style, speed = self._decode(job)
            except Exception as e:
                outputs[k] = e
                continue
            items.append(BatchItem(ids, style, speed))
            slots.append(k)
        if items:
            for k, result in zip(slots, await self.replica.synthesize_batch(items), strict=True):
                outputs[k] = self._output(result)
        return [outputs[k] for k in range(len(jobs))]

    def _decode(self, job: Job):
        if job.index == 0 and job.attempt == 1 and self.wait_histogram is not None:
            # A first chunk's deadline is its request's arrival: the difference is its queue wait.
            self.wait_histogram.observe(max(0.0, (job.leased_at_ms - job.deadline_ms) / 1000))
        ids, voice_spec, speed = decode_job(job.payload)
        voice = self.voices.resolve(voice_spec)
        return ids, self.voices.style(voice, len(ids)), speed

    @staticmethod
    def _output(result) -> JobOutput:
        return JobOutput(to_pcm16(result.audio).tobytes(), result.durations, len(result.audio) / SAMPLE_RATE)
