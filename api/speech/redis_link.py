"""What both halves of the fleet's Redis protocol share: keys, scripts, connection, errors,
figures, and the chunk job's payload.

The protocol itself (keys, scripts, their atomic steps) lives in `queue/` as Lua plus
`queue/PROTOCOL.md`; `api/speech/admission_client.py` (the side holding the HTTP connection) and
`api/speech/dispatcher.py` (the side running the model) are its two Python clients. This module loads
the scripts (each is `queue/lib.lua` followed by its body, registered with EVALSHA and re-loaded
transparently after a Redis restart), opens connections that fail fast, and turns every way Redis
can be unreachable into one exception, `QueueUnavailable`, so callers can fall back to local
serving. It imports neither torch nor FastAPI.

A job's payload is JSON `{"ids", "voice", "speed"}`: the voice is the request's, resolved once at
admission, in its canonical form (`Voice.canonical`: names and exact weights), which the replica's
VoiceBank (every worker loads the same voices) turns into the very same pack; the speed is the one
admit.lua's estimate uses too and returns 16-bit PCM (little-endian; its
replica's audio is on that grid already: worker/audio.py), so the owner's audio is bit-identical to
what its own replica would have made.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import ssl
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit, urlunsplit

import redis
import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import ConstantBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

QUEUE_DIR = Path(__file__).resolve().parents[2] / "queue"
SCRIPT_NAMES = ("reserve", "admit", "withdraw", "lease", "heartbeat", "complete", "fetch", "cancel", "release", "reap",
                "retry")
DEFAULT_PREFIX = "{kf}"  # braces: a Redis Cluster hash tag, so all of one fleet's keys share a slot

# The gauges that must return to zero when the fleet is idle (what the fault tests check).
GAUGES = ("admitted", "queued_jobs", "queued_work_ms", "inflight_jobs", "inflight_work_ms")


def worker_id() -> str:
    """This process's name in the queue (owner and replica): unique across hosts and restarts."""
    return f"{socket.gethostname()}-{os.getpid()}"


def encode_job(ids: Sequence[int], voice: str, speed: float) -> bytes:
    return json.dumps({"ids": [int(i) for i in ids], "voice": voice, "speed": float(speed)},
                      separators=(",", ":")).encode()


def decode_job(payload: bytes) -> tuple[list[int], str, float]:
    d = json.loads(payload)
    return list(d["ids"]), str(d["voice"]), float(d["speed"])


class QueueUnavailable(RuntimeError):
    """Redis cannot be reached (down, restarting, network): the caller should serve locally."""


@contextlib.contextmanager
def unavailable_as_error(what: str) -> Iterator[None]:
    """Re-raise every 'Redis is unreachable' failure as `QueueUnavailable`, saying what failed."""
    try:
        yield
    except (RedisConnectionError, RedisTimeoutError, OSError) as e:
        raise QueueUnavailable(f"Redis unavailable during {what}: {e}") from e


class TracksAvailability:
    """Both ends of the queue call Redis through `_call`, which turns a lost connection into
    `QueueUnavailable` and reports to the worker's queue owner (`worker_queue`) whether the call got
    an answer, as its `side`; `degraded` reads back whether this side's last call failed."""

    worker_queue: Any  # api.speech.worker_queue.WorkerQueueOwner
    side: str

    @property
    def degraded(self) -> bool:
        return self.worker_queue.unreachable(self.side)

    async def _call(self, what: str, fn, *args):
        try:
            with unavailable_as_error(what):
                reply = await fn(*args)
        except QueueUnavailable:
            self.worker_queue.redis_answered(self.side, False)
            raise
        self.worker_queue.redis_answered(self.side, True)
        stop_if_cancelled(what)
        return reply


def stop_if_cancelled(what: str) -> None:
    """Raise CancelledError in a task that has been cancelled. redis-py (7.x with a socket timeout,
    every 8.x) can swallow a cancellation that arrives during a command, or was pending when it
    began, and return the reply as if nothing had happened: a client that left must still stop its
    stream at once, and a background loop that calls Redis must still end when its owner closes
    (an owner heartbeat that swallowed its cancel kept a worker's shutdown waiting forever). So
    every call to Redis is followed by this check. (Clean-up calls after a cancellation run
    shielded, in a task of their own, so this never cuts them short.)"""
    task = asyncio.current_task()
    if task is not None and task.cancelling() > 0:
        raise asyncio.CancelledError(f"cancelled during {what}")


def _driver_info() -> dict:
    """redis-py's client name and version, read once: redis-py >= 7 otherwise looks its own version
    up in the package metadata for every new connection (milliseconds of file reading and header
    parsing on the event loop, paid by whichever request opens the connection)."""
    try:
        from redis.driver_info import DriverInfo
    except ImportError:  # redis-py < 7: the version is a constant there
        return {}
    return {"driver_info": DriverInfo(lib_version=redis.__version__)}


_DRIVER_INFO = _driver_info()


