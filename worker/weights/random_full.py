"""The random-full source (`KOKORO_WEIGHTS=random-full`): the full Kokoro-82M config with seeded
RANDOM parameters (`worker.model.random_init.random_state_dict`: speech-like durations of about
2-6 frames a token, a voiced F0, finite spectra) and seeded random voices under every official
voice name, so every request the API accepts with the real weights is accepted here too.

What it is for: a machine the real weights cannot reach (a GPU box without network) that must still
serve the whole fleet at full size: the same parameter count, the same shapes, the same CUDA graphs
and the same audio lengths per text, so speed, memory and the scheduler's behaviour are those of the
real model. What it is not: speech. Its audio is noise-like; the log, /health and /ready say so.

Built in memory (a few seconds on a CPU, no cache file): each replica folds its own copy on load.
"""

from __future__ import annotations

from worker.weights.common import VOICE_NAMES, Weights

SOURCE = "random-full"
# What the log, /health and /ready say of these weights, so nobody takes the audio for speech.
NOTICE = ("RANDOM weights (KOKORO_WEIGHTS=random-full): full-size Kokoro-82M with seeded random parameters; "
          "the audio is NOT speech (load tests and benchmarks only)")


def random_full_weights(voice_names=("af_heart",), seed: int = 0) -> Weights:
    """`random_state_dict()` of the full config as `Weights` (built in memory, no serving file)."""
    from worker.model.random_init import full_config, random_state_dict, random_voices

    config = full_config()
    return Weights("random-full", config, random_state_dict(config, seed=seed), random_voices(voice_names, seed=seed),
                   {"source": "random-full"})


def make_random_full_weights(seed: int = 0) -> Weights:
    """Seeded random weights of the full Kokoro-82M config, and seeded random voices for VOICE_NAMES."""
    weights = random_full_weights(VOICE_NAMES, seed=seed)
    weights.info = {"source": SOURCE, "random": True, "notice": NOTICE, "seed": seed,
                    "built_from": "worker.model.random_init", "voice_count": len(weights.voices),
                    "parameters": sum(t.numel() for sd in weights.state_dict.values() for t in sd.values())}
    return weights
