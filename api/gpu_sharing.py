"""How the replicas share one GPU, and how many there are.

Several replica processes share a GPU well only through the CUDA MPS daemon: without it the GPU
time-slices between their contexts, and every extra replica adds latency and no throughput
(docs/operations.md, with the H200 figures). `Mps` starts the daemon, the one starter in
production (`kokoro-fleet serve` calls it; docker/entrypoint.sh and Modal go through `serve`).
`plan_replicas` picks the replica count from what it found: under MPS one replica per worker, each
running batches of up to `MPS_BATCH_MAX` chunks;
without it `TIME_SLICED_REPLICAS` replicas, each running batches of up to `TIME_SLICED_BATCH_MAX`
chunks, the other workers staying HTTP fronts of the shared queue. `probe_gpu` is what
`kokoro-fleet gpu-check` (and `modal run modal_app.py::gpu_check`) reports.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Mapping

log = logging.getLogger("kokoro_fleet.serve")

# Without MPS: one process keeps a time-sliced GPU as busy as eight (373 against 334 audio-s/s on
# the H200, chunk p50 41 -> 486 ms at 8), and a batch of 16 made 5x the audio of the same chunks
# one by one. Figures and dates: docs/performance.md.
TIME_SLICED_REPLICAS = 1
TIME_SLICED_BATCH_MAX = 16
# Under MPS a replica in every worker (eight were the best count measured), each batching as many:
# 8 x 16 chunks is a c = 128 load in one pass each. Figures and dates: docs/performance.md.
MPS_BATCH_MAX = 16
# Torch's CUDA initialisation in a fresh process, the test that MPS (or the GPU) really serves.
CUDA_PROBE = "import torch; torch.zeros(1, device='cuda'); torch.cuda.synchronize()"
# How long that probe may take under a new MPS daemon. A daemon that takes clients but never serves
# them (seen in sandboxed containers) hangs it: past this the daemon is stopped and the replicas
# time-slice the GPU, instead of the start failing (and, under an orchestrator, crash-looping).
MPS_PROBE_TIMEOUT_S = 120.0


def mps_daemon_alive(pipe: Path) -> bool:
    """Whether the MPS control daemon of `pipe` runs: the pid file it writes there names a live
    process. A daemon that died (a container restarted with its /tmp, a killed run) leaves its
    `control` pipe behind; CUDA then runs without MPS and says nothing, so the replicas would
    time-slice the GPU while the log said MPS. No pid file (an older driver): trust the pipe."""
    try:
        pid = int((pipe / "nvidia-cuda-mps-control.pid").read_text().strip())
    except FileNotFoundError:
        return True
    except (OSError, ValueError):
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        return True
    return True


class Mps:
    """The CUDA MPS control daemon, so the replicas' kernels share the GPU instead of time-slicing.
    `active` says whether the replicas will run under a daemon (this one's or one found running)."""

    def __init__(self, mode: str):
        if mode not in ("auto", "on", "off"):
            raise SystemExit(f"KOKORO_MPS={mode}: expected auto, on or off")
        self.mode = mode
        self.started = False
        self.active = False
        self.probe_seconds: float | None = None
        self.log_dir: Path | None = None  # where the daemon writes control.log and server.log

    def ensure(self) -> str:
        """Start the daemon unless one runs already; a line for the log."""
        if self.mode == "off":
            return "MPS: off (KOKORO_MPS=off): replicas time-slice the GPU"
        pipe = Path(os.environ.setdefault("CUDA_MPS_PIPE_DIRECTORY", "/tmp/kokoro-fleet-mps/pipe"))
        logs = self.log_dir = Path(os.environ.setdefault("CUDA_MPS_LOG_DIRECTORY", "/tmp/kokoro-fleet-mps/log"))
        if (pipe / "control").exists():
            if mps_daemon_alive(pipe):
                self.active = True
                return f"MPS: a daemon already runs (pipe {pipe}): using it"
            log.warning("MPS: %s holds a dead daemon's pipe (its pid file names no running process): "
                        "starting a new daemon", pipe)
        control = shutil.which("nvidia-cuda-mps-control")
        if control is None:
            return self._not("nvidia-cuda-mps-control is not available")
        pipe.mkdir(parents=True, exist_ok=True)
        logs.mkdir(parents=True, exist_ok=True)
        if subprocess.run([control, "-d"], capture_output=True).returncode != 0:
            return self._not(f"the daemon did not start (log: {logs})")
        self.started = True
        started = time.perf_counter()
        try:
            probe = subprocess.run([sys.executable, "-c", CUDA_PROBE], capture_output=True,
                                   timeout=MPS_PROBE_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.probe_seconds = time.perf_counter() - started
            self.stop()
            return self._not(f"CUDA did not initialise under MPS within {MPS_PROBE_TIMEOUT_S:.0f} s (log: {logs}); "
                             "daemon stopped")
        self.probe_seconds = time.perf_counter() - started
        if probe.returncode != 0:
            self.stop()
            return self._not(f"CUDA does not initialise under MPS here (log: {logs}); daemon stopped")
        self.active = True
        return f"MPS: daemon started (pipe {pipe}), CUDA initialised under it in {self.probe_seconds:.1f} s"

    def _not(self, why: str) -> str:
        if self.mode == "on":
            raise SystemExit(f"kokoro-fleet serve: KOKORO_MPS=on but {why}")
        return f"MPS: not started: {why}; replicas time-slice the GPU"

    def stop(self) -> None:
        control = shutil.which("nvidia-cuda-mps-control")
        if self.started and control:
            subprocess.run([control], input=b"quit\n", capture_output=True)
        self.started = False
        self.active = False


@dataclass(frozen=True)
class ReplicaPlan:
    """How many of the workers hold a replica, how large a batch each runs, and why."""

    replicas: int
    batch_max: int
    reason: str

    def environment(self) -> dict[str, str]:
        """What the Uvicorn workers read (api/settings.py)."""
        return {"KOKORO_REPLICAS": str(self.replicas), "KOKORO_BATCH_MAX": str(self.batch_max)}


def plan_replicas(workers: int, replicas: int, batch_max: int, mps: bool, shared_queue: bool,
                  environ: Mapping[str, str]) -> ReplicaPlan:
    """The replicas for `workers` workers on one GPU, `mps` telling whether they share it through
    MPS. `replicas` and `batch_max` are the settings; a setting present in `environ`
    (KOKORO_REPLICAS, KOKORO_BATCH_MAX) was chosen by the user and is kept. Without MPS the
    default of a replica in every worker becomes TIME_SLICED_REPLICAS batching replicas, where a
    shared queue lets the other workers hand them their chunks."""
    chosen_replicas = bool(environ.get("KOKORO_REPLICAS")) and replicas > 0
    chosen_batch = bool(environ.get("KOKORO_BATCH_MAX"))
    count = replicas or workers
    if mps or workers == 1:
        why = "the GPU is shared through MPS" if mps else "one worker"
        if mps and shared_queue and not chosen_batch:
            batch_max = max(batch_max, MPS_BATCH_MAX)
        return ReplicaPlan(count, batch_max, f"replicas: {count} of {workers} worker(s) ({why}), batches of up "
                                             f"to {batch_max} chunk(s)")
    if not shared_queue:
        return ReplicaPlan(count, batch_max, f"replicas: {count} of {workers} workers time-slice the GPU (no MPS); "
                                             "fewer would need the shared queue (KOKORO_DISPATCH=shared, not "
                                             "--baseline): each replica adds latency, not throughput")
    if not chosen_replicas:
        count = min(TIME_SLICED_REPLICAS, workers)
    if not chosen_batch:
        batch_max = max(batch_max, TIME_SLICED_BATCH_MAX)
    kept = [name for name, chosen in (("KOKORO_REPLICAS", chosen_replicas), ("KOKORO_BATCH_MAX", chosen_batch))
            if chosen]
    return ReplicaPlan(count, batch_max, (
        f"replicas: {count} of {workers} workers, batches of up to {batch_max} chunks, the other workers HTTP fronts: "
        "without MPS the GPU time-slices between replicas, so more of them add latency, not throughput"
        + (f" ({', '.join(kept)} as set)" if kept else "")))


# --- what `kokoro-fleet gpu-check` reports -----------------------------------------------------------


@dataclass
class GpuReport:
    """The card, its driver, MPS, and torch's CUDA under it: what the platform allows."""

    gpu: str = ""
    driver: str = ""
    memory_mib: int = 0
    torch: str = ""
    torch_cuda: str = ""
    mps_control: str = ""
    mps: bool = False
    mps_line: str = ""
    cuda_probe_seconds: float | None = None
    cuda_without_mps: bool | None = None
    notes: list[str] = field(default_factory=list)

    def as_dict(self) -> dict:
        return asdict(self)


def query_gpu() -> tuple[str, str, int] | None:
    """(name, driver version, memory in MiB) of GPU 0 from nvidia-smi; None when there is none."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        out = subprocess.run([smi, "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader,nounits",
                              "-i", "0"], capture_output=True, text=True, timeout=30, check=True).stdout
        name, driver, memory = (part.strip() for part in out.strip().splitlines()[0].split(","))
        return name, driver, int(float(memory))
    except (subprocess.SubprocessError, OSError, ValueError, IndexError):
        return None


def probe_gpu(mode: str = "auto") -> tuple[GpuReport, Mps]:
    """Look at the GPU and try MPS as `serve` would (KOKORO_MPS `mode`). The daemon, when this
    started one, is still running in the returned Mps: the caller stops it."""
    report = GpuReport()
    # In a child process, as the replicas will: importing torch opens no CUDA context, but this
    # process stays free of it anyway before MPS starts.
    built = subprocess.run([sys.executable, "-c", "import torch; print(torch.__version__, torch.version.cuda)"],
                           capture_output=True, text=True, timeout=120)
    if built.returncode == 0:
        report.torch, cuda = built.stdout.split()[-2:]
        report.torch_cuda = "" if cuda == "None" else cuda
    else:
        report.notes.append("torch does not import: " + (built.stderr.strip().splitlines() or ["no message"])[-1])
    found = query_gpu()
    mps = Mps(mode)
    if found is None:  # no GPU: report.gpu stays empty
        return report, mps
    report.gpu, report.driver, report.memory_mib = found
    report.mps_control = shutil.which("nvidia-cuda-mps-control") or ""
    try:
        report.mps_line = mps.ensure()
    except SystemExit as refused:  # KOKORO_MPS=on that cannot be honoured: reported, not raised
        report.mps_line = str(refused)
    report.mps = mps.active
    report.cuda_probe_seconds = mps.probe_seconds
    if not mps.active:
        plain = subprocess.run([sys.executable, "-c", CUDA_PROBE], capture_output=True, text=True, timeout=120)
        report.cuda_without_mps = plain.returncode == 0
        if plain.returncode != 0:
            report.notes.append("torch cannot use the GPU even without MPS: "
                                + (plain.stderr.strip().splitlines() or ["no message"])[-1])
    return report, mps
