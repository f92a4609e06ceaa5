"""Audio encoders that stream: float32 PCM chunks in, bytes of one container out.

One encoder per response. Every chunk of synthesized audio goes through the same codec and
muxer, so the bytes of a streamed response, concatenated, are one valid file of the format (and
codec frames straddle chunk joins: no gap or click where chunks meet). Bytes leave as soon as the
muxer writes them.

    enc = make_encoder("opus", streamed=True, volume=1.0)
    for pcm in pieces:                  # float32 [samples], 24 kHz mono
        send(enc.encode(pcm))           # may be b"" while the codec fills a frame
    send(enc.finish())                  # flushes the codec and writes the trailer

`pcm` and `wav` are written here directly (a WAV header is 44 bytes; PyAV would add nothing but
a seek we cannot do on a stream); mp3, opus (in Ogg), aac (ADTS) and flac go through PyAV, and so
do `mulaw` and `alaw`: raw G.711, the telephone network's audio (8 kHz unless asked otherwise).

Any format can leave at another sample rate than the model's 24 kHz (`sample_rate`, 8 to 48 kHz):
the encoder is then fed through one libswresample resampler for the whole response, whose filter
state carries across chunks, so joins stay seamless.

    enc = make_encoder("mulaw", sample_rate=8000)   # what a Twilio media stream carries
"""

from __future__ import annotations

import io
import struct
from dataclasses import dataclass

import av
import numpy as np

from worker.audio import SAMPLE_RATE, to_pcm16

# What each `response_format` is on the wire.
CONTENT_TYPES: dict[str, str] = {
    "mp3": "audio/mpeg",
    "opus": "audio/ogg",
    "aac": "audio/aac",
    "flac": "audio/flac",
    "wav": "audio/wav",
    "pcm": "audio/pcm",
    "mulaw": "audio/PCMU",  # RFC 3551's names for G.711 mu-law and A-law
    "alaw": "audio/PCMA",
}
FORMATS = tuple(CONTENT_TYPES)

# The output rates a response may ask for: the telephone's 8 kHz up to 48 kHz (the model makes 24 kHz).
MIN_SAMPLE_RATE, MAX_SAMPLE_RATE = 8000, 48000
# FFmpeg's encoders of the G.711 formats.
_G711 = {"mulaw": "pcm_mulaw", "alaw": "pcm_alaw"}


def default_sample_rate(fmt: str) -> int:
    """G.711 is telephone audio: 8 kHz, what telephony media streams expect. Every other format
    keeps the model's own 24 kHz."""
    return 8000 if fmt in _G711 else SAMPLE_RATE


def sample_rates(fmt: str) -> tuple[int, ...] | None:
    """The output rates `fmt` can carry within the bounds above, lowest first; None: any rate.
    mp3, aac and opus take their codec's rates only (read from FFmpeg's encoder)."""
    spec = _CODECS.get(fmt)
    rates = av.Codec(spec.codec, "w").audio_rates if spec is not None else None
    if rates is None:
        return None
    return tuple(sorted(r for r in rates if MIN_SAMPLE_RATE <= r <= MAX_SAMPLE_RATE))


def check_sample_rate(fmt: str, rate: int) -> None:
    """ValueError, saying which rates would do, when `fmt` cannot carry audio at `rate` Hz."""
    if not MIN_SAMPLE_RATE <= rate <= MAX_SAMPLE_RATE:
        raise ValueError(f"{rate} Hz is outside {MIN_SAMPLE_RATE} to {MAX_SAMPLE_RATE} Hz")
    allowed = sample_rates(fmt)
    if allowed is not None and rate not in allowed:
        raise ValueError(f"{fmt} audio cannot be {rate} Hz; its codec takes "
                         f"{', '.join(map(str, allowed[:-1]))} or {allowed[-1]} Hz")


class Encoder:
    """Streams one response's audio in one format. Not thread-safe; one per request."""

    content_type: str = "application/octet-stream"

    def encode(self, pcm: np.ndarray) -> bytes:  # float32 [samples]
        raise NotImplementedError

    def finish(self) -> bytes:
        raise NotImplementedError

    def close(self) -> None:
        """Release codec resources without writing a trailer (the client went away)."""


class PcmEncoder(Encoder):
    content_type = CONTENT_TYPES["pcm"]

    def __init__(self, volume: float = 1.0):
        self.volume = volume

    def encode(self, pcm: np.ndarray) -> bytes:
        return to_pcm16(pcm, self.volume).tobytes()

    def finish(self) -> bytes:
        return b""


# A streamed WAV cannot know its length when the header leaves. 0xFFFFFFFF in both RIFF and
# data sizes is what FFmpeg writes on unseekable output, and decoders (FFmpeg, browsers, sox,
# Python's wave with readframes) read such a file to its end.
_UNKNOWN_SIZE = 0xFFFFFFFF


