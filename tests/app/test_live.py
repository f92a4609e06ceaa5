"""Live speech over a WebSocket (api/live.py): a real Uvicorn server in a thread, in front of the
scripted service of test_api_app.py (one 0.4 s tone piece per sentence, 0.15 s of "synthesis"
each), driven by the `websockets` client as an agent or a phone bot would drive it."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import time

import av
import httpx
import pytest
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import connect
from starlette.websockets import WebSocketState

from api.app import create_app
from test_api_app import (PIECE_AUDIO_S, PIECE_SECONDS, SR, ScriptedService, ThreadServer, cancel_after_turns,
                          metric)
from worker.audio import SAMPLES_PER_FRAME
from api.settings import Settings

PIECE_BYTES = round(PIECE_AUDIO_S * SR) * 2  # one scripted piece as 16-bit PCM


@pytest.fixture(scope="module")
def service():
    return ScriptedService()


@pytest.fixture(scope="module")
def server(service, tmp_path_factory):
    settings = Settings().replace(max_requests=2, max_input_chars=500,
                                  download_dir=str(tmp_path_factory.mktemp("downloads")))
    with ThreadServer(create_app(settings, service=service)) as srv:
        yield srv


def live_url(server) -> str:
    return server.url.replace("http://", "ws://") + "/v1/audio/speech/live"


class Session:
    """A client's view of one session: every message received, audio bytes apart from events."""

    def __init__(self, ws):
        self.ws = ws
        self.audio = bytearray()
        self.events: list[dict] = []

    def send(self, **message) -> None:
        self.ws.send(json.dumps(message))

    def receive_until(self, kind: str, timeout: float = 10) -> dict:
        """Receive (collecting audio) until an event of this type; returns it."""
        deadline = time.monotonic() + timeout
        while True:
            message = self.ws.recv(timeout=max(0.01, deadline - time.monotonic()))
            if isinstance(message, bytes):
                self.audio += message
                continue
            event = json.loads(message)
            self.events.append(event)
            if event["type"] == kind:
                return event

    def receive_audio(self, timeout: float = 10) -> bytes:
        deadline = time.monotonic() + timeout
        while True:
            message = self.ws.recv(timeout=max(0.01, deadline - time.monotonic()))
            if isinstance(message, bytes):
                self.audio += message
                return message
            self.events.append(json.loads(message))

    def of(self, kind: str) -> list[dict]:
        return [e for e in self.events if e["type"] == kind]


@contextlib.contextmanager
def open_session(server, **start):
    with connect(live_url(server), open_timeout=10) as ws:
        session = Session(ws)
        session.send(type="start", **start)
        yield session


def test_text_in_pieces_audio_out_as_each_completes(server):
    with open_session(server, voice="af_heart", response_format="pcm") as session:
        started = session.receive_until("started")
        assert started["sample_rate"] == SR and started["response_format"] == "pcm"
        for token in ["One ", "two", " three. Four", " five."]:  # cut anywhere, as a model's tokens are
            session.send(type="text", text=token)
        # The first sentence is complete once " Four" shows it ended: its audio comes before any
        # more text is sent (the second one waits for what follows its period).
        first = session.receive_audio()
        assert len(first) == PIECE_BYTES
        session.send(type="text", text=" Six")
        session.send(type="end")
        done = session.receive_until("done")
        with pytest.raises(ConnectionClosed) as closed:
            session.ws.recv(timeout=5)
    assert closed.value.rcvd.code == 1000
    assert len(session.audio) == 3 * PIECE_BYTES  # "One two three." "Four five." "Six"
    words = [w for e in session.of("words") for w in e["words"]]
    assert [w["word"] for w in words] == ["One", "two", "three", "Four", "five", "Six"]
    # seconds from the session's first sample: the second piece starts where the first ended
    assert words[3]["start_time"] == pytest.approx(PIECE_AUDIO_S, abs=1e-3)
    assert words[5]["start_time"] == pytest.approx(2 * PIECE_AUDIO_S, abs=1e-3)
    frames = round(3 * PIECE_AUDIO_S * SR / SAMPLES_PER_FRAME)
    assert done["usage"]["output_tokens"] == frames and done["usage"]["input_tokens"] >= 0


