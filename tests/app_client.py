"""An HTTP client on the app in process, with the app's real start-up (the service built in the
background, as a server builds it), handed over once the service is ready or has failed to load."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import httpx


@contextlib.asynccontextmanager
async def started_app_client(app, timeout_s: float = 120.0,
                             raise_app_exceptions: bool = True) -> AsyncIterator[httpx.AsyncClient]:
    """raise_app_exceptions=False: an error the app answers with a 500 comes back as that 500, as a
    server's client sees it, instead of raising in the test."""
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=raise_app_exceptions)
        async with httpx.AsyncClient(transport=transport, base_url="http://t", timeout=timeout_s) as client:
            for _ in range(4800):  # up to 4 min: the tiny model's first warm-up compiles kernels
                if app.state.kokoro.ready or app.state.kokoro.load_error:
                    break
                await asyncio.sleep(0.05)
            yield client
