"""Status: `GET /health` (liveness) and `/ready` (readiness), open to probes; `/metrics` (Prometheus),
which needs an API key once KOKORO_API_KEYS is set (api/keyed_paths.py)."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response

from api.errors import ApiError
from api.replica_table import parse_metrics
from api.routes.dependencies import app_state
from api.settings import Settings
from api.state import AppState
from worker.text import lexicon_status

status_router = APIRouter()


@status_router.get("/health")
async def health(request: Request, state: AppState = Depends(app_state)) -> dict:
    """Liveness: the process answers. Readiness is /ready. With KOKORO_API_KEYS set, only a request
    with a key sees more than that (the fleet's figures, the lexicon, load errors)."""
    if state.api_keys and not _has_key(state, request):
        return {"status": "ok"}
    settings = state.settings
    return {"status": "ok", "ready": state.ready, "admitted": state.admission.admitted, **engine_status(settings),
            **(state.service.health() if state.service is not None else {}),  # the fleet: mode, dispatch
            **({"lexicon": lexicon_status(settings.lexicon)} if settings.lexicon else {}),
            **({"voices_dir": state.service.voices.directory_status()}
               if settings.voices_dir and state.service is not None else {}),
            **({"error": state.load_error} if state.load_error else {})}


@status_router.get("/ready")
async def ready(state: AppState = Depends(app_state)) -> Response:
    """200 once this worker's weights are loaded and warm-up is done. `replicas_planned` and
    `replicas_ready` are the whole server's, whichever worker answers: the server is whole once they
    are equal (what modal_app.py waits for before it routes requests or stores the compile cache)."""
    if state.load_error:
        return ApiError(503, f"The model failed to load: {state.load_error}", type="server_error",
                        code="model_unavailable").response()
    if not state.ready:
        return ApiError(503, "Loading the model and warming up.", type="server_error", code="loading",
                        headers={"Retry-After": "2"}).response()
    return JSONResponse({"status": "ready", **replica_counts(state), **engine_status(state.settings)})


def replica_counts(state: AppState) -> dict:
    """The server's planned and serving replicas, from every worker's figures (api/metrics.py)."""
    samples = parse_metrics(state.metrics_page())
    planned, serving = (sum(value for _, value in samples.get(name, []))
                        for name in ("kokoro_replicas_planned", "kokoro_replicas_ready"))
    return {"replicas_planned": int(planned), "replicas_ready": int(serving)}


def _has_key(state: AppState, request: Request) -> bool:
    try:
        state.check_api_key(request.headers.get("authorization", ""))
    except ApiError:
        return False
    return True


@status_router.get("/metrics", response_class=PlainTextResponse)
async def metrics(state: AppState = Depends(app_state)) -> PlainTextResponse:
    return PlainTextResponse(state.metrics_page(), media_type="text/plain; version=0.0.4; charset=utf-8")


def engine_status(settings: Settings) -> dict:
    """What /health and /ready say of the engine; a simulated one (KOKORO_ENGINE=sim) says so plainly."""
    if settings.engine != "sim":
        if settings.weights == "random-full":  # full-size, but random: its audio is not speech
            from worker.weights.random_full import NOTICE

            return {"engine": settings.engine, "weights": "random-full", "random_weights": True, "notice": NOTICE}
        return {"engine": settings.engine}
    return {"engine": "sim", "simulated": True,
            "sim_cost_ms": {"per_chunk": settings.sim_chunk_ms, "per_phoneme": settings.sim_phoneme_ms}}
