"""The playground page at `/`, in a real browser against a real server.

Debian's `chromium` (Makefile's APT_PACKAGES) driven by Playwright's Python package (the dev extra;
never its own browser downloads), against `kokoro-fleet serve` in its own process: the tiny random
weights as a two-worker fleet on its embedded Redis (as `make serve` runs on a 2-core machine), and
the real offline weights on one worker (marked slow). Each test opens a fresh page and records its
console errors and every URL it requested. Screenshots land in test-artifacts/ (git-ignored).

The page's own figures are what the tests read: the playback position it derives from its
AudioContext's clock (`#position[data-seconds]`), the index of the highlighted word
(`#transcript[data-current-word]`, of `data-words` timed words), the measured first audio
(`#ttfa[data-seconds]`); in Live mode also the sentence latency
(`#latency[data-last][data-max][data-count]`) and the words written but not yet heard
(`#ahead[data-words]`). For Live, a script the page loads first (LIVE_PROBES) records what the
page's WebSocket sent, when its first audio frame came, and which AudioBufferSourceNodes are
still to play, so a test can tell audio stopped from audio merely no longer counted. "Your voice"
(a voice fitted to a sample) records from Chromium's fake microphone, which plays made-up speech;
its probes record each job state the page shows and the multipart form it sends.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import fnmatch
import io
import json
import os
import re
import socket
import time
import tomllib
import wave
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient
from playwright.sync_api import Page, WebSocket, expect
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import connect

from api.app import create_app
from loadtest.dispatch import FleetProcess
from api.settings import Settings
from chromium import launch_chromium
from voice_samples import speechlike, wav_file

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "test-artifacts"
TEXT = "The quick brown fox jumps over the lazy dog. Then it sleeps in the warm afternoon sun."
# Read otherwise than written: "twelve dollars and ninety-nine cents" for "$12.99", "doctor" for "Dr."
TYPED = "Your total is $12.99, Dr. Smith said. Then it sleeps in the warm afternoon sun."
PLAY_TIMEOUT_S = 180  # real weights on one thread of a shared 2-core CPU


# --- servers and the browser ---------------------------------------------------------------------

@pytest.fixture(scope="module")
def tiny_fleet(tmp_path_factory):
    # Two admitted requests fill the fleet, so the 503 test needs to hold only two streams; the
    # queued-audio bound is lifted so those two may be long enough to stay open.
    # A voices directory and a budget of a few candidates let "Your voice" fit in seconds.
    fleet = FleetProcess(2, weights="tiny", log_dir=tmp_path_factory.mktemp("playground"), name="tiny",
                         env={"KOKORO_THREADS": "1", "KOKORO_QUEUE_MAX_REQUESTS": "2",
                              "KOKORO_QUEUE_MAX_AUDIO_SECONDS": "100000",
                              "KOKORO_VOICES_DIR": str(tmp_path_factory.mktemp("voices")),
                              "KOKORO_VOICE_FIT_CANDIDATES": "3"})
    fleet.start(ready_timeout=240)
    yield fleet
    fleet.stop()
    assert "Traceback" not in fleet.log(), fleet.log()


@pytest.fixture(scope="module")
def offline_server(tmp_path_factory, real_weights):  # real_weights: the bundle converted and cached first
    server = FleetProcess(1, weights="offline", log_dir=tmp_path_factory.mktemp("playground"), name="offline",
                          env={"KOKORO_THREADS": "1"})
    server.start(ready_timeout=300)
    yield server
    server.stop()
    assert "Traceback" not in server.log(), server.log()


@pytest.fixture(scope="module", params=["tiny", pytest.param("offline", marks=pytest.mark.slow)])
def server(request) -> FleetProcess:
    return request.getfixturevalue({"tiny": "tiny_fleet", "offline": "offline_server"}[request.param])


@pytest.fixture(scope="module")
def microphone_browser(playwright, tmp_path_factory):
    """Chromium whose microphone plays a file: 14 s of made-up speech, then silence."""
    speech = tmp_path_factory.mktemp("microphone") / "speech.wav"
    speech.write_bytes(wav_file(speechlike(14, 110, seed=1)))
    browser = launch_chromium(playwright, "--use-fake-ui-for-media-stream", "--use-fake-device-for-media-stream",
                              f"--use-file-for-fake-audio-capture={speech}%noloop")
    yield browser
    browser.close()


@dataclass
class Socket:
    """A WebSocket the page opened: the frames it received, text as text, binary as its length."""

    url: str
    received: list[str | int] = field(default_factory=list)
    closed: bool = False

    def events(self, kind: str | None = None) -> list[dict]:
        events = [json.loads(f) for f in self.received if isinstance(f, str)]
        return [e for e in events if kind is None or e["type"] == kind]


@dataclass
class Tab:
    page: Page
    url: str
    console_errors: list[str] = field(default_factory=list)
    requested: list[str] = field(default_factory=list)
    sockets: list[Socket] = field(default_factory=list)

    def on_socket(self, ws: WebSocket) -> None:
        socket = Socket(ws.url)
        self.sockets.append(socket)
        ws.on("framereceived", lambda payload: socket.received.append(
            payload if isinstance(payload, str) else len(payload)))
        ws.on("close", lambda _: setattr(socket, "closed", True))

    def figures(self) -> dict:
        """The page's own playback figures, read in one round trip."""
        return self.page.evaluate("""() => ({
            position: Number(document.querySelector('#position').dataset.seconds),
            word: Number(document.querySelector('#transcript').dataset.currentWord ?? -1),
            words: Number(document.querySelector('#transcript').dataset.words ?? 0),
            status: document.querySelector('#status').textContent,
            streaming: document.querySelector('#rtf').dataset.value === undefined,
            ahead: Number(document.querySelector('#ahead').dataset.words ?? -1),
        })""")

    def sent(self) -> list[tuple[float, dict]]:
        """What the page's live sockets sent, in order: (performance.now() in ms, message)."""
        return [(t, json.loads(data)) for t, data in self.page.evaluate("() => window.__sent")]


