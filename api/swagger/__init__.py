"""The API reference at `/docs`: Swagger UI over `/openapi.json`, served by this server itself.

FastAPI's own `/docs` page loads Swagger UI from a CDN (jsdelivr) and its icon from
fastapi.tiangolo.com, so in a browser or on a network without internet access, where many
self-hosted deployments live, the page stays blank. The files beside this module are
`swagger-ui-dist` from npm (Apache-2.0: LICENSE and NOTICE beside them), unchanged: `FILES` pins
their SHA-256, which tests/unit/test_swagger.py checks. A maintainer moves to another version with

    python -m api.swagger --update 5.32.0     # npm pack, copy the files, print the new FILES

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

VERSION = "5.32.0"
# name -> (content type, SHA-256 of the file as npm ships it)
FILES = {
    "swagger-ui-bundle.js": ("text/javascript; charset=utf-8",
                             "d9bbb469128e88a974c78e76457c3910babb4649447d901af19a60335a09ee1e"),
    "swagger-ui.css": ("text/css; charset=utf-8", "b024df29b02b4943bf95cb835fce9d19d4559c14e374b0dd36a89b27a223a2da"),
    "favicon-32x32.png": ("image/png", "3ed612f41e050ca5e7000cad6f1cbe7e7da39f65fca99c02e99e6591056e5837"),
}
LICENCE_FILES = ("LICENSE", "NOTICE")
DOCS_PATH = "/docs"
REDOC_PATH = "/redoc"
ASSETS_PATH = "/docs/assets/"


@lru_cache(maxsize=len(FILES))
def asset(name: str) -> bytes:
    return files(__name__).joinpath(name).read_bytes()


def docs_router(openapi_url: str, title: str) -> APIRouter:
    router = APIRouter(include_in_schema=False)

    @router.get(DOCS_PATH, response_class=HTMLResponse)
    async def docs() -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url=openapi_url, title=f"{title}: API reference",
            swagger_js_url=ASSETS_PATH + "swagger-ui-bundle.js", swagger_css_url=ASSETS_PATH + "swagger-ui.css",
            swagger_favicon_url=ASSETS_PATH + "favicon-32x32.png",
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
        # The version is pinned with the server: a browser may keep the files for a day.
        return Response(asset(name), media_type=FILES[name][0], headers={"Cache-Control": "public, max-age=86400"})

    return router
