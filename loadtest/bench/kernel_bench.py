"""Eager against fused CPU kernels, side by side in one run, and what their compile costs.

    python -m loadtest.bench.kernel_bench [--dtypes auto,int8] [--phonemes 120] [--runs 5] [--cache-dir DIR]

Per precision mode: the engine warms up eagerly (as a server's worker now does before `/ready`),
then compiles its fused CPU kernels (`Engine.compile_kernels`: compiled, or loaded where DIR's
cache has them); then a ~120-phoneme chunk runs `--runs` times with the eager kernels and with the
fused ones, interleaved (so other processes' load hits both alike); then chunks of other lengths
with the fused kernels, counting every graph dynamo traces and inductor compiles while they serve
(0 is the goal: the compile covered them). Prints the CPU model and load average beside every
figure, ms per chunk (median) and audio-s/s for each, and the audio a one-shot command must make
before a compile pays for itself (`say`'s choice: cli/say_cli.py). DIR defaults to a fresh temporary
directory (a cold compile); the weights come from KOKORO_CACHE_DIR as usual.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch

from loadtest.bench.engine_bench import bench_weights, chunk_ids
from worker.audio import SAMPLE_RATE

OTHER_LENGTHS = (40, 200, 300, 450, 510)  # chunk sizes a server meets after the compile


def cpu_and_load() -> str:
    model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("model name")), "unknown CPU")
    return f"[{model}, {os.cpu_count()} cores, load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}]"


def timed(engine, ids, style) -> tuple[float, float]:
    """Wall seconds of one synthesis, and its audio seconds."""
    start = time.perf_counter()
    result = engine.synthesize(ids, style)
    return time.perf_counter() - start, len(result.audio) / SAMPLE_RATE


def bench_mode(weights, dtype: str, phonemes: int, runs: int) -> dict:
    from worker.compile_cache import CompileTally
    from worker.engine import Engine, EngineConfig

    vocab = weights.config["vocab"]
    ids = chunk_ids(vocab, phonemes)
    style = weights.voices["af_heart"][len(ids) - 1]
    started = time.perf_counter()
    engine = Engine(weights, EngineConfig("cpu", dtype))
    engine.warmup(compile_kernels=False)
    ready_s = time.perf_counter() - started
    first_eager_s, _ = timed(engine, ids, style)
    print(f"{engine.dtype}: engine built and warmed up eagerly in {ready_s:.1f} s, first {phonemes}-phoneme chunk "
          f"eagerly {first_eager_s * 1000:.0f} ms {cpu_and_load()}", flush=True)
    record = engine.compile_kernels()
    engine.switch_to_compiled_kernels()
    print(f"{engine.dtype}: {record.describe()} {cpu_and_load()}", flush=True)
    eager = engine.view()
    eager._kernels_compiled = False  # the same model and thread, the eager kernels
    times: dict[str, list[float]] = {"eager": [], "fused": []}
    audio_s = 0.0
    tally = CompileTally()
    for _ in range(runs):
        for name, which in (("eager", eager), ("fused", engine)):
            seconds, audio_s = timed(which, ids, style)
            times[name].append(seconds)
    for length in OTHER_LENGTHS:
        engine.synthesize(chunk_ids(vocab, length), weights.voices["af_heart"][length - 1])
    serving = tally.deltas()
    median = {name: statistics.median(values) for name, values in times.items()}
    for name in ("eager", "fused"):
        print(f"{engine.dtype} {name:5s}: {median[name] * 1000:7.0f} ms per {phonemes}-phoneme chunk "
              f"({audio_s:.2f} s of audio), {audio_s / median[name]:5.1f} audio-s/s {cpu_and_load()}", flush=True)
    saved_per_audio_s = (median["eager"] - median["fused"]) / audio_s
    pays_after = record.seconds / saved_per_audio_s if saved_per_audio_s > 0 else float("inf")
    print(f"{engine.dtype}: fused {median['eager'] / median['fused']:.2f}x the eager speed; a compile of "
          f"{record.seconds:.0f} s pays for itself after {pays_after:.0f} s of audio (run alone, not counting "
          f"the cores it takes from the eager passes meanwhile); compiles while serving chunks of "
          f"{', '.join(map(str, OTHER_LENGTHS))} phonemes after it: {serving['graphs']} traced, "
          f"{serving['fx_miss']} compiled", flush=True)
    return {"dtype": engine.dtype, "eager_ms": median["eager"] * 1000, "fused_ms": median["fused"] * 1000,
            "compile": record.as_dict(), "serving_traced": serving["graphs"], "serving_compiled": serving["fx_miss"]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dtypes", default="auto,int8", help="precision modes, comma-separated")
    parser.add_argument("--phonemes", type=int, default=120)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--weights", default="offline")
    parser.add_argument("--cache-dir", default=None, help="the fused kernels' compile cache (default: a fresh one)")
    args = parser.parse_args(argv)
    from worker.cpu_runtime import vector_isa

    cache = Path(args.cache_dir or tempfile.mkdtemp(prefix="kokoro-kernel-bench-"))
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(cache / "inductor" / vector_isa())
    weights = bench_weights(args.weights)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, kernel cache {cache} {cpu_and_load()}")
    for dtype in args.dtypes.split(","):  # bf16 before int8: int8 mode keeps freed memory process-wide
        bench_mode(weights, dtype, args.phonemes, args.runs)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
