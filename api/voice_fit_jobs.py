"""Fitting jobs: `POST /v1/audio/voices` starts one, any worker of the machine reports on it.

A job runs `kokoro-fleet voice fit --json-progress` (cli/voice_fit_cli.py) as a child process at
the lowest CPU priority (nice 19) on one thread, so speech requests always come first; its
progress lines are written to the job's state file in the voices directory's `.fit-jobs/`, which
every worker of the machine reads: polling and server-sent events answer from whichever worker a
request reaches (and from any machine that shares the directory: a job names the host it runs on,
since its child's pid means something only there). At most KOKORO_VOICE_FIT_JOBS jobs run at once
per directory (a lock file per slot, held by the worker that runs the job and freed by the system
if that worker dies); beyond them the request gets 503 with Retry-After.

The voice appears in the voices directory only whole (the command writes beside it and renames),
and only when the fit completes: a failed, cancelled or interrupted job leaves nothing behind
(the child's partial files are removed, the uploaded recording too).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import logging
import math
import os
import secrets
import signal
import socket
import sys
import time
from pathlib import Path

from api.speech.contract import Overloaded

log = logging.getLogger("kokoro_fleet.voice_fit")

JOBS_DIR = ".fit-jobs"
FINISHED = ("succeeded", "failed", "cancelled")
# How long a finished job's state stays readable.
KEEP_FINISHED_S = 24 * 3600
POLL_S = 0.5
# Beyond its deadline, how long a job of another machine (whose child this one cannot see) may
# still be loading its model or writing its voice before it counts as interrupted.
OTHER_HOST_GRACE_S = 600
HOST = socket.gethostname()


class JobNotFound(LookupError):
    pass


def _write_json(path: Path, content: dict) -> None:
    partial = path.with_name(f".{path.name}.{os.getpid()}.part")
    partial.write_text(json.dumps(content))
    os.replace(partial, path)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def child_environment(settings) -> dict[str, str]:
    """The settings a fitting child reads as the server does: the same weights, precision and cache."""
    return {"KOKORO_WEIGHTS": settings.weights, "KOKORO_WEIGHTS_DIR": settings.weights_dir,
            "KOKORO_CACHE_DIR": settings.cache_dir, "KOKORO_DEVICE": settings.device, "KOKORO_DTYPE": settings.dtype,
            "KOKORO_SEED": str(settings.seed), "KOKORO_VOICES_DIR": settings.voices_dir}


def _interrupted(job: dict) -> bool:
    """Whether an unfinished job's child is gone: on this host, its pid is no longer alive; on
    another (a shared voices directory), its deadline and a grace period have passed."""
    if job.get("host", HOST) == HOST:
        return bool(job.get("pid")) and not _alive(job["pid"])
    deadline = job["created_at"] + 60 * job.get("minutes", 10.0) + OTHER_HOST_GRACE_S
    return time.time() > deadline


class FitJobs:
    """The machine's fitting jobs, as one worker sees and runs them."""

    def __init__(self, voices_dir: str | Path, slots: int = 1, minutes: float = 10.0, candidates: int | None = None,
                 environment: dict[str, str] | None = None):
        self.voices_dir = Path(voices_dir)
        self.environment = environment or {}  # the settings the child must share with the server (its weights)
        self.dir = self.voices_dir / JOBS_DIR
        self.slots = slots
        self.minutes = minutes
        self.candidates = candidates
        self._running: dict[str, asyncio.subprocess.Process] = {}
        self._tasks: set[asyncio.Task] = set()

    # --- starting -------------------------------------------------------------------------------

    def _take_slot(self) -> int | None:
        """An open, locked slot file descriptor, or None when every slot is taken."""
        self.dir.mkdir(parents=True, exist_ok=True)
        for slot in range(self.slots):
            fd = os.open(self.dir / f"slot-{slot}.lock", os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return fd
            except BlockingIOError:
                os.close(fd)
        return None

    def _retry_after(self) -> float:
        """When a slot should be free: the soonest running job's time left (its ETA)."""
        etas = [(job.get("progress") or {}).get("eta_s", self.minutes * 60) for job in self.list()
                if job["status"] not in FINISHED]
        return max(5.0, min(etas, default=30.0))

    def start(self, sample: bytes, name: str, transcript: str | None) -> dict:
        """A new running job for the checked recording `sample` and name; Overloaded (503 with
        Retry-After) when the machine's jobs are all taken or a job is already fitting `name`."""
        if any(job["name"] == name and job["status"] not in FINISHED for job in self.list()):
            raise Overloaded(self._retry_after(), f"a fit of {name!r} is already running; wait for it (or cancel it)")
        fd = self._take_slot()
        if fd is None:
            retry = self._retry_after()
            raise Overloaded(retry, f"this machine is fitting {self.slots} voice(s) already (KOKORO_VOICE_FIT_JOBS); "
                             f"retry in about {math.ceil(retry)} s")
        job_id = f"vfit_{secrets.token_hex(8)}"
        sample_path = self.dir / f"{job_id}.sample"
        sample_path.write_bytes(sample)
        job = {"id": job_id, "object": "voice.fit_job", "name": name, "status": "queued", "created_at": int(time.time()),
               "transcript": transcript or None, "progress": None, "report": None, "error": None, "pid": None,
               "host": HOST, "minutes": self.minutes}
        _write_json(self._path(job_id), job)
        task = asyncio.get_running_loop().create_task(self._run(job, sample_path, fd))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return self.public(job)

    async def _run(self, job: dict, sample_path: Path, fd: int) -> None:
        name = job["name"]
        command = [sys.executable, "-m", "cli.main", "voice", "fit", str(sample_path), "--name", name, "--json-progress",
                   "--output-dir", str(self.voices_dir), "--minutes", str(self.minutes)]
        if self.candidates:
            command += ["--candidates", str(self.candidates)]
        if job["transcript"]:
            command += ["--transcript", job["transcript"]]
        # one thread at the lowest priority (the child lowers its own: cli/voice_fit_cli.py), so the
        # replicas' speech always comes first
        env = {**os.environ, **self.environment, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
        outcome: dict = {}
        try:
            process = await asyncio.create_subprocess_exec(
                *command, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env)
            self._running[job["id"]] = process
            job.update(status="running", pid=process.pid)
            _write_json(self._path(job["id"]), job)
            watcher = asyncio.get_running_loop().create_task(self._watch_cancel(job["id"], process))
            try:
                async for line in process.stdout:
                    try:
                        event = json.loads(line)
                    except ValueError:
                        continue
                    if event.get("event") == "progress":
                        job["progress"] = {k: v for k, v in event.items() if k != "event"}
                        _write_json(self._path(job["id"]), job)
                    else:
                        outcome = event
                stderr = (await process.stderr.read()).decode(errors="replace")[-2000:]
                code = await process.wait()
            finally:
                watcher.cancel()
            cancelled = self._cancel_path(job["id"]).exists()
            if code == 0 and outcome.get("event") == "done":
                job.update(status="succeeded", report=outcome.get("report"))
            elif cancelled:
                job.update(status="cancelled")
            else:
                error = {"code": outcome.get("code", "fit_failed"),
                         "message": outcome.get("message") or f"the fit stopped (exit {code}): {stderr.strip()[-500:]}"}
                job.update(status="failed", error=error)
                if code != 2:
                    log.error("voice fit %s of %s failed (exit %s): %s", job["id"], name, code, stderr.strip()[-1000:])
        except Exception as e:  # noqa: BLE001 - a job's failure must not leave it "running" forever
            log.exception("voice fit %s of %s failed", job["id"], name)
            job.update(status="failed", error={"code": "fit_failed", "message": f"{type(e).__name__}: {e}"})
        finally:
            self._running.pop(job["id"], None)
            if job["status"] != "succeeded":
                self._remove_leftovers(name)
            job["finished_at"] = int(time.time())
            _write_json(self._path(job["id"]), job)
            sample_path.unlink(missing_ok=True)
            self._cancel_path(job["id"]).unlink(missing_ok=True)
            os.close(fd)  # frees the slot

    def _remove_leftovers(self, name: str) -> None:
        """What a stopped child may have begun: partial files, a report without its voice."""
        for partial in self.voices_dir.glob(f".{name}.*.part"):
            partial.unlink(missing_ok=True)
        if not (self.voices_dir / f"{name}.pt").exists():
            (self.voices_dir / f"{name}.fit.json").unlink(missing_ok=True)

    async def _watch_cancel(self, job_id: str, process) -> None:
        """Stop the child once a cancel is asked for (by any worker: a file)."""
        while process.returncode is None:
            if self._cancel_path(job_id).exists():
                with contextlib.suppress(ProcessLookupError):
                    process.send_signal(signal.SIGKILL)
                return
            await asyncio.sleep(POLL_S)

    # --- reading --------------------------------------------------------------------------------

    def _path(self, job_id: str) -> Path:
        return self.dir / f"{job_id}.json"

    def _cancel_path(self, job_id: str) -> Path:
        return self.dir / f"{job_id}.cancel"

    def read(self, job_id: str) -> dict:
        if not job_id.startswith("vfit_") or not job_id[5:].isalnum():
            raise JobNotFound(job_id)
        try:
            job = json.loads(self._path(job_id).read_text())
        except (OSError, ValueError):
            raise JobNotFound(job_id) from None
        if job["status"] not in FINISHED and job_id not in self._running and _interrupted(job):
            job.update(status="failed", error={"code": "fit_interrupted",
                                               "message": "the server stopped during the fit; start it again"})
        return job

    def get(self, job_id: str) -> dict:
        return self.public(self.read(job_id))

    def list(self) -> list[dict]:
        jobs = []
        if not self.dir.is_dir():
            return jobs
        now = time.time()
        for path in sorted(self.dir.glob("vfit_*.json")):
            try:
                job = self.read(path.stem)
            except JobNotFound:
                continue
            if job["status"] in FINISHED and now - job.get("finished_at", now) > KEEP_FINISHED_S:
                path.unlink(missing_ok=True)
                continue
            jobs.append(job)
        return jobs

    @staticmethod
    def public(job: dict) -> dict:
        return {k: v for k, v in job.items() if k not in ("pid", "host", "minutes", "transcript")}

    def cancel(self, job_id: str) -> dict:
        job = self.read(job_id)
        if job["status"] not in FINISHED:
            self._cancel_path(job_id).touch()
        return self.public(job)

    async def events(self, job_id: str):
        """The job's state each time it changes, until it has finished (server-sent events' data)."""
        last = None
        while True:
            job = self.public(self.read(job_id))
            if job != last:
                yield job
                last = job
            if job["status"] in FINISHED:
                return
            await asyncio.sleep(POLL_S)

    async def aclose(self) -> None:
        """Cancel this worker's jobs (the server is stopping): their children are stopped, nothing kept."""
        for job_id in list(self._running):
            self._cancel_path(job_id).touch()
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=10)
