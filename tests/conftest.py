"""Shared fixtures. Others may append fixtures here; keep each one small and documented."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def real_weights():
    """The real Kokoro-82M weights from the offline bundle (converted once, then cached)."""
    from api.settings import Settings
    from api.settings import weights_source
    from worker.weights import load_weights

    return load_weights(weights_source(Settings.from_env().replace(weights="offline")))


@pytest.fixture(scope="session")
def tiny_weights():
    """Seeded random weights of the small `tiny_config()` (same architecture), for fast tests."""
    from api.settings import Settings
    from api.settings import weights_source
    from worker.weights import load_weights

    return load_weights(weights_source(Settings.from_env().replace(weights="tiny")))


@pytest.fixture
def redis_server():
    """A fresh `redis-server` on a free port for one test (no persistence); killed at teardown.
    `.url` to connect, `.stop()` / `.start()` to simulate a Redis crash and restart."""
    from redis_server import RedisServer  # tests/redis_server.py (tests/ is on sys.path)

    server = RedisServer().start()
    yield server
    server.close()
