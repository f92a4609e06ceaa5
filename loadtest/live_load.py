"""`python -m loadtest live`: sessions of WS /v1/audio/speech/live fed as a language model writes,
measured as a listener hears them.

Each of `c` users runs sessions back to back for the step's duration: a text of the set, sent a
word at a time at `--words-per-second` (a model's writing speed), each word with the space before
it as a model's tokens come (" word"), then `end`. With `--tool-pause S` the writer stops for S
seconds after the text's first sentence, as an agent calling a tool after "Let me check.". Per session:

- **first audio**: from the first word sent to the first audio byte received;
- **word latency**: from the moment a word was sent to the arrival of the audio that speaks it
  (the binary frame before the `words` event naming it), for every word: it includes the wait
  for the rest of the word's sentence, which the model writes;
- **piece latency**: from the moment the server could start a piece (its text complete: the
  client cuts the text as the server does, with worker.text.segments) to the piece's audio,
  per chunk of it: the server's own share (text frontend, queue, synthesis, encoding, network);
- **server stall**: the time a real-time player, started at the first audio, sits waiting for
  audio whose piece was complete: the silence the server caused;
- **model wait**: the time that player sits waiting while the model still writes the next piece:
  silence the listener hears all the same, which the server can only shorten by where it cuts;
- **after pause**: with `--tool-pause`, from the last word before the pause to its audio: the
  session's `pause_ms` (sent with `start`, `--pause-ms`) plus the piece's latency, or the whole
  pause and more when the sentence waits for the text after it (`--pause-ms off`);
- errors: `error` events, a close other than 1000, a refused upgrade (503s counted apart).

    python -m loadtest live --url http://127.0.0.1:8880 --concurrency 1,8 --duration 20 \\
        --texts paragraphs --words-per-second 8 --out loadtest-results/live

With `--out`, live.json holds the table's figures and live-timeline.png draws, for each step, the
session with the most server stall: the audio received and the audio a real-time player has played
over time, its silences shaded by cause, and a tick where each piece's text was complete.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

from api.protocol import DEFAULT_LIVE_PAUSE_MS
from loadtest import listener_metrics as metrics
from loadtest.client import RAW_FORMATS
from loadtest.results import machine, now_iso
from loadtest.texts import load_texts
from worker.text.segments import TextSegmenter


@dataclass
class Frame:
    arrived: float
    seconds: float
    text_ready: float = 0.0  # when the piece it belongs to was complete


@dataclass
class LiveSession:
    """What one session's client saw (times from time.perf_counter)."""

    words_sent: list[tuple[str, float]] = field(default_factory=list)  # (word, sent at)
    word_ready: list[float] = field(default_factory=list)  # per word sent: when its piece was complete
    frames: list[Frame] = field(default_factory=list)
    word_latencies: list[float] = field(default_factory=list)
    piece_latencies: list[float] = field(default_factory=list)
    first_audio_s: float | None = None
    audio_s: float = 0.0
    errors: list[str] = field(default_factory=list)
    refused: bool = False  # the upgrade answered 503
    pause_word: int | None = None  # with a tool pause: the index of the last word before it
    pause_started: float = 0.0  # when that word was sent
    after_pause_s: float | None = None  # from then to that word's audio

    @property
    def server_stall_s(self) -> float:
        return silence(self._frames(), "server")

    @property
    def model_wait_s(self) -> float:
        return silence(self._frames(), "model")

    def _frames(self) -> list[tuple[float, float, float]]:
        return [(f.arrived, f.seconds, f.text_ready) for f in self.frames]


def server_stall(frames: list[tuple[float, float, float]]) -> float:
    """Silence a real-time player hears for lack of audio whose text was already written.

    `frames` are (arrival, seconds of audio, when its text was complete), in arrival order. The
    player starts at the first arrival and plays in real time; when it runs dry before a frame
    arrives, the wait counts from the later of the moment it ran dry and the moment the frame's
    text was complete: only the part the server could have avoided."""
    return silence(frames, "server")


def silence(frames: list[tuple[float, float, float]], cause: str) -> float:
    """Seconds the real-time player of `player_course` sits dry for `cause` ("server", "model")."""
    return sum(end - start for start, end, what in player_course(frames) if what == cause)


def player_course(frames: list[tuple[float, float, float]]) -> list[tuple[float, float, str]]:
    """The real-time player's course over `frames` (as `server_stall` takes them), as spans (start,
    end, what): `"playing"`, `"model"` (dry while the model was still writing the next frame's
    text) and `"server"` (dry with that text complete)."""
    spans: list[tuple[float, float, str]] = []
    plays_until: float | None = None
    for arrived, seconds, text_ready in frames:
        if plays_until is None:
            plays_until = arrived
        elif arrived > plays_until:
            model_until = min(max(plays_until, text_ready), arrived)
            if model_until > plays_until:
                spans.append((plays_until, model_until, "model"))
            spans.append((model_until, arrived, "server"))
            plays_until = arrived
        spans.append((plays_until, plays_until + seconds, "playing"))
        plays_until += seconds
    return spans


