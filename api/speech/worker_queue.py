"""The one owner of a worker's queue state: a plain object, as text-generation-inference's `State` is.

Every Uvicorn worker plays two parts toward the fleet queue: the owner of the requests whose
connections it holds (`AdmissionClient`, `FleetAdmission`, the stream) and the replica that leases
chunk jobs (`Dispatcher`). Everything the two parts share lives here, in one `WorkerQueueOwner` per
worker, and nowhere else:

- the audio this worker's replica made for this worker's own requests (it never crosses Redis), with,
  once Redis accepted the completion, its durations and whether that call released the request;
- the requests Redis already released (by the call that handed over their last chunk);
- the replica's claim: the owner side may take the replica while it waits for work, and the lease
  loop leases nothing until the claimed run gives it back;
- the admitted requests whose response has not started streaming yet (cancelled when they wait too
  long), and the clean-ups left running for requests whose client went away;
- whether Redis answers each side (degraded mode: the worker serves its own requests on its replica),
  and the counters the admissions and the streams keep (`FleetCounters`, read by /metrics).

Every method that changes the state is synchronous: asyncio runs one callback at a time on one
thread, so a method that never awaits is atomic and ordered without any lock or command queue, and a
caller cancelled around it cannot leave it half done. Only `close` and the waits (`lease_turn`,
`claimed_runs_done`) await. The Redis calls stay with the two sides; they report here what came back.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Coroutine, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import numpy as np

log = logging.getLogger("kokoro_fleet.worker_queue")

# The two sides that call Redis and report here whether it answered.
ADMISSION, REPLICA = "admission", "replica"


@dataclass
class FleetCounters:
    """What this worker's admissions and streams came to (/metrics); changed only by the owner."""

    admitted: int = 0             # requests this worker put in the shared queue
    refused: int = 0              # 503s from the shared queue's bound
    served_locally: int = 0       # admitted while Redis was unreachable: ran on this replica
    from_cache: int = 0           # every chunk in this worker's replica's synthesis cache: no queue
    finished_locally: int = 0     # lost Redis mid-stream: remaining chunks ran on this replica
    failed: int = 0               # the queue ended the request with an error
    cancelled: int = 0            # client gone (or response never started): jobs cancelled
    degraded_since: float | None = None  # monotonic time Redis stopped answering; None while it answers
    degraded_seconds: float = 0.0        # seconds degraded before `degraded_since`


