"""The HTTP layer on its own: a real Uvicorn server (in a thread of this process) in front of a
scripted speech service whose timing and failures the tests control. What the real engine adds
(actual speech, voice mixes, first-audio timing) is in tests/servers/test_api.py.

The scripted service makes one 0.4 s tone piece per sentence of the input and spends
`PIECE_SECONDS` of wall time "synthesizing" each in a worker thread, as the real replica does
(the thread keeps running when its awaiting task is cancelled: a disconnect test must see the
replica go idle on its own)."""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import hashlib
import io
import json
import logging
import re
import threading
import time
from dataclasses import dataclass, field

import av
import httpx
import numpy as np
import openai
import pytest
import torch
import uvicorn

from api.app import create_app
from api.ports import free_port
from api.settings import Settings
from api.speech.contract import ReplicaStats, SpeechPlan
from worker.request_errors import RequestFieldError
from worker.text import Chunk, NothingToSay, WordSpan
from worker.voices import VoiceBank

SR = 24000
PIECE_SECONDS = 0.15
PIECE_AUDIO_S = 0.4


class ScriptedVoiceError(RequestFieldError):
    param = "voice"


@dataclass
class Piece:
    pcm: np.ndarray
    words: list = field(default_factory=list)
    index: int = 0
    is_last: bool = False


@dataclass
class Word:
    word: str
    start: float
    end: float
    input_start: int
    input_end: int


class ScriptedReplica:
    def __init__(self):
        self.busy = False
        self.jobs_done = 0
        self.busy_seconds = 0.0
        self.audio_seconds = 0.0
        self.lock = threading.Lock()
        self.overlaps = 0

    def run(self, seconds: float) -> np.ndarray:
        if not self.lock.acquire(blocking=False):
            self.overlaps += 1
            self.lock.acquire()
        try:
            self.busy = True
            time.sleep(seconds)
            self.jobs_done += 1
            self.busy_seconds += seconds
            self.audio_seconds += PIECE_AUDIO_S
        finally:
            self.busy = False
            self.lock.release()
        t = np.arange(round(PIECE_AUDIO_S * SR)) / SR
        return (0.3 * np.sin(2 * np.pi * 300 * t)).astype(np.float32)


def scripted_voices() -> VoiceBank:
    gen = torch.Generator().manual_seed(0)
    return VoiceBank({name: torch.randn(510, 256, generator=gen) for name in ("af_heart", "bm_george")})


class ScriptedService:
    """The speech-service contract (api/speech/contract.py) with a scripted replica: one chunk per sentence."""

    def __init__(self):
        self.replica = ScriptedReplica()
        self.voices = scripted_voices()
        self.semaphore: asyncio.Semaphore | None = None
        self.fail_after: int | None = None  # raise after this many pieces
        self.admitted_keys: list[str | None] = []  # the API key name each admission was made for
        self.pieces_started = 0

    def plan(self, request):
        if request.voice not in ("af_heart", "bm_george", "alloy"):
            raise ScriptedVoiceError(f"unknown voice {request.voice!r}")
        sentences = [s for s in re.finditer(r"[^.]+", request.text) if s.group(0).strip()]
        if not any(c.isalnum() for c in request.text):  # as the text frontend finds nothing to pronounce
            raise NothingToSay("input has nothing to speak")
        return SpeechPlan(request, None, "a", [  # each word spans itself in the input
            Chunk(s.group(0).strip(), "", [], [WordSpan(w.group(0), 0, 0, s.start() + w.start(), s.start() + w.end())
                                               for w in re.finditer(r"\S+", s.group(0))]) for s in sentences])

    async def admit(self, request, key=None):
        self.admitted_keys.append(key)
        return self.plan(request)

    def health(self):
        return {}

    def stats(self):
        r = self.replica
        return ReplicaStats(r.busy, r.jobs_done, r.busy_seconds, r.audio_seconds)

    async def aclose(self):
        pass

    async def stream(self, plan):
        if self.semaphore is None:
            self.semaphore = asyncio.Semaphore(1)
        offset = 0.0
        sentences = [c.words for c in plan.chunks]
        for i, sentence in enumerate(sentences):
            if self.fail_after is not None and i >= self.fail_after:
                raise RuntimeError("scripted failure")
            async with self.semaphore:
                self.pieces_started += 1
                # shield: like the real replica, the job runs to its end even if we stop waiting
                pcm = await asyncio.shield(asyncio.to_thread(self.replica.run, PIECE_SECONDS))
            words = [Word(w.text, offset + 0.1 * k, offset + 0.1 * (k + 1), w.input_start, w.input_end)
                     for k, w in enumerate(sentence)]
            offset += len(pcm) / SR
            yield Piece(pcm, words, i, i == len(sentences) - 1)


class ThreadServer:
    def __init__(self, app):
        self.port = free_port()
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning",
                                                    access_log=False))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self):
        self.thread.start()
        deadline = time.time() + 60
        while not self.server.started:
            assert time.time() < deadline, "server did not start"
            time.sleep(0.02)
        return self

    def __exit__(self, *exc):
        self.server.should_exit = True
        self.thread.join(10)


@pytest.fixture(scope="module")
def service():
    return ScriptedService()


@pytest.fixture(scope="module")
def downloads(tmp_path_factory):
    return tmp_path_factory.mktemp("downloads")


@pytest.fixture(scope="module")
def server(service, downloads):
    settings = Settings().replace(max_requests=2, max_input_chars=500, download_dir=str(downloads))
    with ThreadServer(create_app(settings, service=service)) as srv:
        yield srv


@pytest.fixture()
def http(server):
    with httpx.Client(base_url=server.url, timeout=30) as client:
        yield client


@pytest.fixture()
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


