"""`kokoro-fleet status [--url URL | --redis-url URL] [--watch SECONDS]`: the fleet's replicas in one table.

From a running server (`--url`, default http://127.0.0.1:8880): reads its /metrics, where every
worker publishes the fleet-wide replica table it reads from Redis (one worker without a queue shows
its one replica). From Redis directly (`--redis-url`): reads the queue's replica table and gauges,
no server needed. `--watch SECONDS` reads again every SECONDS (a terminal redraws in place); the
busy% Redis cannot give (it keeps running totals) then comes from each interval.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from dataclasses import asdict

from api.replica_table import ReplicaRow, parse_metrics, rows_from_metrics

def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--url", default="http://127.0.0.1:8880", help="a server of the fleet (reads its /metrics)")
    parser.add_argument("--api-key", default=os.environ.get("KOKORO_API_KEY", ""),
                        help="a key of the server's KOKORO_API_KEYS: /metrics needs one when they are set "
                             "(default: KOKORO_API_KEY)")
    parser.add_argument("--redis-url", help="read the fleet's Redis directly instead of a server")
    parser.add_argument("--prefix", default=None, help="queue key prefix (default {kf})")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument("--watch", type=float, default=0.0, metavar="SECONDS",
                        help="redraw every SECONDS until interrupted; busy%% then comes from the interval too")
    parser.add_argument("--count", type=int, default=0, help="with --watch: stop after this many reads (0: never)")


async def rows_from_redis(url: str, prefix: str | None) -> tuple[list[ReplicaRow], dict]:
    from api.speech.redis_link import DEFAULT_PREFIX, GAUGES, connect, read_replicas, read_stats

    client = connect(url)
    try:
        stats = await read_stats(client, prefix or DEFAULT_PREFIX)
        replicas = await read_replicas(client, prefix or DEFAULT_PREFIX)
    finally:
        await client.aclose()
    rows = [ReplicaRow(r.replica, r.alive, r.busy, None, r.jobs_done, r.busy_seconds, r.audio_seconds, r.engine,
                       r.running_seconds)
            for r in sorted(replicas, key=lambda r: r.replica)]
    engines = sorted({r.engine for r in rows if r.engine})
    summary = {"mode": "redis", **({"engine": ",".join(engines)} if engines else {}), **{g: stats[g] for g in GAUGES}, "live_replicas": stats.live_replicas,
               **{k: stats[k] for k in ("admitted_total", "refused_total", "expired_total", "requeued_total",
                                        "failed_total", "local_total", "result_bytes_total")}}
    summary["queued_work_seconds"] = summary.pop("queued_work_ms") / 1000
    return rows, summary


def format_replica_table(rows: list[ReplicaRow], summary: dict) -> str:
    head = (f"{'replica':<28} {'engine':<15} {'alive':>5} {'busy':>4} {'busy%':>6} {'jobs':>7} {'busy s':>9} "
            f"{'audio s':>9} {'RTFx':>6}")
    lines = [head, "-" * len(head)]
    if summary.get("engine") == "sim" or any(r.engine == "sim" for r in rows):
        lines.insert(0, "SIMULATED ENGINE (KOKORO_ENGINE=sim): no model; replicas sleep an assumed GPU time "
                        "and return synthetic audio\n")
    for r in rows:
        fraction = "-" if r.busy_fraction is None else f"{100 * r.busy_fraction:.0f}"
        speed = f"{r.audio_seconds / r.busy_seconds:.1f}" if r.busy_seconds > 0 else "-"
        lines.append(f"{r.replica:<28} {r.engine or '-':<15} {'yes' if r.alive else 'no':>5} "
                     f"{'yes' if r.busy else 'no':>4} {fraction:>6} {r.jobs_done:>7} {r.busy_seconds:>9.1f} "
                     f"{r.audio_seconds:>9.1f} {speed:>6}")
    if not rows:
        lines.append("(the worker has not read the fleet's replica table from Redis yet: try again in a second)"
                     if summary.get("mode") == "fleet" else "(no replicas reported)")
    shown = {k: v for k, v in summary.items() if v is not None}
    lines.append("")
    lines.append("  ".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in shown.items()))
    return "\n".join(lines)


class StatusUnavailable(Exception):
    """The server or Redis could not be read; the message says which and why."""


def read_status(args: argparse.Namespace) -> tuple[list[ReplicaRow], dict]:
    if args.redis_url:
        from api.speech.redis_link import QueueUnavailable

        try:
            return asyncio.run(rows_from_redis(args.redis_url, args.prefix))
        except QueueUnavailable as e:
            raise StatusUnavailable(f"cannot read the fleet's Redis: {e}") from None
    import httpx

    base = args.url.rstrip("/")
    try:
        key = getattr(args, "api_key", "")
        response = httpx.get(base + "/metrics", timeout=10, trust_env=False,
                             headers={"Authorization": f"Bearer {key}"} if key else {})
        response.raise_for_status()
    except httpx.HTTPError as e:
        raise StatusUnavailable(f"cannot read {base}/metrics: {e}") from None
    return rows_from_metrics(parse_metrics(response.text))


def read_status_settled(args: argparse.Namespace, patience_s: float = 3.0) -> tuple[list[ReplicaRow], dict]:
    """read_status, but a fleet worker that has not read the replica table from Redis yet (it
    re-reads every second; the kernel may hand us one that has just started) is asked again for up
    to patience_s before its empty table is shown."""
    deadline = time.monotonic() + patience_s
    while True:
        rows, summary = read_status(args)
        if rows or summary.get("mode") != "fleet" or time.monotonic() >= deadline:
            return rows, summary
        time.sleep(0.25)


def busy_over_interval(rows: list[ReplicaRow], before: dict[str, ReplicaRow], seconds: float) -> None:
    """Fill in busy_fraction where the source gave none (Redis holds only running totals): the
    replica's busy seconds since the last read over the time between the reads. Redis counts a job's
    busy time when it completes; the time the job in hand has run so far is added, so an interval
    shorter than a job reads busy, not 0% and then over 100% when the job completes."""
    for row in rows:
        last = before.get(row.replica)
        if row.busy_fraction is None and last is not None and seconds > 0:
            row.busy_fraction = min(1.0, max(0.0, (row.busy_so_far - last.busy_so_far) / seconds))


def run(args: argparse.Namespace) -> int:
    try:
        return show(args)
    except KeyboardInterrupt:  # how --watch ends
        return 0


def show(args: argparse.Namespace) -> int:
    """Read and print once, or with --watch every args.watch seconds."""
    before: dict[str, ReplicaRow] = {}
    last_read = 0.0
    reads = 0
    while True:
        try:
            rows, summary = read_status_settled(args)
        except StatusUnavailable as e:
            print(f"kokoro-fleet status: {e}", file=sys.stderr)
            rows, summary = None, None
        now = time.monotonic()
        reads += 1
        if rows is not None:
            if before:
                busy_over_interval(rows, before, now - last_read)
            before, last_read = {r.replica: r for r in rows}, now
            if args.json:
                print(json.dumps({"replicas": [asdict(r) for r in rows], "summary": summary}, indent=2), flush=True)
            else:
                if args.watch and sys.stdout.isatty():
                    print("\x1b[H\x1b[2J", end="")  # redraw in place on a terminal
                elif args.watch:
                    print(time.strftime("%H:%M:%S"))
                print(format_replica_table(rows, summary), flush=True)
        if not args.watch or (args.count and reads >= args.count):
            return 0 if rows is not None else 1
        time.sleep(args.watch)
