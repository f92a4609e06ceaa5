"""One command for a lent GPU: `python -m worker.gpu_check [--json PATH]`.

Needs only torch, transformers and numpy (a bare GPU box). With full-size random weights
(worker.model.random_init: speech-like durations and F0) it prints:
  1. CUDA-graphed against eager, fp32: durations equal, waveform SNR (bound: >= 30 dB);
  2. bf16 and fp16 (graphed) against fp32 eager: durations within one frame (>= 99%) and the
     log-spectrogram distance (bound: <= 1 dB);
  3. noise on: the same input twice gives the same audio;
  4. the benchmark: eager vs graphed per dtype, audio-seconds per second, p50/p95, peak memory,
     capture time (the reference KModel too when the `kokoro` package is importable).
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np
import torch


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", dest="json_path", default=None)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--sizes", default="30,100,250,500")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("gpu_check: no CUDA device", file=sys.stderr)
        return 2
    logging_setup()
    from worker.engine import Engine
    from worker.model.random_init import random_full_weights
    from worker.reference import log_spectral_distance_db, snr_db

    print(f"device: {torch.cuda.get_device_name()}  torch {torch.__version__}", flush=True)
    weights = random_full_weights()
    report: dict = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "parity": [], "precision": []}

    eager = Engine(weights, "cuda", "fp32", noise=False, cuda_graphs=False, bucketed=False)
    graphed = Engine(weights, "cuda", "fp32", noise=False, cuda_graphs=True)
    start = time.perf_counter()
    graphed.warmup()
    print(f"fp32 capture: {'ok' if graphed.graphs else 'FAILED (eager fallback)'} in {time.perf_counter() - start:.1f} s"
          + (f", {graphed.graphs.graph_bytes / 2**20:.0f} MiB" if graphed.graphs else ""), flush=True)
    voice = weights.voices["af_heart"]
    for n in (10, 30, 100, 250, 500):
        g = torch.Generator().manual_seed(n)
        ids = torch.randint(1, 178, (n,), generator=g).tolist()
        a, b = eager.synthesize(ids, voice[n - 1]), graphed.synthesize(ids, voice[n - 1])
        same = bool(np.array_equal(a.durations, b.durations))
        snr = snr_db(a.audio, b.audio) if len(a.audio) == len(b.audio) else float("nan")
        row = {"tokens": n, "durations_equal": same, "snr_db": snr, "frames": int(a.durations.sum())}
        report["parity"].append(row)
        print(f"graphed vs eager fp32, {n:>3} tokens: durations equal {same}, SNR {snr:.1f} dB "
              f"{'PASS' if same and snr >= 30 else 'FAIL'}", flush=True)
    for dtype in ("bf16", "fp16"):
        engine = Engine(weights, "cuda", dtype, noise=False, cuda_graphs=True)
        engine.warmup()
        for n in (30, 250):
            ids = list(np.random.default_rng(n).integers(1, 178, n))
            a, b = eager.synthesize(ids, voice[n - 1]), engine.synthesize(ids, voice[n - 1])
            within = float((np.abs(a.durations - b.durations) <= 1).mean())
            lsd = log_spectral_distance_db(a.audio, b.audio[: len(a.audio)])
            report["precision"].append({"dtype": dtype, "tokens": n, "durations_within_1": within, "lsd_db": lsd})
            print(f"{dtype} graphed vs fp32 eager, {n} tokens: durations within 1 frame {within:.1%}, "
                  f"log-spectral distance {lsd:.2f} dB {'PASS' if within >= 0.99 and lsd <= 1 else 'FAIL'}", flush=True)
        del engine
    noisy = Engine(weights, "cuda", "fp32", noise=True, cuda_graphs=True)
    noisy.warmup()
    x, y = noisy.synthesize(list(range(20, 60)), voice[39]), noisy.synthesize(list(range(20, 60)), voice[39])
    report["noise_reproducible"] = bool(np.array_equal(x.audio, y.audio))
    print(f"noise on, same input twice: identical {report['noise_reproducible']}", flush=True)
    del eager, graphed, noisy
    torch.cuda.empty_cache()

    from worker import bench

    try:
        from worker.reference import reference_module

        reference_module()
        no_reference = False
    except Exception as error:  # the reference package is not on a bare GPU box
        print(f"reference KModel unavailable ({error}); benchmarking ours only", flush=True)
        no_reference = True
    bench_parser = argparse.ArgumentParser()
    bench.configure(bench_parser)
    bench_args = ["--weights", "random-full", "--device", "cuda", "--modes", "fp32,bf16", "--sizes", args.sizes,
                  "--repeats", str(args.repeats)]
    if no_reference:
        bench_args.append("--no-reference")
    if args.json_path:
        bench_args += ["--json", args.json_path + ".bench.json"]
    bench.run(bench_parser.parse_args(bench_args))
    if args.json_path:
        with open(args.json_path, "w", encoding="utf-8") as f:
            json.dump(report, f, indent=2)
    return 0


def logging_setup() -> None:
    import logging

    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")


if __name__ == "__main__":
    sys.exit(main())
