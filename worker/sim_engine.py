"""The simulated engine (`KOKORO_ENGINE=sim`): replicas that take as long as a GPU would and use no
CPU while they "compute", so the fleet around them (HTTP, admission, text, Redis, encoders,
timestamps, streaming) can be measured at GPU rates on a CPU box.

Never chosen automatically: only `KOKORO_ENGINE=sim` builds it, and a simulated server says so on
every surface (startup log, /health, /ready, /metrics, `kokoro-fleet status`, the `X-Kokoro-Engine`
response header).

Cost model, per chunk of n phonemes: t = a + b * n, awaited with `asyncio.sleep` (the event loop
and the CPU are free meanwhile). a = KOKORO_SIM_CHUNK_MS, b = KOKORO_SIM_PHONEME_MS.
The defaults are a real replica's cost on a GPU shared by eight replicas (a = 34 ms, b = 0.93 ms),
not one alone (a = 6.3, b = 0.174): eight simulated replicas, which are independent, then make
what eight real ones sharing a GPU made, and a lightly loaded simulation's first chunks come later
than a real idle GPU's. The measurements: loadtest/README.md, "Figures behind the code's choices".

Batch rule (`synthesize_batch`): one batched forward pass pads every item to the longest, so a
batch of k items of at most m phonemes costs a + b * k * m (the per-call overhead once, the
per-phoneme work for every padded row); all its results come back together at the end.

Audio: realistic length, deterministic and nearly free. Each token gets a fixed number of 25 ms
frames by its kind (`FRAMES_PER_TOKEN`: pads, spaces, punctuation, other phonemes), divided by the
speed, so a chunk's length is about what the real model gives for those phonemes (the table was
chosen to match SECONDS_PER_PHONEME, about 13 phonemes a second at speed 1, then scaled by one
factor, LENGTH_SCALE, so the total matches the real model's on the sample texts; not fitted per
token, so single chunks still differ by up to a third). The samples are
slices of one speech-like waveform computed once per process (a harmonic tone with a moving pitch
and a syllable-rate envelope, plus a little noise), so encoders compress something like speech and
a chunk costs one array copy. Voices are names over constant style rows: the simulation ignores
the style, and nothing is read from disk.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

from worker.audio import SAMPLE_RATE, SAMPLES_PER_FRAME
from worker.engine import BatchItem, Synthesis
from worker.replica import run_to_completion
from worker.audio import SECONDS_PER_PHONEME

# Frames (25 ms) per token at speed 1, by kind: about 3 frames (75 ms) a token over an English
# sentence, as SECONDS_PER_PHONEME assumes; a clause's punctuation holds a pause.
FRAMES_PER_TOKEN = {"start_pad": 2, "end_pad": 6, "space": 2, "pause": 8, "phoneme": 3}
# The table alone makes more audio than the real model over the sample texts: every token is
# scaled by this so the totals agree (measured: loadtest/README.md).
LENGTH_SCALE = 1 / 1.165
PAUSE_IDS = frozenset({1, 2, 3, 4, 5, 6, 9, 10})  # ; : , . ! ? — …
SPACE_ID = 16
_LONG_WAVEFORM_S = 30.0  # the cached waveform; chunks are slices of it, wrapped around
STYLE_WIDTH = 256
# The wait itself: the event loop's timer, no thread and no CPU (tests record it instead).
_wait = asyncio.sleep


@dataclass(frozen=True)
class SimCost:
    """t = chunk_ms + phoneme_ms * phonemes, per chunk (ms)."""

    chunk_ms: float = 34.0
    phoneme_ms: float = 0.93

    def seconds(self, phonemes: int) -> float:
        return (self.chunk_ms + self.phoneme_ms * phonemes) / 1000

    def batch_seconds(self, sizes: Sequence[int]) -> float:
        """One padded batched pass: the overhead once, every row as long as the longest."""
        if not sizes:
            return 0.0
        return (self.chunk_ms + self.phoneme_ms * len(sizes) * max(sizes)) / 1000

    def describe(self) -> dict[str, float]:
        return {"chunk_ms": self.chunk_ms, "phoneme_ms": self.phoneme_ms}


def token_frames(ids: Sequence[int], speed: float = 1.0) -> np.ndarray:
    """int64 [len(ids) + 2]: frames per token, pads included, as the real model's durations are."""
    kinds = [FRAMES_PER_TOKEN["start_pad"]]
    for i in ids:
        kinds.append(FRAMES_PER_TOKEN["pause"] if i in PAUSE_IDS else
                     FRAMES_PER_TOKEN["space"] if i == SPACE_ID else FRAMES_PER_TOKEN["phoneme"])
    kinds.append(FRAMES_PER_TOKEN["end_pad"])
    # Rounded on the running total, so the chunk's length is its frames / speed whatever the speed
    # (token by token, 3 / 2 frames would round up everywhere); each token at least one frame, as
    # the real predictor's clamp gives.
    ends = np.round(np.cumsum(np.asarray(kinds, dtype=np.float64) * LENGTH_SCALE / speed))
    return np.maximum(1, np.diff(ends, prepend=0.0)).astype(np.int64)


