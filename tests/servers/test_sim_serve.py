"""The simulated engine with real processes: `kokoro-fleet serve --workers 2` with KOKORO_ENGINE=sim
says it is simulated in its startup log, in every worker's /health and /ready, in /metrics, in
`kokoro-fleet status` and in the response header, and serves speech; the same command without
KOKORO_ENGINE serves the real model (tiny weights) and says `torch` everywhere, never `sim`."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import redis

from api.replica_table import parse_metrics
from loadtest.dispatch import FleetProcess

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
SPEECH = {"model": "kokoro", "voice": "af_heart", "input": "A simulated fleet still streams real bytes.",
          "response_format": "mp3"}


def status(*source: str) -> str:
    out = subprocess.run([sys.executable, "-m", "cli.main", "status", *source], cwd=ROOT, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout


def engine_column(table: str) -> list[str]:
    """The engine of each replica row of `kokoro-fleet status`'s table (rows between the rule and
    the blank line before the summary)."""
    lines = table.splitlines()
    rows = lines[next(i for i, line in enumerate(lines) if line.startswith("---")) + 1:]
    return [line.split()[1] for line in rows[:rows.index("")]]


def fresh(url: str, path: str) -> httpx.Response:
    """A request on its own connection, so the kernel may hand it to any worker."""
    return httpx.get(url + path, timeout=10, headers={"Connection": "close"}, trust_env=False)


def test_a_sim_fleet_says_so_on_every_surface(tmp_path):
    env = {"KOKORO_SIM_CHUNK_MS": "5", "KOKORO_SIM_PHONEME_MS": "0.1"}
    with FleetProcess(2, env=env, log_dir=tmp_path, name="sim", engine="sim") as fleet:  # serve --engine sim
        workers = {}
        for _ in range(40):
            health = fresh(fleet.url, "/health").json()
            workers[health["worker"]] = health
            if len(workers) == 2:
                break
        assert len(workers) == 2
        for health in workers.values():
            assert health["engine"] == "sim" and health["simulated"] is True and health["mode"] == "fleet"
            assert health["sim_cost_ms"] == {"per_chunk": 5.0, "per_phoneme": 0.1}
        ready = fresh(fleet.url, "/ready")
        assert ready.status_code == 200 and ready.json()["engine"] == "sim" and ready.json()["simulated"] is True

        speech = httpx.post(fleet.url + "/v1/audio/speech", json=SPEECH, timeout=60, trust_env=False)
        assert speech.status_code == 200 and speech.headers["x-kokoro-engine"] == "sim"
        assert speech.headers["content-type"] == "audio/mpeg" and len(speech.content) > 1000

        metrics = fresh(fleet.url, "/metrics").text
        assert 'kokoro_engine_info{engine="sim"} 1' in metrics.splitlines()
        shown = status("--url", fleet.url)
        assert shown.startswith("SIMULATED ENGINE") and "engine=sim" in shown, shown
        assert engine_column(shown) and set(engine_column(shown)) == {"sim"}, shown
        # ... and read from Redis alone: each replica's row names its engine.
        shown = status("--redis-url", fleet.redis_url())
        assert shown.startswith("SIMULATED ENGINE") and engine_column(shown) == ["sim", "sim"], shown
        log = fleet.log_path.read_text(errors="replace")
    launcher = [line for line in log.splitlines() if "kokoro_fleet.serve" in line]
    assert any("SIMULATED ENGINE (KOKORO_ENGINE=sim)" in line for line in launcher), log
    # each worker says so too, when it is ready
    assert sum("kokoro_fleet.api: ready in" in line and "SIMULATED ENGINE" in line for line in log.splitlines()) == 2


def test_without_the_setting_the_fleet_serves_the_model(tmp_path):
    """Never picked implicitly: no KOKORO_ENGINE in the environment gives the real engine."""
    fleet = FleetProcess(1, weights="tiny", log_dir=tmp_path, name="torch")
    fleet.env.pop("KOKORO_ENGINE", None)
    with fleet:
        health = fresh(fleet.url, "/health").json()
        assert health["engine"] == "torch" and "simulated" not in health
        assert fresh(fleet.url, "/ready").json()["engine"] == "torch"
        speech = httpx.post(fleet.url + "/v1/audio/speech", json=SPEECH, timeout=120, trust_env=False)
        assert speech.status_code == 200 and speech.headers["x-kokoro-engine"] == "torch"
        assert 'kokoro_engine_info{engine="torch"} 1' in fresh(fleet.url, "/metrics").text.splitlines()
        assert "SIMULATED" not in status("--url", fleet.url)
        log = fleet.log_path.read_text(errors="replace")
    assert "SIMULATED" not in log


def test_a_voice_file_dropped_in_is_served_at_once_by_every_replica(tmp_path):
    """A request naming a voice whose file appeared a moment ago: its owner and the other worker's
    replica (which reads the voice by name from the job) each look at the directory at once."""
    import redis
    import torch

    voices = tmp_path / "voices"
    voices.mkdir()
    env = {"KOKORO_SIM_CHUNK_MS": "40", "KOKORO_SIM_PHONEME_MS": "0.5", "KOKORO_VOICES_DIR": str(voices)}
    with FleetProcess(2, env=env, log_dir=tmp_path, name="voices", engine="sim") as fleet:
        for _ in range(16):  # each worker lists its voices now, so neither would look again for a second
            assert fresh(fleet.url, "/v1/audio/voices").status_code == 200
        torch.save(torch.randn(510, 1, 256), voices / "bf_reader.pt")
        # about 25 s of audio in five chunks: an idle fleet fans a non-streamed text out over both replicas
        text = " ".join(f"Sentence number {i} of a text long enough to be cut into chunks." for i in range(8))
        body = {**SPEECH, "voice": "bf_reader", "input": text, "response_format": "pcm", "stream": False}
        answers = [httpx.post(fleet.url + "/v1/audio/speech", json=body, timeout=120, trust_env=False,
                              headers={"Connection": "close"}) for _ in range(3)]
        assert [a.status_code for a in answers] == [200] * 3, [a.text[:200] for a in answers]
        client = redis.Redis.from_url(fleet.redis_url())
        jobs = [int(client.hget(key, "jobs_done") or 0) for key in client.scan_iter("{kf}:replica:*")]
        assert len(jobs) == 2 and min(jobs) > 0, jobs  # both replicas ran jobs of the new voice
        listed = httpx.get(fleet.url + "/v1/audio/voices", timeout=10, trust_env=False).json()["voices"]
        assert "bf_reader" in [v["id"] for v in listed]


def test_a_fleet_holds_one_api_key_to_its_share_of_the_shared_queue(tmp_path):
    """KOKORO_KEY_MAX_SHARE=0.5 of the fleet's 4 request slots: a reader's third request while two
    of its own are in progress is a 429 from the shared queue (whichever worker took it), while
    another key's request is admitted."""
    import concurrent.futures

    env = {"KOKORO_SIM_CHUNK_MS": "300", "KOKORO_SIM_PHONEME_MS": "1", "KOKORO_API_KEYS": "reader:k1,bot:k2",
           "KOKORO_QUEUE_MAX_REQUESTS": "4", "KOKORO_KEY_MAX_SHARE": "0.5",
           "KOKORO_QUEUE_MAX_AUDIO_SECONDS": "600"}  # the request bound alone (the audio's share: below)
    text = " ".join(f"Sentence number {i} of a text that keeps a replica busy." for i in range(4))
    with FleetProcess(2, env=env, log_dir=tmp_path, name="keys", engine="sim") as fleet:
        def speak(key: str, body_text: str = text) -> httpx.Response:
            return httpx.post(fleet.url + "/v1/audio/speech", timeout=60, trust_env=False,
                              json={**SPEECH, "input": body_text, "response_format": "pcm"},
                              headers={"Authorization": f"Bearer {key}", "Connection": "close"})

        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            holding = [pool.submit(speak, "k1") for _ in range(2)]
            # Both admitted (counted under the key's name in the shared queue), however long that takes:
            # their first chunks alone take 300 ms and more each, so they are still in progress then.
            keys = redis.Redis.from_url(fleet.redis_url())
            deadline = time.monotonic() + 60
            while keys.hget("{kf}:keys", "reader") != b"2" and time.monotonic() < deadline:
                time.sleep(0.02)
            assert keys.hget("{kf}:keys", "reader") == b"2", keys.hgetall("{kf}:keys")
            third = speak("k1", "Again.")
            other = speak("k2", "Meanwhile.")
            held = [f.result() for f in holding]
        assert [r.status_code for r in held] == [200, 200] and other.status_code == 200
        assert third.status_code == 429, third.text
        error = third.json()["error"]
        assert error["code"] == "rate_limit_exceeded" and "This API key holds its share" in error["message"]
        assert int(third.headers["retry-after"]) >= 1
        assert speak("k1", "Later.").status_code == 200  # its places came back
        metrics = httpx.get(fleet.url + "/metrics", timeout=10, trust_env=False,
                            headers={"Authorization": "Bearer k2"}).text  # with keys set /metrics needs one
        assert "kokoro_fleet_key_refused_total 1" in metrics.splitlines(), metrics


