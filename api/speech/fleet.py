"""The fleet's speech service: every Uvicorn worker is an HTTP front and one model replica; the
work is shared through Redis.

`FleetSpeechService` adapts the speech-service contract (api/speech/contract.py) to the shared queue
when REDIS_URL is set (the launcher sets it to its embedded Redis server when it runs several
workers). `admit(request)` reserves a slot in the fleet (or refuses: `Overloaded`, a 503 with
Retry-After), plans the text off the event loop, turns the plan's chunks into jobs in the shared,
deadline-ordered queue, and returns a `FleetPlan` carrying the ticket; `stream(plan)` runs the local
service's one streaming loop with `QueuedAudio` as the chunks' source: the in-order results, whichever
replica ran them. Beside it this worker's `Dispatcher` leases the fleet's earliest-deadline job
whenever its replica is free. What the two sides share (the audio this worker's replica made for its
own requests, the replica's claim, the requests not streaming yet, degraded mode) belongs to one
`WorkerQueueOwner` (api/speech/worker_queue.py). When Redis is unreachable (at start or mid-run) the
owner is degraded and the service serves its own requests on its own replica (still bounded by the
HTTP layer's per-process `ProcessAdmission`), says so in /health and /metrics, and goes back to the
queue as soon as Redis answers; a stream whose Redis died under it finishes its remaining chunks
locally.

Keep the bytes cheap: a job of a request this worker accepted hands its PCM to the worker's queue
owner (the completion stores only durations and a marker in Redis), and a free replica prefers such
a job when it is due within KOKORO_OWN_JOB_SLACK_MS of the fleet's earliest. When this worker's
replica is waiting for work as a request is admitted, the admission claims it and leases for it in
the same Redis call, and the replica runs the job in this process at once: a one-chunk request then
costs two Redis round trips (admit-and-lease, complete-and-release) instead of about eight. Only
audio another worker's replica made crosses Redis (48 kB per audio second as 16-bit PCM);
`kokoro_fleet_local_total` and `kokoro_fleet_result_bytes_total` in /metrics show the split.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from prometheus_client import Histogram

from api.metrics import Metrics
from api.speech.contract import AudioPiece, KeyShareFull, Overloaded, ReplicaStats, SpeechPlan, SpeechRequest
from api.speech.admission_client import (AdmissionBounds, AdmissionClient, ChunkJob, ChunkResult, QueueUnavailable,
                                         Refused, RequestFailed, RequestLost, Ticket)
from api.speech.dispatcher import Dispatcher, DispatcherConfig, NoReplica, ReplicaJobRunner
from api.speech.local import SpeechService
from api.speech.worker_queue import WorkerQueueOwner
from worker.text import Chunk
from api.speech.redis_link import (DEFAULT_PREFIX, QueueStats, ReplicaStatus, connect, encode_job, open_connections,
                                   read_replicas, read_stats, stop_if_cancelled, worker_id)
from worker.audio import SECONDS_PER_PHONEME, from_pcm16
from api.settings import Settings

log = logging.getLogger("kokoro_fleet.fleet")

DISPATCH_MODES = ("shared", "local")
# A ticket admitted for a request whose response never started streaming (the client left between
# the headers and the first read) is cancelled after this long, so its slot cannot leak.
UNCLAIMED_TICKET_S = 30.0
# How often the fleet figures shown in /metrics are re-read from Redis.
STATS_REFRESH_S = 1.0
# How long a refusal makes this worker reserve short texts' slots before planning them.
REFUSAL_MEMORY_S = 1.0
# Histogram buckets for the wait of a request's first chunk in the shared queue.
WAIT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


# --- the fleet speech service -----------------------------------------------------------------------

@dataclass
class FleetPlan(SpeechPlan):
    """An admitted plan plus where it runs: `ticket` in the shared queue, or None (this worker's
    own replica, because Redis was unreachable when it was admitted)."""

    ticket: Ticket | None = None
    # This worker's replica running the jobs the admission leased for it (`ticket.leased`).
    local_run: asyncio.Task | None = None

    @classmethod
    def admitted(cls, plan: SpeechPlan, ticket: Ticket | None) -> "FleetPlan":
        return cls(plan.request, plan.voice, plan.lang_code, plan.chunks, plan.voices, ticket=ticket)


@dataclass
class FleetCounters:
    admitted: int = 0             # requests this worker put in the shared queue
    refused: int = 0              # 503s from the shared queue's bound
    served_locally: int = 0       # admitted while Redis was unreachable: ran on this replica
    from_cache: int = 0           # every chunk in this worker's replica's synthesis cache: no queue
    finished_locally: int = 0     # lost Redis mid-stream: remaining chunks ran on this replica
    failed: int = 0               # the queue ended the request with an error
    cancelled: int = 0            # client gone (or response never started): jobs cancelled
    # degraded mode is the worker queue owner's state: read here, changed there
    worker_queue: WorkerQueueOwner | None = field(default=None, repr=False)

    @property
    def degraded_since(self) -> float | None:
        return self.worker_queue.degraded_since if self.worker_queue else None

    @property
    def degraded_seconds(self) -> float:
        return self.worker_queue.degraded_seconds if self.worker_queue else 0.0


@dataclass
class FleetSnapshot:
    """What /metrics shows of the whole fleet, re-read from Redis every STATS_REFRESH_S."""

    stats: QueueStats | None = None
    replicas: list[ReplicaStatus] = field(default_factory=list)
    busy_fraction: dict[str, float] = field(default_factory=dict)
    read_at: float = 0.0


class FleetSpeechService:
    """The speech-service contract over the shared queue, with the local service as its fallback."""

    def __init__(self, local: SpeechService, redis_url: str, settings: Settings, *, replicas: int,
                 dispatch: str = "shared", name: str | None = None, owner_ttl_s: float = 5.0,
                 reap_interval_s: float = 1.0):
        if dispatch not in DISPATCH_MODES:
            raise ValueError(f"dispatch must be one of {DISPATCH_MODES}, got {dispatch!r}")
        self.local = local
        self.voices = local.voices
        self.replica = local.replica
        self.settings = settings
        self.dispatch = dispatch
        self.name = name or worker_id()
        # `local` dispatch: the same code, but each worker's queue is its own (blind assignment).
        self.prefix = DEFAULT_PREFIX if dispatch == "shared" else f"{DEFAULT_PREFIX}:local:{self.name}"
        self.redis_url = redis_url
        self.replicas = replicas if dispatch == "shared" else 1
        self.bounds = AdmissionBounds.from_settings(settings, self.replicas)
        self._bounds_replicas = self.replicas  # the replica count the bounds were last derived from
        self.chunk_timeout_s = settings.chunk_timeout_seconds or None
        self.wait_histogram = Histogram("kokoro_fleet_first_chunk_wait_seconds", "Wait of requests' first chunks "
                                        "in the queue before this replica leased them.", buckets=WAIT_BUCKETS,
                                        registry=None)
        # The one owner of this worker's queue state; the admission side and the lease side each
        # hold it, and neither holds the other's state.
        self.worker_queue = WorkerQueueOwner(self.name)
        self.admission = AdmissionClient(connect(redis_url), self.name, self.bounds, prefix=self.prefix,
                                         owner_ttl_s=owner_ttl_s, ms_per_phoneme=SECONDS_PER_PHONEME * 1000,
                                         worker_queue=self.worker_queue)
        runner = ReplicaJobRunner(self.replica, self.voices, self.wait_histogram)
        self.dispatcher = Dispatcher(connect(redis_url), self.name, runner,
                                     DispatcherConfig.from_settings(settings, prefix=self.prefix,
                                                                    replica_ttl_s=owner_ttl_s,
                                                                    reap_interval_s=reap_interval_s),
                                     run_batch=runner.run_batch, worker_queue=self.worker_queue,
                                     engine=self.replica.engine.label, leases=not isinstance(self.replica, NoReplica))
        self.worker_queue.watch_availability(lambda: self.admission.degraded, lambda: self.dispatcher.degraded)
        self._stats_client = connect(redis_url)
        self.counters = FleetCounters(worker_queue=self.worker_queue)
        self.snapshot = FleetSnapshot()
        # When a short text may skip the reservation (see `_plans_inline`): while fewer of this
        # worker's requests are being admitted than its share of the fleet's request bound, and no
        # refusal came back in the last REFUSAL_MEMORY_S.
        self._admitting = 0
        self._refused_at = -math.inf
        self._tasks: list[asyncio.Task] = []
        self._started = time.monotonic()

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
                 _redacted(self.redis_url), self.bounds)
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
        for plan in await self.worker_queue.unstarted_since(None):
            await self._end(plan, finished=False)
        await self.worker_queue.close()
        for client in (self.admission.client, self.dispatcher.client, self._stats_client):
            with contextlib.suppress(Exception):
                await client.aclose()

    # --- state ----------------------------------------------------------------------------------
    @property
    def degraded(self) -> bool:
        """Redis did not answer the last call of this worker's owner or replica side."""
        return self.worker_queue.degraded

    def health(self) -> dict[str, Any]:
        """The fleet's part of /health."""
        self.worker_queue.note_mode()  # the counters agree with the mode this reports, even between requests
        s = self.snapshot.stats
        return {**self.local.health(),  # which kernels this worker's replica serves with
                "mode": "degraded" if self.degraded else "fleet", "dispatch": self.dispatch, "worker": self.name,
                **({"fleet_admitted": int(s["admitted"]), "live_replicas": s.live_replicas} if s and not self.degraded
                   else {})}

    # --- the request's life ---------------------------------------------------------------------
    def stats(self) -> ReplicaStats:
        return self.local.stats()

    def plan(self, request: SpeechRequest) -> SpeechPlan:
        return self.local.plan(request)

    async def admit(self, request: SpeechRequest, key: str | None = None) -> FleetPlan:
        """A slot in the shared queue (or, Redis unreachable, on this replica); Overloaded when
        the fleet is full. A longer text's slot is reserved before the text is planned (in the
        text-frontend thread), so a burst beyond the fleet's bound is refused after one Redis round
        trip each, however much text the admitted requests' planning has to get through. A short
        text is planned on the loop in less time than that round trip takes, so it skips the
        reservation (admit.lua checks both bounds in the one call that enqueues it), unless this
        worker looks crowded (`_plans_inline`). `key`, the API key's name, counts the request
        against that key's share of the fleet (KOKORO_KEY_MAX_SHARE; KeyShareFull beyond it)."""
        self._admitting += 1
        try:
            voice = self.local.voice_for(request)  # resolved once for this request
            inline = self._plans_inline(request, voice)
            if self.worker_queue.note_mode():  # degraded: this replica serves this worker's requests
                plan = await self.local.plan_off_loop(request, voice, inline)
                return self._from_cache(plan) or self._served_here(plan)
            return await self._admit_to_queue(request, voice, inline, key)
        finally:
            self._admitting -= 1

    def _plans_inline(self, request: SpeechRequest, voice) -> bool:
        """Whether to plan a short text before its one admission call. In a burst beyond the
        fleet's bound, planning every text before learning it is refused would put each refusal
        behind all the planning before it on this loop: once this worker is admitting more than its
        share of the bound at once, or the fleet refused lately, texts are reserved first."""
        return (self.local.plans_inline(request, voice) and self._admitting <= self._share_of_bound()
                and time.monotonic() - self._refused_at > REFUSAL_MEMORY_S)

    def _share_of_bound(self) -> float:
        """This worker's share of the fleet's request bound (a replica per worker, all fleets on the queue)."""
        bound = self.admission.bounds.max_requests
        live = self.snapshot.stats.live_replicas if self.snapshot.stats else 0
        return math.ceil(bound / max(1, self.replicas, live)) if bound > 0 else math.inf

    def _refused(self, e: Refused) -> Overloaded:
        if e.reason in ("key", "key_work"):  # one key's share is full, not the fleet: no crowding to remember
            return KeyShareFull(e.retry_after_ms / 1000, str(e))
        self.counters.refused += 1
        self._refused_at = time.monotonic()
        return Overloaded(e.retry_after_ms / 1000, str(e))

    def _served_here(self, plan: SpeechPlan) -> FleetPlan:
        """A plan this worker's replica serves because Redis cannot be reached."""
        self.worker_queue.note_mode()
        if isinstance(self.replica, NoReplica):  # an HTTP front only: nothing to serve it on here
            raise Overloaded(1.0, "The server cannot reach its queue and this worker holds no replica; "
                                 "retry in about 1 s.")
        self.counters.served_locally += 1
        return FleetPlan.admitted(plan, None)

    async def _admit_to_queue(self, request: SpeechRequest, voice, inline: bool, key: str | None) -> FleetPlan:
        """Reserve (a longer text), plan, enqueue; falls back to this replica when Redis stops answering."""
        rid, reserved = None, False
        if inline:
            rid = uuid.uuid4().hex
        else:
            try:
                rid = await self.admission.reserve(key=key)
                reserved = True
            except Refused as e:
                raise self._refused(e) from None
            except QueueUnavailable as e:
                log.warning("fleet worker %s: %s", self.name, e)
        try:
            plan = self.local.plan(request, voice) if inline else await self.local.plan_off_loop(request, voice,
                                                                                                  inline=False)
        except BaseException:  # a 400, or the client left: the slot goes back at once
            if reserved:
                await self._drop_quietly(rid)
            raise
        cached = self._from_cache(plan)
        if cached is not None:
            if reserved:
                await self._drop_quietly(rid)
            return cached
        if rid is None:  # Redis went away at the reservation
            return self._served_here(plan)
        jobs = [ChunkJob(encode_job(c.ids, plan.voice_spec_of(c), plan.speed_of(c)), len(c.ids))
                for c in plan.chunks if c.ids]
        # This worker's replica waiting for work: the admission leases for it in the same call
        # (the earliest deadline first, as ever; usually this request's first chunk, which then
        # never crosses processes or waits for a wake-up).
        claimed = self.dispatcher.claim()
        try:
            if claimed:
                ticket = await self._admit_and_lease(jobs, plan.request.speed, rid, key)
            else:
                ticket = await self.admission.admit(jobs, plan.request.speed, rid, key=key)
        except Refused as e:  # a bound: admit.lua has given any reservation back
            raise self._refused(e) from None
        except QueueUnavailable as e:
            log.warning("fleet worker %s: %s", self.name, e)
            await self._drop_quietly(rid)
            return self._served_here(plan)
        except asyncio.CancelledError:  # client gone while the jobs were being enqueued
            if not claimed:  # (a claimed admission drops the request itself: _admit_and_lease)
                await self._drop_quietly(rid)
            raise
        except BaseException:
            await self._drop_quietly(rid)
            raise
        self.counters.admitted += 1
        fleet_plan = FleetPlan.admitted(plan, ticket)
        if claimed:
            fleet_plan.local_run = self.dispatcher.run_claimed(ticket.leased, ticket.request_id)
        await asyncio.shield(self.worker_queue.admitted(ticket.request_id, fleet_plan))
        return fleet_plan

    def _from_cache(self, plan: SpeechPlan) -> FleetPlan | None:
        """The plan, to be served here, when this worker's replica holds every chunk of it in its
        synthesis cache (a repeated prompt): then it answers at once, wherever the queue stands;
        nothing to compute, no place in the queue, no wait for a replica. Else None."""
        cache = getattr(self.replica, "cache", None)
        if cache is None or not any(c.ids for c in plan.chunks):
            return None
        if not all(cache.key(c.ids, self.voices.style(plan.voice_of(c), len(c.ids)), plan.speed_of(c)) in cache
                   for c in plan.chunks if c.ids):
            return None
        self.counters.from_cache += 1
        return FleetPlan.admitted(plan, None)

    async def _admit_and_lease(self, jobs: list[ChunkJob], speed: float, rid: str, key: str | None) -> Ticket:
        """`admit` with a lease for this worker's claimed replica. The call runs in a task of its
        own: if the client leaves meanwhile, whatever it leased (maybe another request's job) is
        still run and completed, and only then is this request dropped, so no lease is left to
        expire. The replica is given back when the call fails or leased nothing."""
        call = asyncio.ensure_future(self.admission.admit(jobs, speed, rid, self.dispatcher.lease_arguments(),
                                                          key=key))
        try:
            return await asyncio.shield(call)
        except asyncio.CancelledError:
            async def abandon() -> None:
                try:
                    ticket = await call
                except BaseException:
                    self.dispatcher.unclaim()
                    return
                self.dispatcher.run_claimed(ticket.leased, ticket.request_id)
                with contextlib.suppress(QueueUnavailable):
                    await self.admission.cancel(ticket.request_id)

            self.worker_queue.clean_up_later(abandon())
            raise
        except BaseException:
            self.dispatcher.unclaim()
            raise

    async def _drop_quietly(self, request_id: str) -> None:
        """Give back a request that never reached its stream, reserved or already enqueued;
        shielded, and left to the reaper when Redis cannot be reached."""
        async def drop() -> None:
            if not await self.admission.withdraw(request_id):  # enqueued after all: drop its jobs too
                await self.admission.cancel(request_id)

        with contextlib.suppress(QueueUnavailable):
            await asyncio.shield(drop())

    async def stream(self, plan: SpeechPlan) -> AsyncIterator[AudioPiece]:
        """The plan's pieces in order, from the shared queue's results (or this replica's), through
        the local service's one streaming loop."""
        if not isinstance(plan, FleetPlan) or plan.ticket is None:
            async with contextlib.aclosing(self.local.stream(plan)) as pieces:
                async for piece in pieces:
                    yield piece
            return
        await self.worker_queue.stream_started(plan.ticket.request_id)
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
            await self._end(plan, done, cancelled=not done)

    async def _end(self, plan: FleetPlan, finished: bool, cancelled: bool | None = None) -> None:
        """Free the request's slot: release when streamed whole, else cancel its queued jobs.
        Shielded, so a cancelled response (client gone) still frees it; a Redis that cannot be
        reached leaves it to the reaper (the owner's heartbeat stops covering it only when this
        worker dies) or to the Redis restart that already dropped it."""
        if not finished if cancelled is None else cancelled:
            self.counters.cancelled += 1
        call = self.admission.release if finished else self.admission.cancel
        with contextlib.suppress(QueueUnavailable):
            await asyncio.shield(call(plan.ticket.request_id))

    # --- background -----------------------------------------------------------------------------
    async def _housekeeping(self) -> None:
        """Re-read the fleet's figures for /metrics, note degraded/recovered, and cancel tickets
        whose response never started. The first read comes at once, so /metrics and `status`
        show the replica table from a worker's first second, not one refresh later."""
        delay = 0.0
        while True:
            await asyncio.sleep(delay)
            delay = STATS_REFRESH_S
            self.worker_queue.note_mode()
            now = time.monotonic()
            for plan in await self.worker_queue.unstarted_since(UNCLAIMED_TICKET_S):
                log.warning("request %s was admitted but its response never started: cancelling it",
                            plan.ticket.request_id)
                await self._end(plan, finished=False)
            try:
                stats = await read_stats(self._stats_client, self.prefix)
                replicas = await read_replicas(self._stats_client, self.prefix)
            except QueueUnavailable:
                continue
            except Exception:  # figures are best effort; never let them stop the housekeeping
                log.exception("reading the fleet's figures failed")
                continue
            finally:
                stop_if_cancelled("reading the fleet's figures")
            previous = {r.replica: r for r in self.snapshot.replicas}
            elapsed = now - self.snapshot.read_at if self.snapshot.read_at else 0.0
            busy = {}
            for r in replicas:
                before = previous.get(r.replica)
                if before is not None and elapsed > 0:
                    busy[r.replica] = min(1.0, max(0.0, (r.busy_so_far - before.busy_so_far) / elapsed))
            self.snapshot = FleetSnapshot(stats, replicas, busy, now)
            self._follow_live_replicas(stats.live_replicas)

    def _follow_live_replicas(self, live_replicas: int) -> None:
        """Derive the admission bounds from the replicas Redis sees alive, not only this fleet's own.
        Several fleets on one Redis (two Modal containers, say) share one queue and one `admitted`
        counter; each fleet's bound from its own replica count alone would cap the whole fleet at one
        container's size, and the other containers' replicas would idle behind 503s. Never below
        this fleet's own count (its replicas register only when they first lease), and settings that
        fix a bound still win."""
        if self.dispatch != "shared":
            return
        replicas = max(self.replicas, live_replicas)
        stats = self.snapshot.stats
        rate = stats.rate if stats else None
        learnt_ms = stats.fields.get("ms_per_phoneme") if stats else None  # audio per phoneme, measured
        bounds = AdmissionBounds.from_settings(self.settings, replicas, rate,
                                               learnt_ms / 1000 if learnt_ms else SECONDS_PER_PHONEME)
        if bounds != self.admission.bounds:
            # the measured rate moves a little with every refresh: only a new replica count is news
            level = logging.INFO if replicas != self._bounds_replicas else logging.DEBUG
            log.log(level, "fleet worker %s: %d live replicas on the queue at %s audio-s/s each: admission "
                    "bounds %s", self.name, replicas, f"{rate:.1f}" if rate else "an unmeasured rate", bounds)
            self._bounds_replicas = replicas
            self.bounds = self.admission.bounds = bounds

    # --- /metrics -------------------------------------------------------------------------------
    def register_metrics(self, m: Metrics) -> None:
        c = self.counters
        started = self._started
        m.gauge("kokoro_fleet_degraded", "1 while this worker cannot reach Redis and serves its own requests locally.",
                lambda: float(self.degraded))
        m.counter("kokoro_fleet_degraded_seconds_total", "Seconds this worker spent degraded (Redis unreachable).",
                  self.worker_queue.seconds_degraded)
        m.counter("kokoro_fleet_worker_admitted_total", "Requests this worker admitted into the shared queue.",
                  lambda: c.admitted)
        m.counter("kokoro_fleet_worker_refused_total", "Requests this worker refused (503) because the fleet was full.",
                  lambda: c.refused)
        m.counter("kokoro_fleet_worker_served_locally_total",
                  "Requests this worker served on its own replica because Redis was unreachable.", lambda: c.served_locally)
        m.counter("kokoro_fleet_worker_from_cache_total",
                  "Requests whose every chunk this worker's replica had in its synthesis cache: answered at once, "
                  "without the shared queue.", lambda: c.from_cache)
        m.counter("kokoro_fleet_worker_finished_locally_total",
                  "Streams whose remaining chunks ran on this worker's replica after Redis went away.",
                  lambda: c.finished_locally)
        m.counter("kokoro_fleet_worker_cancelled_total", "Requests whose queued jobs were cancelled (client gone).",
                  lambda: c.cancelled)
        m.counter("kokoro_fleet_worker_failed_total", "Requests the queue ended with an error.", lambda: c.failed)
        m.gauge("kokoro_fleet_replica_busy_fraction_lifetime",
                "Fraction of this worker's lifetime its replica spent running inferences.",
                lambda: self.stats().busy_seconds / max(1e-9, time.monotonic() - started))
        m.counter("kokoro_fleet_lease_losses_total", "This replica's results refused because its lease had expired.",
                  lambda: self.dispatcher.lease_losses)
        m.counter("kokoro_fleet_batch_fallbacks_total",
                  "Batches whose forward pass failed on this replica and ran again one job at a time.",
                  lambda: self.dispatcher.batch_fallbacks)

        def stat(name: str):
            def read() -> float:
                s = self.snapshot.stats
                if s is None:
                    raise LookupError("no fleet figures yet")
                return s[name]
            return read

        for field_name, kind, help_text in (
            ("admitted", "gauge", "Requests admitted in the whole fleet (queued or streaming)."),
            ("queued_jobs", "gauge", "Chunk jobs waiting in the shared queue."),
            ("inflight_jobs", "gauge", "Chunk jobs leased by a replica."),
            ("admitted_total", "counter", "Admission decisions: requests admitted, fleet-wide."),
            ("refused_total", "counter",
             "Admission decisions: requests refused, fleet-wide (503, and 429 for a key at its share)."),
            ("key_refused_total", "counter",
             "Requests refused with 429 because their API key held its share (KOKORO_KEY_MAX_SHARE) of the requests "
             "or of the queued audio, fleet-wide."),
            ("leased_total", "counter", "Chunk jobs leased by replicas, fleet-wide (a batch counts each of its jobs)."),
            ("lease_batches_total", "counter",
             "Leases that took at least one job, fleet-wide: leased_total / lease_batches_total is the mean batch."),
            ("expired_total", "counter", "Leases that expired (their replica stopped responding)."),
            ("requeued_total", "counter", "Jobs put back in the queue after a lease expired."),
            ("failed_total", "counter", "Requests the queue failed (a chunk lost twice, or a synthesis error)."),
            ("completed_total", "counter", "Chunk results delivered, fleet-wide."),
            ("cancelled_total", "counter", "Requests cancelled by their owner (client gone)."),
            ("orphaned_total", "counter", "Requests freed by the reaper because their owner worker died."),
            ("local_total", "counter", "Chunk results handed over in memory: the owner's own replica ran them."),
            ("result_bytes_total", "counter", "Bytes of PCM that crossed Redis (results another worker's replica made)."),
        ):
            (m.gauge if kind == "gauge" else m.counter)(f"kokoro_fleet_{field_name}", help_text, stat(field_name),
                                                        fleet_wide=True)
        m.gauge("kokoro_fleet_queued_work_seconds", "Estimated audio seconds of the jobs waiting in the shared queue.",
                lambda: stat("queued_work_ms")() / 1000, fleet_wide=True)
        m.gauge("kokoro_fleet_live_replicas", "Replicas whose liveness Redis saw within its TTL.",
                lambda: self.snapshot.stats.live_replicas if self.snapshot.stats else _missing(), fleet_wide=True)
        m.gauge("kokoro_fleet_replica_rate", "Measured audio seconds per busy second of one replica (EWMA).",
                lambda: self.snapshot.stats.rate if self.snapshot.stats and self.snapshot.stats.rate else _missing(),
                fleet_wide=True)
        m.include(self.wait_histogram, self.dispatcher.batch_sizes)
        # A row per replica of the fleet, as this worker last read them from Redis.
        for name, kind, help_text, figure in (
            ("kokoro_fleet_replica_busy", "gauge", "1 while the replica runs a job.", lambda r: float(r.busy)),
            ("kokoro_fleet_replica_busy_fraction", "gauge",
             f"Fraction of the last ~{STATS_REFRESH_S:g} s the replica spent running jobs.",
             lambda r: self.snapshot.busy_fraction.get(r.replica)),
            ("kokoro_fleet_replica_jobs_total", "counter", "Chunk jobs the replica completed.", lambda r: r.jobs_done),
            ("kokoro_fleet_replica_busy_seconds_total", "counter", "Seconds the replica spent running jobs.",
             lambda r: r.busy_seconds),
            ("kokoro_fleet_replica_audio_seconds_total", "counter", "Audio seconds the replica synthesized.",
             lambda r: r.audio_seconds),
            ("kokoro_fleet_replica_alive", "gauge", "1 while the replica's liveness is fresh.", lambda r: float(r.alive)),
        ):
            (m.gauge if kind == "gauge" else m.counter)(name, help_text, self._per_replica(figure), fleet_wide=True,
                                                        labels=("replica",))
        m.gauge("kokoro_fleet_replica_info", "The engine each replica runs: torch <device> <precision>, or sim "
                "(SIMULATED: no model).", lambda: {(r.replica, r.engine): 1.0 for r in self.snapshot.replicas if r.engine},
                fleet_wide=True, labels=("replica", "engine"))

    def _per_replica(self, figure) -> Callable[[], dict[tuple[str, ...], float]]:
        def read() -> dict[tuple[str, ...], float]:
            values = {(r.replica,): figure(r) for r in self.snapshot.replicas}
            return {key: value for key, value in values.items() if value is not None}
        return read


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
                self.fleet.counters.finished_locally += 1
                self.fleet.worker_queue.note_mode()
            except RequestFailed:
                self.fleet.counters.failed += 1
                self.failed = True
                raise
        return await self.fleet.local.synthesize_chunk(plan, index, chunk)


def _missing() -> float:
    raise LookupError("no fleet figures yet")


def _redacted(url: str) -> str:
    """A Redis URL fit for a log line (no password)."""
    scheme, sep, rest = url.partition("://")
    if "@" in rest:
        rest = "***@" + rest.split("@", 1)[1]
    return scheme + sep + rest
