"""One speech request, timed the way a listener feels it.

`send_speech` posts one `/v1/audio/speech` request over an httpx client and records, on the
monotonic clock, when the headers came, when the first non-empty audio arrived (TTFA: for SSE the
first `speech.audio.delta` event that carries audio) and when the last byte came (E2E), plus the
arrival time and size of every read so `metrics.underrun` can replay the stream as a real-time
player would. The hot path per read is one clock read and one list append; decoding compressed
audio (PyAV) happens after the stream ends, in a thread.
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
import ssl
import time
from dataclasses import asdict, dataclass, field, fields
from typing import Any

import httpx

from loadtest import listener_metrics as metrics

# The API's `pcm`: raw 16-bit little-endian mono at Kokoro's 24 kHz.
from worker.audio import SAMPLE_RATE as PCM_SAMPLE_RATE

# The headerless formats, counted from bytes, never decoded: (bytes per sample, rate unless the
# body's `sample_rate` says otherwise). G.711 is one byte a sample at 8 kHz.
RAW_FORMATS = {"pcm": (2, PCM_SAMPLE_RATE), "mulaw": (1, 8000), "alaw": (1, 8000)}
# PyAV demuxer names for the other response formats.
AV_FORMATS = {"mp3": "mp3", "wav": "wav", "flac": "flac", "aac": "aac", "opus": "ogg", "ogg": "ogg"}


@dataclass
class RequestResult:
    """One CSV row: what happened to one request. Times in seconds; None where not reached."""

    target: str = ""  # label of the server (compare runs two)
    step: str = ""  # e.g. "c=16" or "rate=5"
    phase: str = "measure"  # "measure" or "warmup" (warm-up rows never enter a summary)
    index: int = 0  # order of issue within the step
    request_id: str = ""  # sent as X-Request-Id so a server log (or the stub) can be matched
    text_id: int = 0  # index into the text set
    text_chars: int = 0
    started_at: float = 0.0  # seconds since the run began (when the generator decided to send it)
    scheduled_at: float | None = None  # open loop: the Poisson arrival, seconds since step start
    sched_lag_s: float | None = None  # open loop: how late the request left against its Poisson arrival (the generator's own delay)
    outcome: str = ""  # ok | rejected (503) | error | dropped (open-loop client cap reached)
    status: int = 0  # HTTP status; 0 when no response (connect error, timeout)
    error: str = ""
    headers_s: float | None = None  # time to response headers
    ttfa_s: float | None = None  # time to the first non-empty audio
    e2e_s: float | None = None  # time to the last byte
    audio_bytes: int = 0
    audio_s: float = 0.0  # seconds of audio received (PCM bytes counted, other formats decoded)
    rtf: float | None = None  # e2e / audio seconds (below 1 is faster than real time)
    underrun_s: float | None = None  # longest wait of a real-time player started at the first audio
    underrun_total_s: float | None = None
    stalls: int | None = None
    reads: int = 0  # network reads (SSE: audio events) that carried audio
    retry_after: str = ""  # 503: the Retry-After header as sent (seconds)
    retry_after_ms: str = ""  # 503: the retry-after-ms header as sent
    prep_s: float = 0.0  # the generator's own time from deciding to send to the request leaving (not in any latency)
    t_send: float = 0.0  # absolute time.perf_counter() when the request left (CLOCK_MONOTONIC: same clock as the stub's log)
    t_first_audio: float | None = None  # absolute perf_counter() at the first audio

    @classmethod
    def columns(cls) -> list[str]:
        return [f.name for f in fields(cls)]

    def row(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class RequestSpec:
    """What to ask for; the same spec is sent to every target of a compare run."""

    url: str
    text: str
    text_id: int = 0
    voice: str = "af_heart"
    model: str = "kokoro"
    response_format: str = "pcm"
    speed: float = 1.0
    stream: bool = True
    sse: bool = False
    extra: dict[str, Any] = field(default_factory=dict)  # more body fields, merged last
    headers: dict[str, str] = field(default_factory=dict)

    def body(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.model,
            "input": self.text,
            "voice": self.voice,
            "response_format": self.response_format,
            "speed": self.speed,
            "stream": self.stream,  # Kokoro-FastAPI's field; OpenAI's API ignores it
        }
        if self.sse:
            body["stream_format"] = "sse"  # OpenAI's: events speech.audio.delta / speech.audio.done
        body.update(self.extra)
        return body

    def raw_audio(self) -> tuple[int, int] | None:
        """(bytes per sample, sample rate) of a headerless response, whose audio is counted from its
        bytes; None for a format that is decoded."""
        if self.response_format not in RAW_FORMATS:
            return None
        width, rate = RAW_FORMATS[self.response_format]
        return width, int(self.body().get("sample_rate") or rate)


def make_client(max_connections: int, connect_timeout: float = 10.0, read_timeout: float = 120.0,
                write_timeout: float = 30.0, pool_timeout: float = 600.0,
                verify: ssl.SSLContext | bool = True) -> httpx.AsyncClient:
    """An httpx client with its limits and timeouts set on purpose.

    httpx's defaults would silently cap us at 100 connections and fail any read that waits 5 s,
    so both are set here; timeouts are long enough for a loaded server. `trust_env=False`: an
    HTTP proxy from the environment would distort timings.
    """
    limits = httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections,
                          keepalive_expiry=30.0)
    timeout = httpx.Timeout(connect=connect_timeout, read=read_timeout, write=write_timeout, pool=pool_timeout)
    return httpx.AsyncClient(limits=limits, timeout=timeout, trust_env=False, http1=True, http2=False, verify=verify)


class ConnectionSlots:
    """One single-connection httpx client per request in flight, reused last-in first-out.

    Why not one client with a pool of N connections: httpcore 1.0's pool hands the same idle
    connection to every request queued at that moment; all but one then fail, requeue and retry.
    At 64 concurrent streams this added a median ~0.9 s (up to 3 s) before a request was even
    written, time a server never saw and that we would have reported as its TTFA. A client per
    request in flight has exactly one connection and one user, so nothing waits on our side.
    """

    def __init__(self, limit: int, **client_args: Any) -> None:
        self.limit = limit
        self._args = {"verify": ssl.create_default_context(), **client_args}  # one TLS context for all
        self._free: list[httpx.AsyncClient] = []
        self._all: list[httpx.AsyncClient] = []
        self._used: set[httpx.AsyncClient] = set()  # clients whose connection has been opened

    @property
    def opened(self) -> int:
        return len(self._all)

    def acquire(self) -> httpx.AsyncClient:
        if self._free:
            client = self._free.pop()
            self._used.add(client)
            return client
        if len(self._all) >= self.limit:
            raise RuntimeError(f"more than {self.limit} requests in flight; the schedule should have capped them")
        client = make_client(1, **self._args)
        self._all.append(client)
        return client

    def reserve(self, count: int) -> None:
        """Create clients ahead of a step (a few ms each), so a step's first requests do not wait
        while the loop builds the others' clients."""
        while len(self._all) < min(count, self.limit):
            client = make_client(1, **self._args)
            self._all.append(client)
            self._free.insert(0, client)

    async def preconnect(self, url: str) -> None:
        """Open the connection of every client not yet used, with a GET that any server answers
        (a 404 keeps an HTTP/1.1 connection alive as well as a 200), so a step's first requests
        do not pay 64 TCP handshakes in one burst. Failures are ignored: the step's own
        requests will report them."""
        fresh = [c for c in self._free if c not in self._used]

        async def touch(client: httpx.AsyncClient) -> None:
            try:
                await client.get(url)
            except httpx.HTTPError:
                pass
            self._used.add(client)

        await asyncio.gather(*(touch(c) for c in fresh))

    def release(self, client: httpx.AsyncClient) -> None:
        self._free.append(client)

    async def aclose(self) -> None:
        await asyncio.gather(*(c.aclose() for c in self._all), return_exceptions=True)
        self._all.clear()
        self._free.clear()


