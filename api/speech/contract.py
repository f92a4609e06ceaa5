"""The speech service's contract: what the HTTP layer holds (`SpeechBackend`), what it passes in
(`SpeechRequest`) and gets back (`SpeechPlan`, then `AudioPiece` by `AudioPiece`), and the plain
domain errors a full service raises (`Overloaded`, `KeyShareFull`; api/errors.py maps them to
statuses and headers). Two services implement it: `api.speech.local.SpeechService` (this process's
one replica) and `api.speech.fleet.FleetSpeechService` (the shared queue, the local one as fallback).

    plan = await backend.admit(request)   # Overloaded / KeyShareFull when full; TextError, VoiceError
    async for piece in backend.stream(plan): ...   # AudioPiece by AudioPiece, in order

`admit` decides on capacity first and plans after (text and voice checks, normalization, G2P,
chunking, off the event loop), so a full service refuses a request without planning it.
`plan(request)` is the same planning, synchronous, for callers without a server (`say`, tests).
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from worker.audio import SAMPLE_RATE, SECONDS_PER_PHONEME
from worker.text import Chunk, NormalizationOptions
from worker.timestamps import WordTimestamp, word_timestamps
from worker.voices import Voice, VoiceBank

# Chunks are synthesized independently, so their edges need not meet at zero. A short raised-cosine
# fade at each edge makes every join continuous (no click) without audibly touching speech: Kokoro
# starts and ends each chunk on the pad token's near-silence anyway.
EDGE_FADE_SAMPLES = 96  # 4 ms at 24 kHz
# The speaking rates a request may ask for (the API's bounds); a <prosody rate> stays within them.
MIN_SPEED, MAX_SPEED = 0.25, 4.0


@dataclass(frozen=True)
class SpeechRequest:
    text: str
    voice: str = "af_heart"
    speed: float = 1.0
    lang_code: str | None = None  # None: follow the voice's language
    normalization: NormalizationOptions | None = None
    phonemes: bool = False  # `text` holds Kokoro phonemes to speak as given (no normalization, no G2P)
    voice_tags: bool = False  # read Kokoro-FastAPI's `[voice:...]` and `[rate:...]` tags (markup.voice_tags_as_ssml)
    # Short names for voices in this request (`voice` and voice tags): lowercase name -> (spec, its own pace).
    voice_aliases: dict[str, tuple[str, float]] = field(default_factory=dict, hash=False)


@dataclass(frozen=True)
class VoicedRequest:
    """A request with its voice resolved, once (`SpeechService.voiced`): `request` with its alias
    replaced by what it stands for (its speed times the alias's pace, `alias_rate`), and `voice`, the
    voice that names, or the VoiceError that says what to fix (raised when the request is planned)."""

    request: SpeechRequest
    voice: Voice | Exception
    alias_rate: float = 1.0


@dataclass
class SpeechPlan:
    request: SpeechRequest
    voice: Voice
    lang_code: str
    chunks: list[Chunk]
    voices: dict[str, Voice] = field(default_factory=dict)  # those SSML's <voice name> gave parts of the text

    def voice_of(self, chunk: Chunk) -> Voice:
        """The voice that reads `chunk`: the request's, or the one a <voice> element named."""
        return self.voices[chunk.voice] if chunk.voice else self.voice

    def voice_spec_of(self, chunk: Chunk) -> str:
        """The voice of `chunk` as the request wrote it (for captions)."""
        return chunk.voice or self.request.voice

    def speed_of(self, chunk: Chunk) -> float:
        """The request's speed, times a <prosody rate> around the chunk, within the model's range."""
        return min(MAX_SPEED, max(MIN_SPEED, self.request.speed * chunk.rate))

    @property
    def phoneme_count(self) -> int:
        return sum(len(c.ids) for c in self.chunks)

    @property
    def estimated_seconds(self) -> float:
        """Audio length expected before any synthesis: phonemes at the usual rate, plus pauses."""
        speech = sum(len(c.ids) * SECONDS_PER_PHONEME / self.speed_of(c) for c in self.chunks)
        return speech + sum(c.pause_after for c in self.chunks)


class CountingReplica(Protocol):
    """The figures every replica keeps (the model's, the baseline's, the simulated one, a
    fleet's lease loop), read for /metrics and the Retry-After estimate."""

    busy: bool
    jobs_done: int
    busy_seconds: float   # wall seconds spent running inferences
    audio_seconds: float  # audio those inferences made


@dataclass(frozen=True)
class ReplicaStats:
    """What this process's replica has done so far, for /metrics and the Retry-After estimate."""

    busy: bool
    jobs_done: int
    busy_seconds: float
    audio_seconds: float
    cache_hits: int = 0              # chunks served from the replica's SynthesisCache, not computed
    cache_audio_seconds: float = 0.0  # their audio
    cache_bytes: int = 0             # the cache's size now

    @classmethod
    def of(cls, replica: CountingReplica) -> "ReplicaStats":
        cache = getattr(replica, "cache", None)  # only the model's Replica keeps one
        return cls(bool(replica.busy), int(replica.jobs_done), float(replica.busy_seconds),
                   float(replica.audio_seconds),
                   *((cache.hits, cache.hit_audio_seconds, cache.bytes) if cache is not None else ()))

    @property
    def seconds_per_audio_second(self) -> float | None:
        """Replica seconds one audio second costs, as measured (None before the first job)."""
        return self.busy_seconds / self.audio_seconds if self.audio_seconds > 0 else None


@dataclass
class AudioPiece:
    pcm: np.ndarray  # float32 [samples], 24 kHz mono, edges faded, pause silence appended
    words: list[WordTimestamp] = field(default_factory=list)  # absolute seconds from the request's start
    index: int = 0
    is_last: bool = False

    @property
    def seconds(self) -> float:
        return len(self.pcm) / SAMPLE_RATE


def _raised_cosine(n: int) -> np.ndarray:
    return (0.5 - 0.5 * np.cos(np.linspace(0.0, np.pi, n))).astype(np.float32)


_FADE_IN = _raised_cosine(EDGE_FADE_SAMPLES)


def fade_edges(audio: np.ndarray) -> np.ndarray:
    """A copy of `audio` whose first and last few milliseconds ramp from and to zero."""
    out = np.asarray(audio, dtype=np.float32).copy()
    n = min(EDGE_FADE_SAMPLES, len(out) // 2)
    if n:
        ramp = _FADE_IN if n == EDGE_FADE_SAMPLES else _raised_cosine(n)
        out[:n] *= ramp
        out[-n:] *= ramp[::-1]
    return out


def chunk_piece(chunk: Chunk, index: int, is_last: bool, offset_s: float, audio: np.ndarray | None = None,
                durations: Sequence[int] | np.ndarray | None = None) -> AudioPiece:
    """The piece a chunk's synthesis makes (None for a chunk with nothing to say): the audio with
    its edges faded, its words timed from `offset_s` (where the piece starts in the request), and
    the chunk's pause as silence after it."""
    pcm = np.zeros(0, dtype=np.float32)
    words: list[WordTimestamp] = []
    if audio is not None:
        pcm = fade_edges(audio)
        words = word_timestamps(chunk, durations, offset_s)
    if chunk.pause_after > 0:
        pcm = np.concatenate([pcm, np.zeros(round(chunk.pause_after * SAMPLE_RATE), np.float32)])
    return AudioPiece(pcm, words, index, is_last)


def key_bound(share: float, max_requests: int) -> int:
    """The most requests one API key may hold at once: `share` (KOKORO_KEY_MAX_SHARE) of a bound
    of `max_requests`, at least one; 0 (no per-key bound) when the share is whole or the bound is none."""
    if share >= 1 or max_requests <= 0:
        return 0
    return max(1, math.floor(share * max_requests))


class Overloaded(Exception):
    """No capacity now: come back in `retry_after_s`."""

    def __init__(self, retry_after_s: float, message: str | None = None):
        self.retry_after_s = max(0.001, retry_after_s)
        super().__init__(message or f"The server is at capacity; retry in {self.retry_after_s:.1f} s.")

    @property
    def retry_after_ms(self) -> int:
        return max(1, round(self.retry_after_s * 1000))


class KeyShareFull(Overloaded):
    """The request's API key holds its share of the server (KOKORO_KEY_MAX_SHARE) while other
    keys are still admitted."""


class SpeechBackend(Protocol):
    voices: VoiceBank

    def plan(self, request: SpeechRequest) -> SpeechPlan:
        """Validate and prepare; raises TextError or VoiceError (a ValueError with `param`)."""

    async def admit(self, request: SpeechRequest, key: str | None = None) -> SpeechPlan:
        """Reserve what the service needs (or raise Overloaded; KeyShareFull when `key`, the API
        key's name, holds its share), then plan the request off the event loop (TextError or
        VoiceError, after giving the reservation back)."""

    def stream(self, plan: SpeechPlan) -> AsyncIterator[AudioPiece]:
        """The admitted plan's pieces in order; closing the iterator early frees what it held."""

    def health(self) -> dict[str, Any]:
        """The service's part of /health (the fleet: mode and dispatch)."""

    def stats(self) -> ReplicaStats:
        """This process's replica's figures, for /metrics and Retry-After."""

    async def aclose(self) -> None:
        """Stop background work (the fleet: dispatcher, heartbeats, Redis clients)."""
