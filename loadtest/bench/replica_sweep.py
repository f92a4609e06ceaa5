"""How many engine replicas one GPU serves best: `python -m loadtest.bench.replica_sweep`.

The fleet runs one model replica per Uvicorn worker, each a separate process with its own CUDA
context. This measures that shape without HTTP or Redis: `max(--counts)` engine processes are
started once (weights, CUDA-graph capture), then for each N in `--counts` the first N of them loop
over a realistic mix of chunk sizes for `--seconds`, all starting at the same instant, while the
others idle (an idle context takes no GPU time). Per N it reports the aggregate audio-seconds per
second, chunk latency p50 / p95 (and per chunk size), and the GPU's SM use from `nvidia-smi dmon`.
GPU memory per replica is read once every replica has captured its graphs: the device's used
memory (CUDA context included) over the replica count, and torch's own reserved bytes.

`--mps both` runs the sweep twice: plain time-slicing, then under the CUDA MPS daemon, which this
command starts for its run (private pipe and log directories under /tmp) and quits after; it
changes no other GPU setting. MPS lets kernels of several processes run at once on the GPU
instead of taking turns.

On a CPU (`--device cpu --weights tiny`) the same plumbing runs, for a dry run and the tests.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing as mp
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from api.gpu_sharing import Mps

# The chunk sizes a replica sees serving the sample texts: a short first chunk (fast first audio),
# then sentences and paragraphs up to the 510-phoneme limit. Each replica cycles through them from
# its own offset, so at any moment the replicas run different sizes, as in a fleet.
CHUNK_MIX = (30, 60, 120, 250, 400, 510)


def _log(message: str) -> None:
    print(f"replica_sweep: {message}", file=sys.stderr, flush=True)


# --- one replica (a child process) ------------------------------------------------------------------


def _replica(index: int, device: str, dtype: str, weights_source: str, commands, results) -> None:
    """Build an engine, say ready (with its memory), then run each phase it is sent."""
    import torch

    from loadtest.bench.engine_bench import bench_weights, chunk_ids
    from worker.engine import Engine, EngineConfig

    try:
        torch.set_num_threads(1)
        weights = bench_weights(weights_source)
        voice = next(iter(weights.voices.values()))
        started = time.perf_counter()
        engine = Engine(weights, EngineConfig(device, dtype, seed=index))
        engine.warmup()
        chunks = [chunk_ids(weights.config["vocab"], size) for size in CHUNK_MIX]
        ready = {"index": index, "pid": os.getpid(), "build_s": time.perf_counter() - started,
                 "graphs": engine.graphs is not None}
        if engine.device.type == "cuda":
            torch.cuda.synchronize()
            ready["torch_reserved_bytes"] = torch.cuda.memory_reserved()
            ready["torch_allocated_bytes"] = torch.cuda.memory_allocated()
            if engine.graphs is not None:
                ready["capture_s"] = engine.graphs.capture_seconds
        results.put(("ready", ready))
        turn = index
        while True:
            command = commands.get()
            if command[0] == "exit":
                return
            _, phase, start_at, end_at = command
            while time.time() < start_at:
                time.sleep(0.0005)
            done = []  # (size, seconds, audio seconds, finished at)
            while time.time() < end_at:
                size = CHUNK_MIX[turn % len(CHUNK_MIX)]
                turn += 1
                ids = chunks[CHUNK_MIX.index(size)]
                begin = time.perf_counter()
                out = engine.synthesize(ids, voice[len(ids) - 1])
                done.append((size, time.perf_counter() - begin, len(out.audio) / engine.sample_rate, time.time()))
            results.put(("phase", {"index": index, "phase": phase, "chunks": done}))
    except Exception as error:  # the parent reports it; a dead replica must not hang the sweep
        import traceback

        results.put(("error", {"index": index, "error": f"{type(error).__name__}: {error}",
                               "traceback": traceback.format_exc()}))


# --- the GPU around it ----------------------------------------------------------------------------------


def start_mps(stack: contextlib.ExitStack) -> tuple[Mps, str]:
    """The MPS daemon started by production's starter, as `serve` starts it (KOKORO_MPS=auto),
    stopped when `stack` closes, and its log line (why not, when it did not start); the replicas
    spawned meanwhile connect through it (its directories are in the environment)."""
    daemon = Mps("auto")
    said = daemon.ensure()
    stack.callback(_stop_mps, daemon)
    return daemon, said


def _stop_mps(daemon: Mps) -> None:
    if daemon.started:
        daemon.stop()
        time.sleep(1.0)  # the server exits after its clients; give it a moment before the next contexts


class Dmon:
    """`nvidia-smi dmon -s u` sampling once a second in the background: SM and memory-controller
    use per sample; `window(t0, t1)` averages the samples taken in that interval."""

    def __init__(self):
        self.samples: list[tuple[float, int, int]] = []  # (time, sm %, mem %)
        self.process = None
        if shutil.which("nvidia-smi"):
            self.process = subprocess.Popen(["nvidia-smi", "dmon", "-s", "u", "-d", "1"], stdout=subprocess.PIPE,
                                            stderr=subprocess.DEVNULL, text=True, bufsize=1)
            import threading

            threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.process.stdout:
            fields = line.split()
            if not fields or line.startswith("#"):
                continue
            with contextlib.suppress(ValueError, IndexError):
                self.samples.append((time.time(), int(fields[1]), int(fields[2])))

    def window(self, start: float, end: float) -> dict:
        inside = [(sm, mem) for t, sm, mem in self.samples if start + 1.0 <= t <= end + 0.5]
        if not inside:
            return {}
        return {"sm_pct": float(np.mean([s for s, _ in inside])), "mem_pct": float(np.mean([m for _, m in inside])),
                "samples": len(inside)}

    def close(self) -> None:
        if self.process is not None:
            self.process.terminate()
            with contextlib.suppress(Exception):
                self.process.wait(timeout=5)


def gpu_used_mib() -> float | None:
    """The device's used memory as nvidia-smi reports it (every process, contexts included)."""
    if not shutil.which("nvidia-smi"):
        return None
    with contextlib.suppress(Exception):
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=30).stdout
        return float(out.split()[0])
    return None


