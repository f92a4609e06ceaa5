"""Captioned speech: `POST /v1/audio/speech/captioned` (and Kokoro-FastAPI's `/dev/captioned_speech`)."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response

from api.protocol import CaptionedSpeechRequest, CaptionedSpeechResponse
from api.routes.dependencies import AUTHORIZED, app_state
from api.routes.request_bodies import json_body
from api.serving import captioned_response
from api.state import AppState

caption_router = APIRouter(dependencies=AUTHORIZED)


async def captioned(request: Request, state: AppState = Depends(app_state)) -> Response:
    """Speak `input` and return per-word timestamps: one JSON body, or NDJSON lines when streamed."""
    return await captioned_response(state, request)


for _path in ("/v1/audio/speech/captioned", "/dev/captioned_speech"):
    caption_router.add_api_route(_path, captioned, methods=["POST"], response_model=CaptionedSpeechResponse,
                                 include_in_schema=_path.startswith("/v1"),
                                 openapi_extra=json_body(CaptionedSpeechRequest))
