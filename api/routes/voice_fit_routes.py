"""Voices fitted from a recording: `POST /v1/audio/voices` (multipart: `file`, `name`, optional
`transcript`) answers 202 with a job; `GET /v1/audio/voices/jobs/{id}` (and `/events`, server-sent
events) follows it, `DELETE` on it cancels it; `DELETE /v1/audio/voices/{name}` removes a voice of
the voices directory. Where API keys are configured, starting, cancelling and deleting need a key
named in KOKORO_VOICE_MANAGER_KEYS. The jobs themselves: api/voice_fit_jobs.py.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from fastapi import APIRouter, Depends, Form, Request, UploadFile
from fastapi.responses import JSONResponse, StreamingResponse

from api.errors import ApiError, bad_request
from api.routes.dependencies import AUTHORIZED, app_state
from api.state import AppState
from api.voice_fit_jobs import FitJobs, JobNotFound, child_environment

voice_fit_router = APIRouter(dependencies=AUTHORIZED)


async def voice_manager(request: Request, state: AppState = Depends(app_state)) -> None:
    """Where keys are configured, only the keys KOKORO_VOICE_MANAGER_KEYS names may change voices."""
    name = state.check_api_key(request.headers.get("authorization", ""))
    allowed = {n.strip() for n in state.settings.voice_manager_keys.split(",") if n.strip()}
    if name is not None and name not in allowed:
        raise ApiError(403, f"API key {name!r} may not fit or delete voices; the operator allows keys to in "
                       "KOKORO_VOICE_MANAGER_KEYS.", code="permission_denied")


MANAGER = [Depends(voice_manager)]


def fit_jobs(request: Request) -> FitJobs:
    state: AppState = request.app.state.kokoro
    jobs = getattr(request.app.state, "voice_fit_jobs", None)
    if jobs is None:
        settings = state.settings
        if not settings.voices_dir:
            raise ApiError(400, "This server has no voices directory to keep fitted voices in; the operator sets "
                           "KOKORO_VOICES_DIR to fit voices.", code="voice_fitting_unavailable")
        if settings.voice_fit_jobs < 1:
            raise ApiError(400, "Voice fitting is switched off on this server (KOKORO_VOICE_FIT_JOBS=0).",
                           code="voice_fitting_unavailable")
        jobs = request.app.state.voice_fit_jobs = FitJobs(
            settings.voices_dir, settings.voice_fit_jobs, settings.voice_fit_minutes,
            settings.voice_fit_candidates, environment=child_environment(settings))
    return jobs


def _builtin(state: AppState) -> set[str]:
    return set(state.require_service().voices.builtin_names)


@voice_fit_router.post("/v1/audio/voices", status_code=202, dependencies=MANAGER)
async def fit_voice(request: Request, file: UploadFile, name: str = Form(...), transcript: str | None = Form(None),
                    state: AppState = Depends(app_state)) -> JSONResponse:
    """Fit a voice to a recording of one speaker (10 to 60 s; wav, mp3, flac, ogg/opus, m4a): 202
    with the job; the voice is served by `name` once the job has succeeded."""
    from worker.voice_fit import check_fit_name
    from worker.voice_fit.recording import MAX_SAMPLE_BYTES, SampleError, read_sample
    from worker.voice_fit.speaker import EncoderMissing, speaker_encoder

    jobs = fit_jobs(request)
    name = check_fit_name(name, _builtin(state))
    if (Path(state.settings.voices_dir) / f"{name}.pt").exists():
        raise SampleError("name_taken", f"a voice {name!r} exists already; DELETE /v1/audio/voices/{name} first, "
                          "or choose another name", "name")
    data = await file.read(MAX_SAMPLE_BYTES + 1)
    if len(data) > MAX_SAMPLE_BYTES:
        raise SampleError("sample_too_large", f"the recording is over {MAX_SAMPLE_BYTES >> 20} MiB; 10 to 60 s of "
                          "speech is enough")
    if transcript is not None and len(transcript) > 5000:
        raise bad_request("transcript is over 5000 characters; give what the recording says", "transcript")
    try:  # decoded and checked here, so a bad recording is a 400 now rather than a failed job later
        await asyncio.to_thread(lambda: read_sample(data, speaker_encoder()))
    except EncoderMissing as e:
        raise ApiError(503, str(e), type="server_error", code="voice_fitting_unavailable") from None
    job = jobs.start(data, name, transcript)
    return JSONResponse(job, status_code=202, headers={"Location": f"/v1/audio/voices/jobs/{job['id']}"})


@voice_fit_router.get("/v1/audio/voices/jobs")
async def list_fit_jobs(request: Request) -> dict:
    return {"object": "list", "data": [FitJobs.public(job) for job in fit_jobs(request).list()]}


@voice_fit_router.get("/v1/audio/voices/jobs/{job_id}")
async def fit_job(job_id: str, request: Request) -> dict:
    try:
        return fit_jobs(request).get(job_id)
    except JobNotFound:
        raise ApiError(404, f"No voice fitting job {job_id!r} (finished jobs are kept a day).", code="not_found") from None


@voice_fit_router.get("/v1/audio/voices/jobs/{job_id}/events")
async def fit_job_events(job_id: str, request: Request) -> StreamingResponse:
    """The job as server-sent events: `progress` each time it moves, then `succeeded`, `failed` or `cancelled`."""
    jobs = fit_jobs(request)
    try:
        jobs.read(job_id)
    except JobNotFound:
        raise ApiError(404, f"No voice fitting job {job_id!r}.", code="not_found") from None

    async def stream():
        async for job in jobs.events(job_id):
            kind = job["status"] if job["status"] in ("succeeded", "failed", "cancelled") else "progress"
            yield f"event: {kind}\ndata: {json.dumps(job)}\n\n"

    return StreamingResponse(stream(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})


@voice_fit_router.delete("/v1/audio/voices/jobs/{job_id}", dependencies=MANAGER)
async def cancel_fit_job(job_id: str, request: Request) -> dict:
    """Cancel a job: its child stops and nothing of it is kept."""
    try:
        return fit_jobs(request).cancel(job_id)
    except JobNotFound:
        raise ApiError(404, f"No voice fitting job {job_id!r}.", code="not_found") from None


@voice_fit_router.delete("/v1/audio/voices/{name}", dependencies=MANAGER)
async def delete_voice(name: str, state: AppState = Depends(app_state)) -> dict:
    """Remove a voice of the voices directory (a fitted one, or any file there); built-in voices stay."""
    from worker.voices import VOICE_FILE_SUFFIXES

    directory = state.settings.voices_dir
    lowered = name.lower()
    if lowered in _builtin(state) and not any((Path(directory) / f"{lowered}{s}").exists()
                                               for s in VOICE_FILE_SUFFIXES if directory):
        raise bad_request(f"{name!r} is a built-in voice; only voices of the voices directory can be deleted",
                          "name", "builtin_voice")
    files = [Path(directory) / f"{lowered}{s}" for s in VOICE_FILE_SUFFIXES] if directory else []
    found = [f for f in files if f.is_file() and f.name[:-len(f.suffix)].isidentifier()]
    if not found:
        raise ApiError(404, f"No voice {name!r} in the voices directory.", param="name", code="voice_not_found")
    for f in found:
        f.unlink(missing_ok=True)
    (Path(directory) / f"{lowered}.fit.json").unlink(missing_ok=True)
    state.require_service().voices.rescan()  # this worker at once; the others within a second
    return {"id": lowered, "object": "voice", "deleted": True}
