"""The streaming encoders: every format, streamed in uneven chunks and in one piece, decoded back
with PyAV (an independent decoder: FFmpeg's demuxers) to the expected rate, length and tail; and
every format at other sample rates than the model's 24 kHz."""

from __future__ import annotations

import io
import struct

import av
import numpy as np
import pytest

from api.encoders import CONTENT_TYPES, FORMATS, default_sample_rate, make_encoder, sample_rates, wav_header
from worker.audio import from_pcm16, on_pcm16_grid, to_pcm16

SR = 24000


def tone(seconds: float, freq: float = 330.0, amplitude: float = 0.4) -> np.ndarray:
    t = np.arange(round(seconds * SR)) / SR
    return (amplitude * np.sin(2 * np.pi * freq * t)).astype(np.float32)


def encode(fmt: str, chunks: list[np.ndarray], streamed: bool, volume: float = 1.0,
           sample_rate: int | None = None) -> tuple[bytes, list[bytes]]:
    enc = make_encoder(fmt, streamed=streamed, volume=volume, sample_rate=sample_rate)
    parts = [enc.encode(c) for c in chunks]
    parts.append(enc.finish())
    return b"".join(parts), parts


def decode(data: bytes, fmt: str, raw_rate: int | None = None) -> tuple[np.ndarray, int]:
    """Mono float samples and their rate, decoded by FFmpeg (raw pcm read as s16le; the headerless
    formats at `raw_rate`, by default the format's own)."""
    raw_rate = raw_rate or default_sample_rate(fmt)
    if fmt == "pcm":
        return np.frombuffer(data, "<i2").astype(np.float32) / 32768, raw_rate
    options = {"sample_rate": str(raw_rate)} if fmt in ("mulaw", "alaw") else {}
    demuxer = {"opus": "ogg", "aac": "aac", "mulaw": "mulaw", "alaw": "alaw"}.get(fmt)
    container = av.open(io.BytesIO(data), format=demuxer, options=options)
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

    # Opus always decodes at 48 kHz (that is the format); G.711 is 8 kHz; everything else keeps 24 kHz.
    assert rate == {"opus": 48000, "mulaw": 8000, "alaw": 8000}.get(fmt, SR)
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
        assert all(p == b"" for p in parts[:-1]) or fmt in ("pcm", "mulaw", "alaw")  # headerless: nothing to hold


# Encoder delay and padding of the codecs that show them (see CODEC_SLACK_S), in samples at any rate.
CODEC_SLACK_SAMPLES = {"mp3": 2400, "aac": 2880}


@pytest.mark.parametrize("fmt,rate", [(f, r) for f in FORMATS for r in (8000, 16000, 22050, 44100, 48000)
                                      if sample_rates(f) is None or r in sample_rates(f)])
def test_other_sample_rates_keep_length_level_and_tail(fmt, rate):
    # A voiced, vowel-like sound (150 Hz and its harmonics up to 2.85 kHz): opus codes 8 kHz audio
    # with its speech codec (SILK), which adds 3 dB to a pure tone but keeps speech at its level.
    t = np.arange(round(1.53 * SR)) / SR
    audio = sum(0.15 / k * np.sin(2 * np.pi * 150 * k * t) for k in range(1, 20)).astype(np.float32)
    data, parts = encode(fmt, np.array_split(audio, [5000, 5001, 21111]), streamed=True, sample_rate=rate)
    samples, decoded_rate = decode(data, fmt, raw_rate=rate)
    assert decoded_rate == (48000 if fmt == "opus" else rate)  # an Ogg Opus stream always decodes at 48 kHz
    slack = CODEC_SLACK_SAMPLES.get(fmt, 0) / rate
    assert 1.53 - 0.002 <= len(samples) / decoded_rate <= 1.53 + slack + 0.002, (fmt, rate, len(samples))
    # The sound at its level right to the end (the resampler's filter tail is flushed, not lost).
    end = len(samples) - round(slack * decoded_rate)
    tail = samples[end - round(0.13 * decoded_rate):end - round(0.03 * decoded_rate)]
    assert np.sqrt(np.mean(tail ** 2)) == pytest.approx(np.sqrt(np.mean(audio ** 2)), rel=0.2), (fmt, rate)
    assert sum(len(p) for p in parts[:-1]) > len(data) // 2  # still streamed as it comes


def test_resampling_is_seamless_faithful_and_alias_free():
    """One resampler per response: chunked input gives the samples one piece gives; a 330 Hz tone
    comes out as that tone sampled at the new rate (16-bit rounding aside); a 6 kHz tone, above
    8 kHz audio's 4 kHz Nyquist frequency, is filtered out instead of folding back as a 2 kHz one."""
    audio = tone(1.0)
    whole, _ = decode(encode("pcm", [audio], True, sample_rate=16000)[0], "pcm", 16000)
    chunked, _ = decode(encode("pcm", np.array_split(audio, [1, 7001, 7002, 13000]), True, sample_rate=16000)[0],
                        "pcm", 16000)
    np.testing.assert_array_equal(chunked, whole)
    ideal = 0.4 * np.sin(2 * np.pi * 330 * np.arange(len(whole)) / 16000)
    middle = slice(400, -400)
    snr = 10 * np.log10(np.mean(ideal[middle] ** 2) / np.mean((whole[middle] - ideal[middle]) ** 2))
    assert snr > 80, snr

    high, _ = decode(encode("pcm", [tone(1.0, freq=6000)], True, sample_rate=8000)[0], "pcm", 8000)
    assert len(high) == 8000 and np.sqrt(np.mean(high[200:-200] ** 2)) < 1e-3


@pytest.mark.parametrize("fmt", ["mulaw", "alaw"])
def test_g711_is_telephone_audio(fmt):
    """8 kHz, one byte a sample, and G.711's companding: about 38 dB of SNR on a loud tone, the
    same on a quiet one (a linear 8-bit code would lose 20 dB there)."""
    for amplitude in (0.4, 0.04):
        audio = tone(0.5, amplitude=amplitude)
        data, _ = encode(fmt, np.array_split(audio, 3), streamed=True)
        assert len(data) == 4000
        samples, rate = decode(data, fmt)
        ideal = amplitude * np.sin(2 * np.pi * 330 * np.arange(len(samples)) / rate)
        middle = slice(200, -200)
        snr = 10 * np.log10(np.mean(ideal[middle] ** 2) / np.mean((samples[middle] - ideal[middle]) ** 2))
        assert 30 < snr < 45, (fmt, amplitude, snr)


def test_sample_rates_a_codec_cannot_carry():
    with pytest.raises(ValueError, match="opus audio cannot be 22050 Hz; its codec takes 8000, 12000, 16000, "
                                         "24000 or 48000 Hz"):
        make_encoder("opus", sample_rate=22050)
    with pytest.raises(ValueError, match="mp3 audio cannot be 9000 Hz; its codec takes 8000, 11025, .* or 48000 Hz"):
        make_encoder("mp3", sample_rate=9000)
    for rate in (7999, 48001):
        with pytest.raises(ValueError, match="outside 8000 to 48000 Hz"):
            make_encoder("pcm", sample_rate=rate)
    wav, _ = encode("wav", [tone(0.1)], streamed=False, sample_rate=16000)
    import wave
    with wave.open(io.BytesIO(wav)) as w:
        assert (w.getframerate(), w.getnframes()) == (16000, 1600)


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
                             "wav": "audio/wav", "pcm": "audio/pcm", "mulaw": "audio/PCMU", "alaw": "audio/PCMA"}
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
