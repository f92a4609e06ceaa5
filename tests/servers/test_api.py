"""The product end to end: `kokoro-fleet serve` in a real process, driven over HTTP with the
official `openai` client, as users drive it.

Two servers for the whole file: one on the tiny random weights (fast: the request contract, errors,
listings, SSE, captions) and one on the real Kokoro-82M weights (marked slow: audio lengths against
`kokoro-fleet say`, first-audio timing, 503 + retry, disconnects). The HTTP layer's finer behaviour,
with a scripted service whose timing the tests control, is in tests/app/test_api_app.py.
"""

from __future__ import annotations

import base64
import io
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import wave
from pathlib import Path

import av
import numpy as np
import httpx
import openai
import pytest
from api.ports import free_port

ROOT = Path(__file__).resolve().parents[2]
PARAGRAPHS = [p for p in (ROOT / "tests/data/texts/paragraphs.txt").read_text(encoding="utf-8").splitlines() if p.strip()]
SR = 24000
FORMATS = ["mp3", "opus", "aac", "flac", "wav", "pcm"]
CONTENT_TYPES = {"mp3": "audio/mpeg", "opus": "audio/ogg", "aac": "audio/aac", "flac": "audio/flac",
                 "wav": "audio/wav", "pcm": "audio/pcm"}
# Generous: a loaded machine compiling the CPU kernels takes minutes to get a server ready. Only a
# server that never gets ready (or exits: that fails at once) reaches this.
READY_DEADLINE_S = 900
# MPEG audio and ADTS cannot tell a streaming decoder about the encoder's priming and padding.
CODEC_SLACK_S = {"mp3": 0.1, "aac": 0.12}


class ServerProcess:
    """`python -m cli.main serve` on a free port, its output in a log file shown on failure."""

    def __init__(self, tmp: Path, name: str, **env: str):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = tmp / f"{name}.log"
        self.env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
                    # One intra-op thread: the test machine's few cores are shared, and torch's
                    # threads spin-wait badly when another process holds a core (4-5x slower here).
                    "KOKORO_THREADS": os.environ.get("KOKORO_THREADS", "1"),
                    # These tests time synthesis, and send the same paragraphs more than once.
                    "KOKORO_SYNTHESIS_CACHE_MIB": "0", **env}
        self.proc: subprocess.Popen | None = None

    def start(self, ready_timeout: float) -> "ServerProcess":
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "cli.main", "serve", "--host", "127.0.0.1", "--port", str(self.port), "--workers", "1"],
            cwd=ROOT, env=self.env, stdout=self._log, stderr=subprocess.STDOUT)
        deadline = time.time() + ready_timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"server exited with {self.proc.returncode}:\n{self.log()}")
            try:
                if httpx.get(self.url + "/ready", timeout=2).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        raise AssertionError(f"server not ready after {ready_timeout} s:\n{self.log()}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-6000:]

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()


@pytest.fixture(scope="module")
def tiny_server(tmp_path_factory):
    home = tmp_path_factory.mktemp("tiny")
    server = ServerProcess(home, "tiny", KOKORO_WEIGHTS="tiny", KOKORO_MAX_INPUT_CHARS="600",
                           KOKORO_DOWNLOAD_DIR=str(home / "downloads")).start(ready_timeout=READY_DEADLINE_S)
    yield server
    server.stop()
    assert "Traceback" not in server.log(), server.log()  # no request, however bad, reached a crash


@pytest.fixture(scope="module")
def real_server(tmp_path_factory, real_weights):  # real_weights: the offline bundle converted and cached first
    server = ServerProcess(tmp_path_factory.mktemp("real"), "real", KOKORO_WEIGHTS="offline",
                           KOKORO_MAX_REQUESTS="1").start(ready_timeout=READY_DEADLINE_S)
    yield server
    server.stop()


def decode(data: bytes, fmt: str) -> tuple[float, int, int]:
    """(seconds, sample rate, channels) of a response body, as FFmpeg decodes it."""
    if fmt == "pcm":
        return len(data) / 2 / SR, SR, 1
    container = av.open(io.BytesIO(data))
    samples, rate, channels = 0, None, None
    for frame in container.decode(container.streams.audio[0]):
        samples, rate, channels = samples + frame.samples, frame.sample_rate, len(frame.layout.channels)
    return samples / rate, rate, channels


def openai_error(resp: httpx.Response, status: int, param: str | None = None) -> dict:
    assert resp.status_code == status, resp.text
    body = resp.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}, body
    assert body["error"]["message"] and "Traceback" not in resp.text
    if param is not None:
        assert body["error"]["param"] == param, body
    return body["error"]


def metric(url: str, name: str) -> float:
    for line in httpx.get(url + "/metrics").text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise KeyError(name)


# --- tiny weights: the contract ------------------------------------------------------------------

