"""The HTTP routes, one module per endpoint family, each with its own `APIRouter`; api/app.py
includes them. A route reads the process's `AppState` (`app_state`) and hands the request to the
serving code (api.serving) or the live socket (api.live).

    speech_routes.py    POST /v1/audio/speech, the /dev phoneme and dialogue routes, the download links
    caption_routes.py   POST /v1/audio/speech/captioned (and /dev/captioned_speech)
    voice_routes.py     GET /v1/audio/voices, POST /v1/audio/voices/combine
    model_routes.py     GET /v1/models, /v1/models/{model_id}
    live_route.py       the live socket, /v1/audio/speech/live
    status_routes.py    GET /health, /ready, /metrics (no API key)
    dependencies.py     the AppState and API key dependencies
    request_bodies.py   the OpenAPI bodies of routes that read their JSON themselves

The playground (api/playground) and the API reference (api/swagger) bring their own routers.
"""