def test_flush_speaks_an_unfinished_sentence_and_says_when_its_audio_is_out(server):
    with open_session(server, response_format="pcm", timestamps=False) as session:
        session.receive_until("started")
        session.send(type="text", text="A turn that ends without a period")
        session.send(type="flush")
        session.receive_until("flushed")
        assert len(session.audio) == PIECE_BYTES  # all of its audio came before `flushed`
        session.send(type="text", text="Another turn.")
        session.send(type="end")
        session.receive_until("done")
    assert len(session.audio) == 2 * PIECE_BYTES and not session.of("words")


def test_clear_stops_the_speech_in_flight_and_drops_the_rest(server, service):
    before = service.pieces_started
    with open_session(server, response_format="pcm") as session:
        session.receive_until("started")
        session.send(type="text", text=" ".join(f"Sentence {i}." for i in range(20)) + " ")
        session.receive_audio()  # speaking has begun
        session.send(type="clear")
        session.receive_until("cleared")
        spoken = len(session.audio)
        started = service.pieces_started
        # the piece in flight was the last of the dropped text: none starts after `cleared`
        time.sleep(3 * PIECE_SECONDS)
        assert service.pieces_started == started < before + 20
        session.send(type="text", text="After the interruption.")
        session.send(type="end")
        session.receive_until("done")
    assert len(session.audio) == spoken + PIECE_BYTES < 20 * PIECE_BYTES
    assert service.replica.overlaps == 0


def test_telephone_audio_mulaw_at_8khz(server):
    with open_session(server, response_format="mulaw") as session:
        assert session.receive_until("started")["sample_rate"] == 8000
        session.send(type="text", text="Your table is ready.")
        session.send(type="end")
        session.receive_until("done")
    assert len(session.audio) == round(PIECE_AUDIO_S * 8000)  # one byte a sample


def test_a_bad_message_is_an_error_and_the_session_goes_on(server):
    with open_session(server, response_format="pcm") as session:
        session.receive_until("started")
        session.ws.send("not json")
        assert session.receive_until("error")["error"]["code"] == "invalid_json"
        session.send(type="speak", text="x")
        error = session.receive_until("error")["error"]
        assert error["param"] == "type" and "'speak'" in error["message"]
        session.send(type="text", text="x" * 501)
        error = session.receive_until("error")["error"]
        assert error["param"] == "text" and "limit is 500" in error["message"]
        session.send(type="text", text="Still speaking.")
        session.send(type="end")
        session.send(type="text", text="Too late.")
        assert session.receive_until("error")["error"]["code"] == "session_ending"
        session.receive_until("done")
    assert len(session.audio) == PIECE_BYTES


@pytest.mark.parametrize("start, param", [
    ({"type": "text", "text": "no start"}, "type"),
    ({"type": "start", "voice": "xx_nobody"}, "voice"),
    ({"type": "start", "response_format": "opus", "sample_rate": 22050}, "sample_rate"),
    ({"type": "start", "speed": 9}, "speed"),
    ({"type": "start", "input": "hello"}, "input"),
])
def test_a_bad_start_is_an_error_then_a_policy_close(server, start, param):
    with connect(live_url(server), open_timeout=10) as ws:
        ws.send(json.dumps(start))
        event = json.loads(ws.recv(timeout=10))
        with pytest.raises(ConnectionClosed) as closed:
            ws.recv(timeout=5)
    assert event["type"] == "error" and event["error"]["param"] == param
    assert closed.value.rcvd.code == 1008


def test_a_full_server_refuses_the_upgrade_with_503_and_retry_after(server):
    long_text = ". ".join(["slow"] * 8)
    holders = []
    for _ in range(2):  # the process's two slots
        h = httpx.Client(base_url=server.url, timeout=30)
        cm = h.stream("POST", "/v1/audio/speech", json={"input": long_text, "response_format": "pcm"})
        holders.append((h, cm, cm.__enter__()))
    try:
        with pytest.raises(InvalidStatus) as refused:
            connect(live_url(server), open_timeout=10)
    finally:
        for h, cm, resp in holders:
            cm.__exit__(None, None, None)
            h.close()
    response = refused.value.response
    assert response.status_code == 503 and int(response.headers["Retry-After"]) >= 1
    assert json.loads(response.body)["error"]["code"] == "overloaded"