def decode(data: bytes, fmt: str) -> tuple[float, int]:
    if fmt == "pcm":
        return len(data) / 2 / SR, SR
    container = av.open(io.BytesIO(data))
    n, rate = 0, None
    for frame in container.decode(container.streams.audio[0]):
        assert len(frame.layout.channels) == 1
        n, rate = n + frame.samples, frame.sample_rate
    return n / rate, rate


async def cancel_after_turns(task: asyncio.Task, turns: int) -> tuple[bool, bool]:
    """Cancel `task` after `turns` turns of the event loop, then wait for it: (whether it accepted
    the cancel, whether it ended cancelled). Swept over the turns, one lands as whatever it waits
    on completes."""
    loop = asyncio.get_running_loop()
    accepted: list[bool] = []

    def turn(left: int) -> None:
        if left:
            loop.call_soon(turn, left - 1)
        else:
            accepted.append(task.cancel())
    loop.call_soon(turn, turns)
    try:
        await task
    except asyncio.CancelledError:
        return accepted[0], True
    return bool(accepted and accepted[0]), False  # it may end before the cancel comes


def test_a_stream_cancelled_as_its_send_completes_stops():
    """The producer of a streamed response is cancelled when its client leaves. A cancel that
    lands just as a send completes must still stop it: asyncio.wait_for (before Python 3.12)
    returned the send's result and dropped the cancel, and the rest was synthesized for nobody."""
    from api.transport import DisconnectAwareStreamingResponse

    async def attempt(turns: int) -> tuple[bool, bool, int]:
        sent = []

        async def send(message):
            sent.append(message)
        bounded = DisconnectAwareStreamingResponse(iter(()), send_timeout_s=60)._bounded(send)
        sender = asyncio.ensure_future(bounded({"type": "http.response.body", "body": b"x", "more_body": True}))
        accepted, cancelled = await cancel_after_turns(sender, turns)
        return accepted, cancelled, len(sent)

    for turns in range(12):  # from before the send starts to well after it is done
        accepted, cancelled, sent = asyncio.run(attempt(turns))
        assert cancelled == accepted, f"cancel after {turns} turns: accepted {accepted}, cancelled {cancelled}"
        assert cancelled or sent == 1


def metric(http: httpx.Client, name: str) -> float:
    for line in http.get("/metrics").text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise KeyError(name)


TEXT = "One two three. Four five. Six."  # three pieces: 1.2 s of audio


@pytest.mark.parametrize("fmt", ["mp3", "opus", "aac", "flac", "wav", "pcm"])
def test_every_format_streamed_and_whole(client, fmt):
    whole = client.audio.speech.create(model="tts-1", voice="af_heart", input=TEXT, response_format=fmt,
                                       extra_body={"stream": False})
    assert whole.response.headers["content-length"] == str(len(whole.content))
    with client.audio.speech.with_streaming_response.create(model="kokoro", voice="af_heart", input=TEXT,
                                                            response_format=fmt) as resp:
        assert resp.headers["content-type"] == {"mp3": "audio/mpeg", "opus": "audio/ogg", "aac": "audio/aac",
                                                "flac": "audio/flac", "wav": "audio/wav", "pcm": "audio/pcm"}[fmt]
        assert "content-length" not in resp.headers
        streamed = b"".join(resp.iter_bytes())
    for body in (whole.content, streamed):
        seconds, rate = decode(body, fmt)
        assert rate == (48000 if fmt == "opus" else SR)
        assert 1.2 - 0.002 <= seconds <= 1.2 + (0.12 if fmt in ("mp3", "aac") else 0.002), (fmt, seconds)


def test_telephone_audio_mulaw_at_8khz_and_other_rates(http, client):
    """A phone bot's request: raw mu-law at 8 kHz (one byte a sample), streamed or as SSE deltas
    (what a Twilio media stream carries, base64); any format at another rate with `sample_rate`."""
    with http.stream("POST", "/v1/audio/speech", json={"input": TEXT, "response_format": "mulaw"}) as resp:
        assert resp.status_code == 200 and resp.headers["content-type"] == "audio/PCMU"
        streamed = b"".join(resp.iter_bytes())
    assert len(streamed) == round(1.2 * 8000)
    pcm = np.frombuffer(http.post("/v1/audio/speech", json={"input": TEXT, "response_format": "pcm",
                                                            "sample_rate": 8000}).content, "<i2") / 32768
    with av.open(io.BytesIO(streamed), format="mulaw", options={"sample_rate": "8000"}) as container:
        decoded = np.concatenate([f.to_ndarray().reshape(-1) for f in container.decode(audio=0)]) / 32768
    assert len(pcm) == len(decoded) and np.sqrt(np.mean((decoded - pcm) ** 2)) < 0.01  # the same audio, companded

    sse = http.post("/v1/audio/speech", json={"input": TEXT, "response_format": "alaw", "stream_format": "sse"})
    events = [json.loads(line[6:]) for line in sse.text.split("\n\n") if line.startswith("data: ")]
    assert len(b"".join(base64.b64decode(e["audio"]) for e in events[:-1])) == round(1.2 * 8000)
    assert events[-1]["usage"]["output_tokens"] == round(1.2 * SR / 600)  # usage counts the model's frames

    # The official client sends the extension in extra_body.
    wav = client.audio.speech.create(model="tts-1", voice="af_heart", input=TEXT, response_format="wav",
                                     extra_body={"sample_rate": 16000, "stream": False})
    assert decode(wav.content, "wav") == (pytest.approx(1.2, abs=0.001), 16000)
    opus = http.post("/v1/audio/speech", json={"input": TEXT, "response_format": "opus", "sample_rate": 16000})
    assert decode(opus.content, "opus")[0] == pytest.approx(1.2, abs=0.002)
    phonemes = http.post("/dev/generate_from_phonemes", json={"phonemes": "hˈɛloʊ", "sample_rate": 22050})
    assert decode(phonemes.content, "wav")[1] == 22050