def _first_sentence_end(words: list[str]) -> int | None:
    """The index of the word that ends the text's first sentence, if more words follow it."""
    segmenter = TextSegmenter(opening_chars=0)  # sentence ends only
    for i, word in enumerate(words[:-1]):
        segmenter.push((" " if i else "") + word)
        if copy.copy(segmenter).settle():
            return i
    return None


def _key(word: str) -> str:
    return re.sub(r"\W", "", word).lower()


class _WordMatcher:
    """Caption words back to the words sent, in order: the index of the sent word a caption word
    speaks (a caption spelled otherwise, as "3.50" read out, takes the next unmatched word)."""

    def __init__(self, sent: list[tuple[str, float]]):
        self.sent = sent
        self.next = 0

    def index(self, caption: str) -> int:
        key = _key(caption)
        for i in range(self.next, min(self.next + 6, len(self.sent))):
            if key and key in _key(self.sent[i][0]):
                self.next = i + 1
                return i
        return min(self.next, len(self.sent) - 1)


async def run_session(url: str, text: str, words_per_second: float, fmt: str, voice: str,
                      api_key: str = "", timeout: float = 120.0, tool_pause: float = 0.0,
                      pause_ms: int | None = DEFAULT_LIVE_PAUSE_MS) -> LiveSession:
    from websockets.asyncio.client import connect
    from websockets.exceptions import ConnectionClosed, InvalidStatus

    session = LiveSession()
    sample_rate, width = 24000, 2
    words = text.split()
    if tool_pause > 0:  # after the first sentence that more text follows
        session.pause_word = _first_sentence_end(words)
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    matcher = _WordMatcher(session.words_sent)
    pending: list[Frame] = []  # frames not yet followed by their words event

    segmenter = TextSegmenter()  # the server's cut, to know when each piece was complete

    def pieces_complete(pieces: list[str], now: float) -> None:
        for piece in pieces:
            session.word_ready += [now] * len(piece.split())

    async def write(ws) -> None:
        for i, word in enumerate(words):
            token = (" " if i else "") + word
            now = time.perf_counter()
            session.words_sent.append((word, now))
            await ws.send(json.dumps({"type": "text", "text": token}))
            pieces_complete(segmenter.push(token), now)
            await asyncio.sleep(1 / words_per_second)
            if i == session.pause_word:
                session.pause_started = now
                if pause_ms is not None:  # the server speaks what a space would have ended, pause_ms after it
                    pieces_complete(segmenter.settle(), now + pause_ms / 1000)
                await asyncio.sleep(tool_pause)
        now = time.perf_counter()
        await ws.send(json.dumps({"type": "end"}))
        pieces_complete([segmenter.flush()], now)

    try:
        async with connect(url, additional_headers=headers, open_timeout=timeout, max_size=None) as ws:
            await ws.send(json.dumps({"type": "start", "voice": voice, "response_format": fmt, "pause_ms": pause_ms}))
            started = json.loads(await asyncio.wait_for(ws.recv(), timeout))
            if started.get("type") != "started":
                session.errors.append(json.dumps(started)[:200])
                return session
            sample_rate = started["sample_rate"]
            width = RAW_FORMATS.get(fmt, (2,))[0]
            writer = asyncio.create_task(write(ws))
            try:
                async for message in ws:
                    now = time.perf_counter()
                    if isinstance(message, bytes):
                        if session.first_audio_s is None:
                            session.first_audio_s = now - session.words_sent[0][1]
                        seconds = len(message) / width / sample_rate
                        session.audio_s += seconds
                        frame = Frame(now, seconds, session.frames[-1].text_ready if session.frames else 0.0)
                        session.frames.append(frame)
                        pending.append(frame)
                        continue
                    event = json.loads(message)
                    if event["type"] == "words":
                        heard = pending[-1].arrived if pending else now
                        spoken = [matcher.index(w["word"]) for w in event["words"]]
                        session.word_latencies += [heard - session.words_sent[i][1] for i in spoken]
                        if session.pause_word in spoken:
                            session.after_pause_s = heard - session.pause_started
                        if spoken and spoken[0] < len(session.word_ready):
                            ready = session.word_ready[spoken[0]]
                            session.piece_latencies.append(heard - ready)
                            for frame in pending:
                                frame.text_ready = ready
                        pending.clear()
                    elif event["type"] == "error":
                        session.errors.append(event["error"]["message"][:200])
                    elif event["type"] == "done":
                        break
            finally:
                writer.cancel()
    except InvalidStatus as e:
        session.refused = e.response.status_code == 503
        if not session.refused:
            session.errors.append(f"upgrade refused: HTTP {e.response.status_code}")
    except ConnectionClosed as e:
        session.errors.append(f"closed {e.rcvd.code if e.rcvd else 'abruptly'}")
    except (OSError, asyncio.TimeoutError) as e:
        session.errors.append(f"{type(e).__name__}: {e}")
    return session


