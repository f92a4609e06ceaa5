"""The one builder of the speech service a worker process serves with: baseline, fleet or local."""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING

from api.metrics import Metrics
from api.speech.contract import SpeechBackend
from api.speech.local import SpeechService
from api.settings import Settings, SettingsError
from worker.voices import VoiceBank

if TYPE_CHECKING:
    from worker.engine import EngineConfig
    from worker.sim_engine import SimCost

log = logging.getLogger("kokoro_fleet.api")


def sim_cost(settings: Settings) -> "SimCost":
    """The simulated engine's cost per chunk, KOKORO_SIM_CHUNK_MS + KOKORO_SIM_PHONEME_MS x phonemes."""
    from worker.sim_engine import SimCost

    return SimCost(settings.sim_chunk_ms, settings.sim_phoneme_ms)


def build_local_service(settings: Settings) -> SpeechService:
    """This process's replica and its local service: the weights, the engine and the replica the
    settings name (the model's, the baseline's, or the simulated one), not warmed up yet."""
    from api.settings import weights_source
    from worker.replica import BaselineReplica, Replica
    from worker.text.mandarin import use_segmenter_cache
    from worker.weights import load_weights

    use_segmenter_cache(settings.cache_dir)
    if settings.engine == "sim":  # only ever by KOKORO_ENGINE=sim: no model, no weights
        from worker.sim_engine import SimReplica, sim_voices
        from worker.weights import VOICE_NAMES

        if settings.baseline:
            raise SettingsError("KOKORO_ENGINE=sim does not simulate the baseline (four chunks at once on "
                                "one model); serve the baseline with KOKORO_ENGINE=torch")
        replica = SimReplica(sim_cost(settings), seed=settings.seed)
        return SpeechService(replica, VoiceBank(sim_voices(VOICE_NAMES), settings.voices_dir), settings)
    weights = load_weights(weights_source(settings))
    engine = build_engine(weights, settings)
    replica = (BaselineReplica(engine) if settings.baseline else
               Replica(engine, settings.inference_nice, cache_bytes=settings.synthesis_cache_mib << 20))
    return SpeechService(replica, VoiceBank(weights.voices, settings.voices_dir), settings)


def build_engine(weights, settings: Settings):
    """The engine a replica serves with, on the host's compile cache."""
    from worker.engine import Engine

    return Engine(weights, engine_config_from_settings(settings))


def engine_config_from_settings(settings: Settings) -> "EngineConfig":
    """How the settings run an engine: their device, precision, CUDA graphs and compiled passes
    (the baseline runs neither graphs nor compiled passes), on the host's compile cache."""
    from worker.compile_cache import default_compile_cache_dir
    from worker.engine import EngineConfig, resolve_device

    device = resolve_device(settings.device)
    cache = settings.compile_cache_dir or default_compile_cache_dir(device, settings.cache_dir)
    return EngineConfig(device=str(device), dtype=settings.dtype, seed=settings.seed,
                        cuda_graphs=settings.cuda_graphs and not settings.baseline,
                        compiled=None if settings.compile and not settings.baseline else False,
                        stage2=settings.stage2_arithmetic, max_batch=settings.batch_max,
                        batch_graph_frames=settings.batch_graph_frames, compile_cache_dir=cache)


def build_front_service(settings: Settings) -> SpeechService:
    """A worker without a replica (KOKORO_REPLICAS): the voices and the text frontend, no engine."""
    from api.speech.dispatcher import NoReplica
    from worker.text.mandarin import use_segmenter_cache

    use_segmenter_cache(settings.cache_dir)
    if settings.engine == "sim":
        from worker.sim_engine import sim_voices
        from worker.weights import VOICE_NAMES

        return SpeechService(NoReplica(), VoiceBank(sim_voices(VOICE_NAMES), settings.voices_dir), settings)
    from api.settings import weights_source
    from worker.weights import load_weights

    voices = load_weights(weights_source(settings)).voices
    return SpeechService(NoReplica(), VoiceBank(voices, settings.voices_dir), settings)


async def build_service(settings: Settings, metrics: Metrics | None = None) -> SpeechBackend:
    """The speech service this worker serves with, built and warmed up: baseline, fleet or local."""
    from api.speech.fleet import FleetSpeechService

    # Each stage's time in the log: a fleet's start-up is minutes on a GPU box, and where they go
    # (weights and engine, graph capture, the text readers) decides what to make faster.
    started = time.perf_counter()
    build = build_local_service if _holds_replica(settings) else build_front_service
    local = await asyncio.to_thread(build, settings)
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
    workers; then the first that many to start (a slot each, api.speech.replica_slots)."""
    if not settings.replicas or settings.replicas >= settings.workers or not settings.queue_url:
        return True
    if not settings.metrics_dir:  # only `serve` runs several workers, and it always gives them one
        return True
    from api.speech.replica_slots import REPLICA_SLOTS_DIR, claim_replica_slot

    slot = claim_replica_slot(Path(settings.metrics_dir) / REPLICA_SLOTS_DIR, settings.replicas)
    log.info("replica slot %s of %d", "none: an HTTP front only" if slot is None else slot, settings.replicas)
    return slot is not None
