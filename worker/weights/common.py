"""What every weight source shares: the voices' names and shape, the model's config, the `Weights`
a source returns, `WeightsError`, and careful file handling (hashes, atomic writes, a lock so
concurrent workers prepare a cache only once)."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Iterator

if TYPE_CHECKING:  # torch is imported lazily, so `kokoro-fleet weights` on a ready cache stays instant
    import torch

# The 54 voices of Kokoro-82M v1.0, as named in hexgrad/Kokoro-82M/voices and kokoro-js.
VOICE_NAMES: tuple[str, ...] = (
    "af_alloy", "af_aoede", "af_bella", "af_heart", "af_jessica", "af_kore", "af_nicole", "af_nova",
    "af_river", "af_sarah", "af_sky", "am_adam", "am_echo", "am_eric", "am_fenrir", "am_liam",
    "am_michael", "am_onyx", "am_puck", "am_santa", "bf_alice", "bf_emma", "bf_isabella", "bf_lily",
    "bm_daniel", "bm_fable", "bm_george", "bm_lewis", "ef_dora", "em_alex", "em_santa", "ff_siwis",
    "hf_alpha", "hf_beta", "hm_omega", "hm_psi", "if_sara", "im_nicola", "jf_alpha", "jf_gongitsune",
    "jf_nezumi", "jf_tebukuro", "jm_kumo", "pf_dora", "pm_alex", "pm_santa", "zf_xiaobei", "zf_xiaoni",
    "zf_xiaoxiao", "zf_xiaoyi", "zm_yunjian", "zm_yunxi", "zm_yunxia", "zm_yunyang",
)
VOICE_ROWS, STYLE_WIDTH = 510, 256  # a voice pack: one [256] style per phoneme count 1..510
COMPONENTS = ("bert", "bert_encoder", "predictor", "text_encoder", "decoder")
CONFIG_PATH = Path(__file__).resolve().parent.parent / "kokoro_config.json"  # Kokoro-82M v1.0 config.json


class WeightsError(RuntimeError):
    """Weights cannot be found, fetched or trusted; the message says what to do about it."""


@dataclass(frozen=True)
class WeightsSource:
    """Which weights to load and where their files are cached (the server builds it from KOKORO_WEIGHTS,
    KOKORO_CACHE_DIR, KOKORO_WEIGHTS_DIR and KOKORO_SEED)."""

    kind: str         # "offline" | "official" | "tiny" | "random-full" | a directory of the official files
    cache_dir: str    # converted bundles, downloads and serving files go under it
    directory: str = ""  # the official files for `official` (empty: <cache_dir>/official)
    seed: int = 0     # of the random sources


@dataclass
class Weights:
    source: str                                  # "offline" | "official" | "tiny" | "random-full"
    config: dict                                 # Kokoro config.json content
    state_dict: dict[str, dict[str, "torch.Tensor"]]  # component -> official names, no "module." prefix
    voices: dict[str, "torch.Tensor"]            # name -> float32 [510, 256]
    info: dict = field(default_factory=dict)     # source, paths, hashes: what `kokoro-fleet weights` shows
    # Where the serving file of these weights goes (see worker/weights/served_weights.py), and a key that
    # changes whenever the state dict's content may have: None and "" when it is built in memory.
    serving_dir: Path | None = None
    fingerprint: str = ""


def log(message: str) -> None:
    print(f"kokoro-fleet: {message}", file=sys.stderr, flush=True)


def official_config() -> dict:
    return json.loads(CONFIG_PATH.read_text(encoding="utf-8"))


def serving_dir(source: WeightsSource) -> Path:
    """Where the serving files (worker/weights/served_weights.py) of the file-backed sources go."""
    return Path(source.cache_dir).expanduser() / "serving"


def sha256_file(path: str | Path, chunk: int = 1 << 22) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            digest.update(block)
    return digest.hexdigest()


@contextlib.contextmanager
def atomic_path(dest: Path) -> Iterator[Path]:
    """Yield a temporary path beside `dest`; on success it replaces `dest` in one rename, so an
    interrupted write never leaves a half file under the final name."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".tmp", dir=dest.parent)
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        os.replace(tmp_path, dest)
    finally:
        tmp_path.unlink(missing_ok=True)


def write_json_atomic(dest: Path, data: dict) -> None:
    with atomic_path(dest) as tmp:
        tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")


@contextlib.contextmanager
def file_lock(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as handle:
        try:
            import fcntl
        except ImportError:  # not POSIX: no cross-process lock, the atomic writes still keep files whole
            yield
            return
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