def test_sessions_free_their_slots_and_are_counted(server):
    with httpx.Client(base_url=server.url, timeout=30) as http:
        with open_session(server, response_format="pcm") as session:
            session.receive_until("started")
            session.send(type="text", text="Counted. ")
            session.receive_audio()
        deadline = time.monotonic() + 60
        while metric(http, "kokoro_admitted_requests") and time.monotonic() < deadline:
            time.sleep(0.02)
        assert metric(http, "kokoro_admitted_requests") == 0
        text = http.get("/metrics").text
    assert 'kokoro_requests_total{route="/v1/audio/speech/live",status="101"}' in text


def test_api_keys_guard_the_upgrade(service):
    app = create_app(Settings().replace(api_keys="agent:k1"), service=service)
    with ThreadServer(app) as srv:
        with pytest.raises(InvalidStatus) as refused:
            connect(live_url(srv), open_timeout=10)
        assert refused.value.response.status_code == 401
        assert json.loads(refused.value.response.body)["error"]["code"] == "invalid_api_key"
        with connect(live_url(srv), open_timeout=10, additional_headers={"Authorization": "Bearer k1"}) as ws:
            ws.send(json.dumps({"type": "start"}))
            assert json.loads(ws.recv(timeout=10))["type"] == "started"
        # A browser cannot set headers: it offers the key as a subprotocol, beside a plain one that
        # the server answers with (so the key is not echoed back).
        with pytest.raises(InvalidStatus) as wrong:
            connect(live_url(srv), open_timeout=10, subprotocols=["kokoro-live", "openai-insecure-api-key.k2"])
        assert wrong.value.response.status_code == 401
        with connect(live_url(srv), open_timeout=10,
                     subprotocols=["kokoro-live", "openai-insecure-api-key.k1"]) as ws:
            assert ws.subprotocol == "kokoro-live"
            ws.send(json.dumps({"type": "start"}))
            assert json.loads(ws.recv(timeout=10))["type"] == "started"
        counted = app.state.kokoro.metrics.key_requests
        deadline = time.monotonic() + 60  # the server records a session once it has closed
        while counted.get(("agent", "disconnected"), 0) < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert counted == {("agent", "disconnected"): 2}  # both sessions (left without `end`), by the key's name


@pytest.mark.parametrize("fmt", ["opus", "mp3", "wav"])
def test_a_cleared_stream_stays_one_decodable_file(server, fmt):
    """The encoder lives as long as the session: after a clear the audio goes on in the same file
    (one header, no torn packet), and FFmpeg decodes all that was sent."""
    with open_session(server, response_format=fmt, timestamps=False) as session:
        session.receive_until("started")
        session.send(type="text", text=" ".join(f"Sentence {i}." for i in range(10)) + " ")
        session.receive_audio()
        session.send(type="clear")
        session.receive_until("cleared")
        session.send(type="text", text="After the interruption.")
        session.send(type="end")
        done = session.receive_until("done")
    container = av.open(io.BytesIO(bytes(session.audio)))
    seconds = sum(frame.samples / frame.sample_rate for frame in container.decode(container.streams.audio[0]))
    sent_s = done["usage"]["output_tokens"] * SAMPLES_PER_FRAME / SR  # the server's count of what it sent
    assert abs(seconds - sent_s) < 0.1, (seconds, sent_s)  # mp3 adds its padding
    pieces = seconds / PIECE_AUDIO_S
    assert 2 <= round(pieces) < 10 and abs(pieces - round(pieces)) < 0.25, seconds


# --- the instrument: python -m loadtest live ----------------------------------------------------

def test_server_stall_counts_only_silence_the_server_caused():
    from loadtest.live_load import server_stall

    # plays 0-1, the next arrives at 1.5 with its text complete at 0.8: 0.5 s the server caused
    assert server_stall([(0.0, 1.0, 0.0), (1.5, 1.0, 0.8)]) == pytest.approx(0.5)
    # the same gap while the model was still writing (text complete at 1.4): only 0.1 s is ours
    assert server_stall([(0.0, 1.0, 0.0), (1.5, 1.0, 1.4)]) == pytest.approx(0.1)
    # audio that arrives ahead of the player never stalls it
    assert server_stall([(0.0, 1.0, 0.0), (0.5, 1.0, 0.4), (1.9, 0.5, 1.0)]) == 0.0


