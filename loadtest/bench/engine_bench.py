"""`python -m loadtest.bench`: our engine against the reference KModel, same run, same inputs, same threads.

For chunks of about 30, 100, 250 and 500 phonemes it runs, interleaved (so load from other
processes hits every contender alike): the reference KModel (CPU runs; float32, noise as shipped),
onnxruntime on the int8 ONNX export that the offline bundle is converted from (what kokoro-onnx
runs; CPU runs of the offline weights), and our engine in each requested mode, all on the same
phoneme ids, style row and thread count; then prints the CPU model and the instruction-set flags
that decide our modes, audio-seconds per wall-second, per-chunk latency p50 / p95, and each
mode's speed over the reference's and over onnxruntime's. On CUDA it compares eager against
CUDA-graphed and reports peak memory per replica. `--json PATH` writes every figure.

`--batch 1,2,4,8,16` measures the batched forward pass instead (Engine.synthesize_batch): per batch
size B, B chunks of about `--batch-phonemes` phonemes each (different text, lengths within ~15%, as
the fleet groups jobs by size), run as one eager batch, as one batch of the served engine (on CUDA
by default compiled and CUDA-graphed; `--compiled`, `--cuda-graphs`, `--batch-graphs` switch each
off) and one by one, interleaved in the same run; it prints audio-s/s, the latency of the batch,
the best batch's speed-up over one by one, and how each engine ran (its `run_report()`: card,
torch, compiled or loaded, graphs captured and replayed). `--lone 60` adds a lone 60-phoneme chunk's
p50 on the served engine; several `--stage2` modes time the eager batch in each, against the
first's one-by-one audio. `--json` is rewritten after every batch size.

`--isa avx2` emulates a CPU without AVX-512 for our engine: the bench re-runs itself with the
variables of `worker.cpu_features.ISA_CAPS` set (oneDNN, ATen, torch.compile's kernels and MKL stop
at AVX2; `auto` sees no AVX-512 flags). onnxruntime has no such switch and keeps AVX-512, so the
comparison is conservative: on a real AVX2-only CPU onnxruntime loses its wider vectors too.

`--weights random-full` builds the full-size model with random weights whose durations and F0
behave like speech (worker.model.random_init): for a GPU box where the real weights cannot travel.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import types
from pathlib import Path

import numpy as np
import torch

from worker.audio import SAMPLE_RATE
from worker.cpu_runtime import _KEEP_FREED

# Phonemes of ordinary English (misaki's set), cut to the chunk sizes: real ids and a real rhythm
# of words and punctuation, without needing the text frontend.
PASSAGE = (
    "ðə nˈɔɹθ wˈɪnd ænd ðə sˈʌn wɜɹ dɪspjˈuɾɪŋ wˈɪʧ wʌz ðə stɹˈɔŋɡɚ, wˌɛn ɐ tɹˈævəlɚ kˈeɪm ɐlˈɔŋ ɹˈæpt ɪn ɐ "
    "wˈɔɹm klˈoʊk. ðeɪ ɐɡɹˈiːd ðæt ðə wˈʌn hˌuː fˈɜːst səksˈidᵊd ɪn mˈeɪkɪŋ ðə tɹˈævəlɚ tˈeɪk hɪz klˈoʊk ˈɔf "
    "ʃʊd bi kənsˈɪdɚd stɹˈɔŋɡɚ ðɐn ðə ˈʌðɚ. ðˈɛn ðə nˈɔɹθ wˈɪnd blˈuː æz hˈɑɹd æz hi kʊd, bˌʌt ðə mˈɔɹ hi "
    "blˈuː ðə mˈɔɹ klˈoʊsli dɪd ðə tɹˈævəlɚ fˈoʊld hɪz klˈoʊk ɐɹˈaʊnd hˌɪm; ænd æt lˈæst ðə nˈɔɹθ wˈɪnd ɡˈeɪv "
    "ˈʌp ðɪ ɐtˈɛmpt. ðˈɛn ðə sˈʌn ʃˈɔn ˈaʊt wˈɔɹmli, ænd ɪmˈiːdiətli ðə tɹˈævəlɚ tʊk ˈɔf hɪz klˈoʊk. ænd sˌoʊ "
    "ðə nˈɔɹθ wˈɪnd wʌz ɐblˈiːʤd tə kənfˈɛs ðæt ðə sˈʌn wʌz ðə stɹˈɔŋɡɚ ʌv ðə tˈuː. "
)


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--weights", default="offline", choices=["offline", "tiny", "random-full", "official"],
                        help="weight source (random-full: full size, random, speech-like durations)")
    parser.add_argument("--sizes", default="30,100,250,500", help="phonemes per chunk, comma-separated")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per size and contender")
    parser.add_argument("--modes", default="auto,fp32",
                        help="our engine's dtypes to time (auto, fp32, bf16, fp16, int8; auto shows what it picked)")
    parser.add_argument("--device", default="auto", help="auto, cpu or cuda")
    parser.add_argument("--threads", type=int, default=0, help="torch threads for everyone (0: torch's default)")
    parser.add_argument("--no-reference", action="store_true", help="skip the reference KModel")
    parser.add_argument("--no-onnxruntime", action="store_true", help="skip onnxruntime on the int8 ONNX")
    parser.add_argument("--no-fused", action="store_true", help="CPU: eager elementwise kernels instead of compiled")
    parser.add_argument("--isa", default="native", choices=["native", "avx2"],
                        help="avx2: emulate a CPU without AVX-512 for our engine (re-runs with the variables set)")
    parser.add_argument("--voice", default="af_heart")
    parser.add_argument("--json", dest="json_path", default=None, help="write the figures here")
    parser.add_argument("--batch", default=None,
                        help="batch sizes, comma-separated (e.g. 1,2,4,8,16): time the batched forward pass "
                             "against the same chunks one by one, with the first of --modes")
    parser.add_argument("--batch-phonemes", type=int, default=100, help="--batch: phonemes per chunk (about)")
    parser.add_argument("--compiled", default="auto", choices=["auto", "on", "off"],
                        help="--batch: the served engine compiled (CUDA: and CUDA-graphed batches); auto: on CUDA "
                             "only. One chunk at a time: the graphed engines compiled (auto: the served dtype's only)")
    parser.add_argument("--stage2", default="exact",
                        help="--batch: stage 2's arithmetic (CUDA: exact, exact-nondeterministic, fast = TF32 and "
                             "cudnn.benchmark); several, comma-separated: the eager batch in each, against the "
                             "first's one by one (the served engine runs the first)")
    parser.add_argument("--cuda-graphs", default="on", choices=["on", "off"], help="CUDA: capture CUDA graphs")
    parser.add_argument("--batch-graphs", default="auto", choices=["auto", "on", "off"],
                        help="--batch, CUDA: the batch graphs (auto: as --cuda-graphs)")
    parser.add_argument("--compile-cache-dir", default="", help="the compiled passes' cache (default: the host's)")
    parser.add_argument("--lone", type=int, default=0,
                        help="--batch: also time a lone chunk of this many phonemes on the served engine (p50, p95)")
    parser.add_argument("--lone-runs", type=int, default=20, help="--lone: timed runs")
    parser.add_argument("--artifacts-out", default="", help="--batch: torch.compiler's cache artifacts of the served "
                        "engine's compile, when it compiled and they fit 16 MiB (a later run on the same card loads them)")
    parser.add_argument("--batch-graph-frames", type=int, default=0,
                        help="--batch: the batch graphs' memory bound, batch x frames (0: the engine's default)")


def _progress(message: str) -> None:
    print(f"bench: {message}", file=sys.stderr, flush=True)


def bench_weights(source: str):
    from api.settings import get_settings
    from api.settings import weights_source
    from worker.weights import load_weights

    return load_weights(weights_source(get_settings().replace(weights=source)))


def chunk_ids(vocab: dict, size: int) -> list[int]:
    ids = [vocab[p] for p in PASSAGE if p in vocab]
    while len(ids) < size:
        ids = ids + ids
    return ids[:size]


def summarize(times: list[float], cpu_times: list[float], audio_seconds: list[float]) -> dict:
    """Wall-clock figures, plus process CPU seconds (less disturbed by other processes on a shared box)."""
    return {"runs": len(times), "audio_s_per_s": float(sum(audio_seconds) / sum(times)),
            "p50_s": float(np.percentile(times, 50)), "p95_s": float(np.percentile(times, 95)),
            "audio_s": float(np.mean(audio_seconds)),
            "audio_s_per_cpu_s": float(sum(audio_seconds) / max(sum(cpu_times), 1e-9))}


ONNXRUNTIME = "onnxruntime-int8"


def onnxruntime_contender(weights, voice, threads: int):
    """kokoro-onnx's way of running Kokoro-82M: onnxruntime on the int8 ONNX file, `threads` intra-op
    threads, one inference at a time. None (with the reason printed) where it cannot run."""
    onnx_path = (weights.info or {}).get("onnx_path")
    if not onnx_path:
        _progress(f"no onnxruntime contender: the {weights.source} weights have no ONNX file (use --weights offline)")
        return None
    try:
        import onnxruntime
    except ImportError:
        _progress("no onnxruntime contender: `pip install onnxruntime` (the dev extra has it)")
        return None
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    session = onnxruntime.InferenceSession(onnx_path, options, providers=["CPUExecutionProvider"])
    speed = np.ones(1, dtype=np.float32)

    def run_onnxruntime(ids):
        audio = session.run(None, {"tokens": np.array([[0, *ids, 0]], dtype=np.int64),
                                   "style": voice[len(ids) - 1][None].numpy().astype(np.float32), "speed": speed})[0]
        return types.SimpleNamespace(audio=audio)

    return run_onnxruntime


def batch_chunks(vocab: dict, size: int, count: int) -> list[list[int]]:
    """`count` chunks of the passage at different offsets, lengths size, 0.95 size, 0.9 size, 0.85 size, ..."""
    ids = chunk_ids(vocab, 4 * size + 64 * count)
    chunks = []
    for k in range(count):
        n = max(1, size - (k % 4) * size // 20)
        start = (37 * k) % (len(ids) - n)
        chunks.append(ids[start:start + n])
    return chunks


def run_batches(args: argparse.Namespace, weights, voice, device: torch.device, fused: bool) -> int:
    """Per batch size: the batch eagerly, the batch on the served engine (compiled, and on CUDA
    captured as graphs, unless switched off) and the same chunks one by one, alternating within each
    repeat so other processes' load hits all alike; with several `--stage2` modes, the eager batch in
    each, against the one-by-one results. `--json` is rewritten after every batch size. With a served
    engine to build, the eager batches and one by one are measured and written first (`eager_first`),
    before anything compiles."""
    from worker.engine import BatchItem, Engine, EngineConfig

    mode = [m for m in args.modes.split(",") if m][0]
    sizes = [int(b) for b in args.batch.split(",") if b]
    arithmetic = [m for m in args.stage2.split(",") if m]
    compiled = args.compiled == "on" or (args.compiled == "auto" and device.type == "cuda")
    graphs = device.type == "cuda" and args.cuda_graphs == "on"
    batch_graphs = None if args.batch_graphs == "auto" else args.batch_graphs == "on"
    cache = {"compile_cache_dir": args.compile_cache_dir} if args.compile_cache_dir else {}
    _progress(f"building ours-{mode}, eager" + (" (compiling fused kernels: first time ~30 s)" if fused else ""))
    eager = {m: Engine(weights, EngineConfig(str(device), mode, cuda_graphs=False, fused_kernels=fused, compiled=False, stage2=m))
             for m in arithmetic}
    for engine in eager.values():
        engine.warmup()
    served = eager[arithmetic[0]]
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    results: dict[str, dict] = {}
    figures_out: dict = {"meta": batch_meta(args, device, mode, served, eager, False, False), "batch": results}

    def write() -> None:
        if args.json_path:
            figures_out["meta"]["engines"] = {"eager": next(iter(eager.values())).run_report(),
                                              "served": served.run_report()}
            tmp = f"{args.json_path}.tmp"
            with open(tmp, "w", encoding="utf-8") as f:
                json.dump(figures_out, f, indent=2, default=str)
            os.replace(tmp, args.json_path)

    def timed(fn) -> tuple[float, float, list]:
        sync()
        start, cpu_start = time.perf_counter(), time.process_time()
        out = fn()
        sync()
        return time.perf_counter() - start, time.process_time() - cpu_start, out

    def measure(size: int, single) -> dict:
        """The eager batch (each arithmetic), the served engine's batch (once built) and the same
        chunks one by one on `single`, alternating within each repeat."""
        chunks = batch_chunks(weights.config["vocab"], args.batch_phonemes, size)
        items = [BatchItem(ids, voice[len(ids) - 1]) for ids in chunks]
        contenders = {"batched": lambda: eager[arithmetic[0]].synthesize_batch(items)}  # noqa: E731
        contenders.update({f"batched-{m}": (lambda e: lambda: e.synthesize_batch(items))(e)
                           for m, e in eager.items() if m != arithmetic[0]})
        if served is not eager[arithmetic[0]]:
            contenders["served"] = lambda: served.synthesize_batch(items)  # noqa: E731
        contenders["one_by_one"] = lambda: [single.synthesize(i.ids, i.style, i.speed) for i in items]  # noqa: E731
        outputs = {name: fn() for name, fn in contenders.items()}  # untimed: shape-specific caches
        figures = {name: ([], []) for name in contenders}
        audio_s = 0.0
        for rep in range(args.repeats):
            order = list(contenders.items())
            for name, fn in order if rep % 2 == 0 else order[::-1]:
                _progress(f"batch {size}, run {rep + 1}/{args.repeats}: {name}")
                wall, cpu, out = timed(fn)
                figures[name][0].append(wall)
                figures[name][1].append(cpu)
                audio_s = sum(len(r.audio) for r in out) / SAMPLE_RATE
        by = {name: {"audio_s_per_s": audio_s * len(w) / sum(w), "latency_p50_s": float(np.percentile(w, 50)),
                     "audio_s_per_cpu_s": audio_s * len(c) / max(sum(c), 1e-9)}
              for name, (w, c) in figures.items()}
        best = by.get("served", by["batched"])
        row = {"chunks": len(items), "phonemes": [len(c) for c in chunks], "audio_s": audio_s,
               **{k: v for k, v in by.items() if not k.startswith("batched-")},
               "speedup": best["audio_s_per_s"] / by["one_by_one"]["audio_s_per_s"],
               "speedup_cpu": best["audio_s_per_cpu_s"] / by["one_by_one"]["audio_s_per_cpu_s"]}
        if len(arithmetic) > 1:  # each mode's eager batch against the first mode's single runs
            row["arithmetic"] = {m: {**by["batched" if m == arithmetic[0] else f"batched-{m}"],
                                     **parity(outputs["one_by_one"], outputs["batched" if m == arithmetic[0] else f"batched-{m}"])}
                                 for m in arithmetic}
        return row

    write()
    if compiled or graphs:
        # the eager figures first, kept apart: a compile that overruns the step's limit must not lose them
        eager_first = figures_out["eager_first"] = {}
        for size in sizes:
            eager_first[str(size)] = results[str(size)] = measure(size, eager[arithmetic[0]])
            write()
        _progress(f"building ours-{mode}, " + ("compiled" if compiled else "not compiled")
                  + (", CUDA-graphed" if graphs else "") + " (a compile per shape family on a cold cache)")
        options = {"batch_graph_frames": args.batch_graph_frames} if args.batch_graph_frames else {}
        served = Engine(weights, EngineConfig(str(device), mode, cuda_graphs=graphs, batch_graphs=batch_graphs,
                                              compiled=compiled, max_batch=max(sizes), stage2=arithmetic[0],
                                              **options, **cache))
        start = time.perf_counter()
        served.warmup()
        record = served.compile_record
        _progress(f"served engine ready in {time.perf_counter() - start:.1f} s"
                  + (f": {record.describe()}" if record else ""))
        if args.artifacts_out:
            from loadtest.bench.compile_artifacts import save_artifacts

            _progress(f"compile cache artifacts: {save_artifacts(Path(args.artifacts_out), served.run_report())}")
        figures_out["meta"] = batch_meta(args, device, mode, served, eager, compiled, graphs)
    # one by one as a replica serves single chunks: the served engine on CUDA, eagerly on the CPU
    single = served if device.type == "cuda" else eager[arithmetic[0]]
    for size in sizes:
        results[str(size)] = measure(size, single)
        write()
    if args.lone:
        figures_out["lone"] = lone_chunk(single, weights, voice, args.lone, sync, args.lone_runs)
        write()
    print_batches(args, device, mode, results, figures_out.get("lone"), served, compiled, graphs)
    return 0


def batch_meta(args, device, mode, served, eager, compiled, graphs) -> dict:
    from worker.cpu_features import cpu_info
    from worker.engine import resolve_dtype

    record = served.compile_record
    meta = {"weights": args.weights, "device": str(device), "dtype": resolve_dtype(mode, device),
            "threads": torch.get_num_threads(), "cpu": cpu_info().model,
            "gpu": torch.cuda.get_device_name() if device.type == "cuda" else None,
            "torch": torch.__version__, "repeats": args.repeats, "batch_phonemes": args.batch_phonemes,
            "stage2": args.stage2, "served": ("compiled" if compiled else "eager") + ("+graphs" if graphs else ""),
            "compiled": None if record is None else {**record.as_dict()}}
    if served.batch_graphs is not None:
        bg = served.batch_graphs
        meta["compiled"] = {**(meta["compiled"] or {}), "batch_graphs": {
            "count": len(bg.graphs), "batch_buckets": bg.batch_buckets, "capture_s": bg.capture_seconds,
            "mib": bg.graph_bytes / 2**20, "reserved_mib": bg.reserved_bytes / 2**20}}
    return meta


def parity(reference: list, other: list) -> dict:
    """Items of a batch against the same chunks' single runs: durations, worst log-spectral distance."""
    from worker.reference import log_spectral_distance_db

    return {"durations_equal": all(np.array_equal(a.durations, b.durations) for a, b in zip(reference, other)),
            "lsd_db": max(float(log_spectral_distance_db(a.audio, b.audio[:len(a.audio)]))
                          for a, b in zip(reference, other))}


