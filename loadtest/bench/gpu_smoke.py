"""One engine in the serving configuration, first on a lent GPU: `python -m loadtest.bench.gpu_smoke --json FILE`.

Builds the engine `serve` builds (api/speech/build.py: the settings' dtype, compiled passes, CUDA
graphs, stage-2 arithmetic, on the host's compile cache) with batches up to `--max-batch`, warms it
up, and writes FILE after every phase, so a stop at any point leaves what was found:
  compile   seconds, graphs compiled or loaded, dynamo's compiles and every recompile with its
            reason (TORCH_LOGS=recompiles, collected here);
  graphs    single-chunk and batch graphs captured, or why not;
  checks    the graphed replay against the same engine's eager run (graphs set aside: the same
            compiled passes on the same padded shapes), single chunks and a batch; the compiled
            engine against an uncompiled one (durations exact, audio within the precision bound);
  artifacts torch.compiler's cache artifacts (`save_cache_artifacts`) written to `--artifacts-out`
            when this process compiled and they fit 16 MiB, so a later call on the same card and
            torch starts warm (`--artifacts-in`, loaded before the compile).
The GPU harness's later steps take their fallback from FILE (loadtest/bench/gpu_report.py).

`--together N` starts N such engines at once instead, each its own process (the harness's startup
step on the warm cache): per engine compiled or loaded, lock wait, ready time, memory, how it runs;
FILE rewritten as each one is ready.
"""

from __future__ import annotations

import argparse
import json
import logging
import subprocess
import sys
import time
import traceback
from pathlib import Path

from loadtest.bench.compile_artifacts import load_artifacts, save_artifacts
from loadtest.bench.gpu_report import write_json

# The graphed replay against the eager run of the same engine on the same padded shapes: the same
# kernels, so the same audio but for float rounding.
REPLAY_SNR_DB = 60.0
CHECK_PHONEMES = (60, 250)
BATCH_CHECK = 4


def _say(message: str) -> None:
    print(f"gpu_smoke: {message}", file=sys.stderr, flush=True)


class RecompileReasons(logging.Handler):
    """Dynamo's recompile messages (the `recompiles` log artifact), kept as they come."""

    def __init__(self):
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage()[:600])

    def install(self) -> "RecompileReasons":
        import torch._logging

        torch._logging.set_logs(recompiles=True)
        logging.getLogger("torch._dynamo.guards.__recompiles").addHandler(self)
        return self


def serving_settings(args: argparse.Namespace):
    """The settings `serve` reads, with this run's device, weights, batch bound and switches."""
    from api.settings import get_settings
    from worker.compile_cache import default_compile_cache_dir
    from worker.engine import resolve_device

    settings = get_settings().replace(device=args.device, weights=args.weights,
                                      compile=args.compile == "on", cuda_graphs=args.cuda_graphs == "on")
    if args.max_batch:
        settings = settings.replace(batch_max=args.max_batch)
    device = resolve_device(settings.device)
    directory = settings.compile_cache_dir or str(default_compile_cache_dir(device, settings.cache_dir))
    return settings.replace(compile_cache_dir=args.compile_cache_dir or directory)


def serving_engine(weights, settings, compiled: bool | None = None, cuda_graphs: bool | None = None):
    """api/speech/build.py's engine, but compiled when the settings say so on a CPU too (a replica
    compiles on CUDA only; the rehearsal compiles on the CPU to run the same path)."""
    import dataclasses

    from api.speech.build import engine_config_from_settings
    from worker.engine import Engine

    config = engine_config_from_settings(settings)
    return Engine(weights, dataclasses.replace(
        config, compiled=settings.compile if compiled is None else compiled,
        cuda_graphs=settings.cuda_graphs if cuda_graphs is None else cuda_graphs))


