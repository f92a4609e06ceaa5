"""Download links: Kokoro-FastAPI's `return_download_link`, kept for the clients that use it.

A speech request with `return_download_link: true` gets an `X-Download-Path: /download/NAME`
header at once, and the same audio (in `download_format`, else the response's format) is saved to
a file on this machine; `GET /v1/download/NAME` (or `/download/NAME`) serves it once the response
that made it has ended. The files live in one directory that every worker process of the machine
shares, so any worker serves any worker's file; a fleet of several machines needs the download to
reach the machine that made it (the same limit as Kokoro-FastAPI's temp files).

    store = DownloadStore(directory, max_age_s=3600, max_bytes=1 << 30)
    file = store.create("mp3")        # NAME.mp3.part exists from now on: "still being made"
    file.save(data)                   # at the end: written, then renamed to NAME.mp3
    file.discard()                    # the request failed or its client left: nothing to fetch
    path = store.find(name)           # the finished file, or ApiError 404 / 409

Names are 128 random bits (a link is as private as the response it came with) and are checked
against a strict pattern before they touch the filesystem. Old files go first when the directory
passes its size bound, and every file goes after `max_age_s`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import secrets
import tempfile
import time
from pathlib import Path

from api.errors import ApiError

log = logging.getLogger("kokoro_fleet.api")

PART = ".part"
LINK_PREFIX = "/download/"
_NAME = re.compile(r"^[0-9a-f]{32}\.(mp3|opus|aac|flac|wav|pcm)$")


def default_directory() -> Path:
    return Path(tempfile.gettempdir()) / "kokoro-fleet-downloads"


class DownloadFile:
    """One request's file, from the link handed out to the finished file (or its removal)."""

    def __init__(self, directory: Path, name: str):
        self.name = name
        self.link = LINK_PREFIX + name
        self._final = directory / name
        self._part = directory / (name + PART)

    def save(self, data: bytes) -> None:
        """Write the whole file and publish it under its name (blocking: run it off the event loop)."""
        with open(self._part, "wb") as f:
            f.write(data)
        os.replace(self._part, self._final)  # atomic: a reader sees the whole file or none

    def discard(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self._part.unlink()


class DownloadStore:
    def __init__(self, directory: Path | str, max_age_s: float, max_bytes: int):
        self.directory = Path(directory).expanduser()
        self.max_age_s = max_age_s
        self.max_bytes = max_bytes

    def create(self, fmt: str) -> DownloadFile:
        """A new file's name, marked as being made; old files are cleared first. Raises ApiError
        (500) when the directory cannot be written, before any audio is made."""
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            self._clean()
            file = DownloadFile(self.directory, f"{secrets.token_hex(16)}.{fmt}")
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
            raise ApiError(409, f"The download {name} is still being made; fetch it once the response that "
                                "gave its link has ended.", param="filename", code="download_not_ready")
        raise ApiError(404, f"No download {name}: downloads are kept {self.max_age_s:g} s "
                            "(KOKORO_DOWNLOAD_MAX_AGE_SECONDS), and only if the request that made them finished.",
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
