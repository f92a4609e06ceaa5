"""Hosts that are really apart, on one machine: each host a Linux network namespace with its own
address, all joined by veth pairs on one bridge, and links with a set round trip and bandwidth.

    with Hosts(["client", "balancer", "redis", "fleet1"]) as hosts:
        hosts.address("redis")                       # 10.231.57.12: that host's own address
        proc = hosts.popen("redis", ["redis-server", ...])
        link = hosts.delayed_link("redis", 6380, to_port=6379, rtt_ms=10, mbit=1000)
        with hosts.entered("client"):                # this thread's sockets are the client host's
            httpx.get(f"http://{hosts.address('fleet1')}:8880/ready")
    # leaving the block ends every process in the namespaces and deletes them, failure or not

The bridge lives in a namespace of its own, so nothing is added to the machine's own network and
the only addresses ever reached are the ones assigned here (a private /24 that exists only on these
links). Needs root (or CAP_NET_ADMIN + CAP_SYS_ADMIN) and iproute2. The kernel's netem is not
available on every machine this runs on, so a link's delay and bandwidth are made in user space:
`delayed_link` starts `loadtest.delay_link` in the serving host, which listens on that host's
address and holds each direction's bytes for half the round trip, paced to the bandwidth, before
passing them to the service on that host's loopback; peers reach the service only through it.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

CLONE_NEWNET = 0x40000000
DEFAULT_SUBNET = "10.231.57"  # a /24 private to these namespaces
FIRST_HOST = 10               # host i gets .(10 + i)
REPO = Path(__file__).resolve().parents[1]


def namespaces_available() -> str | None:
    """None when this machine can make the hosts; else why not (for a test's skip reason)."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "iproute2 (ip) is not installed"
    name = f"kfprobe{os.getpid()}"
    made = subprocess.run(["ip", "netns", "add", name], capture_output=True, text=True)
    if made.returncode != 0:
        return f"ip netns add failed: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", name], capture_output=True)
    return None


def _ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")


@dataclass
class DelayedLink:
    """A service on a host's loopback, reached by the other hosts through a delaying relay."""

    host: str
    address: str
    port: int
    rtt_ms: float
    mbit: float
    process: subprocess.Popen

    @property
    def hostport(self) -> str:
        return f"{self.address}:{self.port}"

    def set_rtt(self, rtt_ms: float) -> None:
        """A new round trip for the bytes read from now on."""
        self.process.stdin.write(f"rtt {rtt_ms:g}\n")
        self.process.stdin.flush()
        self.rtt_ms = rtt_ms


class Hosts:
    """Network namespaces on one bridge; see the module's docstring."""

    def __init__(self, names: Sequence[str], *, subnet: str = DEFAULT_SUBNET, tag: str | None = None):
        if len(set(names)) != len(names) or len(names) > 200:
            raise ValueError(f"host names must be unique and at most 200: {names}")
        # Namespace names carry this process's id: runs side by side (two helpers, two CI jobs) never meet.
        self.tag = tag or f"kf{os.getpid()}"
        self.names = list(names)
        self._addresses = {name: f"{subnet}.{FIRST_HOST + i}" for i, name in enumerate(names)}
        self._started: list[str] = []
        self._processes: list[subprocess.Popen] = []

    def netns(self, name: str) -> str:
        return f"{self.tag}-{name}"

    def address(self, name: str) -> str:
        return self._addresses[name]

    # --- making and removing ------------------------------------------------------------------------
    def start(self) -> "Hosts":
        try:
            hub = self.netns("hub")
            _ip("netns", "add", hub)
            self._started.append(hub)
            _ip("-n", hub, "link", "add", "br0", "type", "bridge")
            _ip("-n", hub, "link", "set", "br0", "up")
            for i, name in enumerate(self.names):
                ns = self.netns(name)
                _ip("netns", "add", ns)
                self._started.append(ns)
                _ip("-n", ns, "link", "set", "lo", "up")
                # Both ends are made inside the namespaces: the hub's end, its peer moved to the host.
                _ip("-n", hub, "link", "add", f"p{i}", "type", "veth", "peer", "name", "eth0", "netns", ns)
                _ip("-n", hub, "link", "set", f"p{i}", "master", "br0", "up")
                _ip("-n", ns, "addr", "add", f"{self._addresses[name]}/24", "dev", "eth0")
                _ip("-n", ns, "link", "set", "eth0", "up")
        except BaseException:
            self.close()
            raise
        return self

    def close(self) -> None:
        """End every process started here, then every process left in the namespaces, then the
        namespaces (their veth pairs go with them)."""
        for proc in self._processes:
            _end(proc)
        self._processes.clear()
        for ns in reversed(self._started):
            pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout.split()
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, ValueError):
                    os.kill(int(pid), signal.SIGKILL)
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        self._started.clear()

    def __enter__(self) -> "Hosts":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    # --- running things on a host ---------------------------------------------------------------------
    def command(self, name: str, args: Sequence[str]) -> list[str]:
        """`args` as a command line run on host `name`."""
        return ["ip", "netns", "exec", self.netns(name), *args]

    def popen(self, name: str, args: Sequence[str], **kwargs) -> subprocess.Popen:
        """A process on host `name`, ended by `close` (its own session, so a signal reaches its children)."""
        kwargs.setdefault("start_new_session", True)
        proc = subprocess.Popen(self.command(name, args), **kwargs)
        self._processes.append(proc)
        return proc

    @contextlib.contextmanager
    def entered(self, name: str) -> Iterator[None]:
        """Run this thread in host `name`'s network for the block: the sockets it opens (and those of
        threads and processes it starts meanwhile) are that host's; it comes back after."""
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        home = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
        there = os.open(f"/run/netns/{self.netns(name)}", os.O_RDONLY)
        try:
            if libc.setns(there, CLONE_NEWNET) != 0:
                raise OSError(ctypes.get_errno(), f"setns into {self.netns(name)} failed")
            try:
                yield
            finally:
                if libc.setns(home, CLONE_NEWNET) != 0:
                    raise OSError(ctypes.get_errno(), "setns back to this thread's network failed")
        finally:
            os.close(there)
            os.close(home)

    def delayed_link(self, name: str, port: int, *, to_port: int, rtt_ms: float, mbit: float = 1000.0) -> DelayedLink:
        """Port `port` on host `name`'s address, relayed with `rtt_ms` and `mbit` to `to_port` on its loopback."""
        proc = self.popen(name, [sys.executable, "-m", "loadtest.delay_link", "--listen",
                                 f"{self.address(name)}:{port}", "--to", f"127.0.0.1:{to_port}",
                                 "--rtt-ms", f"{rtt_ms:g}", "--mbit", f"{mbit:g}"],
                          cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        line = proc.stdout.readline()  # the relay prints one line once it listens ("" if it exits)
        if not line.startswith("listening"):
            _end(proc)
            raise RuntimeError(f"the delaying relay on {name} did not start: {line!r}")
        return DelayedLink(name, self.address(name), port, rtt_ms, mbit, proc)


def _end(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
