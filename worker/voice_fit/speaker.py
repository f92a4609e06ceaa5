"""A speaker encoder: Resemblyzer's (GE2E, 3-layer LSTM over 40 mel bands at 16 kHz), whose trained
weights ship inside its PyPI wheel. Only the weights file is read: the package's own module imports
librosa, webrtcvad and scipy for its preprocessing, which is done here with numpy and torch instead
(the same mel filterbank and framing; silences trimmed by frame energy rather than WebRTC's VAD).

`embed(audio16k)` gives a unit vector [256]; the cosine of two is the similarity the fit climbs
(same speaker about 0.85 and up, different speakers mostly below 0.8).
"""

from __future__ import annotations

import functools
import importlib.util
from pathlib import Path

import numpy as np
import torch
from torch import nn

ENCODER_RATE = 16_000
MEL_BANDS = 40
WINDOW = 400         # 25 ms
HOP = 160            # 10 ms
PARTIAL_FRAMES = 160  # 1.6 s per partial utterance
PARTIALS_PER_S = 1.3
MIN_COVERAGE = 0.75


class EncoderMissing(RuntimeError):
    """The speaker encoder's weights are not installed; the message says how to get them."""


def encoder_weights_path() -> Path:
    """Resemblyzer's `pretrained.pt`, found without importing the package (whose import needs librosa)."""
    spec = importlib.util.find_spec("resemblyzer")
    if spec is None or not spec.submodule_search_locations:
        raise EncoderMissing("voice fitting needs the speaker encoder of the `resemblyzer` package: "
                             "pip install --no-deps resemblyzer (or the `voice-fit` extra)")
    path = Path(next(iter(spec.submodule_search_locations))) / "pretrained.pt"
    if not path.is_file():
        raise EncoderMissing(f"{path}: missing from the installed resemblyzer package; reinstall it")
    return path


def _hz_to_mel(f):  # Slaney's scale, as librosa's default
    f = np.asarray(f, dtype=np.float64)
    mel = f / (200.0 / 3)
    log_region = f >= 1000.0
    return np.where(log_region, 15.0 + np.log(np.maximum(f, 1e-9) / 1000.0) / (np.log(6.4) / 27.0), mel)


def _mel_to_hz(m):
    m = np.asarray(m, dtype=np.float64)
    return np.where(m >= 15.0, 1000.0 * np.exp((np.log(6.4) / 27.0) * (m - 15.0)), m * (200.0 / 3))


