"""A `redis-server` that takes only TLS and an ACL user, with a certificate authority made for the
test (openssl): what a fleet meets in a managed Redis on another machine.

    ca = TestAuthority(tmp_path, "127.0.0.1")          # the CA and a server certificate naming that address
    with TlsRedis(ca, password="s3cret") as server:    # or host=/netns= to serve a namespace's address
        server.url                                     # rediss://fleet:s3cret@127.0.0.1:PORT/0
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from pathlib import Path

from api.ports import free_port

USER = "fleet"


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


class TestAuthority:
    """A self-signed CA, a server certificate it signed for `address`, and one it did not sign (an
    impostor with the same name), all in `directory`."""

    __test__ = False  # not a pytest class

    def __init__(self, directory: Path, address: str):
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.address = address
        for name in ("ca", "other-ca"):
            _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out",
                     f"{name}.crt", "-days", "2", "-subj", f"/CN=kokoro-fleet test {name}", cwd=self.dir)
        (self.dir / "san.ext").write_text(f"subjectAltName=IP:{address}\n")
        _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key", "-out", "server.csr",
                 "-subj", f"/CN={address}", cwd=self.dir)
        _openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
                 "-out", "server.crt", "-days", "2", "-extfile", "san.ext", cwd=self.dir)

    @property
    def ca(self) -> Path:
        return self.dir / "ca.crt"

    @property
    def other_ca(self) -> Path:
        """An authority that signed nothing the server holds: a client trusting it must refuse."""
        return self.dir / "other-ca.crt"


class TlsRedis:
    """redis-server on `host`:`port` with TLS only (no plain port), the default user off and one ACL
    user with `password`; `command_prefix` runs it elsewhere (a network namespace)."""

    def __init__(self, authority: TestAuthority, password: str, *, host: str = "127.0.0.1",
                 port: int | None = None, command_prefix: list[str] | None = None):
        if shutil.which("redis-server") is None:
            raise RuntimeError("redis-server is not installed")
        self.authority, self.password, self.host = authority, password, host
        self.port = port or free_port()
        self.prefix = command_prefix or []
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"rediss://{USER}:{self.password}@{self.host}:{self.port}/0"

    def args(self) -> list[str]:
        d = self.authority.dir
        # ACL lines go in a file: on the command line redis-server reads "default off" as one name.
        conf = d / f"redis-{self.port}.conf"
        conf.write_text(f"user default off\nuser {USER} on >{self.password} ~* &* +@all\n")
        return [*self.prefix, "redis-server", str(conf), "--port", "0", "--tls-port", str(self.port), "--bind", self.host,
                "--tls-cert-file", str(d / "server.crt"), "--tls-key-file", str(d / "server.key"),
                "--tls-ca-cert-file", str(d / "ca.crt"), "--tls-auth-clients", "no",
                "--save", "", "--appendonly", "no", "--daemonize", "no", "--loglevel", "warning"]

    def start(self, timeout_s: float = 10.0) -> "TlsRedis":
        self.process = subprocess.Popen(self.args(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"redis-server exited: {self.process.stdout.read().decode(errors='replace')}")
            if not self.prefix and _accepts(self.host, self.port):
                return self
            if self.prefix:  # another namespace: give it the time a local one takes to listen
                time.sleep(0.3)
                return self
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"redis-server with TLS did not listen on {self.host}:{self.port}")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)
        self.process = None

    def __enter__(self) -> "TlsRedis":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def _accepts(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.3):
            return True
    except OSError:
        return False
