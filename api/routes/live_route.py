"""The live socket: `/v1/audio/speech/live` (the protocol and the session in api/live.py)."""

from __future__ import annotations

from fastapi import APIRouter, WebSocket

from api.live import LIVE_PATH, live_session

live_router = APIRouter()


@live_router.websocket(LIVE_PATH)
async def live(websocket: WebSocket) -> None:
    """Live speech: text in as it is written, audio out as it is spoken (protocol in api/live.py)."""
    await live_session(websocket.app.state.kokoro, websocket)
