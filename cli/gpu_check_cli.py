"""`kokoro-fleet gpu-check [--json]`: what this machine's GPU allows, and the replicas `serve` would run.

Prints the card, its driver and memory, torch and its CUDA build, whether `nvidia-cuda-mps-control`
exists, whether an MPS daemon starts and torch initialises CUDA under it (and, when not, without
it), then the replica plan that follows (api/gpu_sharing.py). A daemon this command started is
stopped before it returns. `modal run modal_app.py::gpu_check` runs it on Modal's GPU; in the GPU
image, `docker run --rm --entrypoint kokoro-fleet --gpus all kokoro-fleet:gpu gpu-check`. Exit
status 0 when torch can use the GPU, 1 when it cannot or there is none.
"""

from __future__ import annotations

import argparse
import json
import os

from api.gpu_sharing import plan_replicas, probe_gpu
from api.settings import Settings

# The GPU default of `serve` (cli/serve_cli.py resolve_workers).
GPU_DEFAULT_WORKERS = 8


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--workers", type=int, default=0,
                        help=f"workers to plan for (default: KOKORO_WORKERS, else {GPU_DEFAULT_WORKERS} as on a GPU)")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")


def run(args: argparse.Namespace) -> int:
    settings = Settings.from_env(only=("mps", "workers", "replicas", "batch_max", "dispatch", "baseline"))
    report, mps = probe_gpu(settings.mps)
    try:
        workers = args.workers or settings.workers or GPU_DEFAULT_WORKERS
        plan = plan_replicas(workers, settings.replicas, settings.batch_max, report.mps,
                             shared_queue=settings.dispatch == "shared" and not settings.baseline,
                             environ=os.environ) if report.gpu else None
    finally:
        mps.stop()
    usable = bool(report.gpu) and (report.mps or bool(report.cuda_without_mps))
    if args.json:
        print(json.dumps({**report.as_dict(), "usable": usable,
                          "plan": None if plan is None else {"workers": workers, "replicas": plan.replicas,
                                                             "batch_max": plan.batch_max, "reason": plan.reason}},
                         indent=2))
        return 0 if usable else 1
    print(f"torch: {report.torch or 'not installed'} (CUDA build {report.torch_cuda or 'none'})")
    if not report.gpu:
        print("GPU: none (nvidia-smi is missing or lists none): `serve` runs on the CPU")
    else:
        print(f"GPU: {report.gpu}, driver {report.driver}, {report.memory_mib} MiB")
        print(f"nvidia-cuda-mps-control: {report.mps_control or 'not found'}")
        print(report.mps_line)
        if report.cuda_without_mps is not None:
            print(f"CUDA without MPS: {'initialises' if report.cuda_without_mps else 'does NOT initialise'}")
        print(f"serve with {workers} workers would run {plan.reason}")
    for note in report.notes:
        print(f"note: {note}")
    return 0 if usable else 1
