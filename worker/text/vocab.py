"""Phonemes -> ids in Kokoro's 178-symbol vocabulary (`worker/kokoro_config.json`)."""

from __future__ import annotations

import importlib.resources
import json
import logging
from functools import lru_cache

log = logging.getLogger(__name__)
_dropped: set[str] = set()  # symbols this process has warned about


@lru_cache(maxsize=1)
def vocab() -> dict[str, int]:
    with importlib.resources.files("worker").joinpath("kokoro_config.json").open("r", encoding="utf-8") as f:
        return json.load(f)["vocab"]


@lru_cache(maxsize=1)
def symbols() -> dict[int, str]:
    return {i: s for s, i in vocab().items()}


def to_ids(phonemes: str) -> list[int]:
    """The ids of `phonemes`; symbols outside the vocabulary are dropped with a warning, never an error."""
    table = vocab()
    ids = [table[c] for c in phonemes if c in table]
    if len(ids) != len(phonemes):
        unknown = sorted({c for c in phonemes if c not in table})
        # A warning the first time a symbol is dropped: a request of 4,096 of them logged 4,096 lines.
        level = logging.DEBUG if _dropped.issuperset(unknown) else logging.WARNING
        _dropped.update(unknown)
        log.log(level, "dropping phoneme symbols not in Kokoro's vocabulary: %s (in %r)",
                " ".join(f"{c!r} U+{ord(c):04X}" for c in unknown), phonemes[:80])
    return ids


def to_phonemes(ids: list[int]) -> str:
    table = symbols()
    return "".join(table[i] for i in ids)
