"""How a replica process shares a CPU machine: thread count, inference priority, compile cache.

* Threads: N replicas on C usable cores (a container's CPU quota included: worker/machine.py) get
  C // N intra-op threads each (at least one), unless KOKORO_THREADS says otherwise: several
  replicas each using every core would only fight over them.
* Priority: inference runs in one dedicated thread at raised niceness (KOKORO_INFERENCE_NICE).
  Linux niceness is per thread and inherited by the threads a thread creates, so the OpenMP pool
  that the inference thread starts at its first parallel region (the intra-op threads torch and the
  compiled kernels use) runs at the same niceness, while the event loop stays at the process's own.
  Under load the scheduler then hands a core to the event loop (and to Redis) as soon as it wakes,
  so admission and 503s stay fast while the replicas compute.
* Compile cache: torch.compile's kernels are cached beside the weights (KOKORO_CACHE_DIR/inductor,
  one directory per vector ISA) rather than in /tmp, so they survive reboots and container
  restarts that keep the cache volume.
* Freed memory: during a synthesis a CPU engine in int8 mode keeps the memory of freed activations for the
  next ones (glibc malloc without mmap; `keep_freed_memory`) instead of handing it back to the
  kernel and page-faulting it in again at every large tensor. Once a replica is idle, in every
  mode, the free pages go back to the kernel if the process holds 512 MiB more than after its
  last trim (`return_freed_memory`).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import ctypes
import logging
import os
import platform
import threading
from pathlib import Path

from worker.machine import usable_cores

log = logging.getLogger("kokoro_fleet.cpu")


def inference_threads(configured: int, workers: int, cores: int | None = None) -> int:
    """Intra-op threads for one of `workers` replicas: `configured` when set (> 0), else cores // workers."""
    if configured > 0:
        return configured
    return max(1, (usable_cores() if cores is None else cores) // max(1, workers))


def raise_thread_niceness(niceness: int) -> int:
    """Raise the calling thread's niceness by `niceness` (Linux: per thread); returns the new value.
    Where the OS has no per-thread priority, does nothing and returns 0."""
    if niceness <= 0 or not hasattr(os, "setpriority"):
        return 0
    tid = threading.get_native_id()
    try:
        current = os.getpriority(os.PRIO_PROCESS, tid)
        os.setpriority(os.PRIO_PROCESS, tid, min(19, current + niceness))
        return os.getpriority(os.PRIO_PROCESS, tid)
    except OSError as error:  # e.g. a seccomp profile that forbids it: serve at normal priority
        log.warning("cannot lower the inference thread's priority (%s); inference competes with the event loop",
                    error)
        return 0


def thread_niceness(tid: int) -> int:
    """The niceness of thread `tid` of this process (Linux /proc)."""
    with open(f"/proc/self/task/{tid}/stat", encoding="ascii") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[16])  # field 19 of stat; fields[0] is field 3 (state)


def inference_executor(niceness: int) -> concurrent.futures.ThreadPoolExecutor:
    """One thread for all of a replica's inference (warm-up included, so the OpenMP pool is born in
    it), running at `niceness` above the process's own."""
    return concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="inference",
                                                 initializer=raise_thread_niceness, initargs=(niceness,))


# glibc's mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD, _M_MMAP_MAX = -1, -4
_KEEP_FREED = {"applied": False}
_TRIM: dict = {}  # glibc's malloc_trim (None outside glibc) and the resident bytes after the last trim


def keep_freed_memory() -> bool:
    """Make glibc malloc keep freed memory for reuse: no mmap'd chunks, no trimming of the heap
    (until `return_freed_memory`, which a CPU replica calls once idle; engines ask
    for it in int8 mode only, where it was measured to pay). Process-wide,
    once; returns whether it is in force.

    Above glibc's mmap threshold each large activation of a synthesis is a fresh mmap that the
    kernel zero-fills a page fault at a time; reusing freed memory removes those faults.

    The cost is memory: the heap fragments and freed pages stay resident until
    `return_freed_memory` (figures: loadtest/README.md, "Figures behind the code's choices"). Left alone when
    the environment already tunes malloc (MALLOC_MMAP_MAX_, MALLOC_TRIM_THRESHOLD_,
    MALLOC_MMAP_THRESHOLD_ or glibc.malloc tunables in GLIBC_TUNABLES: a replica short of memory
    sets, say, MALLOC_MMAP_MAX_=65536, glibc's default count), and outside glibc (musl, macOS)."""
    if _KEEP_FREED["applied"]:
        return True
    chosen = any(os.environ.get(k) for k in ("MALLOC_MMAP_MAX_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_"))
    if chosen or "glibc.malloc" in os.environ.get("GLIBC_TUNABLES", "") or platform.libc_ver()[0] != "glibc":
        return False
    try:
        libc = ctypes.CDLL(None)
        mallopt = libc.mallopt
        mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
        # trimming only past 1 GiB free at the top of the heap (the value is a C int)
        applied = bool(mallopt(_M_MMAP_MAX, 0)) and bool(mallopt(_M_TRIM_THRESHOLD, 2**30))
    except (OSError, AttributeError):
        return False
    if applied:
        _KEEP_FREED.update(applied=True)
        log.info("malloc keeps freed memory during a synthesis (no mmap'd chunks); MALLOC_MMAP_MAX_=65536 turns it off")
    return applied