async def run_step(url: str, texts: list[str], concurrency: int, duration: float, args) -> tuple[dict, list]:
    """The step's summary, and its sessions (for the timeline plot)."""
    sessions: list[LiveSession] = []
    started = time.perf_counter()
    counter = 0

    async def user(k: int) -> None:
        nonlocal counter
        while time.perf_counter() - started < duration:
            text = texts[counter % len(texts)]
            counter += 1
            s = await run_session(url, text, args.words_per_second, args.response_format, args.voice, args.api_key,
                                  tool_pause=args.tool_pause, pause_ms=args.pause_ms)
            sessions.append(s)
            if s.refused:
                await asyncio.sleep(1.0)

    await asyncio.gather(*(user(k) for k in range(concurrency)))
    elapsed = time.perf_counter() - started
    return summarize_step(concurrency, sessions, elapsed), sessions


def summarize_step(concurrency: int, sessions: list[LiveSession], elapsed: float) -> dict:
    done = [s for s in sessions if not s.refused and not s.errors]
    firsts = [s.first_audio_s for s in done if s.first_audio_s is not None]
    latencies = [x for s in done for x in s.word_latencies]
    piece_latencies = [x for s in done for x in s.piece_latencies]
    stalls = [s.server_stall_s for s in done]
    waits = [s.model_wait_s for s in done]
    after_pause = [s.after_pause_s for s in done if s.after_pause_s is not None]
    pct = metrics.percentile
    return {
        "concurrency": concurrency, "sessions": len(sessions), "completed": len(done),
        "refused_503": sum(s.refused for s in sessions), "errors": sum(bool(s.errors) for s in sessions),
        "error_examples": [e for s in sessions for e in s.errors][:3],
        "first_audio_p50_ms": _ms(pct(firsts, 50)), "first_audio_p95_ms": _ms(pct(firsts, 95)),
        "word_latency_p50_ms": _ms(pct(latencies, 50)), "word_latency_p95_ms": _ms(pct(latencies, 95)),
        "piece_latency_p50_ms": _ms(pct(piece_latencies, 50)), "piece_latency_p95_ms": _ms(pct(piece_latencies, 95)),
        "server_stall_p95_ms": _ms(pct(stalls, 95)), "server_stall_max_ms": _ms(max(stalls, default=None)),
        "model_wait_p95_ms": _ms(pct(waits, 95)), "model_wait_max_ms": _ms(max(waits, default=None)),
        "after_pause_p50_ms": _ms(pct(after_pause, 50)), "after_pause_p95_ms": _ms(pct(after_pause, 95)),
        "audio_s_per_s": round(sum(s.audio_s for s in done) / elapsed, 2) if elapsed > 0 else None,
        "elapsed_s": round(elapsed, 1),
    }


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 1)


COLUMNS = (("c", "concurrency"), ("sessions", "completed"), ("503", "refused_503"), ("errors", "errors"),
           ("first audio p50/p95 ms", ("first_audio_p50_ms", "first_audio_p95_ms")),
           ("word latency p50/p95 ms", ("word_latency_p50_ms", "word_latency_p95_ms")),
           ("piece latency p50/p95 ms", ("piece_latency_p50_ms", "piece_latency_p95_ms")),
           ("server stall p95/max ms", ("server_stall_p95_ms", "server_stall_max_ms")),
           ("model wait p95/max ms", ("model_wait_p95_ms", "model_wait_max_ms")),
           ("audio-s/s", "audio_s_per_s"))
AFTER_PAUSE = ("after pause p50/p95 ms", ("after_pause_p50_ms", "after_pause_p95_ms"))


def format_live_table(steps: list[dict]) -> str:
    def cell(step: dict, key) -> str:
        if isinstance(key, tuple):
            return " / ".join("-" if step[k] is None else f"{step[k]:g}" for k in key)
        return "-" if step[key] is None else f"{step[key]:g}" if isinstance(step[key], float) else str(step[key])

    columns = COLUMNS + ((AFTER_PAUSE,) if any(s.get("after_pause_p50_ms") is not None for s in steps) else ())
    header = "| " + " | ".join(name for name, _ in columns) + " |"
    rows = ["| " + " | ".join(cell(s, key) for _, key in columns) + " |" for s in steps]
    return "\n".join([header, "|" + "---|" * len(columns), *rows])


