"""The deployment's own voices (KOKORO_VOICES_DIR) through the HTTP app, on the tiny model: a mix
saved from /v1/audio/voices/combine into the directory while the server runs is listed, speaks
exactly as the mix it was made from, and /health shows the directory and a file that does not read.
In-process, with the app's real start-up; the file rules themselves are in tests/unit/test_voices.py."""

from __future__ import annotations

import asyncio


from app_client import started_app_client

from api.app import create_app
from api.settings import Settings

TEXT = {"input": "A voice of our own.", "response_format": "pcm", "stream": False}


async def _session(app, voices_dir) -> dict:
    async with started_app_client(app) as c:
        seen = {"before": (await c.get("/v1/audio/voices")).json()}
        combined = await c.post("/v1/audio/voices/combine", json="af_heart(2)+am_adam(1)")
        (voices_dir / "af_house.pt").write_bytes(combined.content)  # saved while the server runs
        (voices_dir / "bm_broken.pt").write_bytes(b"not a voice")
        seen["house"] = await c.post("/v1/audio/speech", json={**TEXT, "voice": "af_house"})
        seen["mix"] = await c.post("/v1/audio/speech", json={**TEXT, "voice": "af_heart(2)+am_adam(1)"})
        seen["adam"] = await c.post("/v1/audio/speech", json={**TEXT, "voice": "am_adam"})
        seen["broken"] = await c.post("/v1/audio/speech", json={**TEXT, "voice": "bm_broken"})
        seen["after"] = (await c.get("/v1/audio/voices")).json()
        seen["health"] = (await c.get("/health")).json()
        return seen


def test_a_voice_saved_in_the_directory_is_served_as_the_mix_it_was_made_from(tmp_path):
    settings = Settings.from_env({"KOKORO_WEIGHTS": "tiny", "KOKORO_VOICES_DIR": str(tmp_path)})
    seen = asyncio.run(_session(create_app(settings), tmp_path))

    assert "af_house" not in [v["id"] for v in seen["before"]["voices"]]
    house = next(v for v in seen["after"]["voices"] if v["id"] == "af_house")
    assert (house["language"], house["gender"]) == ("en-us", "female")
    assert seen["house"].status_code == 200 and len(seen["house"].content) > 4800
    assert seen["house"].content == seen["mix"].content  # the file's pack is the mix, bit for bit
    assert seen["house"].content != seen["adam"].content

    broken = seen["broken"]
    assert broken.status_code == 400 and broken.json()["error"]["param"] == "voice"
    assert "voice 'bm_broken': its file in the server's voices directory does not read" in \
        broken.json()["error"]["message"]
    status = seen["health"]["voices_dir"]
    assert status["path"] == str(tmp_path) and status["voices"] == ["af_house"]
    assert "bm_broken.pt: cannot read it as a voice" in status["errors"]["bm_broken.pt"]