def wav_header(data_bytes: int | None, sample_rate: int = SAMPLE_RATE, channels: int = 1) -> bytes:
    """A canonical 44-byte PCM s16le WAV header; data_bytes None means 'streamed, size unknown'."""
    block_align = channels * 2
    data_size = _UNKNOWN_SIZE if data_bytes is None else data_bytes
    riff_size = _UNKNOWN_SIZE if data_bytes is None else 36 + data_bytes
    return (
        b"RIFF" + struct.pack("<I", riff_size) + b"WAVE"
        + b"fmt " + struct.pack("<IHHIIHH", 16, 1, channels, sample_rate, sample_rate * block_align, block_align, 16)
        + b"data" + struct.pack("<I", data_size)
    )


class WavEncoder(Encoder):
    """Streamed: header first with unknown size, then samples. Not streamed: everything is
    held until finish() so the header carries the exact size."""

    content_type = CONTENT_TYPES["wav"]

    def __init__(self, streamed: bool, volume: float = 1.0, sample_rate: int = SAMPLE_RATE):
        self.streamed = streamed
        self.volume = volume
        self.sample_rate = sample_rate
        self._header_sent = False
        self._held: list[bytes] = []

    def encode(self, pcm: np.ndarray) -> bytes:
        data = to_pcm16(pcm, self.volume).tobytes()
        if not self.streamed:
            self._held.append(data)
            return b""
        if not self._header_sent:
            self._header_sent = True
            return wav_header(None, self.sample_rate) + data
        return data

    def finish(self) -> bytes:
        if self.streamed:
            return b"" if self._header_sent else wav_header(None, self.sample_rate)
        data = b"".join(self._held)
        self._held.clear()
        return wav_header(len(data), self.sample_rate) + data


class _Sink(io.RawIOBase):
    """Where the muxer writes; encode() hands over whatever arrived since the last call.

    Unseekable when streaming (bytes already sent cannot be patched, and the muxers then write
    stream-friendly headers); seekable when the whole body is built before sending, so e.g. the
    mp3 muxer writes its Xing/LAME header with the exact length and gapless delay/padding."""

    def __init__(self, seekable: bool):
        self._seekable = seekable
        self._buf = io.BytesIO()
        self._taken = 0  # streamed: bytes already handed out

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return self._seekable

    def write(self, b) -> int:
        return self._buf.write(b)

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        if not self._seekable:
            raise io.UnsupportedOperation("streamed output is not seekable")
        return self._buf.seek(offset, whence)

    def tell(self) -> int:
        return self._buf.tell() if self._seekable else self._taken + self._buf.tell()

    def take(self) -> bytes:
        if self._seekable:  # the body leaves in one piece at the end
            return b""
        data = self._buf.getvalue()
        self._taken += len(data)
        self._buf = io.BytesIO()
        return data

    def everything(self) -> bytes:
        return self._buf.getvalue()


def s16_frame(pcm: np.ndarray, volume: float, sample_rate: int) -> av.AudioFrame | None:
    """float32 samples as a mono 16-bit PyAV frame at the levels pcm responses carry (None if empty)."""
    samples = to_pcm16(pcm, volume)
    if samples.size == 0:
        return None
    frame = av.AudioFrame.from_ndarray(samples.reshape(1, -1), format="s16", layout="mono")
    frame.sample_rate = sample_rate
    return frame


@dataclass(frozen=True)
class _Codec:
    container: str       # FFmpeg muxer name
    codec: str           # FFmpeg encoder name
    options: dict        # codec options
    container_options: dict
    bit_rate: int | None = None


_CODECS: dict[str, _Codec] = {
    # MPEG-2 layer III at 24 kHz, 64 kbit/s mono: transparent enough for speech. LAME's quality 5
    # (compression_level) instead of FFmpeg's default: less CPU for the same spectrum; faster levels
    # lose audibly (figures: loadtest/README.md).
    "mp3": _Codec("mp3", "libmp3lame", {"compression_level": "5"}, {}, 64_000),
    # Ogg pages are flushed every 100 ms of audio (default 1 s) so streamed opus leaves steadily.
    "opus": _Codec("ogg", "libopus", {"application": "voip"}, {"page_duration": "100000"}, 32_000),
    "aac": _Codec("adts", "aac", {}, {}, 64_000),
    "flac": _Codec("flac", "flac", {}, {}),
}


