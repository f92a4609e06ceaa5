"""One torch.compile cache per host, shared by every replica: the first compiles, the others load.

The engine's compiled passes (KokoroModel.use_compiled_decode) keep inductor's caches (FX graphs,
generated kernels, Triton binaries) under one directory, by default
KOKORO_CACHE_DIR/compile/<torch version>-<device name>: a cache is only valid for the torch build and
the device it was made with. The fused CPU kernels (worker/model/layers.py) use inductor's cache
directory of the process (KOKORO_CACHE_DIR/inductor/<vector ISA>: worker/cpu_runtime.py) the same
way. Replicas starting together take a file lock in the directory, so one process compiles while
the others wait and then load what it wrote (in parallel: a marker per compiled configuration tells
them it is there). The process that compiles holds the lock through everything its start does with
the compiled code (the warm-ups and CUDA graph captures after the compile), so a recompile there
would happen under the lock too, and its record counts it. A Docker image or a Modal Volume that
carries the directory makes every start a load.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import logging
import os
import re
import time
from dataclasses import dataclass, field
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
    """What an engine's start-up compile did, counted with dynamo's and inductor's own counters over
    its whole start (the compile, and every warm-up and capture after it), not only the compile
    call: `loaded` only when inductor compiled nothing (every graph came from the host's cache, or
    from this process's earlier engines); `dynamo_compiles` the graphs dynamo traced (a load traces
    too), `recompiles` the guard failures that made dynamo trace a function again beyond the
    planned compiles (one per shape family, or per fused kernel variant)."""

    directory: Path
    what: str = "compiled passes"
    loaded: bool = False
    waited_s: float = 0.0
    seconds: float = 0.0
    graphs_compiled: int = 0
    graphs_loaded: int = 0
    dynamo_compiles: int = 0
    recompiles: list[str] = field(default_factory=list)
    error: str | None = None  # the compile failed: served without it

    def describe(self) -> str:
        if self.error is not None:
            return f"{self.what} failed after {self.seconds:.1f} s ({self.error}); serving without them"
        what = "compiled" if not self.loaded else ("loaded from the host's cache" if self.graphs_loaded
                                                   else "reused from this process")
        recompiles = f", {len(self.recompiles)} recompile(s): {'; '.join(self.recompiles)}" if self.recompiles else ""
        return (f"{self.what} {what} in {self.seconds:.1f} s ({self.graphs_compiled} graphs compiled, "
                f"{self.graphs_loaded} loaded, {self.dynamo_compiles} traced by dynamo{recompiles}; "
                f"{self.waited_s:.1f} s waiting for the host's compile lock) in {self.directory}")

    def as_dict(self) -> dict:
        """JSON-ready."""
        return {**dataclasses.asdict(self), "directory": str(self.directory), "recompiles": list(self.recompiles)}


class CompileTally:
    """Dynamo's and inductor's counters from the moment it is made: how many graphs dynamo traced,
    how many inductor compiled or loaded from its caches, and why dynamo traced a function again
    once the graphs meant to be compiled were (`planned_compiles_done`)."""

    def __init__(self):
        self.start = _counters()
        self.since_us = time.time_ns() // 1000

    def planned_compiles_done(self) -> None:
        """The graphs compiled so far were meant to be (one per shape family: dynamo calls each after
        the first a recompile); any compile from here on is a recompile to report."""
        self.since_us = time.time_ns() // 1000

    def deltas(self) -> dict[str, int]:
        return {name: count - self.start[name] for name, count in _counters().items()}

    def recompiles(self) -> list[str]:
        """The recompile reasons dynamo recorded since the planned compiles (its compilation metrics
        keep the last 64)."""
        try:
            from torch._dynamo.utils import get_compilation_metrics

            metrics = get_compilation_metrics()
        except (ImportError, AttributeError):  # a torch without them: counts only
            return []
        return [f"{getattr(m, 'co_name', None) or '?'}: {m.recompile_reason}" for m in metrics
                if getattr(m, "recompile_reason", None) and (getattr(m, "start_time_us", None) or 0) >= self.since_us]

    def fill(self, record: CompileRecord) -> None:
        """The counts since into `record`. An FX-graph cache miss is a compile; a hit of either cache
        a load (an AOTAutograd hit loads its FX graph too, counted once). Neither: dynamo reused a
        graph this process compiled."""
        delta = self.deltas()
        record.graphs_compiled, record.graphs_loaded = delta["fx_miss"], max(delta["fx_hit"], delta["aot_hit"])
        record.dynamo_compiles = delta["graphs"]
        record.recompiles = self.recompiles()
        record.loaded = record.graphs_compiled == 0


def _counters() -> dict[str, int]:
    """Dynamo's traced graphs, inductor's FX-graph cache and AOTAutograd's cache counters so far in
    this process."""
    from torch._dynamo.utils import counters

    inductor, aot = counters["inductor"], counters["aot_autograd"]
    return {"fx_miss": inductor.get("fxgraph_cache_miss", 0) + inductor.get("fxgraph_cache_bypass", 0),
            "fx_hit": inductor.get("fxgraph_cache_hit", 0), "aot_hit": aot.get("autograd_cache_hit", 0),
            "graphs": counters["stats"].get("unique_graphs", 0)}


def use_compile_dir(directory: Path) -> None:
    """Point inductor's caches (and Triton's, which inductor keeps beneath them) at `directory`.
    Process-wide; must happen before the first compile of the process."""
    directory.mkdir(parents=True, exist_ok=True)
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(directory)
    os.environ.pop("TRITON_CACHE_DIR", None)  # inductor then puts Triton's under its own


def inductor_cache_dir() -> Path:
    """The directory inductor caches in now (TORCHINDUCTOR_CACHE_DIR, or torch's default)."""
    from torch._inductor.runtime.runtime_utils import cache_dir

    return Path(cache_dir())


def compile_marker(directory: Path, key: str) -> Path:
    """The file that says the compile named `key` is done and cached in `directory`."""
    return Path(directory) / f"{re.sub(r'[^A-Za-z0-9._-]+', '-', key)}.done"


@contextlib.contextmanager
def shared_compile(directory: Path, key: str, what: str = "compiled passes", tally: CompileTally | None = None):
    """The first compile of this process's passes named `key` (what they compile: dtype, families,
    noise, arithmetic), with everything the start does with them after it (warm-ups, captures). The
    first process on the host to compile them holds the lock in `directory` throughout the block,
    and marks them done; the others wait for it, then load in parallel. Yields a CompileRecord,
    filled in and logged when the block ends, its counts taken from `tally` (default: from the
    block's start). A block that raises marks nothing: the next process compiles again."""
    use_compile_dir(directory)
    record = CompileRecord(directory, what)
    marker = compile_marker(directory, key)
    start = time.perf_counter()
    with open(directory / "compile.lock", "a+", encoding="utf-8") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        record.waited_s = time.perf_counter() - start
        if marker.exists():  # compiled by an earlier process: load without holding the others up
            fcntl.flock(lock, fcntl.LOCK_UN)
        tally = tally or CompileTally()
        compile_start = time.perf_counter()
        try:
            yield record
            marker.touch()
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
            record.seconds = time.perf_counter() - compile_start
            tally.fill(record)
    log.info("pid %d: %s", os.getpid(), record.describe())
