"""Serving one speech request: from the HTTP request to a stream of encoded bytes.

A request is read and validated (api.protocol, api.errors), given a slot in this process's bound
(api.admission), admitted by the speech service (the fleet's bound first, then its plan: text and
voice checks and the audio-length limit, still able to answer 400), then streamed: each audio
piece the service yields goes through the response's one encoder (api.encoders; PyAV's codecs in
the process's encode thread pool, so the event loop keeps serving other streams meanwhile), and
leaves at once as raw audio, SSE events or NDJSON captions. A request with
`return_download_link` also fills a download file (api.downloads) through a second encoder,
saved before the response's last bytes leave. However the response ends (done, failed, client
gone) the slot is released and the synthesis stops after the chunk in flight.

    await speech_response(state, request)      # POST /v1/audio/speech
    await captioned_response(state, request)   # POST /v1/audio/speech/captioned
    await speech_response(state, request, phonemes=True)   # POST /dev/generate_from_phonemes
    await phonemize_response(state, request)   # POST /dev/phonemize (no synthesis)
    await combined_voice_response(state, request)   # POST /v1/audio/voices/combine (a .pt file)
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import re
from collections.abc import AsyncIterator, Callable
from concurrent.futures import Executor
from dataclasses import dataclass

import numpy as np
from fastapi import Request
from fastapi.responses import JSONResponse, Response
from pydantic import ValidationError

from api.admission import ProcessSlot
from api.downloads import DownloadFile
from api.encoders import CONTENT_TYPES, Encoder, make_encoder
from api.errors import (bad_request, internal_error, read_json, read_json_object, request_field_errors,
                        validation_error)
from api.protocol import (CaptionedSpeechRequest, CaptionedSpeechResponse, DialogueRequest, PhonemeSpeechRequest,
                          PhonemizeChunk, PhonemizeRequest, PhonemizeResponse, SpeechAudioDelta, SpeechAudioDone,
                          SpeechRequestBody, SpeechUsage, StreamError, WordTimestampModel)
from api.speech.contract import AudioPiece, SpeechBackend, SpeechPlan
from api.state import AppState
from api.subtitles import CaptionFile
from api.transport import DisconnectAwareStreamingResponse, RequestInfo
from worker.audio import SAMPLE_RATE, SAMPLES_PER_FRAME

log = logging.getLogger("kokoro_fleet.api")

# Written on the event loop: a few numpy operations per piece, cheaper than a hop to a pool thread
# (G.711's table lookup and a resampler to another rate add about 0.1 ms of CPU per audio-second).
# The other formats go through PyAV's codecs (LAME, Opus, AAC, FLAC), in the encode pool.
INLINE_FORMATS = ("pcm", "wav", "mulaw", "alaw")
# nginx's "client closed request": what the log shows for a non-streamed request whose client left
# (nobody receives it).
CLIENT_CLOSED_REQUEST = 499


async def speech_response(state: AppState, request: Request, phonemes: bool = False,
                          dialogue: bool = False) -> Response:
    """Chunked audio, SSE events, or (`stream: false`) one body. phonemes: the body is a
    `PhonemeSpeechRequest` (POST /dev/generate_from_phonemes), spoken as given; dialogue: a
    `DialogueRequest` (POST /dev/dialogue), its turns spoken as one request with voice tags."""
    job = await _prepare(request, state, phonemes, dialogue=dialogue)
    req = job.req
    if req.stream_format == "sse":
        return DisconnectAwareStreamingResponse(
            _sse_events(state, job), media_type="text/event-stream", send_timeout_s=state.settings.send_timeout_seconds,
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no", **job.headers()})
    if req.stream:
        return DisconnectAwareStreamingResponse(
            _audio_bytes(state, job, request), media_type=CONTENT_TYPES[req.response_format],
            send_timeout_s=state.settings.send_timeout_seconds, headers={"X-Accel-Buffering": "no", **job.headers()})
    try:
        body = b"".join([b async for b in _audio_bytes(state, job, request, streamed=False)])
    except ClientGone:
        return Response(status_code=CLIENT_CLOSED_REQUEST)
    return Response(body, media_type=CONTENT_TYPES[req.response_format], headers=job.headers())


async def captioned_response(state: AppState, request: Request) -> Response:
    """Audio and per-word timestamps: one JSON body, or NDJSON lines when streamed."""
    job = await _prepare(request, state, captioned=True)
    req = job.req
    if req.stream:
        return DisconnectAwareStreamingResponse(_caption_lines(state, job), media_type="application/x-ndjson",
                                                send_timeout_s=state.settings.send_timeout_seconds,
                                                headers=job.headers())
    audio = bytearray()
    words: list[WordTimestampModel] = []
    captions, parts = _caption_file(req), []
    try:
        async for data, piece in _encoded(state, job, request, streamed=False):
            audio += data
            parts.append(_next_captions(captions, piece))
            if piece is not None:
                words += _word_models(job, piece)
    except ClientGone:
        return Response(status_code=CLIENT_CLOSED_REQUEST)
    return JSONResponse(CaptionedSpeechResponse(
        audio=base64.b64encode(bytes(audio)).decode(), audio_format=req.response_format, timestamps=words,
        captions="".join(parts) if captions is not None else None,
    ).model_dump(), headers=job.headers())


async def phonemize_response(state: AppState, request: Request) -> PhonemizeResponse:
    """The phonemes and model ids the server would speak for a text, from the text frontend alone."""
    data = await read_json_object(request, state.settings.max_body_bytes)
    try:
        req = PhonemizeRequest.model_validate(data, context={"max_input_chars": state.settings.max_input_chars})
    except ValidationError as e:
        raise validation_error(e) from None
    from worker.text import load_lexicon, text_to_chunks

    with request_field_errors(input="text", lang_code="language"):
        chunks = await asyncio.to_thread(text_to_chunks, req.text, req.language, req.normalization(),
                                         state.settings.first_chunk_phonemes, state.settings.chunk_phonemes,
                                         load_lexicon(state.settings.lexicon))
    return PhonemizeResponse(phonemes=" ".join(c.phonemes for c in chunks if c.phonemes),
                             tokens=[i for c in chunks for i in c.ids],
                             chunks=[PhonemizeChunk(text=c.text, phonemes=c.phonemes)
                                     for c in chunks if c.phonemes])


async def combined_voice_response(state: AppState, request: Request) -> Response:
    """Kokoro-FastAPI's voice combination: a mix (a JSON string such as "af_bella(2)+af_sky(1)",
    a list of names, or either under "voices") as a .pt file in the official voice layout
    [510, 1, 256] float32, which the voices directory (KOKORO_VOICES_DIR) then serves by its name."""
    data = await read_json(request, state.settings.max_body_bytes)
    if isinstance(data, dict) and set(data) == {"voices"}:
        data = data["voices"]
    if isinstance(data, list) and data and all(isinstance(v, str) for v in data):
        spec = "+".join(v.strip() for v in data)
    elif isinstance(data, str):
        spec = data
    else:
        raise bad_request('Send the voices to combine as a JSON string such as "af_bella(2)+af_sky(1)", or a '
                          'list of names such as ["af_bella", "af_sky"].', param="voices", code="invalid_voice")
    from worker.voices import voice_file

    with request_field_errors(voice="voices"):
        voice = state.require_service().voices.resolve(spec)
    filename = re.sub(r"[^A-Za-z0-9_.()+-]", "", voice.name) + ".pt"
    return Response(voice_file(voice), media_type="application/octet-stream",
                    headers={"Content-Disposition": f'attachment; filename="{filename}"'})


# --- admission and planning ---------------------------------------------------------------------

@dataclass
class AdmittedRequest:
    """A validated speech request and what admission gave it: the plan to stream, this process's
    slot, the request's log record, and the download file it fills (`return_download_link`)."""

    req: SpeechRequestBody
    plan: SpeechPlan
    slot: ProcessSlot
    info: RequestInfo
    download: DownloadFile | None = None

    def headers(self) -> dict[str, str]:
        return {"X-Download-Path": self.download.link} if self.download is not None else {}