@functools.lru_cache(maxsize=8)
def mel_filterbank(rate: int, n_fft: int, bands: int, top_hz: float | None = None) -> np.ndarray:
    """[bands, n_fft // 2 + 1] triangular filters up to `top_hz` (default: half the rate),
    Slaney-normalized (librosa.filters.mel's default)."""
    fft_freqs = np.linspace(0, rate / 2, n_fft // 2 + 1)
    mel_points = _mel_to_hz(np.linspace(_hz_to_mel(0.0), _hz_to_mel(top_hz or rate / 2), bands + 2))
    weights = np.zeros((bands, len(fft_freqs)))
    for i in range(bands):
        lower = (fft_freqs - mel_points[i]) / (mel_points[i + 1] - mel_points[i])
        upper = (mel_points[i + 2] - fft_freqs) / (mel_points[i + 2] - mel_points[i + 1])
        weights[i] = np.maximum(0, np.minimum(lower, upper))
    weights *= (2.0 / (mel_points[2:bands + 2] - mel_points[:bands]))[:, None]
    return weights.astype(np.float32)


def power_mel(audio: np.ndarray, n_fft: int = WINDOW, bands: int = MEL_BANDS) -> np.ndarray:
    """[frames, bands] mel power spectrogram at 16 kHz, 10 ms hop, centred frames."""
    x = torch.from_numpy(np.ascontiguousarray(audio, dtype=np.float32))
    spec = torch.stft(x, n_fft=n_fft, hop_length=HOP, win_length=min(WINDOW, n_fft),
                      window=torch.hann_window(min(WINDOW, n_fft)), center=True, pad_mode="constant",
                      return_complex=True).abs().pow(2)
    return (torch.from_numpy(mel_filterbank(ENCODER_RATE, n_fft, bands)) @ spec).T.numpy()


def voiced_frames(audio: np.ndarray, frame: int = 480, floor_db: float = -40.0) -> np.ndarray:
    """A boolean per 30 ms frame: louder than `floor_db` below the recording's loud frames (its
    95th percentile), so pauses and breaths drop out whatever the recording's level."""
    n = len(audio) // frame
    if n == 0:
        return np.zeros(0, dtype=bool)
    energy = 10 * np.log10(np.mean(audio[:n * frame].reshape(n, frame) ** 2, axis=1) + 1e-12)
    return energy > np.percentile(energy, 95) + floor_db


def speech_mask(audio: np.ndarray, frame: int = 480, keep: int = 6) -> np.ndarray:
    """A boolean per sample of the audio's first whole frames: False in silent stretches longer than
    `keep` frames (Resemblyzer trims with a VAD)."""
    flags = voiced_frames(audio, frame)
    dilated = np.convolve(flags.astype(np.float32), np.ones(2 * keep + 1, dtype=np.float32), mode="same") > 0
    return np.repeat(dilated, frame)


def trim_silences(audio: np.ndarray, frame: int = 480, keep: int = 6) -> np.ndarray:
    """The audio without silent stretches longer than `keep` frames."""
    mask = speech_mask(audio, frame, keep)
    return audio[:len(mask)][mask]


def partial_starts(samples: int) -> list[int]:
    """The first mel frame of each 1.6 s partial of `samples` samples at 16 kHz (Resemblyzer's
    compute_partial_slices): 1.3 partials a second, the last dropped if it is mostly padding."""
    frames = int(np.ceil((samples + 1) / HOP))
    step = int(round(ENCODER_RATE / PARTIALS_PER_S / HOP))
    starts = list(range(0, max(1, frames - PARTIAL_FRAMES + step + 1), step))
    if len(starts) > 1 and (samples - starts[-1] * HOP) / (PARTIAL_FRAMES * HOP) < MIN_COVERAGE:
        starts.pop()
    return starts


class SpeakerEncoder(nn.Module):
    def __init__(self, weights: Path | None = None):
        super().__init__()
        self.lstm = nn.LSTM(MEL_BANDS, 256, 3, batch_first=True)
        self.linear = nn.Linear(256, 256)
        state = torch.load(weights or encoder_weights_path(), map_location="cpu", weights_only=False)["model_state"]
        self.load_state_dict({k: v for k, v in state.items() if k.split(".")[0] in ("lstm", "linear")})
        self.eval().requires_grad_(False)

    @torch.inference_mode()
    def forward(self, mels: torch.Tensor) -> torch.Tensor:
        return self.embed_mels(mels)

    def embed_mels(self, mels: torch.Tensor) -> torch.Tensor:
        """mels [partials, 160, 40] power -> unit embeddings [partials, 256]; differentiable (the
        gradient refinement's path, worker/voice_fit/gradient.py)."""
        _, (hidden, _) = self.lstm(mels)
        raw = torch.relu(self.linear(hidden[-1]))
        return raw / raw.norm(dim=1, keepdim=True).clamp_min(1e-9)

    def embed(self, audio16k: np.ndarray, trim: bool = True) -> np.ndarray:
        """The utterance's embedding: the normalized mean of its 1.6 s partials' (Resemblyzer's
        embed_utterance). Raises ValueError on audio with nothing loud enough to embed."""
        return _unit(self.embed_partials(audio16k, trim).mean(axis=0))

    def embed_partials(self, audio16k: np.ndarray, trim: bool = True) -> np.ndarray:
        """[partials, 256]: one embedding per 1.6 s window, 1.3 windows a second."""
        audio = trim_silences(audio16k) if trim else audio16k
        if len(audio) < HOP * 20:
            raise ValueError("no speech loud enough to embed")
        peak = np.sqrt(np.mean(audio ** 2))
        audio = audio * (10 ** (-30 / 20) / max(peak, 1e-9))  # -30 dBFS, as Resemblyzer normalizes
        starts = partial_starts(len(audio))
        padded = np.pad(audio, (0, max(0, (starts[-1] + PARTIAL_FRAMES) * HOP - len(audio))))
        mel = power_mel(padded)
        batch = np.stack([mel[s:s + PARTIAL_FRAMES] for s in starts])
        return self(torch.from_numpy(batch)).numpy()


def _unit(v: np.ndarray) -> np.ndarray:
    return (v / max(float(np.linalg.norm(v)), 1e-9)).astype(np.float32)


@functools.lru_cache(maxsize=1)
def speaker_encoder() -> SpeakerEncoder:
    """The process's one encoder (about 1.4 M parameters, loaded once)."""
    return SpeakerEncoder()