def test_loadtest_live_measures_the_servers_share(server):
    """Against the scripted service (0.15 s of synthesis a piece): every piece's audio comes at
    least one synthesis after its text was complete, and a word waits longer than its piece."""

    from loadtest.live_load import run_session, summarize_step

    text = "One two three. Four five six. Seven eight."
    session = asyncio.run(run_session(live_url(server), text, 40.0, "pcm", "af_heart"))
    assert session.errors == [] and session.audio_s == pytest.approx(3 * PIECE_AUDIO_S)
    assert len(session.piece_latencies) == 3 and len(session.word_latencies) == 8
    assert min(session.piece_latencies) >= 0.9 * PIECE_SECONDS
    assert max(session.word_latencies) > max(session.piece_latencies)
    step = summarize_step(1, [session], elapsed=2.0)
    assert step["completed"] == 1 and step["errors"] == 0 and step["audio_s_per_s"] == pytest.approx(0.6)


def test_loadtest_live_times_the_sentence_before_a_tool_pause(server):
    """With a tool pause after "One two three.", that sentence's audio comes `pause_ms` plus one
    synthesis after its last word; with `pause_ms` off, only once the writer resumes."""

    from loadtest.live_load import run_session, summarize_step

    text = "One two three. Four five six."
    settled = asyncio.run(run_session(live_url(server), text, 40.0, "pcm", "af_heart", tool_pause=1.0, pause_ms=100))
    waited = asyncio.run(run_session(live_url(server), text, 40.0, "pcm", "af_heart", tool_pause=1.0, pause_ms=None))
    assert settled.errors == waited.errors == [] and settled.pause_word == waited.pause_word == 2
    assert 0.1 + 0.9 * PIECE_SECONDS <= settled.after_pause_s < 1.0 <= waited.after_pause_s
    # the client's cut mirrors the server's: the piece was ready when the server settled it
    assert min(settled.piece_latencies) >= 0.9 * PIECE_SECONDS
    assert summarize_step(1, [settled], elapsed=2.0)["after_pause_p50_ms"] == pytest.approx(
        settled.after_pause_s * 1000, abs=0.1)


def test_clear_after_end_still_ends_the_session(server):
    # 30 pieces take the scripted replica 4.5 s, so the clear reaches the server long before the
    # last of them (one that comes after it is the next test's case)
    with open_session(server, response_format="pcm") as session:
        session.receive_until("started")
        session.send(type="text", text=" ".join(f"Sentence {i}." for i in range(30)))
        session.send(type="end")
        session.receive_audio()
        session.send(type="clear")
        session.receive_until("cleared")
        session.receive_until("done")
    assert len(session.audio) < 30 * PIECE_BYTES


class ClosingSocket:
    """A WebSocket double whose close frame is held until the test lets it go, to put a message in
    the moment between `done` and the close, which a real connection only hits under load. Like
    Starlette's, it refuses to send once the close is sent."""

    def __init__(self):
        self.incoming: asyncio.Queue = asyncio.Queue()
        self.sent: list = []
        self.closing, self.may_close = asyncio.Event(), asyncio.Event()
        self.closed = False
        self.client_state = self.application_state = WebSocketState.CONNECTED

    def deliver(self, **message) -> None:
        self.incoming.put_nowait({"type": "websocket.receive", "text": json.dumps(message)})

    async def receive(self) -> dict:
        return await self.incoming.get()

    async def send_text(self, data: str) -> None:
        self._refuse_after_close()
        self.sent.append(json.loads(data)["type"])

    async def send_bytes(self, data: bytes) -> None:
        self._refuse_after_close()
        self.sent.append("audio")

    async def close(self, code: int = 1000, reason: str | None = None) -> None:
        self._refuse_after_close()
        self.closing.set()
        await self.may_close.wait()
        self.closed = True
        self.sent.append(f"close {code}")

    def _refuse_after_close(self) -> None:
        if self.closed:
            raise RuntimeError('Cannot call "send" once a close message has been sent.')


def test_a_clear_that_comes_as_the_session_closes_is_dropped_not_answered(service):
    """Everything spoken and `done` sent: a `clear` now has nothing to clear, and the close goes
    on (it used to cancel the close, then fail sending `cleared` on the closed socket)."""
    from api.live import LiveSession
    from api.protocol import LiveStart

    async def scenario() -> tuple[LiveSession, ClosingSocket]:
        app = create_app(Settings().replace(max_requests=2), service=service)
        ws = ClosingSocket()
        session = LiveSession(app.state.kokoro, ws, LiveStart(type="start", timestamps=False), "live_test")
        running = asyncio.create_task(session.run())
        ws.deliver(type="text", text="Only sentence.")
        ws.deliver(type="end")
        await asyncio.wait_for(ws.closing.wait(), 10)
        ws.deliver(type="clear")
        for _ in range(20):  # let the receiving loop take the clear while the close is held
            await asyncio.sleep(0)
        ws.may_close.set()
        await asyncio.wait_for(running, 10)
        return session, ws

    session, ws = asyncio.run(scenario())
    assert ws.sent == ["started", "audio", "done", "close 1000"]
    assert session.outcome == "ok"


