"""The tiny source: seeded random weights of `tiny_config()` (Kokoro's architecture at small
sizes), for tests and load tests where speed matters."""

from __future__ import annotations

import copy

from worker.weights.common import VOICE_NAMES, Weights, official_config


def tiny_config() -> dict:
    """A 2-layer, 64-wide PL-BERT; one layer of duration encoder / text encoder CNN; 128 text
    channels (hidden_dim); a 128-channel decoder with a 32-channel asr_res (the optional
    `decoder_dim` / `decoder_asr_res_dim` keys, 1024 / 64 when absent as in the official
    config.json); a 64-channel iSTFTNet generator (64 -> 32 -> 16 over its two upsamplings).
    What the rest of the system relies on stays as in Kokoro-82M: the vocab, style_dim 128 (voices
    [510, 256]), 512 positions, and the iSTFTNet rates and STFT (600 samples per frame at 24 kHz).

    Only worker.model.KokoroModel builds it: it reads every size from the config, while the
    reference `kokoro` package hard-codes the decoder's 1024/512/64 channels."""
    cfg = copy.deepcopy(official_config())
    cfg["plbert"] = {"hidden_size": 64, "num_attention_heads": 2, "intermediate_size": 128,
                     "max_position_embeddings": 512, "num_hidden_layers": 2, "dropout": 0.1}
    cfg["n_layer"] = 1
    cfg["hidden_dim"] = 128
    cfg["decoder_dim"] = 128
    cfg["decoder_asr_res_dim"] = 32
    cfg["istftnet"]["upsample_initial_channel"] = 64
    return cfg


def make_tiny_weights(seed: int = 0, cfg: dict | None = None) -> Weights:
    """Seeded random weights of `tiny_config()` (or `cfg`) and seeded random voices for VOICE_NAMES,
    from the model's own random init: speech-like durations and F0, finite spectra."""
    from worker.model.random_init import random_state_dict, random_voices

    cfg = tiny_config() if cfg is None else cfg
    state_dict = random_state_dict(cfg, seed=seed)
    voices = random_voices(VOICE_NAMES, seed=seed)
    info = {"source": "tiny", "seed": seed, "built_from": "worker.model.random_init", "voice_count": len(voices),
            "parameters": sum(t.numel() for sd in state_dict.values() for t in sd.values())}
    return Weights("tiny", cfg, state_dict, voices, info)
