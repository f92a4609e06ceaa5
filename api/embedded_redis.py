"""The fleet's own `redis-server` (`kokoro-fleet serve` without REDIS_URL; the load tests and the
test suite start it too): loopback only, a free port and a private Unix socket, nothing on disk."""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

from api.ports import free_port


def _die_with_parent() -> None:  # pragma: no cover (runs in the child between fork and exec)
    """Linux: the child gets SIGTERM if this launcher dies without cleaning up (SIGKILL)."""
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


class EmbeddedRedis:
    """A `redis-server` owned by the fleet: loopback only, a free port, nothing written to disk."""

    def __init__(self, port: int | None = None):
        self.binary = shutil.which("redis-server")
        if self.binary is None:
            raise SystemExit("kokoro-fleet serve: several workers share their work through Redis, and neither "
                             "--redis-url/REDIS_URL is set nor redis-server installed (apt-get install redis-server)")
        self.port = port or free_port()
        self.process: subprocess.Popen | None = None
        self._socket_dir: str | None = None

    @property
    def url(self) -> str:
        """The loopback TCP address: for anything outside the fleet (status, load tests, tools)."""
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def socket_path(self) -> str | None:
        return os.path.join(self._socket_dir, "redis.sock") if self._socket_dir else None

    @property
    def worker_url(self) -> str:
        """What the fleet's own workers connect to: the Unix socket beside the TCP port. A round trip
        through it costs both ends less CPU than one over loopback TCP (no TCP stack; figures in
        loadtest/README.md), and a one-chunk request makes several."""
        return f"unix://{self.socket_path}?db=0" if self.socket_path else self.url

    def start(self, timeout_s: float = 10.0) -> "EmbeddedRedis":
        # The socket lives in a directory only this user can enter (redis-server also sets its mode).
        self._socket_dir = self._socket_dir or tempfile.mkdtemp(prefix="kokoro-redis-")
        self.process = subprocess.Popen(
            [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--unixsocket", self.socket_path, "--unixsocketperm", "700",
             "--daemonize", "no", "--loglevel", "warning", "--protected-mode", "yes"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            # Its own session: a terminal's Ctrl-C reaches the workers (which drain) but not Redis,
            # which must outlive their drain; this launcher stops it last.
            start_new_session=True, preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None)
        # A plain blocking wait is right here: this runs in the launcher before Uvicorn starts, so
        # there is no event loop to block yet.
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                err = self.process.stderr.read().decode(errors="replace") if self.process.stderr else ""
                raise SystemExit(f"kokoro-fleet serve: the embedded redis-server exited ({self.process.returncode}): {err}")
            if self.ping():
                return self
            time.sleep(0.02)
        self.stop()
        raise SystemExit(f"kokoro-fleet serve: the embedded redis-server did not answer on port {self.port}")

    def ping(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as s:
                s.sendall(b"PING\r\n")
                return s.recv(64).startswith(b"+PONG")
        except OSError:
            return False

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None
        self.remove_socket_dir()

    def remove_socket_dir(self) -> None:
        if self._socket_dir:
            shutil.rmtree(self._socket_dir, ignore_errors=True)
            self._socket_dir = None


# --- the GPU ---------------------------------------------------------------------------------------