def memory(device) -> dict:
    import torch

    if device.type == "cuda":
        return {"reserved_mib": torch.cuda.memory_reserved() / 2**20, "allocated_mib": torch.cuda.memory_allocated() / 2**20}
    import resource

    return {"max_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def smoke(args: argparse.Namespace) -> int:
    """The phases below; an exception in any is written into FILE first (the phase it stopped in and
    its last line: the later steps' fallback says them), then raised."""
    path = Path(args.json)
    report: dict = {"phase": "started", "argv": sys.argv, "started": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    save = lambda: write_json(path, report)  # noqa: E731
    save()
    try:
        return smoke_phases(args, report, save)
    except BaseException as error:
        from loadtest.bench.gpu_report import last_line

        report.update(failed_phase=report["phase"], error=last_line(error))
        save()
        raise


def smoke_phases(args: argparse.Namespace, report: dict, save) -> int:
    started = time.perf_counter()
    import torch

    from loadtest.bench.engine_bench import bench_weights

    settings = serving_settings(args)
    reasons = RecompileReasons().install()
    report["configuration"] = {"device": settings.device, "dtype": settings.dtype, "compile": settings.compile,
                               "cuda_graphs": settings.cuda_graphs, "batch_max": settings.batch_max,
                               "batch_graph_frames": settings.batch_graph_frames, "stage2": settings.stage2_arithmetic,
                               "compile_cache_dir": settings.compile_cache_dir, "weights": settings.weights}
    weights = bench_weights(args.weights)
    report.update(phase="weights", weights_s=round(time.perf_counter() - started, 1))
    save()
    if args.artifacts_in:
        report["artifacts"] = {"loaded_from": load_artifacts(Path(args.artifacts_in), Path(settings.compile_cache_dir))}
        save()
    engine = serving_engine(weights, settings)
    report["phase"] = "warmup"
    save()
    _say(f"warming up the serving engine ({'compiling, ' if engine.compiled else ''}capturing): "
         f"{json.dumps(report['configuration'])}")
    warm_error = None
    try:
        engine.warmup()
    except Exception as error:  # recorded: the later steps fall back
        warm_error = f"{type(error).__name__}: {str(error)[:800]}"
        traceback.print_exc()
    run = engine.run_report()
    report.update(phase="ready", ready_s=round(time.perf_counter() - started, 1), engine=run, memory=memory(engine.device),
                  compile=compile_figures(engine, run, warm_error, reasons), graphs=graph_figures(run))
    if warm_error and report["compile"]["ok"] is not True:
        # the compiled engine did not start: can an uncompiled one capture? (what the later steps run)
        report["error"] = warm_error
        save()
        _say("the compiled engine failed; checking capture on an uncompiled engine")
        del engine
        engine = serving_engine(weights, settings, compiled=False)
        try:
            engine.warmup()
        except Exception as error:
            report["error"] += f"; the uncompiled engine too: {type(error).__name__}: {str(error)[:400]}"
            save()
            return 1
        report["graphs"] = graph_figures(engine.run_report(), note="the uncompiled engine (the compiled one failed)")
    elif warm_error:
        report["error"] = warm_error
    save()
    report["phase"] = "checks"
    report["checks"] = {"rows": []}
    # eager passes on the same padded shapes
    uncompiled = serving_engine(weights, settings, compiled=False, cuda_graphs=False) if engine.compiled else None
    for row in checks(engine, uncompiled, weights):
        report["checks"]["rows"].append(row)
        _say(f"check {row['what']}: {'ok' if row['ok'] else 'FAILED'}: {row['detail']}")
        save()
    report["checks"]["ok"] = all(row["ok"] for row in report["checks"]["rows"])
    report["compile"]["recompile_reasons"] = list(reasons.messages)
    report["engine"] = engine.run_report()
    save()
    if args.artifacts_out:
        report["artifacts"] = {**report.get("artifacts", {}), **save_artifacts(Path(args.artifacts_out), run)}
    report.update(phase="done", seconds=round(time.perf_counter() - started, 1))
    save()
    _say(f"done in {report['seconds']:.0f} s: compile {report['compile'].get('ok')}, graphs "
         f"{ {k: v.get('ok') for k, v in report['graphs'].items()} }, checks {report['checks']['ok']}")
    return 0 if report["checks"]["ok"] and not report.get("error") else 1


def compile_figures(engine, run: dict, error: str | None, reasons: RecompileReasons) -> dict:
    """ok: True once the compile finished (what failed after it, if anything, is the smoke's error),
    False when it failed, None when not wanted or not reached."""
    record = run.get("compile") or {}
    wanted = bool(engine.compiled)
    ok = None
    if wanted and record:
        ok = not record.get("error")
    elif wanted and error:
        ok = False
    return {"wanted": wanted, "ok": ok, **{k: record.get(k) for k in ("loaded", "seconds", "waited_s", "graphs_compiled",
                                                                      "graphs_loaded", "dynamo_compiles", "recompiles")},
            "error": record.get("error") or (error if wanted and not record else None),
            "recompile_reasons": list(reasons.messages)}


def graph_figures(run: dict, note: str | None = None) -> dict:
    out = {}
    for kind, g in (run.get("graphs") or {}).items():
        out[kind] = {"wanted": bool(g.get("wanted")), "captured": g.get("captured", 0), "error": g.get("error"),
                     "ok": bool(g.get("wanted")) and bool(g.get("captured")) and not g.get("error")}
        if note:
            out[kind]["note"] = note
    return out


def checks(engine, uncompiled, weights):
    """Rows of {what, ok, detail, ...}, one at a time (the caller writes each as it comes)."""
    import numpy as np

    from loadtest.bench.engine_bench import batch_chunks, chunk_ids
    from loadtest.bench.gpu_parity import PRECISION_BOUND_DB
    from worker.engine import BatchItem
    from worker.reference import log_spectral_distance_db, snr_db

    vocab = weights.config["vocab"]
    voice = next(iter(weights.voices.values()))
    singles = [chunk_ids(vocab, n) for n in CHECK_PHONEMES]
    batch = [BatchItem(ids, voice[len(ids) - 1]) for ids in batch_chunks(vocab, CHECK_PHONEMES[0], BATCH_CHECK)]

    def compare(a, b) -> dict:
        same_length = len(a.audio) == len(b.audio)
        return {"durations_equal": bool(np.array_equal(a.durations, b.durations)), "same_length": same_length,
                "identical": bool(same_length and np.array_equal(a.audio, b.audio)),
                "snr_db": float(snr_db(a.audio, b.audio)) if same_length else None,
                "lsd_db": float(log_spectral_distance_db(a.audio, b.audio[:len(a.audio)]))}

    def eager_of(engine, fn):
        """`fn` on `engine` with its graphs set aside: the same passes, launched eagerly."""
        graphs, batch_graphs = engine.graphs, engine.batch_graphs
        engine.graphs = engine.batch_graphs = None
        try:
            return fn()
        finally:
            engine.graphs, engine.batch_graphs = graphs, batch_graphs

    if engine.graphs is not None:
        for ids in singles:
            graphed = engine.synthesize(ids, voice[len(ids) - 1])
            eager = eager_of(engine, lambda: engine.synthesize(ids, voice[len(ids) - 1]))
            c = compare(eager, graphed)
            ok = c["durations_equal"] and c["same_length"] and (c["identical"] or c["snr_db"] >= REPLAY_SNR_DB)
            yield {"what": f"graphed vs eager, one chunk of {len(ids)} phonemes", "ok": ok, **c,
                   "detail": f"durations equal {c['durations_equal']}, identical {c['identical']}, SNR "
                             f"{c['snr_db'] if c['snr_db'] is None else round(c['snr_db'], 1)} dB (bound {REPLAY_SNR_DB})"}
    if engine.batch_graphs is not None:
        graphed = engine.synthesize_batch(batch)
        eager = eager_of(engine, lambda: engine.synthesize_batch(batch))
        rows = [compare(e, g) for e, g in zip(eager, graphed)]
        ok = all(r["durations_equal"] and r["same_length"] and (r["identical"] or r["snr_db"] >= REPLAY_SNR_DB)
                 for r in rows)
        worst = min((r["snr_db"] for r in rows if r["snr_db"] is not None), default=None)
        yield {"what": f"graphed vs eager, a batch of {len(batch)}", "ok": ok, "items": rows,
               "detail": f"durations equal {all(r['durations_equal'] for r in rows)}, identical "
                         f"{all(r['identical'] for r in rows)}, worst SNR {worst if worst is None else round(worst, 1)} dB"}
    if uncompiled is not None:
        for ids in singles[:1]:
            a, b = uncompiled.synthesize(ids, voice[len(ids) - 1]), engine.synthesize(ids, voice[len(ids) - 1])
            c = compare(a, b)
            ok = c["durations_equal"] and c["lsd_db"] <= PRECISION_BOUND_DB
            yield {"what": f"compiled vs uncompiled, one chunk of {len(ids)} phonemes", "ok": ok, **c,
                   "detail": f"durations equal {c['durations_equal']}, log-spectral distance {c['lsd_db']:.3f} dB "
                             f"(bound {PRECISION_BOUND_DB})"}
        if engine.max_batch > 1:
            rows = [compare(a, b) for a, b in zip(uncompiled.synthesize_batch(batch), engine.synthesize_batch(batch))]
            ok = all(r["durations_equal"] and r["lsd_db"] <= PRECISION_BOUND_DB for r in rows)
            yield {"what": f"compiled vs uncompiled, a batch of {len(batch)}", "ok": ok, "items": rows,
                   "detail": f"durations equal {all(r['durations_equal'] for r in rows)}, worst log-spectral "
                             f"distance {max(r['lsd_db'] for r in rows):.3f} dB (bound {PRECISION_BOUND_DB})"}


# --- several engines starting together ----------------------------------------------------------------------


def start_one(args: argparse.Namespace) -> int:
    """One serving engine's start (weights, compile or load, capture, warm-up): its figures in
    `--json` as one object."""
    started = time.perf_counter()
    from loadtest.bench.engine_bench import bench_weights

    settings = serving_settings(args)
    weights = bench_weights(args.weights)
    weights_s = time.perf_counter() - started
    engine = serving_engine(weights, settings)
    engine.warmup()
    run = engine.run_report()
    record = run.get("compile") or {}
    write_json(Path(args.json), {
        "loaded": record.get("loaded"), "compile_s": record.get("seconds"), "waited_s": record.get("waited_s"),
        "graphs_compiled": record.get("graphs_compiled"), "graphs_loaded": record.get("graphs_loaded"),
        "weights_s": weights_s, "ready_s": time.perf_counter() - started, **memory(engine.device), "engine": run})
    return 0


def together(args: argparse.Namespace) -> int:
    """`--together` engine processes started at once; `--json` rewritten as each is ready."""
    path = Path(args.json)
    work = path.with_name(path.stem + "-engines")
    work.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "loadtest.bench.gpu_smoke", "--one", "--device", args.device, "--weights",
               args.weights, "--max-batch", str(args.max_batch), "--compile", args.compile, "--cuda-graphs",
               args.cuda_graphs, *(["--compile-cache-dir", args.compile_cache_dir] if args.compile_cache_dir else [])]
    start = time.perf_counter()
    processes = [subprocess.Popen(command + ["--json", str(work / f"{k}.json")]) for k in range(args.together)]
    report = {"workers": args.together, "together": [None] * args.together,
              "configuration": {k: v for k, v in vars(args).items() if k not in ("json", "one", "together")}}
    while True:
        for k, process in enumerate(processes):
            if report["together"][k] is None and process.poll() is not None:
                figures = json.loads((work / f"{k}.json").read_text()) if (work / f"{k}.json").exists() else None
                report["together"][k] = figures or {"error": f"exited with {process.returncode} before it was ready"}
                write_json(path, report)
        if all(p.poll() is not None for p in processes):
            break
        time.sleep(0.2)
    report["all_ready_s"] = time.perf_counter() - start
    write_json(path, report)
    failed = [k for k, r in enumerate(report["together"]) if r.get("error")]
    _say(f"{args.together} engines together: all done after {report['all_ready_s']:.1f} s; "
         + (f"FAILED: {failed}" if failed else "all ready"))
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", required=True, help="where the figures go (rewritten after every phase)")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--weights", default="random-full", help="random-full on a GPU box; tiny on a CPU")
    parser.add_argument("--max-batch", type=int, default=0,
                        help="KOKORO_BATCH_MAX: the batch family and graphs (0: serve's own, from the environment)")
    parser.add_argument("--compile", default="on", choices=["on", "off"], help="KOKORO_COMPILE")
    parser.add_argument("--cuda-graphs", default="on", choices=["on", "off"], help="KOKORO_CUDA_GRAPHS")
    parser.add_argument("--compile-cache-dir", default="", help="KOKORO_COMPILE_CACHE_DIR (default: the host's)")
    parser.add_argument("--artifacts-out", default="", help="write torch.compiler's cache artifacts here")
    parser.add_argument("--artifacts-in", default="", help="load torch.compiler cache artifacts first: a file, or "
                        "a folder's compile-artifacts-*.bin")
    parser.add_argument("--together", type=int, default=0, help="start this many engines together instead")
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    if args.one:
        return start_one(args)
    if args.together:
        return together(args)
    return smoke(args)


if __name__ == "__main__":
    sys.exit(main())
