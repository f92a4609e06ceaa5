"""/metrics of a server of several workers: each worker's own figures added up (api/metrics.py),
the fleet-wide ones (read from Redis, alike in every worker) taken once."""

from __future__ import annotations

import os
import time

from api.metrics import WORKER_GONE_S, Metrics, WorkerMetricsShare, merge_expositions
from api.status_cli import parse_metrics


def worker(requests: int, busy: int, ready: bool, ttfa: list[float]) -> Metrics:
    m = Metrics()
    for _ in range(requests):
        m.count_request("/v1/audio/speech", 200)
    m.count_request("/v1/download/{name}", 404)  # a route template: braces inside a label value
    m.count_key("reader", 429, 0.0)
    for seconds in ttfa:
        m.ttfa.observe(seconds)
    m.audio_seconds = 1.5 * requests
    m.gauge("kokoro_replica_busy", "1 while the replica runs an inference.", lambda: busy)
    m.gauge("kokoro_ready", "1 once warmed up.", lambda: float(ready))
    m.gauge("kokoro_fleet_admitted", "Requests admitted in the whole fleet.", lambda: 7, fleet_wide=True)
    m.collector(lambda: ["# TYPE kokoro_fleet_replica_busy gauge", 'kokoro_fleet_replica_busy{replica="a"} 1'],
                fleet_wide=True)
    return m


def value(samples: dict, name: str, **labels) -> float:
    return next(v for got, v in samples[name] if all(got.get(k) == w for k, w in labels.items()))


def test_counters_and_histograms_add_up_gauges_follow_their_rule():
    a = worker(4, busy=1, ready=True, ttfa=[0.03, 0.2])
    b = worker(2, busy=1, ready=False, ttfa=[0.7])
    gone = worker(5, busy=1, ready=True, ttfa=[9.0])  # its process died: its counts stay, its gauges go
    merged = parse_metrics(merge_expositions(a.render("process"), [(b.render("process"), True),
                                                                    (gone.render("process"), False)]))
    assert value(merged, "kokoro_requests_total", route="/v1/audio/speech", status="200") == 11
    assert value(merged, "kokoro_requests_total", route="/v1/download/{name}", status="404") == 3
    assert value(merged, "kokoro_key_requests_total", key="reader", status="429") == 3
    assert value(merged, "kokoro_audio_seconds_total") == 16.5
    assert value(merged, "kokoro_ttfa_seconds_count") == 4 and value(merged, "kokoro_ttfa_seconds_sum") == 9.93
    assert value(merged, "kokoro_ttfa_seconds_bucket", le="0.25") == 2
    assert value(merged, "kokoro_ttfa_seconds_bucket", le="+Inf") == 4
    assert value(merged, "kokoro_replica_busy") == 2       # summed over the workers alive
    assert value(merged, "kokoro_ready") == 0               # all ready, or not: the least
    assert "kokoro_fleet_admitted" not in merged and "kokoro_fleet_replica_busy" not in merged


def test_the_fleet_wide_figures_are_rendered_apart_and_once():
    m = worker(1, busy=0, ready=True, ttfa=[])
    fleet = parse_metrics(m.render("fleet"))
    assert set(fleet) == {"kokoro_fleet_admitted", "kokoro_fleet_replica_busy"}
    everything = parse_metrics(m.render())
    assert set(everything) == set(parse_metrics(m.render("process"))) | set(fleet)


def test_the_share_publishes_this_worker_and_reads_the_others(tmp_path):
    a, b = WorkerMetricsShare(tmp_path, "host-1"), WorkerMetricsShare(tmp_path, "host-2")
    a.publish(worker(1, 0, True, []).render("process"))
    b.publish(worker(2, 1, True, []).render("process"))
    assert [alive for _, alive in a.others()] == [True]
    assert "kokoro_requests_total" in a.others()[0][0] and len(b.others()) == 1
    old = time.time() - WORKER_GONE_S - 1
    os.utime(tmp_path / "host-2.prom", (old, old))  # a worker that stopped writing
    assert [alive for _, alive in a.others()] == [False]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["host-1.prom", "host-2.prom"]  # no temporary files left