class WorkerQueueOwner:
    """One worker's queue state; both sides report to it and read from it."""

    def __init__(self, name: str):
        self.name = name
        # job id -> PCM this worker's replica made for this worker's own requests
        self._made: dict[str, bytes] = {}
        # job id -> (durations, request released) of those whose completion Redis accepted
        self._accepted: dict[str, tuple[np.ndarray, bool]] = {}
        # requests released by the Redis call that handed over their last chunk (fetch.lua or
        # complete.lua): their release or cancel has nothing left to do in Redis
        self._released: set[str] = set()
        # The replica's claim: `_idle` while its loop waits for work; `_loop_may_lease` cleared
        # while the owner side runs jobs on it.
        self._idle = False
        self._loop_may_lease = asyncio.Event()
        self._loop_may_lease.set()
        self._claimed_runs: set[asyncio.Task] = set()
        self._stopping = False
        # request id -> (admitted plan, monotonic admission time), until its stream starts
        self._unstarted: dict[str, tuple[Any, float]] = {}
        self._abandoned: set[asyncio.Task] = set()  # clean-ups of requests whose client left
        # side -> whether its last Redis call failed
        self._unreachable = {ADMISSION: False, REPLICA: False}
        self.counters = FleetCounters()

    async def close(self) -> None:
        """Wait for clean-ups in flight and the owner side's claimed runs."""
        self.stop_claims()
        if self._abandoned:
            await asyncio.gather(*self._abandoned, return_exceptions=True)
        await self.claimed_runs_done()

    # --- audio the replica made for this worker's own requests --------------------------------
    def hand_over(self, job_id: str, pcm: bytes) -> None:
        """The replica made `job_id`'s audio for a request of this worker: keep it in memory (before
        the completion makes it visible to the owner side)."""
        self._made[job_id] = pcm

    def completion_accepted(self, job_id: str, durations: np.ndarray, released: bool) -> None:
        """Redis accepted the completion of a handed-over job (`released`: and released its request)."""
        self._accepted[job_id] = (durations, released)

    def completion_refused(self, job_id: str) -> None:
        """Redis refused the completion (the lease was lost, the request gone): drop the audio."""
        self._made.pop(job_id, None)
        self._accepted.pop(job_id, None)

    def take_accepted(self, job_id: str) -> tuple[bytes, np.ndarray] | None:
        """(pcm, durations) of an own chunk whose completion Redis accepted, taken out of memory (a
        completion that released the request marks it released); None when there is none (the owner
        side then asks Redis; fetch.lua answers "local" for one accepted later)."""
        accepted = self._accepted.pop(job_id, None)
        if accepted is None:
            return None
        pcm = self._made.pop(job_id, None)
        if pcm is None:  # already read through fetch.lua
            return None
        durations, released = accepted
        if released:
            self._released.add(_request_of(job_id))
        return pcm, np.asarray(durations, dtype=np.int64)

    def take_made(self, job_id: str) -> bytes | None:
        """The PCM of an own chunk that Redis says was made here ("local"), taken out of memory."""
        self._accepted.pop(job_id, None)
        return self._made.pop(job_id, None)

    def released_by_redis(self, request_id: str) -> None:
        """The Redis call that read the request's last chunk also released it."""
        self._released.add(request_id)

    def end_request(self, request_id: str) -> bool:
        """The request is over (released or cancelled): drop whatever audio of it is still held;
        True when Redis released it already (nothing left to do there)."""
        prefix = request_id + "#"
        for held in (self._made, self._accepted):
            for key in [k for k in held if k.startswith(prefix)]:
                del held[key]
        released = request_id in self._released
        self._released.discard(request_id)
        return released

    def results_view(self) -> Mapping[str, bytes]:
        """A read-only view of the audio held for own requests (for /metrics-like checks and tests)."""
        return MappingProxyType(self._made)

    def accepted_view(self) -> Mapping[str, tuple[np.ndarray, bool]]:
        return MappingProxyType(self._accepted)

    # --- the replica's claim ------------------------------------------------------------------
    def claim(self, leases: bool = True) -> bool:
        """Take the replica for the owner side if its loop is waiting for work; False when it is
        busy, already claimed, stopping, or holds no replica (`leases` False)."""
        if not leases or not self._idle or not self._loop_may_lease.is_set() or self._stopping:
            return False
        self._loop_may_lease.clear()
        return True

    def unclaim(self) -> None:
        self._loop_may_lease.set()

    def stop_claims(self) -> None:
        """The lease loop is stopping: no more claims."""
        self._stopping = True

    async def claimed_runs_done(self) -> None:
        """Wait for the jobs leased for the owner side: they finish and complete too."""
        if self._claimed_runs:
            await asyncio.gather(*self._claimed_runs, return_exceptions=True)

    @property
    def claimed(self) -> bool:
        return not self._loop_may_lease.is_set()

    async def lease_turn(self) -> None:
        """Return when the lease loop may lease: at once unless the owner side holds the replica."""
        await self._loop_may_lease.wait()

    @property
    def idle(self) -> bool:
        """The lease loop waits for work (holds no lease: safe to cancel, free to be claimed)."""
        return self._idle

    @contextlib.contextmanager
    def waiting_for_work(self):
        """Mark the lease loop idle for the length of its wait on the ready list."""
        self._idle = True
        try:
            yield
        finally:
            self._idle = False

    def run_claimed(self, run: Coroutine, name: str) -> asyncio.Task:
        """Run the claimed replica's jobs in a task of their own (a client that leaves must not cut a
        leased job short); the replica goes back to its loop when the run ends."""
        async def claimed_run() -> None:
            try:
                await run
            finally:
                self.unclaim()

        task = asyncio.create_task(claimed_run(), name=name)
        self._claimed_runs.add(task)
        task.add_done_callback(self._claimed_runs.discard)
        return task

    # --- admitted requests and what became of them ----------------------------------------------
    def admitted(self, request_id: str, plan: Any) -> None:
        """A request entered the shared queue; its stream has not started yet."""
        self.counters.admitted += 1
        self._unstarted[request_id] = (plan, time.monotonic())

    def stream_started(self, request_id: str) -> None:
        self._unstarted.pop(request_id, None)

    def take_unstarted(self, seconds: float | None = None) -> list[Any]:
        """Take the admitted plans whose stream has not started for `seconds` (None: all of them)."""
        now = time.monotonic()
        stale = [rid for rid, (_, at) in self._unstarted.items() if seconds is None or now - at > seconds]
        return [self._unstarted.pop(rid)[0] for rid in stale]

    def refused(self) -> None:
        """The fleet's bound refused a request (a 503)."""
        self.counters.refused += 1

    def served_here(self, from_cache: bool) -> None:
        """A request runs on this worker's replica without the queue: every chunk in its synthesis
        cache (`from_cache`), or Redis unreachable."""
        if from_cache:
            self.counters.from_cache += 1
        else:
            self.counters.served_locally += 1

    def finished_here(self) -> None:
        """Redis went away under a stream: its remaining chunks run on this worker's replica."""
        self.counters.finished_locally += 1

    def request_failed(self) -> None:
        """The queue ended a request with an error, which its owner has read."""
        self.counters.failed += 1

    def request_cancelled(self) -> None:
        """A request's queued jobs were cancelled (its client left, or its response never started)."""
        self.counters.cancelled += 1

    def clean_up_later(self, coro: Coroutine) -> None:
        """Run a clean-up whose requester is gone (a cancelled admission); `close` awaits it."""
        task = asyncio.ensure_future(coro)
        self._abandoned.add(task)
        task.add_done_callback(self._abandoned.discard)

    # --- degraded mode ------------------------------------------------------------------------
    def redis_answered(self, side: str, answered: bool) -> None:
        """`side` (ADMISSION or REPLICA) reports whether its last Redis call got an answer; the
        worker is degraded while either side's last call failed. The mode's changes are followed
        here, as they happen (counters and log)."""
        if self._unreachable[side] == (not answered):
            return
        self._unreachable[side] = not answered
        degraded, c, now = self.degraded, self.counters, time.monotonic()
        if degraded and c.degraded_since is None:
            c.degraded_since = now
            log.warning("fleet worker %s: Redis unavailable: serving this worker's requests on its own replica",
                        self.name)
        elif not degraded and c.degraded_since is not None:
            c.degraded_seconds += now - c.degraded_since
            c.degraded_since = None
            log.warning("fleet worker %s: Redis is back: dispatching through the queue again", self.name)

    def unreachable(self, side: str) -> bool:
        """Whether `side`'s last Redis call failed."""
        return self._unreachable[side]

    @property
    def degraded(self) -> bool:
        """Redis did not answer the last call of this worker's owner or replica side."""
        return any(self._unreachable.values())

    def seconds_degraded(self) -> float:
        c = self.counters
        return c.degraded_seconds + (time.monotonic() - c.degraded_since if c.degraded_since else 0.0)


def _request_of(job_id: str) -> str:
    """The request id of a job id "<request_id>#<index>"."""
    return job_id.rpartition("#")[0]
