"""The playground page at `/`: type a text, pick or mix voices, hear it stream, see the words.

One static page (index.html, app.js, app.css beside this file, shipped as package data) that calls
the same public API every client calls: `GET /v1/audio/voices`, `POST /v1/audio/speech/captioned`
streamed as NDJSON of 24 kHz PCM pieces with their words (Play), `POST /v1/audio/speech` in the
chosen format (Download), and in Live mode the WebSocket `/v1/audio/speech/live` (api/live.py), fed
a word at a time as a language model writes, with Interrupt sending `clear`. Its "Your voice" panel
fits a voice to a recording picked or made in the browser (`POST /v1/audio/voices`, its job followed
through `/events`, `DELETE` to cancel) and plays the fitted voice beside the sample. Nothing loads from
outside the server (no CDN, no web fonts; the page's Content-Security-Policy forbids it, and its
`default-src 'self'` also admits the same-origin ws:// or wss:// socket). Two small JSON routes feed it:
`/playground/config` (the input limit, whether API keys are needed, whether voices can be fitted) and
`/playground/fleet` (the fleet panel, polled every few seconds; a simulated fleet, KOKORO_ENGINE=sim,
shows a banner there). `/web`, where Kokoro-FastAPI serves its web player, leads here.
KOKORO_PLAYGROUND=false leaves all of them out.

    app.include_router(playground_router(state))   # state: api.state.AppState
"""

from __future__ import annotations

from importlib.resources import files
from typing import Any

from fastapi import APIRouter
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response

from api.encoders import CONTENT_TYPES
from api.state import AppState
from api.replica_table import parse_metrics, rows_from_metrics
from worker.audio import SAMPLE_RATE

# The page may load only what this server sends; blob: URLs carry the Download link.
CONTENT_SECURITY_POLICY = ("default-src 'self'; img-src 'self' data:; media-src 'self' blob:; "
                           "object-src 'none'; base-uri 'none'; frame-ancestors 'none'")
ASSETS = {"app.js": "text/javascript; charset=utf-8", "app.css": "text/css; charset=utf-8"}
# The fleet panel's polling path: the access log writes it at debug level, like /metrics.
FLEET_PATH = "/playground/fleet"
# Kokoro-FastAPI's web player lives here; its users' bookmarks are sent to `/`.
KOKORO_FASTAPI_WEB_PATH = "/web"


def _asset(name: str) -> bytes:
    return files(__name__).joinpath(name).read_bytes()


def fleet_figures(state: AppState) -> dict[str, Any]:
    """The fleet panel's figures, read from /metrics as a scrape sees it: with the shared queue,
    the fleet's replica table and counters as this worker last read them from Redis; on one
    worker without a queue, its own replica and admission counters."""
    samples = parse_metrics(state.metrics_page())
    rows, summary = rows_from_metrics(samples)

    def one(name: str) -> float:
        values = samples.get(name)
        return values[0][1] if values else 0.0

    alive = [r for r in rows if r.alive]
    busy = sum(1 for r in alive if r.busy)
    local_refused = one("kokoro_rejected_total")  # this process's own bound (KOKORO_MAX_REQUESTS)
    if summary.get("mode") in ("fleet", "degraded"):
        queue_depth, queue_unit = summary.get("queued_jobs") or 0.0, "chunk jobs"
        refused = (summary.get("refused_total") or 0.0) + local_refused
    else:
        queue_depth, queue_unit = one("kokoro_queue_depth"), "requests"
        refused = local_refused
    engine = summary.get("engine", "torch")
    return {
        "ready": bool(one("kokoro_ready")), "mode": summary.get("mode", "unknown"),
        "engine": engine, "simulated": engine == "sim",
        "replicas": len(alive), "busy": busy, "idle": len(alive) - busy,
        "queue_depth": int(queue_depth), "queue_unit": queue_unit, "refused": int(refused),
    }


def playground_router(state: AppState) -> APIRouter:
    """`GET /` (the page), its script and style sheet, and its two JSON routes."""
    router = APIRouter(include_in_schema=False)
    page = _asset("index.html")
    assets = {name: _asset(name) for name in ASSETS}
    headers = {"Cache-Control": "no-cache", "Content-Security-Policy": CONTENT_SECURITY_POLICY,
               "X-Content-Type-Options": "nosniff"}

    @router.api_route("/", methods=["GET", "HEAD"], response_class=HTMLResponse)
    async def index() -> Response:
        return HTMLResponse(page, headers=headers)

    @router.get(KOKORO_FASTAPI_WEB_PATH)
    @router.get(KOKORO_FASTAPI_WEB_PATH + "/")
    async def kokoro_fastapi_web() -> RedirectResponse:
        """Where Kokoro-FastAPI serves its web player: a bookmark of it lands on this page."""
        return RedirectResponse("/")

    def serve_asset(name: str):
        async def asset() -> Response:
            return Response(assets[name], media_type=ASSETS[name], headers=headers)
        return asset

    for name in ASSETS:
        router.add_api_route(f"/playground/{name}", serve_asset(name), methods=["GET"])

    @router.get("/playground/config")
    async def config() -> JSONResponse:
        return JSONResponse({
            "max_input_chars": state.settings.max_input_chars,
            "api_key_required": bool(state.api_keys),
            "formats": list(CONTENT_TYPES),
            "sample_rate": SAMPLE_RATE,
            # the "Your voice" panel: POST /v1/audio/voices needs a voices directory and a job slot
            "voice_fitting": bool(state.settings.voices_dir) and state.settings.voice_fit_jobs > 0,
        }, headers={"Cache-Control": "no-cache"})

    @router.get(FLEET_PATH)
    async def fleet() -> JSONResponse:
        return JSONResponse(fleet_figures(state), headers={"Cache-Control": "no-store"})

    return router