async def _prepare(request: Request, state: AppState, phonemes: bool = False,
                   captioned: bool = False, dialogue: bool = False) -> AdmittedRequest:
    """Read, validate, admit and plan; every refusal here is a clean 4xx/5xx before any audio."""
    info: RequestInfo = request.state.info
    data = await read_json_object(request, state.settings.max_body_bytes)
    context = {"max_input_chars": state.settings.max_input_chars}
    try:
        if phonemes:
            req = PhonemeSpeechRequest.model_validate(data, context=context).as_speech_request()
        elif dialogue:
            req = _dialogue_as_speech(DialogueRequest.model_validate(data, context=context), context)
        else:
            req = (CaptionedSpeechRequest if captioned else SpeechRequestBody).model_validate(data, context=context)
    except ValidationError as e:
        _note_refused_body(info, data, phonemes)
        raise validation_error(e) from None
    info.voice, info.chars, info.format, info.stream = req.voice_spec, len(req.input), req.response_format, req.stream
    service = state.require_service()
    slot = state.admission.admit(info.id, key=info.key)
    download = None
    try:
        if req.return_download_link:  # off the loop: creating one first clears expired files
            download = await state.downloads.start(req.download_format or req.response_format)
        # the fleet: a place in the shared queue, or 503 (429: the key's share)
        plan = await service.admit(req.speech_request(req.input, phonemes), key=info.key)
    except BaseException:
        slot.release()
        if download is not None:
            download.discard()
        raise
    return AdmittedRequest(req, plan, slot, info, download)


