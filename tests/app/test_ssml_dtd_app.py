"""SSML or XML that declares a DTD is refused with a 400 in OpenAI's shape, never read aloud, while a
text that only holds angle brackets is still read as text (issue 48). Through the app in process,
with the real text frontend on the simulated engine (the refusal comes before any synthesis)."""

from __future__ import annotations

import asyncio

from app_client import started_app_client

from api.app import create_app
from api.settings import Settings

DTD_DOCUMENTS = {
    "internal entity": '<?xml version="1.0"?><!DOCTYPE speak [<!ENTITY name "Kokoro">]>'
                       "<speak>Hello &name;.</speak>",
    "external DTD": '<!DOCTYPE speak PUBLIC "-//W3C//DTD SYNTHESIS 1.0//EN" '
                    '"http://www.w3.org/TR/speech-synthesis/synthesis.dtd"><speak>Hello.</speak>',
    "external entity, not SSML": '<?xml version="1.0"?><!DOCTYPE note [<!ENTITY secret SYSTEM '
                                 '"file:///etc/passwd">]><note>&secret;</note>',
}
ANGLE_BRACKETS = ["if a < b and c > d", "I <3 this", "x<y>z", "Type <!DOCTYPE html> first, then the page."]


async def _answers(app) -> dict:
    async with started_app_client(app) as c:
        async def speak(text: str):
            return await c.post("/v1/audio/speech", json={"input": text, "voice": "af_heart",
                                                          "response_format": "pcm", "stream": False})

        return {
            "refused": {name: await speak(text) for name, text in DTD_DOCUMENTS.items()},
            "refused_phonemize": await c.post("/dev/phonemize", json={"text": DTD_DOCUMENTS["internal entity"]}),
            "spoken": {text: await speak(text) for text in ANGLE_BRACKETS},
            "read": {text: (await c.post("/dev/phonemize", json={"text": text})).json() for text in ANGLE_BRACKETS},
            "declared_ssml": await c.post("/dev/phonemize", json={"text": '<?xml version="1.0"?><speak>Hi.</speak>'}),
        }


def test_ssml_with_a_dtd_is_a_400_and_angle_brackets_in_text_still_speak():
    seen = asyncio.run(_answers(create_app(Settings.from_env({"KOKORO_ENGINE": "sim"}))))
    for name, response in [*seen["refused"].items(), ("phonemize", seen["refused_phonemize"])]:
        assert response.status_code == 400, (name, response.text[:300])
        error = response.json()["error"]
        assert set(error) == {"message", "type", "param", "code"}
        assert error["type"] == "invalid_request_error" and error["param"] in ("input", "text"), (name, error)
        assert error["code"] == "unsupported_markup", (name, error)
        assert "DTD is not accepted" in error["message"] and "<!DOCTYPE" in error["message"], (name, error)
    for text, response in seen["spoken"].items():
        assert response.status_code == 200 and len(response.content) > 1000, (text, response.text[:300])
    read = {text: " ".join(c["text"] for c in answer["chunks"]) for text, answer in seen["read"].items()}
    assert "a less than b and c greater than d" in read["if a < b and c > d"], read
    assert "less than three" in read["I <3 this"] and "x less than y greater than z" in read["x<y>z"], read
    assert "DOCTYPE" in read["Type <!DOCTYPE html> first, then the page."], read
    # An SSML document's XML declaration is markup too: dropped, not read out.
    declared = " ".join(c["text"] for c in seen["declared_ssml"].json()["chunks"])
    assert declared.strip() == "Hi.", declared
