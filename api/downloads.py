"""Download links: Kokoro-FastAPI's `return_download_link`, kept for the clients that use it.

A speech request with `return_download_link: true` gets an `X-Download-Path: /download/NAME`
header at once, and the same audio (in `download_format`, else the response's format) is saved to
a file on this machine; `GET /v1/download/NAME` (or `/download/NAME`) serves it once the response
that made it has ended. The files live in one directory that every worker process of the machine
shares, so any worker serves any worker's file. A fleet of several machines (Modal's containers on
one external Redis) keeps each file up to KOKORO_DOWNLOAD_SHARED_MAX_MIB in that Redis too
(`SharedDownloads`), so the machine a download request reaches serves it whichever made it.

    store = DownloadStore(directory, max_age_s=3600, max_bytes=1 << 30, shared=None)
    file = await store.start("mp3")   # NAME.mp3.part exists from now on: "still being made"
    await file.finish(data)           # at the end: written, then renamed to NAME.mp3 (and shared)
    file.discard()                    # the request failed or its client left: nothing to fetch
    found = await store.lookup(name)  # the finished file's path, or its bytes from another
                                      # machine; ApiError 404 / 409
    path = store.find(name)           # this machine's file only

Names are 128 random bits (a link is as private as the response it came with) and are checked
against a strict pattern before they touch the filesystem. Old files go first when the directory
passes its size bound, and every file goes after `max_age_s`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import secrets
import tempfile
import time
from pathlib import Path
from urllib.parse import urlparse

from redis.exceptions import RedisError

from api.errors import ApiError

log = logging.getLogger("kokoro_fleet.api")

PART = ".part"
LINK_PREFIX = "/download/"
_NAME = re.compile(r"^[0-9a-f]{32}\.(mp3|opus|aac|flac|wav|pcm)$")


def default_directory() -> Path:
    return Path(tempfile.gettempdir()) / "kokoro-fleet-downloads"


class SharedDownloads:
    """Finished download files kept in the fleet's Redis as well, for the fleet's other machines:
    `{prefix}:download:NAME` holds the bytes (up to `max_bytes`), `...:making` marks one still
    being made; both expire with the file. Every call is best effort: with Redis unreachable, a
    download still works on the machine that made it."""

    def __init__(self, client, max_bytes: int, max_age_s: float, prefix: str):
        self.client = client
        self.max_bytes = max_bytes
        self.max_age_s = max_age_s
        self.prefix = prefix
        self._tasks: set[asyncio.Task] = set()
        self._failing = False  # warned that Redis does not answer: once, until it does again

    @classmethod
    def for_fleet(cls, redis_url: str, max_bytes: int, max_age_s: float) -> "SharedDownloads | None":
        """Shared downloads where the fleet's Redis is another machine's (so the fleet may span
        several); None for no Redis, no size, or a Redis on this machine (the embedded one, a
        loopback address: every worker here shares the download directory already)."""
        if not redis_url or max_bytes <= 0 or _on_this_machine(redis_url):
            return None
        from api.speech.redis_link import DEFAULT_PREFIX, connect

        return cls(connect(redis_url), max_bytes, max_age_s, DEFAULT_PREFIX)

    def _key(self, name: str) -> str:
        return f"{self.prefix}:download:{name}"

    async def making(self, name: str) -> None:
        await self._quietly(self.client.set(self._key(name) + ":making", 1, ex=max(1, round(self.max_age_s))))

    async def publish(self, name: str, data: bytes) -> None:
        if len(data) <= self.max_bytes:
            await self._quietly(self.client.set(self._key(name), data, ex=max(1, round(self.max_age_s))))
        await self._quietly(self.client.delete(self._key(name) + ":making"))

    def forget(self, name: str) -> None:
        """The download will never be finished: say so (in the background; callable in a `finally`)."""
        task = asyncio.get_running_loop().create_task(self._quietly(self.client.delete(self._key(name) + ":making")))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def fetch(self, name: str) -> tuple[bytes | None, bool]:
        """(The file's bytes, or None; whether it is still being made)."""
        found = await self._quietly(self.client.mget(self._key(name), self._key(name) + ":making"))
        data, making = found if found else (None, None)
        return data, making is not None

    async def _quietly(self, call):
        try:
            answer = await call
        except (RedisError, OSError) as e:
            if not self._failing:
                log.warning("shared downloads: the fleet's Redis did not answer (%s); links work on their own "
                            "machine meanwhile", e)
            self._failing = True
            return None
        self._failing = False
        return answer


def _on_this_machine(redis_url: str) -> bool:
    parsed = urlparse(redis_url)
    return parsed.scheme == "unix" or (parsed.hostname or "localhost") in ("localhost", "127.0.0.1", "::1")


class DownloadFile:
    """One request's file, from the link handed out to the finished file (or its removal)."""

    def __init__(self, directory: Path, name: str, shared: SharedDownloads | None = None):
        self.name = name
        self.link = LINK_PREFIX + name
        self._final = directory / name
        self._part = directory / (name + PART)
        self._shared = shared

    async def finish(self, data: bytes) -> None:
        """Save the file (off the event loop), then share it with the fleet's other machines."""
        await asyncio.to_thread(self.save, data)
        if self._shared is not None:
            await self._shared.publish(self.name, data)

    def save(self, data: bytes) -> None:
        """Write the whole file and publish it under its name (blocking: run it off the event loop)."""
        with open(self._part, "wb") as f:
            f.write(data)
        os.replace(self._part, self._final)  # atomic: a reader sees the whole file or none

    def discard(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self._part.unlink()
        if self._shared is not None:
            self._shared.forget(self.name)


class DownloadStore:
    def __init__(self, directory: Path | str, max_age_s: float, max_bytes: int,
                 shared: SharedDownloads | None = None):
        self.directory = Path(directory).expanduser()
        self.max_age_s = max_age_s
        self.max_bytes = max_bytes
        self.shared = shared

    async def start(self, fmt: str) -> DownloadFile:
        """`create` off the event loop (it clears expired files first), told to the fleet's other machines."""
        file = await asyncio.to_thread(self.create, fmt)
        if self.shared is not None:
            await self.shared.making(file.name)
        return file

    async def lookup(self, name: str) -> Path | bytes:
        """This machine's finished file `name`, else (a fleet of several machines) its bytes as
        another machine shared them; ApiError 404 / 409 as `find`."""
        try:
            return self.find(name)
        except ApiError as missing:
            if self.shared is None or missing.status != 404 or not _NAME.match(name):
                raise
            data, making = await self.shared.fetch(name)
            if data is not None:
                return bytes(data)
            if making:
                raise _not_ready(name) from None
            raise

    def create(self, fmt: str) -> DownloadFile:
        """A new file's name, marked as being made; old files are cleared first. Raises ApiError
        (500) when the directory cannot be written, before any audio is made."""
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            self._clean()
            file = DownloadFile(self.directory, f"{secrets.token_hex(16)}.{fmt}", self.shared)
            file._part.touch(exist_ok=False)
        except OSError as e:
            log.error("download directory %s is not writable: %s", self.directory, e)
            raise ApiError(500, "The server cannot save download files (its download directory is not writable); "
                                "send the request without return_download_link and save the response body.",
                           type="server_error", param="return_download_link", code="downloads_unavailable") from None
        return file

    def find(self, name: str) -> Path:
        """The finished file `name`; ApiError 404 when there is none, 409 while it is being made."""
        if not _NAME.match(name):
            raise ApiError(404, f"No download {name!r}: a download name is what a speech request's "
                                "X-Download-Path header gives after /download/.", param="filename",
                           code="download_not_found")
        final = self.directory / name
        if final.is_file() and time.time() - final.stat().st_mtime <= self.max_age_s:
            return final
        if (self.directory / (name + PART)).exists():
            raise _not_ready(name)
        raise ApiError(404, f"No download {name}: downloads are kept {self.max_age_s:g} s "
                            "(KOKORO_DOWNLOAD_MAX_AGE_SECONDS), and only if the request that made them finished"
                            + ("" if self.shared is None else f"; one over {self.shared.max_bytes >> 20} MiB only on "
                               "the machine that made it (KOKORO_DOWNLOAD_SHARED_MAX_MIB)") + ".",
                       param="filename", code="download_not_found")

    def _clean(self) -> None:
        """Remove files older than the age bound (unfinished ones too: a worker that died left
        them), then the oldest finished ones while the directory is over its size bound."""
        now = time.time()
        finished: list[tuple[float, int, Path]] = []
        for entry in os.scandir(self.directory):
            if not entry.is_file(follow_symlinks=False):
                continue
            with contextlib.suppress(FileNotFoundError):  # another worker may be cleaning too
                stat = entry.stat(follow_symlinks=False)
                if now - stat.st_mtime > self.max_age_s:
                    os.unlink(entry.path)
                elif not entry.name.endswith(PART):
                    finished.append((stat.st_mtime, stat.st_size, Path(entry.path)))
        total = sum(size for _, size, _ in finished)
        for _, size, path in sorted(finished):
            if total <= self.max_bytes:
                break
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
            total -= size


def _not_ready(name: str) -> ApiError:
    return ApiError(409, f"The download {name} is still being made; fetch it once the response that gave its "
                         "link has ended.", param="filename", code="download_not_ready")