def test_a_fleet_holds_one_api_key_to_its_share_of_the_queued_audio(tmp_path):
    """KOKORO_KEY_MAX_SHARE=0.5 of 24 s of queued audio: a reader whose one long text left more than
    12 s queued (replicas still on their first chunks, so no rate is measured and nothing of it is
    credited) gets a 429 for its next text, even a short one, while another key's request fits in
    the rest of the bound and is admitted."""
    env = {"KOKORO_SIM_CHUNK_MS": "4000", "KOKORO_SIM_PHONEME_MS": "0", "KOKORO_API_KEYS": "reader:k1,bot:k2",
           "KOKORO_QUEUE_MAX_AUDIO_SECONDS": "24", "KOKORO_KEY_MAX_SHARE": "0.5"}
    text = " ".join(f"Sentence number {i} of a chapter that fills the queue." for i in range(6))
    with FleetProcess(2, env=env, log_dir=tmp_path, name="keywork", engine="sim") as fleet:
        def request(key: str, body_text: str):
            return httpx.stream("POST", fleet.url + "/v1/audio/speech", timeout=60, trust_env=False,
                                json={**SPEECH, "input": body_text, "response_format": "pcm"},
                                headers={"Authorization": f"Bearer {key}", "Connection": "close"})

        # The long text's stream stays open (leaving it would cancel its queued chunks).
        with request("k1", text) as long:
            assert long.status_code == 200
            queued = redis.Redis.from_url(fleet.redis_url()).hget("{kf}:stats", "queued_work_ms")
            assert 12_000 < int(queued) < 23_000, queued  # over the reader's share, under the bound
            with request("k1", "Again.") as again:
                again.read()
            with request("k2", "Meanwhile.") as other:
                assert other.status_code == 200, other.read()
        assert again.status_code == 429, again.text
        error = again.json()["error"]
        assert error["code"] == "rate_limit_exceeded" and "share of the server's queued audio" in error["message"]
        assert int(again.headers["retry-after"]) >= 1
        stats = redis.Redis.from_url(fleet.redis_url()).hgetall("{kf}:stats")
        assert int(stats[b"key_refused_total"]) == 1 and int(stats[b"refused_total"]) == 1


