"""The engine's arithmetic on CUDA: exact for stage 1 always, one of three modes for stage 2.

Stage 2's modes are three separate effects, so a measurement credits each with its own:
* `exact`: float32 without TF32, deterministic cuDNN (a chunk's audio bit-identical run to run).
  PyTorch refuses cuDNN for dilated convolutions in deterministic mode (the resblocks' dilation-3
  and -5 convolutions), so those run a slower fallback.
* `exact-nondeterministic`: still no TF32, but cuDNN's non-deterministic algorithms allowed, so the
  dilated convolutions keep cuDNN; audio may differ in the last bits run to run.
* `fast`: TF32 and cudnn.benchmark on top. TF32 is part of dynamo's guards and of inductor's cache
  key: a `fast` engine compiles its own graphs, the two exact modes share theirs.
Process-wide flags (one engine per replica process); set around stage 2, exact again after it.
"""

from __future__ import annotations

import contextlib

import torch

STAGE2_MODES = ("exact", "exact-nondeterministic", "fast")
# Exact until a GPU run shows another mode within the parity bounds (loadtest/bench/gpu_parity.py):
# parity decides first, speed second.
STAGE2_DEFAULT = "exact"


def check_stage2_mode(mode: str) -> str:
    if mode not in STAGE2_MODES:
        raise ValueError(f"stage2 arithmetic {mode!r}: expected {', '.join(STAGE2_MODES)}")
    return mode


def uses_tf32(mode: str) -> bool:
    """Whether stage 2 compiles under TF32 (what its compiled graphs and their cache key depend on)."""
    return mode == "fast"


def use_exact_cuda_arithmetic() -> None:
    """float32 that is float32, and the same result for the same input, on CUDA (process-wide: one
    engine per replica process).

    cuDNN convolutions default to TF32 in float32, which rounds differently per shape, so padding a
    chunk to its bucket or batching it would change its audio far beyond float rounding; the float32
    parts of every mode (durations, F0, the excitation source) need float32. Deterministic cuDNN
    makes a chunk's audio bit-identical run to run, as the seeded noise promises. Figures and cost:
    loadtest/README.md ("Figures behind the code's choices"; loadtest/bench/parity_diagnosis.py)."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False


@contextlib.contextmanager
def stage2_arithmetic(device: torch.device, mode: str):
    """Stage 2 in `mode` (see the module's docstring), back to exact arithmetic after it."""
    check_stage2_mode(mode)
    if device.type != "cuda" or mode == "exact":
        yield
        return
    torch.backends.cudnn.deterministic = False
    if uses_tf32(mode):
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
        torch.backends.cudnn.benchmark = True
    try:
        yield
    finally:
        use_exact_cuda_arithmetic()