def test_sample_rates_a_format_cannot_carry_are_400s(http):
    error = assert_openai_error(http.post("/v1/audio/speech", json={"input": "hi", "response_format": "opus",
                                                                    "sample_rate": 22050}), 400, "sample_rate")
    assert "opus audio cannot be 22050 Hz; its codec takes 8000, 12000, 16000, 24000 or 48000 Hz" in error["message"]
    # the download file must carry the rate too
    error = assert_openai_error(http.post("/v1/audio/speech", json={
        "input": "hi", "response_format": "wav", "sample_rate": 44100, "return_download_link": True,
        "download_format": "opus"}), 400, "sample_rate")
    assert "opus" in error["message"]
    for rate in (7999, 48001, "fast"):
        assert_openai_error(http.post("/v1/audio/speech", json={"input": "hi", "sample_rate": rate}), 400,
                            "sample_rate")
    phonemes = {"phonemes": "hˈɛloʊ", "response_format": "mp3", "sample_rate": 9000}
    assert_openai_error(http.post("/dev/generate_from_phonemes", json=phonemes), 400, "sample_rate")


def test_an_agents_markdown_is_read_as_rendered(http):
    """An LLM's reply, Markdown and all, is phonemized as the rendered text would be read: no
    "number" for the heading, no link target, no asterisks; the switch keeps the old reading."""
    def phonemes(text: str, **options) -> str:
        body = {"text": text, **({"normalization_options": options} if options else {})}
        resp = http.post("/dev/phonemize", json=body)
        assert resp.status_code == 200, resp.text
        return resp.json()["phonemes"]

    markdown = "## Plan\n- **Mix** the [flour](https://x.org/flour)\n- Bake<break time=\"500ms\"/> it"
    assert phonemes(markdown) == phonemes("Plan.\nMix the flour.\nBake[pause:500ms] it.")
    number = phonemes("number")
    assert number in phonemes("## Plan", markup_normalization=False) and number not in phonemes("## Plan")


def test_phonemize_shows_each_piece_as_read(http):
    """/dev/phonemize's `chunks`: each piece the model speaks at once, as its words are read (a code
    digit by digit, markup gone) and as phonemes; together they are the `phonemes` field."""
    resp = http.post("/dev/phonemize", json={"text": "**Your code is 482913.** Call me at 9:15 p.m. today."})
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert [c["text"] for c in body["chunks"]][0].startswith("Your code is four eight two, nine one three.")
    assert "nine fifteen PM" in " ".join(c["text"] for c in body["chunks"])
    assert " ".join(c["phonemes"] for c in body["chunks"]) == body["phonemes"]


def test_openapi_documents_every_request_body(http):
    """/docs and client generators see the bodies' fields, though the routes read their JSON
    themselves (for the OpenAI error shape): each body names its model, every reference resolves."""
    from api.protocol import CaptionedSpeechRequest, PhonemeSpeechRequest, PhonemizeRequest
    from api.protocol import SpeechRequestBody as SpeechRequest

    schema = http.get("/openapi.json").json()
    components = schema["components"]["schemas"]
    for path, model in [("/v1/audio/speech", SpeechRequest), ("/v1/audio/speech/captioned", CaptionedSpeechRequest),
                        ("/dev/phonemize", PhonemizeRequest), ("/dev/generate_from_phonemes", PhonemeSpeechRequest)]:
        body = schema["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]
        documented = components[body["$ref"].rsplit("/", 1)[-1]]
        assert set(documented["properties"]) == set(model.model_fields), path
    assert components["SpeechRequest"]["properties"]["sample_rate"]["anyOf"][0]["maximum"] == 48000
    assert "mulaw" in components["SpeechRequest"]["properties"]["response_format"]["enum"]

    def refs(node):
        if isinstance(node, dict):
            yield from ([node["$ref"]] if "$ref" in node else [])
            for value in node.values():
                yield from refs(value)
        elif isinstance(node, list):
            for value in node:
                yield from refs(value)

    names = {ref.rsplit("/", 1)[-1] for ref in refs(schema)}
    assert "NormalizationOptions" in names and names <= set(components), names - set(components)


def test_streaming_sends_audio_before_synthesis_ends(http, service):
    text = ". ".join(["word"] * 6)  # 6 pieces, ~0.9 s of scripted synthesis
    jobs_before = service.replica.jobs_done
    with http.stream("POST", "/v1/audio/speech", json={"input": text, "response_format": "pcm"}) as resp:
        # How many pieces the replica had finished when each chunk of audio arrived.
        arrivals = [(service.replica.jobs_done - jobs_before, len(chunk)) for chunk in resp.iter_raw() if chunk]
    assert sum(n for _, n in arrivals) == round(6 * PIECE_AUDIO_S * SR) * 2
    # The first audio came while pieces were still to be synthesized, not after all six.
    assert arrivals[0][0] < 6, arrivals
    assert resp.headers["x-request-id"].startswith("req_")


def test_sse_events(http):
    resp = http.post("/v1/audio/speech", json={"input": TEXT, "response_format": "pcm", "stream_format": "sse"})
    assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/event-stream")
    events = [json.loads(line[len("data: "):]) for line in resp.text.split("\n\n") if line.startswith("data: ")]
    assert [e["type"] for e in events] == ["speech.audio.delta"] * 3 + ["speech.audio.done"]
    audio = b"".join(base64.b64decode(e["audio"]) for e in events[:-1])
    assert len(audio) == round(1.2 * SR) * 2
    usage = events[-1]["usage"]
    assert usage["output_tokens"] == round(1.2 * SR / 600) and usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]


def test_sse_error_event_when_synthesis_fails_midway(http, service):
    service.fail_after = 1
    try:
        resp = http.post("/v1/audio/speech", json={"input": TEXT, "stream_format": "sse", "response_format": "pcm"})
    finally:
        service.fail_after = None
    events = [json.loads(line[6:]) for line in resp.text.split("\n\n") if line.startswith("data: ")]
    assert [e["type"] for e in events] == ["speech.audio.delta", "error"]
    assert events[-1]["error"]["type"] == "server_error" and "Traceback" not in resp.text
    assert http.get("/health").status_code == 200


