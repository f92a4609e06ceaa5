"""What one server process serves with: its settings, speech service, per-process admission,
metrics, the thread pool its PyAV encoders run in, and the directory of download files."""

from __future__ import annotations

import hashlib
import hmac
import math
import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from api.admission import ProcessAdmission
from api.downloads import DownloadStore
from api.errors import ApiError
from api.metrics import Metrics
from api.speech.contract import Overloaded, SpeechBackend
from worker.machine import usable_cores
from api.settings import Settings


def encode_pool(workers: int = 1) -> ThreadPoolExecutor:
    """One pool per process: PyAV releases the GIL while it encodes, so encodes of several streams
    run on several cores while the event loop keeps serving. The fleet's `workers` processes share
    the machine's cores, so each gets its share of threads (at least one): a thread per core in
    every worker would only make the threads take turns on the cores, and the switching costs CPU
    (measured with `python -m loadtest.frontend`: loadtest/README.md)."""
    threads = max(1, math.ceil(usable_cores() / max(1, workers)))
    return ThreadPoolExecutor(max_workers=threads, thread_name_prefix="kokoro-encode")


@dataclass
class AppState:
    settings: Settings
    service: SpeechBackend | None
    admission: ProcessAdmission
    downloads: DownloadStore  # return_download_link's files (api.downloads)
    metrics: Metrics = field(default_factory=Metrics)
    encoders: ThreadPoolExecutor = field(default_factory=encode_pool)
    ready: bool = False
    load_error: str | None = None
    api_keys: tuple[tuple[str, str], ...] = ()  # (name, key): parse_api_keys(KOKORO_API_KEYS)

    @property
    def replicas_planned(self) -> int:
        """The replicas this server starts: KOKORO_REPLICAS (`serve` sets it from the GPU plan), else
        one in every worker."""
        return max(1, self.settings.replicas or self.settings.workers or 1)

    def holds_replica(self) -> bool:
        """Whether this worker's service runs a model replica (an HTTP front of the queue runs none)."""
        from api.speech.dispatcher import NoReplica

        return not isinstance(getattr(self.service, "replica", None), NoReplica)

    def metrics_page(self) -> str:
        """/metrics: the whole server's figures, whichever worker a scrape reaches (api.metrics)."""
        return self.metrics.render()

    def check_api_key(self, authorization: str) -> str | None:
        """With KOKORO_API_KEYS set, an `Authorization: Bearer KEY` header naming one of them, or a
        401; the key's name (None when no key is needed)."""
        if not self.api_keys:
            return None
        scheme, _, token = authorization.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise ApiError(401, "Missing API key: send it as `Authorization: Bearer YOUR_KEY`.",
                           type="invalid_request_error", code="invalid_api_key")
        given = token.strip().encode()
        matched = None
        for name, key in self.api_keys:  # every key compared, in constant time each
            if hmac.compare_digest(given, key.encode()):
                matched = name
        if matched is None:
            raise ApiError(401, "Incorrect API key provided.", type="invalid_request_error", code="invalid_api_key")
        return matched

    def require_service(self) -> SpeechBackend:
        if self.service is None or not self.ready:
            if self.load_error:
                raise ApiError(503, "The model failed to load; the operator has to fix the server (see its log).",
                               type="server_error", code="model_unavailable")
            raise Overloaded(2.0, "The model is still loading; retry in a few seconds.")
        return self.service


_KEY_NAME = re.compile(r"[A-Za-z0-9_.-]{1,40}")


def parse_api_keys(setting: str) -> tuple[tuple[str, str], ...]:
    """KOKORO_API_KEYS -> (name, key) pairs. An entry `NAME:KEY` names its key (a product, a team),
    so the access log and /metrics count usage by name and never show the key; an unnamed key is
    named `key-` and the first 6 hex digits of its SHA-256."""
    pairs = []
    for entry in (e.strip() for e in setting.split(",")):
        if not entry:
            continue
        name, colon, key = entry.partition(":")
        if not colon or not _KEY_NAME.fullmatch(name) or not key:
            name, key = "key-" + hashlib.sha256(entry.encode()).hexdigest()[:6], entry
        pairs.append((name, key))
    return tuple(pairs)