def lone_chunk(engine, weights, voice, phonemes: int, sync, runs: int = 20) -> dict:
    """A single chunk of `phonemes` on an otherwise idle engine: p50 and p95 of `runs`, after two."""
    ids = chunk_ids(weights.config["vocab"], phonemes)
    for _ in range(2):
        out = engine.synthesize(ids, voice[len(ids) - 1])
    times = []
    for _ in range(runs):
        sync()
        start = time.perf_counter()
        engine.synthesize(ids, voice[len(ids) - 1])
        sync()
        times.append(time.perf_counter() - start)
    _progress(f"a lone {phonemes}-phoneme chunk: p50 {1000 * np.percentile(times, 50):.1f} ms")
    return {"phonemes": phonemes, "runs": runs, "audio_s": len(out.audio) / SAMPLE_RATE,
            "p50_s": float(np.percentile(times, 50)), "p95_s": float(np.percentile(times, 95))}


def print_batches(args, device, mode, results, lone, served, compiled, graphs) -> None:
    from worker.cpu_features import cpu_info
    from worker.engine import resolve_dtype

    cpu = cpu_info()
    card = torch.cuda.get_device_name() if device.type == "cuda" else None
    served_name = ("compiled" if compiled else "eager") + ("+graphs" if graphs else "")
    has_served = "served" in next(iter(results.values()), {})
    lines = [f"python -m loadtest.bench --batch: weights={args.weights} device={device} dtype={resolve_dtype(mode, device)} "
             f"threads={torch.get_num_threads()} torch={torch.__version__} repeats={args.repeats} stage2={args.stage2}",
             f"cpu: {cpu.summary()}" + (f"  gpu: {card}" if card else ""),
             *([f"isa: {isa_in_use()}"] if device.type == "cpu" else []),  # the CPU kernels' (a probe compile)
             f"chunks of about {args.batch_phonemes} phonemes; eager = synthesize_batch without compile or graphs; "
             + (f"{served_name} = synthesize_batch of the served engine; " if has_served else "")
             + f"one by one = the same chunks, synthesize() each on the {'served' if device.type == 'cuda' else 'eager'} engine",
             f"{'batch':>5} {'audio s':>8} {'eager audio s/s':>16}"
             + (f" {served_name + ' audio s/s':>26} {served_name + ' p50 s':>21}" if has_served else f" {'batch p50 s':>12}")
             + f" {'1-by-1 audio s/s':>17} {'speed-up':>9} {'audio s/cpu s':>14} {'speed-up cpu':>13}"]
    best, best_size = 0.0, None
    for size, r in results.items():
        b = r.get("served", r["batched"])
        row = f"{size:>5} {r['audio_s']:>8.1f} {r['batched']['audio_s_per_s']:>16.2f}"
        row += (f" {b['audio_s_per_s']:>26.2f} {b['latency_p50_s']:>21.3f}" if has_served else
                f" {b['latency_p50_s']:>12.2f}")
        lines.append(row + f" {r['one_by_one']['audio_s_per_s']:>17.2f} {r['speedup']:>8.2f}x "
                           f"{b['audio_s_per_cpu_s']:>14.2f} {r['speedup_cpu']:>12.2f}x")
        for m, a in (r.get("arithmetic") or {}).items():
            lines.append(f"{'':>5} stage 2 {m:<24} eager {a['audio_s_per_s']:>10.2f} audio s/s, p50 "
                         f"{a['latency_p50_s']:.3f} s, against one by one: durations equal {a['durations_equal']}, "
                         f"log-spectral distance {a['lsd_db']:.3f} dB")
        if b["audio_s_per_s"] > best:
            best, best_size = b["audio_s_per_s"], size
    lines.append(f"highest batched throughput at batch {best_size} ({best:.2f} audio-s/s)")
    if lone:
        lines.append(f"a lone {lone['phonemes']}-phoneme chunk: p50 {1000 * lone['p50_s']:.1f} ms, "
                     f"p95 {1000 * lone['p95_s']:.1f} ms over {lone['runs']} runs")
    report = served.run_report()
    lines.append(f"served engine: {report['dtype']} on {report['card']}, compiled {report['compiled']}, stage 2 "
                 f"{report['stage2']}, graphs {report['graphs']}")
    if served.compile_record is not None:
        lines.append(served.compile_record.describe())
    print("\n".join(lines))


