"""Random weights of the full Kokoro-82M config that behave like speech where it matters for
speed and parity: realistic durations (about 2-6 frames a token), a voiced F0 around 150 Hz, and
decoder convolutions initialised small (as iSTFTNet's init does) so exp() of the spectrum stays
finite. Used by the parity tests and by `python -m loadtest.bench --weights random-full` on a GPU
box, where the real weights cannot travel; worker/weights/random_full.py makes `Weights` of them
(the model's parameters here, the weights' container there: worker/weights imports worker/model,
never the other way).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

CONFIG_PATH = Path(__file__).resolve().parent.parent / "kokoro_config.json"


def full_config() -> dict:
    return json.loads(CONFIG_PATH.read_text(encoding="utf-8"))


@torch.no_grad()
def random_state_dict(config: dict | None = None, seed: int = 0) -> dict[str, dict[str, torch.Tensor]]:
    """component -> official-layout state dict, seeded."""
    from worker.model.kokoro import COMPONENTS, KokoroModel
    from worker.model.layers import WNConv1d, WNConvTranspose1d

    config = full_config() if config is None else config
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = KokoroModel(config)
        generator = model.decoder.generator
        for m in generator.modules():  # iSTFTNet's init: N(0, 0.01) for generator convolutions
            if isinstance(m, (WNConv1d, WNConvTranspose1d)):
                m.weight_v.normal_(0.0, 0.01)
                m.weight_g.copy_(torch.norm_except_dim(m.weight_v, 2, 0))
        # The harmonic branch's phase channels see the phases of near-empty STFT bins: numerically
        # chaotic in the reference itself (a 1e-7 relative change of F0 moves its output by ~20 dB
        # SNR with random weights). Trained weights learned to lean on them little (~30 dB at the
        # same change); random ones lean fully, so they are zeroed here to keep parity testable.
        bins = config["istftnet"]["gen_istft_n_fft"] // 2 + 1
        for conv in generator.noise_convs:
            conv.weight[:, bins:].zero_()
        # durations: sigmoid(logits).sum() over max_dur outputs ~ 2-6 frames
        proj = model.predictor.duration_proj.linear_layer
        proj.weight.mul_(2.0)
        proj.bias.fill_(-2.8)
        # F0 around 150 Hz with some movement; energy small
        model.predictor.F0_proj.weight.mul_(20.0)
        model.predictor.F0_proj.bias.fill_(150.0)
        state = {c: {k: v.detach().clone() for k, v in getattr(model, c).state_dict().items()} for c in COMPONENTS}
    return state


def random_voices(names, seed: int = 0) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed + 1)
    return {name: torch.randn(510, 256, generator=generator) * 0.3 for name in names}
