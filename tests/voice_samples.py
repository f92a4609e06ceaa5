"""Recordings made up for the voice-fitting tests: speech-like sound (a pitch with vibrato, vowels
as formant shapes, syllables and pauses), noise, silence, encoded as the files a user sends."""

from __future__ import annotations

import functools
import io
import wave

import numpy as np

RATE = 16_000


@functools.lru_cache(maxsize=16)
def speechlike(seconds: float, f0: float = 120.0, formants=((700, 1200, 2600), (300, 2300, 3000), (500, 900, 2400)),
               seed: int = 0, rate: int = RATE) -> np.ndarray:
    """Syllables of a voiced source through vowel-like resonances, with short pauses between words."""
    rng = np.random.default_rng(seed)
    out, n = [], int(seconds * rate)
    total = 0
    while total < n:
        syllable = int(rate * rng.uniform(0.15, 0.3))
        t = np.arange(syllable) / rate
        pitch = f0 * (1 + 0.08 * np.sin(2 * np.pi * rng.uniform(2, 5) * t + rng.uniform(0, 6)))
        phase = 2 * np.pi * np.cumsum(pitch) / rate
        shape = formants[rng.integers(len(formants))]
        audio = np.zeros(syllable)
        for k in range(1, int(3800 / f0)):
            gain = sum(np.exp(-((k * pitch - f) / 120.0) ** 2) for f in shape) + 0.02
            audio += gain / k ** 0.5 * np.sin(k * phase)
        audio *= np.hanning(syllable)
        out.append(audio)
        gap = int(rate * (rng.uniform(0.2, 0.4) if rng.random() < 0.25 else 0.03))
        out.append(np.zeros(gap))
        total += syllable + gap
    audio = np.concatenate(out)[:n]
    audio = (0.3 * audio / np.abs(audio).max()).astype(np.float32)
    audio.flags.writeable = False  # shared between callers (cached)
    return audio


def wav_file(audio: np.ndarray, rate: int = RATE) -> bytes:
    buf = io.BytesIO()
    with wave.open(buf, "wb") as f:
        f.setnchannels(1)
        f.setsampwidth(2)
        f.setframerate(rate)
        f.writeframes(np.clip(np.rint(audio * 32767), -32768, 32767).astype("<i2").tobytes())
    return buf.getvalue()


# What browsers' MediaRecorder makes: webm/opus (Chromium, Firefox) and fragmented mp4/AAC (Safari,
# Chromium's audio/mp4), a stream of fragments with no index up front.
FRAGMENTED_MP4 = {"movflags": "frag_keyframe+empty_moov+default_base_moof"}


def encoded(audio: np.ndarray, fmt: str, rate: int = RATE) -> bytes:
    """The audio in another container through PyAV (mp3, flac, ogg/opus, webm/opus, m4a, and
    `recorded-mp4`: fragmented mp4 as a browser records it)."""
    import av

    buf = io.BytesIO()
    codec = {"mp3": "mp3", "flac": "flac", "ogg": "libopus", "webm": "libopus", "m4a": "aac", "recorded-mp4": "aac"}[fmt]
    out_rate = 48000 if codec == "libopus" else rate
    container_format = {"m4a": "mp4", "recorded-mp4": "mp4"}.get(fmt, fmt)
    options = FRAGMENTED_MP4 if fmt == "recorded-mp4" else {}
    with av.open(buf, mode="w", format=container_format, options=options) as container:
        stream = container.add_stream(codec, rate=out_rate)
        stream.layout = "mono"
        frame = av.AudioFrame.from_ndarray(audio.reshape(1, -1).astype(np.float32), format="flt", layout="mono")
        frame.sample_rate = rate
        resampler = av.AudioResampler(format=stream.codec_context.format, layout="mono", rate=out_rate)
        for piece in resampler.resample(frame) + resampler.resample(None):
            for packet in stream.encode(piece):
                container.mux(packet)
        for packet in stream.encode(None):
            container.mux(packet)
    return buf.getvalue()
