"""Prometheus metrics, written in the text exposition format by hand.

A handful of counters, gauges and two histograms do not justify a dependency; the format is
three line types (`# HELP`, `# TYPE`, samples). Gauges that mirror live state (queue depth,
replica busy) are read at scrape time through callbacks, so they can never drift.

A server is several worker processes behind one port, and a scrape reaches whichever worker the
kernel hands the connection to: each worker's own counters alone would jump between workers from
scrape to scrape and under-count. So every worker leaves its process metrics in a directory the
workers share (`WorkerMetricsShare`, KOKORO_METRICS_DIR, which `serve` makes), at most a second
old, and /metrics answers with all of them added up (`merge_expositions`): counters and histograms
summed over every worker that ever wrote (a worker that died keeps its counts, so totals never go
back), gauges over the workers alive, summed or as `GAUGE_MERGE` says. The fleet's own figures,
read from Redis and the same in every worker, are registered `fleet_wide` and come from the
answering worker alone.
"""

from __future__ import annotations

import bisect
import math
import os
import re
import time
from collections.abc import Callable
from pathlib import Path

# Latency buckets (seconds): TTFA on a GPU is tens of ms; E2E of a long text on CPU is minutes.
LATENCY_BUCKETS = (0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)


def _fmt(value: float) -> str:
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value)) if not float(value).is_integer() else str(int(value))


def _labels(labels: dict[str, str]) -> str:
    if not labels:
        return ""
    escaped = (f'{k}="{str(v).replace(chr(92), chr(92) * 2).replace(chr(10), " ").replace(chr(34), chr(92) + chr(34))}"'
               for k, v in sorted(labels.items()))
    return "{" + ",".join(escaped) + "}"


class Histogram:
    def __init__(self, buckets: tuple[float, ...] = LATENCY_BUCKETS):
        self.bounds = tuple(sorted(buckets))
        self.counts = [0] * (len(self.bounds) + 1)  # last: above every bound
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.sum += value
        self.count += 1

    def lines(self, name: str) -> list[str]:
        out, running = [], 0
        for bound, n in zip(self.bounds, self.counts):
            running += n
            out.append(f'{name}_bucket{{le="{_fmt(bound)}"}} {running}')
        out.append(f'{name}_bucket{{le="+Inf"}} {self.count}')
        out.append(f"{name}_sum {_fmt(self.sum)}")
        out.append(f"{name}_count {self.count}")
        return out


