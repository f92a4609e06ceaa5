"""The replica side's client of the fleet queue: lease the earliest-deadline job, run it, complete it.

One `Dispatcher` per model replica. Its loop:

    lease (queue/lease.lua) -> run_job(job) while heartbeating the lease -> complete (complete.lua)
    nothing queued -> wait on the ready list (woken by admissions and re-queues)

and, beside it, a reaper tick (reap.lua) that re-queues jobs whose replica died, fails jobs that
died twice and frees the slots of requests whose owner died. Every worker runs one, so the fleet
repairs itself as long as any worker lives.

The job runner is any `async def run_job(job: Job) -> JobOutput | (pcm_bytes, durations)`: the
real one (`ReplicaJobRunner`, below) decodes the payload and calls `Replica.synthesize`; tests use
one that sleeps and returns silence. This module imports neither torch nor FastAPI. When Redis is unreachable the loop marks
itself `degraded`, backs off and tries again; it never crashes on a Redis outage.
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

from api.fleet.protocol import (DEFAULT_PREFIX, QueueUnavailable, Scripts, TracksAvailability, decode_job,
                                unavailable_as_error)
from worker.audio import FRAME_SECONDS, SAMPLE_RATE

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


@dataclass(frozen=True)
class ReapReport:
    expired: int      # leases past expiry
    requeued: int     # of those, put back in the queue
    failed: int       # of those, on their last attempt: their request failed
    orphaned: int     # requests freed because their owner died (or outlived the age backstop)


# complete.lua's answers
DELIVERED, STALE, DROPPED = 1, 0, 2


class Dispatcher(TracksAvailability):
    def __init__(self, client: aioredis.Redis, replica_id: str, run_job: RunJob, *,
                 prefix: str = DEFAULT_PREFIX, lease_s: float = 10.0, heartbeat_s: float | None = None,
                 local_results: dict[str, bytes] | None = None, own_slack_ms: int = 0,
                 replica_ttl_s: float = 5.0, reap_interval_s: float = 1.0, max_attempts: int = 2,
                 max_request_age_s: float = 3600.0, idle_wait_s: float = 1.0, ewma_alpha: float = 0.2,
                 retry_backoff_s: float = 0.5):
        self.client = client
        self.replica_id = replica_id
        self.run_job = run_job
        self.prefix = prefix
        self.lease_ms = int(lease_s * 1000)
        self.heartbeat_s = heartbeat_s if heartbeat_s is not None else lease_s / 3
        self.replica_ttl_ms = int(replica_ttl_s * 1000)
        self.reap_interval_s = reap_interval_s
        self.max_attempts = max_attempts
        self.max_request_age_ms = int(max_request_age_s * 1000)
        self.idle_wait_s = idle_wait_s  # longest BLPOP on the ready list; below the socket timeout
        self.ewma_alpha = ewma_alpha
        self.retry_backoff_s = retry_backoff_s
        self.scripts = Scripts(client)
        # "Keep the bytes cheap": given the owner side's dict, a job of a request this process owns
        # (job.owner == replica_id) leaves its PCM there instead of in Redis, and leasing prefers
        # such jobs when they are due within own_slack_ms of the fleet's earliest.
        self.local_results = local_results
        self.own_slack_ms = int(own_slack_ms) if local_results is not None else 0
        # Figures for /metrics, named as worker/replica.py's Replica names them.
        self.busy = False
        self.jobs_done = 0
        self.busy_seconds = 0.0
        self.audio_seconds = 0.0
        self.lease_losses = 0       # completions refused because the lease had expired
        self.degraded = False       # the last Redis call failed
        self._idle = False          # in the ready-list wait (safe to cancel: holds no lease)
        self._stopping = asyncio.Event()
        self._tasks: list[asyncio.Task] = []

    # --- one step at a time (the loop below, and tests) ------------------------------------
    async def lease(self) -> Job | None:
        """Lease the earliest-deadline job, or None when the queue is empty."""
        reply = await self._call("lease", self.scripts.lease, self.prefix, self.replica_id,
                                 self.lease_ms, self.replica_ttl_ms, self.replica_id, self.own_slack_ms)
        if not reply:
            return None
        job_id, rid, idx, attempt, token, payload, owner, deadline, est, now = reply
        return Job(job_id.decode(), rid.decode(), int(idx), int(attempt), token.decode(), payload or b"",
                   (owner or b"").decode(), int(deadline), est / 1000, int(now))

    async def run_one(self, job: Job) -> int:
        """Run `job` through the job runner, heartbeating its lease, then complete it. Returns
        DELIVERED, STALE (the lease was lost meanwhile) or DROPPED (the request went away)."""
        self.busy = True
        started = time.perf_counter()
        heartbeat = asyncio.create_task(self._heartbeat_lease(job), name=f"lease-heartbeat-{job.job_id}")
        try:
            try:
                output = await self.run_job(job)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # the job itself failed: the owner gets the reason, not a hang
                log.exception("job %s failed on replica %s", job.job_id, self.replica_id)
                message = (f"synthesis of chunk {job.index} failed on replica {self.replica_id}: "
                           f"{type(e).__name__}: {e}")
                return await self._complete(job, "error", message.encode(), b"", 0.0, 0.0)
            busy_s = time.perf_counter() - started
            if isinstance(output, tuple):
                output = JobOutput(*output)
            durations = np.asarray(output.durations, dtype="<i8")
            audio_s = output.audio_seconds
            if audio_s is None:
                audio_s = float(durations.sum()) * FRAME_SECONDS
            if self.local_results is not None and job.owner == self.replica_id:
                # The owner is this process: hand the PCM over in memory, before the completion
                # makes the result visible; take it back if the completion is refused.
                self.local_results[job.job_id] = bytes(output.pcm)
                status = await self._complete(job, "local", b"", durations.tobytes(), audio_s, busy_s)
                if status != DELIVERED:
                    self.local_results.pop(job.job_id, None)
            else:
                status = await self._complete(job, "ok", bytes(output.pcm), durations.tobytes(), audio_s, busy_s)
            if status == DELIVERED:
                self.jobs_done += 1
                self.busy_seconds += busy_s
                self.audio_seconds += audio_s
            return status
        finally:
            heartbeat.cancel()
            with contextlib.suppress(asyncio.CancelledError, QueueUnavailable):
                await heartbeat
            self.busy = False

    async def step(self) -> bool:
        """Lease and run one job; False when there was none."""
        job = await self.lease()
        if job is None:
            return False
        await self.run_one(job)
        return True

    async def reap(self) -> ReapReport:
        """One reaper pass (any worker may run it at any time; the script is atomic)."""
        reply = await self._call("reap", self.scripts.reap, self.prefix, self.max_attempts,
                                 self.max_request_age_ms, 100)
        return ReapReport(*(int(x) for x in reply))

    # --- the replica's loop ----------------------------------------------------------------
    async def run(self) -> None:
        """Serve jobs until `stop()`; runs the reaper tick beside it."""
        reaper = asyncio.create_task(self._reap_forever(), name=f"reaper-{self.replica_id}")
        try:
            while not self._stopping.is_set():
                try:
                    if not await self.step():
                        # Admissions and re-queues push one token per job onto the ready list.
                        self._idle = True
                        try:
                            await self._call("idle wait", self.client.blpop, [f"{self.prefix}:ready"], self.idle_wait_s)
                        finally:
                            self._idle = False
                except QueueUnavailable as e:
                    log.warning("replica %s: %s; retrying in %.1f s", self.replica_id, e, self.retry_backoff_s)
                    await self._sleep_or_stop(self.retry_backoff_s)
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

    async def close(self) -> None:
        """Stop, wait for the job in hand, and leave the replica table."""
        self.stop()
        for task in self._tasks:
            if self._idle:  # waiting for work holds nothing: no need to sit out the wait
                task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()
        with contextlib.suppress(QueueUnavailable):
            with unavailable_as_error("leaving the replica table"):
                await self.client.zrem(f"{self.prefix}:replicas", self.replica_id)
                await self.client.delete(f"{self.prefix}:replica:{self.replica_id}")

    # --- internals -------------------------------------------------------------------------
    async def _complete(self, job: Job, status: str, data: bytes, durations: bytes,
                        audio_s: float, busy_s: float) -> int:
        result = int(await self._call("complete", self.scripts.complete, self.prefix, self.replica_id,
                                      job.job_id, job.token, status, data, durations,
                                      int(round(audio_s * 1000)), int(round(busy_s * 1000)), self.ewma_alpha))
        if result == STALE:
            self.lease_losses += 1
            log.warning("replica %s: lease on %s was lost before completion; result discarded",
                        self.replica_id, job.job_id)
        return result

    async def _heartbeat_lease(self, job: Job) -> None:
        while True:
            await asyncio.sleep(self.heartbeat_s)
            try:
                alive = await self._call("lease heartbeat", self.scripts.heartbeat, self.prefix, self.replica_id,
                                         self.replica_ttl_ms, job.job_id, job.token, self.lease_ms)
            except QueueUnavailable:
                continue  # keep trying: the lease may survive a short outage
            if alive == 0:
                return  # lost: nothing left to extend; complete() will report it

    async def _reap_forever(self) -> None:
        while not self._stopping.is_set():
            # Jitter keeps a fleet's reapers from running in lockstep.
            await self._sleep_or_stop(self.reap_interval_s * random.uniform(0.75, 1.25))
            if self._stopping.is_set():
                return
            try:
                report = await self.reap()
                if report.expired or report.orphaned:
                    log.warning("replica %s reaper: %s", self.replica_id, report)
            except QueueUnavailable:
                pass

    async def _sleep_or_stop(self, seconds: float) -> None:
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._stopping.wait(), seconds)


class ReplicaJobRunner:
    """The Dispatcher's `run_job`: synthesize one chunk job on this worker's replica."""

    def __init__(self, replica, voices, wait_histogram=None):
        self.replica = replica
        self.voices = voices
        self.wait_histogram = wait_histogram  # api.metrics.Histogram of first chunks' queue waits

    async def __call__(self, job: Job) -> JobOutput:
        if job.index == 0 and job.attempt == 1 and self.wait_histogram is not None:
            # A first chunk's deadline is its request's arrival: the difference is its queue wait.
            self.wait_histogram.observe(max(0.0, (job.leased_at_ms - job.deadline_ms) / 1000))
        ids, voice_spec, speed = decode_job(job.payload)
        voice = self.voices.resolve(voice_spec)
        result = await self.replica.synthesize(ids, self.voices.style(voice, len(ids)), speed)
        audio = np.ascontiguousarray(result.audio, dtype="<f4")
        return JobOutput(audio.tobytes(), result.durations, len(audio) / SAMPLE_RATE)
