"""A recording to fit a voice to: decoded from any container PyAV reads (wav, mp3, flac, ogg/opus,
m4a, ...) to mono 16 kHz float32, and checked before any fitting: `SampleError` says what is wrong
(too short, silence or noise only, several voices, a file that does not decode or is too large).
"""

from __future__ import annotations

import io
from dataclasses import dataclass

import numpy as np

from worker.request_errors import RequestFieldError
from worker.voice_fit.measures import pitch_track
from worker.voice_fit.speaker import ENCODER_RATE, SpeakerEncoder, trim_silences

MAX_SAMPLE_BYTES = 25 << 20        # 25 MiB: a minute of 16-bit 48 kHz stereo WAV is 11 MiB
MIN_SPEECH_S = 8.0                 # of sound after silences are trimmed
MAX_SAMPLE_S = 180.0               # decoded; longer recordings are cut to their first three minutes
MIN_VOICED_SHARE = 0.25            # frames with a pitch among those with sound: speech is well above
# Partial embeddings of one speaker stay close; two speakers give two groups far apart.
SEVERAL_VOICES_SIMILARITY = 0.7


class SampleError(RequestFieldError):
    """The recording (or the voice's name) cannot be fitted; `code` names the fault, the message
    says what to send instead; `param` the request field at fault (`file` or `name`)."""

    param = "file"

    def __init__(self, code: str, message: str, param: str | None = None):
        super().__init__(message, param)
        self.code = code


@dataclass
class Sample:
    audio: np.ndarray       # float32 mono 16 kHz, as decoded (at most MAX_SAMPLE_S)
    speech_s: float         # seconds of sound once silences are trimmed
    source_rate: int
    source_format: str


def decode(data: bytes) -> tuple[np.ndarray, int, str]:
    """(mono float32 at 16 kHz, the file's own rate, its container's name); SampleError if it does not decode."""
    import av  # noqa: PLC0415 - PyAV is a server dependency; imported only where audio is read

    if len(data) > MAX_SAMPLE_BYTES:
        raise SampleError("sample_too_large", f"the recording is {len(data) / 2**20:.1f} MiB; send at most "
                          f"{MAX_SAMPLE_BYTES >> 20} MiB (10 to 60 s of speech is enough)")
    try:
        with av.open(io.BytesIO(data), mode="r") as container:
            stream = next((s for s in container.streams if s.type == "audio"), None)
            if stream is None:
                raise SampleError("sample_not_audio", "the file holds no audio stream")
            resampler = av.AudioResampler(format="flt", layout="mono", rate=ENCODER_RATE)
            pieces, total, rate = [], 0, stream.rate or 0
            for frame in container.decode(stream):
                for out in resampler.resample(frame):
                    pieces.append(out.to_ndarray().reshape(-1))
                    total += pieces[-1].size
                if total >= MAX_SAMPLE_S * ENCODER_RATE:
                    break
            for out in resampler.resample(None):
                pieces.append(out.to_ndarray().reshape(-1))
            name = container.format.name
    except SampleError:
        raise
    except Exception as e:  # av.error.*, or a container it half-reads
        raise SampleError("sample_undecodable", f"the recording does not decode as audio ({type(e).__name__}: "
                          f"{str(e)[:200]}); send wav, mp3, flac, ogg/opus or m4a") from None
    audio = np.concatenate(pieces).astype(np.float32) if pieces else np.zeros(0, np.float32)
    if audio.size == 0:
        raise SampleError("sample_undecodable", "the recording decodes to no audio at all")
    return audio[:int(MAX_SAMPLE_S * ENCODER_RATE)], rate, name


def check(audio: np.ndarray, encoder: SpeakerEncoder | None = None) -> float:
    """Seconds of speech in `audio` (16 kHz); SampleError for silence, noise or too little speech,
    and, given the encoder, for several voices."""
    peak = float(np.max(np.abs(audio))) if audio.size else 0.0
    if peak < 1e-3 or float(np.sqrt(np.mean(audio ** 2))) < 3e-4:
        raise SampleError("sample_silent", "the recording is silent; record one speaker talking for 10 to 60 s")
    f0, loud = pitch_track(audio)
    voiced_share = float((~np.isnan(f0)).sum() / max(1, loud.sum()))
    if voiced_share < MIN_VOICED_SHARE:
        raise SampleError("sample_not_speech", f"the recording sounds like noise, not speech (only {voiced_share:.0%} "
                          "of its sound has a voice's pitch); record one speaker in a quiet room")
    speech_s = len(trim_silences(audio)) / ENCODER_RATE
    if speech_s < MIN_SPEECH_S:
        raise SampleError("sample_too_short", f"the recording holds {speech_s:.1f} s of speech; send at least "
                          f"{MIN_SPEECH_S:.0f} s (10 to 60 s is best)")
    if encoder is not None:
        similarity = two_speaker_similarity(encoder.embed_partials(audio))
        if similarity is not None and similarity < SEVERAL_VOICES_SIMILARITY:
            raise SampleError("sample_several_voices", "the recording seems to hold more than one voice "
                              f"(or music): its parts sound like different speakers (similarity {similarity:.2f}); "
                              "send one speaker alone")
    return speech_s


def two_speaker_similarity(partials: np.ndarray) -> float | None:
    """Split the partial embeddings in two (2-means from the two least alike) and give the two
    groups' similarity; None when there are too few partials or one group is a stray few."""
    if len(partials) < 6:
        return None
    sims = partials @ partials.T
    i, j = np.unravel_index(np.argmin(sims), sims.shape)
    centres = partials[[i, j]]
    for _ in range(10):
        group = np.argmax(partials @ centres.T, axis=1)
        if group.min() == group.max():
            return None
        centres = np.stack([partials[group == g].mean(axis=0) for g in (0, 1)])
        centres /= np.linalg.norm(centres, axis=1, keepdims=True)
    if min(np.bincount(group, minlength=2)) < max(2, len(partials) // 5):
        return None
    return float(centres[0] @ centres[1])


def read_sample(data: bytes, encoder: SpeakerEncoder | None = None) -> Sample:
    audio, rate, name = decode(data)
    return Sample(audio, check(audio, encoder), rate, name)


def resample(audio: np.ndarray, rate: int, to: int = ENCODER_RATE) -> np.ndarray:
    """Mono float32 audio from `rate` to `to` Hz through libswresample (PyAV)."""
    import av  # noqa: PLC0415

    if rate == to:
        return np.asarray(audio, dtype=np.float32)
    frame = av.AudioFrame.from_ndarray(np.ascontiguousarray(audio, dtype=np.float32).reshape(1, -1),
                                       format="flt", layout="mono")
    frame.sample_rate = rate
    resampler = av.AudioResampler(format="flt", layout="mono", rate=to)
    out = [f.to_ndarray().reshape(-1) for f in resampler.resample(frame)]
    out += [f.to_ndarray().reshape(-1) for f in resampler.resample(None)]
    return np.concatenate(out).astype(np.float32) if out else np.zeros(0, np.float32)