def test_listings(tiny_server):
    client = openai.OpenAI(base_url=tiny_server.url + "/v1", api_key="none")
    assert {"kokoro", "tts-1", "tts-1-hd", "gpt-4o-mini-tts"} <= {m.id for m in client.models.list()}
    voices = httpx.get(tiny_server.url + "/v1/audio/voices").json()["voices"]
    names = {v["id"] for v in voices}
    assert len(voices) == 54 and {"af_heart", "bm_george", "jf_alpha"} <= names
    heart = next(v for v in voices if v["id"] == "af_heart")
    assert heart["gender"].lower().startswith("f") and heart["lang_code"] == "a"


def test_what_kokoro_fastapi_clients_send(tiny_server):
    """A subtracted voice, a download link in another format, and a combined voice file, through a
    real server process."""
    url = tiny_server.url
    resp = httpx.post(url + "/v1/audio/speech", timeout=120, json={
        "input": "Subtract one voice from another.", "voice": "af_bella(2)-af_sky(1)", "response_format": "mp3",
        "return_download_link": True, "download_format": "wav"})
    assert resp.status_code == 200, resp.text
    saved = httpx.get(url + "/v1" + resp.headers["x-download-path"])
    assert saved.status_code == 200 and saved.headers["content-type"] == "audio/wav"
    assert decode(saved.content, "wav")[0] == pytest.approx(decode(resp.content, "mp3")[0], abs=0.1)
    pack = httpx.post(url + "/v1/audio/voices/combine", json=["af_bella", "af_sky"])
    assert pack.status_code == 200 and 'filename="af_bella(0.5)+af_sky(0.5).pt"' in pack.headers["content-disposition"]


BAD_INPUTS = [
    ({"input": ""}, 400, "input"),
    ({"input": "word " * 150}, 400, "input"),  # 750 characters, the limit is 600 here
    ({"input": "Hello.", "voice": "no_such_voice"}, 400, "voice"),
    ({"input": "Hello.", "voice": "af_heart++af_bella"}, 400, "voice"),
    ({"input": "Hello.", "voice": "af_heart(x)+af_bella"}, 400, "voice"),
    ({"input": "Hello.", "response_format": "ogg"}, 400, "response_format"),
    ({"input": "Hello.", "speed": 0}, 400, "speed"),
    ({"input": "Hello.", "speed": 10}, 400, "speed"),
    ({"input": "Hello\u0000 there."}, 400, "input"),
    ({"input": "Hello.", "temperature": 0.7}, 400, "temperature"),
    ({"input": "Hello.", "lang_code": "xx"}, 400, "lang_code"),
]


@pytest.mark.parametrize("body,status,param", BAD_INPUTS, ids=[f"{p}-{i}" for i, (_, _, p) in enumerate(BAD_INPUTS)])
def test_bad_input(tiny_server, body, status, param):
    openai_error(httpx.post(tiny_server.url + "/v1/audio/speech", json={"voice": "af_heart", **body}), status, param)


def test_bad_bodies_then_still_healthy(tiny_server):
    url = tiny_server.url + "/v1/audio/speech"
    json_type = {"content-type": "application/json"}
    openai_error(httpx.post(url, content=b"this is not json", headers=json_type), 400)
    openai_error(httpx.post(url, content=b'[{"input": "Hello."}]', headers=json_type), 400)
    openai_error(httpx.post(url, content=b'{"input": "lone \\udc00 surrogate"}', headers=json_type), 400, "input")
    openai_error(httpx.post(url, content=b'{"input": "' + b"a" * (10 << 20) + b'"}', headers=json_type), 413)
    openai_error(httpx.post(url, content=b"Hello.", headers={"content-type": "text/plain"}), 415)
    openai_error(httpx.get(tiny_server.url + "/v1/audio/nothing"), 404)
    assert httpx.get(tiny_server.url + "/health").json()["status"] == "ok"
    assert httpx.get(tiny_server.url + "/ready").status_code == 200
    ok = httpx.post(url, json={"input": "Still speaking.", "voice": "af_heart", "response_format": "wav"}, timeout=60)
    assert ok.status_code == 200 and decode(ok.content, "wav")[0] > 0.1


@pytest.mark.parametrize("nesting", [b"[" * 100_000 + b"]" * 100_000,
                                     b'{"a":' * 100_000 + b"1" + b"}" * 100_000], ids=["arrays", "objects"])
def test_json_nested_past_the_decoders_depth_is_a_400(tiny_server, nesting):
    """A body nested deeper than Python's JSON decoder recurses is bad input, not a server error."""
    url = tiny_server.url + "/v1/audio/speech"
    resp = httpx.post(url, content=nesting, headers={"content-type": "application/json"}, timeout=60)
    assert "nested" in openai_error(resp, 400)["message"]
    assert httpx.post(url, json={"input": "Still speaking.", "voice": "af_heart", "response_format": "pcm"},
                      timeout=60).status_code == 200


