"""What this machine, or the container it runs in, gives a fleet: usable cores and free memory.

A container sees the host's CPUs and memory in `os.cpu_count()` and /proc/meminfo, while its
cgroup may allow far less: `docker run --cpus 4 --memory 8g` on a 64-core host, or a Kubernetes
pod's limits. A fleet sized from the host's figures would start 64 replicas of about 2.5 GB each
and be killed by the OOM killer. So both figures here are the host's, cut by every cgroup limit
on the way from this process's cgroup to the root (cgroup v2, and v1 as Docker on older hosts
mounts it):

* cores: the CPU affinity mask (`--cpuset-cpus`), cut to the CPU quota (`--cpus`: cpu.max, or
  cpu.cfs_quota_us / cpu.cfs_period_us) rounded down, at least 1;
* free memory: MemAvailable, cut to each memory limit less what the cgroup uses, its inactive
  page cache excepted (the kernel reclaims that first; `docker stats` and the kubelet count the
  same "working set").

`root` and `proc` are parameters so tests can point them at made-up cgroup trees.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
PROC = Path("/proc")
_UNLIMITED = 1 << 60  # cgroup v1 writes "no limit" as a huge number (9223372036854771712)


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError):
        return None


def _cgroup_dirs(controller: str, root: Path, proc: Path) -> list[Path]:
    """This process's cgroup directory for `controller` and its ancestors, innermost first.

    cgroup v2 has one tree (`0::/path`); v1 one per controller, mounted under a directory named
    after the controllers it holds (`cpu,cpuacct`, or a link named `cpu`). A path that does not
    exist under the mount (a container without its own cgroup namespace sees the host's path) is
    skipped: the mount's root is then the container's own cgroup."""
    text = _read(proc / "self" / "cgroup") or ""
    unified = (root / "cgroup.controllers").exists()
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        if unified and controllers == "":
            mount = root
        elif not unified and controller in controllers.split(","):
            mount = next((root / name for name in (controllers, controller) if (root / name).is_dir()), None)
            if mount is None:
                continue
        else:
            continue
        dirs = []
        relative = Path(path.lstrip("/"))
        for level in [relative, *relative.parents]:
            if (mount / level).is_dir():
                dirs.append(mount / level)
        return dirs
    return []


def cpu_quota_cores(root: Path = CGROUP_ROOT, proc: Path = PROC) -> float | None:
    """The tightest CPU quota on this process's cgroups, in cores (None: no quota)."""
    quotas = []
    for directory in _cgroup_dirs("cpu", root, proc):
        v2 = _read(directory / "cpu.max")
        if v2 is not None:
            quota, _, period = v2.partition(" ")
            if quota != "max" and period:
                quotas.append(int(quota) / int(period))
            continue
        quota, period = _read(directory / "cpu.cfs_quota_us"), _read(directory / "cpu.cfs_period_us")
        if quota and period and int(quota) > 0:
            quotas.append(int(quota) / int(period))
    return min(quotas) if quotas else None


def usable_cores(root: Path = CGROUP_ROOT, proc: Path = PROC) -> int:
    """Cores this process may use: its affinity mask (a container's cpuset), cut to its cgroups'
    CPU quota rounded down (a replica thread per quota'd core at most: more only get throttled),
    at least 1."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    quota = cpu_quota_cores(root, proc)
    if quota is not None:
        cores = min(cores, max(1, math.floor(quota + 1e-9)))
    return max(1, cores)


def _stat_field(text: str | None, name: str) -> int:
    for line in (text or "").splitlines():
        key, _, value = line.partition(" ")
        if key == name:
            return int(value)
    return 0


def cgroup_free_bytes(root: Path = CGROUP_ROOT, proc: Path = PROC) -> int | None:
    """The least memory any of this process's cgroups still allows: limit less usage, inactive
    page cache counted free (None: no limit anywhere)."""
    free = []
    for directory in _cgroup_dirs("memory", root, proc):
        limit, usage = _read(directory / "memory.max"), _read(directory / "memory.current")
        cache = "inactive_file"
        if limit is None:  # cgroup v1
            limit, usage = _read(directory / "memory.limit_in_bytes"), _read(directory / "memory.usage_in_bytes")
            cache = "total_inactive_file"
        if limit is None or usage is None or limit == "max" or int(limit) >= _UNLIMITED:
            continue
        reclaimable = _stat_field(_read(directory / "memory.stat"), cache)
        free.append(max(0, int(limit) - int(usage) + reclaimable))
    return min(free) if free else None


def available_memory_bytes(root: Path = CGROUP_ROOT, proc: Path = PROC) -> int | None:
    """Memory a new process could take without swapping or meeting a cgroup limit: MemAvailable,
    cut to the cgroups' free memory (None when neither can be read: not Linux)."""
    meminfo = _read(proc / "meminfo")
    host = None
    for line in (meminfo or "").splitlines():
        if line.startswith("MemAvailable:"):
            host = int(line.split()[1]) * 1024
    cgroup = cgroup_free_bytes(root, proc)
    figures = [f for f in (host, cgroup) if f is not None]
    return min(figures) if figures else None
