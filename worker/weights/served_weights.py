"""The serving file: the model's parameters exactly as they are served, written once per host and
memory-mapped by every replica on it.

The checkpoint stores each weight-normed convolution as `weight_g` / `weight_v`; serving folds
them into one plain weight and casts the decoder to the inference dtype. Done in each process,
that would give every replica a private copy of most of the model. Done once and saved here, each
replica maps the same file (`torch.load(mmap=True)`), builds its model on the `meta` device and
takes the mapped tensors as its parameters (`load_state_dict(assign=True)`, as gpt-fast does): the
pages belong to the kernel's page cache, and all replicas on the host share them.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING

from worker.weights.common import Weights, WeightsError, atomic_path, file_lock, log

if TYPE_CHECKING:
    import torch


def serving_path(weights: Weights, decoder_dtype: "torch.dtype") -> Path | None:
    """Where the serving file of `weights` for `decoder_dtype` lives, or None (built in memory)."""
    if weights.serving_dir is None:
        return None
    return weights.serving_dir / f"{_stem(weights.fingerprint)}-{str(decoder_dtype).removeprefix('torch.')}.pt"


def serving_files(directory: Path, fingerprint: str) -> list[Path]:
    """The serving files written for the weights named `fingerprint`, one per precision."""
    return sorted(directory.glob(f"{_stem(fingerprint)}-*.pt"))


def _stem(fingerprint: str) -> str:
    return "kokoro-" + re.sub(r"[^0-9A-Za-z_.-]", "_", fingerprint)


def fold(weights: Weights, decoder_dtype: "torch.dtype") -> dict[str, dict[str, "torch.Tensor"]]:
    """The served parameters, computed from the official-layout state dict (loaded strictly)."""
    from worker.model import KokoroModel

    model = KokoroModel.on_meta(weights.config)
    model.load_components(weights.state_dict, assign=True)
    return model.fold(decoder_dtype).components_state_dict()


def serving_state_dict(weights: Weights, decoder_dtype: "torch.dtype") -> dict[str, dict[str, "torch.Tensor"]]:
    """The served parameters: memory-mapped from the serving file (written here on first use, once
    per host: concurrent workers wait on a lock), or computed in memory when the weights have no
    cache or the cache cannot be written (then each process holds its own copy)."""
    import torch

    path = serving_path(weights, decoder_dtype)
    if path is None:
        return fold(weights, decoder_dtype)
    if not path.is_file():
        try:
            with file_lock(path.with_name(f".{path.name}.lock")):
                if not path.is_file():
                    folded = fold(weights, decoder_dtype)
                    with atomic_path(path) as tmp:
                        torch.save(folded, tmp)
        except OSError as exc:
            log(f"cannot write the serving file {path} ({exc}); folding the weights in memory, "
                "so replicas on this host do not share them")
            return fold(weights, decoder_dtype)
    try:
        return torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception as exc:  # a file damaged after it was written
        raise WeightsError(f"cannot read the serving file {path} ({exc}); delete it and start again") from None