def test_player_course_splits_each_silence_by_cause():
    from loadtest.live_load import player_course, server_stall

    frames = [(0.0, 1.0, 0.0), (1.5, 1.0, 1.2), (2.0, 0.5, 1.9), (4.0, 1.0, 3.0)]
    assert player_course(frames) == [
        (0.0, 1.0, "playing"),
        (1.0, 1.2, "model"), (1.2, 1.5, "server"), (1.5, 2.5, "playing"),
        (2.5, 3.0, "playing"),                       # arrived at 2.0, while the player still had audio
        (3.0, 4.0, "server"), (4.0, 5.0, "playing"),  # text complete at 3.0, when the player ran dry
    ]
    assert server_stall(frames) == pytest.approx(0.3 + 1.0)


def test_loadtest_live_draws_the_sessions_timeline(server, tmp_path):

    from PIL import Image

    from loadtest.live_load import plot_timelines, run_session

    session = asyncio.run(run_session(live_url(server), "One two three. Four five six.", 40.0, "pcm", "af_heart"))
    assert session.errors == [] and len(session.frames) >= 2
    path = plot_timelines([(1, session), (2, session)], tmp_path / "live-timeline.png")
    with Image.open(path) as image:
        width, height = image.size
    assert width > 800 and height > 2 * 250  # one panel per step


def test_metrics_count_open_sessions_and_each_pieces_first_audio(server):
    def scrape(name: str) -> float:
        return metric(httpx.Client(base_url=server.url), name)

    pieces_before = scrape("kokoro_live_piece_ttfa_seconds_count")
    seconds_before = scrape("kokoro_live_piece_ttfa_seconds_sum")
    with open_session(server, response_format="pcm") as session:
        session.receive_until("started")
        assert scrape("kokoro_live_sessions") == 1
        session.send(type="text", text="One two. Three four. Five")
        session.send(type="end")
        session.receive_until("done")
    deadline = time.monotonic() + 60
    while scrape("kokoro_live_sessions") and time.monotonic() < deadline:  # the server's side of the close
        time.sleep(0.02)
    assert scrape("kokoro_live_sessions") == 0
    assert scrape("kokoro_live_piece_ttfa_seconds_count") - pieces_before == 3
    # each piece's first audio comes at least one scripted synthesis after the speaker took it
    assert scrape("kokoro_live_piece_ttfa_seconds_sum") - seconds_before >= 3 * 0.9 * PIECE_SECONDS


def test_a_pieces_words_are_timed_from_its_start_across_its_chunks(server):
    """'Mr. Smith came.' is one piece (Mr. ends no sentence) that the scripted service speaks as two
    chunks, whose words it times from the piece's start; the session adds where the piece began."""
    with open_session(server, response_format="pcm", timestamps=True) as session:
        session.receive_until("started")
        session.send(type="text", text="Hello there. Mr. Smith came. ")
        session.send(type="end")
        session.receive_until("done")
    events = session.of("words")
    words = {w["word"]: w["start_time"] for e in events for w in e["words"]}
    assert words["Hello"] == 0.0
    assert words["Mr"] == pytest.approx(PIECE_AUDIO_S, abs=1e-3)          # piece 2 starts after piece 1
    assert words["Smith"] == pytest.approx(2 * PIECE_AUDIO_S, abs=1e-3)   # its second chunk, not a third
    assert len(session.audio) == 3 * PIECE_BYTES
    # the server's latency figure comes with each piece's first words only
    latencies = [e.get("piece_latency") for e in events]
    assert latencies[0] >= 0.9 * PIECE_SECONDS and latencies[1] >= 0.9 * PIECE_SECONDS and latencies[2] is None