class _SSEReader:
    """Incremental parser of `text/event-stream`: feed bytes, get the JSON data of whole events."""

    def __init__(self) -> None:
        self._buf = b""

    def feed(self, data: bytes) -> list[dict[str, Any]]:
        self._buf += data.replace(b"\r\n", b"\n")
        events = []
        while b"\n\n" in self._buf:
            raw, self._buf = self._buf.split(b"\n\n", 1)
            payload = b"\n".join(line[5:].lstrip(b" ") for line in raw.split(b"\n") if line.startswith(b"data:"))
            if not payload or payload.strip() == b"[DONE]":
                continue
            try:
                event = json.loads(payload)
            except ValueError:
                continue
            if isinstance(event, dict):
                events.append(event)
        return events


async def send_speech(client: httpx.AsyncClient, spec: RequestSpec, result: RequestResult,
                      total_timeout: float | None = None, run_epoch: float = 0.0) -> RequestResult:
    """Send one request and fill `result` with what happened; never raises for HTTP trouble."""
    headers = {"X-Request-Id": result.request_id, **spec.headers}
    if spec.sse:
        headers["Accept"] = "text/event-stream"
    body = json.dumps(spec.body()).encode()
    result.text_id, result.text_chars = spec.text_id, len(spec.text)
    arrivals: list[tuple[float, int]] = []  # (perf_counter, audio bytes) per read that carried audio
    chunks: list[bytes] = []  # kept only when the audio must be decoded afterwards
    raw = spec.raw_audio()
    keep_bytes = raw is None
    t_intent = time.perf_counter()
    result.started_at = t_intent - run_epoch
    t_wire = t_headers = t_end = None

    async def trace(event: str, info: dict) -> None:
        # the clock starts when the request leaves for the network (a TCP connect, or writing the
        # request line on a kept-alive connection), not when httpx starts building it: its own
        # Python time is the generator's overhead, not the server's latency
        nonlocal t_wire
        if t_wire is None and event in ("connection.connect_tcp.started", "http11.send_request_headers.started"):
            t_wire = time.perf_counter()

    async def exchange() -> None:
        nonlocal t_headers, t_end
        async with client.stream("POST", spec.url, content=body, extensions={"trace": trace},
                                 headers={**headers, "Content-Type": "application/json"}) as resp:
            t_headers = time.perf_counter()
            result.status = resp.status_code
            if resp.status_code != 200:
                text = (await resp.aread())[:300].decode("utf-8", "replace")
                t_end = time.perf_counter()
                result.retry_after = resp.headers.get("retry-after", "")
                result.retry_after_ms = resp.headers.get("retry-after-ms", "")
                result.error = text.replace("\n", " ")
                return
            if spec.sse:
                reader = _SSEReader()
                async for data in resp.aiter_bytes():
                    t = time.perf_counter()
                    for event in reader.feed(data):
                        kind = event.get("type", "")
                        if kind == "speech.audio.delta":
                            audio = base64.b64decode(event.get("audio") or "")
                            if audio:
                                arrivals.append((t, len(audio)))
                                if keep_bytes:
                                    chunks.append(audio)
                        elif kind == "error" or "error" in event:
                            result.error = json.dumps(event)[:300]
            else:
                async for data in resp.aiter_bytes():
                    if data:
                        arrivals.append((time.perf_counter(), len(data)))
                        if keep_bytes:
                            chunks.append(data)
            t_end = time.perf_counter()

    try:
        if total_timeout:
            await asyncio.wait_for(exchange(), total_timeout)
        else:
            await exchange()
    except asyncio.TimeoutError:
        result.error = f"timed out after {total_timeout:g} s (--timeout)"
    except httpx.TimeoutException as exc:
        result.error = f"{type(exc).__name__}: httpx timeout ({exc})"
    except httpx.HTTPError as exc:
        result.error = f"{type(exc).__name__}: {exc}"
    except OSError as exc:  # pragma: no cover - raw socket trouble below httpx
        result.error = f"{type(exc).__name__}: {exc}"

    t_send = t_wire if t_wire is not None else t_intent
    result.t_send, result.prep_s = t_send, t_send - t_intent
    if t_headers is not None:
        result.headers_s = t_headers - t_send
    result.reads = len(arrivals)
    result.audio_bytes = sum(n for _, n in arrivals)
    if arrivals:
        result.t_first_audio = arrivals[0][0]
        result.ttfa_s = arrivals[0][0] - t_send
    if t_end is not None:
        result.e2e_s = t_end - t_send

    if result.status == 200 and arrivals and t_end is not None:
        try:
            if keep_bytes:
                per_read = await asyncio.to_thread(_decoded_seconds_per_read, chunks, spec.response_format)
            else:
                per_read = [metrics.pcm_seconds(n, raw[1], raw[0]) for _, n in arrivals]
            result.audio_s = float(sum(per_read))
            gaps = metrics.underrun(zip((t for t, _ in arrivals), per_read))
            result.underrun_s, result.underrun_total_s, result.stalls = gaps.longest_s, gaps.total_s, gaps.stalls
        except Exception as exc:  # noqa: BLE001 - an undecodable stream is the server's error to report
            result.error = result.error or f"undecodable {spec.response_format} audio: {exc}"
    if result.audio_s > 0 and result.e2e_s:
        result.rtf = result.e2e_s / result.audio_s

    if result.status == 503:
        result.outcome = "rejected"
    elif result.status == 200 and result.audio_s > 0 and not result.error:
        result.outcome = "ok"
    else:
        result.outcome = "error"
        if result.status == 200 and not result.error:
            result.error = "200 with no audio"
    return result


