"""The one owner of a worker's queue state: an actor, as text-generation-inference's router queue is.

Every Uvicorn worker plays two parts toward the fleet queue: the owner of the requests whose
connections it holds (`AdmissionClient`) and the replica that leases chunk jobs (`Dispatcher`).
What the two parts have in common lives here, in one `WorkerQueueOwner` per worker, and nowhere else:

- the audio this worker's replica made for this worker's own requests (it never crosses Redis),
  with, once Redis accepted the completion, its durations and whether that call released the request;
- the replica's claim: the owner side may take the replica while it waits for work, and the lease
  loop leases nothing until the claimed run gives it back;
- the admitted requests whose response has not started streaming yet (cancelled when they wait too
  long), and the clean-ups left running for requests whose client went away;
- whether Redis answers (degraded mode: the worker serves its own requests on its replica).

The state is changed by one task only: callers send it commands over an asyncio queue and await the
reply (`_ask`), so commands are applied one at a time, in the order they were sent. The Redis calls a
request waits on (admission, its own result reads) stay in the request's own task: serialized behind
one task they made 503s slower under overload. Two answers are given synchronously, because a loop
step is atomic and the caller needs them before its next await: the claim (`claim`, asked right
before the admission call that leases for the claimed replica) and the mode (`degraded`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Coroutine, Mapping
from types import MappingProxyType
from typing import Any

import numpy as np

log = logging.getLogger("kokoro_fleet.worker_queue")


class WorkerQueueOwner:
    """One worker's queue state, driven by one task (started with the first command)."""

    def __init__(self, name: str):
        self.name = name
        self._commands: asyncio.Queue[tuple[Callable, tuple, asyncio.Future]] = asyncio.Queue()
        self._serving: asyncio.Task | None = None
        # job id -> PCM this worker's replica made for this worker's own requests
        self._made: dict[str, bytes] = {}
        # job id -> (durations, request released) of those whose completion Redis accepted
        self._accepted: dict[str, tuple[np.ndarray, bool]] = {}
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
        # Degraded mode: the sides (admission, replica) whose last Redis call failed.
        self._availability: list[Callable[[], bool]] = []
        self.degraded_since: float | None = None
        self.degraded_seconds = 0.0

    # --- the actor --------------------------------------------------------------------------
    async def _ask(self, command: Callable, *args):
        """Send `command(*args)` to the owner's task and await its reply."""
        if self._serving is None or self._serving.done():
            self._serving = asyncio.create_task(self._serve(), name=f"worker-queue-{self.name}")
        reply = asyncio.get_running_loop().create_future()
        self._commands.put_nowait((command, args, reply))
        return await reply

    async def _serve(self) -> None:
        while True:
            command, args, reply = await self._commands.get()
            try:
                result = command(*args)
            except Exception as e:  # the caller's to handle; the owner keeps serving
                if not reply.done():
                    reply.set_exception(e)
                continue
            if not reply.done():  # a caller cancelled meanwhile: the command still applied
                reply.set_result(result)

    async def close(self) -> None:
        """Wait for clean-ups in flight and the owner side's claimed runs; stop the owner's task."""
        self.stop_claims()
        if self._abandoned:
            await asyncio.gather(*self._abandoned, return_exceptions=True)
        await self.claimed_runs_done()
        if self._serving is not None:
            self._serving.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._serving
            self._serving = None

    # --- audio the replica made for this worker's own requests --------------------------------
    async def hand_over(self, job_id: str, pcm: bytes) -> None:
        """The replica made `job_id`'s audio for a request of this worker: keep it in memory (before
        the completion makes it visible to the owner side)."""
        await self._ask(self._made.__setitem__, job_id, pcm)

    async def completion_accepted(self, job_id: str, durations: np.ndarray, released: bool) -> None:
        """Redis accepted the completion of a handed-over job (`released`: and released its request)."""
        await self._ask(self._accepted.__setitem__, job_id, (durations, released))

    async def completion_refused(self, job_id: str) -> None:
        """Redis refused the completion (the lease was lost, the request gone): drop the audio."""
        await self._ask(self._drop_job, job_id)

    async def take_accepted(self, job_id: str) -> tuple[bytes, np.ndarray, bool] | None:
        """(pcm, durations, request released) of an own chunk whose completion Redis accepted, taken
        out of memory; None when there is none (the owner side then asks Redis)."""
        return await self._ask(self._take_accepted, job_id)

    def holds_accepted(self, job_id: str) -> bool:
        """Whether an own chunk's accepted audio is held now: a read, so a chunk read from Redis
        costs no command. One accepted later is still found: fetch.lua then answers "local"."""
        return job_id in self._accepted

    async def take_made(self, job_id: str) -> bytes | None:
        """The PCM of an own chunk that Redis says was made here ("local"), taken out of memory."""
        return await self._ask(self._take_made, job_id)

    async def forget_request(self, request_id: str) -> None:
        """Drop the in-memory audio of a request that ended before its owner read it."""
        await self._ask(self._forget_request, request_id)

    def results_view(self) -> Mapping[str, bytes]:
        """A read-only view of the audio held for own requests (for /metrics-like checks and tests)."""
        return MappingProxyType(self._made)

    def accepted_view(self) -> Mapping[str, tuple[np.ndarray, bool]]:
        return MappingProxyType(self._accepted)

    def _drop_job(self, job_id: str) -> None:
        self._made.pop(job_id, None)
        self._accepted.pop(job_id, None)

    def _take_accepted(self, job_id: str) -> tuple[bytes, np.ndarray, bool] | None:
        accepted = self._accepted.pop(job_id, None)
        if accepted is None:
            return None
        pcm = self._made.pop(job_id, None)
        if pcm is None:  # already read through fetch.lua
            return None
        durations, released = accepted
        return pcm, np.asarray(durations, dtype=np.int64), released

    def _take_made(self, job_id: str) -> bytes | None:
        self._accepted.pop(job_id, None)
        return self._made.pop(job_id, None)

    def _forget_request(self, request_id: str) -> None:
        prefix = request_id + "#"
        for held in (self._made, self._accepted):
            for key in [k for k in held if k.startswith(prefix)]:
                del held[key]

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

    # --- admitted requests whose stream has not started ---------------------------------------
    async def admitted(self, request_id: str, plan: Any) -> None:
        await self._ask(self._unstarted.__setitem__, request_id, (plan, time.monotonic()))

    async def stream_started(self, request_id: str) -> None:
        await self._ask(self._unstarted.pop, request_id, None)

    async def unstarted_since(self, seconds: float | None = None) -> list[Any]:
        """Take the admitted plans whose stream has not started for `seconds` (None: all of them)."""
        return await self._ask(self._take_unstarted, seconds)

    def _take_unstarted(self, seconds: float | None) -> list[Any]:
        now = time.monotonic()
        stale = [rid for rid, (_, at) in self._unstarted.items() if seconds is None or now - at > seconds]
        return [self._unstarted.pop(rid)[0] for rid in stale]

    def clean_up_later(self, coro: Coroutine) -> None:
        """Run a clean-up whose requester is gone (a cancelled admission); `close` awaits it."""
        task = asyncio.ensure_future(coro)
        self._abandoned.add(task)
        task.add_done_callback(self._abandoned.discard)

    # --- degraded mode ------------------------------------------------------------------------
    def watch_availability(self, *sides: Callable[[], bool]) -> None:
        """The sides whose `degraded` (last Redis call failed) make this worker degraded."""
        self._availability.extend(sides)

    @property
    def degraded(self) -> bool:
        """Redis did not answer the last call of this worker's owner or replica side."""
        return any(side() for side in self._availability)

    def note_mode(self) -> bool:
        """Follow degraded/recovered in the counters (and the log); returns `degraded`."""
        degraded, now = self.degraded, time.monotonic()
        if degraded and self.degraded_since is None:
            self.degraded_since = now
            log.warning("fleet worker %s: Redis unavailable: serving this worker's requests on its own replica",
                        self.name)
        elif not degraded and self.degraded_since is not None:
            self.degraded_seconds += now - self.degraded_since
            self.degraded_since = None
            log.warning("fleet worker %s: Redis is back: dispatching through the queue again", self.name)
        return degraded

    def seconds_degraded(self) -> float:
        return self.degraded_seconds + (time.monotonic() - self.degraded_since if self.degraded_since else 0.0)
