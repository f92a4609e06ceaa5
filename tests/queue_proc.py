"""A fleet worker stand-in for the fault tests: one process that is both an owner (clients that
admit requests and read their audio) and a replica (a Dispatcher with the fake job runner).

    python tests/queue_proc.py --url redis://... --worker w3 [--clients 3] [--seed 3] [--batch-max 4]

Prints "ready" once serving. The first SIGTERM stops its clients: it then prints one JSON line of
outcome counts ({"ok": ..., "failed": ..., "refused": ..., "hung": ..., ...}) and keeps its replica
serving the fleet; the second SIGTERM closes it. SIGKILL at any point is what the tests do to it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import sys
from collections import Counter

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from queue_fakes import MS_PER_PHONEME, fake_payload, fake_run_batch, fake_run_job  # noqa: E402

from api.speech.admission_client import (  # noqa: E402
    AdmissionBounds,
    AdmissionClient,
    ChunkJob,
    QueueUnavailable,
    Refused,
    RequestFailed,
    ResultTimeout,
)
from api.speech.redis_link import connect  # noqa: E402
from api.speech.dispatcher import Dispatcher, DispatcherConfig  # noqa: E402
from api.speech.worker_queue import WorkerQueueOwner  # noqa: E402


async def main(args) -> None:
    rng = random.Random(args.seed)
    worker_queue = WorkerQueueOwner(args.worker)  # one per worker, shared by its two sides
    admission = AdmissionClient(connect(args.url), args.worker, AdmissionBounds(args.max_requests, 0),
                                worker_queue=worker_queue, owner_ttl_s=args.owner_ttl_s, ms_per_phoneme=MS_PER_PHONEME,
                                poll_s=0.5)
    await admission.start()
    config = DispatcherConfig(lease_s=args.lease_s, heartbeat_s=args.lease_s / 4, replica_ttl_s=args.owner_ttl_s,
                              reap_interval_s=0.2, idle_wait_s=0.5, batch_max=args.batch_max)
    dispatcher = Dispatcher(connect(args.url), args.worker, fake_run_job, config, run_batch=fake_run_batch,
                            worker_queue=worker_queue)
    dispatcher.start()
    stop_clients, stop_replica = asyncio.Event(), asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, lambda: (stop_clients if not stop_clients.is_set() else stop_replica).set())
    outcomes: Counter[str] = Counter()

    async def client() -> None:
        while not stop_clients.is_set():
            sizes = [rng.randint(5, 40) for _ in range(rng.randint(1, 4))]
            chunk_jobs = [ChunkJob(fake_payload(p, p / 1500), p) for p in sizes]
            try:
                async with admission.session(chunk_jobs) as ticket:
                    got = [r.index async for r in admission.results(ticket, timeout_s=args.chunk_timeout_s)]
                assert got == list(range(len(sizes))), got
                outcomes["ok"] += 1
            except Refused as e:
                outcomes["refused"] += 1
                await asyncio.sleep(min(0.2, e.retry_after_ms / 1000))
            except ResultTimeout:
                outcomes["hung"] += 1
            except RequestFailed:  # RequestLost included: a chunk died twice, or its request vanished
                outcomes["failed"] += 1
            except QueueUnavailable:
                outcomes["unavailable"] += 1
                await asyncio.sleep(0.1)

    print("ready", flush=True)
    await asyncio.gather(*(client() for _ in range(args.clients)))
    print(json.dumps(dict(outcomes)), flush=True)
    await stop_replica.wait()
    await dispatcher.close()
    await admission.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--worker", required=True)
    parser.add_argument("--clients", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-requests", type=int, default=12)
    parser.add_argument("--lease-s", type=float, default=1.0)
    parser.add_argument("--owner-ttl-s", type=float, default=1.0)
    parser.add_argument("--chunk-timeout-s", type=float, default=15.0)
    parser.add_argument("--batch-max", type=int, default=1)
    asyncio.run(main(parser.parse_args()))
