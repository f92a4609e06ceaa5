"""One command for a lent GPU: `python -m loadtest.bench.gpu_parity [--json PATH]`.

Needs only torch, transformers and numpy (a bare GPU box). With full-size random weights
(worker.model.random_init: speech-like durations and F0) it prints:
  1. CUDA-graphed against eager, fp32: the graphs replay the eager run on the same padded shapes
     bit for bit (what capture must not change), and the padded run against the unpadded one
     (what masking must not change): durations equal, log-spectral distance <= 0.5 dB, SNR shown;
  2. bf16 and fp16 (graphed) against fp32 eager: durations within one frame (>= 99%) and the
     log-spectral distance (bound: <= 1.3 dB with these random weights; see PRECISION_BOUND_DB);
  3. noise on: the same input twice gives the same audio;
  4. the benchmark: eager vs graphed per dtype, audio-seconds per second, p50/p95, peak memory,
     capture time (the reference KModel too when the `kokoro` package is importable).

`--startup N [--cache-dir DIR]` checks start-up with compiled passes instead: N engine processes
start together on DIR (default: the host's compile cache; on a fresh machine one compiles, the
others wait and load), then one more alone on the warm cache; each reports whether it compiled or loaded, how long that took, its time to ready
and its GPU memory (bf16, noise on, batches up to 32: what a serving replica compiles; its batch
graph grid smaller than the default, so that eight fit one card).
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np
import torch


# Padded (bucketed) against unpadded fp32, the same random weights: what masking the padding must
# keep. Well above what exact float32 gives, below what TF32 gives (figures: loadtest/README.md).
PADDING_BOUND_DB = 0.5
# bf16 / fp16 against fp32. These random weights sit near the real weights' 1 dB bound, while a
# masking or precision bug costs several dB (figures: loadtest/README.md).
PRECISION_BOUND_DB = 1.3


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", dest="json_path", default=None)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--sizes", default="30,60,120,250,400,510", help="the benchmark's chunk sizes (phonemes)")
    parser.add_argument("--modes", default="fp32,bf16,fp16", help="the benchmark's dtypes")
    parser.add_argument("--startup", type=int, default=0, help="start this many compiled engines together")
    parser.add_argument("--cache-dir", default=None, help="--startup: the compile cache (empty for a cold start)")
    parser.add_argument("--start-one", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("gpu_check: no CUDA device", file=sys.stderr)
        return 2
    logging_setup()
    if args.start_one:
        return start_one(args.cache_dir)
    if args.startup:
        return startup(args.startup, args.cache_dir, args.json_path)
    from worker.engine import Engine, EngineConfig
    from worker.weights.random_full import random_full_weights
    from worker.reference import log_spectral_distance_db, snr_db

    print(f"device: {torch.cuda.get_device_name()}  torch {torch.__version__}", flush=True)
    weights = random_full_weights()
    report: dict = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "parity": [], "precision": [],
                    "capture": {}}
    failures: list[str] = []

    eager = Engine(weights, EngineConfig("cuda", "fp32", noise=False, cuda_graphs=False, bucketed=False, compiled=False))
    padded = Engine(weights, EngineConfig("cuda", "fp32", noise=False, cuda_graphs=False, bucketed=True, compiled=False))
    graphed = Engine(weights, EngineConfig("cuda", "fp32", noise=False, cuda_graphs=True, compiled=False))
    start = time.perf_counter()
    graphed.warmup()
    record_capture(report, failures, "fp32", graphed)
    print(f"fp32 capture: {'ok' if graphed.graphs else 'FAILED (eager fallback)'} in {time.perf_counter() - start:.1f} s"
          + (f", {graphed.graphs.graph_bytes / 2**20:.0f} MiB" if graphed.graphs else ""), flush=True)
    voice = weights.voices["af_heart"]
    for n in (10, 30, 100, 250, 500):
        g = torch.Generator().manual_seed(n)
        ids = torch.randint(1, 178, (n,), generator=g).tolist()
        a, p, b = (e.synthesize(ids, voice[n - 1]) for e in (eager, padded, graphed))
        replayed = bool(np.array_equal(p.durations, b.durations) and np.array_equal(p.audio, b.audio))
        same = bool(np.array_equal(a.durations, b.durations))
        snr = snr_db(a.audio, b.audio) if len(a.audio) == len(b.audio) else float("nan")
        lsd = log_spectral_distance_db(a.audio, b.audio[: len(a.audio)])
        ok = replayed and same and lsd <= PADDING_BOUND_DB
        report["parity"].append({"tokens": n, "replays_padded_eager_exactly": replayed, "durations_equal": same,
                                 "snr_db": snr, "lsd_db": lsd, "frames": int(a.durations.sum())})
        if not ok:
            failures.append(f"graphed vs eager fp32 at {n} tokens")
        print(f"graphed vs eager fp32, {n:>3} tokens: replays the padded eager run exactly {replayed}; against the "
              f"unpadded run durations equal {same}, log-spectral distance {lsd:.3f} dB, SNR {snr:.1f} dB "
              f"{'PASS' if ok else 'FAIL'}", flush=True)
    for dtype in ("bf16", "fp16"):
        engine = Engine(weights, EngineConfig("cuda", dtype, noise=False, cuda_graphs=True, compiled=False))
        engine.warmup()
        record_capture(report, failures, dtype, engine)
        for n in (30, 250):
            ids = list(np.random.default_rng(n).integers(1, 178, n))
            a, b = eager.synthesize(ids, voice[n - 1]), engine.synthesize(ids, voice[n - 1])
            within = float((np.abs(a.durations - b.durations) <= 1).mean())
            lsd = log_spectral_distance_db(a.audio, b.audio[: len(a.audio)])
            report["precision"].append({"dtype": dtype, "tokens": n, "durations_within_1": within, "lsd_db": lsd})
            ok = within >= 0.99 and lsd <= PRECISION_BOUND_DB
            if not ok:
                failures.append(f"{dtype} against fp32 at {n} tokens")
            print(f"{dtype} graphed vs fp32 eager, {n} tokens: durations within 1 frame {within:.1%}, "
                  f"log-spectral distance {lsd:.2f} dB {'PASS' if ok else 'FAIL'}", flush=True)
        del engine
    noisy = Engine(weights, EngineConfig("cuda", "fp32", noise=True, cuda_graphs=True, compiled=False))
    noisy.warmup()
    x, y = noisy.synthesize(list(range(20, 60)), voice[39]), noisy.synthesize(list(range(20, 60)), voice[39])
    report["noise_reproducible"] = bool(np.array_equal(x.audio, y.audio))
    print(f"noise on, same input twice: identical {report['noise_reproducible']}", flush=True)
    if not report["noise_reproducible"]:
        failures.append("noise not reproducible")
    del eager, padded, graphed, noisy
    torch.cuda.empty_cache()

    from loadtest.bench import engine_bench

    try:
        from worker.reference import reference_module

        reference_module()
        no_reference = False
    except Exception as error:  # the reference package is not on a bare GPU box
        print(f"reference KModel unavailable ({error}); benchmarking ours only", flush=True)
        no_reference = True
    bench_parser = argparse.ArgumentParser()
    engine_bench.configure(bench_parser)
    bench_args = ["--weights", "random-full", "--device", "cuda", "--modes", args.modes, "--sizes", args.sizes,
                  "--repeats", str(args.repeats)]
    if no_reference:
        bench_args.append("--no-reference")
    if args.json_path:
        bench_args += ["--json", args.json_path + ".bench.json"]
    report["failures"] = failures
    if args.json_path:  # the checks' figures first: the benchmark below may run out of time
        with open(args.json_path, "w", encoding="utf-8") as f:
            json.dump(report, f, indent=2)
    print(f"checks: {'PASS' if not failures else 'FAIL: ' + '; '.join(failures)}", flush=True)
    engine_bench.run(bench_parser.parse_args(bench_args))
    return 1 if failures else 0


def start_one(cache_dir: str) -> int:
    """One serving engine's start (compile or load, capture, warm-up); its figures as a JSON line."""
    start = time.perf_counter()
    from worker.engine import Engine, EngineConfig
    from worker.weights.random_full import random_full_weights

    weights = random_full_weights()
    built = time.perf_counter()
    # a smaller batch grid than a replica's default, so that eight fit one card together
    engine = Engine(weights, EngineConfig("cuda", "bf16", compiled=True, max_batch=32, batch_graph_frames=4096,
                    compile_cache_dir=cache_dir))
    engine.warmup()
    torch.cuda.synchronize()
    record = engine.compile_record
    batch_graphs = engine.batch_graphs
    print("START " + json.dumps({
        "loaded": record.loaded, "compile_s": record.seconds, "waited_s": record.waited_s,
        "graphs_compiled": record.graphs_compiled, "graphs_loaded": record.graphs_loaded,
        "weights_s": built - start, "ready_s": time.perf_counter() - start,
        "batch_graphs": len(batch_graphs.graphs) if batch_graphs else 0,
        "reserved_mib": torch.cuda.memory_reserved() / 2**20}), flush=True)
    return 0


