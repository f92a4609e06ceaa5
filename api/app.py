"""The HTTP server: OpenAI's audio API in front of a speech service.

Serving code only translates. A request is read and validated (api.protocol, api.errors), admitted
(api.admission: a slot, or 503 with Retry-After), planned by the speech service (text and voice
checks, still able to answer 400), then streamed: each audio piece the service yields goes through
the response's one encoder (api.encoders) and leaves at once, as raw audio, SSE events or NDJSON
captions. However the response ends (done, failed, client gone) the slot is released, the
synthesis stops after the chunk in flight, and one access-log line records it.

    create_app(settings, service=None)   # service None: weights load in the background at start-up
    app_factory()                        # what `uvicorn --factory api.app:app_factory` calls
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import gc
import hmac
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Protocol

from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from pydantic import ValidationError
from starlette.responses import StreamingResponse
from starlette.types import Message, Receive, Scope, Send

from api.admission import Admission, LocalAdmission, Ticket
from api.encoders import CONTENT_TYPES, SAMPLE_RATE, make_encoder
from api.errors import (ApiError, CapacityError, bad_request, install_error_handlers, internal_error,
                        read_json_object, validation_error)
from api.metrics import Metrics
from api.protocol import (MODEL_IDS, CaptionedSpeechResponse, ErrorResponse, ModelCard, ModelList,
                          SpeechAudioDelta, SpeechAudioDone, SpeechRequest, SpeechUsage, StreamError,
                          VoiceEntry, VoiceList, WordTimestampModel, model_cards)
from worker.settings import Settings, get_settings
from worker.speech import SpeechRequest as WorkerSpeechRequest  # the text frontend loads with it, at start-up

log = logging.getLogger("kokoro_fleet.api")
access_log = logging.getLogger("kokoro_fleet.access")

FRAME_SAMPLES = 600  # one model duration frame: 25 ms at 24 kHz, the unit of "output tokens"
# Speaking rate used to estimate a request's audio length from its phoneme count before any
# synthesis (KOKORO_MAX_REQUEST_AUDIO_SECONDS). Kokoro at speed 1 says about 12-16 phoneme symbols
# a second (spaces and punctuation included); the high end keeps the estimate from over-refusing.
PHONEMES_PER_SECOND = 16.0
# nginx's "client closed request": what the log shows for a non-streamed request whose client left
# (nobody receives it).
CLIENT_CLOSED_REQUEST = 499


class SpeechServiceLike(Protocol):
    """What the app needs of worker.speech.SpeechService (or the fleet's queue-backed twin)."""

    voices: Any

    def plan(self, request: Any) -> Any: ...

    def stream(self, plan: Any) -> AsyncIterator[Any]: ...


@dataclass
class RequestInfo:
    """What the access log and metrics record about one request; handlers fill it in."""

    id: str
    started: float
    voice: str | None = None
    chars: int | None = None
    format: str | None = None
    stream: bool | None = None
    ttfa_s: float | None = None
    audio_s: float = 0.0
    outcome: str = "ok"  # ok | error | disconnected

    def first_audio(self) -> None:
        if self.ttfa_s is None:
            self.ttfa_s = time.perf_counter() - self.started


@dataclass
class AppState:
    settings: Settings
    service: SpeechServiceLike | None
    admission: Admission
    metrics: Metrics = field(default_factory=Metrics)
    ready: bool = False
    load_error: str | None = None
    api_keys: tuple[str, ...] = ()

    def require_service(self) -> SpeechServiceLike:
        if self.service is None or not self.ready:
            if self.load_error:
                raise ApiError(503, "The model failed to load; the operator has to fix the server (see its log).",
                               type="server_error", code="model_unavailable")
            raise CapacityError(2.0, "The model is still loading; retry in a few seconds.")
        return self.service


# --- the app ----------------------------------------------------------------------------------

def app_factory() -> FastAPI:
    """Uvicorn's factory entry (`--factory`): settings from the environment, weights loaded at start-up."""
    if not logging.getLogger().handlers:  # a spawned worker process: give our log lines somewhere to go
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return create_app(get_settings())


def create_app(settings: Settings | None = None, service: SpeechServiceLike | None = None,
               admission: Admission | None = None) -> FastAPI:
    settings = settings or get_settings()
    state = AppState(
        settings=settings,
        service=service,
        admission=admission or LocalAdmission(settings.max_requests),
        api_keys=tuple(k.strip() for k in settings.api_keys.split(",") if k.strip()),
        ready=service is not None,  # a service handed in is built and warmed by its owner
    )

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        loader = asyncio.create_task(_load_service(state)) if state.service is None else None
        try:
            yield
        finally:
            if loader is not None and not loader.done():
                loader.cancel()
            close = getattr(state.service, "aclose", None)  # the fleet: dispatcher and queue clients
            if close is not None:
                await close()

    app = FastAPI(
        title="kokoro-fleet", version="0.1.0", lifespan=lifespan,
        description="Kokoro-82M text to speech behind OpenAI's audio API.",
        responses={400: {"model": ErrorResponse}, 503: {"model": ErrorResponse}},
    )
    app.state.kokoro = state
    install_error_handlers(app)
    _register_metrics(state)
    app.add_middleware(AccessLogMiddleware, state=state)

    def require_api_key(request: Request) -> None:
        if not state.api_keys:
            return
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise ApiError(401, "Missing API key: send it as `Authorization: Bearer YOUR_KEY`.",
                           type="invalid_request_error", code="invalid_api_key")
        token = token.strip().encode()
        if not any(hmac.compare_digest(token, key.encode()) for key in state.api_keys):
            raise ApiError(401, "Incorrect API key provided.", type="invalid_request_error", code="invalid_api_key")

    authed = [Depends(require_api_key)]

    @app.post("/v1/audio/speech", dependencies=authed, response_class=Response,
              responses={200: {"content": {t: {} for t in CONTENT_TYPES.values()} | {"text/event-stream": {}}}})
    async def speech(request: Request) -> Response:
        """Speak `input`. Streams chunked audio (or SSE events) by default; `stream: false` sends one body."""
        req, plan, ticket = await _prepare(request, state)
        info: RequestInfo = request.state.info
        if req.stream_format == "sse":
            return DisconnectAwareStreamingResponse(
                _sse_events(state, req, plan, ticket, info), media_type="text/event-stream",
                headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        if req.stream:
            return DisconnectAwareStreamingResponse(
                _audio_bytes(state, req, plan, ticket, info, request), media_type=CONTENT_TYPES[req.response_format],
                headers={"X-Accel-Buffering": "no"})
        try:
            body = b"".join([b async for b in _audio_bytes(state, req, plan, ticket, info, request, streamed=False)])
        except ClientGone:
            return Response(status_code=CLIENT_CLOSED_REQUEST)
        return Response(body, media_type=CONTENT_TYPES[req.response_format])

    async def captioned(request: Request) -> Response:
        """Speak `input` and return per-word timestamps: one JSON body, or NDJSON lines when streamed."""
        req, plan, ticket = await _prepare(request, state)
        info: RequestInfo = request.state.info
        if req.stream:
            return DisconnectAwareStreamingResponse(_caption_lines(state, req, plan, ticket, info),
                                                    media_type="application/x-ndjson")
        audio = bytearray()
        words: list[WordTimestampModel] = []
        try:
            async for data, piece in _encoded(state, req, plan, ticket, info, request, streamed=False):
                audio += data
                if piece is not None:
                    words += _word_models(piece)
        except ClientGone:
            return Response(status_code=CLIENT_CLOSED_REQUEST)
        return JSONResponse(CaptionedSpeechResponse(
            audio=base64.b64encode(bytes(audio)).decode(), audio_format=req.response_format, timestamps=words,
        ).model_dump())

    for path in ("/v1/audio/speech/captioned", "/dev/captioned_speech"):
        app.add_api_route(path, captioned, methods=["POST"], dependencies=authed, response_model=CaptionedSpeechResponse,
                          include_in_schema=path.startswith("/v1"))

    @app.get("/v1/audio/voices", dependencies=authed, response_model=VoiceList)
    async def voices() -> VoiceList:
        service = state.require_service()
        return VoiceList(voices=[VoiceEntry(id=v.name, name=v.name, language=str(v.language), gender=str(v.gender),
                                            lang_code=getattr(v, "lang_code", None))
                                 for v in service.voices.list()])

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
        fleet = getattr(state.service, "health", None)  # the fleet: mode (fleet | degraded), dispatch
        return {"status": "ok", "ready": state.ready, "admitted": state.admission.admitted,
                **(fleet() if fleet is not None else {}),
                **({"error": state.load_error} if state.load_error else {})}

    @app.get("/ready")
    async def ready() -> Response:
        """200 once the weights are loaded, warm-up is done and admission is reachable."""
        if state.load_error:
            return ApiError(503, f"The model failed to load: {state.load_error}", type="server_error",
                            code="model_unavailable").response()
        if not state.ready:
            return ApiError(503, "Loading the model and warming up.", type="server_error", code="loading",
                            headers={"Retry-After": "2"}).response()
        if not state.admission.healthy():
            return ApiError(503, "The admission queue is unreachable.", type="server_error", code="queue_unavailable").response()
        return JSONResponse({"status": "ready"})

    @app.get("/metrics", response_class=PlainTextResponse)
    async def metrics() -> PlainTextResponse:
        return PlainTextResponse(state.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    return app


async def _load_service(state: AppState) -> None:
    """Build the replica and warm it up without blocking the server: /health answers meanwhile,
    /ready and speech requests say 503 until it is done."""
    started = time.perf_counter()
    try:
        from api.fleet import build_service

        from worker.cpu_runtime import configure_process

        configure_process(state.settings)  # intra-op threads (cores / workers on CPU), compile cache
        # Built and warmed up: this worker's replica alone, behind the fleet's queue, or the baseline.
        service = await build_service(state.settings, state.metrics)
        # The model, its compiled kernels and the text frontend's tables are hundreds of thousands
        # of long-lived objects: freeze them out of the cyclic GC, so a full collection during
        # serving does not walk them all (a pause of hundreds of ms for every request in flight).
        gc.collect()
        gc.freeze()
        state.service = service
        state.ready = True
        log.info("model ready in %.1f s (weights %s)", time.perf_counter() - started, state.settings.weights)
    except asyncio.CancelledError:
        raise
    except Exception as e:
        state.load_error = f"{type(e).__name__}: {e}"
        log.exception("loading the model failed")


def _register_metrics(state: AppState) -> None:
    m = state.metrics

    def replica_attr(name: str):
        def read() -> float:
            replica = getattr(state.service, "replica", None)
            if replica is None:
                raise LookupError("no replica yet")
            return float(getattr(replica, name))
        return read

    m.gauge("kokoro_ready", "1 once the weights are loaded and warmed up.", lambda: float(state.ready))
    m.gauge("kokoro_admitted_requests", "Speech requests admitted and not yet finished.", lambda: state.admission.admitted)
    m.gauge("kokoro_queue_depth", "Admitted requests not being synthesized right now (waiting for the replica or sending).",
            lambda: max(0, state.admission.admitted - int(bool(replica_attr("busy")()))))
    m.gauge("kokoro_replica_busy", "1 while the replica runs an inference.", replica_attr("busy"))
    m.counter("kokoro_replica_busy_seconds_total", "Seconds the replica spent running inferences.", replica_attr("busy_seconds"))
    m.counter("kokoro_replica_jobs_total", "Inferences (chunks) the replica completed.", replica_attr("jobs_done"))
    m.counter("kokoro_replica_audio_seconds_total", "Seconds of audio the replica synthesized.", replica_attr("audio_seconds"))
    m.counter("kokoro_rejected_total", "Speech requests refused with 503 because admission was full.",
              lambda: getattr(state.admission, "rejected"))


# --- one speech request -----------------------------------------------------------------------

async def _prepare(request: Request, state: AppState):
    """Read, validate, admit and plan; every refusal here is a clean 4xx/5xx before any audio."""
    info: RequestInfo = request.state.info
    data = await read_json_object(request, state.settings.max_body_bytes)
    # Best effort for the access log, so a refused request still shows what it asked for.
    info.voice = data.get("voice") if isinstance(data.get("voice"), str) else None
    info.chars = len(data["input"]) if isinstance(data.get("input"), str) else None
    info.format = data.get("response_format", "mp3") if isinstance(data.get("response_format", "mp3"), str) else None
    try:
        req = SpeechRequest.model_validate(data, context={"max_input_chars": state.settings.max_input_chars})
    except ValidationError as e:
        raise validation_error(e) from None
    info.voice, info.chars, info.format, info.stream = req.voice_spec, len(req.input), req.response_format, req.stream
    service = state.require_service()
    ticket = state.admission.admit(info.id, float(len(req.input)))
    try:
        plan = service.plan(WorkerSpeechRequest(text=req.input, voice=req.voice_spec, speed=req.speed,
                                          lang_code=req.lang_code, normalization=req.normalization()))
        _check_audio_length(state.settings, plan, req.speed)
        admit = getattr(service, "admit", None)
        if admit is not None:  # the fleet: a slot in the shared queue, or 503 (CapacityError)
            plan = await admit(plan)
    except ApiError:
        state.admission.release(ticket)
        raise
    except ValueError as e:
        state.admission.release(ticket)
        param = getattr(e, "param", None)
        if param is None:  # a ValueError that is not a user-facing TextError/VoiceError is a bug
            raise
        raise bad_request(str(e), param=param, code=f"invalid_{param}") from None
    except BaseException:
        state.admission.release(ticket)
        raise
    return req, plan, ticket


def _check_audio_length(settings: Settings, plan: Any, speed: float) -> None:
    limit = settings.max_request_audio_seconds
    if limit <= 0:
        return
    phonemes = getattr(plan, "phoneme_count", 0)
    pauses = sum(getattr(c, "pause_after", 0.0) for c in getattr(plan, "chunks", ()))
    estimate = phonemes / (PHONEMES_PER_SECOND * speed) + pauses
    if estimate > limit:
        raise bad_request(
            f"input would give about {estimate:.0f} s of audio; this server's limit is {limit:.0f} s per "
            "request. Split the text into several requests.", param="input", code="input_too_long")


async def _encoded(state: AppState, req: SpeechRequest, plan: Any, ticket: Ticket, info: RequestInfo,
                   request: Request | None, streamed: bool = True) -> AsyncIterator[tuple[bytes, Any]]:
    """The response's bytes, with the piece they came from: (bytes, piece) per synthesized piece,
    then (tail, None) once the encoder is flushed. Owns the request's life: releases its slot,
    counts its audio and notes how it ended, whether it finishes, fails or is cancelled."""
    service = state.require_service()
    encoder = make_encoder(req.response_format, streamed=streamed, volume=req.volume_multiplier)
    samples = 0
    finished = False
    try:
        async with contextlib.aclosing(service.stream(plan)) as pieces:
            async for piece in pieces:
                samples += len(piece.pcm)
                data = encoder.encode(piece.pcm)
                if data:
                    info.first_audio()
                yield data, piece
                # Non-streamed bodies never touch the network until the end, so nothing cancels
                # them when the client leaves: look between chunks instead.
                if request is not None and not streamed and await request.is_disconnected():
                    raise ClientGone()
        tail = encoder.finish()
        if tail:
            info.first_audio()
        finished = True
        yield tail, None
    except (asyncio.CancelledError, ClientGone, GeneratorExit):
        info.outcome = "disconnected"
        raise
    except Exception:
        info.outcome = "error"
        raise
    finally:
        encoder.close()
        info.audio_s = samples / SAMPLE_RATE
        if not finished and info.outcome == "ok":
            info.outcome = "disconnected"
        state.metrics.audio_seconds += info.audio_s
        state.admission.release(ticket, service_seconds=_service_seconds(state, info.audio_s))


class ClientGone(Exception):
    """The client of a non-streamed request disconnected before its body was ready."""


def _service_seconds(state: AppState, audio_s: float) -> float | None:
    """Replica seconds this request used, from its audio length and the replica's measured RTF."""
    replica = getattr(state.service, "replica", None)
    try:
        busy, audio = float(replica.busy_seconds), float(replica.audio_seconds)
    except (AttributeError, TypeError, ValueError):
        return None
    return audio_s * busy / audio if audio > 0 and audio_s > 0 else None


async def _audio_bytes(state, req, plan, ticket, info, request, streamed: bool = True) -> AsyncIterator[bytes]:
    async for data, _ in _encoded(state, req, plan, ticket, info, request, streamed):
        if data:
            yield data


async def _sse_events(state, req, plan, ticket, info) -> AsyncIterator[bytes]:
    """OpenAI's speech SSE stream: audio deltas (base64 of the encoded file's next bytes), then
    `speech.audio.done` with usage; an `error` event instead if synthesis fails midway."""
    samples = 0
    try:
        async for data, piece in _encoded(state, req, plan, ticket, info, None):
            if piece is not None:
                samples += len(piece.pcm)
            if data:
                yield _sse(SpeechAudioDelta(audio=base64.b64encode(data).decode()))
    except Exception:
        log.exception("synthesis failed midway through request %s", info.id)
        yield _sse(StreamError(error=internal_error().detail()))
        return
    phonemes = int(getattr(plan, "phoneme_count", 0))
    frames = round(samples / FRAME_SAMPLES)
    yield _sse(SpeechAudioDone(usage=SpeechUsage(input_tokens=phonemes, output_tokens=frames, total_tokens=phonemes + frames)))


def _sse(event) -> bytes:
    return b"data: " + event.model_dump_json().encode() + b"\n\n"


async def _caption_lines(state, req, plan, ticket, info) -> AsyncIterator[bytes]:
    """NDJSON: one CaptionedSpeechResponse per piece (its bytes of the one encoded file and its
    words, in absolute seconds); the last line carries the encoder's tail."""
    try:
        async for data, piece in _encoded(state, req, plan, ticket, info, None):
            if not data and piece is None:
                continue
            words = _word_models(piece) if piece is not None else []
            line = CaptionedSpeechResponse(audio=base64.b64encode(data).decode(), audio_format=req.response_format,
                                           timestamps=words)
            yield line.model_dump_json().encode() + b"\n"
    except Exception:
        log.exception("synthesis failed midway through request %s", info.id)
        yield json.dumps(StreamError(error=internal_error().detail()).model_dump()).encode() + b"\n"


def _word_models(piece: Any) -> list[WordTimestampModel]:
    return [WordTimestampModel(word=w.word, start_time=round(float(w.start), 3), end_time=round(float(w.end), 3))
            for w in getattr(piece, "words", ())]


# --- transport --------------------------------------------------------------------------------

class DisconnectAwareStreamingResponse(StreamingResponse):
    """A streaming response that stops producing the moment its client disconnects.

    Starlette's own listens for `http.disconnect` only when the server speaks ASGI spec < 2.4;
    under 2.4 it notices a departed client when the next send fails, i.e. after the next chunk
    has been synthesized for nobody. Here a listener always runs and cancels the producer at
    once: the chunk in flight is the last one, and the request's slot frees immediately.
    """

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        producer = asyncio.ensure_future(self.stream_response(send))
        listener = asyncio.ensure_future(self.listen_for_disconnect(receive))
        try:
            await asyncio.wait({producer, listener}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (producer, listener):
                task.cancel()
            await asyncio.gather(producer, listener, return_exceptions=True)
        if producer.done() and not producer.cancelled():
            error = producer.exception()
            if error is not None and not isinstance(error, OSError):  # OSError: the client went away mid-send
                raise error


class AccessLogMiddleware:
    """One structured log line and one metrics sample per request, whatever its outcome."""

    def __init__(self, app, state: AppState):
        self.app = app
        self.state = state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        given = headers.get(b"x-request-id", b"").decode("latin-1")
        request_id = given[:64] if given and given.isprintable() else f"req_{uuid.uuid4().hex[:16]}"
        info = RequestInfo(id=request_id, started=time.perf_counter())
        scope.setdefault("state", {})["info"] = info
        status: int | None = None
        completed = False

        async def send_and_watch(message: Message) -> None:
            nonlocal status, completed
            if message["type"] == "http.response.start":
                status = message["status"]
                message.setdefault("headers", [])
                message["headers"] = [*message["headers"], (b"x-request-id", request_id.encode())]
            elif message["type"] == "http.response.body" and not message.get("more_body", False):
                completed = True
            await send(message)

        try:
            await self.app(scope, receive, send_and_watch)
        except BaseException:
            if info.outcome == "ok":
                info.outcome = "error"
            raise
        finally:
            self._record(scope, info, status, completed)

    def _record(self, scope: Scope, info: RequestInfo, status: int | None, completed: bool) -> None:
        e2e = time.perf_counter() - info.started
        route = getattr(scope.get("route"), "path", None) or "unmatched"
        if not completed and info.outcome == "ok":
            info.outcome = "disconnected"
        shown_status = status if status is not None else 500
        m = self.state.metrics
        m.count_request(route, shown_status if info.outcome != "disconnected" else "disconnected")
        if status == 200 and info.stream is not None:  # a speech response
            if info.ttfa_s is not None:
                m.ttfa.observe(info.ttfa_s)
            if info.outcome == "ok":
                m.e2e.observe(e2e)
            elif info.outcome == "disconnected":
                m.disconnects += 1
        record = {
            "id": info.id, "method": scope.get("method"), "path": scope.get("path"), "status": shown_status,
            "outcome": info.outcome, "voice": info.voice, "chars": info.chars, "format": info.format,
            "stream": info.stream,
            "ttfa_ms": None if info.ttfa_s is None else round(info.ttfa_s * 1000, 1),
            "e2e_ms": round(e2e * 1000, 1), "audio_s": round(info.audio_s, 3),
        }
        quiet = route in ("/health", "/ready", "/metrics")  # probes and scrapes: every few seconds
        access_log.log(logging.DEBUG if quiet else logging.INFO, json.dumps(record))

