"""The local speech service: one speech request, from text to PCM pieces, on this process's replica.

`SpeechService.plan` does everything that can reject a request (voice spec, language, text, the
audio-length limit) before any audio exists, so the API can still answer 400; `SpeechService.stream`
then synthesizes the plan chunk by chunk on this process's replica and yields each piece as soon as
it exists. `admit` (the plan, made in the process's text-frontend thread), `health`, `stats` and
`aclose` complete the contract (api/speech/contract.py); the fleet's service implements the same
contract over the shared queue.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from api.speech.contract import AudioPiece, ReplicaStats, SpeechPlan, SpeechRequest, VoicedRequest, chunk_piece
from api.settings import Settings, get_settings
from worker.text import (Chunk, NormalizationOptions, NothingToSay, TextError, language_loaded, language_problem,
                         load_language, load_lexicon, phonemes_to_chunks, text_to_chunks)
from worker.text.markup import Delivery, split_speech, voice_tags_as_ssml
from worker.text.source_map import MappedText
from worker.voices import Voice, VoiceBank

log = logging.getLogger("kokoro_fleet.api")

# Texts up to this long are planned on the event loop: their text frontend takes about 0.2 ms (a
# 40-character sentence on a 2-core AMD EPYC), less than the hop to the text-frontend thread and
# back costs the loop. Longer texts (a 4,096-character input takes tens of ms) go to the thread.
INLINE_PLAN_CHARS = 200

# Where a chunk's audio comes from: (plan, chunk index, chunk) -> (audio, durations).
ChunkAudio = Callable[[SpeechPlan, int, Chunk], Awaitable[tuple[np.ndarray, np.ndarray]]]


class SpeechService:
    """Turns speech requests into audio pieces on this process's one replica."""

    def __init__(self, replica, voices: VoiceBank, settings: Settings | None = None):
        self.replica = replica
        self.voices = voices
        self.settings = settings or get_settings()
        # The text frontend (normalization, G2P, chunking) of served requests runs here, off the
        # event loop: a long text's milliseconds of planning would otherwise hold every other
        # request's admission, 503 and audio behind it. One thread: the frontend's caches and
        # espeak-ng are then never entered by two requests at once.
        self._text_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="text-frontend")
        self.kernel_compile: asyncio.Task | None = None  # the fused CPU kernels, compiled while serving
        self.kernel_error: str | None = None

    async def warmup(self) -> None:
        """Warm the replica with the kernels it can run at once, and load the text readers of
        KOKORO_PRELOAD_LANGUAGES (English by default) before serving: a language's first request
        would otherwise wait for its reader (English lexicons over half a second, Mandarin's
        dictionary about as long), and loading holds the GIL while every request in flight waits
        for it. A CPU replica's fused kernels compile afterwards, in the background: the server
        speaks (eagerly) in the minutes a cold compile takes on a small CPU."""
        if getattr(self.replica, "kernels_pending", False):
            await self.replica.warmup(compile_kernels=False)
            self.kernel_compile = asyncio.create_task(self._switch_kernels_when_compiled(),
                                                      name="fused-kernel-compile")
        else:
            await self.replica.warmup()
        await asyncio.to_thread(load_lexicon, self.settings.lexicon)  # read now: /health shows it from the start
        for lang_code in self.settings.preload_language_codes():
            await asyncio.to_thread(load_language, lang_code)

    def voiced(self, request: SpeechRequest) -> VoicedRequest:
        """The request's voice, resolved once for the request: its alias (if `voice` is one) replaced
        by what it stands for, and the voice that names (or the error that says what to fix)."""
        alias = request.voice_aliases.get(request.voice.strip().lower())
        if alias is not None:
            request = dataclasses.replace(request, voice=alias[0], speed=request.speed * alias[1])
        return VoicedRequest(request, self.voices.resolution(request.voice), alias[1] if alias else 1.0)

    def voice_for(self, request: SpeechRequest) -> Voice | None:
        """The request's voice (through its aliases); None when the spec names no voice (`plan`
        then refuses it with its message)."""
        voice = self.voiced(request).voice
        return voice if isinstance(voice, Voice) else None

    def plan(self, request: SpeechRequest, voiced: VoicedRequest | None = None) -> SpeechPlan:
        """Validate and prepare a request; raises VoiceError or TextError with a user-facing message.
        `voiced`: the request's voice if the caller resolved it already (`voiced`)."""
        # the plan (and a fleet's jobs) carry what an alias stands for
        voiced = voiced or self.voiced(request)
        request, voice, base_rate = voiced.request, voiced.voice, voiced.alias_rate
        if not isinstance(voice, Voice):
            raise voice
        lang_code = request.lang_code or voice.lang_code
        sizes = {"first_chunk_phonemes": self.settings.first_chunk_phonemes,
                 "chunk_phonemes": self.settings.chunk_phonemes}
        voices: dict[str, Voice] = {}
        problem = None if request.lang_code or request.phonemes else language_problem(lang_code)
        if problem is not None:  # the language came from the voice: the voice is at fault
            raise TextError(f"voice {voice.name}: {problem}; pick another voice or set lang_code", param="voice")
        if request.phonemes:
            chunks = phonemes_to_chunks(request.text, **sizes)
        else:
            chunks = self._text_chunks(request, lang_code, voices, base_rate=base_rate, **sizes)
        if not any(c.ids for c in chunks):
            if request.phonemes:
                raise NothingToSay("phonemes hold nothing to speak", param="phonemes")
            raise NothingToSay("input has nothing to speak: after normalization it holds no pronounceable text")
        plan = SpeechPlan(request, voice, lang_code, chunks, voices)
        limit = self.settings.max_request_audio_seconds
        if limit and plan.estimated_seconds > limit:
            raise TextError(
                f"input would make about {plan.estimated_seconds:.0f} s of audio, more than the {limit:.0f} s "
                "this server allows in one request: split the text into several requests")
        return plan

    def _text_chunks(self, request: SpeechRequest, lang_code: str, voices: dict[str, Voice],
                     first_chunk_phonemes: int, chunk_phonemes: int, base_rate: float = 1.0) -> list[Chunk]:
        """The text's chunks. A part that SSML's `<voice name>` (or a `[voice:...]` tag) gives
        another speaker is read in that voice's language, and its chunks name the voice (resolved
        into `voices`); those of a part inside `<prosody rate>` (or after `[rate:...]`) carry its rate.
        Every word's input span is an offset into `request.text`."""
        options = request.normalization or NormalizationOptions()
        text = MappedText.of(request.text)  # every reader keeps where its words were in the input
        if request.voice_tags:
            text = voice_tags_as_ssml(text, request.voice_aliases, base_rate)
        parts = split_speech(text) if options.reads_markup or request.voice_tags else [(Delivery(), text)]
        lexicon = load_lexicon(self.settings.lexicon)
        chunks: list[Chunk] = []
        for how, text in parts:
            spec, part_lang = how.voice, lang_code
            if spec is not None:
                written = f"[voice:{spec}]" if request.voice_tags else f"<voice name={spec!r}>"
                if spec not in voices:
                    voices[spec] = self.voices.resolve(spec, written_in_input=written)
                part_lang = voices[spec].lang_code
                problem = language_problem(part_lang)
                if problem is not None:
                    raise TextError(f"{written} in the input: voice {voices[spec].name}: {problem}")
            load_language(part_lang)  # once per process; plans_inline sends a first one here off the loop
            part = text_to_chunks(text, part_lang, options, first_chunk_phonemes if not chunks else chunk_phonemes,
                                  chunk_phonemes, lexicon=lexicon)
            chunks += [dataclasses.replace(c, voice=spec, rate=how.rate) for c in part] if how != Delivery() else part
        return chunks

    def plans_inline(self, request: SpeechRequest, voiced: VoicedRequest | None = None) -> bool:
        """A short text costs less to plan (about 0.2 ms) than to hand to the text-frontend thread,
        once its language's reader is loaded: loading one (up to 0.7 s) would stall the event loop.
        `voiced`: the request's voice if the caller resolved it already."""
        lowered = request.text.lower()
        if len(request.text) > INLINE_PLAN_CHARS or "<voice" in lowered or "[voice" in lowered:  # other readers
            return False
        if request.phonemes:
            return True
        voice = (voiced or self.voiced(request)).voice
        if not isinstance(voice, Voice):  # no such voice: plan() refuses it at once
            return not request.lang_code or language_loaded(request.lang_code)
        return language_loaded(request.lang_code or voice.lang_code)

    async def plan_off_loop(self, request: SpeechRequest, voiced: VoicedRequest | None = None,
                            inline: bool | None = None) -> SpeechPlan:
        """`plan` in the text-frontend thread, so the event loop keeps answering meanwhile (a short
        text, cheaper to plan than to hand over, is planned at once). `voiced` and `inline`: the
        caller's `voiced` and `plans_inline` answers, when it has them."""
        voiced = voiced or self.voiced(request)
        if inline if inline is not None else self.plans_inline(request, voiced):
            return self.plan(request, voiced)
        return await asyncio.get_running_loop().run_in_executor(self._text_thread, self.plan, request, voiced)

    async def admit(self, request: SpeechRequest, key: str | None = None) -> SpeechPlan:
        """The request's plan: nothing to reserve beyond the HTTP layer's per-process bound, which
        also holds each API key (`key`) to its share."""
        return await self.plan_off_loop(request)

    async def _switch_kernels_when_compiled(self) -> None:
        """The replica's background compile, and one log line saying how it ended."""
        from api.speech.redis_link import worker_id

        try:
            record = await self.replica.compile_kernels_in_background()
        except Exception as error:  # noqa: BLE001 - whatever broke, the replica serves on eagerly
            self.kernel_error = f"{type(error).__name__}: {error}"
            log.exception("worker %s: fused CPU kernels failed; serving with the eager kernels", worker_id())
            return
        if record is None:
            return
        if record.error is not None:
            self.kernel_error = record.error
            log.warning("worker %s: fused CPU kernels failed after %.1f s (%s); serving with the eager kernels",
                        worker_id(), record.seconds, record.error)
        else:
            log.info("worker %s: fused CPU kernels %s in %.1f s, serving with them", worker_id(),
                     "loaded" if record.loaded else "compiled", record.seconds)

    def health(self) -> dict[str, object]:
        """This service's part of /health: which kernels the replica serves with (`eager` while its
        fused CPU kernels compile, `kernels_compiling` true until they are in service)."""
        kernels = getattr(getattr(self.replica, "engine", None), "kernels", None)
        if kernels is None:  # the simulated engine, or no replica in this worker
            return {}
        return {"kernels": kernels, "kernels_compiling": bool(getattr(self.replica, "kernels_compiling", False)),
                **({"kernels_error": self.kernel_error} if self.kernel_error else {})}

    def stats(self) -> ReplicaStats:
        return ReplicaStats.of(self.replica)

    async def aclose(self) -> None:
        """Stop the text-frontend thread (and a kernel compile's wait); the replica's threads end
        with the process."""
        if self.kernel_compile is not None:
            self.kernel_compile.cancel()
        self._text_thread.shutdown(wait=False)

    async def synthesize_chunk(self, plan: SpeechPlan, index: int, chunk: Chunk) -> tuple[np.ndarray, np.ndarray]:
        """(audio, durations) of one of the plan's chunks, made on this process's replica."""
        style = self.voices.style(plan.voice_of(chunk), len(chunk.ids))
        result = await self.replica.synthesize(chunk.ids, style, plan.speed_of(chunk))
        return result.audio, result.durations

    async def stream(self, plan: SpeechPlan, chunk_audio: ChunkAudio | None = None) -> AsyncIterator[AudioPiece]:
        """Synthesize the plan chunk by chunk; each piece leaves as soon as it exists. `chunk_audio`
        (default: `synthesize_chunk`) is where a chunk's audio comes from: the fleet's service reads
        it from the shared queue's results through this same loop.

        Cancelling the consumer (a client that disconnects) stops after the chunk in flight: the
        replica finishes that one inference and takes no more of this request.
        """
        chunk_audio = chunk_audio or self.synthesize_chunk
        offset_s = 0.0
        last = len(plan.chunks) - 1
        for index, chunk in enumerate(plan.chunks):
            audio = durations = None
            if chunk.ids:
                audio, durations = await chunk_audio(plan, index, chunk)
            piece = chunk_piece(chunk, index, index == last, offset_s, audio, durations)
            offset_s += piece.seconds
            yield piece
