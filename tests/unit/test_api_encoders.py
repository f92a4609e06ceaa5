"""The streaming encoders: every format, streamed in uneven chunks and in one piece, decoded back
with PyAV (an independent decoder: FFmpeg's demuxers) to the expected rate, length and tail."""

from __future__ import annotations

import io
import struct

import av
import numpy as np
import pytest

from api.encoders import CONTENT_TYPES, FORMATS, make_encoder, wav_header
from worker.audio import from_pcm16, on_pcm16_grid, to_pcm16

SR = 24000


def tone(seconds: float, freq: float = 330.0, amplitude: float = 0.4) -> np.ndarray:
    t = np.arange(round(seconds * SR)) / SR
    return (amplitude * np.sin(2 * np.pi * freq * t)).astype(np.float32)


def encode(fmt: str, chunks: list[np.ndarray], streamed: bool, volume: float = 1.0) -> tuple[bytes, list[bytes]]:
    enc = make_encoder(fmt, streamed=streamed, volume=volume)
    parts = [enc.encode(c) for c in chunks]
    parts.append(enc.finish())
    return b"".join(parts), parts


def decode(data: bytes, fmt: str) -> tuple[np.ndarray, int]:
    """Mono float samples and their rate, decoded by FFmpeg (raw pcm read as s16le)."""
    if fmt == "pcm":
        return np.frombuffer(data, "<i2").astype(np.float32) / 32768, SR
    container = av.open(io.BytesIO(data), format={"opus": "ogg", "aac": "aac"}.get(fmt))
    stream = container.streams.audio[0]
    frames, rate = [], None
    for frame in container.decode(stream):
        assert len(frame.layout.channels) == 1, "expected mono"
        rate = frame.sample_rate
        frames.append(frame.to_ndarray().astype(np.float32).reshape(-1))
    samples = np.concatenate(frames)
    if samples.dtype != np.float32 or np.abs(samples).max() > 2:  # integer sample formats
        samples = samples / 32768
    return samples, rate


# The codecs without a way to signal their encoder delay on a stream (MPEG audio, ADTS) decode with
# up to this much extra audio at the start and end: priming plus padding to a whole frame.
CODEC_SLACK_S = {"mp3": 0.1, "aac": 0.12}


@pytest.mark.parametrize("streamed", [True, False], ids=["streamed", "whole"])
@pytest.mark.parametrize("fmt", FORMATS)
def test_round_trip_length_rate_and_tail(fmt, streamed):
    audio = tone(2.37)
    # Uneven chunk sizes that no codec frame size divides.
    chunks = np.array_split(audio, [7001, 20000, 33333, 33334])
    data, parts = encode(fmt, chunks, streamed)
    samples, rate = decode(data, fmt)

    # Opus always decodes at 48 kHz (that is the format); everything else keeps 24 kHz.
    assert rate == (48000 if fmt == "opus" else SR)
    duration = len(samples) / rate
    slack = CODEC_SLACK_S.get(fmt, 0.0) if (streamed or fmt == "aac") else 0.0
    assert len(audio) / SR - 0.002 <= duration <= len(audio) / SR + slack + 0.002, (fmt, duration)

    # No lost tail: the last 100 ms of the input tone are present at full level (a truncated or
    # unflushed stream decodes to silence or nothing there).
    end = len(samples) - round(slack * rate) if fmt in CODEC_SLACK_S else len(samples)
    tail = samples[max(0, end - round(0.1 * rate) - round(0.03 * rate)):end - round(0.03 * rate)]
    expected_rms = 0.4 / np.sqrt(2)
    assert np.sqrt(np.mean(tail ** 2)) == pytest.approx(expected_rms, rel=0.2), fmt

    if streamed:
        # Bytes leave while audio arrives, not only at the end.
        assert sum(len(p) for p in parts[:-1]) > len(data) // 2, [len(p) for p in parts]
    else:
        assert all(p == b"" for p in parts[:-1]) or fmt == "pcm"


