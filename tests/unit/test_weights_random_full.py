"""KOKORO_WEIGHTS=random-full: the full Kokoro-82M config with seeded random weights and a random
voice under every official name, which the server serves like real weights (and says are random)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from api.routes.status_routes import engine_status as _engine
from worker.engine import Engine, EngineConfig
from api.settings import Settings, SettingsError
from worker.text import text_to_chunks
from worker.weights import VOICE_NAMES, load_weights, official_config
from api.settings import weights_source
from cli.weights_cli import describe
from worker.weights.common import STYLE_WIDTH, VOICE_ROWS


@pytest.fixture(scope="module")
def weights():
    return load_weights(weights_source(Settings.from_env({"KOKORO_WEIGHTS": "random-full"})))


def test_the_source_has_the_full_config_every_voice_and_says_it_is_random(weights):
    assert weights.source == "random-full"
    assert weights.config == official_config()          # full size: not the tiny config
    assert 80e6 < weights.info["parameters"] < 85e6       # Kokoro-82M
    assert set(weights.voices) == set(VOICE_NAMES)       # every voice the API may be asked for
    assert all(v.shape == (VOICE_ROWS, STYLE_WIDTH) and v.dtype == torch.float32 for v in weights.voices.values())
    assert weights.info["random"] is True and "NOT speech" in weights.info["notice"]
    assert weights.serving_dir is None                   # built in memory: no serving file written anywhere
    settings = Settings.from_env({"KOKORO_WEIGHTS": "random-full"})
    assert _engine(settings)["random_weights"] is True   # /health and /ready say so
    assert describe(settings)["random"] is True          # so does `kokoro-fleet weights`


def test_seeded():
    a = load_weights(weights_source(Settings.from_env({"KOKORO_WEIGHTS": "random-full", "KOKORO_SEED": "3"})))
    b = load_weights(weights_source(Settings.from_env({"KOKORO_WEIGHTS": "random-full", "KOKORO_SEED": "4"})))
    w = "F0_proj.weight"
    assert not torch.equal(a.state_dict["predictor"][w], b.state_dict["predictor"][w])
    assert not torch.equal(a.voices["af_heart"], b.voices["af_heart"])


def test_a_short_text_gives_audio_of_speech_like_length_on_cpu(weights):
    """The CPU path folds the weights in memory (serving_state_dict without a serving file)."""
    engine = Engine(weights, EngineConfig("cpu", "fp32", fused_kernels=False))
    (chunk,) = text_to_chunks("The quick brown fox jumps over the lazy dog.")
    out = engine.synthesize(chunk.ids, weights.voices["am_adam"][len(chunk.ids) - 1])
    seconds = len(out.audio) / engine.sample_rate
    frames_per_token = out.durations[1:-1].mean()
    # real speech: about 2-3 s for this sentence, 2-6 frames (50-150 ms) a phoneme
    assert 1.0 < seconds < 6.0 and 1.5 < frames_per_token < 7.0, (seconds, frames_per_token)
    assert np.isfinite(out.audio).all() and np.abs(out.audio).max() > 0


def test_an_unknown_source_is_still_refused():
    with pytest.raises(SettingsError):
        Settings.from_env({"KOKORO_WEIGHTS": "random-fulll"})