def _note_refused_body(info: RequestInfo, data: dict, phonemes: bool) -> None:
    """What a body that failed validation asked for, best effort, so the access log still shows it."""
    text_field, default_format = ("phonemes", "wav") if phonemes else ("input", "mp3")
    info.voice = data.get("voice") if isinstance(data.get("voice"), str) else None
    info.chars = len(data[text_field]) if isinstance(data.get(text_field), str) else None
    fmt = data.get("response_format", default_format)
    info.format = fmt if isinstance(fmt, str) else None


def _dialogue_as_speech(dialogue: DialogueRequest, context: dict) -> SpeechRequestBody:
    """The dialogue as one speech request; a 400 on `turns` when, joined with their voice tags and
    pauses, they exceed the input limit."""
    try:
        return dialogue.as_speech_request(context)
    except ValidationError as e:
        if any(err["loc"] == ("input",) for err in e.errors()):
            _, text = dialogue.speech_input()
            raise bad_request(f"the turns come to {len(text)} characters with their voice tags and pauses; the "
                              f"limit is {context['max_input_chars']}. Split the dialogue into several requests",
                              param="turns") from None
        raise


def release_slot(slot: ProcessSlot, service: SpeechBackend, audio_s: float) -> None:
    """Give the slot back, with the replica time its audio cost (the Retry-After estimate learns from it)."""
    cost = service.stats().seconds_per_audio_second
    slot.release(service_seconds=audio_s * cost if cost and audio_s > 0 else None)


# --- the stream of encoded bytes ----------------------------------------------------------------

class ClientGone(Exception):
    """The client of a non-streamed request disconnected before its body was ready."""


