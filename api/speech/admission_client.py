"""The owner side of the fleet queue: admit a request, read its audio back in order.

A worker holding a client's connection calls, per request:

    rid = await admission.reserve()                   # a slot before any planning, or Refused -> 503
    ...plan the text (a 400 gives the slot back: await admission.withdraw(rid))...
    ticket = await admission.admit([ChunkJob(payload, phonemes, speed), ...], rid)   # or Refused -> 503
    async for result in admission.results(ticket):                             # chunk 0, 1, ... in order
        ...encode result.pcm and send it...
    await admission.release(ticket.request_id)        # or cancel(...) when the client went away

(The read of the last chunk releases the request in the same call, so `release` then only forgets
it here; chunks this process's own replica made are read from memory, without a call.)
(`admit` without a reservation checks both bounds in one call; `admission.session(...)` wraps the
admit / release-or-cancel pair.) Any replica in the fleet may
run the chunk jobs; this side never needs to know which. Every Redis failure surfaces as
`QueueUnavailable`, so the caller can serve the request locally instead. Independent of FastAPI
and of torch: the payload of a job is opaque bytes that the replica's job runner understands.
See queue/PROTOCOL.md for the keys and scripts.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import math
import time
import uuid
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import redis.asyncio as aioredis

from api.speech.contract import key_bound
from api.speech.redis_link import (
    DEFAULT_PREFIX,
    QueueStats,
    QueueUnavailable,
    Scripts,
    TracksAvailability,
    read_stats,
    stop_if_cancelled,
)
from api.speech.worker_queue import ADMISSION, WorkerQueueOwner

__all__ = [
    "AdmissionBounds", "AdmissionClient", "ChunkJob", "first_audio_places", "ChunkResult", "QueueUnavailable", "Refused",
    "RequestFailed", "RequestLost", "ResultTimeout", "Ticket", "place_spacing_ms", "retry_after",
    "retry_headers",
]

# Audio seconds per busy second of one replica, assumed until a completion has measured it.
# Deliberately low (CPU-like), so the first Retry-After errs on the side of waiting.
DEFAULT_RATE_PRIOR = 1.0
RETRY_AFTER_MIN_MS = 100
RETRY_AFTER_MAX_MS = 300_000
# The longest a crowd is spread over: beyond it a refused client is told this (or the first place's
# time, if later). Under an open-loop overload new arrivals, not returning clients, take the places
# that free, so the crowd's line would otherwise grow for as long as the overload lasts.
RETRY_CROWD_MAX_MS = 30_000


@dataclass(frozen=True)
class AdmissionBounds:
    """How much the fleet accepts before answering 503, or 429 to one API key (<= 0 means unbounded)."""

    max_requests: int            # admitted requests, queued or streaming
    max_queued_seconds: float    # estimated audio seconds of chunk jobs waiting beyond what is made by
                                 # their deadlines (admit.lua's schedule check)
    key_max_requests: int = 0    # admitted requests of one API key (KOKORO_KEY_MAX_SHARE)
    key_max_queued_seconds: float = 0.0  # one API key's share of max_queued_seconds (and of what the
                                         # replicas make): the same schedule check on its jobs alone

    @property
    def key_work_share(self) -> float:
        """The share of the fleet's work bound and output one key's jobs may hold (1: no such bound)."""
        if self.key_max_queued_seconds <= 0 or self.max_queued_seconds <= 0:
            return 1.0
        return min(1.0, self.key_max_queued_seconds / self.max_queued_seconds)

    @classmethod
    def for_replicas(cls, replicas: int, max_requests: int = 0, max_queued_seconds: float = 0.0,
                     key_max_share: float = 1.0, *, batch_max: int = 1,
                     first_audio_places: int = 0) -> "AdmissionBounds":
        """Defaults derived from the replicas: two requests per replica (one running, one waiting),
        enough to fill every replica's batch (`batch_max`), and as many as the fleet can start within
        its first-audio target (`first_audio_places`, from `first_audio_places()`), whichever is most;
        20 s of queued audio per replica; explicit non-zero values win. One key may hold
        `key_max_share` of the request bound and of the work bound."""
        replicas = max(1, replicas)
        max_requests = max_requests or max(2 * replicas, replicas * max(1, batch_max), first_audio_places)
        max_queued_seconds = max_queued_seconds or 20.0 * replicas
        key_work = key_max_share * max_queued_seconds if 0 < key_max_share < 1 else 0.0
        return cls(max_requests, max_queued_seconds, key_bound(key_max_share, max_requests), key_work)

    @classmethod
    def from_settings(cls, settings, replicas: int, rate: float | None = None,
                      seconds_per_phoneme: float = 0.0) -> "AdmissionBounds":
        """KOKORO_QUEUE_MAX_REQUESTS / KOKORO_QUEUE_MAX_AUDIO_SECONDS, or the derived defaults (with
        the measured `rate` and a first chunk of KOKORO_FIRST_CHUNK_PHONEMES at `seconds_per_phoneme`,
        what KOKORO_FIRST_AUDIO_TARGET_MS allows); KOKORO_KEY_MAX_SHARE of both bounds for one key."""
        places = first_audio_places(replicas, rate, settings.first_audio_target_ms / 1000,
                                    settings.first_chunk_phonemes * seconds_per_phoneme)
        return cls.for_replicas(replicas, settings.queue_max_requests, settings.queue_max_audio_seconds,
                                settings.key_max_share, batch_max=settings.batch_max, first_audio_places=places)


def first_audio_places(replicas: int, rate: float | None, target_s: float, first_chunk_audio_s: float) -> int:
    """How many requests arriving together all hear their first audio within `target_s`: the first
    chunks (`first_chunk_audio_s` each) that `replicas` make in that time at `rate` audio seconds per
    busy second each (their measured service rate, batches included). 0 when any is unknown."""
    if not (rate and rate > 0 and target_s > 0 and first_chunk_audio_s > 0):
        return 0
    return math.floor(max(1, replicas) * rate * target_s / first_chunk_audio_s)


@dataclass(frozen=True)
class ChunkJob:
    payload: bytes   # what the replica's job runner needs (opaque to the queue)
    phonemes: int    # for the audio-duration estimate that orders the queue and bounds admission
    speed: float = 1.0  # the chunk's speaking rate, as its payload gives it to the replica: the estimate's too

    def __post_init__(self):
        if not self.speed > 0:
            raise ValueError(f"a chunk's speed must be positive, got {self.speed}")


@dataclass(frozen=True)
class Ticket:
    request_id: str
    chunks: int
    arrival_ms: int             # Redis server time
    estimated_seconds: float    # estimated audio duration of the whole request
    live_replicas: int
    # lease.lua's reply for this worker's idle replica, when `admit` was asked to lease for it
    leased: tuple = field(default=(), repr=False)


@dataclass(frozen=True)
class ChunkResult:
    index: int
    pcm: bytes                  # as the replica's job runner produced it
    durations: np.ndarray       # int64 frames per token


class Refused(Exception):
    """The fleet is full: answer 503 with `Retry-After: retry_after_s` and `retry-after-ms`."""

    def __init__(self, reason: str, retry_after_s: int, retry_after_ms: int, work_ahead_s: float,
                 admitted: int, live_replicas: int, rate: float | None):
        # "requests" (too many admitted), "key" (this API key holds its share of them), "work"
        # (queue too long) or "key_work" (this API key's jobs hold its share of the queue)
        self.reason = reason
        self.retry_after_s = retry_after_s
        self.retry_after_ms = retry_after_ms
        self.work_ahead_s = work_ahead_s
        self.admitted = admitted
        self.live_replicas = live_replicas
        self.rate = rate
        if reason == "key":
            super().__init__(f"This API key holds its share of the server ({admitted} requests in progress, "
                             f"KOKORO_KEY_MAX_SHARE); retry in about {retry_after_s} s.")
            return
        if reason == "key_work":
            super().__init__(f"This API key holds its share of the server's queued audio (KOKORO_KEY_MAX_SHARE; "
                             f"its earlier requests have more audio waiting than the share allows); "
                             f"retry in about {retry_after_s} s.")
            return
        what = "too many requests in progress" if reason == "requests" else "too much audio queued"
        super().__init__(f"The server is at capacity ({what}); retry in about {retry_after_s} s.")


class RequestFailed(RuntimeError):
    """The queue ended the request with an error (e.g. a chunk's replica died twice)."""


class RequestLost(RequestFailed):
    """The request disappeared from Redis (a Redis restart, or the reaper released it)."""


class ResultTimeout(RequestFailed):
    """No result for a chunk within the caller's time limit."""


def retry_after(work_s: float, replicas: int, rate: float | None) -> tuple[int, int]:
    """(Retry-After seconds, retry-after-ms) for `work_s` audio seconds that must drain first, at
    `rate` audio seconds per second on each of `replicas` replicas. Seconds are an integer >= 1
    (the header's grammar); milliseconds are the finer figure the OpenAI client prefers."""
    return retry_headers(1000.0 * max(0.0, work_s) / _capacity(replicas, rate))


def retry_headers(wait_ms: float) -> tuple[int, int]:
    """(Retry-After seconds, retry-after-ms) for a wait of `wait_ms`, clamped to the sane range."""
    ms = int(min(RETRY_AFTER_MAX_MS, max(RETRY_AFTER_MIN_MS, math.ceil(wait_ms))))
    return max(1, math.ceil(ms / 1000)), ms


def _capacity(replicas: int, rate: float | None) -> float:
    """Audio seconds the fleet makes per second: `replicas` at `rate` each (the prior until measured)."""
    return max(1, replicas) * (rate if rate and rate > 0 else DEFAULT_RATE_PRIOR)


def place_spacing_ms(reason: str, work_ahead_ms: float, admitted: int, new_work_ms: float, replicas: int,
                     rate: float | None, key_work_share: float = 1.0) -> float:
    """How long one more place takes to free after the first, for a crowd of clients refused for
    `reason`: each refused client given the next such slot comes back about as fast as places free
    (queue/retry.lua keeps the slots). A request slot ("requests", "key") frees when an average
    admitted request has run; room under the work bound ("work") when as much work as this request
    brings has drained, at the key's share of the fleet's output for "key_work"."""
    if reason == "work":
        work_ms = new_work_ms
    elif reason == "key_work":
        work_ms = new_work_ms / max(key_work_share, 1e-6)
    else:
        work_ms = work_ahead_ms / max(1, admitted)
    return max(1.0, work_ms / _capacity(replicas, rate))


class AdmissionClient(TracksAvailability):
    """One worker's admission client. `worker_id` names this process; the reaper frees the
    requests of a worker whose alive key (refreshed by `start()`'s heartbeat and by every
    read) expires. `worker_queue`, the worker's queue owner, holds what this side shares with the
    replica side: the PCM this process's own replica made for these requests (fetch.lua answers
    "local" for those chunks; once Redis accepted a completion, the chunk is read from memory with no
    Redis call at all), the requests Redis released already, and whether Redis answers."""

    side = ADMISSION

    def __init__(self, client: aioredis.Redis, worker_id: str, bounds: AdmissionBounds, *,
                 worker_queue: WorkerQueueOwner, ms_per_phoneme: float, prefix: str = DEFAULT_PREFIX,
                 owner_ttl_s: float = 5.0, poll_s: float = 1.0):
        self.client = client
        self.worker_queue = worker_queue
        self.worker_id = worker_id
        self.bounds = bounds
        self.prefix = prefix
        self.owner_ttl_ms = int(owner_ttl_s * 1000)
        # The speaking-rate prior (the fleet service passes worker.audio.SECONDS_PER_PHONEME); the
        # queue replaces it with the measured figure after the first completed chunk.
        self.ms_per_phoneme = ms_per_phoneme
        self.poll_s = poll_s  # longest single blocking read; must stay below the socket timeout
        self.scripts = Scripts(client)
        self._heartbeat: asyncio.Task | None = None

    # --- lifecycle -------------------------------------------------------------------------
    async def start(self) -> None:
        """Start the owner heartbeat (keeps this worker's requests from being reaped)."""
        if self._heartbeat is None:
            self._heartbeat = asyncio.create_task(self._beat(), name=f"owner-heartbeat-{self.worker_id}")

    async def close(self) -> None:
        if self._heartbeat is not None:
            self._heartbeat.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._heartbeat
            self._heartbeat = None

    async def _beat(self) -> None:
        key = f"{self.prefix}:alive:{self.worker_id}"
        while True:
            with contextlib.suppress(QueueUnavailable):  # reported to the owner: degraded
                await self._call("owner heartbeat", functools.partial(self.client.set, px=self.owner_ttl_ms),
                                 key, b"1")
            stop_if_cancelled("owner heartbeat")
            await asyncio.sleep(self.owner_ttl_ms / 3000)

    # --- the request's life ----------------------------------------------------------------
    async def reserve(self, request_id: str | None = None, key: str | None = None) -> str:
        """Hold a slot under the request bound (and, with `key`, an API key's name, under that key's
        bound) for a request not planned yet, or raise `Refused`: one cheap round trip, so a full
        fleet answers 503 without the text frontend's work. The slot is the request's until
        `admit(..., request_id)` enqueues its jobs or `withdraw` gives it back (the reaper frees it
        if this worker dies). Returns the request id."""
        rid = request_id or uuid.uuid4().hex
        reply = await self._call("reservation", self.scripts.reserve, self.prefix, rid, self.worker_id,
                                 self.owner_ttl_ms, self.bounds.max_requests, key or "",
                                 self.bounds.key_max_requests)
        if reply[0] != 1:
            raise await self._refused(reply, key)
        return rid

    async def withdraw(self, request_id: str) -> bool:
        """Give back a reservation whose request will not be admitted (its text was refused)."""
        return bool(await self._call("withdrawal", self.scripts.withdraw, self.prefix, request_id))

    async def admit(self, jobs: Sequence[ChunkJob], request_id: str | None = None,
                    lease_for: Sequence | None = None, key: str | None = None) -> Ticket:
        """Admit a request of `jobs` (its chunks, in order) and enqueue them, or raise `Refused`.
        With the id of a reservation, only the work bound is left to check (its key's was checked
        by `reserve`); a refusal there gives the reservation back. `lease_for` (an idle replica's `Dispatcher.lease_arguments()`): the
        same call then leases for that replica as lease.lua would, and the ticket's `leased` holds
        what it got (the replica must run it: `Dispatcher.run_claimed`)."""
        if not jobs:
            raise ValueError("a request needs at least one chunk job")
        rid = request_id or uuid.uuid4().hex
        args: list = [self.prefix, rid, self.worker_id, self.owner_ttl_ms, self.bounds.max_requests,
                      int(self.bounds.max_queued_seconds * 1000), self.ms_per_phoneme, len(jobs),
                      key or "", self.bounds.key_max_requests, int(self.bounds.key_max_queued_seconds * 1000)]
        for job in jobs:
            args += [int(job.phonemes), float(job.speed), job.payload]
        if lease_for:
            args += list(lease_for)
        reply = await self._call("admission", self.scripts.admit, *args)
        if reply[0] == 1:
            _, arrival_ms, total_est_ms, live, *leased = reply
            return Ticket(rid, len(jobs), int(arrival_ms), total_est_ms / 1000, int(live),
                          tuple(leased[0]) if leased else ())
        raise await self._refused(reply, key)

    async def _refused(self, reply: list, key: str | None = None) -> Refused:
        """The `Refused` for a refusal reply of admit.lua or reserve.lua, with its retry estimate:
        when the first place frees, pushed back behind the clients refused before it (retry.lua)."""
        _, reason, admitted, queued_ms, inflight_ms, new_ms, live, rate, *over = reply
        reason = reason.decode()
        rate = float(rate) if rate else None
        work_ahead_ms = queued_ms + inflight_ms
        if reason == "work":
            # Enough queued work must drain for this request to fit under the bound: admit.lua
            # says how much (its schedule check's worst excess).
            must_drain_ms = over[0] if over else queued_ms + new_ms - self.bounds.max_queued_seconds * 1000
        elif reason == "key_work":
            # The key's own excess, which drains at its share of the fleet's output.
            must_drain_ms = over[0] / self.bounds.key_work_share
        else:
            # A slot frees when one admitted request finishes: about the average work per request.
            must_drain_ms = work_ahead_ms / max(1, admitted)
        _, first_ms = retry_after(must_drain_ms / 1000, int(live), rate)
        spacing_ms = place_spacing_ms(reason, work_ahead_ms, int(admitted), new_ms, int(live), rate,
                                      self.bounds.key_work_share)
        scope = f"key:{key}" if reason in ("key", "key_work") and key else "fleet"
        try:
            wait_ms = await self._call("retry slot", self.scripts.retry, self.prefix, scope, first_ms,
                                       math.ceil(spacing_ms), max(first_ms, RETRY_CROWD_MAX_MS))
        except QueueUnavailable:  # the refusal stands; only the spreading is lost
            wait_ms = first_ms
        seconds, ms = retry_headers(wait_ms)
        return Refused(reason, seconds, ms, work_ahead_ms / 1000, int(admitted), int(live), rate)

    async def results(self, ticket: Ticket, timeout_s: float | None = None,
                      local_run: asyncio.Future | None = None) -> AsyncIterator[ChunkResult]:
        """The request's chunk results in order, each as soon as it exists. `timeout_s` bounds the
        wait for any one chunk. Raises `RequestFailed` (with the queue's message), `RequestLost`,
        `ResultTimeout` or `QueueUnavailable`; it never waits forever. `local_run`: this process's
        replica running `ticket.leased` (awaited before reading those jobs' chunks from memory).
        The read of the last chunk releases the request (the owner then holds all its audio)."""
        wake = f"{self.prefix}:wake:{ticket.request_id}"
        leased = {entry[0].decode() for entry in ticket.leased}
        for index in range(ticket.chunks):
            job_id = f"{ticket.request_id}#{index}"
            if local_run is not None and job_id in leased and not local_run.done():
                with contextlib.suppress(Exception):  # its failure shows in Redis: read from there
                    await asyncio.shield(local_run)
            accepted = self.worker_queue.take_accepted(job_id)
            if accepted is not None:
                yield ChunkResult(index, *accepted)
                continue
            last = index == ticket.chunks - 1
            give_up = None if timeout_s is None else time.monotonic() + timeout_s
            while True:
                reply = await self._call("result read", self.scripts.fetch, self.prefix, ticket.request_id,
                                         index, self.worker_id, self.owner_ttl_ms, int(last))
                status = reply[0]
                if reply[-1] == b"released":
                    self.worker_queue.released_by_redis(ticket.request_id)
                if status == b"ok":
                    yield ChunkResult(index, reply[1], np.frombuffer(reply[2], dtype="<i8").astype(np.int64))
                    break
                if status == b"local":
                    pcm = self.worker_queue.take_made(job_id)
                    if pcm is None:  # only if another process shares this worker id: a bug
                        raise RequestLost(f"chunk {index} of request {ticket.request_id} was made by this "
                                          "worker's replica but its audio is not in this process")
                    yield ChunkResult(index, pcm, np.frombuffer(reply[1], dtype="<i8").astype(np.int64))
                    break
                if status == b"error":
                    raise RequestFailed(reply[1].decode(errors="replace"))
                if status == b"gone":
                    raise RequestLost(f"request {ticket.request_id} is no longer in the queue "
                                      "(Redis restarted, or the request was released)")
                wait = self.poll_s
                if give_up is not None:
                    wait = min(wait, give_up - time.monotonic())
                    if wait <= 0:
                        raise ResultTimeout(f"no audio for chunk {index} of request {ticket.request_id} "
                                            f"within {timeout_s:g} s")
                # Completions push to the wake list, so nothing is missed between fetch and wait.
                await self._call("result wait", self.client.blpop, [wake], max(0.01, wait))

    @property
    def local_results(self) -> Mapping[str, bytes]:
        """A read-only view of the audio this worker's replica made and holds for these requests."""
        return self.worker_queue.results_view()

    async def cancel(self, request_id: str) -> bool:
        """The client went away: drop the request's queued jobs and free its slot."""
        if self.worker_queue.end_request(request_id):  # its last chunk was read: nothing left to cancel
            return False
        return bool(await self._call("cancel", self.scripts.cancel, self.prefix, request_id))

    async def release(self, request_id: str) -> bool:
        """The last chunk has been streamed (or the error read): free the slot (already done when
        the last chunk's read released it)."""
        if self.worker_queue.end_request(request_id):
            return True
        return bool(await self._call("release", self.scripts.release, self.prefix, request_id))

    @contextlib.asynccontextmanager
    async def session(self, jobs: Sequence[ChunkJob], request_id: str | None = None) -> AsyncIterator[Ticket]:
        """Admit, yield the ticket, then release (finished normally) or cancel (an exception or
        cancellation left the body early). A failure to reach Redis at exit is left to the reaper."""
        ticket = await self.admit(jobs, request_id)
        finished = False
        try:
            yield ticket
            finished = True
        finally:
            with contextlib.suppress(QueueUnavailable):
                if finished:
                    await self.release(ticket.request_id)
                else:
                    await asyncio.shield(self.cancel(ticket.request_id))

    async def stats(self) -> QueueStats:
        return await read_stats(self.client, self.prefix)