def requests_by_status(url: str) -> dict[str, float]:
    """kokoro_requests_total for the speech route, by its status label."""
    counts = {}
    for line in httpx.get(url + "/metrics").text.splitlines():
        if line.startswith('kokoro_requests_total{route="/v1/audio/speech",status="'):
            counts[line.split('status="', 1)[1].split('"', 1)[0]] = float(line.split()[-1])
    return counts


def test_a_client_leaving_mid_body_is_logged_as_gone_not_as_a_server_error(tiny_server):
    """A client that promises a longer body than it sends and hangs up: one access-log line saying
    it disconnected, no traceback, and no 5xx in /metrics."""
    url = tiny_server.url
    before = requests_by_status(url)
    request_id = f"req_left_mid_body_{os.getpid()}"
    with socket.create_connection(("127.0.0.1", tiny_server.port), timeout=10) as raw:
        raw.sendall(b"POST /v1/audio/speech HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                    b"X-Request-Id: " + request_id.encode() + b"\r\nContent-Length: 100000\r\n\r\n"
                    b'{"input": "This body stops short')
    # The access line is written once the request has ended: wait for it, not for a fixed time.
    deadline = time.monotonic() + 60
    while request_id not in tiny_server.log_path.read_text(errors="replace") and time.monotonic() < deadline:
        time.sleep(0.1)
    log = tiny_server.log_path.read_text(errors="replace")
    lines = [line for line in log.splitlines() if request_id in line]
    assert len(lines) == 1, log[-3000:]
    record = json.loads(lines[0][lines[0].index("{"):])
    assert record["outcome"] == "disconnected" and record["status"] < 500, record
    assert "Traceback" not in log and "unhandled error" not in log, log[-3000:]
    after = requests_by_status(url)
    assert after.get("disconnected", 0) == before.get("disconnected", 0) + 1, (before, after)
    assert not any(status.startswith("5") and n > before.get(status, 0) for status, n in after.items()), after


def test_phonemize_then_generate_from_phonemes_speaks_what_the_text_would(tiny_server):
    """Kokoro-FastAPI's phoneme endpoints: /dev/phonemize's phonemes, sent back to
    /dev/generate_from_phonemes, are the very ids the text makes, so the audio is as long."""
    text = "Phonemes come back as they went. A second sentence makes a second chunk of the text."
    phonemized = httpx.post(tiny_server.url + "/dev/phonemize", json={"text": text}, timeout=60)
    assert phonemized.status_code == 200, phonemized.text
    phonemes, tokens = phonemized.json()["phonemes"], phonemized.json()["tokens"]
    assert phonemes.startswith("fˈOn") and phonemes.endswith("tˈɛkst.") and len(tokens) >= len(phonemes.split()) and all(isinstance(t, int) for t in tokens)
    spoken = httpx.post(tiny_server.url + "/dev/generate_from_phonemes", timeout=60,
                        json={"phonemes": phonemes, "voice": "af_heart"})
    assert spoken.status_code == 200 and spoken.headers["content-type"] == "audio/wav"  # Kokoro-FastAPI's default
    from_text = httpx.post(tiny_server.url + "/v1/audio/speech", timeout=60,
                           json={"input": text, "voice": "af_heart", "response_format": "wav", "stream": False})
    assert decode(spoken.content, "wav")[0] == decode(from_text.content, "wav")[0] > 1.0
    mp3 = httpx.post(tiny_server.url + "/dev/generate_from_phonemes", timeout=60,
                     json={"phonemes": "həlˈO wˈɜɹld.", "voice": "af_sky", "response_format": "mp3", "stream": False})
    assert mp3.status_code == 200 and mp3.headers["content-type"] == "audio/mpeg" and decode(mp3.content, "mp3")[0] > 0.2


BAD_PHONEME_BODIES = [
    ("/dev/generate_from_phonemes", {"phonemes": "həlˈO 42"}, "phonemes"),  # digits are no phonemes
    ("/dev/generate_from_phonemes", {"phonemes": "   "}, "phonemes"),
    ("/dev/generate_from_phonemes", {"phonemes": "həlˈO", "voice": "no_such_voice"}, "voice"),
    ("/dev/generate_from_phonemes", {"phonemes": "həlˈO", "input": "Hello."}, "input"),
    ("/dev/phonemize", {"text": "Hello.", "language": "xx"}, "language"),
    ("/dev/phonemize", {"text": ""}, "text"),
]


@pytest.mark.parametrize("path,body,param", BAD_PHONEME_BODIES, ids=[f"{p}-{i}" for i, (_, _, p) in enumerate(BAD_PHONEME_BODIES)])
def test_phoneme_endpoints_answer_bad_bodies_in_the_openai_shape(tiny_server, path, body, param):
    error = openai_error(httpx.post(tiny_server.url + path, json=body, timeout=60), 400, param)
    if param == "phonemes" and body["phonemes"].strip():
        assert "'4'" in error["message"] and "/dev/phonemize" in error["message"], error