@pytest.fixture
def tab(browser, server):
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    t = Tab(page, server.url)
    page.on("console", lambda m: t.console_errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: t.console_errors.append(f"uncaught: {e}"))
    page.on("request", lambda r: t.requested.append(r.url))
    page.on("websocket", t.on_socket)
    yield t
    context.close()


def open_playground(tab: Tab):
    response = tab.page.goto(tab.url + "/")
    assert response is not None and response.status == 200
    # voices loaded (the mixer's first select is filled) and the fleet panel has its first figures
    tab.page.wait_for_function("() => document.querySelectorAll('#mix-voice-1 option').length > 1")
    expect(tab.page.locator("#fleet-replicas")).not_to_have_text("–")
    return response


def unlabelled_controls(page: Page) -> list[str]:
    """Visible controls a screen reader would announce without a name."""
    return page.evaluate("""() => [...document.querySelectorAll('input, select, textarea, button')]
        .filter(el => !el.closest('[hidden]'))
        .filter(el => !(el.labels && el.labels.length) && !el.getAttribute('aria-label') && !el.textContent.trim())
        .map(el => el.id || el.outerHTML)""")


def api_error(url: str, body: dict) -> dict:
    response = httpx.post(url + "/v1/audio/speech", json=body, timeout=60)
    assert response.status_code >= 400, response.text
    return response.json()["error"]


def wait_done(tab: Tab, shot: Path | None = None) -> list[dict]:
    """Sample the page's figures until it says Done. (or time runs out); the samples. With `shot`,
    a screenshot there once half the words have been spoken."""
    samples = []
    deadline = time.monotonic() + PLAY_TIMEOUT_S
    while time.monotonic() < deadline:
        f = tab.figures()
        samples.append(f)
        if shot is not None and not shot.exists() and f["words"] and f["word"] >= f["words"] // 2:
            ARTIFACTS.mkdir(exist_ok=True)
            tab.page.screenshot(path=str(shot), full_page=True)
        if f["status"] == "Done.":
            break
        time.sleep(0.1)
    return samples


def start_and_time(tab: Tab, button: str) -> float:
    """Click `button` (Play, Speak live) and return the page's own first-audio figure, checked
    against the time since the click."""
    clicked = time.monotonic()
    tab.page.click(button)
    tab.page.wait_for_function("() => document.querySelector('#ttfa').dataset.seconds !== undefined",
                               timeout=PLAY_TIMEOUT_S * 1000)
    ttfa = float(tab.page.locator("#ttfa").get_attribute("data-seconds"))
    assert 0 < ttfa <= time.monotonic() - clicked
    return ttfa


# --- in process: the route and its setting ----------------------------------------------------------

