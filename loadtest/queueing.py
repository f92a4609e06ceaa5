"""What queueing alone predicts for `python -m loadtest.dispatch`: a discrete-event model of the
fleet's scheduling, no servers, no network, no CPU costs.

    python -m loadtest.queueing [--workers 8] [--load 0.8] [--texts short] [--requests 200000]
                                [--chunk-ms 200] [--phoneme-ms 3.5]

Requests arrive as a Poisson stream; each is its text's chunks (the real text frontend's chunking),
every chunk costing chunk_ms + phoneme_ms x phonemes (the simulated engine's cost model) and all
enqueued at arrival with the fleet's deadlines (queue/admit.lua: chunk i is due at arrival plus the
estimated audio of chunks 0..i-1, so every first chunk is due at once). A free replica runs the
earliest-deadline chunk, non-preemptively. `shared`: one queue, `workers` replicas. `local`: each
request goes to one worker, uniformly at random (a balanced spread: the kernel's accepts and kept-alive
connections are often skewed, which only makes `local` worse), and only that worker's replica runs it. Prints p50/p95 time to first audio
(first chunk done minus arrival) of both and their ratio, for comparison with a measured run.
The load is the offered fraction of the fleet's capacity (replica-seconds per second / workers).
"""

from __future__ import annotations

import argparse
import heapq
import random
import sys
from dataclasses import dataclass

from loadtest.texts import load_texts
from worker.audio import SECONDS_PER_PHONEME


@dataclass(frozen=True)
class Shape:
    """One request's chunks: service seconds and deadline offsets from arrival."""

    service_s: tuple[float, ...]
    due_s: tuple[float, ...]


def shapes(texts: list[str], chunk_ms: float, phoneme_ms: float) -> list[Shape]:
    from api.settings import Settings
    from worker.text import text_to_chunks

    settings = Settings.from_env(only=("first_chunk_phonemes", "chunk_phonemes"))
    out = []
    for text in texts:
        sizes = [len(c.ids) for c in text_to_chunks(text, "a", first_chunk_phonemes=settings.first_chunk_phonemes,
                                                      chunk_phonemes=settings.chunk_phonemes) if c.ids]
        due, at = [], 0.0
        for n in sizes:
            due.append(at)
            at += n * SECONDS_PER_PHONEME
        out.append(Shape(tuple((chunk_ms + phoneme_ms * n) / 1000 for n in sizes), tuple(due)))
    return out


def first_audio_times(arrivals: list[tuple[float, Shape]], servers: int) -> list[float]:
    """TTFA of each request (in arrival order) on one pool of `servers` replicas, EDF, non-preemptive."""
    ttfa = [0.0] * len(arrivals)
    queue: list[tuple[float, int, int, int]] = []  # (deadline, request, chunk, tie)
    free_at = [0.0] * servers  # heap of the times replicas become free
    heapq.heapify(free_at)
    i, tie, n = 0, 0, len(arrivals)
    while i < n or queue:
        t_free = free_at[0]
        # Admit every request that has arrived by the time the next replica is free.
        while i < n and (arrivals[i][0] <= t_free or not queue):
            at, shape = arrivals[i]
            for k, due in enumerate(shape.due_s):
                heapq.heappush(queue, (at + due, i, k, tie))
                tie += 1
            i += 1
        deadline, r, k, _ = heapq.heappop(queue)
        at, shape = arrivals[r]
        start = max(heapq.heappop(free_at), at)
        end = start + shape.service_s[k]
        heapq.heappush(free_at, end)
        if k == 0:
            ttfa[r] = end - at
    return ttfa


def model(texts: list[Shape], workers: int, load: float, requests: int, seed: int = 0) -> dict[str, dict[str, float]]:
    rng = random.Random(seed)
    mean_work = sum(sum(s.service_s) for s in texts) / len(texts)
    rate = load * workers / mean_work
    t, arrivals = 0.0, []
    for _ in range(requests):
        t += rng.expovariate(rate)
        arrivals.append((t, rng.choice(texts)))
    shared = first_audio_times(arrivals, workers)
    owner = [rng.randrange(workers) for _ in arrivals]
    local: list[float] = []
    for w in range(workers):
        local += first_audio_times([a for a, o in zip(arrivals, owner) if o == w], 1)
    return {"shared": _dist(shared), "local": _dist(local)}


def _dist(values: list[float]) -> dict[str, float]:
    values = sorted(values[len(values) // 20:])  # the first 5%: warm-up, dropped
    pick = lambda q: values[min(len(values) - 1, int(q * len(values)))]  # noqa: E731
    return {"p50": pick(0.5), "p95": pick(0.95), "p99": pick(0.99)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m loadtest.queueing", description=__doc__.splitlines()[0])
    p.add_argument("--workers", type=int, default=8)
    p.add_argument("--load", type=float, default=0.8, help="fraction of the fleet's capacity offered")
    p.add_argument("--texts", default="short", help="short | paragraphs | long | FILE")
    p.add_argument("--requests", type=int, default=200_000)
    p.add_argument("--chunk-ms", type=float, default=200.0, help="cost per chunk (default: the sim's, 20x)")
    p.add_argument("--phoneme-ms", type=float, default=3.5, help="cost per phoneme (default: the sim's, 20x)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    texts = shapes(load_texts(args.texts), args.chunk_ms, args.phoneme_ms)
    result = model(texts, args.workers, args.load, args.requests, args.seed)
    for label in ("shared", "local"):
        d = result[label]
        print(f"{label:>6}: TTFA p50 {d['p50'] * 1000:.0f} ms  p95 {d['p95'] * 1000:.0f} ms  p99 {d['p99'] * 1000:.0f} ms")
    print(f"p95 TTFA local / shared = {result['local']['p95'] / result['shared']['p95']:.2f}x "
          f"({args.workers} workers, {args.load:.0%} load, {args.texts} texts, requests spread uniformly)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