class PooledEncoder:
    """A response's encoder run in the process's encode pool (or inline when `pool` is None), one
    call at a time.

    A call whose awaiting task is cancelled (client gone) still runs to its end in its thread; the
    codec is closed only after that, never under a running encode."""

    def __init__(self, encoder: Encoder, pool: Executor | None):
        self.encoder = encoder
        self.pool = pool
        self.finished = False
        self._running: asyncio.Future | None = None

    async def encode(self, pcm: np.ndarray) -> bytes:
        return await self._run(self.encoder.encode, pcm)

    async def finish(self) -> bytes:
        if self.finished:
            return b""
        self.finished = True
        return await self._run(self.encoder.finish)

    async def encode_last(self, pcm: np.ndarray) -> bytes:
        """The last piece and the flush in one call: one trip to the pool instead of two (a
        one-chunk request, the commonest, then costs a single hop); `finish` then has nothing left."""
        self.finished = True
        return await self._run(self._encode_and_finish, pcm)

    def _encode_and_finish(self, pcm: np.ndarray) -> bytes:
        return self.encoder.encode(pcm) + self.encoder.finish()

    async def _run(self, call: Callable[..., bytes], *args) -> bytes:
        if self.pool is None:
            return call(*args)
        self._running = asyncio.get_running_loop().run_in_executor(self.pool, call, *args)
        data = await asyncio.shield(self._running)
        self._running = None
        return data

    async def interrupted(self) -> bytes:
        """The bytes of the call whose awaiting task was cancelled (b"" if none): the stream's next
        bytes, which a stream that goes on after the cancellation (a live session) still sends.
        Call it before the next encode, which must not run beside that one."""
        running, self._running = self._running, None
        return await running if running is not None else b""

    def close(self) -> None:
        if self._running is not None and not self._running.done():
            self._running.add_done_callback(lambda _: self.encoder.close())
        else:
            self.encoder.close()


async def _encoded(state: AppState, job: AdmittedRequest, request: Request | None,
                   streamed: bool = True) -> AsyncIterator[tuple[bytes, AudioPiece | None]]:
    """The response's bytes, with the piece they came from: (bytes, piece) per synthesized piece,
    then (tail, None) once the encoder is flushed. Owns the request's life: releases its slot,
    counts its audio, saves its download file, and notes how it ended, whether it finishes, fails
    or is cancelled."""
    service = state.require_service()
    req, info = job.req, job.info
    encoder = pooled_encoder(state, req.response_format, streamed, req.volume_multiplier, req.sample_rate)
    # The download file has its own encoder, not streamed: its headers then hold the real length
    # (a streamed WAV's cannot), and its format may differ from the response's.
    copy = (pooled_encoder(state, req.download_format or req.response_format, False, req.volume_multiplier,
                           req.sample_rate)
            if job.download is not None else None)
    saved = bytearray()  # the download file's bytes
    samples = 0
    finished = False
    try:
        async with contextlib.aclosing(service.stream(job.plan)) as pieces:
            async for piece in pieces:
                samples += len(piece.pcm)
                data = await (encoder.encode_last(piece.pcm) if piece.is_last else encoder.encode(piece.pcm))
                if copy is not None:
                    saved += await copy.encode(piece.pcm)
                if data:
                    info.first_audio()
                yield data, piece
                # Non-streamed bodies never touch the network until the end, so nothing cancels
                # them when the client leaves: look between chunks instead.
                if request is not None and not streamed and await request.is_disconnected():
                    raise ClientGone()
        tail = await encoder.finish()
        if tail:
            info.first_audio()
        if copy is not None:  # saved before the response's last bytes leave: once a client has
            saved += await copy.finish()  # the whole body, its link works
            await job.download.finish(bytes(saved))
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
        if copy is not None:
            copy.close()
            if not finished:
                job.download.discard()
        info.audio_s = samples / SAMPLE_RATE
        if not finished and info.outcome == "ok":
            info.outcome = "disconnected"
        state.metrics.audio_seconds.inc(info.audio_s)
        release_slot(job.slot, service, info.audio_s)