# --- the sweep ------------------------------------------------------------------------------------------


def summarize_phase(chunks: list[tuple[int, float, float, float]], replicas: int, start: float, end: float) -> dict:
    """Aggregate figures of one phase: chunks that finished inside [start, end] count."""
    inside = [c for c in chunks if start <= c[3] <= end]
    if not inside:
        return {"replicas": replicas, "chunks": 0}
    latencies = np.array([c[1] for c in inside])
    by_size = {}
    for size in CHUNK_MIX:
        own = [c[1] for c in inside if c[0] == size]
        if own:
            by_size[str(size)] = {"p50_ms": 1000 * float(np.percentile(own, 50)),
                                  "p95_ms": 1000 * float(np.percentile(own, 95)), "count": len(own)}
    audio = sum(c[2] for c in inside)
    return {"replicas": replicas, "chunks": len(inside), "seconds": end - start,
            "audio_s_per_s": audio / (end - start), "per_replica_audio_s_per_s": audio / (end - start) / replicas,
            "latency_p50_ms": 1000 * float(np.percentile(latencies, 50)),
            "latency_p95_ms": 1000 * float(np.percentile(latencies, 95)), "by_size": by_size}


def sweep(counts: list[int], seconds: float, device: str, dtype: str, weights: str, mps: bool,
          ready_timeout: float, save=lambda report: None) -> dict:
    """One sweep over `counts` with max(counts) replicas started once; `save(report)` after start-up
    and after every count, so a sweep stopped at its time limit keeps what it measured."""
    context = mp.get_context("spawn")
    results = context.Queue()
    total = max(counts)
    report: dict = {"mps": mps, "device": device, "dtype": dtype, "weights": weights, "chunk_mix": list(CHUNK_MIX),
                    "phases": []}
    with contextlib.ExitStack() as stack:
        if mps:
            daemon, said = start_mps(stack)
            report["mps_active"] = daemon.active
            if not daemon.active:
                report["error"] = f"MPS did not start: {said}"
                return report
        before_mib = gpu_used_mib()
        commands = [context.Queue() for _ in range(total)]
        processes = [context.Process(target=_replica, args=(k, device, dtype, weights, commands[k], results),
                                     daemon=True) for k in range(total)]
        started = time.perf_counter()
        for process in processes:
            process.start()
        stack.callback(stop_replica_processes, processes, commands)
        ready = []
        while len(ready) < total:
            kind, message = next_replica_message(results, processes, started + ready_timeout)
            if kind == "error":
                report["error"] = f"replica {message['index']}: {message['error']}"
                report["traceback"] = message["traceback"]
                return report
            ready.append(message)
            _log(f"replica {message['index']} ready in {message['build_s']:.1f} s "
                 f"(graphs {'captured' if message['graphs'] else 'NOT captured'}); {len(ready)}/{total}")
        report["startup_s"] = time.perf_counter() - started
        report["replicas_ready"] = sorted(ready, key=lambda r: r["index"])
        after_mib = gpu_used_mib()
        if before_mib is not None and after_mib is not None:
            report["gpu_used_mib_before"], report["gpu_used_mib_after"] = before_mib, after_mib
            report["gpu_mib_per_replica"] = (after_mib - before_mib) / total
        reserved = [r.get("torch_reserved_bytes") for r in ready if r.get("torch_reserved_bytes")]
        if reserved:
            report["torch_reserved_mib_per_replica"] = float(np.mean(reserved)) / 2**20
        save(report)
        dmon = Dmon()
        stack.callback(dmon.close)
        time.sleep(1.5)  # dmon's first sample
        for phase, count in enumerate(counts):
            start_at = time.time() + 0.5
            end_at = start_at + seconds
            for k in range(count):
                commands[k].put(("run", phase, start_at, end_at))
            chunks = []
            for _ in range(count):
                kind, message = next_replica_message(results, processes, time.perf_counter() + seconds + 60)
                if kind == "error":
                    report["error"] = f"replica {message['index']}: {message['error']}"
                    return report
                chunks += message["chunks"]
            figures = summarize_phase(chunks, count, start_at, end_at)
            figures.update(dmon.window(start_at, end_at))
            report["phases"].append(figures)
            save(report)
            _log(f"{'MPS' if mps else 'no MPS'}, {count:>2} replicas: {figures.get('audio_s_per_s', 0):8.1f} audio-s/s, "
                 f"chunk p50 {figures.get('latency_p50_ms', 0):.1f} ms p95 {figures.get('latency_p95_ms', 0):.1f} ms, "
                 f"SM {figures.get('sm_pct', float('nan')):.0f}%")
    return report


