"""A fitting job's state read from a voices directory that several machines share: a job running on
another host is reported as running (its child's pid means nothing here) until its deadline and a
grace period have passed; a job of this host whose child is gone is interrupted at once."""

from __future__ import annotations

import json
import subprocess
import sys
import time

from api.voice_fit_jobs import HOST, JOBS_DIR, OTHER_HOST_GRACE_S, FitJobs


def _job(directory, job_id: str, **fields) -> None:
    job = {"id": job_id, "object": "voice.fit_job", "name": "af_mine", "status": "running",
           "created_at": int(time.time()), "transcript": None, "progress": None, "report": None, "error": None,
           "minutes": 2.0, **fields}
    (directory / JOBS_DIR).mkdir(exist_ok=True)
    (directory / JOBS_DIR / f"{job_id}.json").write_text(json.dumps(job))


def test_a_job_of_another_host_runs_until_its_deadline_and_grace_and_one_of_this_host_stops_with_its_child(tmp_path):
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(gone.stdout)  # a pid that has exited: no process of this host has it now (or soon)
    old = int(time.time() - 2 * 60 - OTHER_HOST_GRACE_S - 5)
    _job(tmp_path, "vfit_elsewhere", host=f"{HOST}-other", pid=dead_pid)
    _job(tmp_path, "vfit_elsewherelong", host=f"{HOST}-other", pid=dead_pid, created_at=old)
    _job(tmp_path, "vfit_here", host=HOST, pid=dead_pid)
    _job(tmp_path, "vfit_older", pid=dead_pid)  # written before jobs named their host: this host's

    jobs = FitJobs(tmp_path)
    assert jobs.get("vfit_elsewhere")["status"] == "running"
    assert jobs.get("vfit_elsewherelong")["error"]["code"] == "fit_interrupted"
    assert jobs.get("vfit_here")["error"]["code"] == "fit_interrupted"
    assert jobs.get("vfit_older")["status"] == "failed"
    assert not {"pid", "host", "minutes"} & set(jobs.get("vfit_elsewhere"))  # what the API answers
