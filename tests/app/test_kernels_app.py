"""A CPU server is ready before its fused kernels are compiled (issue 48): /ready answers and speech
is served with the eager kernels while the compile runs in the background; /health says which
kernels the worker serves, and that it switched once the compile is done."""

from __future__ import annotations

import asyncio
import threading
import time

from app_client import started_app_client

from api.app import create_app
from api.settings import Settings
from worker.engine import Engine


def test_ready_and_speaking_while_the_kernels_compile_then_switched(monkeypatch, tmp_path):
    release = threading.Event()
    compile_kernels = Engine.compile_kernels

    def held_compile(engine):  # the compile, held until the test has seen the server serve eagerly
        assert release.wait(120), "the test never released the compile"
        return compile_kernels(engine)

    monkeypatch.setattr(Engine, "compile_kernels", held_compile)
    app = create_app(Settings().replace(weights="tiny", dtype="fp32", download_dir=str(tmp_path)))

    async def go():
        async with started_app_client(app) as c:
            ready, during = await c.get("/ready"), (await c.get("/health")).json()
            speech = await c.post("/v1/audio/speech", json={"input": "Hello there.", "response_format": "pcm"})
            release.set()
            deadline = time.monotonic() + 300
            after = during
            while after.get("kernels_compiling") and time.monotonic() < deadline:
                await asyncio.sleep(0.2)
                after = (await c.get("/health")).json()
            return ready, during, speech, after

    ready, during, speech, after = asyncio.run(go())
    assert ready.status_code == 200 and speech.status_code == 200 and len(speech.content) > 0
    assert during["kernels"] == "eager" and during["kernels_compiling"] is True
    assert after["kernels_compiling"] is False
    assert after["kernels"] == "compiled" or "kernels_error" in after, after  # a failed compile says so