def connect(url: str = "redis://127.0.0.1:6379/0", *, connect_timeout_s: float = 1.0,
            socket_timeout_s: float = 5.0) -> aioredis.Redis:
    """An asyncio Redis client that fails fast: one immediate retry (a pooled connection that a
    Redis restart broke), then `ConnectionError`. redis-py's default retries back off for seconds,
    which would hold a request instead of letting its worker fall back. A user and password in the
    URL work as redis-py parses them; a `rediss://` URL verifies the server against
    KOKORO_REDIS_TLS_CA_FILE (`tls_options`). `socket_timeout_s` must exceed the longest blocking
    read (BLPOP) the clients issue."""
    return aioredis.Redis.from_url(
        url,
        socket_connect_timeout=connect_timeout_s,
        socket_timeout=socket_timeout_s,
        retry=Retry(ConstantBackoff(0.05), 1),
        retry_on_error=[RedisConnectionError],
        health_check_interval=0,
        **tls_options(url),
        **_DRIVER_INFO,
    )


# --- a Redis on another machine: TLS, the password, and what a wrong one says ----------------------

def tls_options(url: str) -> dict[str, str]:
    """redis-py's TLS arguments for `url` from the settings: the CA the server's certificate must
    chain to (and name the URL's host), and this fleet's own certificate when the server asks."""
    if not url.startswith("rediss://"):
        return {}
    from api.settings import Settings

    s = Settings.from_env(only=("redis_tls_ca_file", "redis_tls_cert_file", "redis_tls_key_file"))
    options = {"ssl_cert_reqs": "required"}
    for name, value in (("ssl_ca_certs", s.redis_tls_ca_file), ("ssl_certfile", s.redis_tls_cert_file),
                        ("ssl_keyfile", s.redis_tls_key_file)):
        if value:
            options[name] = value
    return options


def redacted_url(url: str) -> str:
    """A Redis URL fit for a log line or an error: the user stays, the password does not."""
    parts = urlsplit(url)
    if "@" not in parts.netloc and "password=" not in parts.query.lower():
        return url  # nothing secret (and a unix:// path stays as written)
    netloc = parts.netloc
    if "@" in netloc:
        userinfo, host = netloc.rsplit("@", 1)
        # A lone `secret@host` is hidden whole: redis-py reads it as a user name, other clients as the password.
        user = userinfo.split(":", 1)[0] if ":" in userinfo else ""
        netloc = f"{user}:***@{host}" if userinfo else host
    query = "&".join(f"{k}=***" if k.lower() == "password" else f"{k}={v}"
                     for k, v in parse_qsl(parts.query, keep_blank_values=True))
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


class RedisMisconfigured(SystemExit):
    """The Redis at REDIS_URL answers but refuses this fleet (password, ACL rights, TLS certificate):
    a start-up error, since waiting would never help."""


def check_at_start(url: str, timeout_s: float = 5.0) -> str:
    """Before the workers start: raise `RedisMisconfigured` when the Redis at `url` refuses the
    password, the ACL user's rights to run the queue's scripts, or the TLS handshake; return a
    warning line when it is only unreachable (the workers serve locally until it answers), else ''.
    Neither names the password."""
    from redis.exceptions import AuthenticationError, NoPermissionError, ResponseError

    async def probe() -> None:
        client = connect(url, connect_timeout_s=timeout_s, socket_timeout_s=timeout_s)
        try:
            await client.ping()
            await client.eval("return 1", 0)  # the queue is Lua: an ACL user without scripting is refused now
        finally:
            await client.aclose()

    where = redacted_url(url)
    secret = urlsplit(url).password or ""
    for option, path in tls_options(url).items():
        if option != "ssl_cert_reqs" and not Path(path).is_file():
            raise RedisMisconfigured(f"kokoro-fleet serve: the TLS file {path} for the Redis at {where} does not "
                                     "exist (KOKORO_REDIS_TLS_CA_FILE, KOKORO_REDIS_TLS_CERT_FILE, "
                                     "KOKORO_REDIS_TLS_KEY_FILE)")
    try:
        asyncio.run(probe())
    except (AuthenticationError, NoPermissionError, ResponseError) as e:
        raise RedisMisconfigured(f"kokoro-fleet serve: the Redis at {where} refused this fleet: "
                                 f"{_hidden(str(e), secret)} (check the user and password in REDIS_URL and "
                                 "that user's ACL rights: the queue runs Lua scripts)") from None
    except (RedisConnectionError, RedisTimeoutError, OSError) as e:
        tls = _tls_cause(e)
        if tls is not None:
            raise RedisMisconfigured(f"kokoro-fleet serve: the TLS handshake with the Redis at {where} failed: "
                                     f"{_hidden(str(tls), secret)} (KOKORO_REDIS_TLS_CA_FILE must hold the "
                                     "authority that signed the server's certificate, and the certificate must "
                                     "name the URL's host)") from None
        return f"the Redis at {where} does not answer yet ({_hidden(str(e), secret)}): serving locally until it does"
    return ""


def _tls_cause(error: BaseException) -> BaseException | None:
    """The TLS failure behind a connection error, if that is what it was."""
    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, ssl.SSLError) or "SSL" in str(seen):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