def emulate_isa(isa: str) -> None:
    """Re-run this command with the ISA caps of `isa` in the environment (they must be set before
    oneDNN and ATen pick their kernels, i.e. at start-up); returns at once when they are set."""
    from worker.cpu_features import ISA_CAPS

    caps = ISA_CAPS.get(isa, {})
    if all(os.environ.get(k) == v for k, v in caps.items()):
        return  # already re-run (or the caller set them)
    from torch._inductor.runtime.runtime_utils import default_cache_dir

    # torch.compile's cache must not mix kernels generated for two ISAs (see cpu_runtime.use_compile_cache)
    cache = os.environ.get("TORCHINDUCTOR_CACHE_DIR") or default_cache_dir()
    caps = {**caps, "TORCHINDUCTOR_CACHE_DIR": os.path.join(cache, f"isa-{isa}")}
    _progress(f"re-running with {' '.join(f'{k}={v}' for k, v in caps.items())}")
    sys.stdout.flush()
    os.execve(sys.executable, sys.orig_argv, {**os.environ, **caps})


def isa_in_use() -> str:
    """What each library dispatches to here: ATen's kernels, torch.compile's C++ kernels, oneDNN's cap."""
    from worker.cpu_features import isa_cap
    from worker.cpu_runtime import vector_isa

    # torch finds inductor's by compiling a probe (minutes on a cold cache and 2 busy cores): not when
    # TORCH_COMPILE_OVERRIDE_BACKENDS keeps inductor from generating any kernel
    inductor = "not used (TORCH_COMPILE_OVERRIDE_BACKENDS)" if os.environ.get("TORCH_COMPILE_OVERRIDE_BACKENDS") \
        else vector_isa()
    return f"aten={torch.backends.cpu.get_cpu_capability()} inductor={inductor} onednn={isa_cap() or 'native'}"


