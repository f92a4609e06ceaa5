"""The transport pieces under the routes: a streaming response that notices a departed client at
once, and the middleware that gives every request an id, one access-log line and its metrics."""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from dataclasses import dataclass

from starlette.responses import StreamingResponse
from starlette.types import Message, Receive, Scope, Send

from api.metrics import Metrics

access_log = logging.getLogger("kokoro_fleet.access")


@dataclass
class RequestInfo:
    """What the access log and metrics record about one request; handlers fill it in."""

    id: str
    started: float
    voice: str | None = None
    chars: int | None = None
    format: str | None = None
    stream: bool | None = None
    ttfa_s: float | None = None
    audio_s: float = 0.0
    outcome: str = "ok"  # ok | error | disconnected
    key: str | None = None  # the name of the API key it came with (KOKORO_API_KEYS)

    def first_audio(self) -> None:
        if self.ttfa_s is None:
            self.ttfa_s = time.perf_counter() - self.started


class ClientStalled(Exception):
    """The client took none of the bytes sent for the response's send timeout."""


class DisconnectAwareStreamingResponse(StreamingResponse):
    """A streaming response that stops producing the moment its client disconnects, or stalls.

    Starlette's own listens for `http.disconnect` only when the server speaks ASGI spec < 2.4;
    under 2.4 it notices a departed client when the next send fails, i.e. after the next chunk
    has been synthesized for nobody. Here a listener always runs and cancels the producer at
    once: the chunk in flight is the last one, and the request's slot frees immediately.

    A client that stays connected but takes no bytes (it stopped reading, or vanished from the
    network without a FIN: TCP then retries for 15 minutes and more) never disconnects; its sends
    wait for buffer space forever and its request holds a place in the server. With `send_timeout_s`
    a send that waits longer is given up: the request ends (outcome `stalled`) and Uvicorn closes
    the connection (it logs that the response was not completed).
    """

    def __init__(self, *args, send_timeout_s: float = 0.0, **kwargs):
        super().__init__(*args, **kwargs)
        self.send_timeout_s = send_timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        producer = asyncio.ensure_future(self.stream_response(self._bounded(send)))
        listener = asyncio.ensure_future(self.listen_for_disconnect(receive))
        try:
            await asyncio.wait({producer, listener}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (producer, listener):
                task.cancel()
            await asyncio.gather(producer, listener, return_exceptions=True)
            # The body's generator may be suspended at a send that failed: close it now, so the
            # request's slot and queued work are freed at once rather than when it is collected.
            closing = getattr(self.body_iterator, "aclose", None)
            if closing is not None:
                await closing()
        if producer.done() and not producer.cancelled():
            error = producer.exception()
            if isinstance(error, ClientStalled):
                info = scope.get("state", {}).get("info")
                if info is not None:
                    info.outcome = "stalled"
                access_log.warning("request %s: %s", getattr(info, "id", "?"), error)
            elif error is not None and not isinstance(error, OSError):  # OSError: the client went away mid-send
                raise error

    def _bounded(self, send: Send) -> Send:
        if not self.send_timeout_s:
            return send

        async def bounded_send(message: Message) -> None:
            # Uvicorn waits for the connection to drain before it writes, so a send given up here
            # has written nothing: the bytes on the wire stay whole. asyncio.wait, not wait_for:
            # wait_for (before Python 3.12) drops a cancel that lands as the send completes, and the
            # producer, cancelled for a departed client, synthesized the rest for nobody.
            sending = asyncio.ensure_future(send(message))
            try:
                done, _ = await asyncio.wait({sending}, timeout=self.send_timeout_s)
            finally:
                sending.cancel()  # given up (timed out, or we were cancelled); nothing once it is done
            if not done:
                raise ClientStalled(f"the client took no bytes for {self.send_timeout_s:g} s "
                                    "(KOKORO_SEND_TIMEOUT_SECONDS): closing its connection")
            sending.result()
        return bounded_send


class AccessLogMiddleware:
    """One structured log line and one metrics sample per request, whatever its outcome."""

    def __init__(self, app, metrics: Metrics, quiet_paths: tuple[str, ...] = ("/health", "/ready", "/metrics"),
                 engine: str = "torch"):
        """engine: sent on every response as `X-Kokoro-Engine`, so a client of a simulated server
        (KOKORO_ENGINE=sim) can tell that its audio is synthetic."""
        self.app = app
        self.metrics = metrics
        self.engine_header = (b"x-kokoro-engine", engine.encode())
        self.quiet_paths = quiet_paths  # probes, scrapes and panels that poll every few seconds: logged at debug

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        given = headers.get(b"x-request-id", b"").decode("latin-1")
        request_id = given[:64] if given and given.isprintable() else f"req_{uuid.uuid4().hex[:16]}"
        info = RequestInfo(id=request_id, started=time.perf_counter())
        scope.setdefault("state", {})["info"] = info
        status: int | None = None
        completed = False
        client_left = False  # the server saw the client hang up before the response was complete

        async def send_and_watch(message: Message) -> None:
            nonlocal status, completed
            if message["type"] == "http.response.start":
                status = message["status"]
                message.setdefault("headers", [])
                message["headers"] = [*message["headers"], (b"x-request-id", request_id.encode()), self.engine_header]
            elif message["type"] == "http.response.body" and not message.get("more_body", False):
                completed = True
            await send(message)

        async def receive_and_watch() -> Message:
            nonlocal client_left
            message = await receive()
            if message["type"] == "http.disconnect" and not completed:
                client_left = True
            return message

        try:
            await self.app(scope, receive_and_watch, send_and_watch)
        except BaseException:
            if info.outcome == "ok":
                info.outcome = "error"
            raise
        finally:
            self._record(scope, info, status, completed and not client_left)

    def _record(self, scope: Scope, info: RequestInfo, status: int | None, completed: bool) -> None:
        e2e = time.perf_counter() - info.started
        route = getattr(scope.get("route"), "path", None) or "unmatched"
        if not completed and info.outcome == "ok":
            info.outcome = "disconnected"
        shown_status = status if status is not None else 500
        gone = info.outcome in ("disconnected", "stalled")  # a stalled client is cut off: gone all the same
        m = self.metrics
        m.count_request(route, "disconnected" if gone else shown_status)
        if info.key is not None:
            m.count_key(info.key, "disconnected" if gone else shown_status, info.audio_s)
        if status == 200 and info.stream is not None:  # a speech response
            if info.ttfa_s is not None:
                m.ttfa.observe(info.ttfa_s)
            if info.outcome == "ok":
                m.e2e.observe(e2e)
            elif gone:
                m.disconnects.inc()
                m.stalls.inc(info.outcome == "stalled")
        record = {
            "id": info.id, "method": scope.get("method"), "path": scope.get("path"), "status": shown_status,
            "outcome": info.outcome, "voice": info.voice, "chars": info.chars, "format": info.format,
            "stream": info.stream,
            "ttfa_ms": None if info.ttfa_s is None else round(info.ttfa_s * 1000, 1),
            "e2e_ms": round(e2e * 1000, 1), "audio_s": round(info.audio_s, 3),
            **({"key": info.key} if info.key is not None else {}),
        }
        access_log.log(logging.DEBUG if route in self.quiet_paths else logging.INFO, json.dumps(record))

