"""The speech-service contract: everything the HTTP layer needs from what makes the audio.

Two services implement it: `worker.speech.SpeechService` (this process's one replica; also the
baseline's) and `api.fleet.service.FleetSpeechService` (the fleet's shared queue, with the local
service as its fallback). The HTTP layer holds a `SpeechBackend` and calls only these methods:

    plan = backend.plan(request)          # validation that can still answer 400 (TextError, VoiceError)
    plan = await backend.admit(plan)      # the service's own bound: CapacityError (503) when full
    async for piece in backend.stream(plan): ...   # AudioPiece by AudioPiece, in order

`admit` returns the plan to stream: the same plan, or one that also carries the service's
admission (`FleetPlan`, a `SpeechPlan` with its ticket in the shared queue). `build_service`
picks and builds the service a worker process serves with.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any, Protocol

from api.metrics import Metrics
from worker.settings import Settings, SettingsError
from worker.speech import AudioPiece, ReplicaStats, SpeechPlan, SpeechRequest, SpeechService
from worker.voices import VoiceBank


class SpeechBackend(Protocol):
    voices: VoiceBank

    def plan(self, request: SpeechRequest) -> SpeechPlan:
        """Validate and prepare; raises TextError or VoiceError (a ValueError with `param`)."""

    async def admit(self, plan: SpeechPlan) -> SpeechPlan:
        """Reserve what the service needs to run the plan, or raise CapacityError."""

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
    from worker.engine import Engine
    from worker.replica import BaselineReplica, Replica
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
            return SpeechService(replica, VoiceBank(sim_voices(VOICE_NAMES)), settings)
        weights = load_weights(settings)
        engine = Engine(weights, device=resolve_device(settings.device), dtype=settings.dtype, seed=settings.seed,
                        cuda_graphs=settings.cuda_graphs and not settings.baseline)
        replica = BaselineReplica(engine) if settings.baseline else Replica(engine, settings.inference_nice)
        return SpeechService(replica, VoiceBank(weights.voices), settings)

    local = await asyncio.to_thread(build)
    await local.warmup()  # the replica, and the text frontend's lexicons
    if settings.baseline or not settings.queue_url:
        return local
    fleet = FleetSpeechService(local, settings.queue_url, settings, replicas=max(1, settings.workers),
                               dispatch=settings.dispatch)
    if metrics is not None:
        fleet.register_metrics(metrics)
    return await fleet.start()
