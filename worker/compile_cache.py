"""One torch.compile cache per host, shared by every replica: the first compiles, the others load.

The engine's compiled passes (KokoroModel.use_compiled_decode) keep inductor's caches (FX graphs,
generated kernels, Triton binaries) under one directory, by default
KOKORO_CACHE_DIR/compile/<torch version>-<device name>: a cache is only valid for the torch build and
the device it was made with. Replicas starting together take a file lock around their first
compile, so one process compiles while the others wait and then load what it wrote (in parallel:
a marker per compiled configuration tells them it is there). A Docker
image or a Modal Volume that carries the directory makes every start a load.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

import torch

log = logging.getLogger("kokoro_fleet.compile_cache")


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    from worker.cpu_features import cpu_info

    return cpu_info().model


def default_compile_cache_dir(device: torch.device, cache_dir: str | Path | None = None) -> Path:
    """cache_dir (KOKORO_CACHE_DIR's default when None)/compile/<torch version>-<device name>, the
    name reduced to [A-Za-z0-9._-]."""
    cache_dir = Path.home() / ".cache" / "kokoro-fleet" if cache_dir is None else cache_dir
    key = re.sub(r"[^A-Za-z0-9._-]+", "-", f"{torch.__version__}-{device_name(device)}").strip("-")
    return Path(cache_dir) / "compile" / key


@dataclass
class CompileRecord:
    """What an engine's compile did: `loaded` when inductor compiled nothing (every graph came from
    the host's cache, or from this process's earlier engines)."""

    directory: Path
    loaded: bool = False
    waited_s: float = 0.0
    seconds: float = 0.0
    graphs_compiled: int = 0
    graphs_loaded: int = 0

    def describe(self) -> str:
        what = "compiled" if not self.loaded else ("loaded from the host's cache" if self.graphs_loaded
                                                   else "reused from this process")
        return (f"compiled passes {what} in {self.seconds:.1f} s ({self.graphs_compiled} graphs compiled, "
                f"{self.graphs_loaded} loaded; {self.waited_s:.1f} s waiting for the host's compile lock) "
                f"in {self.directory}")


def _cache_counters() -> dict[str, int]:
    """Inductor's FX-graph cache and AOTAutograd's cache counters so far in this process."""
    from torch._dynamo.utils import counters

    inductor, aot = counters["inductor"], counters["aot_autograd"]
    return {"fx_miss": inductor.get("fxgraph_cache_miss", 0) + inductor.get("fxgraph_cache_bypass", 0),
            "fx_hit": inductor.get("fxgraph_cache_hit", 0), "aot_hit": aot.get("autograd_cache_hit", 0)}


def use_compile_dir(directory: Path) -> None:
    """Point inductor's caches (and Triton's, which inductor keeps beneath them) at `directory`.
    Process-wide; must happen before the first compile of the process."""
    directory.mkdir(parents=True, exist_ok=True)
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(directory)
    os.environ.pop("TRITON_CACHE_DIR", None)  # inductor then puts Triton's under its own


@contextlib.contextmanager
def shared_compile(directory: Path, key: str):
    """The first compile of this process's passes named `key` (what they compile: dtype, families,
    noise). The first process on the host to compile them holds the lock in `directory` throughout,
    and marks them done; the others wait for it, then load in parallel. Yields a CompileRecord,
    filled in and logged when the block ends."""
    use_compile_dir(directory)
    record = CompileRecord(directory)
    marker = directory / f"{re.sub(r'[^A-Za-z0-9._-]+', '-', key)}.done"
    start = time.perf_counter()
    with open(directory / "compile.lock", "a+", encoding="utf-8") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        record.waited_s = time.perf_counter() - start
        if marker.exists():  # compiled by an earlier process: load without holding the others up
            fcntl.flock(lock, fcntl.LOCK_UN)
        before = _cache_counters()
        compile_start = time.perf_counter()
        try:
            yield record
            marker.touch()
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    record.seconds = time.perf_counter() - compile_start
    delta = {name: count - before[name] for name, count in _cache_counters().items()}
    # An FX-graph cache miss is a compile; a hit of either cache a load (an AOTAutograd hit loads
    # its FX graph too, counted once). Neither: dynamo reused a graph this process compiled.
    record.graphs_compiled, record.graphs_loaded = delta["fx_miss"], max(delta["fx_hit"], delta["aot_hit"])
    record.loaded = record.graphs_compiled == 0
    log.info("pid %d: %s", os.getpid(), record.describe())
