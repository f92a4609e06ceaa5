"""The API reference at /docs (api/swagger): Swagger UI served by the app itself, so it works in a
browser or on a network with no internet access, from the files the fastapi-offline package ships."""

from __future__ import annotations

import fnmatch
import re
import threading
import time
import tomllib
from pathlib import Path

import pytest
import uvicorn
from fastapi.testclient import TestClient

from api.app import create_app
from api.ports import free_port
from api.swagger import ASSETS, ASSETS_PATH, FILES, LICENCE_FILES
from api.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
HERE = ROOT / "api" / "swagger"


def test_the_files_come_from_the_package_and_swagger_uis_licence_ships_with_ours():
    assert all(ASSETS.joinpath(name).read_bytes() for name in FILES)
    assert b"SwaggerUIBundle" in ASSETS.joinpath("swagger-ui-bundle.js").read_bytes()
    assert "Apache License" in (HERE / "LICENSE").read_text() and "SmartBear" in (HERE / "NOTICE").read_text()
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert any(d.startswith("fastapi-offline") for d in pyproject["project"]["dependencies"])
    patterns = pyproject["tool"]["setuptools"]["package-data"]["api.swagger"]
    shipped = [p.name for p in HERE.iterdir() if p.is_file() and p.suffix != ".py"]
    assert sorted(shipped) == sorted(LICENCE_FILES)  # no copy of Swagger UI's files here
    assert all(any(fnmatch.fnmatch(name, pat) for pat in patterns) for name in shipped), shipped


def test_docs_page_refers_only_to_this_server():
    client = TestClient(create_app(Settings()))
    page = client.get("/docs")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    urls = re.findall(r"""(?:src|href)=["']([^"']+)|url: ?'([^']+)'""", page.text)
    urls = [a or b for a, b in urls]
    assert urls and all(u.startswith("/") for u in urls), urls
    assert '"validatorUrl": null' in page.text  # no schema sent to validator.swagger.io
    for name, content_type in FILES.items():
        response = client.get(ASSETS_PATH + name)
        assert response.status_code == 200 and response.headers["content-type"] == content_type
        assert response.content == ASSETS.joinpath(name).read_bytes()
    missing = client.get(ASSETS_PATH + "../app.py")
    assert missing.status_code == 404
    assert client.get(ASSETS_PATH + "nothing.js").json()["error"]["code"] == "not_found"
    assert "/docs" not in client.get("/openapi.json").json()["paths"]
    redoc = client.get("/redoc", follow_redirects=False)  # FastAPI's would load ReDoc from a CDN
    assert redoc.is_redirect and redoc.headers["location"] == "/docs"


def test_docs_page_renders_every_route_in_a_browser_with_nothing_from_outside(browser):
    # The simulated engine: no weights to load, and /docs needs none.
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(Settings().replace(engine="sim")), host="127.0.0.1",
                                           port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        deadline = time.time() + 60
        while not server.started:
            assert time.time() < deadline, "server did not start"
            time.sleep(0.05)
        url = f"http://127.0.0.1:{port}"
        context = browser.new_context()
        page = context.new_page()
        requested, errors = [], []
        page.on("request", lambda r: requested.append(r.url))
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(url + "/docs")
        page.wait_for_selector(".opblock-summary-path", timeout=30_000)
        paths = page.eval_on_selector_all(".opblock-summary-path", "els => els.map(e => e.dataset.path)")
        assert "/v1/audio/speech" in paths and "/v1/audio/voices" in paths
        assert page.locator(".swagger-ui .info .title").inner_text().startswith("kokoro-fleet")
        outside = [u for u in requested if not u.startswith(url + "/") and not u.startswith("data:")]
        assert outside == [], outside
        assert errors == [], errors
        context.close()
    finally:
        server.should_exit = True
        thread.join(10)
