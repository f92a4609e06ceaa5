"""The HTTP server: OpenAI's audio API in front of a speech service.

Routes only route: each reads what it needs from the process's `AppState` (api.state) and hands
speech requests to the serving code (api.serving), which talks to the speech service through its
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

from fastapi import Depends, FastAPI, Request, WebSocket
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import FileResponse, JSONResponse, PlainTextResponse, Response
from pydantic import BaseModel

from api.admission import ProcessAdmission
from api.downloads import DownloadStore, SharedDownloads, default_directory
from api.encoders import CONTENT_TYPES
from api.errors import ApiError, install_error_handlers
from api.live import LIVE_PATH, live_session
from api.metrics import REFRESH_S, Metrics
from api.playground import FLEET_PATH, playground_router
from api.protocol import (MODEL_IDS, CaptionedSpeechRequest, CaptionedSpeechResponse, DialogueRequest, ErrorResponse,
                          LegacyVoiceList, ModelCard, ModelList, PhonemeSpeechRequest, PhonemizeRequest,
                          PhonemizeResponse, SpeechRequestBody, VoiceEntry, VoiceList, model_cards)
from api.speech.contract import ReplicaStats, SpeechBackend
from api.serving import captioned_response, combined_voice_response, phonemize_response, speech_response
from api.state import AppState, encode_pool, parse_api_keys
from api.swagger import docs_router
from api.transport import AccessLogMiddleware
from api.settings import Settings, get_settings
from worker.text import lexicon_status

log = logging.getLogger("kokoro_fleet.api")


def app_factory() -> FastAPI:
    """Uvicorn's factory entry (`--factory`): settings from the environment, weights loaded at start-up."""
    if not logging.getLogger().handlers:  # a spawned worker process: give our log lines somewhere to go
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return create_app(get_settings())


