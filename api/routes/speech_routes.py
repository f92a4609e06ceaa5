"""Speech: `POST /v1/audio/speech`, Kokoro-FastAPI's /dev routes (phonemes, dialogue) and the
download links a `return_download_link` request names."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request
from fastapi.responses import FileResponse, Response

from api.encoders import CONTENT_TYPES
from api.protocol import (DialogueRequest, PhonemeSpeechRequest, PhonemizeRequest, PhonemizeResponse,
                          SpeechRequestBody)
from api.routes.dependencies import AUTHORIZED, app_state
from api.routes.request_bodies import json_body
from api.serving import phonemize_response, speech_response
from api.state import AppState

speech_router = APIRouter(dependencies=AUTHORIZED)
AUDIO = {t: {} for t in CONTENT_TYPES.values()}


@speech_router.post("/v1/audio/speech", response_class=Response, openapi_extra=json_body(SpeechRequestBody),
                    responses={200: {"content": AUDIO | {"text/event-stream": {}}}})
async def speech(request: Request, state: AppState = Depends(app_state)) -> Response:
    """Speak `input`. Streams chunked audio (or SSE events) by default; `stream: false` sends one body."""
    return await speech_response(state, request)


# Kokoro-FastAPI's phoneme endpoints, for pronunciations a text cannot spell.
@speech_router.post("/dev/phonemize", response_model=PhonemizeResponse, openapi_extra=json_body(PhonemizeRequest))
async def phonemize(request: Request, state: AppState = Depends(app_state)) -> PhonemizeResponse:
    """The phonemes and model ids the server would speak for `text` (no synthesis)."""
    return await phonemize_response(state, request)


@speech_router.post("/dev/generate_from_phonemes", response_class=Response,
                    openapi_extra=json_body(PhonemeSpeechRequest), responses={200: {"content": AUDIO}})
async def generate_from_phonemes(request: Request, state: AppState = Depends(app_state)) -> Response:
    """Speak `phonemes` as given; streamed WAV by default (any speech format may be asked)."""
    return await speech_response(state, request, phonemes=True)


@speech_router.post("/dev/dialogue", response_class=Response, openapi_extra=json_body(DialogueRequest),
                    responses={200: {"content": AUDIO}})
async def dialogue(request: Request, state: AppState = Depends(app_state)) -> Response:
    """Kokoro-FastAPI's dialogue: turns, each in its speaker's voice, a pause where the speaker
    changes; answered as `/v1/audio/speech` answers."""
    return await speech_response(state, request, dialogue=True)


async def download(filename: str, state: AppState = Depends(app_state)) -> Response:
    """A file saved for a `return_download_link` request (the path its X-Download-Path header named)."""
    found = await state.downloads.lookup(filename)
    suffix = "." + filename.rsplit(".", 1)[-1]
    if isinstance(found, bytes):  # another machine of the fleet made it
        return Response(found, media_type=CONTENT_TYPES[suffix[1:]],
                        headers={"Content-Disposition": f'attachment; filename="speech{suffix}"'})
    return FileResponse(found, media_type=CONTENT_TYPES[suffix[1:]], filename=f"speech{suffix}")


# Kokoro-FastAPI names the link `/download/NAME`, relative to its `/v1` prefix; both paths serve it.
for _path in ("/v1/download/{filename}", "/download/{filename}"):
    speech_router.add_api_route(_path, download, methods=["GET"], response_class=FileResponse,
                                include_in_schema=_path.startswith("/v1"))