def test_audio_stream_failing_midway_is_an_incomplete_body(http, service):
    service.fail_after = 1
    try:
        with pytest.raises(httpx.RemoteProtocolError):
            with http.stream("POST", "/v1/audio/speech", json={"input": TEXT, "response_format": "pcm"}) as resp:
                b"".join(resp.iter_bytes())
    finally:
        service.fail_after = None
    assert http.get("/ready").status_code == 200


def test_captioned_json_and_ndjson(http):
    for path in ("/v1/audio/speech/captioned", "/dev/captioned_speech"):
        resp = http.post(path, json={"input": TEXT, "response_format": "wav", "stream": False})
        body = resp.json()
        assert decode(base64.b64decode(body["audio"]), "wav")[0] == pytest.approx(1.2, abs=0.002)
        assert [w["word"] for w in body["timestamps"]] == ["One", "two", "three", "Four", "five", "Six"]
        assert body["timestamps"][3]["start_time"] == pytest.approx(0.4)  # absolute, not per piece
        assert [TEXT[w["input_start"]:w["input_end"]] for w in body["timestamps"]] == [
            "One", "two", "three", "Four", "five", "Six"]
    resp = http.post("/v1/audio/speech/captioned", json={"input": TEXT, "response_format": "mp3"})
    assert resp.headers["content-type"].startswith("application/x-ndjson")
    lines = [json.loads(line) for line in resp.text.splitlines()]
    audio = b"".join(base64.b64decode(line["audio"]) for line in lines)
    assert decode(audio, "mp3")[0] == pytest.approx(1.2, abs=0.12)
    assert [w["word"] for line in lines for w in line["timestamps"]][-1] == "Six"
    assert [TEXT[w["input_start"]:w["input_end"]] for line in lines for w in line["timestamps"]] == [
        "One", "two", "three", "Four", "five", "Six"]  # the streamed lines carry the spans too


def test_listings(http, client):
    voices = http.get("/v1/audio/voices").json()["voices"]
    assert voices[0] == {"id": "af_heart", "name": "af_heart", "language": "en-us", "lang_code": "a", "gender": "female"}
    assert http.get("/v1/audio/voices", params={"legacy": "true"}).json() == {"voices": ["af_heart", "bm_george"]}
    ids = [m.id for m in client.models.list()]
    assert ids[0] == "kokoro" and {"tts-1", "tts-1-hd", "gpt-4o-mini-tts"} <= set(ids)
    assert client.models.retrieve("tts-1").id == "tts-1"
    with pytest.raises(openai.NotFoundError) as e:
        client.models.retrieve("whisper-1")
    assert e.value.body["code"] == "model_not_found"


def assert_openai_error(resp: httpx.Response, status: int, param: str | None = None) -> dict:
    assert resp.status_code == status, resp.text
    error = resp.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["message"] and "Traceback" not in error["message"]
    if param is not None:
        assert error["param"] == param, error
    return error


BAD_BODIES = [
    ({"input": ""}, "input"),
    ({"input": "   "}, "input"),
    ({"input": "x" * 501}, "input"),
    ({"input": "hi", "voice": "nope"}, "voice"),
    ({"input": "hi", "response_format": "ogg"}, "response_format"),
    ({"input": "hi", "speed": 0}, "speed"),
    ({"input": "hi", "speed": 10}, "speed"),
    ({"input": "hi", "model": "tts-2"}, "model"),
    ({"input": "a\u0000b"}, "input"),
    ({"input": "hi", "voices": "af_heart"}, "voices"),
    ({"input": "hi", "normalization_options": {"no_such_switch": True}}, "normalization_options.no_such_switch"),
    ({"voice": "af_heart"}, "input"),
    ({"input": 42}, "input"),
]


@pytest.mark.parametrize("body,param", BAD_BODIES, ids=[p + str(i) for i, (_, p) in enumerate(BAD_BODIES)])
def test_bad_request_bodies(http, body, param):
    assert_openai_error(http.post("/v1/audio/speech", json=body), 400, param)


def test_bad_raw_bodies(http):
    post = lambda content, **kw: http.post("/v1/audio/speech", content=content,
                                           headers=kw.get("headers", {"content-type": "application/json"}))
    assert_openai_error(post(b"{not json"), 400)
    assert "JSON object" in assert_openai_error(post(b'["input", "hi"]'), 400)["message"]
    assert_openai_error(post(b'{"input": "lone \\ud800 surrogate"}'), 400, "input")
    assert_openai_error(post(b'{"input": "bad utf8 \xff"}'), 400)
    assert_openai_error(post(b""), 400)
    big = b'{"input": "' + b"a" * (10 << 20) + b'"}'
    assert assert_openai_error(post(big), 413)["code"] == "request_too_large"
    assert_openai_error(post(b"input=hi", headers={"content-type": "application/x-www-form-urlencoded"}), 415)
    assert_openai_error(http.get("/v1/audio/speech"), 405)
    assert_openai_error(http.get("/v1/nothing/here"), 404)
    assert http.get("/health").json()["status"] == "ok"
    # and it still speaks
    assert http.post("/v1/audio/speech", json={"input": "fine", "response_format": "pcm"}).status_code == 200


