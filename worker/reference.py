"""The reference implementation (the `kokoro==0.9.4` package's KModel), for parity tests and bench.

`kokoro/__init__.py` imports the misaki G2P pipeline and spaCy, which we neither need nor install;
the package module is therefore created by hand (pointing at the installed directory) and only
`kokoro.model` is imported. KModel insists on a checkpoint path, so the state dict is written to a
temporary file in the official layout (component -> parameters).
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import sys
import tempfile
import types
from pathlib import Path
from typing import Iterator

import torch


class ReferenceUnavailable(RuntimeError):
    """The reference package is not installed (`pip install --no-deps kokoro==0.9.4 loguru`)."""


def reference_module() -> types.ModuleType:
    """`kokoro.model`, imported without running `kokoro/__init__.py`."""
    if "kokoro.model" in sys.modules:
        return sys.modules["kokoro.model"]
    spec = importlib.util.find_spec("kokoro")
    if spec is None or not spec.submodule_search_locations:
        raise ReferenceUnavailable("the reference package is missing: pip install --no-deps kokoro==0.9.4 loguru")
    package = sys.modules.get("kokoro")
    if package is None:
        package = types.ModuleType("kokoro")
        package.__path__ = list(spec.submodule_search_locations)
        package.__file__ = str(Path(package.__path__[0]) / "__init__.py")
        sys.modules["kokoro"] = package
    return importlib.import_module("kokoro.model")


def build_reference(config: dict, state_dict: dict[str, dict[str, torch.Tensor]]) -> torch.nn.Module:
    """A reference KModel (eval mode, CPU, float32) holding these weights, loaded strictly."""
    KModel = reference_module().KModel
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "kokoro.pth"
        torch.save({name: dict(sd) for name, sd in state_dict.items()}, path)
        model = KModel(repo_id="hexgrad/Kokoro-82M", config=config, model=str(path))
    # KModel falls back to strict=False silently when a key mismatches; make a mismatch loud. The
    # only keys allowed missing are the InstanceNorm affine parameters the reference adds (identity
    # at init; the official checkpoint has none).
    for name, sd in state_dict.items():
        result = getattr(model, name).load_state_dict(sd, strict=False)
        missing = [k for k in result.missing_keys if not k.endswith((".norm.weight", ".norm.bias"))]
        if missing or result.unexpected_keys:
            raise ValueError(f"reference {name}: missing {missing[:5]}, unexpected {result.unexpected_keys[:5]}")
    return model.eval()


class _NoRandomTorch(types.ModuleType):
    """`torch` as the reference's istftnet module sees it, with rand / randn_like returning zeros."""

    def __init__(self):
        super().__init__("torch")

    def __getattr__(self, name):
        return getattr(torch, name)

    @staticmethod
    def rand(*size, **kwargs):
        return torch.zeros(*size, **kwargs)

    @staticmethod
    def randn_like(x, **kwargs):
        return torch.zeros_like(x, **kwargs)


@contextlib.contextmanager
def reference_noise_off() -> Iterator[None]:
    """Switch off the reference's random sources (SineGen's random initial phase and additive
    noise, the source module's noise branch), as in the ONNX export. Affects kokoro.istftnet only."""
    reference_module()
    istftnet = sys.modules["kokoro.istftnet"]
    saved = istftnet.torch
    istftnet.torch = _NoRandomTorch()
    try:
        yield
    finally:
        istftnet.torch = saved


@torch.no_grad()
def reference_synthesize(model: torch.nn.Module, ids: torch.Tensor, style: torch.Tensor,
                         speed: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """ids: [1, T] with the boundary pads, style: [1, 256] -> (waveform [S], durations [T])."""
    audio, durations = model.forward_with_tokens(ids, style, speed)
    return audio.reshape(-1), durations.reshape(-1)


# --- parity measures (tests, bench, gpu_check) ------------------------------------------------------

def snr_db(reference, other) -> float:
    """Signal-to-noise ratio of `other` against `reference` (same length), in dB."""
    import numpy as np

    reference = np.asarray(reference, dtype=np.float64)
    other = np.asarray(other, dtype=np.float64)
    if reference.shape != other.shape:
        raise ValueError(f"lengths differ: {reference.shape} vs {other.shape}")
    noise = ((reference - other) ** 2).sum()
    return float("inf") if noise == 0 else float(10 * np.log10((reference ** 2).sum() / noise))


def log_spectral_distance_db(reference, other, n_fft: int = 1024, hop: int = 256, floor_db: float = -80.0) -> float:
    """Mean absolute difference of the two log-magnitude spectrograms, in dB (bins floored at
    `floor_db` below the reference's peak, so silence does not dominate)."""
    a = torch.as_tensor(reference, dtype=torch.float32)
    b = torch.as_tensor(other, dtype=torch.float32)
    n = min(a.numel(), b.numel())
    window = torch.hann_window(n_fft)
    spec = [torch.stft(x[:n], n_fft, hop, window=window, return_complex=True).abs() for x in (a, b)]
    floor = spec[0].max() * 10 ** (floor_db / 20)
    db = [20 * torch.log10(s.clamp(min=floor)) for s in spec]
    return float((db[0] - db[1]).abs().mean())