def startup(workers: int, cache_dir: str | None, json_path: str | None) -> int:
    """`workers` engine processes started together on `cache_dir`, then one alone (warm cache)."""
    import subprocess

    from worker.compile_cache import default_compile_cache_dir

    # the host's own cache by default, which the engines started after this check then load
    cache_dir = cache_dir or str(default_compile_cache_dir(torch.device("cuda")))
    command = [sys.executable, "-m", "loadtest.bench.gpu_parity", "--start-one", "--cache-dir", cache_dir]

    def started(count: int) -> list[dict]:
        processes = [subprocess.Popen(command, stdout=subprocess.PIPE, text=True) for _ in range(count)]
        figures = []
        for process in processes:
            out, _ = process.communicate()
            lines = [line for line in out.splitlines() if line.startswith("START ")]
            figures.append(json.loads(lines[-1][6:]) if process.returncode == 0 and lines else None)
        return figures

    print(f"device: {torch.cuda.get_device_name()}  torch {torch.__version__}; compile cache {cache_dir}", flush=True)
    together, alone = started(workers), started(1)
    report = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "workers": workers,
              "together": together, "alone_warm": alone[0]}
    for name, rows in (("together", together), ("alone, warm cache", alone)):
        for k, row in enumerate(rows):
            print(f"{name} #{k}: " + ("FAILED" if row is None else
                  f"{'loaded' if row['loaded'] else 'compiled'} in {row['compile_s']:.1f} s (waited "
                  f"{row['waited_s']:.1f} s; {row['graphs_compiled']} graphs compiled, {row['graphs_loaded']} "
                  f"loaded), ready after {row['ready_s']:.1f} s, {row['batch_graphs']} batch graphs, "
                  f"{row['reserved_mib']:.0f} MiB reserved"), flush=True)
    ok = [r for r in together if r is not None]
    compiled = sum(not r["loaded"] for r in ok)
    print(f"startup: {len(ok)}/{workers} started together, {compiled} compiled, {len(ok) - compiled} loaded; "
          f"alone on the warm cache ready after {alone[0]['ready_s']:.1f} s" if alone[0] else
          "startup: the warm start FAILED", flush=True)
    if json_path:
        with open(json_path, "w", encoding="utf-8") as f:
            json.dump(report, f, indent=2)
    # compiled == 0: the cache was warm already (a second run on the same machine)
    return 0 if len(ok) == workers and compiled <= 1 and alone[0] and alone[0]["loaded"] else 1


def record_capture(report: dict, failures: list[str], dtype: str, engine) -> None:
    """Capture time and memory of an engine's CUDA graphs, or the failure (it then serves eagerly)."""
    graphs = engine.graphs
    if graphs is None:
        failures.append(f"{dtype} CUDA graph capture failed (see the log)")
        report["capture"][dtype] = None
        return
    report["capture"][dtype] = {"seconds": graphs.capture_seconds, "mib": graphs.graph_bytes / 2**20,
                                "stage1_graphs": len(graphs.stage1_graphs), "stage2_graphs": len(graphs.stage2_graphs)}


def logging_setup() -> None:
    import logging

    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")


if __name__ == "__main__":
    sys.exit(main())