def create_app(settings: Settings | None = None, service: SpeechBackend | None = None) -> FastAPI:
    settings = settings or get_settings()
    state = AppState(
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
    async def lifespan(app: FastAPI):
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

    app = FastAPI(
        title="kokoro-fleet", version="0.1.0", lifespan=lifespan, docs_url=None, redoc_url=None,  # api.swagger: no CDN
        description="Kokoro-82M text to speech behind OpenAI's audio API.",
        responses={400: {"model": ErrorResponse}, 429: {"model": ErrorResponse}, 503: {"model": ErrorResponse}},
    )
    app.state.kokoro = state
    install_error_handlers(app)
    _register_metrics(state)
    app.add_middleware(AccessLogMiddleware, metrics=state.metrics,
                       quiet_paths=("/health", "/ready", "/metrics", FLEET_PATH), engine=settings.engine)
    origins = [o.strip() for o in settings.cors_origins.split(",") if o.strip()]
    if origins:  # outermost: preflights are answered before the API key check, which they cannot pass
        app.add_middleware(CORSMiddleware, allow_origins=origins, allow_methods=["GET", "POST"],
                           allow_headers=["Authorization", "Content-Type", "X-Request-Id"],
                           expose_headers=["Retry-After", "X-Request-Id", "X-Kokoro-Engine", "X-Download-Path"],
                           max_age=600)

    # async: FastAPI runs a plain `def` dependency in its thread pool, a thread hop (and, the first
    # time, the pool's start) for every request, 503s included
    async def require_api_key(request: Request) -> None:
        name = state.check_api_key(request.headers.get("authorization", ""))
        info = request.scope.get("state", {}).get("info")
        if info is not None:  # the access log and /metrics count the request under its key's name
            info.key = name

    authed = [Depends(require_api_key)]

    @app.post("/v1/audio/speech", dependencies=authed, response_class=Response,
              openapi_extra=_json_body(SpeechRequestBody),
              responses={200: {"content": {t: {} for t in CONTENT_TYPES.values()} | {"text/event-stream": {}}}})
    async def speech(request: Request) -> Response:
        """Speak `input`. Streams chunked audio (or SSE events) by default; `stream: false` sends one body."""
        return await speech_response(state, request)

    async def captioned(request: Request) -> Response:
        """Speak `input` and return per-word timestamps: one JSON body, or NDJSON lines when streamed."""
        return await captioned_response(state, request)

    for path in ("/v1/audio/speech/captioned", "/dev/captioned_speech"):
        app.add_api_route(path, captioned, methods=["POST"], dependencies=authed, response_model=CaptionedSpeechResponse,
                          include_in_schema=path.startswith("/v1"), openapi_extra=_json_body(CaptionedSpeechRequest))

    # Kokoro-FastAPI's phoneme endpoints, for pronunciations a text cannot spell.
    @app.post("/dev/phonemize", dependencies=authed, response_model=PhonemizeResponse,
              openapi_extra=_json_body(PhonemizeRequest))
    async def phonemize(request: Request) -> PhonemizeResponse:
        """The phonemes and model ids the server would speak for `text` (no synthesis)."""
        return await phonemize_response(state, request)

    @app.post("/dev/generate_from_phonemes", dependencies=authed, response_class=Response,
              openapi_extra=_json_body(PhonemeSpeechRequest),
              responses={200: {"content": {t: {} for t in CONTENT_TYPES.values()}}})
    async def generate_from_phonemes(request: Request) -> Response:
        """Speak `phonemes` as given; streamed WAV by default (any speech format may be asked)."""
        return await speech_response(state, request, phonemes=True)

    @app.post("/dev/dialogue", dependencies=authed, response_class=Response,
              openapi_extra=_json_body(DialogueRequest),
              responses={200: {"content": {t: {} for t in CONTENT_TYPES.values()}}})
    async def dialogue(request: Request) -> Response:
        """Kokoro-FastAPI's dialogue: turns, each in its speaker's voice, a pause where the speaker
        changes; answered as `/v1/audio/speech` answers."""
        return await speech_response(state, request, dialogue=True)

    @app.websocket(LIVE_PATH)
    async def live(websocket: WebSocket) -> None:
        """Live speech: text in as it is written, audio out as it is spoken (protocol in api/live.py)."""
        await live_session(state, websocket)

    async def download(filename: str) -> Response:
        """A file saved for a `return_download_link` request (the path its X-Download-Path header named)."""
        found = await state.downloads.lookup(filename)
        suffix = "." + filename.rsplit(".", 1)[-1]
        if isinstance(found, bytes):  # another machine of the fleet made it
            return Response(found, media_type=CONTENT_TYPES[suffix[1:]],
                            headers={"Content-Disposition": f'attachment; filename="speech{suffix}"'})
        return FileResponse(found, media_type=CONTENT_TYPES[suffix[1:]], filename=f"speech{suffix}")

    # Kokoro-FastAPI names the link `/download/NAME`, relative to its `/v1` prefix; both paths serve it.
    for path in ("/v1/download/{filename}", "/download/{filename}"):
        app.add_api_route(path, download, methods=["GET"], dependencies=authed, response_class=FileResponse,
                          include_in_schema=path.startswith("/v1"))

    @app.get("/v1/audio/voices", dependencies=authed, response_model=VoiceList | LegacyVoiceList)
    async def voices(legacy: bool = False) -> VoiceList | LegacyVoiceList:
        """The voices, with language and gender; `?legacy=true`: the bare names, as Kokoro-FastAPI
        listed them before 0.3."""
        listed = state.require_service().voices.list()
        if legacy:
            return LegacyVoiceList(voices=[v.name for v in listed])
        return VoiceList(voices=[VoiceEntry(id=v.name, name=v.name, language=str(v.language), gender=str(v.gender),
                                            lang_code=v.lang_code) for v in listed])

    @app.post("/v1/audio/voices/combine", dependencies=authed, response_class=Response,
              responses={200: {"content": {"application/octet-stream": {}}}})
    async def combine_voices(request: Request) -> Response:
        """A mix of voices as a .pt voice file (Kokoro-FastAPI's endpoint): saved as NAME.pt in the
        voices directory (KOKORO_VOICES_DIR), it is served as NAME."""
        return await combined_voice_response(state, request)

    @app.get("/v1/models", dependencies=authed, response_model=ModelList)
    async def models() -> ModelList:
        return ModelList(data=model_cards())

    @app.get("/v1/models/{model_id}", dependencies=authed, response_model=ModelCard)
    async def model(model_id: str) -> ModelCard:
        for card in model_cards():
            if card.id == model_id:
                return card
        raise ApiError(404, f"The model {model_id!r} does not exist; this server has {', '.join(MODEL_IDS)}.",
                       param="model", code="model_not_found")

    @app.get("/health")
    async def health() -> dict:
        """Liveness: the process answers. Readiness is /ready."""
        return {"status": "ok", "ready": state.ready, "admitted": state.admission.admitted, **_engine(settings),
                **(state.service.health() if state.service is not None else {}),  # the fleet: mode, dispatch
                **({"lexicon": lexicon_status(settings.lexicon)} if settings.lexicon else {}),
                **({"voices_dir": state.service.voices.directory_status()}
                   if settings.voices_dir and state.service is not None else {}),
                **({"error": state.load_error} if state.load_error else {})}

    @app.get("/ready")
    async def ready() -> Response:
        """200 once the weights are loaded and warm-up is done."""
        if state.load_error:
            return ApiError(503, f"The model failed to load: {state.load_error}", type="server_error",
                            code="model_unavailable").response()
        if not state.ready:
            return ApiError(503, "Loading the model and warming up.", type="server_error", code="loading",
                            headers={"Retry-After": "2"}).response()
        return JSONResponse({"status": "ready", **_engine(settings)})

    @app.get("/metrics", response_class=PlainTextResponse)
    async def metrics() -> PlainTextResponse:
        return PlainTextResponse(state.metrics_page(), media_type="text/plain; version=0.0.4; charset=utf-8")

    app.include_router(docs_router(app.openapi_url, app.title))
    if settings.playground:
        app.include_router(playground_router(state))
    _document_request_bodies(app, (SpeechRequestBody, CaptionedSpeechRequest, PhonemizeRequest, PhonemeSpeechRequest,
                                   DialogueRequest))
    return app


async def _publish_metrics(metrics: Metrics) -> None:
    """Copy this worker's callback figures into the server's metrics files every REFRESH_S, for
    the scrapes other workers answer."""
    while True:
        metrics.refresh()
        await asyncio.sleep(REFRESH_S)


def _json_body(model: type[BaseModel]) -> dict:
    """The OpenAPI request body of a route that reads its JSON itself (so a bad body gets the
    OpenAI error shape, not FastAPI's): `model`'s schema, which `_document_request_bodies` adds."""
    schema = {"$ref": f"#/components/schemas/{_schema_name(model)}"}
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": schema}}}}


def _schema_name(model: type[BaseModel]) -> str:
    """The name a body's schema is documented under: its title where it sets one (OpenAI's names)."""
    return model.model_config.get("title") or model.__name__


def _document_request_bodies(app: FastAPI, models: tuple[type[BaseModel], ...]) -> None:
    """Put the request models (and the models they use) into the OpenAPI components, so /docs and
    client generators show every field of the bodies `_json_body` names."""
    generate = app.openapi

    def openapi() -> dict:
        if app.openapi_schema is not None:
            return app.openapi_schema
        schema = generate()  # FastAPI's, cached on the app: completed in place
        components = schema.setdefault("components", {}).setdefault("schemas", {})
        for model in models:
            model_schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
            components.update(model_schema.pop("$defs", {}))
            components[_schema_name(model)] = model_schema
        return schema

    app.openapi = openapi  # type: ignore[method-assign]


def _engine(settings: Settings) -> dict:
    """What /health and /ready say of the engine; a simulated one (KOKORO_ENGINE=sim) says so plainly."""
    if settings.engine != "sim":
        if settings.weights == "random-full":  # full-size, but random: its audio is not speech
            from worker.weights.random_full import NOTICE

            return {"engine": settings.engine, "weights": "random-full", "random_weights": True, "notice": NOTICE}
        return {"engine": settings.engine}
    return {"engine": "sim", "simulated": True,
            "sim_cost_ms": {"per_chunk": settings.sim_chunk_ms, "per_phoneme": settings.sim_phoneme_ms}}


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
