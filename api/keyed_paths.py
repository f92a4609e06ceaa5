"""The paths beside the speech API that need an API key too once KOKORO_API_KEYS is set: the
metrics (they name every key and its usage) and the API reference. A pure ASGI guard, so the
speech streams do not pass through a response-wrapping middleware.

`/health` and `/ready` stay open for orchestrators' probes (Docker, Modal, Kubernetes); without a
key `/health` says only that the process answers (api/routes/status_routes.py)."""

from __future__ import annotations

from api.errors import ApiError
from api.state import AppState
from api.swagger import DOCS_PATH, REDOC_PATH

# `/docs/assets/...` is Swagger UI's own files, the same for everyone: not worth a key.
KEYED_PATHS = ("/metrics", "/openapi.json", DOCS_PATH, REDOC_PATH)


class KeyedPaths:
    """Answer 401 (OpenAI's error shape) to a request for KEYED_PATHS without a valid key."""

    def __init__(self, app, state: AppState):
        self.app = app
        self.state = state

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and self.state.api_keys and _keyed(scope["path"]):
            authorization = next((v.decode("latin-1") for k, v in scope["headers"] if k == b"authorization"), "")
            try:
                self.state.check_api_key(authorization)
            except ApiError as refused:
                await refused.response()(scope, receive, send)
                return
        await self.app(scope, receive, send)


def _keyed(path: str) -> bool:
    return (path.rstrip("/") or "/") in KEYED_PATHS
