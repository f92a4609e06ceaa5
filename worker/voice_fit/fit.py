"""Fitting a Kokoro voice to a recording: a guided search of the style space, scored by ear.

A candidate voice (a style pack [510, 256]) is heard by synthesizing a few short sentences with it
and scoring that speech against the recording: the speaker encoder's cosine similarity, less
penalties for the pitch and spectral-envelope distances (worker/voice_fit/measures.py). The search:

1. **Start in the span of the stock voices.** Every stock voice of the pool is heard once (cached
   on disk per weights and sentences); mixture weights over the whole pool are solved against the
   target on those stock figures (a mix's embedding and pitch are close to the mix of its voices'),
   and the best few voices kept.
2. **Mixture search.** An evolution strategy on the kept voices' mixture weights, each candidate
   heard for real. Mixes are always natural speech.
3. **Refinement by gradient.** From the best mix, Adam on one style shift shared by every row of
   the pack, through a float32 twin of the model and a differentiable encoder, pitch and envelope
   (worker/voice_fit/gradient.py; its timbre half follows the encoder and the envelope, its prosody
   half the pitch alone): the voice moves where no mix reaches, held near the stock voices
   by a penalty on the shift's size in their own spreads. The ear hears every few steps' voice and
   keeps the best it scores; a candidate whose speech loses its voicing (the measure of noise) is
   refused whatever its similarity. A gradient step counts as a candidate (it hears the speech too).

Deterministic for a seed and a candidate budget: the mixtures are drawn from a seeded generator,
the engine's noise is seeded and the gradient's speech has none. A deadline (`minutes`) stops the search early with the best so
far, which then depends on the machine's speed; the report says whether it stopped early.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import torch

from worker.voice_fit.gradient import GradientRefiner, float_twin
from worker.voice_fit.measures import MEASURE_VERSION, VoiceMeasures, measure
from worker.voice_fit.recording import resample
from worker.voice_fit.speaker import SpeakerEncoder

# The score: similarity less these penalties, per semitone of pitch distance and per unit of
# envelope distance (sized so a 1-semitone or a 2.5-unit miss costs about what separates two
# similar stock voices on the encoder: a listener hears a semitone).
PITCH_PENALTY = 0.04
ENVELOPE_PENALTY = 0.015
KEPT_VOICES = 6          # voices of the pool the mixture search works on
GENERATION = 4           # candidates per step of the evolution strategy
MIXTURE_SHARE = 0.35     # of the candidate budget spent on mixtures, the rest on gradient steps and their hearing
EAR_EVERY = 3            # gradient steps between two hearings of the refined voice
PITCH_GRADIENT_WEIGHT = 0.1  # per squared semitone, in the refinement's loss: the prosody half follows it alone
VOICING_FLOOR = 0.7      # a candidate voiced less than this share of the stock voices' least is noise

# Short sentences with varied vowels and voiced consonants: what a candidate is heard saying.
# Statements: how far a question rises is a voice's own, and a recording's pitch rarely holds one.
DEFAULT_SENTENCES = {
    "en": ("The morning light fell softly across the quiet valley.",
           "My brother keeps a small boat near the harbour and paints it every spring."),
}


@dataclass
class FitProgress:
    phase: str             # "stock", "mixture", "refine", "done"
    done: int              # candidates heard so far (stock voices included)
    total: int
    best_score: float
    best_similarity: float
    elapsed_s: float
    eta_s: float
    message: str = ""

    def as_dict(self) -> dict:
        """JSON-ready: no score yet is None (JSON has no infinity)."""
        return {k: (None if isinstance(v, float) and not math.isfinite(v) else round(v, 4) if isinstance(v, float) else v)
                for k, v in self.__dict__.items()}


@dataclass
class Heard:
    """A voice as heard on the fit sentences."""
    embedding: np.ndarray
    measures: VoiceMeasures

    def score(self, target: "Heard") -> tuple[float, float]:
        """(score, similarity) against the target."""
        similarity = float(self.embedding @ target.embedding)
        pitch = self.measures.pitch_distance(target.measures)
        pitch = 12.0 if math.isnan(pitch) else pitch
        return similarity - PITCH_PENALTY * pitch - ENVELOPE_PENALTY * self.measures.envelope_distance(target.measures), \
            similarity


@dataclass
class FitResult:
    pack: torch.Tensor                # [510, 256] float32
    report: dict = field(default_factory=dict)


class CandidateEar:
    """Synthesizes the fit sentences with a style pack and hears the speech: embedding + measures."""

    def __init__(self, engine, encoder: SpeakerEncoder, sentence_ids: Sequence[Sequence[int]]):
        self.engine = engine
        self.encoder = encoder
        self.sentence_ids = [list(ids) for ids in sentence_ids]

    def speech(self, pack: torch.Tensor) -> np.ndarray:
        """The sentences in this voice, 16 kHz, a short pause between them."""
        pieces = []
        for ids in self.sentence_ids:
            row = min(len(ids) - 1, pack.shape[0] - 1)
            audio = self.engine.synthesize(ids, pack[row]).audio
            pieces += [audio, np.zeros(self.engine.sample_rate // 5, np.float32)]
        return resample(np.concatenate(pieces), self.engine.sample_rate)

    def hear(self, pack: torch.Tensor) -> Heard:
        audio = self.speech(pack)
        return Heard(self.encoder.embed(audio), measure(audio))


def hear_recording(audio16k: np.ndarray, encoder: SpeakerEncoder) -> Heard:
    return Heard(encoder.embed(audio16k), measure(audio16k))


def stock_cache_key(fingerprint: str, dtype: str, sentence_ids: Sequence[Sequence[int]]) -> str:
    key = [fingerprint, dtype, [list(s) for s in sentence_ids], MEASURE_VERSION]
    digest = hashlib.blake2b(json.dumps(key).encode(), digest_size=10)
    return digest.hexdigest()


def hear_stock(ear: CandidateEar, voices: dict[str, torch.Tensor], cache_file: Path | None,
               progress: Callable[[str, int], None] | None = None,
               stop: Callable[[], bool] = lambda: False) -> dict[str, Heard]:
    """Each stock voice heard on the fit sentences, read from `cache_file` where heard before;
    once `stop()` says so, only those heard by then (at least two)."""
    cached: dict[str, Heard] = {}
    if cache_file is not None and cache_file.is_file():
        with np.load(cache_file, allow_pickle=False) as data:
            for name in data.files:
                row = data[name]
                cached[name] = Heard(row[:256].astype(np.float32), VoiceMeasures(float(row[256]), float(row[257]),
                                                                              float(row[258]), row[259:].copy()))
    heard, fresh = {}, False
    for i, name in enumerate(sorted(voices)):
        if name not in cached and len(heard) >= 2 and stop():
            continue
        if name not in cached:
            cached[name] = ear.hear(voices[name])
            fresh = True
        heard[name] = cached[name]
        if progress:
            progress(name, i + 1)
    if fresh and cache_file is not None:
        cache_file.parent.mkdir(parents=True, exist_ok=True)
        rows = {n: np.concatenate([h.embedding, [h.measures.pitch_median, h.measures.pitch_spread,
                                                 h.measures.voiced_share], h.measures.envelope]) for n, h in cached.items()}
        tmp = cache_file.with_name(f".{cache_file.name}.{time.monotonic_ns()}.npz")
        np.savez(tmp, **rows)
        tmp.replace(cache_file)
    return heard


def solve_mixture(stock: dict[str, Heard], target: Heard, names: list[str], steps: int = 300) -> np.ndarray:
    """Mixture weights over `names` (summing to 1) whose mixed figures best match the target's,
    taking a mix's embedding, pitch and envelope as the mix of its voices' (a first guess only)."""
    emb = torch.tensor(np.stack([stock[n].embedding for n in names]))
    pitch = torch.tensor([stock[n].measures.pitch_median for n in names], dtype=torch.float32)
    env = torch.tensor(np.stack([stock[n].measures.envelope for n in names]), dtype=torch.float32)
    t_emb = torch.tensor(target.embedding)
    t_pitch = float(target.measures.pitch_median) if not math.isnan(target.measures.pitch_median) else float(pitch.mean())
    t_env = torch.tensor(target.measures.envelope, dtype=torch.float32)
    z = torch.zeros(len(names), requires_grad=True)
    optimizer = torch.optim.Adam([z], lr=0.1)
    for _ in range(steps):
        w = torch.softmax(z, 0)
        mixed = w @ emb
        loss = -(mixed @ t_emb) / mixed.norm() + PITCH_PENALTY * (w @ pitch - t_pitch).abs() \
            + ENVELOPE_PENALTY * (w @ env - t_env).norm()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return torch.softmax(z, 0).detach().numpy()


class VoiceFitter:
    """Fits a voice to a recording with one engine (a worker.engine.Engine), a pool of stock
    voices (name -> [510, 256]) and the sentences a candidate is heard saying (phoneme ids)."""

    def __init__(self, engine, voices: dict[str, torch.Tensor], sentence_ids: Sequence[Sequence[int]],
                 encoder: SpeakerEncoder, stock_cache: Path | None = None):
        if len(voices) < 2:
            raise ValueError("fitting needs at least two stock voices to start from")
        self.voices = {n: torch.as_tensor(p, dtype=torch.float32).reshape(p.shape[0], -1) for n, p in voices.items()}
        self.ear = CandidateEar(engine, encoder, sentence_ids)
        self.encoder = encoder
        self.stock_cache = stock_cache

    def fit(self, target_audio16k: np.ndarray, *, candidates: int = 120, seed: int = 0, minutes: float | None = None,
            progress: Callable[[FitProgress], None] | None = None,
            cancelled: Callable[[], bool] = lambda: False) -> FitResult:
        start = time.monotonic()
        deadline = start + minutes * 60 if minutes else math.inf
        rng = np.random.default_rng(seed)
        target = hear_recording(target_audio16k, self.encoder)
        names = sorted(self.voices)
        total = len(names) + candidates
        best = {"score": -math.inf, "similarity": -math.inf}
        done = [0]

        def report(phase: str, message: str = "") -> None:
            if progress is None:
                return
            elapsed = time.monotonic() - start
            eta = elapsed / max(done[0], 1) * (total - done[0])
            eta = max(0.0, min(eta, deadline - time.monotonic()))
            progress(FitProgress(phase, done[0], total, best["score"], best["similarity"], elapsed, eta, message))

        def stock_step(name: str, i: int) -> None:
            done[0] = i
            report("stock", f"heard stock voice {name}")

        report("stock", "hearing the stock voices")
        def out_of_time() -> bool:
            if cancelled():
                raise FitCancelled()
            return time.monotonic() > deadline

        stock = hear_stock(self.ear, self.voices, self.stock_cache, stock_step, out_of_time)
        names = sorted(stock)  # all of them, unless the deadline came first
        scored = {n: stock[n].score(target) for n in names}
        nearest = max(names, key=lambda n: scored[n][0])
        best_pack, best_heard = self.voices[nearest], stock[nearest]
        best.update(score=scored[nearest][0], similarity=scored[nearest][1])
        voicing_floor = VOICING_FLOOR * min(h.measures.voiced_share for h in stock.values())

        # 1. mixture weights on the stock figures, then the evolution strategy heard for real
        weights = solve_mixture(stock, target, names)
        kept = [names[i] for i in np.argsort(-weights)[:KEPT_VOICES]]
        packs = torch.stack([self.voices[n] for n in kept])
        z = np.log(np.maximum(weights[[names.index(n) for n in kept]], 1e-3))
        z -= z.max()
        sigma = 0.6
        stopped_early = False
        mix_of = lambda zz: torch.softmax(torch.tensor(zz, dtype=torch.float32), 0)  # noqa: E731
        best_mix = {nearest: 1.0}
        budget_mix = int(candidates * MIXTURE_SHARE)
        first = True

        def evaluate(pack: torch.Tensor) -> tuple[float, float, Heard] | None:
            heard = self.ear.hear(pack)
            done[0] += 1
            if heard.measures.voiced_share < voicing_floor:
                return None
            return (*heard.score(target), heard)

        used = 0
        while used < budget_mix:
            if cancelled():
                raise FitCancelled()
            if time.monotonic() > deadline:
                stopped_early = True
                break
            trials = [z] if first else [z + sigma * rng.standard_normal(len(z)) for _ in range(GENERATION)]
            first = False
            improved = False
            for trial in trials[:budget_mix - used]:
                w = mix_of(trial)
                pack = torch.einsum("k,krc->rc", w, packs)
                result = evaluate(pack)
                used += 1
                if result is not None and result[0] > best["score"]:
                    best.update(score=result[0], similarity=result[1])
                    best_pack, best_heard, z, improved = pack, result[2], trial, True
                    best_mix = {n: round(float(x), 4) for n, x in zip(kept, w) if x >= 1e-3}
                report("mixture", f"mixture of {', '.join(kept)}")
            sigma = sigma * 1.25 if improved else max(sigma * 0.8, 0.05)

        # 2. refinement by gradient from the best mix (worker/voice_fit/gradient.py); the ear hears
        # every EAR_EVERY-th proposal, and the best the ear scores is kept
        spread = torch.stack([self.voices[n] for n in names]).std(0).mean(0)  # [256]: per value, over rows
        refiner, shift_size, refined = None, 0.0, False
        while used < candidates and not stopped_early:
            if cancelled():
                raise FitCancelled()
            if time.monotonic() > deadline:
                stopped_early = True
                break
            if refiner is None:
                refiner = GradientRefiner(float_twin(self.ear.engine.model), self.encoder, self.ear.sentence_ids,
                                          best_pack, spread, target.embedding, target.measures, best_heard.measures,
                                          pitch_weight=PITCH_GRADIENT_WEIGHT, envelope_weight=ENVELOPE_PENALTY)
                base_pack, steps, heard_at = best_pack, 0, 0
            if used + 1 < candidates:  # the budget's last candidate hears where the steps got
                refiner.step()
                steps += 1
                used += 1
                done[0] += 1
            elif steps == heard_at:
                break
            if steps % EAR_EVERY == 0 or used + 1 >= candidates:
                heard_at = steps
                shift = refiner.shift()
                pack = base_pack + shift
                result = evaluate(pack)
                used += 1
                if result is not None:
                    refiner.calibrate(result[2].measures)
                if result is not None and result[0] > best["score"]:
                    best.update(score=result[0], similarity=result[1])
                    best_pack, best_heard, refined = pack, result[2], True
                    shift_size = float((shift / spread.clamp_min(1e-4)).norm())
            report("refine", "refining beyond the mixes")

        elapsed = time.monotonic() - start
        report("done", "fitted")
        nearest_heard = stock[nearest]
        return FitResult(best_pack.clone().contiguous(), {
            "similarity": round(best["similarity"], 4),
            "score": round(best["score"], 4),
            "nearest_stock_voice": nearest,
            "nearest_stock_similarity": round(scored[nearest][1], 4),
            "nearest_stock_score": round(scored[nearest][0], 4),
            "mixture": best_mix,
            "refined": refined,
            "shift_from_mix_std": round(shift_size, 3),
            "pitch": {"sample": target.measures.as_dict(), "fitted": best_heard.measures.as_dict(),
                      "nearest_stock": nearest_heard.measures.as_dict()},
            "envelope_distance": {"fitted": round(best_heard.measures.envelope_distance(target.measures), 3),
                                  "nearest_stock": round(nearest_heard.measures.envelope_distance(target.measures), 3)},
            "candidates": used, "candidate_budget": candidates, "stopped_at_deadline": stopped_early,
            "seed": seed, "elapsed_s": round(elapsed, 1),
        })


class FitCancelled(Exception):
    """The fit's `cancelled()` said stop; nothing was produced."""