def test_setting_turns_the_page_off():
    on = TestClient(create_app(Settings().replace(playground=True)))
    page = on.get("/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "default-src 'self'" in page.headers["content-security-policy"]
    for asset in re.findall(r'(?:src|href)="(/playground/[^"]+)"', page.text):
        assert on.get(asset).status_code == 200, asset
    assert on.get("/playground/fleet").json()["ready"] is False  # no model yet: nothing pretends otherwise
    for web in ("/web", "/web/"):  # Kokoro-FastAPI's web player address leads to the page
        moved = on.get(web, follow_redirects=False)
        assert moved.status_code == 307 and moved.headers["location"] == "/", web
    off = TestClient(create_app(Settings().replace(playground=False)))
    for path in ("/", "/web", "/playground/app.js", "/playground/config", "/playground/fleet"):
        response = off.get(path)
        assert response.status_code == 404 and set(response.json()) == {"error"}, path


def test_config_says_when_a_key_is_needed_and_whether_voices_can_be_fitted(tmp_path):
    config = TestClient(create_app(Settings().replace(api_keys="k1", max_input_chars=123))).get("/playground/config")
    assert config.json()["api_key_required"] is True and config.json()["max_input_chars"] == 123
    plain = TestClient(create_app(Settings())).get("/playground/config").json()
    assert plain["api_key_required"] is False and plain["voice_fitting"] is False  # no voices directory
    fitting = TestClient(create_app(Settings().replace(voices_dir=str(tmp_path)))).get("/playground/config").json()
    assert fitting["voice_fitting"] is True
    off = TestClient(create_app(Settings().replace(voices_dir=str(tmp_path), voice_fit_jobs=0))).get("/playground/config")
    assert off.json()["voice_fitting"] is False


def test_the_package_ships_every_page_file():
    patterns = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["api.playground"]
    shipped = [p.name for p in (ROOT / "api/playground").iterdir() if p.is_file() and p.suffix != ".py"]
    assert shipped and all(any(fnmatch.fnmatch(name, pat) for pat in patterns) for name in shipped), shipped


# --- in the browser ------------------------------------------------------------------------------

def test_page_loads_offline_with_labels_and_no_console_errors(tab, server):
    response = open_playground(tab)
    assert "default-src 'self'" in response.headers["content-security-policy"]
    assert tab.console_errors == []
    outside = [u for u in tab.requested if not (u.startswith(server.url + "/") or u.startswith("data:"))]
    assert outside == [], "the page must load nothing from outside its server"
    # every control has a label a screen reader announces
    assert unlabelled_controls(tab.page) == []
    # voices grouped by language and gender: every voice the API lists, under its gender's group
    voices = {v["id"]: v for v in httpx.get(server.url + "/v1/audio/voices").json()["voices"]}
    options = tab.page.evaluate("""() => [...document.querySelectorAll('#mix-voice-1 option')]
        .map(o => [o.value, o.parentElement.label])""")
    assert sorted(v for v, _ in options) == sorted(voices)
    groups: dict[str, set[str]] = {}
    for voice, label in options:
        assert label.endswith(" · " + voices[voice]["gender"]), (voice, label)
        groups.setdefault(label, set()).add(voices[voice]["language"])
    assert all(len(languages) == 1 for languages in groups.values()), groups
    # "Your voice" is offered where the server fits voices (the tiny fleet has a voices directory)
    if server.env.get("KOKORO_VOICES_DIR"):
        expect(tab.page.locator("#voice-unavailable")).to_be_hidden()
        expect(tab.page.locator("#fit")).to_be_enabled()
    else:
        expect(tab.page.locator("#voice-unavailable")).to_contain_text("KOKORO_VOICES_DIR")
        expect(tab.page.locator("#fit")).to_be_disabled()
    limit = httpx.get(server.url + "/playground/config").json()["max_input_chars"]
    text = tab.page.locator("#text").input_value()
    expect(tab.page.locator("#char-count")).to_have_text(f"{len(text)} / {limit} characters")


def marks(words: list[dict], text: str) -> list[str]:
    """What the transcript's marks show for `words` (timestamps of `text`): the typed slice each was
    read from, one mark for the words read from one slice; a word without a slice as spoken."""
    shown, last_end = [], None
    for w in words:
        start, end = w.get("input_start"), w.get("input_end")
        if start is None:
            shown.append(w["word"])
        elif last_end is None or start >= last_end:
            shown.append(text[start:end])
            last_end = end
    return shown


# Loaded before the page's script: every time a mark lights up, which word is current and the mark's
# text and place in the typed text.
HIGHLIGHT_PROBE = """
window.__lit = [];
new MutationObserver((records) => {
  for (const r of records) {
    const el = r.target;
    if (!el.classList || !el.classList.contains('current') || (r.oldValue || '').includes('current')) continue;
    window.__lit.push({ word: Number(document.querySelector('#transcript').dataset.currentWord), text: el.textContent,
                        start: Number(el.dataset.inputStart), end: Number(el.dataset.inputEnd) });
  }
}).observe(document, { subtree: true, attributes: true, attributeFilter: ['class'], attributeOldValue: true });
"""


def test_play_streams_and_highlights_the_text_as_typed(tab, server, request):
    """Play streams the captioned endpoint; while "twelve dollars and ninety-nine cents" plays, the
    "$12.99" typed is what lights up: every highlight is the slice of the typed text its word was
    read from."""
    page = tab.page
    page.add_init_script(HIGHLIGHT_PROBE)
    open_playground(tab)
    page.fill("#text", TYPED)
    # the mixer: af_bella weighted 2, af_sky 1
    page.select_option("#mix-voice-1", "af_bella")
    page.click("#add-voice")
    page.select_option("#mix-voice-2", "af_sky")
    page.fill("#mix-weight-1", "2")
    expect(page.locator("#voice-spec")).to_have_value("af_bella(2)+af_sky(1)")

    ttfa = start_and_time(tab, "#play")
    print(f"\n{server.name}: first audio {ttfa * 1000:.0f} ms after Play (the page's own measure)")
    shot = ARTIFACTS / f"playground-{server.name}.png"
    shot.unlink(missing_ok=True)
    samples = wait_done(tab, shot)
    assert samples[-1]["status"] == "Done.", samples[-1]
    assert tab.console_errors == []

    positions = [f["position"] for f in samples]
    total = float(re.search(r"/ ([\d.]+) s", page.locator("#position").inner_text()).group(1))
    assert positions == sorted(positions), "the playback position never goes back"
    assert positions[-1] >= total - 0.1 > 1.0, (positions[-1], total)  # it played to the end
    assert len(set(round(p, 2) for p in positions if 0 < p < total)) >= 5, "it advanced while playing"
    if server.name == "offline":  # the tiny model may finish a short text within the first piece's lead
        assert any(f["position"] > 0 and f["streaming"] for f in samples), "audio started before the stream ended"

    words = [f["word"] for f in samples]
    assert words == sorted(words), "the highlight only moves forward"
    assert len(set(words) - {-1}) >= 3 and words[-1] == samples[-1]["words"] - 1, words
    shown = page.locator("#transcript .word").all_inner_texts()
    captioned = httpx.post(server.url + "/v1/audio/speech/captioned", timeout=PLAY_TIMEOUT_S, json={
        "input": TYPED, "voice": "af_bella(2)+af_sky(1)", "response_format": "pcm", "stream": False}).json()
    timed = captioned["timestamps"]
    assert shown == marks(timed, TYPED) and "$12.99" in shown and "Dr." in shown
    assert page.locator("#transcript").inner_text() == TYPED  # the text as typed, every word of it marked
    assert [w["word"] for w in timed][3:8] == ["twelve", "dollars", "and", "ninety-nine", "cents"]
    lit = page.evaluate("() => window.__lit")
    for light in lit:
        word = timed[light["word"]]
        assert light["text"] == TYPED[light["start"]:light["end"]] == TYPED[word["input_start"]:word["input_end"]]
    assert "$12.99" in [light["text"] for light in lit if 3 <= light["word"] <= 7], lit

    rtf = float(page.locator("#rtf").get_attribute("data-value"))
    assert rtf > 0
    print(f"{server.name}: {total:.1f} s of audio, real-time factor {rtf:.2f}; screenshot {shot}")
    assert shot is not None and shot.stat().st_size > 10_000

    # Download: the same request as one wav file, as long as what was played
    page.select_option("#format", "wav")
    with page.expect_download(timeout=PLAY_TIMEOUT_S * 1000) as download:
        page.click("#download")
    assert download.value.suggested_filename == "speech.wav"
    with wave.open(io.BytesIO(Path(download.value.path()).read_bytes())) as w:
        seconds = w.getnframes() / w.getframerate()
    assert abs(seconds - total) < 0.06, (seconds, total)


def test_telephone_rate_plays_and_downloads_at_8khz(browser, tiny_fleet):
    """The sample-rate choice: Play asks for 8 kHz PCM and the page plays it at its length (Web Audio
    resamples the 8 kHz buffers); Download in mu-law gives one byte per 8 kHz sample of that length."""
    context = browser.new_context()
    page = context.new_page()
    bodies: list[dict] = []
    page.on("request", lambda r: bodies.append(r.post_data_json) if r.url.endswith("/v1/audio/speech/captioned")
            or r.url.endswith("/v1/audio/speech") else None)
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    try:
        page.goto(tiny_fleet.url + "/")
        page.wait_for_function("() => document.querySelectorAll('#mix-voice-1 option').length > 1")
        page.fill("#text", TEXT)
        page.select_option("#rate", "8000")
        page.click("#play")
        expect(page.locator("#status")).to_have_text("Done.", timeout=PLAY_TIMEOUT_S * 1000)
        assert bodies[-1]["sample_rate"] == 8000 and bodies[-1]["response_format"] == "pcm"
        total = float(re.search(r"/ ([\d.]+) s", page.locator("#position").inner_text()).group(1))
        full = httpx.post(tiny_fleet.url + "/v1/audio/speech", timeout=60, json={
            "input": TEXT, "voice": page.locator("#voice-spec").input_value(), "response_format": "pcm",
            "stream": False})
        assert total == pytest.approx(len(full.content) / 2 / 24000, abs=0.06)  # the same speech, not 3x faster

        page.select_option("#format", "mulaw")
        with page.expect_download(timeout=PLAY_TIMEOUT_S * 1000) as download:
            page.click("#download")
        assert download.value.suggested_filename == "speech.mulaw"
        assert bodies[-1]["sample_rate"] == 8000 and bodies[-1]["response_format"] == "mulaw"
        size = Path(download.value.path()).stat().st_size
        assert size == pytest.approx(total * 8000, abs=0.06 * 8000)
        assert errors == []
    finally:
        context.close()


def test_errors_show_the_servers_message(tab, server):
    page = tab.page
    open_playground(tab)
    page.fill("#text", "")
    page.click("#play")
    expected = api_error(server.url, {"input": "", "voice": "af_heart"})
    expect(page.locator("#error")).to_contain_text(expected["message"])
    expect(page.locator("#error")).to_contain_text("Error 400")
    expect(page.locator("#text")).to_have_attribute("aria-invalid", "true")
    expect(page.locator("#char-count")).to_have_text(re.compile(r"^0 / \d+ characters$"))

    page.fill("#text", "Hello there.")
    page.fill("#voice-spec", "zz_nobody")
    page.click("#play")
    expected = api_error(server.url, {"input": "Hello there.", "voice": "zz_nobody"})
    expect(page.locator("#error")).to_contain_text(expected["message"])
    expect(page.locator("#voice-spec")).to_have_attribute("aria-invalid", "true")


def test_show_what_is_read_previews_the_words_and_phonemes(tab, server):
    """"Show what is read": the text as the server reads it, piece by piece (a code digit by digit,
    a time in words), each with its phonemes, in the first voice's language; greyed with a note
    once the text changes."""
    page = tab.page
    open_playground(tab)
    text = "Your code is 482913. Call me at 9:15 p.m."
    page.fill("#text", text)
    page.click("#preview")
    expect(page.locator("#preview-chunks li .read").first).to_contain_text("four eight two, nine one three")
    expected = httpx.post(server.url + "/dev/phonemize", json={"text": text, "language": "a"}, timeout=30).json()
    assert page.locator("#preview-chunks .read").all_inner_texts() == [c["text"] for c in expected["chunks"]]
    assert page.locator("#preview-chunks .phonemes").all_inner_texts() == [c["phonemes"] for c in expected["chunks"]]
    expect(page.locator("#preview-stale")).to_be_hidden()

    page.fill("#text", "Tengo 25 años.")
    expect(page.locator("#preview-stale")).to_be_visible()
    expect(page.locator("#preview-panel")).to_have_class(re.compile(r"\bstale\b"))
    page.fill("#voice-spec", "ef_dora(2)+af_heart(1)")
    with page.expect_request("**/dev/phonemize") as sent:
        page.click("#preview")
    assert sent.value.post_data_json == {"text": "Tengo 25 años.", "language": "e"}
    expect(page.locator("#preview-stale")).to_be_hidden()
    expect(page.locator("#preview-chunks .read")).to_have_text(["Tengo 25 años."])  # Spanish: espeak-ng reads it
    assert tab.console_errors == []


def test_fleet_panel_shows_the_replicas(tab, server):
    open_playground(tab)
    expect(tab.page.locator("#fleet-replicas")).to_have_text(str(server.workers))
    busy, idle = (int(tab.page.locator(f"#fleet-{k}").inner_text()) for k in ("busy", "idle"))
    assert busy + idle == server.workers
    expect(tab.page.locator("#fleet-bars span")).to_have_count(server.workers)
    figures = httpx.get(server.url + "/playground/fleet").json()
    assert figures["replicas"] == server.workers and figures["ready"] is True
    assert figures["mode"] == ("fleet" if server.workers > 1 else "single")


def test_a_full_fleet_shows_503_with_its_retry_time(browser, tiny_fleet):
    """Two streams the test holds open fill the fleet (KOKORO_QUEUE_MAX_REQUESTS=2); the page's
    request, sent from the keyboard, gets the 503 and shows when to retry; the panel counts it."""
    context = browser.new_context()
    page = context.new_page()
    try:
        page.goto(tiny_fleet.url + "/")
        page.wait_for_function("() => document.querySelectorAll('#mix-voice-1 option').length > 1")
        # the panel's first figures may come after the voices: until then it shows a dash
        expect(page.locator("#fleet-refused")).to_have_text(re.compile(r"^\d+$"), timeout=10_000)
        refused_before = int(page.locator("#fleet-refused").inner_text())
        long_text = " ".join(["Every request here waits its turn in the shared queue."] * 70)
        # A small receive buffer: the server's sends block long before its ~14 MB of PCM are out.
        transport = httpx.HTTPTransport(socket_options=[(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)])
        with httpx.Client(timeout=120, transport=transport) as http, contextlib.ExitStack() as held:
            readers = []  # kept: a dropped iterator would close its response
            for _ in range(2):
                response = held.enter_context(http.stream("POST", tiny_fleet.url + "/v1/audio/speech", json={
                    "input": long_text, "voice": "af_heart", "response_format": "pcm"}))
                assert response.status_code == 200
                readers.append(response.iter_raw())
                next(readers[-1])  # admitted and streaming; then left unread
            page.focus("#text")
            page.keyboard.press("Control+Enter")
            error = page.locator("#error")
            expect(error).to_contain_text("Error 503")
            expect(error).to_contain_text(re.compile(r"Retry after [\d.]+ s\."))
            expect(page.locator("#play")).to_be_enabled()
        expect(page.locator("#fleet-refused")).to_have_text(re.compile(r"^\d+$"), timeout=10_000)
        page.wait_for_function(f"() => Number(document.querySelector('#fleet-refused').textContent) > {refused_before}",
                               timeout=15_000)
    finally:
        context.close()


# --- Live mode: WS /v1/audio/speech/live -----------------------------------------------------------

# Loaded before the page's own script: records every message a WebSocket sends (with its time),
# the arrival of the first binary frame, and the AudioBufferSourceNodes started and not yet ended
# (stopped or played out), with the context time each would end at.
LIVE_PROBES = """
window.__sent = [];
window.__firstAudioAt = null;
const NativeSocket = window.WebSocket;
window.WebSocket = class extends NativeSocket {
  constructor(...args) {
    super(...args);
    this.addEventListener('message', (e) => {
      if (typeof e.data !== 'string' && window.__firstAudioAt === null) window.__firstAudioAt = performance.now();
    });
  }
  send(data) {
    window.__sent.push([performance.now(), data]);
    return super.send(data);
  }
};
window.__playing = new Set();
const start = AudioBufferSourceNode.prototype.start;
AudioBufferSourceNode.prototype.start = function (when, ...rest) {
  this.__end = Math.max(when || 0, this.context.currentTime) + this.buffer.duration;
  window.__playing.add(this);
  this.addEventListener('ended', () => window.__playing.delete(this));
  return start.call(this, when, ...rest);
};
window.__scheduledAhead = () => {
  let end = 0, ctx = null;
  for (const node of window.__playing) { end = Math.max(end, node.__end); ctx = node.context; }
  return ctx ? end - ctx.currentTime : 0;
};
"""
LIVE_PATH = "/v1/audio/speech/live"
WORDS_PER_SECOND = 8  # the page's default writing speed


def live_url(url: str) -> str:
    return "ws" + url.removeprefix("http") + LIVE_PATH


def test_live_speaks_text_written_word_by_word(tab, server):
    page = tab.page
    page.add_init_script(LIVE_PROBES)
    response = open_playground(tab)
    assert "connect-src" not in response.headers["content-security-policy"]  # default-src 'self' lets ws:// in
    page.fill("#text", TEXT)
    # the mode switch is a radio group: from the keyboard, an arrow key moves to Live
    page.focus("#mode-request")
    page.keyboard.press("ArrowRight")
    expect(page.locator("#mode-live")).to_be_checked()
    expect(page.locator("#live-actions")).to_be_visible()
    expect(page.locator("#request-actions")).to_be_hidden()
    assert unlabelled_controls(page) == []
    expect(page.locator("#wps")).to_have_value(str(WORDS_PER_SECOND))
    voice = page.locator("#voice-spec").input_value()

    ttfa = start_and_time(tab, "#speak-live")
    shot = ARTIFACTS / f"playground-live-{server.name}.png"
    shot.unlink(missing_ok=True)
    samples = wait_done(tab, shot)
    assert samples[-1]["status"] == "Done.", samples[-1]
    assert tab.console_errors == []
    outside = [u for u in tab.requested if not (u.startswith(server.url + "/") or u.startswith("data:"))]
    assert outside == []
    assert [s.url for s in tab.sockets] == [live_url(server.url)]  # same origin, one session

    # what the page sent: `start`, the text a word at a time at the writing speed, `end`
    sent = tab.sent()
    messages = [m for _, m in sent]
    assert messages[0] == {"type": "start", "voice": voice, "speed": 1, "response_format": "pcm", "timestamps": True}
    assert messages[-1] == {"type": "end"}
    texts = messages[1:-1]
    assert all(m["type"] == "text" and len(m["text"].split()) == 1 for m in texts), texts
    assert "".join(m["text"] for m in texts) == TEXT and len(texts) == len(TEXT.split())
    writing = sent[-2][0] - sent[1][0]  # ms from the first word to the last
    assert writing >= 0.9 * 1000 * (len(texts) - 1) / WORDS_PER_SECOND, writing
    # first audio counts from the first word written to the first audio frame
    first_audio_at = page.evaluate("() => window.__firstAudioAt")
    assert ttfa == pytest.approx((first_audio_at - sent[1][0]) / 1000, abs=0.05)

    # what the server sent: started, audio, the words, done, then a normal close
    socket = tab.sockets[0]
    assert socket.events()[0]["type"] == "started" and socket.events()[0]["sample_rate"] == 24000
    assert socket.events()[-1]["type"] == "done" and socket.closed
    assert sum(1 for f in socket.received if isinstance(f, int)) >= 2, "audio came as binary frames"
    spoken = [w for e in socket.events("words") for w in e["words"]]
    assert page.locator("#transcript .word").all_inner_texts() == marks(spoken, TEXT) and len(spoken) >= 10

    positions = [f["position"] for f in samples]
    total = float(re.search(r"/ ([\d.]+) s", page.locator("#position").inner_text()).group(1))
    assert positions == sorted(positions), "the playback position never goes back"
    assert positions[-1] >= total - 0.1 > 1.0, (positions[-1], total)
    assert len(set(round(p, 2) for p in positions if 0 < p < total)) >= 5, "it advanced while playing"
    words = [f["word"] for f in samples]
    assert words == sorted(words), "the highlight only moves forward"
    assert len(set(words) - {-1}) >= 3 and words[-1] == len(spoken) - 1, words

    # the live figures: each of the two sentences timed, and the text ran ahead of the speech
    latency = page.locator("#latency")
    assert latency.get_attribute("data-count") == "2"
    assert 0 < float(latency.get_attribute("data-last")) <= float(latency.get_attribute("data-max"))
    assert max(f["ahead"] for f in samples) >= 3 and samples[-1]["ahead"] == 0, [f["ahead"] for f in samples]
    print(f"\n{server.name} live: first audio {ttfa * 1000:.0f} ms after the first word, sentence latency max "
          f"{float(latency.get_attribute('data-max')) * 1000:.0f} ms; screenshot {shot}")
    assert shot is not None and shot.stat().st_size > 10_000


def test_live_interrupt_stops_the_audio_at_once(tab, server):
    """Interrupt sends `clear` and stops the scheduled sources then and there (not when they would
    have played out); the position holds, the writing stops, the server answers `cleared`. The
    session goes on with "Say next", and a new run works after it."""
    page = tab.page
    page.add_init_script(LIVE_PROBES)
    open_playground(tab)
    page.fill("#text", " ".join([TEXT] * 4))
    page.check("#mode-live")
    page.click("#speak-live")
    # well over a second of audio scheduled past the clock while some is heard: there is audio to cut
    page.wait_for_function("""() => window.__scheduledAhead() > 2
        && Number(document.querySelector('#position').dataset.seconds) > 0.3""", timeout=PLAY_TIMEOUT_S * 1000)
    page.click("#interrupt")
    page.wait_for_function("() => window.__playing.size === 0", timeout=1000)  # stopped, not played out
    expect(page.locator("#status")).to_have_attribute("data-cleared", "1", timeout=10_000)
    expect(page.locator("#status")).to_contain_text("Interrupted")
    held = []
    for _ in range(8):  # a second's worth of the page's ticks
        time.sleep(0.12)
        held.append(tab.figures())
    assert len({f["position"] for f in held}) == 1 and len({f["word"] for f in held}) == 1, held
    assert held[-1]["ahead"] == 0
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"playground-live-interrupted-{server.name}.png"), full_page=True)
    assert page.locator("#transcript .word.dropped").count() > 0, "words of audio never heard are struck out"

    socket = tab.sockets[0]
    kinds = [m["type"] for _, m in tab.sent()]
    assert kinds[-1] == "clear" and "end" not in kinds, kinds  # the writing stopped with the interrupt
    assert "cleared" in [e["type"] for e in socket.events()] and not socket.closed

    # the session is open: what to say next is written and spoken, then it ends
    page.fill("#next-text", "Sorry, go on.")
    page.click("#add-next")
    samples = wait_done(tab)
    assert samples[-1]["status"] == "Done.", samples[-1]
    after = [m for _, m in tab.sent()][len(kinds):]
    assert after == [{"type": "text", "text": t} for t in ("Sorry, ", "go ", "on.")] + [{"type": "end"}], after
    assert samples[-1]["position"] > held[-1]["position"] and samples[-1]["word"] > held[-1]["word"]
    assert page.locator("#transcript .word.current").inner_text() == "on"

    # a new run, on a new socket
    page.fill("#text", "A new run starts here.")
    page.click("#speak-live")
    samples = wait_done(tab)
    assert samples[-1]["status"] == "Done.", samples[-1]
    assert page.locator("#transcript .word").all_inner_texts()[:3] == ["A", "new", "run"]
    assert len(tab.sockets) == 2 and all(s.closed for s in tab.sockets)
    assert tab.console_errors == []


