"""Refining a voice by gradient: the fit's score made differentiable from the style to the ear.

The served model may run bf16 or int8 convolutions; a float32 twin of it (the same weights) speaks
the fit sentences with gradients on. Its speech reaches the three measures without leaving torch:

- the speaker encoder hears it through the same mel frontend as `SpeakerEncoder.embed` (a 24 kHz
  STFT whose 25 ms window and 10 ms hop match the encoder's 16 kHz ones, filters up to 8 kHz, so no
  resampling is needed);
- pitch is the model's own F0 curve (what its excitation source sings), in semitones;
- the envelope is the mean low-order cepstrum of the loud frames, as `measures.envelope` computes it.

Pitch and envelope are read differently here than by the ear (worker/voice_fit/measures.py), so
each carries an offset: the ear's figure less this module's, both taken on the voice the refinement
starts from. The fitter keeps whatever the ear scores best: this module only proposes.

The voice moves as one 256-value shift added to every row of its pack (a voice's rows differ by
input length, not by speaker), in units of the stock voices' spread per value, with a penalty on
its size beyond what separates similar stock voices: the voice stays among natural ones.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

from worker.audio import SAMPLE_RATE
from worker.model import KokoroModel
from worker.voice_fit.measures import CEPSTRA, ENVELOPE_BANDS, VoiceMeasures
from worker.voice_fit.speaker import (ENCODER_RATE, MEL_BANDS, PARTIAL_FRAMES, SpeakerEncoder, mel_filterbank,
                                      partial_starts, speech_mask)

RATIO = SAMPLE_RATE / ENCODER_RATE           # 1.5: the model's samples per encoder sample
WINDOW = round(400 * RATIO)                  # 25 ms
HOP = round(160 * RATIO)                     # 10 ms
ENVELOPE_FFT = round(512 * RATIO)
TOP_HZ = ENCODER_RATE / 2
PAUSE = SAMPLE_RATE // 5                     # between sentences, as the ear's speech has it
FREE_RADIUS = 6.0                            # shift size (stock spreads, over 256 values) with no penalty


def float_twin(model: KokoroModel) -> KokoroModel:
    """A float32 copy of a served model on the CPU, for gradients (its weights as served: a bf16
    decoder's rounding stays, which moves a gradient far less than a step does)."""
    state = {component: {k: (v.detach().float() if v.is_floating_point() else v.detach()).clone()
                         for k, v in tensors.items()}
             for component, tensors in model.components_state_dict().items()}
    return KokoroModel.for_serving(model.config, state, torch.float32, "cpu")


@dataclass
class Proposal:
    shift: torch.Tensor        # [256]: add to every row of the base pack
    loss: float
    similarity: float          # the encoder's cosine, as this module hears it
    pitch: float               # the pitch median (semitones above 55 Hz), as this module hears it


class GradientRefiner:
    """Adam on a style shift: similarity up, pitch and envelope distances down (the fit's score,
    with `pitch_weight` and `envelope_weight`), from `base` ([510, 256]) toward `target`."""

    def __init__(self, model: KokoroModel, encoder: SpeakerEncoder, sentence_ids: Sequence[Sequence[int]],
                 base: torch.Tensor, spread: torch.Tensor, target_embedding: np.ndarray, target: VoiceMeasures,
                 start: VoiceMeasures, *, pitch_weight: float, envelope_weight: float, lr: float = 0.08):
        self.model = model
        self.encoder = encoder
        self.sentences = [torch.tensor([[0, *ids, 0]], dtype=torch.long) for ids in sentence_ids]
        self.rows = [min(len(ids) - 1, base.shape[0] - 1) for ids in sentence_ids]
        self.base = base.detach().float()
        self.spread = spread.detach().float().clamp_min(1e-4)
        self.target_embedding = torch.from_numpy(np.asarray(target_embedding, dtype=np.float32))
        self.target = target
        self.pitch_weight, self.envelope_weight = pitch_weight, envelope_weight
        self.unit_shift = torch.zeros(base.shape[1], requires_grad=True)
        self.optimizer = torch.optim.Adam([self.unit_shift], lr=lr)
        self.speed = torch.ones(1)
        self.filters = torch.from_numpy(mel_filterbank(SAMPLE_RATE, WINDOW, MEL_BANDS, TOP_HZ))
        self.envelope_filters = torch.from_numpy(mel_filterbank(SAMPLE_RATE, ENVELOPE_FFT, ENVELOPE_BANDS, TOP_HZ))
        k = torch.arange(ENVELOPE_BANDS, dtype=torch.float32)
        self.dct = torch.cos(math.pi / ENVELOPE_BANDS * (k[None, :] + 0.5) * torch.arange(1, CEPSTRA + 1)[:, None]) \
            * math.sqrt(2 / ENVELOPE_BANDS)
        self.calibrate(start)

    def calibrate(self, heard: VoiceMeasures) -> None:
        """Pitch and envelope offsets: the ear's figures (`heard`, of the current shift's voice) less
        this module's, which drift apart as the voice moves: the fitter calls this at each hearing."""
        with torch.no_grad():
            audio, f0 = self.speak(self.unit_shift.detach())
            median, spread_st = self.pitch(f0)
            offset = (heard.pitch_median - float(median), heard.pitch_spread - float(spread_st))
            if all(math.isfinite(x) for x in offset) or not hasattr(self, "pitch_offset"):
                self.pitch_offset = offset  # a voice heard without a pitch keeps the last offset
            self.envelope_offset = torch.from_numpy(np.asarray(heard.envelope, dtype=np.float32)) - self.envelope(audio)

    def shift(self) -> torch.Tensor:
        return (self.unit_shift * self.spread).detach().clone()

    def speak(self, unit_shift: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The sentences in the shifted voice (24 kHz, pauses between) and the F0 curves joined (Hz)."""
        shift = unit_shift * self.spread
        pieces, curves = [], []
        for tokens, row in zip(self.sentences, self.rows):
            style = (self.base[row] + shift).unsqueeze(0)
            durations, features = self.model.stage1(tokens, None, style, self.speed)
            frames = int(durations.sum())
            asr, f0, energy = self.model.frame_prosody(durations, features, None, frames, style)
            pieces += [self.model.decode(asr, f0, energy, None, style, None)[0], torch.zeros(PAUSE)]
            curves.append(f0[0])
        return torch.cat(pieces), torch.cat(curves)

    def embed(self, audio: torch.Tensor) -> torch.Tensor:
        """`SpeakerEncoder.embed` on 24 kHz audio, differentiable: silences trimmed, -30 dBFS, 1.6 s partials."""
        mask = torch.from_numpy(speech_mask(audio.detach().numpy(), frame=round(480 * RATIO)))
        speech = audio[:len(mask)][mask]
        speech = speech * (10 ** (-30 / 20) / speech.pow(2).mean().sqrt().clamp_min(1e-9))
        starts = partial_starts(int(len(speech) / RATIO))
        speech = torch.nn.functional.pad(speech, (0, max(0, (starts[-1] + PARTIAL_FRAMES) * HOP - len(speech))))
        power = torch.stft(speech, n_fft=WINDOW, hop_length=HOP, window=torch.hann_window(WINDOW), center=True,
                           pad_mode="constant", return_complex=True).abs().pow(2)
        mel = (self.filters @ power).T / RATIO ** 2  # the 16 kHz STFT's scale: 1.5x fewer samples per window
        partials = torch.stack([mel[s:s + PARTIAL_FRAMES] for s in starts])
        mean = self.encoder.embed_mels(partials).mean(0)
        return mean / mean.norm().clamp_min(1e-9)

    def pitch(self, f0: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(median, interquartile range) of the voiced F0 in semitones above 55 Hz."""
        voiced = f0[f0 > 60.0]
        if voiced.numel() < 10:
            return torch.tensor(float("nan")), torch.tensor(float("nan"))
        q1, median, q3 = torch.quantile(12 * torch.log2(voiced / 55.0), torch.tensor([0.25, 0.5, 0.75]))
        return median, q3 - q1

    def envelope(self, audio: torch.Tensor) -> torch.Tensor:
        """Mean cepstrum c1..c20 of the loud frames' 60-band log-mel spectrum."""
        power = torch.stft(audio, n_fft=ENVELOPE_FFT, hop_length=HOP, win_length=WINDOW,
                           window=torch.hann_window(WINDOW), center=True, pad_mode="constant",
                           return_complex=True).abs().pow(2)
        mel = (self.envelope_filters @ power).T  # [frames, 60]
        logmel = 10 * torch.log10(mel + 1e-10)
        frame_db = 10 * torch.log10(mel.detach().sum(1) + 1e-10)
        keep = frame_db > torch.quantile(frame_db, 0.95) - 30
        return (logmel[keep] @ self.dct.T).mean(0)

    def step(self) -> Proposal:
        """One Adam step; returns the shift it started from, with that shift's loss and similarity.

        The halves of the style answer to different terms. The timbre half (values 0-127, what the
        decoder reads) follows the encoder and the envelope. The prosody half (128-255, what sets
        F0, durations and energy) follows the pitch alone: the encoder and the envelope would pull
        the pitch wherever their text-bound figures like best (Adam scales each value's step to its
        own gradient, so a share of their gradient would still take full steps), and the pitch is
        what a listener hears first. The squared miss lets the steps settle on the recording's pitch."""
        unit_shift = self.unit_shift
        with torch.enable_grad():
            audio, f0 = self.speak(unit_shift)
            similarity = self.embed(audio) @ self.target_embedding
            envelope = self.envelope(audio) + self.envelope_offset
            target_envelope = torch.from_numpy(np.asarray(self.target.envelope, dtype=np.float32))
            timbre = -similarity + self.envelope_weight * (envelope - target_envelope).norm()
            near = 0.01 * torch.relu(unit_shift.norm() - FREE_RADIUS) ** 2
            median, spread_st = self.pitch(f0)
            pitch = torch.zeros(())
            if math.isfinite(self.target.pitch_median) and math.isfinite(self.pitch_offset[0]) \
                    and not torch.isnan(median):
                pitch = self.pitch_weight * ((median + self.pitch_offset[0] - self.target.pitch_median) ** 2
                                             + 0.25 * (spread_st + self.pitch_offset[1] - self.target.pitch_spread) ** 2)
            proposal = Proposal(self.shift(), float((timbre + near + pitch).detach()), float(similarity.detach()),
                                float(median.detach()) + self.pitch_offset[0])
            (timbre_grad,) = torch.autograd.grad(timbre, unit_shift, retain_graph=True)
            (whole_grad,) = torch.autograd.grad(near + pitch, unit_shift)  # the terms on both halves
        timbre_grad[timbre_grad.shape[0] // 2:] = 0.0
        self.optimizer.zero_grad()
        unit_shift.grad = timbre_grad + whole_grad
        self.optimizer.step()
        return proposal
