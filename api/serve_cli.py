"""`kokoro-fleet serve`: run the HTTP server under Uvicorn.

Flags override the matching KOKORO_* settings. They are passed on through the environment, so
every Uvicorn worker process (each builds its own app and replica through `api.app:app_factory`)
sees the same configuration.
"""

from __future__ import annotations

import argparse
import logging
import os

from worker.settings import Settings

# flag -> environment variable
_FLAGS = {
    "host": "KOKORO_HOST",
    "port": "KOKORO_PORT",
    "workers": "KOKORO_WORKERS",
    "weights": "KOKORO_WEIGHTS",
    "device": "KOKORO_DEVICE",
}


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", help="address to listen on (KOKORO_HOST, default 0.0.0.0)")
    parser.add_argument("--port", type=int, help="port to listen on (KOKORO_PORT, default 8880)")
    parser.add_argument("--workers", type=int,
                        help="Uvicorn worker processes, one model replica each (KOKORO_WORKERS; 0: 8 on a GPU, "
                             "the core count on CPU)")
    parser.add_argument("--weights", help="offline | official | tiny | a directory (KOKORO_WEIGHTS)")
    parser.add_argument("--device", help="auto | cpu | cuda | cuda:N (KOKORO_DEVICE)")
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])


def _on_gpu(settings: Settings) -> bool:
    if settings.device == "cpu":
        return False
    import torch

    return settings.device.startswith("cuda") or torch.cuda.is_available()


def resolve_workers(settings: Settings) -> int:
    """KOKORO_WORKERS, or its default: 8 replicas on a GPU, one per core on CPU."""
    if settings.workers > 0:
        return settings.workers
    if _on_gpu(settings):
        return 8
    return os.cpu_count() or 1


def run(args: argparse.Namespace) -> int:
    import uvicorn

    for name, env in _FLAGS.items():
        value = getattr(args, name, None)
        if value is not None:
            os.environ[env] = str(value)
    settings = Settings.from_env()
    workers = resolve_workers(settings)
    os.environ["KOKORO_WORKERS"] = str(workers)
    if workers > 1 and settings.threads == 0 and not _on_gpu(settings):
        # Several CPU replicas each using every core would fight over them: share the cores out.
        os.environ["KOKORO_THREADS"] = str(max(1, (os.cpu_count() or 1) // workers))
    logging.basicConfig(level=getattr(logging, args.log_level.upper()),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    limit = settings.limit_concurrency or max(64, 2 * settings.max_requests + 16)
    uvicorn.run(
        "api.app:app_factory", factory=True,
        host=settings.host, port=settings.port, workers=workers,
        log_level=args.log_level,
        access_log=False,  # api.app writes one structured line per request instead
        # The per-process backstop behind admission: connections beyond it get 503 from Uvicorn.
        limit_concurrency=limit,
        timeout_graceful_shutdown=max(1, round(settings.drain_seconds)),
    )
    return 0
