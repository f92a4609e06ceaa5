"""A throwaway `redis-server` for tests: own free port, no persistence, stopped at teardown.

    with RedisServer() as server:          # or the `redis_server` fixture in conftest.py
        client = connect(server.url)
        server.stop(); server.start()      # same port, empty data: a Redis restart
    # leaving the block (or server.close()) kills it and removes its socket directory

It is the fleet's own embedded Redis (api.embedded_redis.EmbeddedRedis), except that stopping it is a
crash (SIGKILL: nothing flushed, clients cut off), which is what the fault tests need. Never
assumes a Redis is already running. Needs the `redis-server` binary (apt: redis-server).
"""

from __future__ import annotations

from api.ports import free_port
from api.embedded_redis import EmbeddedRedis

__all__ = ["RedisServer", "free_port"]


class RedisServer(EmbeddedRedis):
    def start(self, timeout_s: float = 10.0) -> "RedisServer":
        assert self.process is None, "already running"
        super().start(timeout_s)
        return self

    def stop(self) -> None:
        """Kill the server (SIGKILL: like a crash, nothing is flushed) and wait for it. Its socket
        directory stays for a restart on the same addresses."""
        if self.process is not None:
            self.process.kill()
            self.process.wait(timeout=10)
            self.process = None

    def close(self) -> None:
        """Kill the server for good and remove its socket directory."""
        self.stop()
        self.remove_socket_dir()

    def __enter__(self) -> "RedisServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()