def live_error(url: str, start: dict) -> tuple[int, dict]:
    """The close code and the `error` event the server answers a `start` with."""
    with connect(live_url(url), open_timeout=30) as ws:
        ws.send(json.dumps(start))
        event = json.loads(ws.recv(timeout=30))
        with pytest.raises(ConnectionClosed) as closed:
            ws.recv(timeout=30)
    assert event["type"] == "error", event
    return closed.value.rcvd.code, event["error"]


def test_live_error_shows_the_servers_message(tab, server):
    page = tab.page
    open_playground(tab)
    page.check("#mode-live")
    page.fill("#voice-spec", "zz_nobody")
    page.click("#speak-live")
    code, error = live_error(server.url, {"type": "start", "voice": "zz_nobody", "response_format": "pcm"})
    assert code == 1008
    expect(page.locator("#error")).to_contain_text(error["message"])
    expect(page.locator("#error")).to_contain_text("Closed 1008 · policy violation")
    expect(page.locator("#voice-spec")).to_have_attribute("aria-invalid", "true")
    expect(page.locator("#status")).to_have_text("Failed.")
    expect(page.locator("#speak-live")).to_be_enabled()
    expect(page.locator("#live-stop")).to_be_disabled()
    assert tab.console_errors == []


def test_api_key_field_when_keys_are_configured(browser, tmp_path):
    """With KOKORO_API_KEYS set, the page asks for a key, shows the 401's message for a wrong one,
    then loads the voices and plays with the right one, in Request and in Live mode; "Your voice"
    shows the 403 of a key not allowed to fit voices (none is: KOKORO_VOICE_MANAGER_KEYS is empty)."""
    (tmp_path / "voices").mkdir()
    server = FleetProcess(1, weights="tiny", log_dir=tmp_path, name="keys",
                          env={"KOKORO_THREADS": "1", "KOKORO_API_KEYS": "first-key,second-key",
                               "KOKORO_VOICES_DIR": str(tmp_path / "voices")})
    server.start(ready_timeout=240)
    context = browser.new_context()
    try:
        page = context.new_page()
        page.goto(server.url + "/")
        expect(page.locator("#api-key-field")).to_be_visible()
        expect(page.locator("#status")).to_have_text("Enter the API key to load the voices.")
        page.fill("#api-key", "wrong-key")
        page.locator("#api-key").dispatch_event("change")
        expected = httpx.get(server.url + "/v1/audio/voices", headers={"Authorization": "Bearer wrong-key"})
        expect(page.locator("#error")).to_contain_text(expected.json()["error"]["message"])
        page.fill("#api-key", "second-key")
        page.locator("#api-key").dispatch_event("change")
        page.wait_for_function("() => document.querySelectorAll('#mix-voice-1 option').length > 1")
        expect(page.locator("#error")).to_be_hidden()
        page.fill("#text", "Keys work.")
        page.click("#play")
        page.wait_for_function("() => document.querySelector('#status').textContent === 'Done.'",
                               timeout=PLAY_TIMEOUT_S * 1000)
        assert float(page.locator("#ttfa").get_attribute("data-seconds")) > 0

        sample = wav_file(speechlike(10, 110, seed=1))
        page.set_input_files("#voice-file", files=[{"name": "sample.wav", "mimeType": "audio/wav", "buffer": sample}])
        page.click("#fit")
        refused = httpx.post(server.url + "/v1/audio/voices", headers={"Authorization": "Bearer second-key"},
                             files={"file": ("sample.wav", sample, "audio/wav")}, data={"name": "af_mine"})
        assert refused.status_code == 403
        expect(page.locator("#voice-error")).to_contain_text("Error 403 · permission_denied")
        expect(page.locator("#voice-error")).to_contain_text(refused.json()["error"]["message"])
        expect(page.locator("#api-key")).to_have_attribute("aria-invalid", "true")

        # Live: a page's WebSocket cannot set the Authorization header, so the page offers the key as
        # a subprotocol; a wrong key is refused with the 401's own message.
        page.check("#mode-live")
        page.fill("#wps", "20")
        page.click("#speak-live")
        page.wait_for_function("() => document.querySelector('#ttfa').dataset.seconds !== undefined",
                               timeout=PLAY_TIMEOUT_S * 1000)
        page.click("#live-stop")
        page.fill("#api-key", "wrong-key")
        page.click("#speak-live")
        expect(page.locator("#error")).to_contain_text(
            "The server refused the live connection: " + expected.json()["error"]["message"])
        expect(page.locator("#speak-live")).to_be_enabled()
        with pytest.raises(InvalidStatus) as refused:
            connect(live_url(server.url), open_timeout=30)
        assert refused.value.response.status_code == 401
        with connect(live_url(server.url), additional_headers={"Authorization": "Bearer second-key"}) as ws:
            ws.send(json.dumps({"type": "start", "voice": "af_heart"}))
            assert json.loads(ws.recv(timeout=30))["type"] == "started"
    finally:
        context.close()
        server.stop()


