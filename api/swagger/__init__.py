"""The API reference at `/docs`: Swagger UI over `/openapi.json`, served by this server itself.

FastAPI's own `/docs` page loads Swagger UI from a CDN (jsdelivr) and its icon from
fastapi.tiangolo.com, so in a browser or on a network without internet access, where many
self-hosted deployments live, the page stays blank. The `fastapi-offline` package ships those
same files (`swagger-ui-dist` 5 from npm, and FastAPI's icon); this router serves them from the
installed package. Swagger UI is Apache-2.0 and the package carries neither its LICENSE nor its
NOTICE, so they ship beside this module.

    app = FastAPI(docs_url=None, redoc_url=None, ...)
    app.include_router(docs_router("/openapi.json", "kokoro-fleet"))

FastAPI's `/redoc` would load ReDoc from the same CDN: it sends the browser to `/docs` instead.
"""

from __future__ import annotations

from functools import lru_cache
from importlib.resources import files

from fastapi import APIRouter
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from api.errors import ApiError

# The installed package's copy of Swagger UI, and the content type of each file served from it.
ASSETS = files("fastapi_offline") / "static"
FILES = {"swagger-ui-bundle.js": "text/javascript; charset=utf-8", "swagger-ui.css": "text/css; charset=utf-8",
         "favicon.png": "image/png"}
LICENCE_FILES = ("LICENSE", "NOTICE")
DOCS_PATH = "/docs"
REDOC_PATH = "/redoc"
ASSETS_PATH = "/docs/assets/"


@lru_cache(maxsize=len(FILES))
def asset(name: str) -> bytes:
    return ASSETS.joinpath(name).read_bytes()


def docs_router(openapi_url: str, title: str) -> APIRouter:
    router = APIRouter(include_in_schema=False)

    @router.get(DOCS_PATH, response_class=HTMLResponse)
    async def docs() -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url=openapi_url, title=f"{title}: API reference",
            swagger_js_url=ASSETS_PATH + "swagger-ui-bundle.js", swagger_css_url=ASSETS_PATH + "swagger-ui.css",
            swagger_favicon_url=ASSETS_PATH + "favicon.png",
            # Swagger UI would otherwise send the schema to validator.swagger.io for a badge.
            swagger_ui_parameters={"validatorUrl": None})

    @router.get(REDOC_PATH)
    async def redoc() -> RedirectResponse:
        return RedirectResponse(DOCS_PATH)

    @router.get(ASSETS_PATH + "{name}")
    async def docs_asset(name: str) -> Response:
        if name not in FILES:
            raise ApiError(404, f"No file {name!r} here: the API reference is at {DOCS_PATH}.", param=None,
                           code="not_found")
        # The files change only with the installed package: a browser may keep them for a day.
        return Response(asset(name), media_type=FILES[name], headers={"Cache-Control": "public, max-age=86400"})

    return router
