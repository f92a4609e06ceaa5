"""What routes depend on: the process's `AppState`, and the API key check."""

from __future__ import annotations

from fastapi import Depends, Request

from api.state import AppState


# Both async: FastAPI runs a plain `def` dependency in its thread pool, a thread hop (and, the
# first time, the pool's start) for every request, 503s included.
async def app_state(request: Request) -> AppState:
    return request.app.state.kokoro


async def require_api_key(request: Request) -> None:
    state: AppState = request.app.state.kokoro
    name = state.check_api_key(request.headers.get("authorization", ""))
    info = request.scope.get("state", {}).get("info")
    if info is not None:  # the access log and /metrics count the request under its key's name
        info.key = name


AUTHORIZED = [Depends(require_api_key)]