def speech_like_waveform(seconds: float = _LONG_WAVEFORM_S, seed: int = 0) -> np.ndarray:
    """float32 [seconds * 24 kHz]: harmonics of a pitch gliding 100-220 Hz, amplitude-modulated at
    syllable rate (about 4 Hz), plus quiet noise; peak about 0.5. Deterministic for a seed."""
    n = int(seconds * SAMPLE_RATE)
    t = np.arange(n, dtype=np.float64) / SAMPLE_RATE
    pitch = 160 + 60 * np.sin(2 * np.pi * 0.7 * t) * np.sin(2 * np.pi * 0.13 * t + 1.0)
    phase = 2 * np.pi * np.cumsum(pitch) / SAMPLE_RATE
    voiced = sum(np.sin(k * phase) / k for k in range(1, 9))
    envelope = np.clip(np.sin(2 * np.pi * 4.1 * t) * 0.6 + 0.4, 0.0, None)
    rng = np.random.default_rng(seed)
    wave = 0.25 * voiced * envelope + 0.01 * rng.standard_normal(n)
    return (0.5 * wave / np.max(np.abs(wave))).astype(np.float32)


class SimEngine:
    """Synthesis without a model: a Synthesis of the length and durations the cost model's chunk
    would have, made from the cached waveform. Runs on the caller's thread in microseconds."""

    sample_rate = SAMPLE_RATE
    frame_samples = SAMPLES_PER_FRAME
    max_phonemes = 510
    label = "sim"  # the replica table's engine column: never mistaken for a model
    kernels = "simulated"  # no kernels to compile: what Engine.kernels says of a model's

    def __init__(self, seed: int = 0):
        self.waveform = speech_like_waveform(seed=seed)

    def synthesize(self, ids: Sequence[int], style: torch.Tensor | None = None, speed: float = 1.0) -> Synthesis:
        if len(ids) > self.max_phonemes:
            raise ValueError(f"{len(ids)} phonemes in one chunk; at most {self.max_phonemes}")
        if not speed > 0:
            raise ValueError(f"speed must be positive, got {speed}")
        durations = token_frames(ids, speed)
        samples = int(durations.sum()) * SAMPLES_PER_FRAME
        # Start somewhere that depends on the chunk, so consecutive chunks do not repeat each other.
        start = (sum(ids) * 7919) % len(self.waveform)
        audio = _wrapped_slice(self.waveform, start, samples)
        return Synthesis(audio=audio, durations=durations)


def _wrapped_slice(wave: np.ndarray, start: int, samples: int) -> np.ndarray:
    """A copy of `samples` samples of `wave` from `start`, wrapping around its end."""
    if start + samples <= len(wave):
        return wave[start:start + samples].copy()
    parts, left = [wave[start:]], samples - (len(wave) - start)
    while left > 0:
        parts.append(wave[:min(left, len(wave))])
        left -= len(parts[-1])
    return np.concatenate(parts)


class SimReplica:
    """worker.replica.Replica's interface over the cost model: one job at a time (FIFO), each
    holding the replica for the cost model's time in `asyncio.sleep`, no thread, no CPU."""

    simulated = True
    kernels_pending = False  # Replica's background kernel compile: nothing to compile here
    kernels_compiling = False

    def __init__(self, cost: SimCost | None = None, seed: int = 0):
        self.cost = cost or SimCost()
        self.engine = SimEngine(seed)
        self._one_at_a_time = asyncio.Semaphore(1)
        self.busy = False
        self.jobs_done = 0
        self.busy_seconds = 0.0
        self.audio_seconds = 0.0

    async def synthesize(self, ids: Sequence[int], style: torch.Tensor | None = None, speed: float = 1.0) -> Synthesis:
        result = await self._exclusive(self.cost.seconds(len(ids)), self.engine.synthesize, ids, style, speed)
        self.jobs_done += 1
        self.audio_seconds += len(result.audio) / SAMPLE_RATE
        return result

    async def synthesize_batch(self, items: Sequence[BatchItem]) -> list[Synthesis]:
        """All items for the batch rule's time (a + b * k * longest), results together at the end."""
        def run() -> list[Synthesis]:
            return [self.engine.synthesize(item.ids, item.style, item.speed) for item in items]

        results = await self._exclusive(self.cost.batch_seconds([len(i.ids) for i in items]), run)
        self.jobs_done += len(results)
        self.audio_seconds += sum(len(r.audio) for r in results) / SAMPLE_RATE
        return results

    async def warmup(self) -> None:
        """Nothing to compile or capture; one short job checks the path end to end."""
        await self.synthesize([16, 43, 54, 16, 56, 57] * 5)

    async def _exclusive(self, seconds: float, fn, *args):
        async with self._one_at_a_time:
            self.busy = True
            start = time.perf_counter()
            # Validate and build the result first (microseconds), so a bad chunk fails at once.
            try:
                result = fn(*args)
                # As on a GPU, a launched pass is not interrupted: the replica stays busy until its
                # time is up, so the next job never overlaps it.
                await run_to_completion(asyncio.ensure_future(_wait(seconds)))
                return result
            finally:
                self.busy = False
                self.busy_seconds += time.perf_counter() - start


def sim_voices(names: Sequence[str]) -> dict[str, torch.Tensor]:
    """Voice packs for the simulation: the names are what matters (requests are checked against
    them); the rows are one constant row expanded (no memory per voice), since the sim ignores style."""
    row = torch.zeros(1, STYLE_WIDTH)
    return {name: row.expand(510, STYLE_WIDTH) for name in names}


def describe(cost: SimCost) -> str:
    """The startup log's line for a simulated server."""
    seconds = cost.seconds(400)
    # a zero cost model (the front-end benchmark, loadtest.frontend) has no real-time factor
    speed = (f"{400 * SECONDS_PER_PHONEME / seconds:.0f}x real time" if seconds > 0
             else "no service time at all")
    return (f"SIMULATED ENGINE (KOKORO_ENGINE=sim): no model, replicas sleep t = {cost.chunk_ms:g} ms + "
            f"{cost.phoneme_ms:g} ms x phonemes per chunk (an assumed GPU cost, not a measurement; "
            f"{speed} per replica on 400-phoneme chunks); audio is synthetic")