class AvEncoder(Encoder):
    """A PyAV muxer + encoder. PyAV's encode() resamples to the codec's sample format and cuts
    the input into the codec's frame size, keeping the remainder for the next chunk; finish()
    flushes that remainder and the codec's delay line, then writes the trailer, so no tail is
    lost (Kokoro-FastAPI's opus lost its last packets: they never flushed)."""

    def __init__(self, fmt: str, streamed: bool, volume: float = 1.0, sample_rate: int = SAMPLE_RATE):
        spec = _CODECS[fmt]
        self.content_type = CONTENT_TYPES[fmt]
        self.volume = volume
        self.sample_rate = sample_rate
        self._sink = _Sink(seekable=not streamed)
        self._container = av.open(
            self._sink, mode="w", format=spec.container,
            container_options=dict(spec.container_options),
        )
        # On unseekable output FFmpeg flushes its I/O buffer after every packet (flush_packets
        # defaults to "when not seekable"), so each encode() returns what the codec has produced.
        self._stream = self._container.add_stream(spec.codec, rate=sample_rate, options=dict(spec.options))
        self._stream.layout = "mono"
        if spec.bit_rate:
            self._stream.bit_rate = spec.bit_rate
        self._pts = 0
        self._done = False

    def _mux(self, frame: av.AudioFrame | None) -> None:
        for packet in self._stream.encode(frame):
            self._container.mux(packet)

    def encode(self, pcm: np.ndarray) -> bytes:
        frame = s16_frame(pcm, self.volume, self.sample_rate)
        if frame is None:
            return b""
        frame.pts = self._pts
        self._pts += frame.samples
        self._mux(frame)
        return self._sink.take()

    def finish(self) -> bytes:
        if self._done:
            return b""
        self._done = True
        self._mux(None)
        if self._pts == 0:  # no audio at all: still write the headers, so the body is a valid (empty) file
            self._container.start_encoding()
        self._container.close()
        if self._sink.seekable():
            return self._sink.everything()
        return self._sink.take()

    def close(self) -> None:
        if not self._done:
            self._done = True
            try:
                self._container.close()
            except Exception:  # a half-written container on a dropped request: nothing to save
                pass


class G711Encoder(Encoder):
    """Raw G.711 (`mulaw`, `alaw`): one byte a sample, no header, as telephone networks and their
    media streams carry it. FFmpeg's table codec; it holds nothing back between calls."""

    def __init__(self, fmt: str, sample_rate: int, volume: float = 1.0):
        self.content_type = CONTENT_TYPES[fmt]
        self.volume = volume
        self.sample_rate = sample_rate
        self._codec = av.CodecContext.create(_G711[fmt], "w")
        self._codec.sample_rate = sample_rate
        self._codec.format = "s16"
        self._codec.layout = "mono"

    def encode(self, pcm: np.ndarray) -> bytes:
        frame = s16_frame(pcm, self.volume, self.sample_rate)
        if frame is None:
            return b""
        return b"".join(bytes(packet) for packet in self._codec.encode(frame))

    def finish(self) -> bytes:
        return b"".join(bytes(packet) for packet in self._codec.encode(None))


class ResampledEncoder(Encoder):
    """`inner`, fed at its own rate instead of the model's 24 kHz: one libswresample resampler
    per response (float32 in and out; its default windowed-sinc filter keeps a 440 Hz tone over
    90 dB above the error and leaves nothing above the new Nyquist frequency to alias), so the
    filter runs on across chunk joins; finish() passes on the filter's last samples before
    flushing `inner`. Its CPU cost is small beside encoding's (loadtest/README.md)."""

    def __init__(self, inner: Encoder, sample_rate: int):
        self.inner = inner
        self.content_type = inner.content_type
        self._resampler = av.AudioResampler(format="flt", layout="mono", rate=sample_rate)

    def _resample(self, frame: av.AudioFrame | None) -> np.ndarray:
        frames = self._resampler.resample(frame)
        if not frames:
            return np.zeros(0, np.float32)
        return np.concatenate([f.to_ndarray().reshape(-1) for f in frames])

    def encode(self, pcm: np.ndarray) -> bytes:
        if pcm.size == 0:
            return self.inner.encode(pcm)
        frame = av.AudioFrame.from_ndarray(np.ascontiguousarray(pcm, np.float32).reshape(1, -1), format="flt",
                                           layout="mono")
        frame.sample_rate = SAMPLE_RATE
        return self.inner.encode(self._resample(frame))

    def finish(self) -> bytes:
        return self.inner.encode(self._resample(None)) + self.inner.finish()

    def close(self) -> None:
        self.inner.close()


def make_encoder(fmt: str, streamed: bool = True, volume: float = 1.0, sample_rate: int | None = None) -> Encoder:
    """The encoder for one response; fmt is one of FORMATS, sample_rate the output's (None: the
    format's default, `default_sample_rate`). ValueError for an unknown format or a rate it cannot carry."""
    if fmt not in CONTENT_TYPES:
        raise ValueError(f"unknown audio format {fmt!r}; expected one of {', '.join(FORMATS)}")
    rate = default_sample_rate(fmt) if sample_rate is None else sample_rate
    check_sample_rate(fmt, rate)
    encoder: Encoder
    if fmt == "pcm":
        encoder = PcmEncoder(volume)
    elif fmt == "wav":
        encoder = WavEncoder(streamed, volume, rate)
    elif fmt in _G711:
        encoder = G711Encoder(fmt, rate, volume)
    else:
        encoder = AvEncoder(fmt, streamed, volume, rate)
    return encoder if rate == SAMPLE_RATE else ResampledEncoder(encoder, rate)
