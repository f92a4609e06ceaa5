"""The fit's second, independent measure of a voice: its pitch (median and spread of F0 in
semitones, from a YIN-style tracker) and its spectral envelope (the mean low-order cepstrum of its
voiced frames: the vocal tract's shape, without loudness). Both read 16 kHz audio.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from worker.voice_fit.speaker import ENCODER_RATE, HOP, power_mel

PITCH_FRAME = 640              # 40 ms: two periods of a 50 Hz voice
F0_MIN, F0_MAX = 60.0, 400.0
YIN_THRESHOLD = 0.2
CEPSTRA = 20                   # c1..c20 of 60 log-mel bands
ENVELOPE_BANDS = 60
MEASURE_VERSION = 2            # in the fit's stock cache key: figures an older measure cached are heard again


@dataclass(frozen=True)
class VoiceMeasures:
    pitch_median: float    # semitones above 55 Hz
    pitch_spread: float    # semitones, interquartile range
    voiced_share: float    # frames with a pitch / frames with sound
    envelope: np.ndarray   # [CEPSTRA]

    def pitch_distance(self, other: "VoiceMeasures") -> float:
        """Semitones: the medians' difference plus a quarter of the spreads'."""
        return abs(self.pitch_median - other.pitch_median) + 0.25 * abs(self.pitch_spread - other.pitch_spread)

    def envelope_distance(self, other: "VoiceMeasures") -> float:
        """Euclidean distance of the mean cepstra (dB-like units; same speaker about 1-2, others 2-6)."""
        return float(np.linalg.norm(self.envelope - other.envelope))

    def as_dict(self) -> dict:
        return {"pitch_hz": round(float(55.0 * 2 ** (self.pitch_median / 12)), 1),
                "pitch_spread_semitones": round(self.pitch_spread, 2), "voiced_share": round(self.voiced_share, 3)}


def pitch_track(audio16k: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(f0 Hz per 10 ms frame, NaN where unvoiced; whether the frame has sound)."""
    n = 1 + (len(audio16k) - PITCH_FRAME) // HOP
    if n <= 0:
        return np.zeros(0), np.zeros(0, dtype=bool)
    idx = np.arange(PITCH_FRAME)[None, :] + HOP * np.arange(n)[:, None]
    frames = audio16k[idx].astype(np.float64)
    frames -= frames.mean(axis=1, keepdims=True)
    energy = np.sum(frames ** 2, axis=1)
    loud = 10 * np.log10(energy + 1e-12) > 10 * np.log10(np.percentile(energy, 95) + 1e-12) - 35
    spec = np.fft.rfft(frames, n=2 * PITCH_FRAME, axis=1)
    acf = np.fft.irfft(np.abs(spec) ** 2, axis=1)[:, :PITCH_FRAME // 2 + 1]
    lag_max = int(ENCODER_RATE / F0_MIN)
    lag_min = int(ENCODER_RATE / F0_MAX)
    # YIN's difference function: d(t) = sum (x[j] - x[j + t])^2 over the overlap, from the
    # autocorrelation and the energies of the overlapping parts
    squares = np.cumsum(frames ** 2, axis=1)
    lags = np.arange(lag_max + 1)
    head = squares[:, PITCH_FRAME - 1 - lags]                             # sum x[j]^2, j < W - t
    tail = squares[:, -1:] - np.concatenate([np.zeros((n, 1)), squares[:, lags[1:] - 1]], axis=1)  # j >= t
    diff = np.maximum(head + tail - 2 * acf[:, :lag_max + 1], 0.0)
    cmnd = np.ones_like(diff)
    cumulative = np.cumsum(diff[:, 1:], axis=1)
    cmnd[:, 1:] = diff[:, 1:] * np.arange(1, lag_max + 1)[None, :] / np.maximum(cumulative, 1e-12)
    region = cmnd[:, lag_min:lag_max + 1]
    below = region < YIN_THRESHOLD
    first = np.where(below.any(axis=1), below.argmax(axis=1), region.argmin(axis=1))
    # descend to the local minimum after the first dip under the threshold
    lags = first.copy()
    rows = np.arange(n)
    for _ in range(12):
        nxt = np.minimum(lags + 1, region.shape[1] - 1)
        better = region[rows, nxt] < region[rows, lags]
        lags = np.where(better, nxt, lags)
    best = region[rows, lags]
    # YIN's parabolic interpolation between lags: an integer lag alone moves a 200 Hz voice's
    # pitch in steps of 0.2 semitones, coarser than the distances the fit tells apart
    before = region[rows, np.maximum(lags - 1, 0)]
    after = region[rows, np.minimum(lags + 1, region.shape[1] - 1)]
    curvature = before - 2 * best + after
    inner = (lags > 0) & (lags < region.shape[1] - 1) & (curvature > 1e-12)
    fraction = np.where(inner, 0.5 * (before - after) / np.where(inner, curvature, 1.0), 0.0)
    f0 = ENCODER_RATE / (lags + lag_min + np.clip(fraction, -0.5, 0.5))
    voiced = loud & (best < YIN_THRESHOLD)
    return np.where(voiced, f0, np.nan), loud


def envelope(audio16k: np.ndarray, voiced: np.ndarray | None = None) -> np.ndarray:
    """The mean cepstrum c1..c20 of the loud frames' 60-band log-mel spectrum (n_fft 512)."""
    mel = power_mel(audio16k, n_fft=512, bands=ENVELOPE_BANDS)
    logmel = 10 * np.log10(mel + 1e-10)
    frame_db = 10 * np.log10(mel.sum(axis=1) + 1e-10)
    keep = frame_db > np.percentile(frame_db, 95) - 30
    if voiced is not None:
        voiced = np.pad(voiced, (0, max(0, len(keep) - len(voiced))))[:len(keep)]
        keep = keep & voiced if (keep & voiced).sum() > 20 else keep
    k = np.arange(ENVELOPE_BANDS)
    dct = np.cos(np.pi / ENVELOPE_BANDS * (k[None, :] + 0.5) * np.arange(1, CEPSTRA + 1)[:, None])
    return (logmel[keep] @ dct.T * np.sqrt(2 / ENVELOPE_BANDS)).mean(axis=0)


def measure(audio16k: np.ndarray) -> VoiceMeasures:
    f0, loud = pitch_track(audio16k)
    voiced = ~np.isnan(f0)
    if voiced.sum() < 10:
        return VoiceMeasures(float("nan"), float("nan"), 0.0, envelope(audio16k))
    semitones = 12 * np.log2(f0[voiced] / 55.0)
    q1, median, q3 = np.percentile(semitones, [25, 50, 75])
    # frames are 10 ms apart in both trackers: centre-aligned within half a frame
    return VoiceMeasures(float(median), float(q3 - q1), float(voiced.sum() / max(1, loud.sum())),
                         envelope(audio16k, voiced))