def plot_timelines(steps: list[tuple[int, LiveSession]], path: Path) -> Path:
    """One panel per (concurrency, session): the audio received and the audio heard by a real-time
    player over the session, its silences shaded by cause (the server's red, the model's grey), and
    a tick where each piece's text was complete. Where the two lines meet, the listener hears
    nothing; the gap between them is the audio buffered."""
    from loadtest.report import _plt

    plt = _plt()
    fig, axes = plt.subplots(len(steps), 1, figsize=(10, 2.8 * len(steps)), squeeze=False)
    for ax, (concurrency, session) in zip(axes[:, 0], steps):
        t0 = session.words_sent[0][1] if session.words_sent else session.frames[0].arrived
        frames = [(f.arrived - t0, f.seconds, f.text_ready - t0) for f in session.frames]
        received_x, received_y, total = [0.0], [0.0], 0.0
        for arrived, seconds, _ in frames:
            received_x += [arrived, arrived]
            received_y += [total, total + seconds]
            total += seconds
        heard_x, heard_y, heard = [], [], 0.0
        stalls = {"model": 0.0, "server": 0.0}
        for start, end, what in player_course(frames):
            if what == "playing":
                heard_x += [start, end]
                heard_y += [heard, heard + end - start]
                heard += end - start
            else:
                ax.axvspan(start, end, color="tab:red" if what == "server" else "0.8", alpha=0.4, lw=0)
                stalls[what] += end - start
        ax.plot(received_x, received_y, color="tab:blue", label="audio received")
        ax.plot(heard_x, heard_y, color="tab:green", label="audio heard (real-time player)")
        ready = sorted({r - t0 for r in session.word_ready})
        ax.plot(ready, [0.0] * len(ready), "|", color="black", markersize=12, label="a piece's text complete")
        ax.set_title(f"{concurrency} session(s) at once: server stall {stalls['server']:.2f} s (red), "
                     f"waiting for the model {stalls['model']:.2f} s (grey)", fontsize=10)
        ax.set_ylabel("seconds of audio")
        ax.grid(alpha=0.3)
    axes[-1, 0].set_xlabel("seconds since the first word was sent")
    axes[0, 0].legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("--url", required=True, help="the server, http://HOST:PORT (the socket path is added)")
    p.add_argument("--concurrency", default="1,8", help="comma-separated numbers of simultaneous sessions")
    p.add_argument("--duration", type=float, default=20.0, help="seconds each step starts new sessions")
    p.add_argument("--texts", default="paragraphs", help="as `run --texts` (default paragraphs)")
    p.add_argument("--words-per-second", type=float, default=8.0,
                   help="how fast the simulated model writes (default 8: a brisk model at about 6 tokens a word "
                        "writes 50 tokens/s)")
    p.add_argument("--format", default="pcm", dest="response_format", choices=("pcm", "mulaw", "alaw"),
                   help="the session's raw audio format (its length counted from bytes)")
    p.add_argument("--voice", default="af_heart")
    p.add_argument("--tool-pause", type=float, default=0.0, metavar="S",
                   help="seconds the writer stops after each text's first sentence, as an agent calling a tool")
    p.add_argument("--pause-ms", type=_pause_ms, default=DEFAULT_LIVE_PAUSE_MS,
                   help=f"the sessions' pause_ms (default {DEFAULT_LIVE_PAUSE_MS}; off: an ended sentence waits for "
                        "the text after it)")
    p.add_argument("--api-key", default="")
    p.add_argument("--out", default="", help="directory for live.json and live-timeline.png (the table is "
                                             "printed either way)")


def _pause_ms(value: str) -> int | None:
    return None if value == "off" else int(value)


def run(args: argparse.Namespace) -> int:
    url = args.url.rstrip("/").replace("http://", "ws://").replace("https://", "wss://") + "/v1/audio/speech/live"
    texts = load_texts(args.texts)
    steps, worst = [], []
    for c in (int(x) for x in args.concurrency.split(",") if x.strip()):
        print(f"live: {c} session(s) at once for {args.duration:g} s ...", flush=True)
        step, sessions = asyncio.run(run_step(url, texts, c, args.duration, args))
        steps.append(step)
        done = [s for s in sessions if not s.refused and not s.errors and s.frames]
        if done:  # the step's session with the most silence the server caused
            worst.append((c, max(done, key=lambda s: s.server_stall_s)))
    print(format_live_table(steps))
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "live.json").write_text(json.dumps({"when": now_iso(), "machine": machine(), "url": url,
                                                   "words_per_second": args.words_per_second, "texts": args.texts,
                                                   "tool_pause_s": args.tool_pause, "pause_ms": args.pause_ms,
                                                   "format": args.response_format, "steps": steps}, indent=2))
        print(out / "live.json")
        if worst:
            print(plot_timelines(worst, out / "live-timeline.png"))
    return 1 if any(s["errors"] for s in steps) else 0
