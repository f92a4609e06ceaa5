"""Voices: `GET /v1/audio/voices` and `POST /v1/audio/voices/combine`."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response

from api.protocol import LegacyVoiceList, VoiceEntry, VoiceList
from api.routes.dependencies import AUTHORIZED, app_state
from api.serving import combined_voice_response
from api.state import AppState

voice_router = APIRouter(dependencies=AUTHORIZED)


@voice_router.get("/v1/audio/voices", response_model=VoiceList | LegacyVoiceList)
async def voices(legacy: bool = False, state: AppState = Depends(app_state)) -> VoiceList | LegacyVoiceList:
    """The voices, with language and gender; `?legacy=true`: the bare names, as Kokoro-FastAPI
    listed them before 0.3."""
    listed = state.require_service().voices.list()
    if legacy:
        return LegacyVoiceList(voices=[v.name for v in listed])
    return VoiceList(voices=[VoiceEntry(id=v.name, name=v.name, language=str(v.language), gender=str(v.gender),
                                        lang_code=v.lang_code) for v in listed])


@voice_router.post("/v1/audio/voices/combine", response_class=Response,
                   responses={200: {"content": {"application/octet-stream": {}}}})
async def combine_voices(request: Request, state: AppState = Depends(app_state)) -> Response:
    """A mix of voices as a .pt voice file (Kokoro-FastAPI's endpoint): saved as NAME.pt in the
    voices directory (KOKORO_VOICES_DIR), it is served as NAME."""
    return await combined_voice_response(state, request)
