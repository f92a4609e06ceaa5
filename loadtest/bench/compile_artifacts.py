"""torch.compiler's cache artifacts ("Mega-Cache", `save_cache_artifacts` / `load_cache_artifacts`,
torch 2.7 on; the GPU box has 2.11) for the GPU harness: what a step compiled, kept in the call's
output folder when it fits what comes back from a device call, so a later call on the same card and
torch loads it before anything compiles instead of compiling again. A torch without them, or
artifacts that do not load, cost a compile, never the call.
"""

from __future__ import annotations

from pathlib import Path

FILE_LIMIT = 16 << 20  # a file that comes back from a device call


def load_artifacts(path: Path, directory: Path) -> str:
    """torch.compiler's cache artifacts (a file, or a folder's compile-artifacts-*.bin) into the
    caches under `directory` (the compile cache the engines then use), before anything compiles."""
    import torch

    from worker.compile_cache import use_compile_dir

    files = sorted(path.glob("compile-artifacts-*.bin")) if path.is_dir() else [path] if path.is_file() else []
    if not files:
        return f"{path}: no artifacts there"
    load = getattr(torch.compiler, "load_cache_artifacts", None)
    if load is None:
        return f"torch {torch.__version__} has no torch.compiler.load_cache_artifacts"
    use_compile_dir(directory)
    said = []
    for file in files:
        try:
            said.append(f"{file.name} ({file.stat().st_size / 2**20:.1f} MiB): {_artifact_summary(load(file.read_bytes()))}")
        except Exception as error:  # a cache that does not load costs a compile, not the call
            said.append(f"{file.name}: not loaded ({type(error).__name__}: {str(error)[:300]})")
    return "; ".join(said)


def save_artifacts(path: Path, run: dict) -> dict:
    """This process's compile as torch.compiler cache artifacts in `path`, if it compiled anything
    and they fit what comes back from a device call."""
    import torch

    record = run.get("compile") or {}
    if not record.get("graphs_compiled"):
        return {"saved": None, "why": "nothing compiled in this process (loaded from the cache, or no compile)"}
    save = getattr(torch.compiler, "save_cache_artifacts", None)
    if save is None:
        return {"saved": None, "why": f"torch {torch.__version__} has no torch.compiler.save_cache_artifacts"}
    try:
        saved = save()
    except Exception as error:
        return {"saved": None, "why": f"save_cache_artifacts failed: {type(error).__name__}: {str(error)[:300]}"}
    if not saved or not saved[0]:
        return {"saved": None, "why": "save_cache_artifacts returned nothing"}
    data, info = saved
    if len(data) >= FILE_LIMIT:
        return {"saved": None, "bytes": len(data), "why": f"{len(data) / 2**20:.1f} MiB: over the 16 MiB that come back"}
    path.write_bytes(data)
    return {"saved": str(path), "bytes": len(data), "info": _artifact_summary(info)}


def _artifact_summary(info) -> str:
    artifacts = getattr(info, "artifacts", None)
    if isinstance(artifacts, dict):
        return ", ".join(f"{kind}: {len(keys)}" for kind, keys in artifacts.items()) or "no artifacts"
    return str(info)[:300]
