"""A free TCP port on the loopback interface, for a server this process starts (the embedded
Redis, a fleet under test)."""

from __future__ import annotations

import socket


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