def test_sse_matches_plain_audio(tiny_server):
    body = {"input": "Streaming events carry the same audio.", "voice": "af_bella(2)+af_sky(1)", "response_format": "pcm"}
    plain = httpx.post(tiny_server.url + "/v1/audio/speech", json=body, timeout=60).content
    resp = httpx.post(tiny_server.url + "/v1/audio/speech", json={**body, "stream_format": "sse"}, timeout=60)
    events = [json.loads(block[len("data: "):]) for block in resp.text.split("\n\n") if block.startswith("data: ")]
    assert events[-1]["type"] == "speech.audio.done" and {e["type"] for e in events[:-1]} == {"speech.audio.delta"}
    audio = b"".join(base64.b64decode(e["audio"]) for e in events[:-1])
    assert len(audio) == len(plain) > 0
    usage = events[-1]["usage"]
    assert usage["output_tokens"] == round(len(audio) / 2 / 600) and usage["input_tokens"] > 0


def test_captioned_speech(tiny_server):
    resp = httpx.post(tiny_server.url + "/v1/audio/speech/captioned", timeout=60, json={
        "input": "Captions come with times.", "voice": "af_heart", "response_format": "wav", "stream": False})
    body = resp.json()
    seconds = decode(base64.b64decode(body["audio"]), "wav")[0]
    words = body["timestamps"]
    assert [w["word"].strip(".").lower() for w in words] == ["captions", "come", "with", "times"]
    assert [(w["input_start"], w["input_end"]) for w in words] == [(0, 8), (9, 13), (14, 18), (19, 24)]
    assert all(0 <= w["start_time"] <= w["end_time"] <= seconds + 1e-3 for w in words)
    assert [w["start_time"] for w in words] == sorted(w["start_time"] for w in words)


@pytest.mark.parametrize("voice, text, words, phonemes", [
    ("zf_xiaobei", "你好，世界。我们用Kokoro说话。", ["你好", "世界", "我们", "用", "Kokoro", "说话"], "ni↓xau↓, ʂɨ↘ʨje↘."),
    ("jf_alpha", "こんにちは、世界。", ["こんにちは", "世界"], "koɲɲiʨiβa, sekai."),
])
def test_mandarin_and_japanese_voices_speak_their_language_with_word_captions(tiny_server, voice, text, words,
                                                                              phonemes):
    """The voice's first letter picks the language (z, j), as for every other voice."""
    resp = httpx.post(tiny_server.url + "/v1/audio/speech/captioned", timeout=60, json={
        "input": text, "voice": voice, "response_format": "wav", "stream": False})
    assert resp.status_code == 200, resp.text
    body = resp.json()
    seconds = decode(base64.b64decode(body["audio"]), "wav")[0]
    assert seconds > 0.3 * len(words)
    assert [w["word"] for w in body["timestamps"]] == words
    assert [text[w["input_start"]:w["input_end"]] for w in body["timestamps"]] == words  # each word where it is
    assert all(0 <= w["start_time"] < w["end_time"] <= seconds + 1e-3 for w in body["timestamps"])
    phonemized = httpx.post(tiny_server.url + "/dev/phonemize", json={"text": text, "language": voice[0]}, timeout=60)
    assert phonemized.status_code == 200 and phonemized.json()["phonemes"].startswith(phonemes), phonemized.text


# --- real weights: audio, timing, capacity, disconnects ------------------------------------------

