"""A streamed speech request kept in flight on a thread, for the drain tests (SIGTERM to the
entrypoint on this host, `docker stop` to a container): they stop the server once audio flows and
then check that the stream still finished whole."""

from __future__ import annotations

import threading

import httpx

# Several sentences, one chunk each, so the stream is still running when the server is stopped.
DRAIN_TEXT = ("The drain test speaks several sentences, so the stream is still running when the signal "
              "arrives. Each sentence becomes its own chunk of audio. The server must finish all of them "
              "before it exits, and the client must see a complete response.")


class InFlightStream:
    """POSTs DRAIN_TEXT as streamed PCM to `base` on a thread; `received` grows as audio arrives,
    `outcome` gets the status, then `complete` or the `error` of a cut stream."""

    def __init__(self, base: str, timeout: float):
        self.received = bytearray()
        self.outcome: dict[str, object] = {}
        self._first_audio = threading.Event()
        self._thread = threading.Thread(target=self._stream, args=(base, timeout))
        self._thread.start()

    def _stream(self, base: str, timeout: float) -> None:
        try:
            with httpx.stream("POST", f"{base}/v1/audio/speech", timeout=timeout, json={
                    "model": "kokoro", "voice": "af_heart", "input": DRAIN_TEXT, "response_format": "pcm",
                    "stream": True}) as response:
                self.outcome["status"] = response.status_code
                for chunk in response.iter_bytes():
                    self.received.extend(chunk)
                    self._first_audio.set()
            self.outcome["complete"] = True
        except Exception as exc:  # a cut stream raises here (incomplete chunked body)
            self.outcome["error"] = repr(exc)
        finally:
            self._first_audio.set()

    def wait_for_audio(self, timeout: float) -> bool:
        return self._first_audio.wait(timeout)

    def join(self, timeout: float) -> None:
        self._thread.join(timeout)

    @property
    def audio_seconds(self) -> float:
        return len(self.received) / (24000 * 2)
