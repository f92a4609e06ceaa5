"""Subtitles through the captioned endpoint (`caption_format`), in process on the simulated engine:
the real text frontend and word timestamps, audio of the real length, no model. The files are read
back with real subtitle parsers (`srt`, `webvtt-py`); the cue rules themselves are in
tests/unit/test_subtitles.py."""

from __future__ import annotations

import asyncio
import base64
import html
import json

import pytest
import srt
import webvtt

from app_client import started_app_client

from api.app import create_app
from api.settings import Settings

TEXT = ("Your total is $12.99, due on 3/14. Dr. Smith paid it at 9:30 a.m. and **kept** the receipt.\n\n"
        "Then the quick brown fox jumped over the lazy dog, which was sleeping in the warm afternoon sun.")
WAV = {"input": TEXT, "voice": "af_heart", "response_format": "wav"}


async def _requests(app) -> dict:
    async with started_app_client(app) as c:
        post = lambda **body: c.post("/v1/audio/speech/captioned", json={**WAV, **body})  # noqa: E731
        return {
            "srt": await post(caption_format="srt", stream=False),
            "vtt": await post(caption_format="vtt", stream=False),
            "vtt_streamed": await post(caption_format="vtt"),
            "json": await post(stream=False),
            "no_words": await post(caption_format="srt", stream=False, return_timestamps=False),
            "bad": await post(caption_format="ass"),
        }


@pytest.fixture(scope="module")
def seen() -> dict:
    return asyncio.run(_requests(create_app(Settings.from_env({"KOKORO_ENGINE": "sim"}))))


def parse(fmt: str, text: str) -> list[tuple[int, int, str]]:
    if fmt == "srt":
        return [(round(c.start.total_seconds() * 1000), round(c.end.total_seconds() * 1000), c.content)
                for c in srt.parse(text)]
    return [(c.start_time.in_milliseconds(), c.end_time.in_milliseconds(), html.unescape(c.text))
            for c in webvtt.from_string(text)]


def wav_seconds(data: bytes) -> float:
    return (len(data) - 44) / 2 / 24000  # the streamed WAV's header is 44 bytes, s16le mono 24 kHz


def test_srt_and_webvtt_of_the_input_through_the_endpoint(seen):
    for fmt in ("srt", "vtt"):
        body = seen[fmt].json()
        assert seen[fmt].status_code == 200 and body["timestamps"], body
        audio_ms = wav_seconds(base64.b64decode(body["audio"])) * 1000
        cues = parse(fmt, body["captions"])
        assert len(cues) >= 3
        for (s1, e1, _), (s2, _, _) in zip(cues, cues[1:]):
            assert s1 < e1 <= s2, cues
        assert cues[0][0] >= 0 and cues[-1][1] <= audio_ms, (cues[-1], audio_ms)
        # the text as the user wrote it: "$12.99", "3/14", "Dr.", "9:30 a.m.", the Markdown's emphasis gone
        shown = " ".join(text.replace("\n", " ") for *_, text in cues)
        assert shown == " ".join(TEXT.replace("**", "").split()), shown
        # every cue starts with the first word whose span it shows, within the words' times
        starts = {round(w["start_time"] * 1000) for w in body["timestamps"]}
        assert all(s in starts for s, _, _ in cues[1:]), cues
    assert seen["srt"].json()["timestamps"] == seen["vtt"].json()["timestamps"]
    assert [c[:2] for c in parse("srt", seen["srt"].json()["captions"])] == \
        [c[:2] for c in parse("vtt", seen["vtt"].json()["captions"])]


def test_streamed_webvtt_lines_join_to_the_same_file(seen):
    response = seen["vtt_streamed"]
    assert response.status_code == 200 and response.headers["content-type"].startswith("application/x-ndjson")
    lines = [json.loads(line) for line in response.text.splitlines()]
    assert len(lines) >= 3 and all("captions" in line for line in lines)
    assert lines[0]["captions"].startswith("WEBVTT")
    assert "".join(line["captions"] for line in lines) == seen["vtt"].json()["captions"]
    # cues come as they become final, not all at the end
    assert sum(1 for line in lines[:-1] if "-->" in line["captions"]) >= 1


def test_json_is_unchanged_and_a_bad_format_is_refused(seen):
    assert "captions" not in seen["json"].json() and seen["json"].json()["timestamps"]
    # the words turned off still caption
    no_words = seen["no_words"].json()
    assert no_words["timestamps"] == [] and parse("srt", no_words["captions"]) == parse("srt", seen["srt"].json()["captions"])
    bad = seen["bad"]
    assert bad.status_code == 400, bad.text
    error = bad.json()["error"]
    assert error["param"] == "caption_format" and error["type"] == "invalid_request_error"
    assert "'srt'" in error["message"] and "'vtt'" in error["message"]