def _hidden(text: str, secret: str) -> str:
    return text.replace(secret, "***") if secret else text


async def open_connections(client: aioredis.Redis, count: int) -> None:
    """Open `count` pooled connections now (one PING each, concurrently), so that a burst of
    requests finds them ready instead of each opening its own on the request path."""
    with unavailable_as_error("opening connections"):
        await asyncio.gather(*(client.ping() for _ in range(count)))


def script_source(name: str) -> str:
    """The text Redis runs for script `name`: the shared prelude, then the script's body."""
    return (QUEUE_DIR / "lib.lua").read_text() + "\n" + (QUEUE_DIR / f"{name}.lua").read_text()


class Scripts:
    """The protocol's scripts registered on one client; `await scripts.admit(prefix, ...)`."""

    def __init__(self, client: aioredis.Redis):
        for name in SCRIPT_NAMES:
            setattr(self, name, _Bound(client.register_script(script_source(name))))


class _Bound:
    def __init__(self, script):
        self._script = script

    async def __call__(self, *args):
        return await self._script(keys=[], args=list(args))


@dataclass
class QueueStats:
    """One consistent snapshot of the queue's gauges and counters (see queue/PROTOCOL.md)."""

    fields: dict[str, float]
    queue_len: int        # ZCARD queue: must equal queued_jobs
    leases: int           # ZCARD leases: must equal inflight_jobs
    requests: int         # HLEN requests: must equal admitted
    live_replicas: int

    def __getitem__(self, name: str) -> float:
        return self.fields.get(name, 0)

    @property
    def rate(self) -> float | None:
        """Measured audio seconds per busy second of one replica (None until a job completed)."""
        return self.fields.get("rate")

    def gauges(self) -> dict[str, float]:
        return {g: self[g] for g in GAUGES}

    def consistent(self) -> bool:
        """The counters agree with the structures they count."""
        return (self["queued_jobs"] == self.queue_len and self["inflight_jobs"] == self.leases
                and self["admitted"] == self.requests)


async def read_stats(client: aioredis.Redis, prefix: str = DEFAULT_PREFIX) -> QueueStats:
    with unavailable_as_error("reading queue stats"):
        async with client.pipeline(transaction=True) as pipe:
            pipe.hgetall(f"{prefix}:stats")
            pipe.zcard(f"{prefix}:queue")
            pipe.zcard(f"{prefix}:leases")
            pipe.hlen(f"{prefix}:requests")
            pipe.time()
            pipe.zrange(f"{prefix}:replicas", 0, -1, withscores=True)
            raw, queue_len, leases, requests, (sec, usec), replicas = await pipe.execute()
    now_ms = sec * 1000 + usec // 1000
    fields = {k.decode(): float(v) for k, v in raw.items()}
    live = sum(1 for _, expiry in replicas if expiry > now_ms)
    return QueueStats(fields, queue_len, leases, requests, live)


@dataclass
class ReplicaStatus:
    replica: str
    alive: bool
    busy: bool
    jobs_done: int
    busy_seconds: float
    audio_seconds: float
    engine: str | None = None  # "torch cuda bf16", "sim"; None from a replica that writes none
    running_seconds: float = 0.0  # how long its current lease has run; busy_seconds counts a job when it completes

    @property
    def busy_so_far(self) -> float:
        """Busy seconds including the job in hand: what a busy fraction over an interval shorter
        than a job must read, or it shows 0% until the job completes and then well over 100%."""
        return self.busy_seconds + self.running_seconds


def running_seconds(row: dict[str, str], now_ms: int, alive: bool) -> float:
    """Seconds the replica's current lease has run, from its row's `since`; 0 when it is idle,
    dead (a dead replica's row keeps busy=1 until a reaper drops it) or writes no `since`."""
    if not alive or row.get("busy") != "1" or "since" not in row:
        return 0.0
    return max(0, now_ms - int(row["since"])) / 1000


async def read_replicas(client: aioredis.Redis, prefix: str = DEFAULT_PREFIX) -> list[ReplicaStatus]:
    """Every replica Redis knows of, for `kokoro-fleet status` and /metrics."""
    with unavailable_as_error("reading replica table"):
        (sec, usec) = await client.time()
        now_ms = sec * 1000 + usec // 1000
        rows = []
        for name, expiry in await client.zrange(f"{prefix}:replicas", 0, -1, withscores=True):
            h = {k.decode(): v.decode() for k, v in (await client.hgetall(f"{prefix}:replica:{name.decode()}")).items()}
            rows.append(ReplicaStatus(
                replica=name.decode(), alive=expiry > now_ms, busy=h.get("busy") == "1",
                jobs_done=int(h.get("jobs_done", 0)), busy_seconds=int(h.get("busy_ms", 0)) / 1000,
                audio_seconds=int(h.get("audio_ms", 0)) / 1000, engine=h.get("engine"),
                running_seconds=running_seconds(h, now_ms, alive=expiry > now_ms)))
    return rows