# --- Your voice: a voice fitted to a sample (POST /v1/audio/voices) ------------------------------------

# Loaded before the page's script: each state of the fitting job the page shows.
FIT_PROBE = """
window.__fit = [];
new MutationObserver(() => {
  const status = document.querySelector('#fit-status');
  const shown = { state: status.dataset.state, source: status.dataset.source, done: Number(status.dataset.done),
                  phase: document.querySelector('#fit-phase').dataset.phase,
                  best: document.querySelector('#fit-best').textContent, eta: document.querySelector('#fit-eta').textContent };
  const last = window.__fit.at(-1);
  if (!last || JSON.stringify(last) !== JSON.stringify(shown)) window.__fit.push(shown);
}).observe(document, { subtree: true, attributes: true, attributeFilter: ['data-state', 'data-done', 'data-phase'] });
"""
# Also loaded first: what the page's fetch calls send as multipart forms (Playwright does not show a
# request body holding a file), each file's bytes as base64.
FORM_PROBE = """
window.__forms = [];
const nativeFetch = window.fetch;
window.fetch = function (input, init) {
  if (init && init.body instanceof FormData) {
    const form = { url: String(input), fields: {} };
    window.__forms.push(form);
    for (const [name, value] of init.body.entries()) {
      if (typeof value === 'string') { form.fields[name] = value; continue; }
      const file = form.fields[name] = { filename: value.name, type: value.type };
      value.arrayBuffer().then((buffer) => {
        let binary = '';
        for (const byte of new Uint8Array(buffer)) binary += String.fromCharCode(byte);
        file.base64 = btoa(binary);
      });
    }
  }
  return nativeFetch.call(this, input, init);
};
"""
FIT_TIMEOUT_S = 180  # the tiny model, three candidates; the fitting process loads the model first


