"""The fleet's replica table as a /metrics page tells it: `kokoro-fleet status` and the
playground's fleet panel read it.

    rows, summary = rows_from_metrics(parse_metrics(page))
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)$')
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


@dataclass
class ReplicaRow:
    replica: str
    alive: bool
    busy: bool
    busy_fraction: float | None
    jobs_done: int
    busy_seconds: float
    audio_seconds: float
    engine: str | None = None  # "torch cuda bf16", "sim"; None where the replica reports none
    running_seconds: float = 0.0  # Redis only: how long the job in hand has run (busy_seconds counts it when done)

    @property
    def busy_so_far(self) -> float:
        return self.busy_seconds + self.running_seconds


def parse_metrics(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Prometheus text exposition -> name -> [(labels, value)]."""
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line.strip())
        if not m:
            continue
        name, labels, value = m.groups()
        try:
            number = float(value)
        except ValueError:
            continue
        out.setdefault(name, []).append((dict(_LABEL.findall(labels or "")), number))
    return out


def rows_from_metrics(samples: dict[str, list[tuple[dict[str, str], float]]]) -> tuple[list[ReplicaRow], dict]:
    """The replica table and the fleet's summary figures from one /metrics page."""
    def one(name: str) -> float | None:
        values = samples.get(name)
        return values[0][1] if values else None

    def per_replica(name: str) -> dict[str, float]:
        return {labels["replica"]: v for labels, v in samples.get(name, []) if "replica" in labels}

    engines = [labels.get("engine") for labels, _ in samples.get("kokoro_engine_info", [])]
    engine = {"engine": engines[0]} if engines else {}  # a server older than the engine setting: not shown
    summary = {**engine, **{k: one(f"kokoro_fleet_{k}") for k in (
        "degraded", "admitted", "queued_jobs", "inflight_jobs", "queued_work_seconds", "live_replicas", "admitted_total",
        "refused_total", "expired_total", "requeued_total", "failed_total", "local_total", "result_bytes_total")}}
    names = per_replica("kokoro_fleet_replica_jobs_total")
    if names:
        alive, busy, fraction = (per_replica("kokoro_fleet_replica_alive"), per_replica("kokoro_fleet_replica_busy"),
                                 per_replica("kokoro_fleet_replica_busy_fraction"))
        busy_s, audio_s = (per_replica("kokoro_fleet_replica_busy_seconds_total"),
                           per_replica("kokoro_fleet_replica_audio_seconds_total"))
        labels = {labels["replica"]: labels.get("engine") for labels, _ in samples.get("kokoro_fleet_replica_info", [])}
        rows = [ReplicaRow(r, bool(alive.get(r, 1)), bool(busy.get(r, 0)), fraction.get(r), int(names[r]),
                           busy_s.get(r, 0.0), audio_s.get(r, 0.0), labels.get(r)) for r in sorted(names)]
        summary["mode"] = "degraded" if summary.get("degraded") else "fleet"
        return rows, summary
    if any(name.startswith("kokoro_fleet_") for name in samples):
        # A fleet worker that has not read the replica table from Redis yet (it does every
        # STATS_REFRESH_S): its own replica alone would pass it off as a single worker.
        return [], {**summary, "mode": "fleet"}
    # One worker without a queue: its own replica, as api/app.py names it.
    if one("kokoro_replica_jobs_total") is None:
        return [], {"mode": "unknown", **engine}
    busy_s = one("kokoro_replica_busy_seconds_total") or 0.0
    row = ReplicaRow("local", True, bool(one("kokoro_replica_busy")), None, int(one("kokoro_replica_jobs_total") or 0),
                     busy_s, one("kokoro_replica_audio_seconds_total") or 0.0, engine.get("engine"))
    return [row], {"mode": "single", **engine}