def test_lossless_formats_are_exact():
    audio = tone(0.8)
    for fmt in ("pcm", "wav", "flac"):
        data, _ = encode(fmt, np.array_split(audio, 3), streamed=True)
        samples, _ = decode(data, fmt)
        np.testing.assert_array_equal(np.rint(samples * 32768).astype(np.int32), to_pcm16(audio).astype(np.int32))


def test_volume_multiplier_scales_and_clips():
    audio = tone(0.5, amplitude=0.3)
    quiet, _ = decode(encode("pcm", [audio], True, volume=0.5)[0], "pcm")
    loud, _ = decode(encode("pcm", [audio], True, volume=5.0)[0], "pcm")
    assert np.abs(quiet).max() == pytest.approx(0.15, abs=0.002)
    assert np.abs(loud).max() == pytest.approx(32767 / 32768, abs=1e-4)  # clipped, not wrapped
    assert np.all(np.sign(loud[np.abs(audio) > 0.01]) == np.sign(audio[np.abs(audio) > 0.01]))


def test_wav_headers():
    streamed, _ = encode("wav", [tone(0.1)], streamed=True)
    riff_size, = struct.unpack("<I", streamed[4:8])
    data_size, = struct.unpack("<I", streamed[40:44])
    assert (riff_size, data_size) == (0xFFFFFFFF, 0xFFFFFFFF)  # unknown length on a stream

    whole, _ = encode("wav", [tone(0.1)], streamed=False)
    riff_size, = struct.unpack("<I", whole[4:8])
    data_size, = struct.unpack("<I", whole[40:44])
    assert data_size == len(whole) - 44 == 2 * 2400 and riff_size == len(whole) - 8
    assert wav_header(10)[:4] == b"RIFF" and len(wav_header(None)) == 44

    # Python's own wave reader accepts the exact header.
    import wave
    with wave.open(io.BytesIO(whole)) as w:
        assert (w.getframerate(), w.getnchannels(), w.getsampwidth(), w.getnframes()) == (SR, 1, 2, 2400)


def test_empty_audio_still_gives_a_valid_file():
    for fmt in ("wav", "flac", "opus", "mp3"):
        data, _ = encode(fmt, [np.zeros(0, np.float32)], streamed=True)
        assert data, fmt


def test_close_without_finish_is_safe():
    for fmt in FORMATS:
        enc = make_encoder(fmt, streamed=True)
        enc.encode(tone(0.3))
        enc.close()  # a client that went away: no trailer, no crash
        enc.close()


def test_content_types_and_unknown_format():
    assert CONTENT_TYPES == {"mp3": "audio/mpeg", "opus": "audio/ogg", "aac": "audio/aac", "flac": "audio/flac",
                             "wav": "audio/wav", "pcm": "audio/pcm"}
    with pytest.raises(ValueError, match="unknown audio format 'ogg'"):
        make_encoder("ogg")


def test_the_encode_pool_gives_each_worker_its_share_of_the_cores(monkeypatch):
    import api.state

    monkeypatch.setattr(api.state, "usable_cores", lambda: 8)
    assert [api.state.encode_pool(w)._max_workers for w in (0, 1, 2, 3, 8, 16)] == [8, 8, 4, 3, 1, 1]


def test_16_bit_pcm_levels_survive_the_round_trip_exactly():
    """Every int16 level -> float32 -> int16 is the identity: audio on the grid (what replicas hand
    out) crosses processes as int16 and comes back bit-identical."""
    levels = np.arange(-32768, 32768, dtype=np.int16)
    np.testing.assert_array_equal(to_pcm16(from_pcm16(levels)), levels)
    audio = np.array([-1.5, -1.0, -0.25, 0.0, 0.3, 1.0, 2.0], dtype=np.float32)
    np.testing.assert_array_equal(to_pcm16(audio), [-32768, -32767, -8192, 0, 9830, 32767, 32767])
    np.testing.assert_array_equal(on_pcm16_grid(audio), from_pcm16(to_pcm16(audio)))