@pytest.fixture(scope="module")
def say_seconds(tmp_path_factory, real_weights):
    """Length of SAY_TEXT as `kokoro-fleet say` synthesizes it: the reference for every format."""
    out = tmp_path_factory.mktemp("say") / "say.wav"
    subprocess.run([sys.executable, "-m", "cli.main", "say", SAY_TEXT, "-o", str(out), "--weights", "offline"],
                   cwd=ROOT, check=True, capture_output=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    with wave.open(str(out)) as w:
        return w.getnframes() / w.getframerate()


SAY_TEXT = "The quick brown fox jumps over the lazy dog, and then it rests."


@pytest.mark.slow
@pytest.mark.parametrize("fmt", FORMATS)
def test_every_format_matches_say(real_server, say_seconds, fmt):
    client = openai.OpenAI(base_url=real_server.url + "/v1", api_key="none", max_retries=3, timeout=120)
    whole = client.audio.speech.create(model="tts-1", voice="af_heart", input=SAY_TEXT, response_format=fmt,
                                       extra_body={"stream": False})
    assert int(whole.response.headers["content-length"]) == len(whole.content)
    with client.audio.speech.with_streaming_response.create(model="kokoro", voice="af_heart", input=SAY_TEXT,
                                                            response_format=fmt) as resp:
        assert resp.headers["content-type"] == CONTENT_TYPES[fmt]
        streamed = b"".join(resp.iter_bytes())
    for body in (whole.content, streamed):
        seconds, rate, channels = decode(body, fmt)
        assert channels == 1 and rate == (48000 if fmt == "opus" else SR)
        assert seconds == pytest.approx(say_seconds, rel=0.05), (fmt, seconds, say_seconds)
        assert seconds >= say_seconds * 0.995  # nothing lost at the end


def band_energy(samples, rate: int, low: float = 300.0, high: float = 3400.0) -> float:
    """Energy of the telephone band (300-3400 Hz) of a mono signal, per second."""
    spectrum = np.abs(np.fft.rfft(samples)) ** 2
    freqs = np.fft.rfftfreq(len(samples), 1 / rate)
    return float(spectrum[(freqs >= low) & (freqs <= high)].sum() / len(samples) / rate)


@pytest.mark.slow
def test_telephone_audio_keeps_the_speech_band(real_server, say_seconds):
    """Real speech as a phone line carries it: mu-law at 8 kHz (one byte a sample, as long as the
    say CLI's audio) holds the same energy in the 300-3400 Hz band as the 24 kHz PCM, within 1 dB:
    resampled, companded, nothing of the voice lost; the 16 kHz wideband PCM likewise."""
    body = {"model": "kokoro", "voice": "af_heart", "input": SAY_TEXT, "stream": False}
    with httpx.Client(base_url=real_server.url, timeout=300) as http:
        full = np.frombuffer(http.post("/v1/audio/speech", json={**body, "response_format": "pcm"}).content, "<i2")
        phone = http.post("/v1/audio/speech", json={**body, "response_format": "mulaw"})
        wide = http.post("/v1/audio/speech", json={**body, "response_format": "pcm", "sample_rate": 16000})
    assert phone.headers["content-type"] == "audio/PCMU"
    assert len(phone.content) / 8000 == pytest.approx(say_seconds, rel=0.05)
    with av.open(io.BytesIO(phone.content), format="mulaw", options={"sample_rate": "8000"}) as container:
        heard = np.concatenate([f.to_ndarray().reshape(-1) for f in container.decode(audio=0)])
    wideband = np.frombuffer(wide.content, "<i2")
    assert len(heard) == round(len(full) / 3) and len(wideband) == round(len(full) * 2 / 3)
    reference = band_energy(full / 32768, SR)
    for samples, rate in ((heard / 32768, 8000), (wideband / 32768, 16000)):
        assert abs(10 * np.log10(band_energy(samples, rate) / reference)) < 1.0, rate


@pytest.mark.slow
def test_first_audio_early_in_every_paragraph(real_server):
    """Each paragraph's first audio byte arrives once its first chunk is synthesized, while the rest
    is still being synthesized: at that moment the replica has completed fewer of the paragraph's
    chunks (inferences, /metrics) than it completes in all. A server that held the audio until the
    paragraph was done fails that in every paragraph, on any machine. The share of the response's
    time the first audio took is printed as a figure."""
    url = real_server.url
    figures = []
    with httpx.Client(base_url=url, timeout=300) as http:
        for paragraph in PARAGRAPHS:
            jobs_before = metric(url, "kokoro_replica_jobs_total")
            t0 = time.perf_counter()
            first = jobs_at_first = None
            with http.stream("POST", "/v1/audio/speech",
                             json={"input": paragraph, "voice": "af_heart", "response_format": "pcm"}) as resp:
                assert resp.status_code == 200
                for chunk in resp.iter_raw():
                    if chunk and first is None:
                        first = time.perf_counter() - t0
                        jobs_at_first = metric(url, "kokoro_replica_jobs_total") - jobs_before
            total = time.perf_counter() - t0
            jobs = metric(url, "kokoro_replica_jobs_total") - jobs_before
            figures.append({"ttfa_share": round(first / total, 2), "ttfa_s": round(first, 2), "e2e_s": round(total, 2),
                            "chunks_done_at_first_audio": jobs_at_first, "chunks": jobs})
    print("\nper paragraph: " + ", ".join(f"{f['ttfa_share']:.2f} ({f['ttfa_s']:.2f}/{f['e2e_s']:.2f} s, "
                                          f"{f['chunks_done_at_first_audio']:g} of {f['chunks']:g} chunks)"
                                          for f in figures))
    assert all(f["chunks"] >= 2 for f in figures), figures  # each paragraph spans chunks: the test can tell
    assert all(f["chunks_done_at_first_audio"] < f["chunks"] for f in figures), figures


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_rate(pid: int, window: float = 1.0) -> float:
    """CPU seconds per wall second the process uses over the next `window` seconds."""
    before = cpu_seconds(pid)
    time.sleep(window)
    return (cpu_seconds(pid) - before) / window


@pytest.mark.slow
def test_disconnect_frees_the_replica_within_one_chunk(real_server):
    """Drop a long streamed request after its first chunk: /metrics shows the replica idle and the
    slot free once the chunk in flight ends, no chunk starts after the drop, and the process is
    really idle then (its CPU time stops growing: no inference left running behind the metrics)."""
    long_text = " ".join(PARAGRAPHS)
    url, pid = real_server.url, real_server.proc.pid
    with httpx.Client(base_url=url, timeout=300) as http:
        t0, cpu0 = time.perf_counter(), cpu_seconds(pid)
        # mp3: the first chunk's bytes fit the socket buffers, so the server moves straight on to
        # the next chunk (a large pcm chunk would leave it waiting in send when we drop).
        with http.stream("POST", "/v1/audio/speech",
                         json={"input": long_text, "voice": "af_heart", "response_format": "mp3"}) as resp:
            chunks = resp.iter_raw()  # kept: a discarded iter_raw() closes the response
            next(chunk for chunk in chunks if chunk)
            first_chunk_s = time.perf_counter() - t0
            # What synthesizing costs this process on this (possibly shared) machine right now.
            busy_rate = (cpu_seconds(pid) - cpu0) / first_chunk_s
            # Leave while the second chunk is being synthesized: the case that must stop within one chunk.
            while metric(url, "kokoro_replica_busy") != 1 and time.perf_counter() - t0 < 10 * first_chunk_s:
                time.sleep(0.02)
            assert metric(url, "kokoro_replica_busy") == 1, "the second chunk never started"
            jobs_at_drop = metric(url, "kokoro_replica_jobs_total")
    dropped = time.perf_counter()
    # The chunk in flight holds at most 510 phonemes; the first one (timed above) at least a few.
    # 20x the first chunk's time bounds one chunk's synthesis generously on a busy machine.
    one_chunk_bound = 20 * first_chunk_s + 2
    while time.perf_counter() - dropped < one_chunk_bound:
        if metric(url, "kokoro_replica_busy") == 0 and metric(url, "kokoro_admitted_requests") == 0:
            break
        time.sleep(0.05)
    metrics_idle_after = time.perf_counter() - dropped
    assert metric(url, "kokoro_replica_busy") == 0 and metric(url, "kokoro_admitted_requests") == 0
    # /metrics saying idle must mean idle: the process's CPU use drops far below its synthesizing rate.
    idle_rate = cpu_rate(pid)
    assert idle_rate < 0.25 * busy_rate, (
        f"the server still uses {idle_rate:.2f} CPU s/s (synthesizing: {busy_rate:.2f}) after /metrics said idle "
        f"{metrics_idle_after:.1f} s after the drop: an inference is running that the metrics do not show")
    # At most the chunk in flight at the drop finishes; none starts afterwards.
    jobs_after = metric(url, "kokoro_replica_jobs_total")
    assert jobs_after - jobs_at_drop <= 1, (jobs_at_drop, jobs_after, metrics_idle_after)
    assert metric(url, "kokoro_client_disconnects_total") >= 1
    ok = httpx.post(url + "/v1/audio/speech", json={"input": "Still here.", "voice": "af_heart", "response_format": "pcm"},
                    timeout=120)
    assert ok.status_code == 200 and len(ok.content) > SR  # more than half a second of audio


@pytest.mark.slow
def test_capacity_503_is_retried_by_the_openai_client(real_server):
    """This server admits one request at a time: a second gets 503 with Retry-After and
    retry-after-ms; the official client waits as told and succeeds once the first is done."""
    url = real_server.url
    holder = httpx.Client(base_url=url, timeout=300)
    stream = holder.stream("POST", "/v1/audio/speech",
                           json={"input": PARAGRAPHS[0] + " " + PARAGRAPHS[1], "voice": "af_heart", "response_format": "pcm"})
    resp = stream.__enter__()
    try:
        chunks = resp.iter_raw()  # one iterator throughout: closing an iter_raw() closes the response
        next(chunk for chunk in chunks if chunk)  # admitted and speaking
        refused = httpx.post(url + "/v1/audio/speech", json={"input": "Me too.", "voice": "af_heart"})
        error = openai_error(refused, 503)
        assert error["code"] == "overloaded"
        assert int(refused.headers["retry-after"]) >= 1 and int(refused.headers["retry-after-ms"]) >= 1

        result: dict = {}

        def call() -> None:
            client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=20, timeout=120)
            result["audio"] = client.audio.speech.create(model="tts-1", voice="alloy", input="Me too.",
                                                         response_format="pcm").content
        caller = threading.Thread(target=call)
        caller.start()
        for _ in chunks:  # the first request runs to its end
            pass
    finally:
        stream.__exit__(None, None, None)
        holder.close()
    caller.join(180)
    assert len(result.get("audio", b"")) > SR // 2, "the retried request did not succeed"
    assert metric(url, "kokoro_rejected_total") >= 2  # our probe and at least one of the client's tries