def test_kokoro_fastapi_request_fields(http):
    """What Kokoro-FastAPI clients send, its defaults spelled out, is accepted as they send it."""
    resp = http.post("/v1/audio/speech", json={
        "model": "kokoro", "input": "Hello.", "voice": "af_heart", "response_format": "pcm", "download_format": None,
        "speed": 1.0, "stream": True, "return_download_link": False, "lang_code": None, "volume_multiplier": 1.0,
        "normalization_options": {"normalize": True, "unit_normalization": False, "url_normalization": True,
                                  "email_normalization": True, "optional_pluralization_normalization": True,
                                  "phone_normalization": True, "replace_remaining_symbols": True}})
    assert resp.status_code == 200 and len(resp.content) == round(PIECE_AUDIO_S * SR) * 2
    assert "x-download-path" not in resp.headers
    for flag, words in ((True, ["One", "two", "three", "Four", "five", "Six"]), (False, [])):
        body = http.post("/dev/captioned_speech", json={"input": TEXT, "response_format": "pcm", "stream": False,
                                                        "return_timestamps": flag}).json()
        assert [w["word"] for w in body["timestamps"]] == words and len(base64.b64decode(body["audio"])) == 57600
    lines = http.post("/dev/captioned_speech", json={"input": TEXT, "return_timestamps": False}).text.splitlines()
    assert len(lines) >= 3 and all(json.loads(line)["timestamps"] == [] for line in lines)
    # return_timestamps belongs to the captioned endpoint only
    assert_openai_error(http.post("/v1/audio/speech", json={"input": "hi", "return_timestamps": True}), 400,
                        "return_timestamps")


def test_combined_voice_file_as_kokoro_fastapi_gives_it(http, service):
    heart, george = (service.voices.resolve(n).pack for n in ("af_heart", "bm_george"))
    for body, name, expected in (
            ("af_heart(3)+bm_george(1)", "af_heart(0.75)+bm_george(0.25)", heart * 0.75 + george * 0.25),
            (["af_heart", "bm_george"], "af_heart(0.5)+bm_george(0.5)", (heart + george) / 2),
            ({"voices": "af_heart-bm_george"}, "af_heart(0.5)-bm_george(0.5)", (heart - george) / 2),
            ("coral", "af_heart", heart)):  # an OpenAI name: its Kokoro voice
        resp = http.post("/v1/audio/voices/combine", json=body)
        assert resp.status_code == 200 and resp.headers["content-type"] == "application/octet-stream"
        assert resp.headers["content-disposition"] == f'attachment; filename="{name}.pt"'
        pack = torch.load(io.BytesIO(resp.content), weights_only=True)
        assert pack.shape == (510, 1, 256) and pack.dtype == torch.float32  # the official voice layout
        assert torch.allclose(pack[:, 0], expected, atol=1e-6)
        assert len(resp.content) < 510 * 256 * 4 + 4096  # the pack alone, not a storage it is a view of
    for body in ("af_heart+nobody", [], ["af_heart", 3], {"voice": "af_heart"}, 42):
        assert_openai_error(http.post("/v1/audio/voices/combine", json=body), 400, "voices")


def download_name(resp: httpx.Response, fmt: str) -> str:
    link = resp.headers["x-download-path"]
    assert link.startswith("/download/") and link.endswith("." + fmt), link
    return link[len("/download/"):]


def test_download_link_serves_the_same_audio_after_the_response(http, downloads):
    # streamed mp3, saved as wav: a real WAV header (the length known), the same 1.2 s
    with http.stream("POST", "/v1/audio/speech", json={"input": TEXT, "return_download_link": True,
                                                        "download_format": "wav"}) as resp:
        name = download_name(resp, "wav")
        streamed = b"".join(resp.iter_bytes())
    assert decode(streamed, "mp3")[0] == pytest.approx(1.2, abs=0.12)
    for path in (f"/v1/download/{name}", f"/download/{name}"):
        got = http.get(path)
        assert got.status_code == 200 and got.headers["content-type"] == "audio/wav"
        assert "attachment" in got.headers["content-disposition"]
        assert decode(got.content, "wav")[0] == pytest.approx(1.2, abs=0.002)
        assert int.from_bytes(got.content[40:44], "little") == round(1.2 * SR) * 2  # data size, not 0xFFFFFFFF
    # the response's own format, not streamed: the file is the body
    whole = http.post("/v1/audio/speech", json={"input": TEXT, "response_format": "pcm", "stream": False,
                                                "return_download_link": True})
    assert http.get(f"/v1/download/{download_name(whole, 'pcm')}").content == whole.content
    # captioned, as Kokoro-FastAPI's captioned endpoint offers it
    caption = http.post("/dev/captioned_speech", json={"input": TEXT, "response_format": "flac", "stream": False,
                                                       "return_download_link": True})
    saved = http.get(f"/v1/download/{download_name(caption, 'flac')}").content
    assert decode(saved, "flac")[0] == pytest.approx(1.2, abs=0.002)
    assert not list(downloads.glob("*.part"))
    # at the request's sample rate, as the response
    phone = http.post("/v1/audio/speech", json={"input": TEXT, "response_format": "mulaw", "stream": False,
                                                "return_download_link": True, "download_format": "wav",
                                                "sample_rate": 8000})
    assert len(phone.content) == round(1.2 * 8000)
    assert decode(http.get(f"/v1/download/{download_name(phone, 'wav')}").content, "wav") == (
        pytest.approx(1.2, abs=0.001), 8000)


