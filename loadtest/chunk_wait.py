"""How long a short request waits behind a long stream, by KOKORO_CHUNK_PHONEMES.

    python -m loadtest.chunk_wait [--sizes 400,200] [--rounds 2] [--weights offline] [--requests 24]

A replica runs each chunk to its end, so a request that arrives while it computes a long text's
chunk waits for the rest of that chunk before its own first chunk starts. For each size in
`--sizes` (rounds interleaved: 400, 200, 400, 200), one `kokoro-fleet serve --workers 1` on the
real weights: a reader streams a long text again and again, reading as fast as it can, while a bot
sends a one-sentence request on a fixed schedule (one about every 2 s, so the bot takes the same
share of the replica whatever its latency). Printed per run: the bot's time to first audio (p50,
p90, max), the reader's audio received per second, and the replica's busy share and audio per busy
second (from /metrics). On a CPU, where chunk size barely changes the engine's speed, smaller
chunks trade some of the reader's throughput for a shorter wait; on a GPU a chunk takes tens of
milliseconds either way.
"""

from __future__ import annotations

import argparse
import random
import threading
import time
from pathlib import Path

import httpx

from loadtest.dispatch import FleetProcess

ROOT = Path(__file__).resolve().parents[1]
LONG_TEXT = " ".join(p for p in (ROOT / "tests/data/texts/paragraphs.txt").read_text(encoding="utf-8").splitlines()
                     if p.strip())
SHORT_TEXT = "Your order has shipped."
REPLICA_FIGURES = ("kokoro_replica_busy_seconds_total", "kokoro_replica_audio_seconds_total")


def replica_figures(url: str) -> dict[str, float]:
    lines = httpx.get(url + "/metrics", timeout=10, trust_env=False).text.splitlines()
    return {name: float(value) for name, value in (line.split() for line in lines if line.startswith(REPLICA_FIGURES))}


def one_run(chunk_phonemes: int, weights: str, requests: int, seed: int = 1, settle_s: float = 5.0) -> dict:
    """One server at `chunk_phonemes`: the reader's stream, `settle_s` for it to get under way, then
    the bot's `requests` on their schedule. Returns the figures `main` prints."""
    env = {"KOKORO_CHUNK_PHONEMES": str(chunk_phonemes)}
    with FleetProcess(1, weights=weights, env=env, name=f"chunk{chunk_phonemes}") as fleet:
        stop = threading.Event()
        received = [0.0]  # the reader's audio seconds (pcm: 48,000 bytes a second)

        def reader() -> None:
            while not stop.is_set():
                with httpx.stream("POST", fleet.url + "/v1/audio/speech", timeout=600, trust_env=False,
                                  json={"input": LONG_TEXT, "voice": "af_heart", "response_format": "pcm"}) as r:
                    for data in r.iter_bytes():
                        received[0] += len(data) / 48000
                        if stop.is_set():
                            break

        waits: list[float] = []

        def bot() -> None:
            sent = time.monotonic()
            with httpx.stream("POST", fleet.url + "/v1/audio/speech", timeout=120, trust_env=False,
                              json={"input": SHORT_TEXT, "voice": "am_adam", "response_format": "pcm"}) as r:
                if any(r.iter_bytes()):
                    waits.append(time.monotonic() - sent)

        streaming = threading.Thread(target=reader)
        streaming.start()
        time.sleep(settle_s)  # the reader's stream under way
        started, audio_before, before = time.monotonic(), received[0], replica_figures(fleet.url)
        rng, bots = random.Random(seed), []
        for i in range(requests):
            time.sleep(max(0.0, started + 2.0 * i + rng.uniform(0, 1.0) - time.monotonic()))
            bots.append(threading.Thread(target=bot))
            bots[-1].start()
        for b in bots:
            b.join()
        wall = time.monotonic() - started
        after = replica_figures(fleet.url)
        reader_rate = (received[0] - audio_before) / wall
        stop.set()
        streaming.join(timeout=120)
    busy = after[REPLICA_FIGURES[0]] - before[REPLICA_FIGURES[0]]
    made = after[REPLICA_FIGURES[1]] - before[REPLICA_FIGURES[1]]
    waits.sort()
    return {"chunk_phonemes": chunk_phonemes, "wait_p50_s": waits[len(waits) // 2],
            "wait_p90_s": waits[min(len(waits) - 1, int(0.9 * len(waits)))], "wait_max_s": waits[-1],
            "reader_audio_s_per_s": reader_rate, "replica_busy": busy / wall, "audio_per_busy_s": made / busy}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtest.chunk_wait", description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="400,200", help="KOKORO_CHUNK_PHONEMES values, comma-separated")
    parser.add_argument("--rounds", type=int, default=2, help="runs of each size, interleaved")
    parser.add_argument("--weights", default="offline", help="KOKORO_WEIGHTS of the server")
    parser.add_argument("--requests", type=int, default=24, help="the bot's requests per run")
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    from worker.cpu_features import cpu_info  # the machine beside every CPU figure

    print(f"cpu: {cpu_info().summary()}")
    for _ in range(args.rounds):
        for size in sizes:
            r = one_run(size, args.weights, args.requests)
            print(f"chunk_phonemes={size}: bot's first audio p50 {r['wait_p50_s'] * 1000:.0f} ms, "
                  f"p90 {r['wait_p90_s'] * 1000:.0f} ms, max {r['wait_max_s'] * 1000:.0f} ms; reader "
                  f"{r['reader_audio_s_per_s']:.2f} audio-s/s; replica busy {r['replica_busy']:.0%}, "
                  f"{r['audio_per_busy_s']:.2f} audio-s per busy s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