def _decoded_seconds_per_read(chunks: list[bytes], response_format: str) -> list[float]:
    """Seconds of audio each read made playable, for a compressed or containered stream.

    Decodes the whole stream with PyAV, notes where each packet ends in the byte stream and how
    many seconds it decodes to, then credits each packet to the read that completed it (a player
    can only play a packet once all of its bytes are in). Demuxers that do not give byte positions
    fall back to spreading the decoded total over the bytes.
    """
    import av  # imported here: PCM runs never need it

    data = b"".join(chunks)
    packets: list[tuple[int, float]] = []  # (byte offset where the packet ends, seconds)
    with av.open(io.BytesIO(data), mode="r", format=AV_FORMATS.get(response_format)) as container:
        stream = container.streams.audio[0]
        for packet in container.demux(stream):
            seconds = sum(frame.samples / float(frame.sample_rate) for frame in packet.decode())
            pos = packet.pos if packet.pos is not None and packet.pos >= 0 else None
            packets.append((None if pos is None else pos + packet.size, seconds))  # type: ignore[arg-type]
    total = sum(s for _, s in packets)
    read_ends, offset = [], 0
    for c in chunks:
        offset += len(c)
        read_ends.append(offset)
    if not packets or any(end is None for end, _ in packets):
        return [total * len(c) / max(1, len(data)) for c in chunks]
    per_read = [0.0] * len(chunks)
    i = 0
    for end, seconds in sorted(packets):
        while i < len(read_ends) - 1 and read_ends[i] < end:
            i += 1
        per_read[i] += seconds
    return per_read