def next_replica_message(results, processes, deadline: float) -> tuple[str, dict]:
    """The next message from the replicas; an error message if one died silently (a crash in
    CUDA kills a process without a word) or none spoke before the deadline (perf_counter time)."""
    import queue

    while True:
        try:
            return results.get(timeout=1.0)
        except queue.Empty:
            dead = [k for k, p in enumerate(processes) if p.exitcode not in (None, 0)]
            if dead:
                return "error", {"index": dead[0], "error": f"exited with code {processes[dead[0]].exitcode}",
                                 "traceback": ""}
            if time.perf_counter() > deadline:
                return "error", {"index": -1, "error": "no answer before the deadline", "traceback": ""}


def stop_replica_processes(processes, commands) -> None:
    for queue in commands:
        with contextlib.suppress(Exception):
            queue.put(("exit",))
    deadline = time.time() + 20
    for process in processes:
        process.join(timeout=max(0.1, deadline - time.time()))
        if process.is_alive():
            process.kill()


def markdown(reports: list[dict]) -> str:
    """One table over every sweep: a row per (MPS, N)."""
    lines = ["| MPS | replicas | audio-s/s | per replica | chunk p50 ms | chunk p95 ms | 60-phoneme p50 ms | SM % |",
             "|---|---|---|---|---|---|---|---|"]
    notes = []
    for report in reports:
        label = "on" if report["mps"] else "off"
        if report.get("error"):
            notes.append(f"- MPS {label}: {report['error']}")
        for p in report["phases"]:
            if not p.get("chunks"):
                continue
            first = p["by_size"].get("60", {}).get("p50_ms", float("nan"))
            lines.append(f"| {label} | {p['replicas']} | {p['audio_s_per_s']:.0f} | {p['per_replica_audio_s_per_s']:.0f} | "
                         f"{p['latency_p50_ms']:.1f} | {p['latency_p95_ms']:.1f} | {first:.1f} | "
                         f"{p.get('sm_pct', float('nan')):.0f} |")
        if "gpu_mib_per_replica" in report:
            notes.append(f"- MPS {label}: GPU memory per replica {report['gpu_mib_per_replica']:.0f} MiB (device used "
                         f"{report['gpu_used_mib_before']:.0f} -> {report['gpu_used_mib_after']:.0f} MiB over "
                         f"{len(report['replicas_ready'])} replicas), torch reserved "
                         f"{report.get('torch_reserved_mib_per_replica', float('nan')):.0f} MiB; start-up "
                         f"{report.get('startup_s', float('nan')):.0f} s")
    return "\n".join(lines + [""] + notes)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--counts", default="1,2,4,8,12,16", help="replica counts to measure, comma-separated")
    parser.add_argument("--seconds", type=float, default=6.0, help="measured seconds per count")
    parser.add_argument("--mps", default="both", choices=["off", "on", "both"])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--weights", default="random-full", help="random-full on a GPU box; tiny for a CPU dry run")
    parser.add_argument("--ready-timeout", type=float, default=240.0, help="seconds for every replica to be ready")
    parser.add_argument("--json", dest="json_path", default=None)
    args = parser.parse_args(argv)
    counts = sorted({int(c) for c in args.counts.split(",") if c})
    modes = {"off": [False], "on": [True], "both": [False, True]}[args.mps]
    reports = []
    for mps in modes:
        _log(f"sweep {'with' if mps else 'without'} MPS over {counts} replicas")
        finished = list(reports)

        def save(report: dict) -> None:  # the finished sweeps and this one, as far as it got
            if args.json_path:
                Path(args.json_path).write_text(json.dumps(finished + [report], indent=2), encoding="utf-8")

        try:
            report = sweep(counts, args.seconds, args.device, args.dtype, args.weights, mps, args.ready_timeout, save)
        except Exception as error:  # one sweep's failure (a timeout, MPS) must not lose the other's figures
            report = {"mps": mps, "phases": [], "error": f"{type(error).__name__}: {error}"}
        reports.append(report)
        save(report)
    print(markdown(reports))
    return 0 if all(not r.get("error") for r in reports) else 1


if __name__ == "__main__":
    sys.exit(main())
