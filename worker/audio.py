"""What Kokoro-82M's audio is, for every part that handles it: mono float samples at 24 kHz, and
durations counted in frames of 600 samples (25 ms), the model's iSTFTNet hop times its upsampling.

Between processes audio travels as 16-bit PCM: half of float32's bytes, and the precision of every
format a client gets. A replica's audio is put on that grid where it is made (`on_pcm16_grid`), so
a chunk is bit-identical whether the worker holding the connection made it or another one did."""

import numpy as np

SAMPLE_RATE = 24_000
SAMPLES_PER_FRAME = 600
FRAME_SECONDS = SAMPLES_PER_FRAME / SAMPLE_RATE  # 0.025
# Before synthesis the only measure of a text's length is its phoneme count; Kokoro speaks about
# 13 phonemes a second at speed 1. The one speaking-rate estimate: the audio-length limit checks it,
# the simulated engine matches it, and the fleet's queue starts from it until it has measured better.
SECONDS_PER_PHONEME = 0.075

PCM16_FULL_SCALE = np.float32(32767.0)


def to_pcm16(audio: np.ndarray, gain: float = 1.0) -> np.ndarray:
    """float32 [-1, 1] (any shape) -> little-endian int16, gain applied, clipped rather than wrapped."""
    scaled = np.asarray(audio, dtype=np.float32) * np.float32(gain * PCM16_FULL_SCALE)
    return np.clip(np.rint(scaled), -32768, 32767).astype("<i2")


def from_pcm16(samples: np.ndarray) -> np.ndarray:
    """int16 (to_pcm16's) -> float32. to_pcm16 of the result gives `samples` back exactly."""
    return np.asarray(samples).astype(np.float32) / PCM16_FULL_SCALE


def on_pcm16_grid(audio: np.ndarray) -> np.ndarray:
    """float32 audio rounded to the nearest 16-bit PCM level (and clipped to [-1, 1])."""
    return from_pcm16(to_pcm16(audio))