def test_a_pause_in_the_text_speaks_the_sentence_before_it(server):
    """A model that says "Let me check." and then calls a tool for seconds: the sentence is heard
    during the call, not after it, with no `flush` (an unfinished one still waits)."""
    with open_session(server, response_format="pcm", pause_ms=200) as session:
        session.receive_until("started")
        session.send(type="text", text="Let me check that for you.")
        paused = time.monotonic()
        session.receive_audio(timeout=5)
        heard_after = time.monotonic() - paused
        assert len(session.audio) == PIECE_BYTES and heard_after >= 0.2
        assert [w["word"] for w in session.receive_until("words")["words"]][:2] == ["Let", "me"]
        session.send(type="text", text="It is sunny and twenty deg")  # unfinished: the pause ends nothing
        with pytest.raises(TimeoutError):
            session.receive_audio(timeout=0.6)
        session.send(type="text", text="rees.")
        session.send(type="end")
        session.receive_until("done")
    assert len(session.audio) == 2 * PIECE_BYTES and not session.of("error")


def test_without_pause_ms_an_ended_sentence_waits_for_the_text_after_it(server):
    with open_session(server, response_format="pcm", pause_ms=None) as session:
        session.receive_until("started")
        session.send(type="text", text="Let me check that for you.")
        with pytest.raises(TimeoutError):
            session.receive_audio(timeout=0.6)
        session.send(type="flush")
        session.receive_until("flushed")
    assert len(session.audio) == PIECE_BYTES


def test_text_with_nothing_to_say_is_skipped_without_an_error(server):
    with open_session(server, response_format="pcm") as session:
        session.receive_until("started")
        session.send(type="text", text="🎉\n")  # a model's emoji line, then a stray closing quote
        session.send(type="text", text="Done.")
        session.send(type="flush")
        session.send(type="text", text='"')
        session.send(type="end")
        session.receive_until("done")
    assert len(session.audio) == PIECE_BYTES and not session.of("error")


def test_a_code_block_in_the_reply_is_not_spoken(server, service):
    reply = "Here is the fix:\n\n```python\nfor i in range(3):\n    print(i)\n```\nRun it. It works.\n"
    with open_session(server, response_format="pcm") as session:
        session.receive_until("started")
        for token in reply.split(" "):
            session.send(type="text", text=token + " ")
        session.send(type="end")
        session.receive_until("done")
    words = [w["word"] for e in session.of("words") for w in e["words"]]
    assert words == ["Here", "is", "the", "fix:", "Run", "it", "It", "works"] and not session.of("error")
    # each word points at where it stands in all the text sent, messages joined, the code block included
    sent = "".join(token + " " for token in reply.split(" "))
    assert [sent[w["input_start"]:w["input_end"]] for e in session.of("words") for w in e["words"]] == words
    assert sent.index("Run") == [w["input_start"] for e in session.of("words") for w in e["words"]][4]


def test_with_markdown_off_a_code_block_is_read(server):
    with open_session(server, response_format="pcm", normalization_options={"markup_normalization": False}) as session:
        session.receive_until("started")
        session.send(type="text", text="```sh\nls -la\n```\n")
        session.send(type="end")
        session.receive_until("done")
    words = [w["word"] for e in session.of("words") for w in e["words"]]
    assert "ls" in words and len(session.audio) == 2 * PIECE_BYTES  # the bare closing fence: nothing to say


def test_a_speaker_cancelled_as_its_frame_goes_out_stops(service):
    """`clear` cancels the speaker, which is mostly waiting on a frame going out. A cancel that
    lands just as that frame is sent must still stop it: asyncio.wait_for (before Python 3.12)
    returned the send's result and dropped the cancel, and the speaker spoke on through all the
    cleared text (CI saw it as a `cleared` sent after the session's close). Whatever the moment,
    a cancel the sender accepted ends it cancelled, and its frame still goes out whole."""
    from api.live import LiveSession
    from api.protocol import LiveStart

    state = create_app(Settings().replace(max_requests=2), service=service).state.kokoro

    async def attempt(turns: int) -> tuple[bool, bool, list]:
        ws = ClosingSocket()
        session = LiveSession(state, ws, LiveStart(type="start"), "live_test")
        sender = asyncio.ensure_future(session._send(ws.send_bytes(b"frame")))
        accepted, cancelled = await cancel_after_turns(sender, turns)
        await asyncio.sleep(0.01)  # a frame under way when the cancel came finishes
        return accepted, cancelled, ws.sent

    for turns in range(12):  # from before the frame starts to well after it has gone
        accepted, cancelled, sent = asyncio.run(attempt(turns))
        assert cancelled == accepted, f"cancel after {turns} turns: accepted {accepted}, cancelled {cancelled}"
        assert sent == ["audio"]
