"""The fleet's figures as one worker shows them in /metrics: its own counters (admitted, refused,
served locally, ...), its replica's, and the whole fleet's, re-read from Redis every STATS_REFRESH_S
(`FleetFigures.refresh`, from the fleet service's housekeeping), so a scrape never waits on Redis.
Figures marked fleet-wide are the same on every worker; api/replica_table.py reads them back for
`kokoro-fleet status`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import redis.asyncio as aioredis
from prometheus_client import Histogram

from api.metrics import Metrics
from api.speech.redis_link import QueueStats, ReplicaStatus, read_replicas, read_stats

if TYPE_CHECKING:
    from api.speech.contract import ReplicaStats
    from api.speech.dispatcher import Dispatcher
    from api.speech.worker_queue import WorkerQueueOwner

# How often the fleet figures shown in /metrics are re-read from Redis.
STATS_REFRESH_S = 1.0
# Histogram buckets for the wait of a request's first chunk in the shared queue.
WAIT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


@dataclass
class FleetSnapshot:
    """What /metrics shows of the whole fleet, re-read from Redis every STATS_REFRESH_S."""

    stats: QueueStats | None = None
    replicas: list[ReplicaStatus] = field(default_factory=list)
    busy_fraction: dict[str, float] = field(default_factory=dict)
    read_at: float = 0.0


class FleetFigures:
    """The fleet's part of one worker's /metrics, and the snapshot of the fleet it is read from."""

    def __init__(self, client: aioredis.Redis, prefix: str):
        self.client = client
        self.prefix = prefix
        self.snapshot = FleetSnapshot()
        # filled by this worker's replica (api/speech/dispatcher.py, ReplicaJobRunner)
        self.wait_histogram = Histogram("kokoro_fleet_first_chunk_wait_seconds", "Wait of requests' first chunks "
                                        "in the queue before this replica leased them.", buckets=WAIT_BUCKETS,
                                        registry=None)

    async def refresh(self) -> QueueStats:
        """Re-read the fleet's figures from Redis (QueueUnavailable when it cannot be reached), with
        each replica's busy fraction since the last read."""
        now = time.monotonic()
        stats = await read_stats(self.client, self.prefix)
        replicas = await read_replicas(self.client, self.prefix)
        previous = {r.replica: r for r in self.snapshot.replicas}
        elapsed = now - self.snapshot.read_at if self.snapshot.read_at else 0.0
        busy = {}
        for r in replicas:
            before = previous.get(r.replica)
            if before is not None and elapsed > 0:
                busy[r.replica] = min(1.0, max(0.0, (r.busy_so_far - before.busy_so_far) / elapsed))
        self.snapshot = FleetSnapshot(stats, replicas, busy, now)
        return stats

    def register(self, m: Metrics, worker_queue: WorkerQueueOwner, dispatcher: Dispatcher,
                 replica_stats: Callable[[], ReplicaStats], started: float) -> None:
        """Every fleet figure of this worker's /metrics: `worker_queue` holds its mode and counters,
        `dispatcher` runs its replica, `replica_stats` reads that replica's, `started` (monotonic) is its start."""
        c = worker_queue.counters
        m.gauge("kokoro_fleet_degraded", "1 while this worker cannot reach Redis and serves its own requests locally.",
                lambda: float(worker_queue.degraded))
        m.counter("kokoro_fleet_degraded_seconds_total", "Seconds this worker spent degraded (Redis unreachable).",
                  worker_queue.seconds_degraded)
        m.counter("kokoro_fleet_worker_admitted_total", "Requests this worker admitted into the shared queue.",
                  lambda: c.admitted)
        m.counter("kokoro_fleet_worker_refused_total", "Requests this worker refused (503) because the fleet was full.",
                  lambda: c.refused)
        m.counter("kokoro_fleet_worker_served_locally_total",
                  "Requests this worker served on its own replica because Redis was unreachable.", lambda: c.served_locally)
        m.counter("kokoro_fleet_worker_from_cache_total",
                  "Requests whose every chunk this worker's replica had in its synthesis cache: answered at once, "
                  "without the shared queue.", lambda: c.from_cache)
        m.counter("kokoro_fleet_worker_finished_locally_total",
                  "Streams whose remaining chunks ran on this worker's replica after Redis went away.",
                  lambda: c.finished_locally)
        m.counter("kokoro_fleet_worker_cancelled_total", "Requests whose queued jobs were cancelled (client gone).",
                  lambda: c.cancelled)
        m.counter("kokoro_fleet_worker_failed_total", "Requests the queue ended with an error.", lambda: c.failed)
        m.gauge("kokoro_fleet_replica_busy_fraction_lifetime",
                "Fraction of this worker's lifetime its replica spent running inferences.",
                lambda: replica_stats().busy_seconds / max(1e-9, time.monotonic() - started))
        m.counter("kokoro_fleet_lease_losses_total", "This replica's results refused because its lease had expired.",
                  lambda: dispatcher.lease_losses)
        m.counter("kokoro_fleet_batch_fallbacks_total",
                  "Batches whose forward pass failed on this replica and ran again one job at a time.",
                  lambda: dispatcher.batch_fallbacks)

        def stat(name: str):
            def read() -> float:
                s = self.snapshot.stats
                if s is None:
                    raise LookupError("no fleet figures yet")
                return s[name]
            return read

        for field_name, kind, help_text in (
            ("admitted", "gauge", "Requests admitted in the whole fleet (queued or streaming)."),
            ("queued_jobs", "gauge", "Chunk jobs waiting in the shared queue."),
            ("inflight_jobs", "gauge", "Chunk jobs leased by a replica."),
            ("admitted_total", "counter", "Admission decisions: requests admitted, fleet-wide."),
            ("refused_total", "counter",
             "Admission decisions: requests refused, fleet-wide (503, and 429 for a key at its share)."),
            ("key_refused_total", "counter",
             "Requests refused with 429 because their API key held its share (KOKORO_KEY_MAX_SHARE) of the requests "
             "or of the queued audio, fleet-wide."),
            ("leased_total", "counter", "Chunk jobs leased by replicas, fleet-wide (a batch counts each of its jobs)."),
            ("lease_batches_total", "counter",
             "Leases that took at least one job, fleet-wide: leased_total / lease_batches_total is the mean batch."),
            ("expired_total", "counter", "Leases that expired (their replica stopped responding)."),
            ("requeued_total", "counter", "Jobs put back in the queue after a lease expired."),
            ("failed_total", "counter", "Requests the queue failed (a chunk lost twice, or a synthesis error)."),
            ("completed_total", "counter", "Chunk results delivered, fleet-wide."),
            ("cancelled_total", "counter", "Requests cancelled by their owner (client gone)."),
            ("orphaned_total", "counter", "Requests freed by the reaper because their owner worker died."),
            ("local_total", "counter", "Chunk results handed over in memory: the owner's own replica ran them."),
            ("result_bytes_total", "counter", "Bytes of PCM that crossed Redis (results another worker's replica made)."),
        ):
            (m.gauge if kind == "gauge" else m.counter)(f"kokoro_fleet_{field_name}", help_text, stat(field_name),
                                                        fleet_wide=True)
        m.gauge("kokoro_fleet_queued_work_seconds", "Estimated audio seconds of the jobs waiting in the shared queue.",
                lambda: stat("queued_work_ms")() / 1000, fleet_wide=True)
        m.gauge("kokoro_fleet_live_replicas", "Replicas whose liveness Redis saw within its TTL.",
                lambda: self.snapshot.stats.live_replicas if self.snapshot.stats else _missing(), fleet_wide=True)
        m.gauge("kokoro_fleet_replica_rate", "Measured audio seconds per busy second of one replica (EWMA).",
                lambda: self.snapshot.stats.rate if self.snapshot.stats and self.snapshot.stats.rate else _missing(),
                fleet_wide=True)
        m.include(self.wait_histogram, dispatcher.batch_sizes)
        # A row per replica of the fleet, as this worker last read them from Redis.
        for name, kind, help_text, figure in (
            ("kokoro_fleet_replica_busy", "gauge", "1 while the replica runs a job.", lambda r: float(r.busy)),
            ("kokoro_fleet_replica_busy_fraction", "gauge",
             f"Fraction of the last ~{STATS_REFRESH_S:g} s the replica spent running jobs.",
             lambda r: self.snapshot.busy_fraction.get(r.replica)),
            ("kokoro_fleet_replica_jobs_total", "counter", "Chunk jobs the replica completed.", lambda r: r.jobs_done),
            ("kokoro_fleet_replica_busy_seconds_total", "counter", "Seconds the replica spent running jobs.",
             lambda r: r.busy_seconds),
            ("kokoro_fleet_replica_audio_seconds_total", "counter", "Audio seconds the replica synthesized.",
             lambda r: r.audio_seconds),
            ("kokoro_fleet_replica_alive", "gauge", "1 while the replica's liveness is fresh.", lambda r: float(r.alive)),
        ):
            (m.gauge if kind == "gauge" else m.counter)(name, help_text, self._per_replica(figure), fleet_wide=True,
                                                        labels=("replica",))
        m.gauge("kokoro_fleet_replica_info", "The engine each replica runs: torch <device> <precision>, or sim "
                "(SIMULATED: no model).", lambda: {(r.replica, r.engine): 1.0 for r in self.snapshot.replicas if r.engine},
                fleet_wide=True, labels=("replica", "engine"))

    def _per_replica(self, figure) -> Callable[[], dict[tuple[str, ...], float]]:
        def read() -> dict[tuple[str, ...], float]:
            values = {(r.replica,): figure(r) for r in self.snapshot.replicas}
            return {key: value for key, value in values.items() if value is not None}
        return read


def _missing() -> float:
    raise LookupError("no fleet figures yet")
