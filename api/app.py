"""The HTTP server: OpenAI's audio API in front of a speech service.

The app is assembled here from the routers of api/routes (one per endpoint family). Routes only
route: each reads what it needs from the process's `AppState` (api.state) and hands speech
requests to the serving code (api.serving), which talks to the speech service through its
contract (api.speech.contract) and streams the encoded bytes through the transport pieces (api.transport).

    create_app(settings, service=None)   # service None: weights load in the background at start-up
    app_factory()                        # what `uvicorn --factory api.app:app_factory` calls
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import time
from collections.abc import Callable

from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware

from api.admission import ProcessAdmission
from api.downloads import DownloadStore, SharedDownloads, default_directory
from api.errors import install_error_handlers
from api.keyed_paths import KeyedPaths
from api.metrics import REFRESH_S, Metrics
from api.playground import FLEET_PATH, playground_router
from api.protocol import ErrorResponse
from api.routes.caption_routes import caption_router
from api.routes.live_route import live_router
from api.routes.model_routes import model_router
from api.routes.request_bodies import document_request_bodies
from api.routes.speech_routes import speech_router
from api.routes.status_routes import status_router
from api.routes.voice_routes import voice_router
from api.routes.voice_fit_routes import voice_fit_router
from api.speech.contract import ReplicaStats, SpeechBackend
from api.state import AppState, encode_pool, parse_api_keys
from api.swagger import docs_router
from api.transport import AccessLogMiddleware
from api.settings import Settings, get_settings

log = logging.getLogger("kokoro_fleet.api")


def app_factory() -> FastAPI:
    """Uvicorn's factory entry (`--factory`): settings from the environment, weights loaded at start-up."""
    if not logging.getLogger().handlers:  # a spawned worker process: give our log lines somewhere to go
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return create_app(get_settings())


def create_app(settings: Settings | None = None, service: SpeechBackend | None = None) -> FastAPI:
    settings = settings or get_settings()
    state = _app_state(settings, service)
    app = FastAPI(
        title="kokoro-fleet", version="0.1.0", lifespan=_lifespan, docs_url=None, redoc_url=None,  # api.swagger: no CDN
        description="Kokoro-82M text to speech behind OpenAI's audio API.",
        responses={400: {"model": ErrorResponse}, 429: {"model": ErrorResponse}, 503: {"model": ErrorResponse}},
    )
    app.state.kokoro = state
    install_error_handlers(app)
    _register_metrics(state)
    app.add_middleware(AccessLogMiddleware, metrics=state.metrics,
                       quiet_paths=("/health", "/ready", "/metrics", FLEET_PATH), engine=settings.engine)
    app.add_middleware(KeyedPaths, state=state)  # /metrics and the API reference need the key too
    _allow_origins(app, settings.cors_origins)
    for router in (speech_router, caption_router, live_router, voice_router, voice_fit_router, model_router, status_router,
                   docs_router(app.openapi_url, app.title)):
        app.include_router(router)
    if settings.playground:
        app.include_router(playground_router(state))
    document_request_bodies(app)
    return app


def _app_state(settings: Settings, service: SpeechBackend | None) -> AppState:
    return AppState(
        settings=settings,
        service=service,
        admission=ProcessAdmission(settings.max_requests, key_max_share=settings.key_max_share),
        encoders=encode_pool(settings.workers),  # the launcher sets KOKORO_WORKERS for every worker
        api_keys=parse_api_keys(settings.api_keys),
        metrics=Metrics(settings.metrics_dir or None),
        ready=service is not None,  # a service handed in is built and warmed by its owner
        downloads=DownloadStore(settings.download_dir or default_directory(), settings.download_max_age_seconds,
                                settings.download_max_mib << 20, shared=SharedDownloads.for_fleet(
                                    "" if settings.baseline else settings.queue_url,
                                    settings.download_shared_max_mib << 20, settings.download_max_age_seconds)),
    )


@contextlib.asynccontextmanager
async def _lifespan(app: FastAPI):
    """Load the service in the background (unless one was handed in) and publish the metrics; at
    the end, stop both and close the service and the encode pool."""
    state: AppState = app.state.kokoro
    loader = asyncio.create_task(_load_service(state)) if state.service is None else None
    publisher = asyncio.create_task(_publish_metrics(state.metrics)) if state.metrics.directory else None
    try:
        yield
    finally:
        if loader is not None and not loader.done():
            loader.cancel()
        if publisher is not None:
            publisher.cancel()
        state.metrics.close()
        if state.service is not None:
            await state.service.aclose()
        state.encoders.shutdown(wait=False)


def _allow_origins(app: FastAPI, cors_origins: str) -> None:
    origins = [o.strip() for o in cors_origins.split(",") if o.strip()]
    if origins:  # outermost: preflights are answered before the API key check, which they cannot pass
        app.add_middleware(CORSMiddleware, allow_origins=origins, allow_methods=["GET", "POST"],
                           allow_headers=["Authorization", "Content-Type", "X-Request-Id"],
                           expose_headers=["Retry-After", "X-Request-Id", "X-Kokoro-Engine", "X-Download-Path"],
                           max_age=600)


