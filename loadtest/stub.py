"""A stub speech server with known timing, to check the load generator itself.

It speaks just enough HTTP/1.1 (keep-alive, chunked responses) on raw asyncio to answer
`POST /v1/audio/speech` with pre-made audio (a sine tone, 16-bit mono 24 kHz; other formats
encoded once with PyAV at start-up), on a schedule you set: a delay before the headers, a delay
between the headers and the first audio, a gap between chunks, one extra stall, 503s with
Retry-After past a capacity or on every Nth request, SSE events when the body asks for
`"stream_format": "sse"`. It logs, per X-Request-Id, when it received the request and when it
wrote the headers and the first audio (time.perf_counter, the system-wide monotonic clock on
Linux, read just before each write), served at `GET /stub/log`, so a test can compare what the client reports with what the
server did.

    python -m loadtest.stub --port 8899 --first-byte-delay 0.05 --audio-seconds 2 --chunk-gap 0.02
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import io
import json
import math
import random
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Iterator

from loadtest.client import RAW_FORMATS
from worker.audio import SAMPLE_RATE

# response_format -> (PyAV container, codec) for the formats the stub encodes with PyAV.
_ENCODERS = {"wav": ("wav", "pcm_s16le"), "mp3": ("mp3", "libmp3lame"), "flac": ("flac", "flac"),
             "aac": ("adts", "aac")}
_CONTENT_TYPES = {"pcm": "audio/pcm", "wav": "audio/wav", "mp3": "audio/mpeg", "flac": "audio/flac",
                  "aac": "audio/aac", "mulaw": "audio/PCMU", "alaw": "audio/PCMA"}
# The headerless formats (bytes per sample, default rate), made by the server's own encoders at any
# `sample_rate`.
_RAW = RAW_FORMATS


@dataclass
class StubConfig:
    audio_seconds: float = 1.0  # audio per response
    header_delay: float = 0.0  # request received -> headers written
    first_byte_delay: float = 0.0  # headers written -> first audio written
    jitter: float = 0.0  # first_byte_delay varies uniformly by +- this much (desynchronizes clients)
    chunk_seconds: float = 0.1  # audio per chunk (PCM: 4,800 bytes)
    chunk_gap: float = 0.0  # pause between chunks
    stall_after_chunk: int = -1  # with stall_s: one extra pause after this chunk (0-based)
    stall_s: float = 0.0
    capacity: int = 0  # > 0: more requests in flight than this get 503
    reject_every: int = 0  # > 0: every Nth request gets 503
    retry_after_s: float = 1.5  # what the 503s advertise
    log: bool = True


@dataclass
class StubServer:
    config: StubConfig = field(default_factory=StubConfig)
    host: str = "127.0.0.1"
    port: int = 0
    requests_seen: int = 0
    in_flight: int = 0
    max_in_flight: int = 0
    connections: int = 0  # TCP connections accepted (a client that keeps connections alive opens few)
    events: dict[str, dict[str, float]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        n = int(round(self.config.audio_seconds * SAMPLE_RATE))
        tone = [int(8000 * math.sin(2 * math.pi * 220 * i / SAMPLE_RATE)) for i in range(n)]
        import array

        self.pcm = array.array("h", tone).tobytes()  # s16le on the little-endian machines we run on
        self._encoded: dict[tuple[str, int | None], bytes] = {("pcm", None): self.pcm}
        self._server: asyncio.base_events.Server | None = None
        self._rng = random.Random(0)

    # --- audio -------------------------------------------------------------------------------
    def audio(self, fmt: str, sample_rate: int | None = None) -> bytes:
        if (fmt, sample_rate) not in self._encoded:
            if fmt in _RAW:
                import numpy as np

                from api.encoders import make_encoder

                encoder = make_encoder(fmt, sample_rate=sample_rate)
                tone = np.frombuffer(self.pcm, dtype="<i2").astype(np.float32) / 32768
                data = encoder.encode(tone) + encoder.finish()
            elif fmt in _ENCODERS and sample_rate is None:
                data = _encode(self.pcm, fmt)
            else:
                raise ValueError(f"the stub serves {', '.join([*_RAW, *_ENCODERS])} (only the first three at "
                                 f"another sample_rate), not {fmt!r} at {sample_rate}")
            self._encoded[(fmt, sample_rate)] = data
        return self._encoded[(fmt, sample_rate)]

    def chunks(self, fmt: str, sample_rate: int | None = None) -> list[bytes]:
        data = self.audio(fmt, sample_rate)
        if fmt in _RAW:
            width, rate = _RAW[fmt]
            size = max(width, int(self.config.chunk_seconds * (sample_rate or rate)) * width)
        else:  # the same number of chunks as PCM would have, so timing schedules match
            n = max(1, math.ceil(self.config.audio_seconds / self.config.chunk_seconds))
            size = max(1, math.ceil(len(data) / n))
        return [data[i:i + size] for i in range(0, len(data), size)]

    # --- HTTP --------------------------------------------------------------------------------
    async def start(self) -> str:
        self._server = await asyncio.start_server(self._connection, self.host, self.port, backlog=1024)
        self.port = self._server.sockets[0].getsockname()[1]
        return self.url

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await self._server.wait_closed()

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
                    return
                t_recv = time.perf_counter()
                lines = head.decode("latin-1").split("\r\n")
                method, path, _ = lines[0].split(" ", 2)
                headers = {}
                for line in lines[1:]:
                    if ":" in line:
                        k, v = line.split(":", 1)
                        headers[k.strip().lower()] = v.strip()
                length = int(headers.get("content-length", "0") or 0)
                body = await reader.readexactly(length) if length else b""
                await self._route(method, path, headers, body, writer, t_recv)
                if headers.get("connection", "").lower() == "close":
                    return
        except (ConnectionError, asyncio.IncompleteReadError):
            return
        finally:
            with contextlib.suppress(Exception):
                writer.close()

    async def _route(self, method: str, path: str, headers: dict[str, str], body: bytes,
                     writer: asyncio.StreamWriter, t_recv: float) -> None:
        path = path.split("?", 1)[0]
        if method == "GET" and path == "/stub/log":
            return await _send_whole(writer, 200, json.dumps({
                "events": self.events, "requests_seen": self.requests_seen,
                "max_in_flight": self.max_in_flight, "connections": self.connections}).encode(), "application/json")
        if method == "POST" and path == "/stub/reset":
            self.events.clear()
            self.requests_seen = self.max_in_flight = self.connections = 0
            return await _send_whole(writer, 200, b"{}", "application/json")
        if method == "GET" and path in ("/health", "/"):
            return await _send_whole(writer, 200, b'{"status":"ok"}', "application/json")
        if method != "POST" or path != "/v1/audio/speech":
            return await _send_whole(writer, 404, b'{"error":"not found"}', "application/json")
        await self._speech(headers, body, writer, t_recv)

    async def _speech(self, headers: dict[str, str], body: bytes, writer: asyncio.StreamWriter,
                      t_recv: float) -> None:
        cfg = self.config
        self.requests_seen += 1
        rid = headers.get("x-request-id", str(self.requests_seen))
        try:
            req = json.loads(body or b"{}")
            fmt = req.get("response_format", "mp3")
            chunks = self.chunks(fmt, req.get("sample_rate"))
        except ValueError as exc:
            return await _send_whole(writer, 400, json.dumps({"error": str(exc)}).encode(), "application/json")
        if (cfg.capacity and self.in_flight >= cfg.capacity) or (
                cfg.reject_every and self.requests_seen % cfg.reject_every == 0):
            extra = {"Retry-After": str(max(1, math.ceil(cfg.retry_after_s))),
                     "retry-after-ms": str(int(cfg.retry_after_s * 1000))}
            return await _send_whole(writer, 503, b'{"error":{"message":"server busy"}}', "application/json", extra)
        sse = req.get("stream_format") == "sse"
        log = self.events.setdefault(rid, {}) if cfg.log else {}
        log["recv"] = t_recv
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            if cfg.header_delay:
                await asyncio.sleep(cfg.header_delay)
            ctype = "text/event-stream" if sse else _CONTENT_TYPES.get(fmt, "application/octet-stream")
            log["headers"] = time.perf_counter()  # taken just before the write: nothing can see it earlier
            writer.write((f"HTTP/1.1 200 OK\r\nContent-Type: {ctype}\r\n"
                          "Transfer-Encoding: chunked\r\n\r\n").encode())
            await writer.drain()
            delay = cfg.first_byte_delay + (self._rng.uniform(-cfg.jitter, cfg.jitter) if cfg.jitter else 0.0)
            if delay > 0:
                await asyncio.sleep(delay)
            for i, chunk in enumerate(chunks):
                if i and cfg.chunk_gap:
                    await asyncio.sleep(cfg.chunk_gap)
                if sse:
                    event = {"type": "speech.audio.delta", "audio": base64.b64encode(chunk).decode()}
                    chunk = b"data: " + json.dumps(event).encode() + b"\n\n"
                frame = b"%x\r\n%s\r\n" % (len(chunk), chunk)
                if i == 0:
                    log["first_audio"] = time.perf_counter()
                writer.write(frame)
                await writer.drain()
                if i == cfg.stall_after_chunk and cfg.stall_s:
                    await asyncio.sleep(cfg.stall_s)
            if sse:
                done = b'data: {"type": "speech.audio.done", "usage": {}}\n\n'
                writer.write(b"%x\r\n%s\r\n" % (len(done), done))
            writer.write(b"0\r\n\r\n")
            log["end"] = time.perf_counter()
            await writer.drain()
        finally:
            self.in_flight -= 1

    # --- running it ----------------------------------------------------------------------------
    @contextlib.contextmanager
    def running_in_thread(self) -> Iterator[str]:
        """Serve on a private event loop in a daemon thread; yields the base URL."""
        loop = asyncio.new_event_loop()
        started = threading.Event()

        def serve() -> None:
            asyncio.set_event_loop(loop)
            loop.run_until_complete(self.start())
            started.set()
            loop.run_forever()

        thread = threading.Thread(target=serve, name="loadtest-stub", daemon=True)
        thread.start()
        if not started.wait(10):
            raise RuntimeError("stub server did not start")
        try:
            yield self.url
        finally:
            asyncio.run_coroutine_threadsafe(self.close(), loop).result(5)
            loop.call_soon_threadsafe(loop.stop)
            thread.join(5)


async def _send_whole(writer: asyncio.StreamWriter, status: int, body: bytes, ctype: str,
                      extra: dict[str, str] | None = None) -> None:
    reason = {200: "OK", 400: "Bad Request", 404: "Not Found", 503: "Service Unavailable"}.get(status, "")
    head = f"HTTP/1.1 {status} {reason}\r\nContent-Type: {ctype}\r\nContent-Length: {len(body)}\r\n"
    head += "".join(f"{k}: {v}\r\n" for k, v in (extra or {}).items())
    writer.write(head.encode() + b"\r\n" + body)
    await writer.drain()


def _encode(pcm: bytes, fmt: str) -> bytes:
    import av
    import numpy as np

    container_name, codec = _ENCODERS[fmt]
    out = io.BytesIO()
    with av.open(out, mode="w", format=container_name) as container:
        stream = container.add_stream(codec, rate=SAMPLE_RATE)
        stream.layout = "mono"
        samples = np.frombuffer(pcm, dtype="<i2").reshape(1, -1)
        frame_size = stream.codec_context.frame_size or 1024
        resampler = av.AudioResampler(format=stream.codec_context.format.name, layout="mono", rate=SAMPLE_RATE)
        for start in range(0, samples.shape[1], frame_size):
            frame = av.AudioFrame.from_ndarray(np.ascontiguousarray(samples[:, start:start + frame_size]),
                                               format="s16", layout="mono")
            frame.sample_rate = SAMPLE_RATE
            for converted in resampler.resample(frame):
                for packet in stream.encode(converted):
                    container.mux(packet)
        for packet in stream.encode(None):
            container.mux(packet)
    return out.getvalue()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m loadtest.stub", description=__doc__.split("\n\n")[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8899, help="0 picks a free port (printed on start)")
    for name, f in StubConfig.__dataclass_fields__.items():
        if name == "log":
            continue
        p.add_argument("--" + name.replace("_", "-"), type=type(f.default), default=f.default)
    args = p.parse_args(argv)
    cfg = StubConfig(**{k: getattr(args, k) for k in StubConfig.__dataclass_fields__ if k != "log"})
    server = StubServer(cfg, host=args.host, port=args.port)

    async def serve() -> None:
        url = await server.start()
        print(f"stub listening on {url}", flush=True)
        await asyncio.Event().wait()

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve())
    return 0


if __name__ == "__main__":
    sys.exit(main())
