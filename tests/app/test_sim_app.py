"""A simulated server says so on every surface a person or a scraper looks at, and a default one
never claims to be simulated: /health, /ready, /metrics, `kokoro-fleet status` (read from
/metrics), the playground's fleet panel and the `X-Kokoro-Engine` header of speech responses. In-process: the app with its
real start-up (the service built by build_service in the background), no Redis (one worker).
The real processes (startup log, a 2-worker fleet, the status command) are in
tests/servers/test_sim_serve.py."""

from __future__ import annotations

import asyncio


from app_client import started_app_client

from api.app import create_app
from api.settings import Settings
from api.replica_table import parse_metrics, rows_from_metrics
from cli.status_cli import format_replica_table
from worker.sim_engine import SimReplica


async def _surfaces(app) -> dict:
    async with started_app_client(app) as c:
        return {
            "health": (await c.get("/health")).json(),
            "ready": await c.get("/ready"),
            "metrics": (await c.get("/metrics")).text,
            "playground": (await c.get("/playground/fleet")).json(),
            "page": (await c.get("/")).text,
            "speech": await c.post("/v1/audio/speech", json={"input": "Simulated speech, streamed.",
                                                             "voice": "af_heart", "response_format": "mp3"}),
            "captioned": await c.post("/v1/audio/speech/captioned",
                                      json={"input": "Words with times.", "voice": "am_echo",
                                            "response_format": "wav", "stream": False}),
            "state": app.state.kokoro,
        }


def test_a_sim_server_says_it_is_simulated_everywhere():
    settings = Settings.from_env({"KOKORO_ENGINE": "sim"})
    seen = asyncio.run(_surfaces(create_app(settings)))
    assert seen["state"].load_error is None and isinstance(seen["state"].service.replica, SimReplica)

    health = seen["health"]
    assert health["engine"] == "sim" and health["simulated"] is True and health["ready"] is True
    assert health["sim_cost_ms"] == {"per_chunk": settings.sim_chunk_ms, "per_phoneme": settings.sim_phoneme_ms}
    ready = seen["ready"]
    assert ready.status_code == 200 and ready.json()["engine"] == "sim" and ready.json()["simulated"] is True
    assert 'kokoro_engine_info{engine="sim"} 1' in seen["metrics"].splitlines()

    speech = seen["speech"]
    assert speech.status_code == 200 and speech.headers["x-kokoro-engine"] == "sim"
    assert speech.headers["content-type"] == "audio/mpeg" and len(speech.content) > 1000
    captioned = seen["captioned"]
    assert captioned.status_code == 200 and captioned.headers["x-kokoro-engine"] == "sim"
    assert [w["word"] for w in captioned.json()["timestamps"]][:2] == ["Words", "with"]

    rows, summary = rows_from_metrics(parse_metrics(seen["metrics"]))
    assert summary["engine"] == "sim"
    assert format_replica_table(rows, summary).startswith("SIMULATED ENGINE")
    # the playground's fleet panel: the page carries the banner, hidden until the panel's JSON says so
    assert seen["playground"]["engine"] == "sim" and seen["playground"]["simulated"] is True
    assert 'id="fleet-simulated"' in seen["page"]


def test_the_default_server_is_not_simulated():
    """No KOKORO_ENGINE: the real engine (tiny weights here), and nothing says `sim`."""
    settings = Settings.from_env({"KOKORO_WEIGHTS": "tiny"})
    assert settings.engine == "torch"
    seen = asyncio.run(_surfaces(create_app(settings)))
    assert seen["state"].load_error is None and not isinstance(seen["state"].service.replica, SimReplica)
    assert seen["health"]["engine"] == "torch" and "simulated" not in seen["health"]
    assert seen["ready"].json() == {"status": "ready", "replicas_planned": 1, "replicas_ready": 1, "engine": "torch"}
    assert 'kokoro_engine_info{engine="torch"} 1' in seen["metrics"].splitlines()
    assert 'engine="sim"' not in seen["metrics"]
    assert seen["speech"].status_code == 200 and seen["speech"].headers["x-kokoro-engine"] == "torch"
    rows, summary = rows_from_metrics(parse_metrics(seen["metrics"]))
    assert summary["engine"] == "torch" and "SIMULATED" not in format_replica_table(rows, summary)
    assert seen["playground"]["engine"] == "torch" and seen["playground"]["simulated"] is False