def run(args: argparse.Namespace) -> int:
    from worker.engine import Engine, EngineConfig, resolve_device, resolve_dtype

    if args.isa != "native":
        emulate_isa(args.isa)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = resolve_device(args.device)
    if args.batch:
        _progress(f"loading weights ({args.weights})")
        weights = bench_weights(args.weights)
        voice = weights.voices.get(args.voice, next(iter(weights.voices.values())))
        return run_batches(args, weights, voice, device, device.type == "cpu" and not args.no_fused)
    sizes = [int(s) for s in args.sizes.split(",") if s]
    _progress(f"loading weights ({args.weights})")
    weights = bench_weights(args.weights)
    voice = weights.voices.get(args.voice, next(iter(weights.voices.values())))
    fused = device.type == "cpu" and not args.no_fused

    contenders: dict[str, callable] = {}
    engines: dict[str, Engine] = {}
    for mode in [m for m in args.modes.split(",") if m]:
        variants = [("eager", False), ("graphs", True)] if device.type == "cuda" else [("", False)]
        for suffix, graphs in variants:
            resolved = resolve_dtype(mode, device)
            name = f"ours-{mode}" + (f"={resolved}" if resolved != mode else "") + (f"-{suffix}" if suffix else "")
            _progress(f"building {name}" + (" (compiling fused kernels: first time ~30 s)" if fused else ""))
            if device.type == "cuda":
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
                baseline = torch.cuda.memory_allocated()
            # graphed: the serving path, compiled for the dtype a replica serves (auto's) only: a compile
            # per dtype would cost minutes for figures the served dtype's already give
            serving = resolved == resolve_dtype("auto", device)
            engine = Engine(weights, EngineConfig(str(device), mode, cuda_graphs=graphs, fused_kernels=fused,
                            compiled=graphs and (args.compiled == "on" or (args.compiled == "auto" and serving)),
                            **({"compile_cache_dir": args.compile_cache_dir} if args.compile_cache_dir else {})))
            engine.warmup()
            engines[name] = engine
            contenders[name] = (lambda e: (lambda ids: e.synthesize(ids, voice[len(ids) - 1])))(engine)
            if device.type == "cuda":  # this replica's own memory: weights, graphs, activations
                engine.static_bytes = torch.cuda.memory_allocated() - baseline
                engine.peak_bytes = torch.cuda.max_memory_allocated() - baseline
    if not args.no_reference and "decoder_dim" in weights.config:
        # The reference KModel hard-codes the decoder's 1024 channels: it cannot build the tiny config.
        _progress(f"no reference: it cannot build the {weights.source} config (decoder_dim "
                  f"{weights.config['decoder_dim']}); comparing our modes only")
    elif not args.no_reference:
        from worker.reference import build_reference

        _progress("building the reference KModel")
        reference = build_reference(weights.config, weights.state_dict).to(device)

        def run_reference(ids):
            with torch.no_grad():
                audio, _ = reference.forward_with_tokens(torch.tensor([[0, *ids, 0]], device=device),
                                                         voice[len(ids) - 1][None].to(device), 1.0)
            return types.SimpleNamespace(audio=audio.cpu().numpy())

        contenders = {"reference": run_reference, **contenders}
    if not args.no_onnxruntime and device.type == "cpu":
        _progress("building onnxruntime on the int8 ONNX")
        run_onnxruntime = onnxruntime_contender(weights, voice, torch.get_num_threads())
        if run_onnxruntime is not None:
            contenders = {ONNXRUNTIME: run_onnxruntime, **contenders}

    results: dict[str, dict[str, dict]] = {}
    for size in sizes:
        ids = chunk_ids(weights.config["vocab"], size)
        times = {name: [] for name in contenders}
        cpu_times = {name: [] for name in contenders}
        audio = {name: [] for name in contenders}
        for name, fn in contenders.items():  # one untimed run each (shape-specific caches)
            fn(ids)

        for rep in range(args.repeats):
            for name, fn in contenders.items():
                _progress(f"{size} phonemes, run {rep + 1}/{args.repeats}: {name}")
                if device.type == "cuda":
                    torch.cuda.synchronize()
                    torch.cuda.reset_peak_memory_stats()
                    before = torch.cuda.memory_allocated()
                start, cpu_start = time.perf_counter(), time.process_time()
                out = fn(ids)
                times[name].append(time.perf_counter() - start)
                cpu_times[name].append(time.process_time() - cpu_start)
                if device.type == "cuda" and name in engines:
                    engine = engines[name]
                    engine.peak_bytes = max(engine.peak_bytes,
                                            engine.static_bytes + torch.cuda.max_memory_allocated() - before)
                audio[name].append(len(out.audio) / SAMPLE_RATE)
        results[str(size)] = {name: summarize(times[name], cpu_times[name], audio[name]) for name in contenders}

    from worker.cpu_features import REPORTED_FLAGS, cpu_info

    cpu = cpu_info()
    lines = [f"python -m loadtest.bench: weights={args.weights} device={device} threads={torch.get_num_threads()} "
             f"fused={fused} torch={torch.__version__}",
             f"cpu: {cpu.summary()}",
             f"isa: {isa_in_use()} (onnxruntime: its own choice, native)",
             *(["malloc: keeps freed memory for every contender here (process-wide, set by the int8 engine; "
                "a bf16 or fp32 server runs with glibc's default)"] if _KEEP_FREED["applied"] else []),
             f"{'phonemes':>8} {'contender':<22} {'audio s/s':>10} {'p50 s':>8} {'p95 s':>8} {'audio s':>8} {'vs ref':>7}"
             f" {'vs onnxrt':>9} {'audio s/cpu s':>14} {'vs ref':>7}"]
    for size, by_name in results.items():
        ref, onnxrt = by_name.get("reference"), by_name.get(ONNXRUNTIME)
        for name, r in by_name.items():
            ratio = cpu_ratio = onnx_ratio = "-"
            if ref:
                r["vs_reference"] = r["audio_s_per_s"] / ref["audio_s_per_s"]
                r["vs_reference_cpu"] = r["audio_s_per_cpu_s"] / ref["audio_s_per_cpu_s"]
                ratio, cpu_ratio = f"{r['vs_reference']:.2f}x", f"{r['vs_reference_cpu']:.2f}x"
            if onnxrt:
                r["vs_onnxruntime"] = r["audio_s_per_s"] / onnxrt["audio_s_per_s"]
                onnx_ratio = f"{r['vs_onnxruntime']:.2f}x"
            lines.append(f"{size:>8} {name:<22} {r['audio_s_per_s']:>10.2f} {r['p50_s']:>8.3f} {r['p95_s']:>8.3f} "
                         f"{r['audio_s']:>8.2f} {ratio:>7} {onnx_ratio:>9} {r['audio_s_per_cpu_s']:>14.2f} {cpu_ratio:>7}")
    if device.type == "cuda":
        for name, engine in engines.items():
            graphs = engine.graphs
            lines.append(f"{name}: peak memory {engine.peak_bytes / 2**20:.0f} MiB"
                         + (f", graphs {graphs.graph_bytes / 2**20:.0f} MiB captured in {graphs.capture_seconds:.1f} s"
                            if graphs else ""))
    print("\n".join(lines))
    if args.json_path:
        meta = {"weights": args.weights, "device": str(device), "threads": torch.get_num_threads(),
                "cpu": cpu.model, "cpu_flags": [f for f in cpu.flags if f in REPORTED_FLAGS], "isa": isa_in_use(),
                "fused_kernels": fused, "torch": torch.__version__, "repeats": args.repeats}
        if device.type == "cuda":
            meta["gpu"] = torch.cuda.get_device_name()
            meta["peak_memory_bytes"] = {n: e.peak_bytes for n, e in engines.items()}
            meta["graph_capture"] = {n: {"seconds": e.graphs.capture_seconds, "bytes": e.graphs.graph_bytes}
                                     for n, e in engines.items() if e.graphs}
        with open(args.json_path, "w", encoding="utf-8") as f:
            json.dump({"meta": meta, "results": results}, f, indent=2)
    return 0