def test_a_fleet_frees_a_stalled_clients_request_and_its_results_in_redis(tmp_path):
    """A client that stops reading a stream (connection left open) in a 2-worker fleet: with
    KOKORO_SEND_TIMEOUT_SECONDS=2 its request leaves the shared queue (the fleet's admitted count
    back to 0, no result of it left in Redis: the replicas had made its chunks far ahead of the
    reader), and the stall is counted in the whole server's /metrics."""
    import json
    import socket

    env = {"KOKORO_SIM_CHUNK_MS": "1", "KOKORO_SIM_PHONEME_MS": "0.05", "KOKORO_SEND_TIMEOUT_SECONDS": "2"}
    text = " ".join(f"Sentence number {i} of a long text whose reader stopped reading." for i in range(50))
    with FleetProcess(2, env=env, log_dir=tmp_path, name="stall", engine="sim") as fleet:
        queue = redis.Redis.from_url(fleet.redis_url())
        body = json.dumps({**SPEECH, "input": text, "response_format": "pcm"}).encode()
        stalled = socket.socket()
        stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connecting: a small window
        stalled.connect(("127.0.0.1", fleet.port))
        stalled.sendall(b"POST /v1/audio/speech HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
                        b"Content-Length: %d\r\n\r\n" % len(body) + body)
        assert stalled.recv(64).startswith(b"HTTP/1.1 200")
        time.sleep(1.0)
        assert int(queue.hget("{kf}:stats", "admitted") or 0) == 1  # held while its client reads nothing
        deadline = time.monotonic() + 30
        while int(queue.hget("{kf}:stats", "admitted") or 0) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert int(queue.hget("{kf}:stats", "admitted") or 0) == 0, "the stalled request still holds its place"
        assert not list(queue.scan_iter("{kf}:res:*")) and not list(queue.scan_iter("{kf}:req:*"))
        stalled.close()
        stalls = 0.0
        while time.monotonic() < deadline and stalls != 1:  # each worker publishes its figures for the others
            lines = httpx.get(fleet.url + "/metrics", timeout=10, trust_env=False).text.splitlines()
            stalls = next(float(line.split()[1]) for line in lines if line.startswith("kokoro_client_stalls_total "))
            time.sleep(0.2)
        assert stalls == 1


