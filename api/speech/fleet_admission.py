"""A request's way into the fleet, on the worker that holds its connection.

`FleetAdmission.admit(request)` reserves a slot in the shared, deadline-ordered queue (or refuses:
`Overloaded`, a 503 with Retry-After), plans the text off the event loop, turns the plan's chunks
into jobs and enqueues them, and returns a `FleetPlan` carrying the ticket; `end(plan)` releases the
slot when the stream is done, or cancels the request's queued jobs when it is not. A plan whose every
chunk is in this worker's synthesis cache, and every plan admitted while Redis cannot be reached
(the worker queue owner is degraded), is served on this worker's own replica without a ticket.

When this worker's replica is waiting for work as a request is admitted, the admission claims it and
leases for it in the same Redis call, and the replica runs the job in this process at once: a
one-chunk request then costs two Redis round trips (admit-and-lease, complete-and-release) instead of
about eight.

What this flow shares with the lease side (the replica's claim, the requests not streaming yet,
degraded mode) and the counters /metrics reads are held by the worker's `WorkerQueueOwner`
(api/speech/worker_queue.py); this flow reports to it and reads from it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
import uuid
from dataclasses import dataclass

from api.settings import Settings
from api.speech.admission_client import (AdmissionBounds, AdmissionClient, ChunkJob, QueueUnavailable, Refused,
                                         Ticket)
from api.speech.contract import KeyShareFull, Overloaded, SpeechPlan, SpeechRequest, VoicedRequest
from api.speech.dispatcher import Dispatcher, NoReplica
from api.speech.local import SpeechService
from api.speech.redis_link import QueueStats, encode_job
from api.speech.worker_queue import WorkerQueueOwner
from worker.audio import SECONDS_PER_PHONEME
from worker.voices import Voice

log = logging.getLogger("kokoro_fleet.fleet")

# A ticket admitted for a request whose response never started streaming (the client left between
# the headers and the first read) is cancelled after this long, so its slot cannot leak.
UNCLAIMED_TICKET_S = 30.0
# How long a refusal makes this worker reserve short texts' slots before planning them.
REFUSAL_MEMORY_S = 1.0


@dataclass
class FleetPlan(SpeechPlan):
    """An admitted plan plus where it runs: `ticket` in the shared queue, or None (this worker's
    own replica: Redis was unreachable when it was admitted, or its audio was all in the cache)."""

    ticket: Ticket | None = None
    # This worker's replica running the jobs the admission leased for it (`ticket.leased`).
    local_run: asyncio.Task | None = None

    @classmethod
    def admitted(cls, plan: SpeechPlan, ticket: Ticket | None) -> "FleetPlan":
        return cls(plan.request, plan.voice, plan.lang_code, plan.chunks, plan.voices, ticket=ticket)


class FleetAdmission:
    """Admits this worker's requests into the shared queue and frees their slots afterwards."""

    def __init__(self, local: SpeechService, admission: AdmissionClient, dispatcher: Dispatcher,
                 worker_queue: WorkerQueueOwner, settings: Settings, *, replicas: int, follows_fleet: bool):
        self.local = local
        self.admission = admission
        self.dispatcher = dispatcher
        self.worker_queue = worker_queue
        self.settings = settings
        self.name = admission.worker_id
        self.replicas = replicas  # this fleet's own replicas
        self.follows_fleet = follows_fleet  # bounds follow every replica alive on the queue (shared dispatch)
        self._bounds_replicas = replicas  # the replica count the bounds were last derived from
        self._live_replicas = 0  # alive on the queue, as last read from Redis
        # When a short text may skip the reservation (see `_plans_inline`): while fewer of this
        # worker's requests are being admitted than its share of the fleet's request bound, and no
        # refusal came back in the last REFUSAL_MEMORY_S.
        self._admitting = 0
        self._refused_at = -math.inf

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
            voiced = self.local.voiced(request)  # its voice resolved once for this request
            inline = self._plans_inline(request, voiced)
            if self.worker_queue.degraded:  # this replica serves this worker's requests
                plan = await self.local.plan_off_loop(request, voiced, inline)
                return self._from_cache(plan) or self._served_here(plan)
            return await self._admit_to_queue(request, voiced, inline, key)
        finally:
            self._admitting -= 1

    async def end(self, plan: FleetPlan, finished: bool, cancelled: bool | None = None) -> None:
        """Free the request's slot: release when streamed whole, else cancel its queued jobs.
        Shielded, so a cancelled response (client gone) still frees it; a Redis that cannot be
        reached leaves it to the reaper (the owner's heartbeat stops covering it only when this
        worker dies) or to the Redis restart that already dropped it."""
        if not finished if cancelled is None else cancelled:
            self.worker_queue.request_cancelled()
        call = self.admission.release if finished else self.admission.cancel
        with contextlib.suppress(QueueUnavailable):
            await asyncio.shield(call(plan.ticket.request_id))

    async def cancel_unstarted(self, older_than_s: float | None = UNCLAIMED_TICKET_S) -> None:
        """Cancel the admitted requests whose response has not started streaming for `older_than_s`
        (None: all of them, at shutdown)."""
        for plan in self.worker_queue.take_unstarted(older_than_s):
            if older_than_s is not None:
                log.warning("request %s was admitted but its response never started: cancelling it",
                            plan.ticket.request_id)
            await self.end(plan, finished=False)

    def follow_live_replicas(self, stats: QueueStats) -> None:
        """Derive the admission bounds from the replicas Redis sees alive, not only this fleet's own.
        Several fleets on one Redis (two Modal containers, say) share one queue and one `admitted`
        counter; each fleet's bound from its own replica count alone would cap the whole fleet at one
        container's size, and the other containers' replicas would idle behind 503s. Never below
        this fleet's own count (its replicas register only when they first lease), and settings that
        fix a bound still win."""
        self._live_replicas = stats.live_replicas
        if not self.follows_fleet:
            return
        replicas = max(self.replicas, stats.live_replicas)
        learnt_ms = stats.fields.get("ms_per_phoneme")  # audio per phoneme, measured
        bounds = AdmissionBounds.from_settings(self.settings, replicas, stats.rate,
                                               learnt_ms / 1000 if learnt_ms else SECONDS_PER_PHONEME)
        if bounds != self.admission.bounds:
            # the measured rate moves a little with every refresh: only a new replica count is news
            level = logging.INFO if replicas != self._bounds_replicas else logging.DEBUG
            log.log(level, "fleet worker %s: %d live replicas on the queue at %s audio-s/s each: admission "
                    "bounds %s", self.name, replicas, f"{stats.rate:.1f}" if stats.rate else "an unmeasured rate",
                    bounds)
            self._bounds_replicas = replicas
            self.admission.bounds = bounds

    # --- the admission's steps --------------------------------------------------------------------
    def _plans_inline(self, request: SpeechRequest, voiced: VoicedRequest) -> bool:
        """Whether to plan a short text before its one admission call. In a burst beyond the
        fleet's bound, planning every text before learning it is refused would put each refusal
        behind all the planning before it on this loop: once this worker is admitting more than its
        share of the bound at once, or the fleet refused lately, texts are reserved first."""
        return (self.local.plans_inline(request, voiced) and self._admitting <= self._share_of_bound()
                and time.monotonic() - self._refused_at > REFUSAL_MEMORY_S)

    def _share_of_bound(self) -> float:
        """This worker's share of the fleet's request bound (a replica per worker, all fleets on the queue)."""
        bound = self.admission.bounds.max_requests
        return math.ceil(bound / max(1, self.replicas, self._live_replicas)) if bound > 0 else math.inf

    def _refused(self, e: Refused) -> Overloaded:
        if e.reason in ("key", "key_work"):  # one key's share is full, not the fleet: no crowding to remember
            return KeyShareFull(e.retry_after_ms / 1000, str(e))
        self.worker_queue.refused()
        self._refused_at = time.monotonic()
        return Overloaded(e.retry_after_ms / 1000, str(e))

    def _served_here(self, plan: SpeechPlan) -> FleetPlan:
        """A plan this worker's replica serves because Redis cannot be reached."""
        if isinstance(self.local.replica, NoReplica):  # an HTTP front only: nothing to serve it on here
            raise Overloaded(1.0, "The server cannot reach its queue and this worker holds no replica; "
                                 "retry in about 1 s.")
        self.worker_queue.served_here(from_cache=False)
        return FleetPlan.admitted(plan, None)

    async def _admit_to_queue(self, request: SpeechRequest, voiced: VoicedRequest, inline: bool,
                              key: str | None) -> FleetPlan:
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
            plan = self.local.plan(request, voiced) if inline else await self.local.plan_off_loop(request, voiced,
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
        jobs = [chunk_job(c.ids, plan.voice_of(c), plan.speed_of(c)) for c in plan.chunks if c.ids]
        # This worker's replica waiting for work: the admission leases for it in the same call
        # (the earliest deadline first, as ever; usually this request's first chunk, which then
        # never crosses processes or waits for a wake-up).
        claimed = self.dispatcher.claim()
        try:
            if claimed:
                ticket = await self._admit_and_lease(jobs, rid, key)
            else:
                ticket = await self.admission.admit(jobs, rid, key=key)
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
        fleet_plan = FleetPlan.admitted(plan, ticket)
        if claimed:
            fleet_plan.local_run = self.dispatcher.run_claimed(ticket.leased, ticket.request_id)
        self.worker_queue.admitted(ticket.request_id, fleet_plan)
        return fleet_plan

    def _from_cache(self, plan: SpeechPlan) -> FleetPlan | None:
        """The plan, to be served here, when this worker's replica holds every chunk of it in its
        synthesis cache (a repeated prompt): then it answers at once, wherever the queue stands;
        nothing to compute, no place in the queue, no wait for a replica. Else None."""
        cache = getattr(self.local.replica, "cache", None)
        if cache is None or not any(c.ids for c in plan.chunks):
            return None
        voices = self.local.voices
        if not all(cache.key(c.ids, voices.style(plan.voice_of(c), len(c.ids)), plan.speed_of(c)) in cache
                   for c in plan.chunks if c.ids):
            return None
        self.worker_queue.served_here(from_cache=True)
        return FleetPlan.admitted(plan, None)

    async def _admit_and_lease(self, jobs: list[ChunkJob], rid: str, key: str | None) -> Ticket:
        """`admit` with a lease for this worker's claimed replica. The call runs in a task of its
        own: if the client leaves meanwhile, whatever it leased (maybe another request's job) is
        still run and completed, and only then is this request dropped, so no lease is left to
        expire. The replica is given back when the call fails or leased nothing."""
        call = asyncio.ensure_future(self.admission.admit(jobs, rid, self.dispatcher.lease_arguments(), key=key))
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


def chunk_job(ids, voice: Voice, speed: float) -> ChunkJob:
    """A chunk's job: its ids, its voice in the one form that travels (the canonical spec, which the
    replica's VoiceBank turns into the very same pack) and its speed, decided once by the plan and
    used both by the queue's audio estimate and by the replica."""
    return ChunkJob(encode_job(ids, voice.canonical, speed), len(ids), speed)
