"""A voice fitted through the HTTP API as a deployment serves it, with real processes: two
`kokoro-fleet serve` fleets (A of two Uvicorn workers, B of one; tiny weights, three candidates per
fit) on one redis-server this test owns, sharing one voices directory as machines share a volume
(docs/voices.md, "Every worker, every machine"). The voice is fitted through fleet A; fleet B
follows the job; then every worker of both fleets lists the voice and speaks it (the same audio
from each), every replica runs chunks of it, and a DELETE through fleet B removes it from all of
them. The fitting itself (bad input, cancel, restart) is tests/app/test_voice_fit_app.py's.
"""

from __future__ import annotations

import time

import httpx
import numpy as np
import pytest
import redis as redis_client
from voice_samples import speechlike, wav_file  # tests/voice_samples.py

from loadtest.dispatch import FleetProcess, start_all, stop_all

pytestmark = pytest.mark.slow

WORKERS = {"A": 2, "B": 1}  # B of one worker: a third process enough to show a second fleet, on a 2-core CI
SPEECH = {"model": "kokoro", "input": "A voice of my own, from every worker.", "response_format": "pcm",
          "stream": False}


def fresh(url: str, path: str) -> httpx.Response:
    """A GET on its own connection, so the kernel may hand it to any worker."""
    return httpx.get(url + path, timeout=30, headers={"Connection": "close"}, trust_env=False)


def through_each_worker(fleet: FleetProcess, ask) -> dict[str, object]:
    """worker name -> ask(client), once through every worker of the fleet. One connection is served
    by one worker from accept to close: `/health` names it before and after `ask` on that same
    connection, so the answer is that worker's."""
    answers: dict[str, object] = {}
    for _ in range(80):
        with httpx.Client(base_url=fleet.url, limits=httpx.Limits(max_connections=1), timeout=60,
                          trust_env=False) as client:
            worker = client.get("/health").json()["worker"]
            if worker in answers:
                continue
            answer = ask(client)
            if client.get("/health").json()["worker"] == worker:
                answers[worker] = answer
        if len(answers) == fleet.workers:
            return answers
    raise AssertionError(f"{fleet.name}: only workers {sorted(answers)} answered in 80 connections")


def listed_and_spoken(client: httpx.Client) -> tuple[bool, int, np.ndarray | str]:
    """Whether the worker lists af_mine, and its speech of it: (status, PCM samples or the error)."""
    listed = "af_mine" in [v["id"] for v in client.get("/v1/audio/voices").json()["voices"]]
    spoken = client.post("/v1/audio/speech", json={**SPEECH, "voice": "af_mine"})
    audio = np.frombuffer(spoken.content, "<i2").astype(int) if spoken.status_code == 200 else spoken.text
    return listed, spoken.status_code, audio


def jobs_done(url: str) -> dict[str, int]:
    client = redis_client.Redis.from_url(url)
    try:
        return {key.decode(): int(client.hget(key, "jobs_done") or 0) for key in client.scan_iter("{kf}:replica:*")}
    finally:
        client.close()


def test_a_voice_fitted_through_one_fleet_is_served_by_every_worker_of_two_fleets_and_deleted_from_all(tmp_path):
    from redis_server import RedisServer  # tests/redis_server.py

    voices = tmp_path / "voices"
    voices.mkdir()
    env = {"KOKORO_VOICES_DIR": str(voices), "KOKORO_VOICE_FIT_CANDIDATES": "3", "KOKORO_THREADS": "1",
           "KOKORO_PLAYGROUND": "false"}
    server = RedisServer().start()
    fleets = [FleetProcess(n, redis_url=server.url, env=env, log_dir=tmp_path, name=name) for name, n in WORKERS.items()]
    a, b = fleets
    try:
        started_at = time.monotonic()
        start_all(fleets, timeout_s=240)
        print(f"\nfleets of {WORKERS} workers ready in {time.monotonic() - started_at:.1f} s")

        fit_at = time.monotonic()
        sample = wav_file(speechlike(10, 110, seed=1))
        started = httpx.post(a.url + "/v1/audio/voices", files={"file": ("sample.wav", sample, "audio/wav")},
                             data={"name": "af_mine"}, timeout=60, trust_env=False)
        assert started.status_code == 202, started.text
        job_id = started.json()["id"]
        states = []
        while time.monotonic() - fit_at < 180:  # followed through the other fleet
            job = fresh(b.url, f"/v1/audio/voices/jobs/{job_id}").json()
            states.append(job["status"])
            if job["status"] in ("succeeded", "failed", "cancelled"):
                break
            time.sleep(0.5)
        assert job["status"] == "succeeded", (job, a.log())
        assert "running" in states and job["report"]["candidates"] == 3
        assert fresh(a.url, f"/v1/audio/voices/jobs/{job_id}").json() == job  # the same state from either
        print(f"fitted in {time.monotonic() - fit_at:.1f} s")

        before = jobs_done(server.url)
        served = {name: through_each_worker(fleet, listed_and_spoken) for name, fleet in (("A", a), ("B", b))}
        after = jobs_done(server.url)
        assert {name: len(fleet) for name, fleet in served.items()} == WORKERS
        assert not set(served["A"]) & set(served["B"])  # three workers in all, each named once
        answers = [answer for fleet in served.values() for answer in fleet.values()]
        assert all(listed for listed, _, _ in answers), served
        assert [status for _, status, _ in answers] == [200] * sum(WORKERS.values()), served
        first = answers[0][2]
        assert len(first) > 4800
        for _, _, audio in answers[1:]:  # one voice, whichever worker answers (kernels' rounding aside)
            assert len(audio) == len(first) and np.abs(audio - first).max() <= 16
        # every replica of both fleets ran chunks of the fitted voice (only it was spoken meanwhile)
        assert len(after) == sum(WORKERS.values()) and all(after[r] > before.get(r, 0) for r in after), (before, after)

        deleted = httpx.delete(b.url + "/v1/audio/voices/af_mine", timeout=30, trust_env=False)
        assert deleted.status_code == 200 and deleted.json()["deleted"] is True
        assert sorted(p.name for p in voices.iterdir()) == [".fit-jobs"]
        time.sleep(1.5)  # every other worker looks at the directory again within a second
        gone = {name: through_each_worker(fleet, listed_and_spoken) for name, fleet in (("A", a), ("B", b))}
        for answer in (answer for fleet in gone.values() for answer in fleet.values()):
            listed, status, error = answer
            assert not listed and status == 400 and "af_mine" in error, gone
        print(f"served and deleted by every worker of both fleets; {time.monotonic() - started_at:.1f} s in all")
    finally:
        stop_all(fleets)
        server.close()