def pooled_encoder(state: AppState, fmt: str, streamed: bool, volume: float, sample_rate: int | None) -> PooledEncoder:
    """A response's encoder, on the event loop for the cheap formats, else in the encode pool."""
    encoder = make_encoder(fmt, streamed=streamed, volume=volume, sample_rate=sample_rate)
    return PooledEncoder(encoder, None if fmt in INLINE_FORMATS else state.encoders)


async def _audio_bytes(state: AppState, job: AdmittedRequest, request: Request,
                       streamed: bool = True) -> AsyncIterator[bytes]:
    async with contextlib.aclosing(_encoded(state, job, request, streamed)) as pieces:
        async for data, _ in pieces:
            if data:
                yield data


async def _sse_events(state: AppState, job: AdmittedRequest) -> AsyncIterator[bytes]:
    """OpenAI's speech SSE stream: audio deltas (base64 of the encoded file's next bytes), then
    `speech.audio.done` with usage; an `error` event instead if synthesis fails midway."""
    samples = 0
    try:
        async with contextlib.aclosing(_encoded(state, job, None)) as pieces:
            async for data, piece in pieces:
                if piece is not None:
                    samples += len(piece.pcm)
                if data:
                    yield _sse(SpeechAudioDelta(audio=base64.b64encode(data).decode()))
    except Exception:
        log.exception("synthesis failed midway through request %s", job.info.id)
        yield _sse(StreamError(error=internal_error().detail()))
        return
    phonemes = job.plan.phoneme_count
    frames = round(samples / SAMPLES_PER_FRAME)  # one duration frame is the unit of "output tokens"
    yield _sse(SpeechAudioDone(usage=SpeechUsage(input_tokens=phonemes, output_tokens=frames, total_tokens=phonemes + frames)))


def _sse(event) -> bytes:
    return b"data: " + event.model_dump_json().encode() + b"\n\n"


async def _caption_lines(state: AppState, job: AdmittedRequest) -> AsyncIterator[bytes]:
    """NDJSON: one CaptionedSpeechResponse per piece (its bytes of the one encoded file and its
    words, in absolute seconds, and with `caption_format` srt or vtt the cues that became final);
    the last line carries the encoder's tail and the last cues."""
    captions = _caption_file(job.req)
    try:
        async with contextlib.aclosing(_encoded(state, job, None)) as pieces:
            async for data, piece in pieces:
                cues = _next_captions(captions, piece)
                if not data and piece is None and not cues:
                    continue
                words = _word_models(job, piece) if piece is not None else []
                line = CaptionedSpeechResponse(audio=base64.b64encode(data).decode(),
                                               audio_format=job.req.response_format, timestamps=words,
                                               captions=cues)
                yield line.model_dump_json().encode() + b"\n"
    except Exception:
        log.exception("synthesis failed midway through request %s", job.info.id)
        yield json.dumps(StreamError(error=internal_error().detail()).model_dump()).encode() + b"\n"


def _word_models(job: AdmittedRequest, piece: AudioPiece) -> list[WordTimestampModel]:
    if not job.req.captions()[0]:  # a captioned request's return_timestamps
        return []
    voice = job.plan.voice_spec_of(job.plan.chunks[piece.index]) if job.req.allow_voice_tags else None
    return [WordTimestampModel(word=w.word, start_time=round(float(w.start), 3), end_time=round(float(w.end), 3),
                               input_start=w.input_start, input_end=w.input_end, voice=voice) for w in piece.words]


def _caption_file(req: SpeechRequestBody) -> CaptionFile | None:
    """The subtitle file a captioned request asks for (`caption_format` srt or vtt), else None."""
    fmt = req.captions()[1]
    return CaptionFile(fmt, req.input) if fmt != "json" else None


def _next_captions(captions: CaptionFile | None, piece: AudioPiece | None) -> str | None:
    """The subtitle file's next part: the cues `piece` made final, or (None: the audio has ended) the rest."""
    if captions is None:
        return None
    return captions.add(piece.words, piece.seconds) if piece is not None else captions.finish()