LIVE_TEXT = "The quick brown fox jumps over the lazy dog. Then it rests in the shade of an old tree."


@pytest.mark.slow
def test_live_session_speaks_text_streamed_word_by_word(real_server):
    """WS /v1/audio/speech/live on the real weights, fed a word at a time as a language model
    writes: the first sentence is heard before the second has been written, the words come back
    timed in order, and the whole is as long as the same text spoken over HTTP (within 10%: the
    live session speaks sentence by sentence, HTTP in its own chunks)."""
    from websockets.sync.client import connect

    with httpx.Client(base_url=real_server.url, timeout=300) as http:
        whole = http.post("/v1/audio/speech", json={"input": LIVE_TEXT, "voice": "af_heart", "response_format": "pcm",
                                                    "stream": False}).content
    first, second = LIVE_TEXT.split(". ")
    audio, events = bytearray(), []
    url = real_server.url.replace("http://", "ws://") + "/v1/audio/speech/live"
    with connect(url, open_timeout=30) as ws:
        ws.send(json.dumps({"type": "start", "voice": "af_heart", "response_format": "pcm"}))
        for word in (first + ". " + second.split()[0]).split(" "):
            ws.send(json.dumps({"type": "text", "text": word + " "}))
        heard_early = ws.recv(timeout=120)  # "started", then the first sentence's audio or words
        while not isinstance(heard_early, bytes):
            events.append(json.loads(heard_early))
            heard_early = ws.recv(timeout=120)
        audio += heard_early
        for word in second.split()[1:]:
            ws.send(json.dumps({"type": "text", "text": word + " "}))
        ws.send(json.dumps({"type": "end"}))
        while not events or events[-1]["type"] != "done":
            message = ws.recv(timeout=120)
            if isinstance(message, bytes):
                audio += message
            else:
                events.append(json.loads(message))
    assert [e["type"] for e in events if e["type"] == "error"] == []
    words = [w for e in events if e["type"] == "words" for w in e["words"]]
    assert [w["word"].strip(".") for w in words] == LIVE_TEXT.replace(".", "").split()
    starts = [w["start_time"] for w in words]
    assert starts == sorted(starts) and starts[-1] < len(audio) / 2 / SR
    pcm = np.frombuffer(bytes(audio), "<i2") / 32768
    assert len(pcm) / SR == pytest.approx(len(whole) / 2 / SR, rel=0.10)
    assert np.sqrt(np.mean(pcm ** 2)) > 0.01  # speech, not silence