class Metrics:
    def __init__(self) -> None:
        self.requests: dict[tuple[str, str], int] = {}  # (route, status) -> count
        self.key_requests: dict[tuple[str, str], int] = {}  # (API key's name, status) -> count
        self.key_audio_seconds: dict[str, float] = {}  # API key's name -> audio sent
        self.ttfa = Histogram()
        self.e2e = Histogram()
        self.audio_seconds = 0.0
        self.disconnects = 0
        self.stalls = 0                    # streams and live sessions cut off for taking no bytes (KOKORO_SEND_TIMEOUT_SECONDS)
        self.live_sessions = 0             # open WS /v1/audio/speech/live sessions in this process
        self.live_piece_ttfa = Histogram()  # a live piece: from the speaker taking it to its first audio
        self.gauges: dict[str, tuple[str, Callable[[], float]]] = {}
        self.counters: dict[str, tuple[str, Callable[[], float]]] = {}
        self.collectors: list[Callable[[], list[str]]] = []  # whole families, e.g. labelled per replica
        self.fleet_wide: set[str] = set()   # gauges and counters every worker reads alike (from Redis)
        self.fleet_collectors: list[Callable[[], list[str]]] = []

    def count_request(self, route: str, status: int | str) -> None:
        key = (route, str(status))
        self.requests[key] = self.requests.get(key, 0) + 1

    def count_key(self, name: str, status: int | str, audio_s: float) -> None:
        """A request (or live session) that came with the API key named `name`, and its audio."""
        self.key_requests[(name, str(status))] = self.key_requests.get((name, str(status)), 0) + 1
        self.key_audio_seconds[name] = self.key_audio_seconds.get(name, 0.0) + audio_s

    def gauge(self, name: str, help_text: str, read: Callable[[], float], fleet_wide: bool = False) -> None:
        """A gauge read at scrape time; `fleet_wide`: the same in every worker (not added up)."""
        self.gauges[name] = (help_text, read)
        if fleet_wide:
            self.fleet_wide.add(name)

    def counter(self, name: str, help_text: str, read: Callable[[], float], fleet_wide: bool = False) -> None:
        self.counters[name] = (help_text, read)
        if fleet_wide:
            self.fleet_wide.add(name)

    def collector(self, lines: Callable[[], list[str]], fleet_wide: bool = False) -> None:
        """A source of ready-made exposition lines (HELP, TYPE and samples), read at scrape time."""
        (self.fleet_collectors if fleet_wide else self.collectors).append(lines)

    def render(self, part: str = "all") -> str:
        """The exposition of this process: `process` (its own figures, which /metrics adds up over
        the workers), `fleet` (the fleet-wide ones) or `all`."""
        lines = self._process_lines() if part in ("all", "process") else []
        if part in ("all", "fleet"):
            lines += self._read(self.fleet_wide, self.fleet_collectors)
        return "\n".join(lines) + "\n"

    def _read(self, names, collectors) -> list[str]:
        lines = []
        for kind, table in (("counter", self.counters), ("gauge", self.gauges)):
            for name, (help_text, read) in sorted(table.items()):
                if name not in names:
                    continue
                try:
                    value = float(read())
                except Exception:  # a source that is not there yet (weights loading)
                    continue
                lines += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}", f"{name} {_fmt(value)}"]
        for collect in collectors:
            try:
                lines += collect()
            except Exception:  # a source that is not there yet
                continue
        return lines

    def _process_lines(self) -> list[str]:
        lines = [
            "# HELP kokoro_requests_total HTTP requests answered, by route and status.",
            "# TYPE kokoro_requests_total counter",
        ]
        for (route, status), n in sorted(self.requests.items()):
            lines.append(f"kokoro_requests_total{_labels({'route': route, 'status': status})} {n}")
        if self.key_requests:
            lines += ["# HELP kokoro_key_requests_total Requests by the name of their API key (KOKORO_API_KEYS) "
                      "and status.", "# TYPE kokoro_key_requests_total counter"]
            lines += [f"kokoro_key_requests_total{_labels({'key': name, 'status': status})} {n}"
                      for (name, status), n in sorted(self.key_requests.items())]
            lines += ["# HELP kokoro_key_audio_seconds_total Seconds of audio sent, by the name of the API key.",
                      "# TYPE kokoro_key_audio_seconds_total counter"]
            lines += [f"kokoro_key_audio_seconds_total{_labels({'key': name})} {_fmt(seconds)}"
                      for name, seconds in sorted(self.key_audio_seconds.items())]
        lines += ["# HELP kokoro_ttfa_seconds Time from request to the first audio byte sent.",
                  "# TYPE kokoro_ttfa_seconds histogram", *self.ttfa.lines("kokoro_ttfa_seconds")]
        lines += ["# HELP kokoro_e2e_seconds Time from request to the last byte of a speech response.",
                  "# TYPE kokoro_e2e_seconds histogram", *self.e2e.lines("kokoro_e2e_seconds")]
        lines += ["# HELP kokoro_audio_seconds_total Seconds of audio sent to clients.",
                  "# TYPE kokoro_audio_seconds_total counter", f"kokoro_audio_seconds_total {_fmt(self.audio_seconds)}"]
        lines += ["# HELP kokoro_client_disconnects_total Speech responses abandoned by their client before the end.",
                  "# TYPE kokoro_client_disconnects_total counter", f"kokoro_client_disconnects_total {self.disconnects}"]
        lines += ["# HELP kokoro_client_stalls_total Speech streams (counted as disconnects too) and live sessions the "
                  "server ended because their client took no bytes for KOKORO_SEND_TIMEOUT_SECONDS (stopped reading, "
                  "or left the network without closing).",
                  "# TYPE kokoro_client_stalls_total counter", f"kokoro_client_stalls_total {self.stalls}"]
        lines += ["# HELP kokoro_live_sessions Live speech sessions (WS /v1/audio/speech/live) open now.",
                  "# TYPE kokoro_live_sessions gauge", f"kokoro_live_sessions {self.live_sessions}"]
        lines += ["# HELP kokoro_live_piece_ttfa_seconds Live sessions: from the speaker taking a piece of text to "
                  "its first audio sent (admission, text, queue, synthesis, encoding).",
                  "# TYPE kokoro_live_piece_ttfa_seconds histogram",
                  *self.live_piece_ttfa.lines("kokoro_live_piece_ttfa_seconds")]
        own = (set(self.counters) | set(self.gauges)) - self.fleet_wide
        return lines + self._read(own, self.collectors)


