"""A container's CPU quota and memory limit size the fleet: worker/machine.py reads them from
made-up cgroup trees (v2 and v1) here, and `serve` lowers or refuses its worker count by them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from cli.serve_cli import fit_cpu_memory, replica_cpu_mib, resolve_workers
from worker import machine
from api.settings import Settings

GIB = 1 << 30


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def _proc(tmp_path: Path, cgroup: str, available_kib: int = 64 * (GIB >> 10)) -> Path:
    proc = tmp_path / "proc"
    _write(proc / "self" / "cgroup", cgroup)
    _write(proc / "meminfo", f"MemTotal: {2 * available_kib} kB\nMemFree: 1000 kB\nMemAvailable: {available_kib} kB\n")
    return proc


def test_cgroup_v2_quota_and_memory_limit_cut_the_host_figures(tmp_path):
    root = tmp_path / "cgroup"
    _write(root / "cgroup.controllers", "cpu memory")
    pod = root / "kubepods" / "pod1"
    _write(root / "kubepods" / "cpu.max", "800000 100000")  # the parent allows 8 cores
    _write(pod / "cpu.max", "250000 100000")  # the pod 2.5
    _write(root / "kubepods" / "memory.max", "max")
    _write(pod / "memory.max", str(8 * GIB))
    _write(pod / "memory.current", str(5 * GIB))
    _write(pod / "memory.stat", f"anon 1234\ninactive_file {GIB}\nactive_file 99\n")
    proc = _proc(tmp_path, "0::/kubepods/pod1\n")

    assert machine.cpu_quota_cores(root, proc) == pytest.approx(2.5)
    assert machine.usable_cores(root, proc) == min(2, len(os.sched_getaffinity(0)))
    # limit - usage + inactive page cache: 8 - 5 + 1 GiB, below the host's 64 GiB available
    assert machine.cgroup_free_bytes(root, proc) == 4 * GIB
    assert machine.available_memory_bytes(root, proc) == 4 * GIB


def test_cgroup_v1_as_docker_mounts_it(tmp_path):
    root = tmp_path / "cgroup"
    # the host's path in /proc/self/cgroup does not exist under the container's mounts: their
    # roots are the container's own cgroups
    _write(root / "cpu,cpuacct" / "cpu.cfs_quota_us", "150000")
    _write(root / "cpu,cpuacct" / "cpu.cfs_period_us", "100000")
    _write(root / "memory" / "memory.limit_in_bytes", str(6 * GIB))
    _write(root / "memory" / "memory.usage_in_bytes", str(2 * GIB))
    _write(root / "memory" / "memory.stat", f"cache 5\ntotal_inactive_file {GIB // 2}\n")
    proc = _proc(tmp_path, "12:memory:/docker/abc\n4:cpu,cpuacct:/docker/abc\n1:name=systemd:/docker/abc\n")

    assert machine.cpu_quota_cores(root, proc) == pytest.approx(1.5)
    assert machine.usable_cores(root, proc) == 1  # rounded down: a second thread would be throttled
    assert machine.available_memory_bytes(root, proc) == 4 * GIB + GIB // 2


def test_no_limits_leave_the_host_figures(tmp_path):
    root = tmp_path / "cgroup"
    _write(root / "cpu" / "cpu.cfs_quota_us", "-1")
    _write(root / "cpu" / "cpu.cfs_period_us", "100000")
    _write(root / "memory" / "memory.limit_in_bytes", "9223372036854771712")
    _write(root / "memory" / "memory.usage_in_bytes", str(GIB))
    proc = _proc(tmp_path, "4:memory:/\n3:cpu:/\n", available_kib=3 * (GIB >> 10))

    assert machine.cpu_quota_cores(root, proc) is None
    assert machine.usable_cores(root, proc) == len(os.sched_getaffinity(0))
    assert machine.available_memory_bytes(root, proc) == 3 * GIB
    # nothing readable at all (not Linux): unknown, and the fleet is not cut by it
    assert machine.available_memory_bytes(tmp_path / "none", tmp_path / "none") is None


def test_this_machine_reads():
    assert machine.usable_cores() >= 1
    available = machine.available_memory_bytes()
    assert available is None or available > 0


def test_workers_default_to_the_usable_cores(monkeypatch):
    monkeypatch.setattr(machine, "usable_cores", lambda: 3)
    cpu = Settings.from_env({"KOKORO_DEVICE": "cpu"})
    assert resolve_workers(cpu) == 3
    assert resolve_workers(Settings.from_env({"KOKORO_DEVICE": "cpu", "KOKORO_WORKERS": "5"})) == 5
    assert resolve_workers(Settings.from_env({"KOKORO_ENGINE": "sim"})) == 8


def test_memory_lowers_the_default_count_and_refuses_a_chosen_one():
    assert fit_cpu_memory(4, 2560, 20_000, chosen=False)[0::2] == (4, False)  # fits: as asked, no warning
    assert fit_cpu_memory(4, 2560, 20_000, chosen=True)[0::2] == (4, False)
    workers, line, warn = fit_cpu_memory(16, 2560, 20_000, chosen=False)
    assert (workers, warn) == (7, True) and "not one per core (16)" in line
    with pytest.raises(SystemExit, match=r"16 replicas .* 20000 MiB are available.*--workers 7"):
        fit_cpu_memory(16, 2560, 20_000, chosen=True)
    # one replica always starts, with a warning, when even it may not fit
    assert fit_cpu_memory(1, 2560, 1000, chosen=True)[0::2] == (1, True)
    assert fit_cpu_memory(8, 2560, 1000, chosen=False)[0::2] == (1, True)
    with pytest.raises(SystemExit, match="--workers 1"):
        fit_cpu_memory(2, 2560, 1000, chosen=True)
    assert fit_cpu_memory(64, 2560, None, chosen=True)[0::2] == (64, False)  # memory unknown: not cut


def test_the_per_replica_figure_follows_the_weights_and_counts_the_synthesis_cache():
    assert replica_cpu_mib(Settings.from_env({})) == 2560 + 64
    assert replica_cpu_mib(Settings.from_env({"KOKORO_WEIGHTS": "tiny", "KOKORO_SYNTHESIS_CACHE_MIB": "0"})) == 1280
    chosen = Settings.from_env({"KOKORO_REPLICA_CPU_MIB": "900", "KOKORO_SYNTHESIS_CACHE_MIB": "100"})
    assert replica_cpu_mib(chosen) == 1000


def test_serve_refuses_workers_the_memory_cannot_hold():
    """The real launcher, before any replica or Redis starts: a clear refusal, at once."""
    env = {**os.environ, "KOKORO_DEVICE": "cpu", "KOKORO_WEIGHTS": "tiny", "KOKORO_REPLICA_CPU_MIB": str(1 << 30)}
    done = subprocess.run([sys.executable, "-m", "cli.main", "serve", "--workers", "2", "--port", "1"],
                          env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert "2 replicas may take about" in done.stderr and "Start at most 1 (--workers 1)" in done.stderr