def test_download_link_while_streaming_then_after_a_failure_or_a_disconnect(server, http, service, downloads):
    text = ". ".join(["slow"] * 8)
    with http.stream("POST", "/v1/audio/speech", json={"input": text, "response_format": "pcm",
                                                        "return_download_link": True}) as resp:
        name = download_name(resp, "pcm")
        chunks = resp.iter_raw()
        next(chunks)
        pending = http.get(f"/v1/download/{name}")
        b"".join(chunks)
    assert assert_openai_error(pending, 409, "filename")["code"] == "download_not_ready"
    assert http.get(f"/v1/download/{name}").status_code == 200

    service.fail_after = 1  # synthesis fails midway: no file, no leftover
    try:
        with pytest.raises(httpx.RemoteProtocolError):
            with http.stream("POST", "/v1/audio/speech", json={"input": TEXT, "response_format": "pcm",
                                                                "return_download_link": True}) as resp:
                failed = download_name(resp, "pcm")
                b"".join(resp.iter_bytes())
    finally:
        service.fail_after = None
    assert assert_openai_error(http.get(f"/v1/download/{failed}"), 404)["code"] == "download_not_found"

    c = httpx.Client(base_url=server.url, timeout=30)  # the client leaves after the first chunk
    with c.stream("POST", "/v1/audio/speech", json={"input": text, "response_format": "pcm",
                                                     "return_download_link": True}) as resp:
        left = download_name(resp, "pcm")
        next(resp.iter_raw())
    c.close()
    deadline = time.time() + 60  # the piece in flight runs to its end (as on a real replica) before the cleanup
    while ((downloads / (left + ".part")).exists() or metric(http, "kokoro_replica_busy")) and time.time() < deadline:
        time.sleep(0.02)
    assert assert_openai_error(http.get(f"/v1/download/{left}"), 404)["code"] == "download_not_found"
    assert metric(http, "kokoro_admitted_requests") == 0 and metric(http, "kokoro_replica_busy") == 0


def test_download_names_never_reach_the_filesystem(http):
    for name in ("nothing.mp3", "...", "0" * 32 + ".exe", "0" * 32 + ".mp3"):
        assert_openai_error(http.get(f"/v1/download/{name}"), 404, "filename")
    assert_openai_error(http.get("/v1/download/..%2F..%2Fetc%2Fpasswd"), 404)  # no route takes a slash


def test_download_directory_unwritable_is_a_clean_500_before_any_audio(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    service = ScriptedService()
    app = create_app(Settings().replace(download_dir=str(blocker / "downloads")), service=service)

    async def go():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
            return await c.post("/v1/audio/speech", json={"input": TEXT, "return_download_link": True})

    error = assert_openai_error(asyncio.run(go()), 500, "return_download_link")
    assert error["code"] == "downloads_unavailable" and "without return_download_link" in error["message"]
    assert service.pieces_started == 0 and app.state.kokoro.admission.admitted == 0


def test_a_download_link_works_on_another_machine_of_the_fleet(tmp_path, redis_server):
    """Two servers with their own download directories (two machines) on one Redis: the link one
    gave is served by the other, with the same bytes and headers."""
    from api.downloads import SharedDownloads
    from api.speech.redis_link import connect

    apps = [create_app(Settings().replace(download_dir=str(tmp_path / m)), service=ScriptedService()) for m in "ab"]

    async def go():
        client = connect(redis_server.url)
        for app in apps:  # the test's Redis is on loopback, which for_fleet takes for one machine
            app.state.kokoro.downloads.shared = SharedDownloads(client, 1 << 20, 60, "{test}")
        try:
            async with (httpx.AsyncClient(transport=httpx.ASGITransport(app=apps[0]), base_url="http://a") as a,
                        httpx.AsyncClient(transport=httpx.ASGITransport(app=apps[1]), base_url="http://b") as b):
                made = await a.post("/v1/audio/speech", json={"input": TEXT, "response_format": "flac",
                                                              "stream": False, "return_download_link": True})
                name = download_name(made, "flac")
                return made, await a.get(f"/v1/download/{name}"), await b.get(f"/download/{name}")
        finally:
            await client.aclose()

    made, own, other = asyncio.run(go())
    assert own.status_code == other.status_code == 200 and other.content == own.content == made.content
    assert other.headers["content-type"] == own.headers["content-type"] == "audio/flac"
    assert other.headers["content-disposition"] == own.headers["content-disposition"]
    assert not list((tmp_path / "b").glob("*.flac"))  # served from Redis, not from a file of its own


def test_accepted_extras(http):
    resp = http.post("/v1/audio/speech", json={
        "model": "gpt-4o-mini-tts", "input": "Hello.", "voice": {"id": "af_heart"}, "instructions": "whisper",
        "speed": 4.0, "lang_code": "a", "volume_multiplier": 0.5, "stream": False, "response_format": "pcm"})
    assert resp.status_code == 200
    peak = np.abs(np.frombuffer(resp.content, "<i2")).max() / 32768
    assert peak == pytest.approx(0.15, abs=0.003)


def test_capacity_503_then_openai_client_retries(server, http, service):
    """Two slots: fill both with slow streams, a third request gets 503 + Retry-After; the
    official client honours it (max_retries) and succeeds once a slot frees."""
    long_text = ". ".join(["slow"] * 6)
    holders = []
    for _ in range(2):
        h = httpx.Client(base_url=server.url, timeout=30)
        cm = h.stream("POST", "/v1/audio/speech", json={"input": long_text, "response_format": "pcm"})
        holders.append((h, cm, cm.__enter__()))
    try:
        refused = http.post("/v1/audio/speech", json={"input": "x", "response_format": "pcm"})
        error = assert_openai_error(refused, 503)
        assert error["code"] == "overloaded"
        assert int(refused.headers["retry-after"]) >= 1 and float(refused.headers["retry-after-ms"]) > 0

        retrying = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=8)
        done = {}

        def call():
            done["audio"] = retrying.audio.speech.create(model="kokoro", voice="af_heart", input="After.",
                                                         response_format="pcm")
        t = threading.Thread(target=call)
        t.start()
        time.sleep(0.3)
        assert "audio" not in done  # still being refused
    finally:
        for h, cm, resp in holders:
            b"".join(resp.iter_bytes())
            cm.__exit__(None, None, None)
            h.close()
    t.join(30)
    assert len(done["audio"].content) == round(PIECE_AUDIO_S * SR) * 2


