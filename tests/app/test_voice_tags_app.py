"""Kokoro-FastAPI's multi-speaker surface through the HTTP app, on the tiny model: `allow_voice_tags`
with `[voice:...]` / `[rate:...]`, `voice_aliases`, and `POST /dev/dialogue`, each compared bit for
bit with the request it stands for. In-process, with the app's real start-up; the tag rules
themselves are in tests/unit/test_speech.py."""

from __future__ import annotations

import asyncio

import httpx

from app_client import started_app_client

from api.app import create_app
from api.settings import Settings

PCM = {"response_format": "pcm", "stream": False}
TURNS = [{"voice": "af_heart", "text": "Did it land?"}, {"voice": "am_adam", "text": "It did."},
         {"voice": "am_adam", "text": "Turns switch voices."}, {"voice": "af_heart", "text": "Good."}]


async def _session(app) -> dict:
    async with started_app_client(app) as c:

        async def speak(path: str = "/v1/audio/speech", **body) -> httpx.Response:
            return await c.post(path, json={**PCM, **body})

        return {
            "tags": await speak(input="Hello there. [voice:am_adam] Good morning. [rate:1.5] Quickly.",
                                allow_voice_tags=True),
            "ssml": await speak(input='Hello there. <voice name="am_adam"> Good morning. <prosody rate="1.5"> '
                                      'Quickly.</prosody></voice>'),
            "as_text": await speak(input="Hello there. [voice:am_adam] Good morning. [rate:1.5] Quickly."),
            "alias": await speak(input="An old voice.", voice="Grandpa",
                                 voice_aliases={"grandpa": {"voice": "am_adam", "rate": 0.8}}),
            "spec": await speak(input="An old voice.", voice="am_adam", speed=0.8),
            "unknown": await speak(input="Hi [voice:am_nobody] there.", allow_voice_tags=True),
            "dialogue": await speak("/dev/dialogue", turns=TURNS),
            "dialogue_as_speech": await speak(
                input="Did it land? [pause:0.4s] [voice:am_adam] It did. Turns switch voices. [pause:0.4s] "
                      "[voice:af_heart] Good.", voice="af_heart", allow_voice_tags=True),
            "no_pause": await speak("/dev/dialogue", turns=TURNS, pause_between_turns=0),
            "too_long": await speak("/dev/dialogue", turns=[{"voice": "af_heart", "text": "word " * 600},
                                                            {"voice": "am_adam", "text": "word " * 300}]),
            "ssml_flag": await speak(input='<speak>Hi. <voice name="am_adam">Hello.</voice></speak>', ssml=True,
                                     allow_voice_tags=True),  # a Kokoro-FastAPI client's SSML request
            "ssml_plain": await speak(input='<speak>Hi. <voice name="am_adam">Hello.</voice></speak>'),
            "captioned": await c.post("/v1/audio/speech/captioned", json={
                **PCM, "input": "First voice. [voice:am_adam] Second voice.", "allow_voice_tags": True}),
            "captioned_plain": await c.post("/v1/audio/speech/captioned", json={**PCM, "input": "Plain words."}),
        }


def test_voice_tags_aliases_and_dialogue_speak_as_the_requests_they_stand_for():
    seen = asyncio.run(_session(create_app(Settings.from_env({"KOKORO_WEIGHTS": "tiny",
                                                               "KOKORO_MAX_INPUT_CHARS": "4096"}))))
    for name in ("tags", "ssml", "as_text", "alias", "spec", "dialogue", "dialogue_as_speech", "no_pause", "captioned"):
        assert seen[name].status_code == 200, (name, seen[name].text[:300])
    assert seen["tags"].content == seen["ssml"].content        # the tags are that SSML
    assert seen["tags"].content != seen["as_text"].content     # not allowed: read as text, one voice
    assert seen["alias"].content == seen["spec"].content       # an alias is its voice at its pace
    assert seen["dialogue"].content == seen["dialogue_as_speech"].content
    assert seen["ssml_flag"].status_code == 200 and seen["ssml_flag"].content == seen["ssml_plain"].content
    # two speaker changes, 0.4 s of silence each (pcm: 2 bytes a sample at 24 kHz)
    assert len(seen["dialogue"].content) - len(seen["no_pause"].content) == 2 * round(0.4 * 24000) * 2

    unknown = seen["unknown"].json()["error"]
    assert seen["unknown"].status_code == 400 and unknown["param"] == "input"
    assert "[voice:am_nobody] in the input: unknown voice 'am_nobody'" in unknown["message"]
    too_long = seen["too_long"].json()["error"]
    assert seen["too_long"].status_code == 400 and too_long["param"] == "turns"
    assert "the turns come to" in too_long["message"] and "the limit is 4096" in too_long["message"]
    words = [(w["word"], w["voice"]) for w in seen["captioned"].json()["timestamps"]]
    assert words == [("First", "af_heart"), ("voice", "af_heart"), ("Second", "am_adam"), ("voice", "am_adam")]
    tagged = "First voice. [voice:am_adam] Second voice."  # the spans point into the input, tags and all
    assert [tagged[w["input_start"]:w["input_end"]] for w in seen["captioned"].json()["timestamps"]] == [
        "First", "voice", "Second", "voice"]
    assert [w["input_start"] for w in seen["captioned"].json()["timestamps"]] == [0, 6, 29, 36]
    plain = seen["captioned_plain"].json()["timestamps"]  # without the tags: no voice field at all
    assert plain and all(set(w) == {"word", "start_time", "end_time", "input_start", "input_end"} for w in plain)