# --- one /metrics for all the workers of a server ---------------------------------------------------

# How a gauge of several workers adds up (default: summed, e.g. replicas busy, requests admitted).
GAUGE_MERGE = {"kokoro_ready": min, "kokoro_engine_info": max, "kokoro_fleet_degraded": max,
               "kokoro_fleet_replica_busy_fraction_lifetime": lambda values: sum(values) / len(values)}
# A worker whose file is older than this is taken for gone: its gauges leave, its counts stay.
WORKER_GONE_S = 5.0
_SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(?:[^"}]|"(?:[^"\\]|\\.)*")*\})?\s+(\S+)$')


class WorkerMetricsShare:
    """The directory where the workers of one server leave their process metrics for each other."""

    def __init__(self, directory: str | Path, worker: str):
        self.directory = Path(directory)
        self.path = self.directory / f"{worker}.prom"

    def publish(self, exposition: str) -> None:
        """This worker's figures now (written beside and renamed in: a reader never sees half)."""
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}")
        tmp.write_text(exposition, encoding="utf-8")
        os.replace(tmp, self.path)

    def others(self) -> list[tuple[str, bool]]:
        """(exposition, still alive) of every other worker that has written."""
        out, now = [], time.time()
        for path in self.directory.glob("*.prom"):
            if path == self.path:
                continue
            try:
                age = now - path.stat().st_mtime
                out.append((path.read_text(encoding="utf-8"), age <= WORKER_GONE_S))
            except OSError:  # replaced or removed while listed
                continue
        return out


def merge_expositions(own: str, others: list[tuple[str, bool]]) -> str:
    """One exposition of `own` (this worker's, alive) and `others` ((text, alive) per worker):
    counters and histograms summed over all, gauges over the alive ones (GAUGE_MERGE)."""
    families: dict[str, dict] = {}  # name -> {"help", "type", "samples": {(sample, labels): [values]}}

    def family_of(sample: str) -> str:
        for suffix in ("_bucket", "_sum", "_count"):
            if sample.endswith(suffix) and sample[:-len(suffix)] in families:
                return sample[:-len(suffix)]
        return sample

    for text, alive in [(own, True), *others]:
        for line in text.splitlines():
            if line.startswith(("# HELP ", "# TYPE ")):
                _, what, name, rest = (line.split(" ", 3) + [""])[:4]
                family = families.setdefault(name, {"help": "", "type": "untyped", "samples": {}})
                if what == "TYPE":
                    family["type"] = rest
                elif not family["help"]:
                    family["help"] = rest
                continue
            m = _SAMPLE.match(line)
            if not m:
                continue
            sample, labels, value = m.group(1), m.group(2) or "", float(m.group(3))
            family = families.setdefault(family_of(sample), {"help": "", "type": "untyped", "samples": {}})
            if family["type"] == "gauge" and not alive:
                continue
            family["samples"].setdefault((sample, labels), []).append(value)
    lines = []
    for name, family in families.items():
        if not family["samples"]:
            continue
        if family["help"]:
            lines.append(f"# HELP {name} {family['help']}")
        lines.append(f"# TYPE {name} {family['type']}")
        add = GAUGE_MERGE.get(name, sum) if family["type"] == "gauge" else sum
        lines += [f"{sample}{labels} {_fmt(add(values))}" for (sample, labels), values in family["samples"].items()]
    return "\n".join(lines) + "\n"