def test_disconnect_stops_synthesis_and_frees_the_slot(server, http, service):
    text = ". ".join(["many"] * 40)  # 40 pieces, 6 s of scripted synthesis if nobody stopped it
    before = service.pieces_started
    jobs_before = metric(http, "kokoro_replica_jobs_total")
    c = httpx.Client(base_url=server.url, timeout=30)
    with c.stream("POST", "/v1/audio/speech", json={"input": text, "response_format": "pcm"}) as resp:
        next(resp.iter_raw())  # the first chunk arrived
    c.close()  # drop the connection
    dropped = time.perf_counter()
    # A generous deadline for the slot to free (a slot held until some timeout still fails it); how
    # much was synthesized for nobody is checked below.
    deadline = dropped + 15
    while time.perf_counter() < deadline:
        if metric(http, "kokoro_admitted_requests") == 0 and metric(http, "kokoro_replica_busy") == 0:
            break
        time.sleep(0.01)
    idle_after = time.perf_counter() - dropped
    assert metric(http, "kokoro_admitted_requests") == 0
    assert metric(http, "kokoro_replica_busy") == 0
    time.sleep(3 * PIECE_SECONDS)  # time for pieces to start, were synthesis still going on
    started = service.pieces_started - before
    assert started <= 3, f"{started} pieces were synthesized for a client that left after the first " \
                         f"(idle {idle_after:.2f} s after the drop)"
    assert metric(http, "kokoro_replica_jobs_total") - jobs_before <= 3
    assert metric(http, "kokoro_client_disconnects_total") >= 1
    assert service.replica.overlaps == 0
    assert http.post("/v1/audio/speech", json={"input": "still here", "response_format": "pcm"}).status_code == 200


def test_metrics_exposition(http):
    http.post("/v1/audio/speech", json={"input": "count me", "response_format": "pcm"})
    http.post("/v1/audio/speech", json={"input": ""})
    text = http.get("/metrics").text
    assert 'kokoro_requests_total{route="/v1/audio/speech",status="200"}' in text
    assert 'kokoro_requests_total{route="/v1/audio/speech",status="400"}' in text
    assert "# TYPE kokoro_ttfa_seconds histogram" in text and 'kokoro_e2e_seconds_bucket{le="+Inf"}' in text
    assert metric(http, "kokoro_audio_seconds_total") > 0
    assert metric(http, "kokoro_ready") == 1


def test_api_keys(caplog):
    settings = Settings().replace(api_keys="k1, reader:k2")
    app = create_app(settings, service=ScriptedService())

    async def go():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
            missing = await c.get("/v1/models")
            wrong = await c.get("/v1/models", headers={"Authorization": "Bearer nope"})
            right = await c.get("/v1/models", headers={"Authorization": "Bearer k2"})
            health = await c.get("/health")
            for key in ("k2", "k2", "k1"):
                await c.post("/v1/audio/speech", json={"input": TEXT, "response_format": "pcm"},
                             headers={"Authorization": f"Bearer {key}"})
            # /metrics names the keys and their usage, /openapi.json and /docs describe the API: a key each
            closed = [await c.get(path) for path in ("/metrics", "/openapi.json", "/docs")]
            keyed_health = await c.get("/health", headers={"Authorization": "Bearer k1"})
            return (missing, wrong, right, health, closed, keyed_health,
                    (await c.get("/metrics", headers={"Authorization": "Bearer k1"})).text)

    with caplog.at_level(logging.INFO, logger="kokoro_fleet.access"):
        missing, wrong, right, health, closed, keyed_health, metrics = asyncio.run(go())
    assert assert_openai_error(missing, 401)["code"] == "invalid_api_key"
    assert_openai_error(wrong, 401)
    assert right.status_code == 200 and health.status_code == 200
    for refused in closed:
        assert assert_openai_error(refused, 401)["code"] == "invalid_api_key"
    assert health.json() == {"status": "ok"}, "without a key /health tells only that the process answers"
    assert keyed_health.json()["ready"] is True and "admitted" in keyed_health.json()
    # usage by the key's name: `reader:k2` is "reader", the unnamed k1 a name from its hash
    unnamed = "key-" + hashlib.sha256(b"k1").hexdigest()[:6]
    assert 'kokoro_key_requests_total{key="reader",status="200"} 3' in metrics  # /v1/models and two speeches
    assert f'kokoro_key_requests_total{{key="{unnamed}",status="200"}} 1' in metrics
    assert 'kokoro_key_audio_seconds_total{key="reader"} 2.4' in metrics
    logged = [json.loads(r.getMessage()) for r in caplog.records if r.name == "kokoro_fleet.access"]
    assert [r.get("key") for r in logged if r["path"] == "/v1/audio/speech"] == ["reader", "reader", unnamed]
    assert not any("k2" in r.getMessage() for r in caplog.records)  # the key itself is never logged


def test_one_api_key_holds_at_most_its_share_and_gets_429_while_others_are_served():
    """KOKORO_KEY_MAX_SHARE=0.5 of 4 requests: a reader's third request at once is a 429 in OpenAI's
    rate-limit shape with Retry-After, while another key's request is served; the key's name also
    reaches the speech service, which holds it to its share of the fleet."""
    service = ScriptedService()
    settings = Settings().replace(api_keys="reader:k1,bot:k2", max_requests=4, key_max_share=0.5)
    app = create_app(settings, service=service)
    long_text = "One. Two. Three. Four. Five. Six."  # six pieces: about a second of the scripted replica

    async def go():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t", timeout=30) as c:
            def speak(key: str, text: str = long_text):
                return c.post("/v1/audio/speech", json={"input": text, "response_format": "pcm"},
                              headers={"Authorization": f"Bearer {key}"})
            def scrape():  # /metrics needs a key too
                return c.get("/metrics", headers={"Authorization": "Bearer k2"})
            holding = [asyncio.ensure_future(speak("k1")) for _ in range(2)]
            # Until both are admitted (each then streams for about a second), not a fixed time.
            deadline = time.monotonic() + 60
            during = (await scrape()).text
            while 'kokoro_key_admitted_requests{key="reader"} 2' not in during and time.monotonic() < deadline:
                await asyncio.sleep(0.02)
                during = (await scrape()).text
            third, other = await asyncio.gather(speak("k1", "Again."), speak("k2", "Meanwhile."))
            held = await asyncio.gather(*holding)
            after = await speak("k1", "Later.")  # the reader's places came back
            return held, third, other, after, during, (await scrape()).text

    held, third, other, after, during, metrics = asyncio.run(go())
    assert [r.status_code for r in held] == [200, 200] and other.status_code == 200 and after.status_code == 200
    error = assert_openai_error(third, 429)
    assert error["code"] == "rate_limit_exceeded" and error["type"] == "requests"
    assert "This API key holds its share of the server (2 requests in progress" in error["message"]
    assert int(third.headers["retry-after"]) >= 1 and int(third.headers["retry-after-ms"]) > 0
    assert 'kokoro_key_requests_total{key="reader",status="429"} 1' in metrics
    # What the share bounds, per key: the reader's two while they stream; every named key back at 0.
    assert {'kokoro_key_admitted_requests{key="reader"} 2', 'kokoro_key_admitted_requests{key="bot"} 0'} <= set(
        during.splitlines()), during
    assert {'kokoro_key_admitted_requests{key="reader"} 0', 'kokoro_key_admitted_requests{key="bot"} 0'} <= set(
        metrics.splitlines()), metrics
    assert sorted(service.admitted_keys) == ["bot", "reader", "reader", "reader"]


