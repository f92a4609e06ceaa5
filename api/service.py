"""The speech-service contract: everything the HTTP layer needs from what makes the audio.

Two services implement it: `worker.speech.SpeechService` (this process's one replica; also the
baseline's) and `api.fleet.service.FleetSpeechService` (the fleet's shared queue, with the local
service as its fallback). The HTTP layer holds a `SpeechBackend` and calls only these methods:

    plan = await backend.admit(request)   # CapacityError (503) when full; TextError, VoiceError (400)
    async for piece in backend.stream(plan): ...   # AudioPiece by AudioPiece, in order

`admit` decides on capacity first and plans after (text and voice checks, normalization, G2P,
chunking: milliseconds of CPU, run off the event loop), so a full service refuses a request
without planning it, and a burst's 503s never wait behind other requests' text. It returns the plan
to stream: a `SpeechPlan`, or one that also carries the service's admission (`FleetPlan`, with its
ticket in the shared queue). `plan(request)` is the same planning, synchronous, for callers
without a server (`say`, tests). `build_service` picks and builds the service a worker process
serves with.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from typing import Any, Protocol

from api.metrics import Metrics
from worker.settings import Settings, SettingsError
from worker.speech import AudioPiece, ReplicaStats, SpeechPlan, SpeechRequest, SpeechService
from worker.voices import VoiceBank

log = logging.getLogger("kokoro_fleet.api")


class SpeechBackend(Protocol):
    voices: VoiceBank

    def plan(self, request: SpeechRequest) -> SpeechPlan:
        """Validate and prepare; raises TextError or VoiceError (a ValueError with `param`)."""

    async def admit(self, request: SpeechRequest, key: str | None = None) -> SpeechPlan:
        """Reserve what the service needs (or raise CapacityError; KeyShareError when `key`, the
        API key's name, holds its share), then plan the request off the event loop (TextError or
        VoiceError, after giving the reservation back)."""

    def stream(self, plan: SpeechPlan) -> AsyncIterator[AudioPiece]:
        """The admitted plan's pieces in order; closing the iterator early frees what it held."""

    def health(self) -> dict[str, Any]:
        """The service's part of /health (the fleet: mode and dispatch)."""

    def stats(self) -> ReplicaStats:
        """This process's replica's figures, for /metrics and Retry-After."""

    async def aclose(self) -> None:
        """Stop background work (the fleet: dispatcher, heartbeats, Redis clients)."""


async def build_service(settings: Settings, metrics: Metrics | None = None) -> SpeechBackend:
    """The speech service this worker serves with, built and warmed up: baseline, fleet or local."""
    from api.fleet.service import FleetSpeechService
    from worker.speech import resolve_device
    from worker.weights import load_weights

    def build() -> SpeechService:
        if settings.engine == "sim":  # only ever by KOKORO_ENGINE=sim: no model, no weights
            from worker.sim_engine import SimCost, SimReplica, sim_voices
            from worker.weights import VOICE_NAMES

            if settings.baseline:
                raise SettingsError("KOKORO_ENGINE=sim does not simulate the baseline (four chunks at once on "
                                    "one model); serve the baseline with KOKORO_ENGINE=torch")
            replica = SimReplica(SimCost.from_settings(settings), seed=settings.seed)
            return SpeechService(replica, VoiceBank(sim_voices(VOICE_NAMES), settings.voices_dir), settings)
        # imported here, not above: the engine imports the model and transformers (seconds of a
        # worker's start-up), which an HTTP front (KOKORO_REPLICAS) never uses
        from worker.engine import Engine
        from worker.replica import BaselineReplica, Replica

        weights = load_weights(settings)
        engine = Engine(weights, device=resolve_device(settings.device), dtype=settings.dtype, seed=settings.seed,
                        cuda_graphs=settings.cuda_graphs and not settings.baseline)
        replica = (BaselineReplica(engine) if settings.baseline else
                   Replica(engine, settings.inference_nice, cache_bytes=settings.synthesis_cache_mib << 20))
        return SpeechService(replica, VoiceBank(weights.voices, settings.voices_dir), settings)

    def build_front() -> SpeechService:
        """A worker without a replica (KOKORO_REPLICAS): the voices and the text frontend, no engine."""
        from api.fleet.replica import NoReplica

        if settings.engine == "sim":
            from worker.sim_engine import sim_voices
            from worker.weights import VOICE_NAMES

            return SpeechService(NoReplica(), VoiceBank(sim_voices(VOICE_NAMES), settings.voices_dir), settings)
        return SpeechService(NoReplica(), VoiceBank(load_weights(settings).voices, settings.voices_dir), settings)

    # Each stage's time in the log: a fleet's start-up is minutes on a GPU box, and where they go
    # (weights and engine, graph capture, the text readers) decides what to make faster.
    started = time.perf_counter()
    holds_replica = _holds_replica(settings)
    local = await asyncio.to_thread(build if holds_replica else build_front)
    built = time.perf_counter()
    await local.warmup()  # the replica (CUDA graphs on a GPU), and the text frontend's lexicons
    log.info("start-up: weights and engine %.1f s, warm-up %.1f s (replica and text readers)",
             built - started, time.perf_counter() - built)
    if settings.baseline or not settings.queue_url:
        return local
    fleet = FleetSpeechService(local, settings.queue_url, settings,
                               replicas=max(1, settings.replicas or settings.workers), dispatch=settings.dispatch)
    if metrics is not None:
        fleet.register_metrics(metrics)
    return await fleet.start()


def _holds_replica(settings: Settings) -> bool:
    """Whether this worker builds a replica: every worker does unless KOKORO_REPLICAS is below the
    workers; then the first that many to start (a slot each, api.serve_cli.claim_replica_slot)."""
    if not settings.replicas or settings.replicas >= settings.workers or not settings.queue_url:
        return True
    from pathlib import Path

    from api.serve_cli import REPLICA_SLOTS_DIR, claim_replica_slot

    if not settings.metrics_dir:  # only `serve` runs several workers, and it always gives them one
        return True
    slot = claim_replica_slot(Path(settings.metrics_dir) / REPLICA_SLOTS_DIR, settings.replicas)
    log.info("replica slot %s of %d", "none: an HTTP front only" if slot is None else slot, settings.replicas)
    return slot is not None
