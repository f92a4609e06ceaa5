"""`serve` starts the CUDA MPS daemon unless one runs. A daemon that died leaves its pipe behind
(a container restarted with its /tmp, a run that was killed): CUDA then runs without MPS and says
nothing, so the launcher must not take a leftover pipe for a running daemon. No GPU needed: the
pipe directory and the daemon's pid file are made up here."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from api import gpu_sharing
from api.gpu_sharing import Mps, mps_daemon_alive


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid  # reaped: no process has it (until the kernel hands it out again, far later)


def _pipe(tmp_path: Path, pid: int | None) -> Path:
    pipe = tmp_path / "pipe"
    pipe.mkdir(parents=True)
    (pipe / "control").touch()
    if pid is not None:
        (pipe / "nvidia-cuda-mps-control.pid").write_text(f"{pid}\n")
    return pipe


def test_a_pipe_is_a_running_daemon_only_while_its_pid_lives(tmp_path):
    assert mps_daemon_alive(_pipe(tmp_path / "alive", os.getpid()))
    assert not mps_daemon_alive(_pipe(tmp_path / "dead", _dead_pid()))
    assert mps_daemon_alive(_pipe(tmp_path / "no-pid-file", None))  # an older driver: trust the pipe
    garbled = _pipe(tmp_path / "garbled", None)
    (garbled / "nvidia-cuda-mps-control.pid").write_text("not a pid")
    assert not mps_daemon_alive(garbled)


@pytest.mark.parametrize("mode", ["auto", "on"])
def test_a_dead_daemons_pipe_is_not_used(mode, tmp_path, monkeypatch, caplog):
    """The launcher goes on to start a daemon (here there is none to start, so `auto` serves
    time-sliced and says why, and `on` refuses), instead of 'a daemon already runs: using it'."""
    pipe = _pipe(tmp_path, _dead_pid())
    monkeypatch.setenv("CUDA_MPS_PIPE_DIRECTORY", str(pipe))
    monkeypatch.setenv("CUDA_MPS_LOG_DIRECTORY", str(tmp_path / "log"))
    monkeypatch.setattr(gpu_sharing.shutil, "which", lambda name: None)
    if mode == "on":
        with pytest.raises(SystemExit, match="nvidia-cuda-mps-control is not available"):
            Mps(mode).ensure()
    else:
        said = Mps(mode).ensure()
        assert "not started" in said and "already runs" not in said
    assert "dead daemon's pipe" in caplog.text


def test_a_live_daemons_pipe_is_used(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDA_MPS_PIPE_DIRECTORY", str(_pipe(tmp_path, os.getpid())))
    monkeypatch.setattr(gpu_sharing.shutil, "which", lambda name: None)
    assert "already runs" in Mps("on").ensure()


def _fake_control(tmp_path: Path) -> Path:
    """An `nvidia-cuda-mps-control` that starts (-d) and records the `quit` it is sent on stdin."""
    control = tmp_path / "bin" / "nvidia-cuda-mps-control"
    control.parent.mkdir(parents=True)
    control.write_text(f'#!/usr/bin/env bash\nif [[ $1 == -d ]]; then exit 0; fi\ncat >> "{tmp_path}/control-input"\n')
    control.chmod(0o755)
    return control


@pytest.mark.parametrize("mode", ["auto", "on"])
def test_a_hung_cuda_probe_under_mps_falls_back_to_time_slicing(mode, tmp_path, monkeypatch):
    """A daemon that starts but never serves its clients hangs torch's CUDA initialisation: past
    the probe's timeout `auto` stops the daemon and plans the time-sliced replicas (the start goes
    on), `on` refuses with the reason; neither raises TimeoutExpired (a crash loop under Modal)."""
    control = _fake_control(tmp_path)
    monkeypatch.setenv("CUDA_MPS_PIPE_DIRECTORY", str(tmp_path / "pipe"))
    monkeypatch.setenv("CUDA_MPS_LOG_DIRECTORY", str(tmp_path / "log"))
    monkeypatch.setattr(gpu_sharing.shutil, "which", lambda name: str(control) if name == control.name else None)
    monkeypatch.setattr(gpu_sharing, "CUDA_PROBE", "import time; time.sleep(600)")  # the hung initialisation
    monkeypatch.setattr(gpu_sharing, "MPS_PROBE_TIMEOUT_S", 1.0)
    mps = Mps(mode)
    if mode == "on":
        with pytest.raises(SystemExit, match="did not initialise under MPS within 1 s"):
            mps.ensure()
    else:
        said = mps.ensure()
        assert "did not initialise under MPS within 1 s" in said and "time-slice" in said, said
        plan = gpu_sharing.plan_replicas(8, 0, 1, mps.active, shared_queue=True, environ={})
        assert (plan.replicas, plan.batch_max) == (gpu_sharing.TIME_SLICED_REPLICAS, gpu_sharing.TIME_SLICED_BATCH_MAX)
    assert not mps.active and 1.0 <= mps.probe_seconds < 600
    assert (tmp_path / "control-input").read_text() == "quit\n", "the daemon that hung the probe must be stopped"