def test_a_client_that_stops_reading_is_cut_off_and_its_place_freed(tmp_path):
    """A client that keeps its connection open but takes no more bytes (it stopped reading; a phone
    that left the network looks the same to the server) would hold its request's place until TCP
    gives up. With KOKORO_SEND_TIMEOUT_SECONDS=2 the server ends the stream once a send has waited
    that long: the place frees, /metrics counts a stall, and the connection closes without the
    chunked stream's last chunk, so the client can tell that its audio was cut. A client that reads
    is served as before."""
    server = ServerProcess(tmp_path, "stall", KOKORO_ENGINE="sim", KOKORO_WEIGHTS="tiny", KOKORO_SIM_CHUNK_MS="1",
                           KOKORO_SIM_PHONEME_MS="0.05", KOKORO_MAX_REQUESTS="1",
                           KOKORO_SEND_TIMEOUT_SECONDS="2").start(ready_timeout=READY_DEADLINE_S)
    try:
        text = " ".join(PARAGRAPHS)[:4000]  # minutes of audio: megabytes of pcm, more than the socket buffers hold
        body = json.dumps({"input": text, "voice": "af_heart", "response_format": "pcm"}).encode()
        stalled = socket.socket()
        stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        stalled.connect(("127.0.0.1", server.port))
        stalled.sendall(b"POST /v1/audio/speech HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
                        b"Content-Length: %d\r\n\r\n" % len(body) + body)
        assert stalled.recv(64).startswith(b"HTTP/1.1 200")
        stopped_reading = time.monotonic()
        time.sleep(1.0)
        assert metric(server.url, "kokoro_admitted_requests") == 1  # held while the client reads nothing
        full = httpx.post(server.url + "/v1/audio/speech", timeout=30,
                          json={"input": "Full.", "voice": "af_heart", "response_format": "pcm"})
        assert full.status_code == 503  # its one place is taken

        deadline = time.monotonic() + 30
        while metric(server.url, "kokoro_admitted_requests") != 0 and time.monotonic() < deadline:
            time.sleep(0.2)
        freed_after = time.monotonic() - stopped_reading
        assert metric(server.url, "kokoro_admitted_requests") == 0, "the stalled request still holds its place"
        assert metric(server.url, "kokoro_client_stalls_total") == 1
        ok = httpx.post(server.url + "/v1/audio/speech", timeout=30,
                        json={"input": "Served again.", "voice": "af_heart", "response_format": "pcm"})
        assert ok.status_code == 200 and len(ok.content) > 0

        stalled.settimeout(10)
        received = b""
        while chunk := stalled.recv(1 << 16):  # what was already on its way, then the server's close
            received += chunk
        stalled.close()
        assert not received.endswith(b"\r\n0\r\n\r\n"), "the stream ended as if complete"
        print(f"\nstalled client: place freed {freed_after:.1f} s after it stopped reading; "
              f"{len(received) / 1e6:.2f} MB of pcm had reached it")
    finally:
        server.stop()
    log = server.log_path.read_text(errors="replace")
    assert "Traceback" not in log, log[-6000:]
    # One access line says how it ended, written once its audio was counted (the request's
    # generators are closed before the line is logged, not whenever they are collected).
    (line,) = [json.loads(line.split("kokoro_fleet.access: ", 1)[1]) for line in log.splitlines()
               if "kokoro_fleet.access: {" in line and '"stalled"' in line]
    assert line["status"] == 200 and line["audio_s"] > 0, line


