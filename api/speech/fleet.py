"""The fleet's speech service: every Uvicorn worker is an HTTP front and one model replica; the
work is shared through Redis.

`FleetSpeechService` adapts the speech-service contract (api/speech/contract.py) to the shared queue
when REDIS_URL is set (the launcher sets it to its embedded Redis server when it runs several
workers). It only assembles one worker's parts and hands each call to the part that does it:

- `admit(request)`: `FleetAdmission` (api/speech/fleet_admission.py) reserves a slot in the fleet (or
  refuses: `Overloaded`, a 503 with Retry-After), plans the text off the event loop, enqueues the
  plan's chunks and returns a `FleetPlan` carrying the ticket;
- `stream(plan)`: the local service's one streaming loop, with `QueuedAudio` as the chunks' source:
  the request's in-order results, whichever replica ran them;
- beside them, this worker's `Dispatcher` (api/speech/dispatcher.py) leases the fleet's
  earliest-deadline job whenever its replica is free;
- /metrics: `FleetFigures` (api/speech/fleet_figures.py), re-read by the housekeeping task here.

What the admission side and the lease side share (the audio this worker's replica made for its own
requests, the replica's claim, the requests not streaming yet, degraded mode, the counters) belongs to
one plain `WorkerQueueOwner` (api/speech/worker_queue.py). When Redis is unreachable (at start or mid-run) the
owner is degraded and the service serves its own requests on its own replica (still bounded by the
HTTP layer's per-process `ProcessAdmission`), says so in /health and /metrics, and goes back to the
queue as soon as Redis answers; a stream whose Redis died under it finishes its remaining chunks
locally.

Keep the bytes cheap: a job of a request this worker accepted hands its PCM to the worker's queue
owner (the completion stores only durations and a marker in Redis), and a free replica prefers such
a job when it is due within KOKORO_OWN_JOB_SLACK_MS of the fleet's earliest. Only audio another
worker's replica made crosses Redis (48 kB per audio second as 16-bit PCM);
`kokoro_fleet_local_total` and `kokoro_fleet_result_bytes_total` in /metrics show the split.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

import numpy as np

from api.metrics import Metrics
from api.settings import Settings
from api.speech.admission_client import (AdmissionBounds, AdmissionClient, ChunkResult, QueueUnavailable,
                                         RequestFailed, RequestLost)
from api.speech.contract import AudioPiece, ReplicaStats, SpeechPlan, SpeechRequest
from api.speech.dispatcher import Dispatcher, DispatcherConfig, NoReplica, ReplicaJobRunner
from api.speech.fleet_admission import FleetAdmission, FleetPlan
from api.speech.fleet_figures import STATS_REFRESH_S, FleetFigures, FleetSnapshot
from api.speech.local import SpeechService
from api.speech.redis_link import (DEFAULT_PREFIX, connect, open_connections, redacted_url, stop_if_cancelled,
                                    worker_id)
from api.speech.worker_queue import FleetCounters, WorkerQueueOwner
from worker.audio import SECONDS_PER_PHONEME, from_pcm16
from worker.text import Chunk

log = logging.getLogger("kokoro_fleet.fleet")

DISPATCH_MODES = ("shared", "local")


class FleetSpeechService:
    """The speech-service contract over the shared queue, with the local service as its fallback."""

    def __init__(self, local: SpeechService, redis_url: str, settings: Settings, *, replicas: int,
                 dispatch: str = "shared", name: str | None = None, owner_ttl_s: float = 5.0,
                 reap_interval_s: float = 1.0):
        if dispatch not in DISPATCH_MODES:
            raise ValueError(f"dispatch must be one of {DISPATCH_MODES}, got {dispatch!r}")
        self.local = local
        self.voices = local.voices  # the contract's voice bank (GET /v1/audio/voices)
        self.replica = local.replica
        self.settings = settings
        self.dispatch = dispatch
        self.name = name or worker_id()
        # `local` dispatch: the same code, but each worker's queue is its own (blind assignment).
        self.prefix = DEFAULT_PREFIX if dispatch == "shared" else f"{DEFAULT_PREFIX}:local:{self.name}"
        self.redis_url = redis_url
        self.replicas = replicas if dispatch == "shared" else 1
        self.chunk_timeout_s = settings.chunk_timeout_seconds or None
        self.started = time.monotonic()
        self.figures = FleetFigures(connect(redis_url), self.prefix)
        # The one owner of this worker's queue state; the admission side and the lease side each
        # hold it, and neither holds the other's state.
        self.worker_queue = WorkerQueueOwner(self.name)
        self.admission = AdmissionClient(connect(redis_url), self.name,
                                         AdmissionBounds.from_settings(settings, self.replicas),
                                         worker_queue=self.worker_queue, prefix=self.prefix,
                                         owner_ttl_s=owner_ttl_s, ms_per_phoneme=SECONDS_PER_PHONEME * 1000)
        runner = ReplicaJobRunner(local.replica, local.voices, self.figures.wait_histogram)
        self.dispatcher = Dispatcher(connect(redis_url), self.name, runner,
                                     DispatcherConfig.from_settings(settings, prefix=self.prefix,
                                                                    replica_ttl_s=owner_ttl_s,
                                                                    reap_interval_s=reap_interval_s),
                                     run_batch=runner.run_batch, worker_queue=self.worker_queue,
                                     engine=local.replica.engine.label,
                                     leases=not isinstance(local.replica, NoReplica))
        self.entry = FleetAdmission(local, self.admission, self.dispatcher, self.worker_queue, settings,
                                    replicas=self.replicas, follows_fleet=dispatch == "shared")
        self._tasks: list[asyncio.Task] = []

    # --- lifecycle ------------------------------------------------------------------------------
    async def start(self) -> "FleetSpeechService":
        await self.admission.start()
        # The HTTP layer lets at most KOKORO_MAX_REQUESTS requests of this process into `admit` at
        # once, each making one Redis call at a time: open that many connections now, so a burst's
        # reservations (and 503s) never wait for connections being opened.
        with contextlib.suppress(QueueUnavailable):  # Redis down at start: degraded, opened later
            await open_connections(self.admission.client, self.settings.max_requests)
        self.dispatcher.start()
        self._tasks.append(asyncio.create_task(self._housekeeping(), name=f"fleet-housekeeping-{self.name}"))
        log.info("fleet worker %s: %s dispatch through %s (bounds %s)", self.name, self.dispatch,
                 redacted_url(self.redis_url), self.admission.bounds)
        return self

    async def aclose(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()
        await self.dispatcher.close()
        await self.admission.close()
        await self.entry.cancel_unstarted(None)
        await self.worker_queue.close()
        for client in (self.admission.client, self.dispatcher.client, self.figures.client):
            with contextlib.suppress(Exception):
                await client.aclose()

    # --- state ----------------------------------------------------------------------------------
    @property
    def degraded(self) -> bool:
        """Redis did not answer the last call of this worker's owner or replica side."""
        return self.worker_queue.degraded

    @property
    def counters(self) -> FleetCounters:
        return self.worker_queue.counters

    @property
    def snapshot(self) -> FleetSnapshot:
        return self.figures.snapshot

    def health(self) -> dict[str, Any]:
        """The fleet's part of /health."""
        s = self.snapshot.stats
        return {**self.local.health(),  # which kernels this worker's replica serves with
                "mode": "degraded" if self.degraded else "fleet", "dispatch": self.dispatch, "worker": self.name,
                **({"fleet_admitted": int(s["admitted"]), "live_replicas": s.live_replicas} if s and not self.degraded
                   else {})}

    def register_metrics(self, m: Metrics) -> None:
        self.figures.register(m, self.worker_queue, self.dispatcher, self.stats, self.started)

    # --- the request's life ---------------------------------------------------------------------
    def stats(self) -> ReplicaStats:
        return self.local.stats()

    def plan(self, request: SpeechRequest) -> SpeechPlan:
        return self.local.plan(request)

    async def admit(self, request: SpeechRequest, key: str | None = None) -> FleetPlan:
        return await self.entry.admit(request, key)

    async def stream(self, plan: SpeechPlan) -> AsyncIterator[AudioPiece]:
        """The plan's pieces in order, from the shared queue's results (or this replica's), through
        the local service's one streaming loop."""
        if not isinstance(plan, FleetPlan) or plan.ticket is None:
            async with contextlib.aclosing(self.local.stream(plan)) as pieces:
                async for piece in pieces:
                    yield piece
            return
        self.worker_queue.stream_started(plan.ticket.request_id)
        results = self.admission.results(plan.ticket, timeout_s=self.chunk_timeout_s, local_run=plan.local_run)
        audio = QueuedAudio(self, plan, results)
        finished = False
        try:
            async with contextlib.aclosing(self.local.stream(plan, audio)) as pieces:
                async for piece in pieces:
                    yield piece
            finished = True
        finally:
            await results.aclose()
            done = finished or audio.failed  # a failure the owner has read: release, not cancel
            await self.entry.end(plan, done, cancelled=not done)

    # --- background -----------------------------------------------------------------------------
    async def _housekeeping(self) -> None:
        """Re-read the fleet's figures for /metrics and the admission bounds, note degraded or
        recovered, and cancel tickets whose response never started. The first read comes at once,
        so /metrics and `status` show the replica table from a worker's first second."""
        delay = 0.0
        while True:
            await asyncio.sleep(delay)
            delay = STATS_REFRESH_S
            await self.entry.cancel_unstarted()
            try:
                stats = await self.figures.refresh()
            except QueueUnavailable:
                continue
            except Exception:  # figures are best effort; never let them stop the housekeeping
                log.exception("reading the fleet's figures failed")
                continue
            finally:
                stop_if_cancelled("reading the fleet's figures")
            self.entry.follow_live_replicas(stats)


class QueuedAudio:
    """Where a queued plan's chunk audio comes from, for the local service's streaming loop: the
    request's in-order results from the shared queue, until Redis goes away (or restarts empty)
    under the stream; its remaining chunks then run on this worker's replica."""

    def __init__(self, fleet: FleetSpeechService, plan: FleetPlan, results: AsyncIterator[ChunkResult]):
        self.fleet = fleet
        self.plan = plan
        self.results = results
        self.remote = True
        self.failed = False  # the queue ended the request with an error, which the owner has read

    async def __call__(self, plan: SpeechPlan, index: int, chunk: Chunk) -> tuple[np.ndarray, np.ndarray]:
        if self.remote:
            try:
                result = await anext(self.results)
                return from_pcm16(np.frombuffer(result.pcm, dtype="<i2")), result.durations
            except (QueueUnavailable, RequestLost) as e:
                log.warning("request %s: %s; finishing its chunks %d.. on this replica",
                            self.plan.ticket.request_id, e, index)
                self.remote = False
                self.fleet.worker_queue.finished_here()
            except RequestFailed:
                self.fleet.worker_queue.request_failed()
                self.failed = True
                raise
        return await self.fleet.local.synthesize_chunk(plan, index, chunk)
