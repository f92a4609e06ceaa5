"""Which torch device a replica runs on: the engine builds on it, the process set-up sizes its
threads for it, so both ask here rather than one asking the other."""

from __future__ import annotations

import torch


def resolve_device(device: str) -> torch.device:
    if device in ("", "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)