def test_metrics_add_up_every_worker_whichever_one_a_scrape_reaches(tmp_path):
    """The requests a 2-worker fleet served, split between its workers, counted whole by every
    scrape (each on a fresh connection, so any worker answers); the fleet's own counters once."""
    from prometheus_client.multiprocess import MultiProcessCollector

    metrics_dir = tmp_path / "metrics"
    metrics_dir.mkdir()
    subprocess.run(  # a worker of an earlier run, whose counts serve clears
        [sys.executable, "-c", "import sys; from api.metrics import Metrics; "
         "Metrics(sys.argv[1]).requests.labels('/v1/audio/speech', '200').inc(1000)", str(metrics_dir)],
        cwd=ROOT, check=True, timeout=60, env={**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(metrics_dir)})
    env = {"KOKORO_SIM_CHUNK_MS": "5", "KOKORO_SIM_PHONEME_MS": "0.1", "KOKORO_METRICS_DIR": str(metrics_dir)}
    speech = {**SPEECH, "input": "Counted once.", "response_format": "pcm"}

    def own(path, name: str) -> float:  # one worker's own figure, as it left it
        return sum(s.value for family in MultiProcessCollector.merge([str(path)]) for s in family.samples
                   if s.name == name and s.labels.get("status") == "200" and s.labels.get("route") == "/v1/audio/speech")

    with FleetProcess(2, env=env, log_dir=tmp_path, name="metrics", engine="sim") as fleet:
        served = 0
        for _ in range(60):  # until both workers have served some (the kernel picks who accepts)
            answer = httpx.post(fleet.url + "/v1/audio/speech", json=speech, timeout=30, trust_env=False,
                                headers={"Connection": "close"})
            assert answer.status_code == 200
            served += 1
            time.sleep(0.05)
            files = list(metrics_dir.glob("counter_*.db"))
            if served >= 6 and len(files) == 2 and all(own(f, "kokoro_requests_total") for f in files):
                break
        assert all(own(f, "kokoro_requests_total") for f in metrics_dir.glob("counter_*.db")), "one worker served all"
        time.sleep(1.5)  # every worker has left its latest figures
        for _ in range(8):
            page = parse_metrics(fresh(fleet.url, "/metrics").text)
            requests = [v for labels, v in page["kokoro_requests_total"]
                        if labels == {"route": "/v1/audio/speech", "status": "200"}]
            assert requests == [served]
            assert [v for _, v in page["kokoro_ttfa_seconds_count"]] == [served]
            assert [v for _, v in page["kokoro_fleet_admitted_total"]] == [served]  # from Redis: not doubled
            assert [v for _, v in page["kokoro_ready"]] == [1] and len(page["kokoro_engine_info"]) == 1