def test_your_voice_is_recorded_fitted_and_played_beside_the_sample(microphone_browser, tiny_fleet):
    """Record from the microphone (Chromium's fake one, playing made-up speech), fit: the page sends
    what MediaRecorder made (webm/opus) with the name and transcript, follows the job's events to
    its end, lists the voice in the picker and plays it saying the transcript's first sentence."""
    context = microphone_browser.new_context()
    page = context.new_page()
    page.add_init_script(FIT_PROBE)
    page.add_init_script(FORM_PROBE)
    errors: list[str] = []
    requested: list[tuple[str, str]] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("request", lambda r: requested.append((r.method, r.url.removeprefix(tiny_fleet.url))))
    try:
        page.goto(tiny_fleet.url + "/")
        page.wait_for_function("() => document.querySelectorAll('#mix-voice-1 option').length > 1")
        expect(page.locator("#voice-unavailable")).to_be_hidden()
        assert unlabelled_controls(page) == []
        page.click("#record")
        expect(page.locator("#record-stop")).to_be_enabled()
        page.wait_for_function("() => Number(document.querySelector('#record-time').dataset.seconds) >= 11",
                               timeout=30_000)
        page.click("#record-stop")
        expect(page.locator("#sample-audio")).to_have_attribute("src", re.compile(r"^blob:"))
        expect(page.locator("#sample-caption")).to_contain_text("recording.webm")
        page.fill("#voice-name", "af_recorded")
        page.fill("#voice-transcript", "My voice sounds like this. It is a second sentence.")
        page.click("#fit")
        page.wait_for_function("() => window.__forms.length === 1 && window.__forms[0].fields.file.base64")
        form = page.evaluate("() => window.__forms[0]")
        assert form["url"] == "/v1/audio/voices" and ("POST", "/v1/audio/voices") in requested
        assert form["fields"]["name"] == "af_recorded"
        assert form["fields"]["transcript"] == "My voice sounds like this. It is a second sentence."
        sample = form["fields"]["file"]
        assert sample["filename"] == "recording.webm" and sample["type"].startswith("audio/webm")
        recording = base64.b64decode(sample["base64"])
        assert recording[:4] == b"\x1a\x45\xdf\xa3" and len(recording) > 20_000  # Matroska/WebM, as recorded
        expect(page.locator("#fit-cancel")).to_be_enabled()

        expect(page.locator("#fit-status")).to_have_attribute("data-state", "succeeded", timeout=FIT_TIMEOUT_S * 1000)
        shown = page.evaluate("() => window.__fit")
        # the fit's own progress shown before its end (the phases the tiny model's few candidates
        # pass through within one of the events' half-second polls may not all show)
        assert any(s["state"] == "running" and s["phase"] not in ("queued", "running") for s in shown), shown
        assert shown[-1]["best"] != "–" and shown[-1]["eta"] == "–", shown
        assert all(s["source"] == "events" for s in shown), shown  # followed by its events, never polled
        job_id = next(u for m, u in requested if m == "GET" and u.endswith("/events")).split("/")[-2]
        assert ("GET", f"/v1/audio/voices/jobs/{job_id}") not in requested
        report = httpx.get(f"{tiny_fleet.url}/v1/audio/voices/jobs/{job_id}").json()["report"]
        expect(page.locator("#fit-done")).to_have_text(re.compile(r"^(\d+) / \1$"))
        expect(page.locator("#fit-progress")).to_have_js_property("position", 1)
        expect(page.locator("#fit-report")).to_contain_text(f"Similarity to your sample {report['similarity']:.3f}")
        expect(page.locator("#fit-report")).to_contain_text(f"the nearest stock voice, {report['nearest_stock_voice']}")

        # listed in the picker, and saying the transcript's first sentence beside the sample
        expect(page.locator("#mix-voice-1 option[value='af_recorded']")).to_have_count(1)
        expect(page.locator("#fitted-said")).to_have_text("Saying “My voice sounds like this.”")
        page.wait_for_function("() => document.querySelector('#fitted-audio').readyState >= 1")
        played = page.evaluate("() => document.querySelector('#fitted-audio').duration")
        spoken = httpx.post(tiny_fleet.url + "/v1/audio/speech", timeout=60, json={
            "input": "My voice sounds like this.", "voice": "af_recorded", "response_format": "pcm", "stream": False})
        assert played == pytest.approx(len(spoken.content) / 2 / 24000, abs=0.06)
        recorded = float(page.locator("#record-time").get_attribute("data-seconds"))
        page.wait_for_function("() => Number.isFinite(document.querySelector('#sample-audio').duration)")
        assert page.evaluate("() => document.querySelector('#sample-audio').duration") == pytest.approx(recorded, abs=1.2)
        assert page.locator("#sample-audio").is_visible() and page.locator("#fitted-audio").is_visible()
        ARTIFACTS.mkdir(exist_ok=True)
        page.locator("#voice-panel").screenshot(path=str(ARTIFACTS / "playground-your-voice.png"))
        page.click("#use-voice")
        expect(page.locator("#voice-spec")).to_have_value("af_recorded")
        assert errors == []
    finally:
        context.close()
        httpx.delete(tiny_fleet.url + "/v1/audio/voices/af_recorded")