def _resident_bytes() -> int:
    with open("/proc/self/statm", encoding="ascii") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _malloc_trim():
    """glibc's malloc_trim, or None outside glibc (musl, macOS)."""
    if "malloc_trim" not in _TRIM:
        trim = None
        if platform.libc_ver()[0] == "glibc":
            with contextlib.suppress(OSError, AttributeError):
                trim = ctypes.CDLL(None).malloc_trim
        _TRIM["malloc_trim"] = trim
    return _TRIM["malloc_trim"]


def return_freed_memory(slack: int = 512 << 20) -> None:
    """Hand the free pages of every malloc arena back to the kernel (glibc malloc_trim) once the
    process holds more than `slack` bytes above what it held after its last trim. A CPU replica
    calls it once it has been idle for a few seconds (worker/replica.py), so an idle replica holds
    at most `slack` more than its floor, while a busy one keeps its pages for the next job.

    Needed in every mode: glibc's default raises its mmap and trim thresholds as large tensors come
    and go, and every allocating thread keeps its own arena, so a replica would hold its high-water
    mark between requests. Idle only, since a trim and faulting the pages in again cost a busy
    replica throughput (figures: loadtest/README.md, "Figures behind the code's choices")."""
    trim = _malloc_trim()
    if trim is None:
        return
    resident = _resident_bytes()
    if resident > _TRIM.get("floor", 0) + slack:
        trim(0)
        _TRIM["floor"] = _resident_bytes()


def vector_isa() -> str:
    """The vector ISA torch.compile's C++ kernels are generated for here (avx512-avx512_vnni,
    avx2, ...; it follows ATEN_CPU_CAPABILITY), as a directory name. torch finds it by compiling a
    probe, so on a machine without a C++ compiler (the CPU image has none) it cannot tell; no
    kernel can be compiled there either, and ATen's own capability names the directory."""
    import torch
    from torch._inductor.cpu_vec_isa import pick_vec_isa

    try:
        isa = pick_vec_isa()
    except Exception:  # torch._inductor.exc.InvalidCxxCompiler, or a probe that fails to build
        return f"{torch.backends.cpu.get_cpu_capability().lower()}-no-compiler"
    return "-".join(str(isa).lower().split()) if isa else "scalar"


def use_compile_cache(cache_dir: str | Path) -> Path:
    """Keep torch.compile's kernels under `cache_dir`/inductor/<vector ISA>, unless the user chose a
    place with TORCHINDUCTOR_CACHE_DIR (torch itself fills that variable with its /tmp default on
    first use, which does not count as a choice).

    One directory per ISA: torch 2.13's cache does not key its entries by the ISA they were
    generated for, and a kernel generated for AVX2 loaded by a process that generates AVX-512
    code (a cache volume moved to another CPU, or ATEN_CPU_CAPABILITY=avx2 set for one run)
    writes past its buffers: heap corruption, "corrupted size vs. prev_size" aborts."""
    from torch._inductor.runtime.runtime_utils import default_cache_dir

    current = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if current is None or os.path.abspath(current) == os.path.abspath(default_cache_dir()):
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(Path(cache_dir) / "inductor" / vector_isa())
    return Path(os.environ["TORCHINDUCTOR_CACHE_DIR"])


def configure_process(*, cache_dir: str, threads: int, workers: int, device: str, inference_nice: int) -> None:
    """A replica process's set-up before its engine is built: intra-op threads and compile cache.
    `threads` and `workers` as KOKORO_THREADS and KOKORO_WORKERS give them (0: derived)."""
    import torch

    from worker.device import resolve_device

    use_compile_cache(cache_dir)
    # On a GPU too: a worker's host-side torch work (building or loading the weights, the small CPU
    # tensors of each request) would otherwise start one OpenMP thread per core in every worker,
    # 8 workers x 16 threads on 16 cores, slowing every worker's start-up (loadtest/README.md).
    used = inference_threads(threads, workers)
    torch.set_num_threads(used)
    on = "inference" if resolve_device(device).type == "cpu" else "host-side torch"
    log.info("%d %s thread(s) (KOKORO_THREADS=%d, %d worker(s) on %d usable core(s)), niceness +%d",
             used, on, threads, max(1, workers), usable_cores(), inference_nice)
