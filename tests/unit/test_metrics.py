"""/metrics of a server of several workers (api/metrics.py, prometheus_client's multiprocess mode):
each worker's own figures added up, whichever worker answers the scrape, the fleet-wide ones
(read from Redis, alike in every worker) taken once. Each worker here is a real process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from api.metrics import Metrics, share_with_workers
from api.replica_table import parse_metrics

ROOT = Path(__file__).resolve().parents[2]
# A worker: its figures as the app records them, then commands on stdin ("render", "leave").
WORKER = textwrap.dedent("""
    import sys
    from api.metrics import Metrics

    requests, busy, ready = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "ready"
    m = Metrics(sys.argv[4])
    for _ in range(requests):
        m.count_request("/v1/audio/speech", 200)
    m.count_request("/v1/download/{name}", 404)  # a route template: braces inside a label value
    m.count_key("reader", 429, 0.0)
    for seconds in map(float, filter(None, sys.argv[5].split(","))):
        m.ttfa.observe(seconds)
    m.audio_seconds.inc(1.5 * requests)
    m.gauge("kokoro_replica_busy", "1 while the replica runs an inference.", lambda: busy)
    m.gauge("kokoro_ready", "1 once warmed up.", lambda: float(ready))
    m.counter("kokoro_replica_jobs_total", "Inferences.", lambda: 10 * requests)
    m.gauge("kokoro_fleet_replica_busy_fraction_lifetime", "Busy share.", lambda: busy / 4)
    m.gauge("kokoro_fleet_admitted", "Requests admitted in the whole fleet.", lambda: 7, fleet_wide=True)
    m.gauge("kokoro_fleet_replica_busy", "1 while the replica runs a job.", lambda: {("a",): 1}, fleet_wide=True,
            labels=("replica",))
    m.refresh()
    print("ready", flush=True)
    for command in sys.stdin:
        if command.strip() == "render":
            print(m.render() + "# end", flush=True)
        elif command.strip() == "leave":
            m.close()
            break
""")


class Worker:
    def __init__(self, directory: Path, requests: int, busy: int, ready: bool, ttfa: list[float]):
        env = {**os.environ, "PYTHONPATH": str(ROOT), "PROMETHEUS_MULTIPROC_DIR": str(directory)}
        self.process = subprocess.Popen(
            [sys.executable, "-c", WORKER, str(requests), str(busy), "ready" if ready else "loading", str(directory),
             ",".join(map(str, ttfa))], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env, cwd=ROOT)
        assert self.process.stdout.readline().strip() == "ready"

    def scrape(self) -> dict:
        self.process.stdin.write("render\n")
        self.process.stdin.flush()
        page = "".join(iter(self.process.stdout.readline, "# end\n"))
        return parse_metrics(page)

    def stop(self, how: str) -> None:
        if how == "leave":
            self.process.stdin.write("leave\n")
            self.process.stdin.flush()
        else:
            self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=30)


def value(samples: dict, name: str, **labels) -> float:
    return next(v for got, v in samples[name] if all(got.get(k) == w for k, w in labels.items()))


@pytest.fixture(autouse=True)
def _environment_kept(monkeypatch):
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", "")  # whatever share_with_workers sets, undone after


def test_counters_and_histograms_add_up_gauges_follow_their_rule(tmp_path):
    share_with_workers(tmp_path)
    a = Worker(tmp_path, 4, busy=1, ready=True, ttfa=[0.03, 0.2])
    b = Worker(tmp_path, 2, busy=1, ready=False, ttfa=[0.7])
    left = Worker(tmp_path, 1, busy=1, ready=True, ttfa=[])  # it left in order: its counts stay, its gauges go
    killed = Worker(tmp_path, 4, busy=1, ready=True, ttfa=[9.0])  # it died without a word: the same
    try:
        left.stop("leave")
        killed.stop("kill")
        for merged in (a.scrape(), b.scrape()):  # whichever worker answers
            assert value(merged, "kokoro_requests_total", route="/v1/audio/speech", status="200") == 11
            assert value(merged, "kokoro_requests_total", route="/v1/download/{name}", status="404") == 4
            assert value(merged, "kokoro_key_requests_total", key="reader", status="429") == 4
            assert value(merged, "kokoro_audio_seconds_total") == 16.5
            assert value(merged, "kokoro_replica_jobs_total") == 110
            assert value(merged, "kokoro_ttfa_seconds_count") == 4
            assert value(merged, "kokoro_ttfa_seconds_sum") == pytest.approx(9.93)
            assert value(merged, "kokoro_ttfa_seconds_bucket", le="0.25") == 2
            assert value(merged, "kokoro_ttfa_seconds_bucket", le="+Inf") == 4
            assert value(merged, "kokoro_replica_busy") == 2       # summed over the workers alive
            assert value(merged, "kokoro_ready") == 0               # all ready, or not: the least
            assert merged["kokoro_fleet_replica_busy_fraction_lifetime"] == [({}, 0.25)]  # the mean of the alive
            assert merged["kokoro_fleet_admitted"] == [({}, 7)]     # once, not added up
            assert merged["kokoro_fleet_replica_busy"] == [({"replica": "a"}, 1)]
    finally:
        for worker in (a, b):
            worker.stop("leave")


def test_a_server_starts_from_zero_in_its_own_directory(tmp_path):
    share_with_workers(tmp_path)
    Worker(tmp_path, 3, busy=0, ready=True, ttfa=[]).stop("leave")  # a previous run's worker
    assert list(tmp_path.glob("*.db"))
    share_with_workers(tmp_path)
    assert not list(tmp_path.glob("*.db")) and os.environ["PROMETHEUS_MULTIPROC_DIR"] == str(tmp_path)
    fresh = Worker(tmp_path, 1, busy=0, ready=True, ttfa=[])
    try:
        assert value(fresh.scrape(), "kokoro_requests_total", route="/v1/audio/speech", status="200") == 1
    finally:
        fresh.stop("leave")


def test_one_process_shows_its_own_figures_and_the_fleet_wide_ones_once():
    m = Metrics()
    m.count_request("/v1/audio/speech", 200)
    m.gauge("kokoro_replica_busy", "1 while the replica runs an inference.", lambda: 1 / 0)  # not there yet
    m.gauge("kokoro_fleet_admitted", "Requests admitted in the whole fleet.", lambda: 7, fleet_wide=True)
    m.counter("kokoro_fleet_admitted_total", "Admitted, fleet-wide.", lambda: 3, fleet_wide=True)
    m.gauge("kokoro_fleet_replica_alive", "1 while alive.", lambda: {}, fleet_wide=True, labels=("replica",))
    page = m.render()
    assert "kokoro_fleet_admitted 7" in page.splitlines() and "kokoro_fleet_admitted_total 3" in page.splitlines()
    assert "# TYPE kokoro_fleet_admitted_total counter" in page.splitlines()
    assert "kokoro_replica_busy" not in page and "kokoro_fleet_replica_alive" not in page  # nothing to show yet
    assert value(parse_metrics(page), "kokoro_requests_total", route="/v1/audio/speech", status="200") == 1
