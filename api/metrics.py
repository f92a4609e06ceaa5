"""Prometheus metrics, kept and written by prometheus_client.

A server is several worker processes behind one port, and a scrape reaches whichever worker the
kernel hands the connection to. So the workers run prometheus_client's multiprocess mode: each
keeps its figures in files in the server's own directory (KOKORO_METRICS_DIR, handed to the workers
as PROMETHEUS_MULTIPROC_DIR by `share_with_workers`), and the worker a scrape reaches adds up all
the files: counters and histograms over every worker that ever wrote (a worker that died keeps its
counts, so totals never go back), gauges over the workers alive, summed or as `GAUGE_MODES` says.
The fleet's own figures, read from Redis and the same in every worker, are registered `fleet_wide`
and come from the answering worker alone.

Figures a worker reads through callbacks (its replica's counts, its admission) cannot be called
from another worker, so `refresh` copies them into the files: every `REFRESH_S` and before a scrape.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable
from pathlib import Path

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.multiprocess import MultiProcessCollector, mark_process_dead
from prometheus_client.samples import Sample

# `_created` series would double the counters' lines for a figure nobody here reads.
disable_created_metrics()

# Latency buckets (seconds): TTFA on a GPU is tens of ms; E2E of a long text on CPU is minutes.
LATENCY_BUCKETS = (0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
# How a gauge of several workers adds up (prometheus_client's multiprocess modes); any other gauge
# is summed over the workers alive. `liveall` keeps one value per worker, which /metrics averages.
GAUGE_MODES = {"kokoro_ready": "livemin", "kokoro_engine_info": "livemax", "kokoro_fleet_degraded": "livemax",
               "kokoro_replicas_planned": "livemax",
               "kokoro_fleet_replica_busy_fraction_lifetime": "liveall"}
# How often a worker copies its callbacks' figures into the shared files for the others' scrapes.
REFRESH_S = 1.0
_WHOLE_NUMBER = re.compile(r" (-?\d+)\.0$", re.MULTILINE)
_LIVE_GAUGE_FILE = re.compile(r"gauge_live[a-z]+_(\d+)\.db")

Read = Callable[[], "float | dict[tuple[str, ...], float]"]


class ReadableHistogram(Histogram):
    """prometheus_client's Histogram with this process's `count` and `sum` readable, as the fleet's
    own figures read them (the exposition still adds every worker's up)."""

    def _sample(self, suffix: str) -> float:
        return next(s.value for metric in self.collect() for s in metric.samples if s.name.endswith(suffix))

    @property
    def count(self) -> float:
        return self._sample("_count")

    @property
    def sum(self) -> float:
        return self._sample("_sum")


def share_with_workers(directory: str | Path) -> None:
    """Make `directory` this server's metrics directory, for the worker processes started after:
    emptied (a previous run's workers are not this one's) and named in PROMETHEUS_MULTIPROC_DIR,
    which prometheus_client reads as it is imported."""
    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    for old in path.glob("*.db"):
        old.unlink(missing_ok=True)
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(path)


class Metrics:
    """This process's metrics; `directory`: the metrics directory its server's workers share."""

    def __init__(self, directory: str | Path | None = None) -> None:
        self.directory = str(directory) if directory else None
        shared = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
        if self.directory and (not shared or Path(shared).resolve() != Path(self.directory).resolve()):
            raise RuntimeError(f"KOKORO_METRICS_DIR={self.directory} needs PROMETHEUS_MULTIPROC_DIR set to the same "
                               "directory before the process starts (`kokoro-fleet serve` sets it)")
        self.registry = CollectorRegistry()
        self.fleet_registry = CollectorRegistry()
        self.requests = Counter("kokoro_requests_total", "HTTP requests answered, by route and status.",
                                ["route", "status"], registry=self.registry)
        self.key_requests: dict[tuple[str, str], int] = {}  # this process's (API key's name, status) -> count
        self.key_requests_total = Counter(
            "kokoro_key_requests_total", "Requests by the name of their API key (KOKORO_API_KEYS) and status.",
            ["key", "status"], registry=self.registry)
        self.key_audio_seconds = Counter("kokoro_key_audio_seconds_total",
                                         "Seconds of audio sent, by the name of the API key.", ["key"],
                                         registry=self.registry)
        self.ttfa = Histogram("kokoro_ttfa_seconds", "Time from request to the first audio byte sent.",
                              buckets=LATENCY_BUCKETS, registry=self.registry)
        self.e2e = Histogram("kokoro_e2e_seconds", "Time from request to the last byte of a speech response.",
                             buckets=LATENCY_BUCKETS, registry=self.registry)
        self.audio_seconds = Counter("kokoro_audio_seconds_total", "Seconds of audio sent to clients.",
                                     registry=self.registry)
        self.disconnects = Counter("kokoro_client_disconnects_total",
                                   "Speech responses abandoned by their client before the end.", registry=self.registry)
        self.stalls = Counter(
            "kokoro_client_stalls_total", "Speech streams (counted as disconnects too) and live sessions the server "
            "ended because their client took no bytes for KOKORO_SEND_TIMEOUT_SECONDS (stopped reading, or left the "
            "network without closing).", registry=self.registry)
        self.live_sessions = Gauge("kokoro_live_sessions", "Live speech sessions (WS /v1/audio/speech/live) open now.",
                                   multiprocess_mode="livesum", registry=self.registry)
        self.live_piece_ttfa = Histogram(
            "kokoro_live_piece_ttfa_seconds", "Live sessions: from the speaker taking a piece of text to its first "
            "audio sent (admission, text, queue, synthesis, encoding).", buckets=LATENCY_BUCKETS,
            registry=self.registry)
        self._read: list[Callable[[], None]] = []  # copies a callback's figures into its metric
        self._fleet = _FleetWide()
        self.fleet_registry.register(self._fleet)

    def count_request(self, route: str, status: int | str) -> None:
        self.requests.labels(route, str(status)).inc()

    def count_key(self, name: str, status: int | str, audio_s: float) -> None:
        """A request (or live session) that came with the API key named `name`, and its audio."""
        self.key_requests[(name, str(status))] = self.key_requests.get((name, str(status)), 0) + 1
        self.key_requests_total.labels(name, str(status)).inc()
        self.key_audio_seconds.labels(name).inc(audio_s)

    def include(self, *metrics) -> None:
        """prometheus_client metrics made elsewhere (registry=None), shown with this process's."""
        for metric in metrics:
            self.registry.register(metric)

    def gauge(self, name: str, help_text: str, read: Read, fleet_wide: bool = False,
              labels: tuple[str, ...] = ()) -> None:
        """A gauge read at scrape time; with `labels`, `read` gives {label values: value}.
        `fleet_wide`: the same in every worker (shown once, not added up)."""
        if fleet_wide:
            self._fleet.sources.append((GaugeMetricFamily, name, help_text, read, labels))
            return
        mode = GAUGE_MODES.get(name, "livesum")
        self._read.append(self._copier(lambda: Gauge(name, help_text, labels, registry=self.registry,
                                                     multiprocess_mode=mode),
                                       read, labels, lambda child, value, key: child.set(value)))

    def counter(self, name: str, help_text: str, read: Read, fleet_wide: bool = False,
                labels: tuple[str, ...] = ()) -> None:
        """A counter whose total `read` gives at scrape time (see `gauge`)."""
        if fleet_wide:
            self._fleet.sources.append((CounterMetricFamily, name, help_text, read, labels))
            return
        added: dict[tuple[str, ...], float] = {}

        def add_new(child, total: float, key: tuple[str, ...]) -> None:
            if total > added.get(key, 0.0):  # a counter only goes up: it is given what came since
                child.inc(total - added.get(key, 0.0))
                added[key] = total

        self._read.append(self._copier(lambda: Counter(name, help_text, labels, registry=self.registry),
                                       read, labels, add_new))

    @staticmethod
    def _copier(make: Callable[[], Gauge | Counter], read: Read, labels: tuple[str, ...],
                store: Callable[[Gauge | Counter, float, tuple[str, ...]], None]) -> Callable[[], None]:
        metric: list = []  # made at the first read that succeeds: a source not there yet shows nothing

        def copy() -> None:
            try:
                value = read()
            except Exception:  # a source that is not there yet (weights loading)
                return
            if not metric:
                metric.append(make())
            for key, v in (value.items() if labels else [((), value)]):
                child = metric[0].labels(*key) if labels else metric[0]
                store(child, float(v), key)
        return copy

    def refresh(self) -> None:
        """Copy the callbacks' figures into the metrics (and so into this worker's shared files)."""
        for copy in self._read:
            copy()

    def close(self) -> None:
        """This worker is leaving: its gauges leave /metrics now, its counts stay."""
        if self.directory:
            mark_process_dead(os.getpid(), self.directory)

    def render(self) -> str:
        """/metrics: every worker's figures added up (or this process's alone), then the fleet-wide ones."""
        self.refresh()
        if self.directory:
            _forget_dead_workers(self.directory)
            workers = CollectorRegistry()
            workers.register(_AllWorkers(self.directory))
            page = generate_latest(workers).decode()
        else:
            page = generate_latest(self.registry).decode()
        # Whole numbers as they were written before prometheus_client (`1`, not `1.0`): scrapers
        # read both alike, and tests and scripts match these lines as text.
        return _WHOLE_NUMBER.sub(r" \1", page + generate_latest(self.fleet_registry).decode())


class _AllWorkers:
    """prometheus_client's sum over the workers' files, with `liveall` gauges averaged over the workers."""

    def __init__(self, directory: str) -> None:
        self.files = MultiProcessCollector(None, path=directory)

    def collect(self) -> Iterable[Metric]:
        for family in self.files.collect():
            if GAUGE_MODES.get(family.name) == "liveall":
                values = [s.value for s in family.samples]
                family.samples = [Sample(family.name, {}, sum(values) / len(values))] if values else []
            yield family


class _FleetWide:
    """The fleet-wide figures, read from the answering worker at scrape time."""

    def __init__(self) -> None:
        self.sources: list[tuple[type, str, str, Read, tuple[str, ...]]] = []

    def collect(self) -> Iterable[Metric]:
        for family_type, name, help_text, read, labels in self.sources:
            try:
                value = read()
            except Exception:  # a source that is not there yet (Redis not read yet)
                continue
            family = family_type(name, help_text, labels=labels)
            for key, v in (value.items() if labels else [((), value)]):
                family.add_metric(list(key), float(v))
            if family.samples:  # a table with no rows yet: no family either
                yield family


def _forget_dead_workers(directory: str) -> None:
    """Drop the gauges of workers that died without leaving (killed, crashed): a worker that left
    in order has done so itself (`Metrics.close`)."""
    for path in Path(directory).glob("gauge_live*.db"):
        match = _LIVE_GAUGE_FILE.fullmatch(path.name)
        if match is None:
            continue
        pid = int(match.group(1))
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            mark_process_dead(pid, directory)
        except PermissionError:  # alive, another user's
            continue
