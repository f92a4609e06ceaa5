"""The replica choice on a GPU (api/gpu_sharing.py): under MPS one replica per worker, without it
a few replicas running batches. No GPU here: the probe's world is faked (nvidia-smi and
nvidia-cuda-mps-control as scripts on PATH), the choice and the probe's code are the real ones."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from api.gpu_sharing import MPS_BATCH_MAX, TIME_SLICED_BATCH_MAX, TIME_SLICED_REPLICAS, plan_replicas
from cli import serve_cli
from api.settings import Settings


def test_without_mps_fewer_replicas_each_batching():
    plan = plan_replicas(8, replicas=0, batch_max=1, mps=False, shared_queue=True, environ={})
    assert (plan.replicas, plan.batch_max) == (TIME_SLICED_REPLICAS, TIME_SLICED_BATCH_MAX)
    assert plan.replicas < 8 and plan.batch_max > 1
    assert "without MPS" in plan.reason and "HTTP fronts" in plan.reason
    assert plan.environment() == {"KOKORO_REPLICAS": str(TIME_SLICED_REPLICAS),
                                  "KOKORO_BATCH_MAX": str(TIME_SLICED_BATCH_MAX)}


def test_under_mps_a_replica_in_every_worker_each_batching():
    plan = plan_replicas(8, replicas=0, batch_max=1, mps=True, shared_queue=True, environ={})
    assert (plan.replicas, plan.batch_max) == (8, MPS_BATCH_MAX)
    assert "MPS" in plan.reason and plan.batch_max > 1
    chosen = plan_replicas(8, replicas=0, batch_max=2, mps=True, shared_queue=True, environ={"KOKORO_BATCH_MAX": "2"})
    assert (chosen.replicas, chosen.batch_max) == (8, 2)


def test_what_the_user_set_is_kept_without_mps():
    environ = {"KOKORO_REPLICAS": "2", "KOKORO_BATCH_MAX": "4"}
    plan = plan_replicas(8, replicas=2, batch_max=4, mps=False, shared_queue=True, environ=environ)
    assert (plan.replicas, plan.batch_max) == (2, 4)
    assert "KOKORO_REPLICAS, KOKORO_BATCH_MAX as set" in plan.reason
    only_batch = plan_replicas(8, replicas=0, batch_max=4, mps=False, shared_queue=True,
                               environ={"KOKORO_BATCH_MAX": "4"})
    assert (only_batch.replicas, only_batch.batch_max) == (TIME_SLICED_REPLICAS, 4)


@pytest.mark.parametrize("workers, shared_queue", [(1, True), (8, False)])
def test_no_fronts_without_a_shared_queue_or_with_one_worker(workers, shared_queue):
    """A worker without a replica needs the shared queue to hand its chunks on (KOKORO_REPLICAS)."""
    plan = plan_replicas(workers, replicas=0, batch_max=1, mps=False, shared_queue=shared_queue, environ={})
    assert plan.replicas == workers


def test_serve_hands_the_choice_to_its_workers(monkeypatch, caplog):
    for name in ("KOKORO_REPLICAS", "KOKORO_BATCH_MAX"):
        monkeypatch.delenv(name, raising=False)
    settings = Settings.from_env({"KOKORO_WORKERS": "8"})
    caplog.set_level("INFO", logger="kokoro_fleet.serve")
    assert serve_cli.share_gpu(settings, 8, mps=False) == TIME_SLICED_REPLICAS
    assert os.environ["KOKORO_REPLICAS"] == str(TIME_SLICED_REPLICAS)
    assert os.environ["KOKORO_BATCH_MAX"] == str(TIME_SLICED_BATCH_MAX)
    assert "without MPS" in caplog.text
    # what the workers then read is a valid fleet: fronts need the shared queue, which it is
    assert serve_cli.resolve_replicas(Settings.from_env(), 8) == TIME_SLICED_REPLICAS


def fake_gpu(tmp_path: Path, daemon_starts: bool) -> dict[str, str]:
    """nvidia-smi showing an H100 and nvidia-cuda-mps-control whose `-d` succeeds or fails; each
    records its calls. torch here is a CPU build, so CUDA never initialises, under MPS or not."""
    bin_dir, calls = tmp_path / "bin", tmp_path / "calls"
    bin_dir.mkdir()
    scripts = {
        "nvidia-smi": 'echo "nvidia-smi $*" >>{calls}\n'
                      'if [[ $* == *--query-gpu=name,driver_version,memory.total* ]]; then '
                      'echo "NVIDIA H100 80GB HBM3, 580.95.05, 81559"; else echo "GPU 0: NVIDIA H100 80GB HBM3"; fi',
        "nvidia-cuda-mps-control": 'if (($# == 0)); then echo "mps-control stdin: $(cat)" >>{calls}; exit 0; fi\n'
                                   'echo "mps-control $*" >>{calls}\n'
                                   + ("exit 0" if daemon_starts else 'echo "cannot start" >&2; exit 1'),
    }
    for name, body in scripts.items():
        (bin_dir / name).write_text("#!/usr/bin/env bash\n" + body.format(calls=calls) + "\n")
        (bin_dir / name).chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KOKORO_", "CUDA_MPS_"))}
    env.update(PATH=f"{bin_dir}:{os.environ['PATH']}", KOKORO_WORKERS="8",
               CUDA_MPS_PIPE_DIRECTORY=str(tmp_path / "mps" / "pipe"), CUDA_MPS_LOG_DIRECTORY=str(tmp_path / "mps" / "log"))
    return env


@pytest.mark.parametrize("daemon_starts", [False, True], ids=["daemon-fails", "cuda-fails-under-mps"])
def test_gpu_check_finds_no_mps_and_plans_batching_replicas(daemon_starts, tmp_path):
    env = fake_gpu(tmp_path, daemon_starts)
    result = subprocess.run([sys.executable, "-m", "cli.main", "gpu-check", "--json"], capture_output=True, text=True,
                            env=env, timeout=300)
    report = json.loads(result.stdout)
    assert (report["gpu"], report["driver"], report["memory_mib"]) == ("NVIDIA H100 80GB HBM3", "580.95.05", 81559)
    assert report["mps_control"].endswith("nvidia-cuda-mps-control")
    assert report["mps"] is False
    if daemon_starts:
        assert "CUDA does not initialise under MPS" in report["mps_line"]
        assert "mps-control stdin: quit" in (tmp_path / "calls").read_text(), "the daemon it started was not stopped"
    else:
        assert "the daemon did not start" in report["mps_line"]
    assert report["cuda_without_mps"] is False and report["usable"] is False and result.returncode == 1
    assert report["plan"]["replicas"] == TIME_SLICED_REPLICAS and report["plan"]["batch_max"] == TIME_SLICED_BATCH_MAX
    if not daemon_starts:  # the same report for a person, once
        human = subprocess.run([sys.executable, "-m", "cli.main", "gpu-check"], capture_output=True, text=True,
                               env=env, timeout=300).stdout
        assert "GPU: NVIDIA H100 80GB HBM3, driver 580.95.05" in human
        assert f"would run replicas: {TIME_SLICED_REPLICAS} of 8 workers" in human


def test_gpu_check_on_a_machine_without_a_gpu(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("KOKORO_")}
    env["PATH"] = os.pathsep.join(p for p in env["PATH"].split(os.pathsep) if not (Path(p) / "nvidia-smi").exists())
    result = subprocess.run([sys.executable, "-m", "cli.main", "gpu-check"], capture_output=True, text=True,
                            env=env, timeout=300)
    assert result.returncode == 1 and "GPU: none" in result.stdout, result.stdout + result.stderr