def _client_text_frame(text: str) -> bytes:
    """One masked WebSocket text frame, as a client sends it (RFC 6455 5.2), for a raw-socket client."""
    data, mask = text.encode(), os.urandom(4)
    size = bytes([0x80 | len(data)]) if len(data) < 126 else bytes([0x80 | 126]) + len(data).to_bytes(2, "big")
    return bytes([0x81]) + size + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(data))


def test_a_live_session_whose_client_stops_reading_ends_and_frees_its_place(tmp_path):
    """The live socket, same case: a client that sends a long reply and takes none of the audio.
    Its session held its place for all of the 100 s watched before KOKORO_SEND_TIMEOUT_SECONDS
    reached the live socket; with it at 2 s the session ends (outcome `stalled`), the place frees,
    and the stall is counted."""
    server = ServerProcess(tmp_path, "live-stall", KOKORO_ENGINE="sim", KOKORO_WEIGHTS="tiny", KOKORO_SIM_CHUNK_MS="1",
                           KOKORO_SIM_PHONEME_MS="0.05", KOKORO_MAX_REQUESTS="1",
                           KOKORO_SEND_TIMEOUT_SECONDS="2").start(ready_timeout=READY_DEADLINE_S)
    try:
        stalled = socket.socket()
        stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        stalled.connect(("127.0.0.1", server.port))
        stalled.sendall(b"GET /v1/audio/speech/live HTTP/1.1\r\nHost: test\r\nUpgrade: websocket\r\n"
                        b"Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
                        b"Sec-WebSocket-Version: 13\r\n\r\n")
        assert stalled.recv(64).startswith(b"HTTP/1.1 101")
        stalled.sendall(_client_text_frame(json.dumps({"type": "start", "voice": "af_heart", "response_format": "pcm"})))
        reply = " ".join(f"Sentence {i} of a long reply that nobody listens to." for i in range(100))
        for at in range(0, len(reply), 100):
            stalled.sendall(_client_text_frame(json.dumps({"type": "text", "text": reply[at:at + 100]})))
        stalled.sendall(_client_text_frame(json.dumps({"type": "end"})))
        stopped_reading = time.monotonic()
        time.sleep(0.5)
        assert metric(server.url, "kokoro_live_sessions") == 1
        deadline = stopped_reading + 30
        while metric(server.url, "kokoro_live_sessions") != 0 and time.monotonic() < deadline:
            time.sleep(0.2)
        ended_after = time.monotonic() - stopped_reading
        assert metric(server.url, "kokoro_live_sessions") == 0, "the stalled session is still open"
        assert metric(server.url, "kokoro_admitted_requests") == 0 and metric(server.url, "kokoro_client_stalls_total") == 1
        ok = httpx.post(server.url + "/v1/audio/speech", timeout=30,
                        json={"input": "Served again.", "voice": "af_heart", "response_format": "pcm"})
        assert ok.status_code == 200
        stalled.close()
        print(f"\nstalled live session ended {ended_after:.1f} s after its client stopped reading")
    finally:
        server.stop()
    log = server.log_path.read_text(errors="replace")
    assert "Traceback" not in log and "never retrieved" not in log, log[-6000:]
    (line,) = [json.loads(line.split("kokoro_fleet.access: ", 1)[1]) for line in log.splitlines()
               if "kokoro_fleet.access: {" in line and '"WEBSOCKET"' in line]
    assert line["outcome"] == "stalled" and line["audio_s"] > 0, line
