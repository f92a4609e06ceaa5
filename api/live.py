"""Live speech over a WebSocket: the text comes in as a language model writes it, the audio goes
out as soon as each piece of it can be spoken, and the listener can interrupt.

    WS /v1/audio/speech/live          (with KOKORO_API_KEYS: `Authorization: Bearer KEY`, or from a
                                       browser the subprotocols ["kokoro-live", "openai-insecure-api-key.KEY"])

The client sends JSON text frames (the models are in api.protocol):

    {"type": "start", "voice": "af_heart", "response_format": "pcm", ...}   first, once (LiveStart)
    {"type": "text", "text": "Hello, wor"}   the next characters, cut anywhere; once none come for
                         the start's `pause_ms` (300), the sentences already ended are spoken
    {"type": "flush"}    speak what is buffered now, even mid-sentence (the end of a turn)
    {"type": "clear"}    drop the text not spoken yet and stop the audio being made (barge-in)
    {"type": "end"}      speak the rest, then `done`, and close

It receives one continuous audio stream in `response_format` as binary frames, and JSON text
frames between them: `started` (the audio's sample rate), `words` (each piece's word timings in
seconds from the session's first sample; on a piece's first words, `piece_latency`: seconds from its
text being complete to its first audio), `flushed` (after the last audio of the text sent before a
flush), `cleared`, `error` (OpenAI's error shape: a message or a piece refused; the session goes
on unless it closes) and `done` (usage) before a normal close.

The text is cut into pieces (worker.text.segments) and every piece is one speech request to the
service, admitted (this process's bound, then the fleet's queue), planned and streamed as an HTTP
one is: a session holds capacity only while it speaks, and an idle one (a bot waiting for its
model) holds none. A piece that finds the server full waits for capacity, up to
`ADMISSION_WAIT_S`, then the session closes with 1013 (try again later). A connection that would
be refused at once (no API key, model loading, process full) gets the HTTP answer any request
would get (401, or 503 with Retry-After) instead of the upgrade.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import uuid
from collections.abc import Awaitable

from pydantic import BaseModel, ValidationError
from starlette.websockets import WebSocket, WebSocketDisconnect, WebSocketState

from api.admission import ProcessSlot
from api.encoders import default_sample_rate
from api.errors import ApiError, as_api_error, bad_request, internal_error, request_field_errors, validation_error
from api.protocol import (LiveCleared, LiveClear, LiveDone, LiveEnd, LiveFlush, LiveFlushed, LiveStart, LiveStarted,
                          LiveText, LiveWords, SpeechUsage, StreamError, WordTimestampModel)
from api.serving import pooled_encoder, release_slot
from api.speech.contract import AudioPiece, Overloaded, SpeechPlan
from api.state import AppState
from api.transport import ClientStalled, access_log
from worker.audio import SAMPLE_RATE, SAMPLES_PER_FRAME
from worker.text import NormalizationOptions
from worker.text.segments import TextPiece, TextSegmenter

log = logging.getLogger("kokoro_fleet.api")

LIVE_PATH = "/v1/audio/speech/live"
# How long one piece waits for capacity before the session gives up: a listener who has heard
# nothing for this long has lost the conversation anyway.
ADMISSION_WAIT_S = 10.0
# How long a new connection may take to send its `start` message.
START_TIMEOUT_S = 10.0
# WebSocket close codes (RFC 6455 section 7.4.1; 1013 from IANA's registry).
NORMAL_CLOSURE, POLICY_VIOLATION, INTERNAL_ERROR, TRY_AGAIN_LATER = 1000, 1008, 1011, 1013

# A browser's WebSocket cannot send an Authorization header: it offers the key as a subprotocol
# instead, beside a plain one for the server to choose: ["kokoro-live", "openai-insecure-api-key.KEY"].
KEY_SUBPROTOCOL = "openai-insecure-api-key."
_MESSAGES: dict[str, type[BaseModel]] = {"text": LiveText, "flush": LiveFlush, "clear": LiveClear, "end": LiveEnd}
_FLUSHED, _END = object(), object()  # marks in the work queue, between the pieces of text


class SessionOver(Exception):
    """The session cannot go on: tell the client why, then close with `code`."""

    def __init__(self, error: ApiError, code: int):
        super().__init__(error.message)
        self.error = error
        self.code = code


async def live_session(state: AppState, websocket: WebSocket) -> None:
    """One WebSocket connection, from the upgrade (or its refusal) to the close."""
    try:
        key = _check_upgrade(state, websocket)
    except (ApiError, Overloaded) as refusal:
        await _deny(websocket, as_api_error(refusal))
        return
    await websocket.accept(subprotocol=_chosen_subprotocol(websocket))
    session_id = f"live_{uuid.uuid4().hex[:16]}"
    try:
        start = await _read_start(state, websocket)
    except SessionOver as over:
        await _close(websocket, over)
        return
    if start is None:  # the client left before saying anything
        return
    session = LiveSession(state, websocket, start, session_id, key=key)
    await session.run()


class LiveSession:
    """A started session: the receiving loop (this task) and the speaker (its own task), which
    speaks the queued pieces in order and is the only one to send audio."""

    def __init__(self, state: AppState, websocket: WebSocket, start: LiveStart, session_id: str,
                 key: str | None = None):
        self.state = state
        self.key = key  # the name of its API key (KOKORO_API_KEYS), for the access log and /metrics
        self.ws = websocket
        self.start = start
        self.id = session_id
        self.service = state.require_service()
        # Where the text is read as markup: code blocks dropped, <voice> followed from piece to piece.
        self.segmenter = TextSegmenter(reads_markup=(start.normalization() or NormalizationOptions()).reads_markup)
        self.work: asyncio.Queue = asyncio.Queue()
        self.waiting_chars = 0  # text queued and not yet spoken: bounded by KOKORO_MAX_INPUT_CHARS
        self.encoder = pooled_encoder(state, start.response_format, True, start.volume_multiplier, start.sample_rate)
        self.send_lock = asyncio.Lock()
        # A client that takes no bytes for this long is cut off (KOKORO_SEND_TIMEOUT_SECONDS): its
        # connection stays open, so nothing else would ever end the session and free its place.
        self.send_timeout_s = state.settings.send_timeout_seconds
        self.stalled = False
        self.speaker: asyncio.Task | None = None
        self.ending = False  # `end` came: no more text
        self.unsettled = False  # text came since the writer last paused: a pause may end a sentence
        self.finished = False  # the speaker reached `end`: a disconnect now is the close handshake
        # what the access log and `done` report
        self.opened = time.perf_counter()
        self.samples = 0    # at 24 kHz, sent so far
        self.phonemes = 0
        self.pieces = 0
        self.chars = 0
        self.first_audio_s: float | None = None  # from the first piece's completion to its first bytes
        self.outcome = "ok"

    async def run(self) -> None:
        fmt = self.start.response_format
        await self._send_json(LiveStarted(session_id=self.id, response_format=fmt,
                                          sample_rate=self.start.sample_rate or default_sample_rate(fmt)))
        self.speaker = asyncio.create_task(self._speak())
        self.state.metrics.live_sessions.inc()
        receive: asyncio.Future | None = None
        try:
            while True:
                if receive is None:
                    receive = asyncio.ensure_future(self.ws.receive())
                done, _ = await asyncio.wait({receive, self.speaker}, timeout=self._pause_s(),
                                             return_when=asyncio.FIRST_COMPLETED)
                if not done:  # the writer paused: speak what a space would have ended
                    self.unsettled = False
                    for piece in self.segmenter.settle():
                        await self._queue(piece)
                    continue
                if self.speaker in done:  # it ended the session (its end, or a failure): a message
                    return                # that came with its close has no one left to answer it
                message, receive = receive.result(), None
                if message["type"] == "websocket.disconnect":
                    if self.outcome == "ok" and not self.finished:
                        self.outcome = "disconnected"
                    return
                await self._handle(message)
        except (WebSocketDisconnect, OSError):  # the client left while we answered it
            self.outcome = "disconnected"
        except asyncio.CancelledError:
            self.outcome = "disconnected"
            raise
        finally:
            if receive is not None:
                receive.cancel()
            self.state.metrics.live_sessions.dec()
            await self._stop_speaker()
            self.encoder.close()
            self._record()

    async def _handle(self, message: dict) -> None:
        try:
            event = _parse(message, self.state.settings.max_input_chars)
        except ApiError as e:
            await self._send_json(StreamError(error=e.detail()))
            return
        if self.ending and not isinstance(event, LiveClear):
            await self._send_json(StreamError(error=bad_request(
                "The session is ending (`end` was sent): it speaks what it has, then closes.", param="type",
                code="session_ending").detail()))
            return
        if isinstance(event, LiveText):
            self.chars += len(event.text)
            self.unsettled = True
            for piece in self.segmenter.push(event.text):
                await self._queue(piece)
        elif isinstance(event, LiveFlush):
            await self._queue(self.segmenter.flush())
            self.work.put_nowait(_FLUSHED)
        elif isinstance(event, LiveClear):
            if self.finished:  # everything was spoken: `done` and the close are on their way, and
                return         # cancelling them would leave a `cleared` to send on a closed socket
            self.segmenter.clear()
            await self._stop_speaker()
            self.work = asyncio.Queue()
            self.waiting_chars = 0
            await self._send_json(LiveCleared())
            if self.ending:  # cleared after `end`: nothing more to say, the session still ends
                self.work.put_nowait(_END)
            self.speaker = asyncio.create_task(self._speak())
        else:  # LiveEnd
            self.ending = True
            await self._queue(self.segmenter.flush())
            self.work.put_nowait(_END)

    def _pause_s(self) -> float | None:
        """How long the receiving loop waits for text before the writer counts as paused (None: no
        pause can end anything now)."""
        if self.start.pause_ms is None or not self.unsettled or self.ending or not self.segmenter.buffer.strip():
            return None
        return self.start.pause_ms / 1000

    async def _queue(self, piece: TextPiece) -> None:
        if not piece:
            return
        limit = self.state.settings.max_input_chars
        if self.waiting_chars + len(piece) > limit:  # the client writes far faster than we speak
            await self._send_json(StreamError(error=bad_request(
                f"This piece of text was dropped: {self.waiting_chars} characters already wait to be spoken and "
                f"the bound is {limit}; send text as fast as it is spoken (or `clear` first).",
                param="text", code="live_backlog").detail()))
            return
        self.waiting_chars += len(piece)
        self.work.put_nowait((piece, time.perf_counter()))

    # --- the speaker ----------------------------------------------------------------------------

    async def _speak(self) -> None:
        """Speak the queued pieces in order; on `_END` finish the stream, send `done` and close."""
        try:
            while True:
                item = await self.work.get()
                if item is _FLUSHED:
                    await self._send_json(LiveFlushed())
                elif item is _END:
                    self.finished = True
                    await self._send_audio(await self.encoder.finish())
                    frames = round(self.samples / SAMPLES_PER_FRAME)
                    await self._send_json(LiveDone(usage=SpeechUsage(
                        input_tokens=self.phonemes, output_tokens=frames, total_tokens=self.phonemes + frames)))
                    await self._send(self.ws.close(NORMAL_CLOSURE))
                    return
                else:
                    text, ready_at = item
                    try:
                        await self._speak_piece(text, ready_at)
                    finally:
                        self.waiting_chars -= len(text)
        except SessionOver as over:
            self.outcome = "error"
            await _close(self.ws, over)
        except ClientStalled as stalled:  # nothing more can reach it: no error message, no close frame
            self.outcome = "stalled"
            access_log.warning("live session %s: %s", self.id, stalled)
        except (WebSocketDisconnect, OSError):  # the client left while we spoke
            self.outcome = "disconnected"
        except Exception:
            self.outcome = "error"
            log.exception("live session %s failed", self.id)
            await _close(self.ws, SessionOver(internal_error(), INTERNAL_ERROR))

    async def _speak_piece(self, text: TextPiece, ready_at: float) -> None:
        taken = time.perf_counter()
        slot, plan = await self._admit(text)
        if plan is None:
            return
        spoken = 0
        start_s = self.samples / SAMPLE_RATE  # the piece's words are timed from its own start
        heard = False
        try:
            async with contextlib.aclosing(self.service.stream(plan)) as pieces:
                async for piece in pieces:
                    sent = await self._send_piece(piece, text, start_s, None if heard else ready_at)
                    if sent and not heard:
                        heard = True
                        self.state.metrics.live_piece_ttfa.observe(time.perf_counter() - taken)
                    spoken += len(piece.pcm)
            self.pieces += 1
            self.phonemes += plan.phoneme_count
        finally:
            release_slot(slot, self.service, spoken / SAMPLE_RATE)
            self.state.metrics.audio_seconds.inc(spoken / SAMPLE_RATE)

    async def _admit(self, text: str) -> tuple[ProcessSlot | None, SpeechPlan | None]:
        """A slot and a plan for one piece, waiting while the server is full (up to
        ADMISSION_WAIT_S); (None, None) after telling the client that its text cannot be spoken."""
        deadline = time.monotonic() + ADMISSION_WAIT_S
        while True:
            try:
                slot = self.state.admission.admit(self.id, count_refusal=False, key=self.key)
                try:
                    with request_field_errors(input="text"):
                        return slot, await self.service.admit(self.start.speech_request(text), key=self.key)
                except BaseException:
                    slot.release()
                    raise
            except Overloaded as full:
                wait = min(full.retry_after_s, deadline - time.monotonic())
                if wait <= 0:
                    raise SessionOver(as_api_error(full), TRY_AGAIN_LATER) from None
                await asyncio.sleep(wait)
            except ApiError as refused:  # TextError / VoiceError: this piece cannot be spoken
                if refused.status != 400:
                    raise
                if refused.code == "nothing_to_say":  # a lone quote, an emoji line: a model wrote it, skip it
                    return None, None
                skipped = bad_request(f"{refused.message} (in the piece {text[:60]!r}; it was skipped)",
                                      param=refused.param, code=f"invalid_{refused.param}")
                await self._send_json(StreamError(error=skipped.detail()))
                return None, None

    async def _send_piece(self, piece: AudioPiece, text: TextPiece, start_s: float, ready_at: float | None) -> bool:
        """Encode and send one chunk of a piece's audio (and its words, timed from the piece's start
        at `start_s` in the session, their spans in all the text the session was sent through the
        piece's `text`); whether any audio bytes went out. `ready_at`: when the piece's text was
        complete, until its first audio has gone."""
        data = await self.encoder.encode(piece.pcm)
        self.samples += len(piece.pcm)
        latency = time.perf_counter() - ready_at if data and ready_at is not None else None
        if latency is not None and self.first_audio_s is None:
            self.first_audio_s = latency
        await self._send_audio(data)
        if self.start.timestamps and piece.words:
            await self._send_json(LiveWords(piece_latency=None if latency is None else round(latency, 3), words=[
                WordTimestampModel(word=w.word, start_time=round(start_s + float(w.start), 3),
                                   end_time=round(start_s + float(w.end), 3), input_start=text.written_at(w.input_start),
                                   input_end=text.written_at(w.input_end)) for w in piece.words]))
        return bool(data)

    async def _stop_speaker(self) -> None:
        """Cancel the speaker (the chunk in flight is its last) and keep the audio stream whole:
        bytes an interrupted encode made still go out, since the next ones continue them."""
        if self.speaker is None:
            return
        self.speaker.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):  # _speak reports its own failures
            await self.speaker
        self.speaker = None
        with contextlib.suppress(Exception):
            data = await self.encoder.interrupted()
            if not self.stalled and WebSocketState.CONNECTED == self.ws.client_state == self.ws.application_state:
                await self._send_audio(data)

    # --- sending --------------------------------------------------------------------------------

    async def _send_audio(self, data: bytes) -> None:
        if data:
            await self._send(self.ws.send_bytes(data))

    async def _send_json(self, event: BaseModel) -> None:
        await self._send(self.ws.send_text(event.model_dump_json()))

    async def _send(self, sending: Awaitable[None]) -> None:
        # One frame at a time, and never cut: a cancelled sender lets its frame finish. A frame the
        # client does not take within the send timeout ends the session (ClientStalled); it stays
        # queued until the connection closes, and every later send fails at once.
        if self.stalled:
            getattr(sending, "close", lambda: None)()  # a coroutine never to be awaited
            raise ClientStalled("the client stopped taking bytes")

        async def locked() -> None:
            async with self.send_lock:
                await sending
        sent = asyncio.ensure_future(locked())
        sent.add_done_callback(lambda task: task.cancelled() or task.exception())  # read below, or by no one
        # asyncio.wait, not wait_for: wait_for (before Python 3.12) drops a cancel that lands as the
        # frame goes out, and a `clear` that cancelled the speaker then let it speak on.
        done, _ = await asyncio.wait({sent}, timeout=self.send_timeout_s or None)
        if not done:  # the frame stays queued and ends with the connection
            self.stalled = True
            raise ClientStalled(f"the client took no bytes for {self.send_timeout_s:g} s "
                                "(KOKORO_SEND_TIMEOUT_SECONDS): ending the session")
        sent.result()

    def _record(self) -> None:
        audio_s = self.samples / SAMPLE_RATE
        status = "disconnected" if self.outcome in ("disconnected", "stalled") else 101
        self.state.metrics.stalls.inc(self.outcome == "stalled")
        self.state.metrics.count_request(LIVE_PATH, status)
        if self.key is not None:
            self.state.metrics.count_key(self.key, status, audio_s)
        access_log.info(json.dumps({
            "id": self.id, "method": "WEBSOCKET", "path": LIVE_PATH, "status": 101, "outcome": self.outcome,
            "voice": self.start.voice_spec, "chars": self.chars, "format": self.start.response_format,
            "pieces": self.pieces,
            "ttfa_ms": None if self.first_audio_s is None else round(self.first_audio_s * 1000, 1),
            "e2e_ms": round((time.perf_counter() - self.opened) * 1000, 1), "audio_s": round(audio_s, 3),
            **({"key": self.key} if self.key is not None else {})}))


# --- the connection's first steps ---------------------------------------------------------------

def _authorization(websocket: WebSocket) -> str:
    """The `Authorization` header, or from a browser, which cannot set headers on a WebSocket, the
    key offered as the subprotocol `openai-insecure-api-key.KEY` (OpenAI's Realtime API convention)."""
    header = websocket.headers.get("authorization", "")
    if header:
        return header
    for protocol in websocket.scope.get("subprotocols", []):
        if protocol.startswith(KEY_SUBPROTOCOL):
            return "Bearer " + protocol[len(KEY_SUBPROTOCOL):]
    return ""


def _chosen_subprotocol(websocket: WebSocket) -> str | None:
    """The subprotocol to answer with: a client that offers any must get one of them back, or the
    browser drops the connection. Prefer one that does not carry the key (`kokoro-live`), so the
    key is not echoed into the response headers."""
    offered = websocket.scope.get("subprotocols", [])
    return next((p for p in offered if not p.startswith(KEY_SUBPROTOCOL)), offered[0] if offered else None)


def _check_upgrade(state: AppState, websocket: WebSocket) -> str | None:
    """The name of the connection's API key, or the error (ApiError, Overloaded) an HTTP request
    would be refused with now (API key, readiness, this process full)."""
    key = state.check_api_key(_authorization(websocket))
    state.require_service()
    state.admission.admit("live_upgrade").release()  # full: the 503 with its Retry-After
    return key


async def _deny(websocket: WebSocket, error: ApiError) -> None:
    """Refuse the upgrade with the HTTP answer (status, OpenAI error body, Retry-After) when the
    server can send one; otherwise accept, say why, and close."""
    if "websocket.http.response" in websocket.scope.get("extensions", {}):
        await websocket.send_denial_response(error.response())
        return
    await websocket.accept(subprotocol=_chosen_subprotocol(websocket))
    await _close(websocket, SessionOver(error, TRY_AGAIN_LATER if error.status == 503 else POLICY_VIOLATION))


async def _read_start(state: AppState, websocket: WebSocket) -> LiveStart | None:
    """The session's `start` message, validated (None: the client left first)."""
    try:
        message = await asyncio.wait_for(websocket.receive(), START_TIMEOUT_S)
    except asyncio.TimeoutError:
        raise SessionOver(bad_request(f"No `start` message within {START_TIMEOUT_S:.0f} s of connecting.",
                                      param="type", code="missing_start"), POLICY_VIOLATION) from None
    if message["type"] == "websocket.disconnect":
        return None
    try:
        data = _json_object(message)
        if data.get("type") != "start":
            raise bad_request('The first message must be {"type": "start", "voice": ..., "response_format": ...}.',
                              param="type", code="missing_start")
        try:
            start = LiveStart.model_validate(data)
        except ValidationError as e:
            raise validation_error(e) from None
        with request_field_errors():  # an unknown voice fails now, not at the first piece
            state.require_service().voices.resolve(start.voice_spec)
    except (ApiError, Overloaded) as e:
        raise SessionOver(as_api_error(e), POLICY_VIOLATION) from None
    return start


def _parse(message: dict, max_chars: int) -> BaseModel:
    data = _json_object(message)
    kind = data.get("type")
    model = _MESSAGES.get(kind) if isinstance(kind, str) else None
    if model is None:
        raise bad_request(f"Unknown message type {kind!r}; send one of {', '.join(map(repr, _MESSAGES))} "
                          "(`start` only once, first).", param="type", code="invalid_type")
    try:
        return model.model_validate(data, context={"max_input_chars": max_chars})
    except ValidationError as e:
        raise validation_error(e) from None


def _json_object(message: dict) -> dict:
    text = message.get("text")
    if text is None:
        raise bad_request("Send JSON text frames; binary frames carry nothing to this endpoint.", param=None,
                          code="invalid_json")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise bad_request(f"The message is not valid JSON: {e.msg} at position {e.pos}.", code="invalid_json") from None
    if not isinstance(data, dict):
        raise bad_request("Send each message as a JSON object with a `type`.", code="invalid_json")
    return data


async def _close(websocket: WebSocket, over: SessionOver) -> None:
    """Say why (an `error` message in OpenAI's shape), then close with the code that fits."""
    with contextlib.suppress(Exception):  # the client may be gone already
        await websocket.send_text(StreamError(error=over.error.detail()).model_dump_json())
        # a close reason is at most 123 bytes of UTF-8
        await websocket.close(over.code, reason=over.error.message.encode()[:120].decode(errors="ignore"))
