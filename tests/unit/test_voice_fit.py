"""Voice fitting as a library (worker/voice_fit), on the tiny model: the recording's checks, the
encoder and measures on made-up speech, and the fit's determinism and progress. What it achieves
on the real weights is the benchmark's (loadtest/bench/voice_fit.py, docs/voices.md)."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch

from voice_samples import encoded, speechlike, wav_file
from worker.voice_fit import SampleError, check_fit_name, fit_pool, fit_recording
from worker.voice_fit.measures import measure
from worker.voice_fit.recording import MAX_SAMPLE_BYTES, read_sample
from worker.voice_fit.speaker import mel_filterbank, speaker_encoder

LOW = ((600, 1000, 2400), (300, 2000, 2800), (450, 800, 2300))
HIGH = ((900, 1500, 3000), (400, 2700, 3400), (700, 1200, 2900))


@pytest.fixture(scope="module")
def encoder():
    return speaker_encoder()


def _refusal(data: bytes, encoder) -> SampleError:
    with pytest.raises(SampleError) as caught:
        read_sample(data, encoder)
    return caught.value


def test_a_recording_of_one_speaker_is_read_in_every_container(encoder):
    from worker.voice_fit.recording import decode

    audio = speechlike(10, 120, LOW)
    for fmt in ("mp3", "flac", "ogg", "m4a", "webm", "recorded-mp4"):  # the last two: what browsers record
        decoded, _, _ = decode(encoded(audio, fmt))
        assert abs(len(decoded) / 16000 - 10) < 0.2, fmt
    sample = read_sample(wav_file(speechlike(10, 120, LOW, rate=44100), 44100), encoder)
    assert sample.source_rate == 44100 and 9 < sample.speech_s <= 10.2


def test_bad_recordings_are_refused_with_what_to_send(encoder):
    rng = np.random.default_rng(0)
    cases = {
        "sample_silent": wav_file(np.zeros(16000 * 15, np.float32)),
        "sample_not_speech": wav_file(rng.normal(0, 0.1, 16000 * 15).astype(np.float32)),
        "sample_too_short": wav_file(speechlike(4, 120, LOW)),
        "sample_several_voices": wav_file(np.concatenate([speechlike(10, 110, LOW, seed=1),
                                                          speechlike(10, 240, HIGH, seed=2)])),
        "sample_undecodable": b"RIFF\x00\x00\x00\x00WAVEnot audio at all" * 10,
        "sample_too_large": b"\x00" * (MAX_SAMPLE_BYTES + 1),
    }
    for code, data in cases.items():
        error = _refusal(data, encoder)
        assert error.code == code and error.param == "file", (code, str(error))
    assert "at least 8 s" in str(_refusal(cases["sample_too_short"], encoder))


def test_a_fitted_voice_needs_a_language_letter_and_a_name_of_its_own():
    assert check_fit_name("AF_Mine", {"af_heart"}) == "af_mine"
    for bad, code in (("mine", "invalid_name"), ("xf_mine", "invalid_name"), ("af-mine", "invalid_name"),
                      ("../af_x", "invalid_name"), ("af_heart", "name_taken")):
        with pytest.raises(SampleError) as caught:
            check_fit_name(bad, {"af_heart"})
        assert caught.value.code == code and caught.value.param == "name", bad


def test_the_encoder_and_measures_tell_speakers_apart(encoder):
    low, low_again, high = speechlike(10, 110, LOW, seed=1), speechlike(10, 110, LOW, seed=5), speechlike(10, 240, HIGH, seed=2)
    same = float(encoder.embed(low) @ encoder.embed(low_again))
    other = float(encoder.embed(low) @ encoder.embed(high))
    assert same > 0.9 and other < same - 0.2
    m_low, m_high = measure(low), measure(high)
    assert abs(m_low.as_dict()["pitch_hz"] - 110) < 6 and abs(m_high.as_dict()["pitch_hz"] - 240) < 12
    assert m_low.envelope_distance(measure(low_again)) < m_low.envelope_distance(m_high)
    # librosa's Slaney mel filterbank: each filter's area normalized, peaks on the mel grid
    bank = mel_filterbank(16000, 400, 40)
    assert bank.shape == (40, 201) and (bank.max(axis=1) > 0).all()


def test_the_pitch_is_read_between_the_trackers_lags():
    """A steady voice whose period falls between two whole lags of the 16 kHz tracker is read to
    a hundredth of a semitone (a whole lag is 0.2 semitones at 200 Hz, 0.12 at 110 Hz)."""
    seconds = np.arange(3 * 16000) / 16000
    for period in (80.4, 145.5, 60.7):
        f0 = 16000 / period
        tone = 0.3 * sum(np.sin(2 * np.pi * k * f0 * seconds) / k for k in range(1, 8))
        assert abs(measure(tone.astype(np.float32)).pitch_median - 12 * np.log2(f0 / 55)) < 0.01, period


def test_stock_figures_cached_by_an_older_measure_are_not_reused(monkeypatch):
    from worker.voice_fit import fit

    key = fit.stock_cache_key("weights", "bf16", [[1, 2, 3]])
    monkeypatch.setattr(fit, "MEASURE_VERSION", fit.MEASURE_VERSION + 1)
    assert fit.stock_cache_key("weights", "bf16", [[1, 2, 3]]) != key


def _fit(tiny_weights, sample: bytes, seed: int, steps: list | None = None):
    from worker.engine import Engine, EngineConfig

    engine = Engine(tiny_weights, EngineConfig("cpu", "fp32"))
    voices = {n: tiny_weights.voices[n] for n in ("af_heart", "am_adam", "bm_george")}
    return fit_recording(engine, voices, sample, "af_mine", candidates=5, minutes=None, seed=seed,
                         progress=steps.append if steps is not None else None)


@pytest.mark.slow
def test_a_fit_is_deterministic_for_a_seed_and_reports_progress_from_the_start(tiny_weights):
    sample = wav_file(speechlike(10, 110, LOW, seed=1))
    steps: list = []
    first = _fit(tiny_weights, sample, seed=3, steps=steps)
    again = _fit(tiny_weights, sample, seed=3)
    assert torch.equal(first.pack, again.pack) and first.report["mixture"] == again.report["mixture"]
    assert first.pack.shape == (510, tiny_weights.voices["af_heart"].shape[-1])
    assert torch.isfinite(first.pack).all()
    phases = [s.phase for s in steps]
    assert phases[0] == "check" and phases[-1] == "done" and {"stock", "mixture", "refine"} <= set(phases)
    assert [s.done for s in steps] == sorted(s.done for s in steps)  # progress only moves forward
    assert steps[-1].done == steps[-1].total == 3 + 5
    report = first.report
    assert report["candidates"] == 5 and report["name"] == "af_mine" and report["text_checked"]
    # the best candidate is kept: never worse than the nearest stock voice it started from
    assert report["score"] >= report["nearest_stock_score"] and report["nearest_stock_voice"] in ("af_heart", "am_adam", "bm_george")


def test_the_gradients_ear_hears_what_the_ear_hears_and_its_step_moves_the_voice(tiny_weights, encoder):
    """The refinement's differentiable encoder (24 kHz, no resampling) embeds as the encoder does on
    the same speech resampled to 16 kHz; its pitch and envelope start at the ear's figures (the
    offsets); a step runs backward through the served model's float32 twin (no in-place op in the
    way) and moves the style."""
    from worker.engine import Engine, EngineConfig
    from worker.voice_fit.fit import CandidateEar, DEFAULT_SENTENCES
    from worker.voice_fit.gradient import GradientRefiner, float_twin
    from worker.voice_fit.recording import resample
    from worker.text.chunks import text_to_chunks

    engine = Engine(tiny_weights, EngineConfig("cpu", "fp32", noise=False))
    ids = [list(text_to_chunks(t, "a")[0].ids) for t in DEFAULT_SENTENCES["en"][:1]]
    base = tiny_weights.voices["af_heart"].reshape(510, -1).float()
    ear = CandidateEar(engine, encoder, ids)
    heard = ear.hear(base)
    target = ear.hear(tiny_weights.voices["am_adam"].reshape(510, -1).float())
    spread = torch.ones(base.shape[1])
    refiner = GradientRefiner(float_twin(engine.model), encoder, ids, base, spread, target.embedding,
                              target.measures, heard.measures, pitch_weight=0.1, envelope_weight=0.015)
    with torch.no_grad():
        audio, f0 = refiner.speak(torch.zeros(base.shape[1]))
        assert audio.shape[0] == sum(len(ear.engine.synthesize(i, base[len(i) - 1]).audio) for i in ids) \
            + len(ids) * engine.sample_rate // 5
        # speech-like sound (the tiny model's is noise, mostly above the encoder's 8 kHz)
        voice = speechlike(6, 140, LOW, seed=2, rate=engine.sample_rate).astype(np.float32)
        differentiable = refiner.embed(torch.from_numpy(voice)).numpy()
    assert float(differentiable @ encoder.embed(resample(voice, engine.sample_rate))) > 0.99
    first = refiner.step()
    assert torch.equal(first.shift, torch.zeros(base.shape[1]))  # the proposal is where the step began
    assert not math.isnan(first.pitch) and abs(first.pitch - heard.measures.pitch_median) < 1e-3
    moved = refiner.shift()
    assert torch.isfinite(moved).all() and moved.abs().max() > 0
    half = base.shape[1] // 2
    assert moved[half:].abs().max() > 0  # the pitch term moves the prosody half
    # without a pitch to reach, the prosody half (what sets F0) stays: the encoder and the envelope
    # move the timbre half only
    pitchless = dataclasses.replace(target.measures, pitch_median=float("nan"), pitch_spread=float("nan"))
    refiner = GradientRefiner(float_twin(engine.model), encoder, ids, base, spread, target.embedding,
                              pitchless, heard.measures, pitch_weight=0.1, envelope_weight=0.015)
    refiner.step()
    moved = refiner.shift()
    assert moved[:half].abs().max() > 0 and torch.equal(moved[half:], torch.zeros(base.shape[1] - half))


def test_the_pool_keeps_the_voices_language_and_drops_what_is_excluded(tiny_weights):
    pool = fit_pool("bf_mine", tiny_weights.voices, exclude={"bf_emma"})
    assert pool and all(n[0] in "ab" for n in pool) and "bf_emma" not in pool
    assert {n[0] for n in fit_pool("ff_mine", tiny_weights.voices)} == {"a", "b", "f"}