async def _publish_metrics(metrics: Metrics) -> None:
    """Copy this worker's callback figures into the server's metrics files every REFRESH_S, for
    the scrapes other workers answer."""
    while True:
        metrics.refresh()
        await asyncio.sleep(REFRESH_S)


async def _load_service(state: AppState) -> None:
    """Build the replica and warm it up without blocking the server: /health answers meanwhile,
    /ready and speech requests say 503 until it is done."""
    started = time.perf_counter()
    try:
        from api.speech.build import build_service

        from worker.cpu_runtime import configure_process

        settings = state.settings
        configure_process(cache_dir=settings.cache_dir, threads=settings.threads, workers=settings.workers,
                          device=settings.device, inference_nice=settings.inference_nice)  # threads, compile cache
        log.info("start-up: imports and process set-up %.1f s", time.perf_counter() - started)
        # Built and warmed up: this worker's replica alone, behind the fleet's queue, or the baseline.
        service = await build_service(state.settings, state.metrics)
        # The model, its compiled kernels and the text frontend's tables are hundreds of thousands
        # of long-lived objects: freeze them out of the cyclic GC, so a full collection during
        # serving does not walk them all (a pause of hundreds of ms for every request in flight).
        gc.collect()
        gc.freeze()
        state.service = service
        state.ready = True
        if state.settings.engine == "sim":
            from api.speech.build import sim_cost
            from worker.sim_engine import describe

            log.warning("ready in %.1f s: %s", time.perf_counter() - started, describe(sim_cost(state.settings)))
        elif state.settings.weights == "random-full":
            from worker.weights.random_full import NOTICE

            log.warning("model ready in %.1f s: %s", time.perf_counter() - started, NOTICE)
        else:
            log.info("model ready in %.1f s (weights %s)", time.perf_counter() - started, state.settings.weights)
    except asyncio.CancelledError:
        raise
    except Exception as e:
        state.load_error = f"{type(e).__name__}: {e}"
        log.exception("loading the model failed")


def _register_metrics(state: AppState) -> None:
    m = state.metrics

    def replica(figure: Callable[[ReplicaStats], float]):
        def read() -> float:
            if state.service is None:
                raise LookupError("no replica yet")
            return float(figure(state.service.stats()))
        return read

    engine = state.settings.engine
    m.gauge("kokoro_engine_info", "The engine serving: torch (the model) or sim (SIMULATED: no model, synthetic audio "
            "after an assumed GPU time; KOKORO_ENGINE=sim).", lambda: {(engine,): 1.0}, labels=("engine",))
    m.gauge("kokoro_ready", "1 once the weights are loaded and warmed up.", lambda: float(state.ready))
    # The whole server's readiness, whichever worker answers: /ready's `replicas_*` fields.
    m.gauge("kokoro_replicas_planned", "Model replicas this server's plan starts (KOKORO_REPLICAS, else one per "
            "worker).", lambda: float(state.replicas_planned))
    m.gauge("kokoro_replicas_ready", "Model replicas of this server loaded, warmed up and serving.",
            lambda: float(state.ready and state.holds_replica()))
    m.gauge("kokoro_admitted_requests", "Speech requests admitted and not yet finished.", lambda: state.admission.admitted)
    if state.api_keys:
        named = [name for name, _ in state.api_keys]

        def held_by_key() -> dict[tuple[str, ...], float]:  # every named key, 0 when idle: never stale
            held = state.admission.admitted_by_key()
            return {(name,): held.get(name, 0) for name in named}
        m.gauge("kokoro_key_admitted_requests", "Speech requests admitted and not yet finished, by the name of their "
                "API key: what KOKORO_KEY_MAX_SHARE bounds.", held_by_key, labels=("key",))
    m.gauge("kokoro_queue_depth", "Admitted requests not being synthesized right now (waiting for the replica or sending).",
            lambda: max(0, state.admission.admitted - int(bool(replica(lambda s: s.busy)()))))
    m.gauge("kokoro_replica_busy", "1 while the replica runs an inference.", replica(lambda s: s.busy))
    m.counter("kokoro_replica_busy_seconds_total", "Seconds the replica spent running inferences.", replica(lambda s: s.busy_seconds))
    m.counter("kokoro_replica_jobs_total", "Inferences (chunks) the replica completed.", replica(lambda s: s.jobs_done))
    m.counter("kokoro_replica_audio_seconds_total", "Seconds of audio the replica synthesized.", replica(lambda s: s.audio_seconds))
    m.counter("kokoro_replica_cache_hits_total", "Chunks the replica served from its synthesis cache instead of "
              "computing them (KOKORO_SYNTHESIS_CACHE_MIB).", replica(lambda s: s.cache_hits))
    m.counter("kokoro_replica_cache_audio_seconds_total", "Seconds of audio those chunks held.",
              replica(lambda s: s.cache_audio_seconds))
    m.gauge("kokoro_replica_cache_bytes", "Memory the replica's synthesis cache holds.",
            replica(lambda s: s.cache_bytes))
    m.counter("kokoro_rejected_total", "Speech requests refused with 503 because admission was full.",
              lambda: state.admission.rejected)
