"""Voices fitted to a recording (a library: no HTTP, no Redis).

`fit_recording(engine, voices, sample_bytes, name)` decodes and checks a recording
(recording.py: SampleError for what cannot be fitted), picks the stock voices to start from and
the sentences a candidate is heard saying, and runs the search (fit.py), reporting progress.
The speaker encoder (speaker.py) is Resemblyzer's, its weights from the installed package;
the second measure (measures.py) is pitch and spectral envelope.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import torch

from worker.voice_fit.fit import DEFAULT_SENTENCES, FitCancelled, FitProgress, FitResult, VoiceFitter, stock_cache_key
from worker.voice_fit.recording import SampleError, read_sample
from worker.voice_fit.speaker import EncoderMissing, speaker_encoder

__all__ = ["FitCancelled", "FitProgress", "FitResult", "EncoderMissing", "SampleError", "fit_recording", "fit_pool",
           "fit_sentences", "check_fit_name"]

# Transcript sentences a candidate says: enough for the encoder (a few seconds), few enough to stay fast.
TRANSCRIPT_SENTENCES = 3
SENTENCE_PHONEMES = (20, 160)


def check_fit_name(name: str, builtin: set[str] | list[str]) -> str:
    """The fitted voice's name, lowercased; SampleError('invalid_name') if it lacks a language and
    gender letter as Kokoro's voices have, or is a built-in voice's."""
    from worker.voices import VoiceFileError, voice_file_name

    try:
        if not isinstance(name, str) or "/" in name or "\\" in name:
            raise VoiceFileError(name)
        name = voice_file_name(Path(f"{name.strip()}.pt"))
    except VoiceFileError:
        raise SampleError("invalid_name", f"name {name!r}: a voice's name starts with its language letter (a American "
                          "English, b British English, e, f, h, i, j, p, z), then f or m, '_' and letters, digits "
                          "or '_', e.g. af_mine", "name") from None
    if name in set(builtin):
        raise SampleError("name_taken", f"name {name!r} is a built-in voice's; choose another (e.g. {name[:3]}mine)", "name")
    return name


def fit_sentences(lang_code: str, transcript: str | None) -> tuple[list[str], list[list[int]]]:
    """(texts, phoneme ids) of the sentences a candidate says: the transcript's first sentences
    where given (the speech then says what the recording says), else a default set."""
    from worker.text.chunks import text_to_chunks

    lang = lang_code if transcript else "a" if lang_code not in ("a", "b") else lang_code
    texts = []
    if transcript and transcript.strip():
        chunks = text_to_chunks(transcript.strip(), lang, first_chunk_phonemes=SENTENCE_PHONEMES[1],
                                chunk_phonemes=SENTENCE_PHONEMES[1])
        picked = [c for c in chunks if len(c.ids) >= SENTENCE_PHONEMES[0]][:TRANSCRIPT_SENTENCES]
        if picked:
            return [c.text for c in picked], [list(c.ids) for c in picked]
    texts = list(DEFAULT_SENTENCES["en"])
    ids = [list(text_to_chunks(t, lang, first_chunk_phonemes=SENTENCE_PHONEMES[1])[0].ids) for t in texts]
    return texts, ids


def fit_pool(name: str, voices: dict[str, torch.Tensor], exclude: set[str] = frozenset()) -> dict[str, torch.Tensor]:
    """The stock voices a fit starts from: English ones (American and British) for an English voice,
    else the voice's language's and the English ones; never those in `exclude`."""
    lang = name[:1]
    langs = {"a", "b"} | {lang}
    return {n: p for n, p in voices.items() if n[:1] in langs and n not in exclude}


def fit_recording(engine, voices: dict[str, torch.Tensor], sample: bytes, name: str, *, transcript: str | None = None,
                  candidates: int = 120, minutes: float | None = 10.0, seed: int = 0, cache_dir: Path | None = None,
                  exclude: set[str] = frozenset(), fingerprint: str = "",
                  progress: Callable[[FitProgress], None] | None = None,
                  cancelled: Callable[[], bool] = lambda: False) -> FitResult:
    """Fit a voice named `name` (checked by the caller) to the recording `sample` (file bytes)."""
    if progress is not None:  # the first report, before the recording is read and the encoder loaded
        progress(FitProgress("check", 0, candidates, float("-inf"), float("-inf"), 0.0, minutes * 60 if minutes else 0.0,
                             "reading the recording"))
    encoder = speaker_encoder()
    recording = read_sample(sample, encoder)
    texts, ids = fit_sentences(name[:1], transcript)
    pool = fit_pool(name, voices, exclude)
    cache = None
    if cache_dir is not None:
        cache = Path(cache_dir) / "voice-fit" / f"stock-{stock_cache_key(fingerprint, engine.dtype, ids)}.npz"
    fitter = VoiceFitter(engine, pool, ids, encoder, cache)
    result = fitter.fit(recording.audio, candidates=candidates, seed=seed, minutes=minutes, progress=progress,
                        cancelled=cancelled)
    result.report.update(name=name, text_checked=texts, sample_speech_s=round(recording.speech_s, 1),
                         sample_format=recording.source_format, sample_rate=recording.source_rate)
    return result
