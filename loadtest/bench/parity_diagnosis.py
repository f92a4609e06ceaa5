"""The CUDA parity diagnosis behind worker.engine.use_exact_cuda_arithmetic: eager, bucketed,
CUDA-graphed, batched, noisy and bf16 runs of the same chunks compared (SNR, log-spectral distance,
bit equality). `python -m loadtest.bench.parity_diagnosis MODE` from the repo root on a GPU, MODE
default (torch's flags), notf32 (TF32 off) or strict (TF32 off, deterministic cuDNN). The engine
now sets the strict flags itself, so `default` and `notf32` no longer reproduce torch's defaults
inside Engine. The recorded run and its figures: loadtest/README.md, "Figures behind the code's choices"."""

import argparse
import time
import numpy as np, torch


def main(mode: str) -> None:
    if mode == "strict":
        torch.backends.cudnn.deterministic = True
        torch.backends.cudnn.benchmark = False
        torch.backends.cudnn.allow_tf32 = False
        torch.backends.cuda.matmul.allow_tf32 = False
    elif mode == "notf32":
        torch.backends.cudnn.allow_tf32 = False
        torch.backends.cuda.matmul.allow_tf32 = False
    from worker.engine import Engine, EngineConfig, BatchItem
    from worker.weights.random_full import random_full_weights
    from worker.reference import log_spectral_distance_db as lsd, snr_db
    GRID = (64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048, 2560)
    w = random_full_weights(); voice = w.voices["af_heart"]
    def ids_of(n):
        g = torch.Generator().manual_seed(n); return torch.randint(1, 178, (n,), generator=g).tolist()
    def cmp(tag, a, b):
        same = bool(np.array_equal(a.durations, b.durations)); n = min(len(a.audio), len(b.audio))
        exact = bool(len(a.audio) == len(b.audio) and np.array_equal(a.audio, b.audio))
        print(f"{mode:7s} {tag:45s} dur_eq={same} exact={exact} snr={snr_db(a.audio[:n], b.audio[:n]):6.1f} dB "
              f"lsd={lsd(a.audio[:n], b.audio[:n]):.3f} dB maxabs={np.abs(a.audio[:n]-b.audio[:n]).max():.2e} "
              f"rms={np.sqrt((a.audio**2).mean()):.3f} nan={np.isnan(b.audio).any()}", flush=True)
    eager = Engine(w, EngineConfig("cuda", "fp32", noise=False, cuda_graphs=False, bucketed=False))
    beager = Engine(w, EngineConfig("cuda", "fp32", noise=False, cuda_graphs=False, bucketed=True, frame_grid=GRID))
    graphed = Engine(w, EngineConfig("cuda", "fp32", noise=False, cuda_graphs=True, frame_grid=GRID)); graphed.warmup()
    print("graphs", graphed.graphs is not None)
    for n in (10, 100, 250):
        ids = ids_of(n); s = voice[n - 1]
        e1, e2 = eager.synthesize(ids, s), eager.synthesize(ids, s)
        b1 = beager.synthesize(ids, s)
        g1, g2 = graphed.synthesize(ids, s), graphed.synthesize(ids, s)
        cmp(f"eager twice {n}", e1, e2); cmp(f"bucketed-eager vs eager {n}", e1, b1)
        cmp(f"graphed twice {n}", g1, g2); cmp(f"graphed vs eager {n}", e1, g1); cmp(f"graphed vs bucketed-eager {n}", b1, g1)
    items = [BatchItem(ids_of(n), voice[n - 1], 1.0 + 0.2 * k) for k, n in enumerate((100, 10, 37))]
    for eng, tag in ((eager, "unbucketed"), (beager, "bucketed")):
        for it, got in zip(items, eng.synthesize_batch(items)):
            cmp(f"batch vs single {tag} {len(it.ids)}", eng.synthesize(it.ids, it.style, it.speed), got)
    noisy = Engine(w, EngineConfig("cuda", "fp32", noise=True, cuda_graphs=True, frame_grid=GRID)); noisy.warmup()
    neager = Engine(w, EngineConfig("cuda", "fp32", noise=True, cuda_graphs=False, bucketed=True, frame_grid=GRID))
    for n in (40, 250):
        ids = ids_of(n); s = voice[n - 1]
        cmp(f"noise graphed twice {n}", noisy.synthesize(ids, s), noisy.synthesize(ids, s))
        cmp(f"noise bucketed-eager twice {n}", neager.synthesize(ids, s), neager.synthesize(ids, s))
        cmp(f"noise graphed vs bucketed-eager {n}", neager.synthesize(ids, s), noisy.synthesize(ids, s))
    for dt in ("bf16",):
        o = Engine(w, EngineConfig("cuda", dt, noise=False, cuda_graphs=True, frame_grid=GRID)); o.warmup()
        for n in (30, 60, 250):
            ids = ids_of(n); s = voice[n - 1]
            cmp(f"{dt} graphed vs fp32 eager {n}", eager.synthesize(ids, s), o.synthesize(ids, s))
        for n in (60, 510):
            ids = ids_of(n); s = voice[n - 1]; o.synthesize(ids, s); torch.cuda.synchronize()
            t = []
            for _ in range(5):
                t0 = time.perf_counter(); o.synthesize(ids, s); t.append(time.perf_counter() - t0)
            print(f"{mode:7s} {dt} graphed {n} phonemes p50 {1000*np.median(t):.1f} ms", flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="CUDA parity of eager, bucketed, graphed and batched runs")
    parser.add_argument("mode", nargs="?", default="default", choices=("default", "notf32", "strict"))
    main(parser.parse_args().mode)