def test_your_voice_shows_the_apis_errors_and_cancels(browser, tiny_fleet):
    """A sample too short and a name without its language letter show the 400's message at the
    field at fault; a machine whose fitting slot is taken, the 503 and when to retry. A fit
    cancelled, followed by polling when its event stream is refused, leaves no voice behind."""
    url = tiny_fleet.url
    voices_dir = Path(tiny_fleet.env["KOKORO_VOICES_DIR"])
    short, good = wav_file(speechlike(3, 120)), wav_file(speechlike(10, 110, seed=1))
    context = browser.new_context()
    page = context.new_page()
    page.add_init_script(FIT_PROBE)
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))  # the console lists each 400 and 503 itself

    def fit(sample: bytes, name: str) -> dict:
        page.set_input_files("#voice-file", files=[{"name": "sample.wav", "mimeType": "audio/wav", "buffer": sample}])
        page.fill("#voice-name", name)
        page.click("#fit")
        return httpx.post(url + "/v1/audio/voices", files={"file": ("sample.wav", sample, "audio/wav")},
                          data={"name": name}, timeout=60).json().get("error")

    try:
        page.goto(url + "/")
        page.wait_for_function("() => document.querySelectorAll('#mix-voice-1 option').length > 1")
        expected = fit(short, "af_short")
        expect(page.locator("#voice-error")).to_contain_text("Error 400 · sample_too_short")
        expect(page.locator("#voice-error")).to_contain_text(expected["message"])
        expect(page.locator("#voice-file")).to_have_attribute("aria-invalid", "true")
        expect(page.locator("#sample-audio")).to_have_attribute("src", re.compile(r"^blob:"))

        expected = fit(good, "mine")
        expect(page.locator("#voice-error")).to_contain_text("Error 400 · invalid_name")
        expect(page.locator("#voice-error")).to_contain_text(expected["message"])
        expect(page.locator("#voice-name")).to_have_attribute("aria-invalid", "true")
        expect(page.locator("#voice-file")).not_to_have_attribute("aria-invalid", "true")

        # the machine's one fitting slot taken (here by the test): 503, and when to retry
        (voices_dir / ".fit-jobs").mkdir(exist_ok=True)
        slot = os.open(voices_dir / ".fit-jobs" / "slot-0.lock", os.O_RDWR | os.O_CREAT)
        try:
            fcntl.flock(slot, fcntl.LOCK_EX)
            page.fill("#voice-name", "am_busy")
            page.click("#fit")
            expect(page.locator("#voice-error")).to_contain_text("Error 503")
            expect(page.locator("#voice-error")).to_contain_text(re.compile(r"retry in about \d+ s\. Retry after [\d.]+ s\."))
        finally:
            os.close(slot)
        expect(page.locator("#fit")).to_be_enabled()

        # the events refused: the page polls the job; Cancel deletes it and nothing is kept
        page.route("**/events", lambda route: route.abort())
        page.fill("#voice-name", "am_gone")
        page.click("#fit")
        expect(page.locator("#fit-status")).to_have_attribute("data-source", "polling", timeout=30_000)
        page.click("#fit-cancel")
        expect(page.locator("#fit-status")).to_have_attribute("data-state", "cancelled", timeout=60_000)
        expect(page.locator("#fit-status")).to_have_text("Cancelled: nothing was kept.")
        expect(page.locator("#fit")).to_be_enabled()
        assert "am_gone" not in [v["id"] for v in httpx.get(url + "/v1/audio/voices").json()["voices"]]
        assert not list(voices_dir.glob("*am_gone*"))
        assert errors == []
    finally:
        context.close()