def test_cors_lets_a_web_page_call_the_api_and_read_retry_after():
    async def call(settings: Settings):
        app = create_app(settings, service=ScriptedService())
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
            page = {"Origin": "https://app.example.com"}
            preflight = await c.options("/v1/audio/speech", headers={
                **page, "Access-Control-Request-Method": "POST",
                "Access-Control-Request-Headers": "authorization, content-type"})
            listed = await c.get("/v1/models", headers={**page, "Authorization": "Bearer k1"})
            return preflight, listed

    # The default (Kokoro-FastAPI's): any origin; the preflight passes before the key check.
    preflight, listed = asyncio.run(call(Settings().replace(api_keys="k1")))
    assert preflight.status_code == 200 and preflight.headers["access-control-allow-origin"] == "*"
    assert "authorization" in preflight.headers["access-control-allow-headers"].lower()
    assert listed.status_code == 200 and listed.headers["access-control-allow-origin"] == "*"
    assert "retry-after" in listed.headers["access-control-expose-headers"].lower()
    # Narrowed to other origins: this page gets no CORS headers; switched off: none at all.
    for origins in ("https://other.example.com", ""):
        preflight, listed = asyncio.run(call(Settings().replace(cors_origins=origins)))
        assert "access-control-allow-origin" not in preflight.headers and preflight.status_code != 200
        assert listed.status_code == 200 and "access-control-allow-origin" not in listed.headers


def test_not_ready_until_loaded():
    app = create_app(Settings().replace(weights="/nonexistent/weights/dir"))

    async def go():
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
                first = await c.get("/ready")
                speech = await c.post("/v1/audio/speech", json={"input": "hi"})
                # Until the load has failed, with a deadline that only a load that never ends reaches.
                deadline = time.monotonic() + 120
                while not app.state.kokoro.load_error and time.monotonic() < deadline:
                    await asyncio.sleep(0.05)
                return first, speech, await c.get("/ready"), await c.get("/health")

    first, speech, after, health = asyncio.run(go())
    assert first.status_code == 503 and speech.status_code == 503
    assert assert_openai_error(after, 503)["code"] == "model_unavailable"
    assert health.status_code == 200 and health.json()["ready"] is False


def test_audio_is_encoded_off_the_event_loop(monkeypatch):
    """Encoding (LAME, Opus, AAC through PyAV) runs in the process's encode pool: an encode never
    runs on the event loop's thread, and the loop keeps serving while one is in progress."""
    import api.serving
    from api.encoders import make_encoder

    ticks = 0
    encodes: list[tuple[int, int]] = []  # (thread id, loop ticks that happened during the encode)

    class SlowEncoder:
        def __init__(self, inner):
            self.inner = inner

        def encode(self, pcm):
            before = ticks
            time.sleep(0.1)  # a long encode; a loop blocked here could not tick
            encodes.append((threading.get_ident(), ticks - before))
            return self.inner.encode(pcm)

        def finish(self):
            encodes.append((threading.get_ident(), 1))
            return self.inner.finish()

        def close(self):
            self.inner.close()

    monkeypatch.setattr(api.serving, "make_encoder", lambda *a, **kw: SlowEncoder(make_encoder(*a, **kw)))
    app = create_app(Settings(), service=ScriptedService())

    async def go():
        async def ticker():
            nonlocal ticks
            while True:
                await asyncio.sleep(0.005)
                ticks += 1

        tick = asyncio.create_task(ticker())
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
            resp = await c.post("/v1/audio/speech", json={"input": TEXT, "response_format": "mp3"})
        tick.cancel()
        return threading.get_ident(), resp

    loop_thread, resp = asyncio.run(go())
    assert resp.status_code == 200 and decode(resp.content, "mp3")[0] == pytest.approx(1.2, abs=0.12)
    assert len(encodes) == 4  # three pieces and the flush
    assert all(thread != loop_thread for thread, _ in encodes), "an encode ran on the event loop's thread"
    assert all(during > 0 for _, during in encodes), "the event loop stood still while audio was encoded"


def test_the_load_generator_warns_when_the_server_answered_from_its_cache(server, service, monkeypatch):
    from loadtest.loadtest_cli import cache_warning

    assert asyncio.run(cache_warning(server.url)) is None  # no cache hits: nothing to say
    real = service.stats
    monkeypatch.setattr(service, "stats", lambda: dataclasses.replace(real(), cache_hits=7))
    warning = asyncio.run(cache_warning(server.url + "/v1/audio/speech"))
    assert "7 chunks from its synthesis cache" in warning and "KOKORO_SYNTHESIS_CACHE_MIB=0" in warning
