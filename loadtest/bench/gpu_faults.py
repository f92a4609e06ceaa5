"""GPU faults (issue 41, item 5): `python -m loadtest.bench.gpu_faults --json FILE` (the GPU
harness's `faults` step).

Two measurements, each in processes of its own (this one never opens a CUDA context):

  oom  one engine process (bf16, eager: CUDA graphs and compiled passes replay from memory they
       reserved at start-up, so an eager pass is where an allocation can fail while serving) behind
       a Replica: its free device memory filled by one tensor but a headroom of a few single-chunk
       passes, then a batch that cannot fit (the dispatcher's first try), the same chunks one at a
       time (its retry), the tensor freed, the batch again. Recorded: what each raised, what the
       allocator reserved before and after the failure, and whether the replica served afterwards.
  mps  `--replicas` engine processes (bf16, CUDA graphs) under the CUDA MPS daemon, started for this
       step as the replica sweep starts it, all synthesizing; one is SIGKILLed halfway. Recorded:
       each survivor's chunks before and after the kill (ok and failed, the failures' text, its exit
       code), whether a replica started after the kill serves, what `nvidia-cuda-mps-control`
       lists before and after, and the tail of the MPS logs. Without an MPS daemon it runs the same
       with time-sliced contexts and says so.

Without CUDA (and `--device cuda`) it writes {"skipped": ...} and exits 0, so the harness's report
says why. `--device cpu --weights tiny` runs the mps part's plumbing on a CPU (no MPS, no oom part).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import multiprocessing as mp
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from loadtest.bench.replica_sweep import next_replica_message, start_mps, stop_replica_processes

OOM_BATCH = 8
OOM_PHONEMES = 400
# Chunk sizes the mps replicas cycle through (a fleet's mix, kept short so kills land mid-pass often).
MPS_CHUNKS = (60, 120, 250)


def _log(message: str) -> None:
    print(f"gpu_faults: {message}", file=sys.stderr, flush=True)


def _outcome(error: BaseException | None) -> str:
    """'ok', or the exception's type and the first line of its message."""
    if error is None:
        return "ok"
    return f"{type(error).__name__}: {str(error).splitlines()[0][:300] if str(error) else ''}"


# --- oom: one engine process --------------------------------------------------------------------------------


def _oom_child(weights_source: str, batch: int, phonemes: int, headroom_passes: float, results) -> None:
    try:
        results.put(("oom", asyncio.run(_oom_scenario(weights_source, batch, phonemes, headroom_passes))))
    except BaseException as error:  # the parent reports it; a dead child must not hang the step
        import traceback

        results.put(("oom", {"error": _outcome(error), "traceback": traceback.format_exc()}))


async def _oom_scenario(weights_source: str, batch: int, phonemes: int, headroom_passes: float) -> dict:
    import torch

    from loadtest.bench.engine_bench import bench_weights, chunk_ids
    from worker.engine import BatchItem, Engine, EngineConfig
    from worker.replica import Replica

    weights = bench_weights(weights_source)
    voice = next(iter(weights.voices.values()))
    engine = Engine(weights, EngineConfig("cuda", "bf16", cuda_graphs=False, compiled=False, max_batch=batch))
    engine.warmup()
    replica = Replica(engine)
    ids = chunk_ids(weights.config["vocab"], phonemes)
    items = [BatchItem(ids, voice[len(ids) - 1]) for _ in range(batch)]
    mib = 2 ** 20

    async def attempt(call, *args) -> str:
        try:
            await call(*args)
            return "ok"
        except Exception as error:  # what the dispatcher would see
            return _outcome(error)

    # One chunk's peak above what the engine holds idle: the headroom left is a few of those, so
    # a chunk fits alone and a batch of `batch` does not.
    torch.cuda.synchronize()
    held = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    single = await attempt(replica.synthesize, ids, items[0].style)
    single_peak = torch.cuda.max_memory_allocated() - held
    torch.cuda.empty_cache()
    free, total = torch.cuda.mem_get_info()
    headroom = int(max(64 * mib, headroom_passes * single_peak))
    filler = torch.empty(max(0, free - headroom), dtype=torch.uint8, device="cuda")
    report = {"batch": batch, "phonemes": phonemes, "single_before": single, "single_peak_mib": single_peak / mib,
              "device_total_mib": total / mib, "free_before_fill_mib": free / mib, "headroom_mib": headroom / mib,
              "filler_mib": filler.numel() / mib, "reserved_before_mib": torch.cuda.memory_reserved() / mib}
    report["batch_filled"] = await attempt(replica.synthesize_batch, items)
    report["reserved_after_failure_mib"] = torch.cuda.memory_reserved() / mib
    report["one_at_a_time_filled"] = [await attempt(replica.synthesize, item.ids, item.style) for item in items]
    del filler
    torch.cuda.empty_cache()
    report["batch_after_free"] = await attempt(replica.synthesize_batch, items)
    report["single_after_free"] = await attempt(replica.synthesize, ids, items[0].style)
    report["replica_idle_after"] = not replica.busy and not replica._one_at_a_time.locked()
    return report


def run_oom(weights_source: str, batch: int, phonemes: int, headroom_passes: float, timeout_s: float) -> dict:
    context = mp.get_context("spawn")
    results = context.Queue()
    child = context.Process(target=_oom_child, args=(weights_source, batch, phonemes, headroom_passes, results),
                            daemon=True)
    child.start()
    try:
        kind, report = next_replica_message(results, [child], time.perf_counter() + timeout_s)
    finally:
        child.join(timeout=10)
        if child.is_alive():
            child.kill()
    if kind != "oom":
        return {"error": report.get("error", "no answer")}
    report["exit_code"] = child.exitcode
    return report


# --- mps: several engine processes, one killed ------------------------------------------------------------


def _mps_replica(index: int, device: str, weights_source: str, commands, results) -> None:
    """Build an engine, say ready, then synthesize until the run's end, noting every chunk."""
    try:
        import torch

        from loadtest.bench.engine_bench import bench_weights, chunk_ids
        from worker.engine import Engine, EngineConfig

        torch.set_num_threads(1)
        weights = bench_weights(weights_source)
        voice = next(iter(weights.voices.values()))
        engine = Engine(weights, EngineConfig(device, "bf16" if device == "cuda" else "fp32", seed=index, compiled=False,
                        fused_kernels=False))
        engine.warmup()
        chunks = [chunk_ids(weights.config["vocab"], size) for size in MPS_CHUNKS]
        results.put(("ready", {"index": index, "pid": os.getpid()}))
        command = commands.get()
        if command[0] != "run":
            return
        _, start_at, end_at = command
        while time.time() < start_at:
            time.sleep(0.0005)
        done = []  # (finished at, outcome)
        turn = index
        while time.time() < end_at:
            ids = chunks[turn % len(chunks)]
            turn += 1
            try:
                engine.synthesize(ids, voice[len(ids) - 1])
                done.append((time.time(), "ok"))
            except Exception as error:  # recorded, and the replica tries again: does it recover?
                done.append((time.time(), _outcome(error)))
                time.sleep(0.05)
        results.put(("chunks", {"index": index, "chunks": done}))
    except BaseException as error:
        results.put(("error", {"index": index, "error": _outcome(error)}))


def mps_listing() -> dict:
    """What the MPS control daemon lists: its servers, and each server's clients (pids)."""
    control = shutil.which("nvidia-cuda-mps-control")
    if control is None or "CUDA_MPS_PIPE_DIRECTORY" not in os.environ:
        return {}

    def ask(question: str) -> list[str]:
        with contextlib.suppress(Exception):
            done = subprocess.run([control], input=question + "\n", text=True, capture_output=True, timeout=10)
            return done.stdout.split()
        return []

    return {server: ask(f"get_client_list {server}") for server in ask("get_server_list")}


def split_at_kill(chunks: list[tuple[float, str]], kill_at: float) -> dict:
    """A survivor's chunks before and after the kill: counts of ok and failed, the failures' kinds."""
    figures = {}
    for label, part in (("before", [c for c in chunks if c[0] < kill_at]),
                        ("after", [c for c in chunks if c[0] >= kill_at])):
        failures = [outcome for _, outcome in part if outcome != "ok"]
        figures[f"ok_{label}"] = len(part) - len(failures)
        figures[f"failed_{label}"] = len(failures)
        if failures:
            figures[f"failures_{label}"] = sorted(set(failures))[:5]
    return figures


def run_mps(replicas: int, seconds: float, device: str, weights_source: str, ready_timeout_s: float,
            respawn: bool = True) -> dict:
    context = mp.get_context("spawn")
    results = context.Queue()
    report: dict = {"replicas": replicas, "seconds": seconds, "device": device}
    with contextlib.ExitStack() as stack:
        daemon, said = start_mps(stack) if device == "cuda" else (None, "")
        report["mps_active"] = bool(daemon and daemon.active)
        if daemon is not None and not daemon.active:
            report["mps_error"] = said
        commands = [context.Queue() for _ in range(replicas + 1)]
        processes = [context.Process(target=_mps_replica, args=(k, device, weights_source, commands[k], results),
                                     daemon=True) for k in range(replicas)]
        started = time.perf_counter()
        for process in processes:
            process.start()
        stack.callback(stop_replica_processes, processes, commands)
        pids = {}
        while len(pids) < replicas:
            kind, message = next_replica_message(results, processes, started + ready_timeout_s)
            if kind != "ready":
                report["error"] = f"replica {message.get('index')}: {message.get('error')}"
                return report
            pids[message["index"]] = message["pid"]
        report["startup_s"] = round(time.perf_counter() - started, 1)
        report["mps_clients_before"] = mps_listing()
        start_at = time.time() + 0.5
        end_at = start_at + seconds
        for k in range(replicas):
            commands[k].put(("run", start_at, end_at))
        victim = 0
        time.sleep(max(0.0, start_at + seconds / 2 - time.time()))
        kill_at = time.time()
        os.kill(pids[victim], signal.SIGKILL)
        processes[victim].join(timeout=10)
        report["killed"] = {"index": victim, "pid": pids[victim], "exit_code": processes[victim].exitcode,
                            "at_s": round(kill_at - start_at, 2)}
        time.sleep(0.5)
        report["mps_clients_after_kill"] = mps_listing()
        survivors = _survivors(results, processes, victim, kill_at, time.perf_counter() + seconds + 60)
        for k, figures in survivors.items():
            processes[k].join(timeout=10)
            figures["exit_code"] = processes[k].exitcode
        report["survivors"] = {str(k): survivors[k] for k in sorted(survivors)}
        if respawn:
            report["respawned"] = _respawn(context, results, commands[replicas], replicas, device, weights_source,
                                           ready_timeout_s, processes)
        if daemon is not None and daemon.active:
            report["mps_log_tail"] = mps_log_tail(daemon.log_dir)
    return report


def _survivors(results, processes, victim: int, kill_at: float, deadline: float) -> dict[int, dict]:
    """Each survivor's chunks split at the kill; a survivor that died too (a CUDA fault crosses
    MPS clients) or never answered says so."""
    import queue

    survivors: dict[int, dict] = {}
    waiting = {k for k in range(len(processes)) if k != victim}
    while waiting and time.perf_counter() < deadline:
        try:
            kind, message = results.get(timeout=0.5)
        except queue.Empty:
            for k in [k for k in waiting if processes[k].exitcode not in (None, 0)]:
                survivors[k] = {"error": f"exited with code {processes[k].exitcode} before it reported"}
                waiting.discard(k)
            continue
        k = message.get("index")
        if k in waiting:
            survivors[k] = (split_at_kill(message["chunks"], kill_at) if kind == "chunks"
                            else {"error": message.get("error")})
            waiting.discard(k)
    for k in waiting:
        survivors[k] = {"error": "no answer before the deadline"}
    return dict(sorted(survivors.items()))


def _respawn(context, results, commands, index: int, device: str, weights_source: str, ready_timeout_s: float,
             processes: list) -> dict:
    """A replica started after the kill (as a fleet restarts a dead worker): does it start and serve?"""
    process = context.Process(target=_mps_replica, args=(index, device, weights_source, commands, results),
                              daemon=True)
    started = time.perf_counter()
    process.start()
    processes.append(process)
    kind, message = next_replica_message(results, [process], started + ready_timeout_s)
    if kind != "ready":
        return {"started": False, "error": message.get("error")}
    ready_s = round(time.perf_counter() - started, 1)
    start_at = time.time() + 0.2
    commands.put(("run", start_at, start_at + 2.0))
    kind, message = next_replica_message(results, [process], time.perf_counter() + 60)
    if kind != "chunks":
        return {"started": True, "ready_s": ready_s, "error": message.get("error")}
    return {"started": True, "ready_s": ready_s, **split_at_kill(message["chunks"], kill_at=0.0)}


def mps_log_tail(log_dir: Path, chars: int = 1500) -> dict:
    tails = {}
    for name in ("control.log", "server.log"):
        path = Path(log_dir) / name
        if path.exists():
            tails[name] = path.read_text(errors="replace")[-chars:]
    return tails


# --- the report -----------------------------------------------------------------------------------------------


def markdown(report: dict) -> str:
    """The faults section of the harness's report."""
    if report.get("skipped"):
        return f"Skipped: {report['skipped']}."
    lines = []
    oom = report.get("oom") or {}
    if oom.get("error"):
        lines.append(f"- Out of memory: the step failed: {oom['error']}")
    elif oom.get("skipped"):
        lines.append(f"- Out of memory: skipped ({oom['skipped']}).")
    elif oom:
        retried = oom.get("one_at_a_time_filled", [])
        lines += [f"- Out of memory: {oom['filler_mib']:.0f} MiB of {oom['device_total_mib']:.0f} MiB filled, "
                  f"{oom['headroom_mib']:.0f} MiB left (one {oom['phonemes']}-phoneme chunk peaks at "
                  f"{oom['single_peak_mib']:.0f} MiB).",
                  f"  - batch of {oom['batch']}, memory filled: {oom['batch_filled']} (allocator reserved "
                  f"{oom['reserved_before_mib']:.0f} MiB before, {oom['reserved_after_failure_mib']:.0f} MiB after)",
                  f"  - the same chunks one at a time, memory filled: {retried.count('ok')} of {len(retried)} ok"
                  + (f"; {sorted(set(r for r in retried if r != 'ok'))[0]}" if retried.count("ok") < len(retried)
                     else ""),
                  f"  - memory freed: batch {oom['batch_after_free']}, single chunk {oom['single_after_free']}, "
                  f"replica idle after {oom['replica_idle_after']}"]
    mps = report.get("mps") or {}
    if mps.get("error"):
        lines.append(f"- SIGKILL of a replica: the step failed: {mps['error']}")
    elif mps:
        mode = "under MPS" if mps.get("mps_active") else f"without MPS ({mps.get('mps_error') or mps.get('device')})"
        killed = mps.get("killed", {})
        lines += [f"- SIGKILL of one of {mps['replicas']} replicas {mode}, {killed.get('at_s')} s into a "
                  f"{mps['seconds']:g} s run (exit code {killed.get('exit_code')}):", "",
                  "| survivor | ok before | failed before | ok after | failed after | exit code | failures |",
                  "|---|---|---|---|---|---|---|"]
        for index, s in mps.get("survivors", {}).items():
            failures = "; ".join(s.get("failures_after", []) + s.get("failures_before", [])) or s.get("error") or "-"
            counts = " | ".join(str(s.get(k, "-")) for k in ("ok_before", "failed_before", "ok_after", "failed_after"))
            lines.append(f"| {index} | {counts} | {s.get('exit_code')} | {failures} |")
        respawned = mps.get("respawned")
        if respawned:
            lines += ["", "- A replica started after the kill: " + (
                f"ready in {respawned['ready_s']} s, {respawned.get('ok_after', 0)} chunks ok, "
                f"{respawned.get('failed_after', 0)} failed" if respawned.get("started") and "error" not in respawned
                else f"FAILED: {respawned.get('error')}")]
        if mps.get("mps_active"):
            lines.append(f"- MPS clients (server pid: client pids) before the kill {mps.get('mps_clients_before')}, "
                         f"after it {mps.get('mps_clients_after_kill')}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", dest="json_path", required=True, help="where the figures go")
    parser.add_argument("--parts", default="oom,mps", help="oom, mps or both")
    parser.add_argument("--device", default="cuda", help="cuda; cpu runs the mps part's plumbing only")
    parser.add_argument("--weights", default="random-full", help="random-full on a GPU box; tiny for a CPU dry run")
    parser.add_argument("--replicas", type=int, default=3, help="mps part: engine processes, one of them killed")
    parser.add_argument("--seconds", type=float, default=8.0, help="mps part: the run, killed halfway")
    parser.add_argument("--oom-batch", type=int, default=OOM_BATCH)
    parser.add_argument("--oom-phonemes", type=int, default=OOM_PHONEMES)
    parser.add_argument("--headroom-passes", type=float, default=3.0,
                        help="oom part: device memory left free, in single-chunk peaks")
    parser.add_argument("--ready-timeout", type=float, default=90.0)
    args = parser.parse_args(argv)
    if args.replicas < 2:
        parser.error("--replicas: at least 2 (one is killed, the others must serve)")
    path = Path(args.json_path)
    path.parent.mkdir(parents=True, exist_ok=True)
    report: dict = {}

    def save() -> None:
        path.write_text(json.dumps(report, indent=2), encoding="utf-8")

    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        report["skipped"] = "no CUDA device"
        save()
        print(markdown(report))
        return 0
    parts = [p for p in args.parts.split(",") if p]
    if "oom" in parts:
        if args.device != "cuda":
            report["oom"] = {"skipped": "no device memory to fill on a CPU"}
        else:
            _log(f"oom: a batch of {args.oom_batch} x {args.oom_phonemes} phonemes into a filled GPU")
            report["oom"] = run_oom(args.weights, args.oom_batch, args.oom_phonemes, args.headroom_passes,
                                    args.ready_timeout + 60)
        save()
    if "mps" in parts:
        _log(f"mps: {args.replicas} replicas, one SIGKILLed halfway through {args.seconds:g} s")
        try:
            report["mps"] = run_mps(args.replicas, args.seconds, args.device, args.weights, args.ready_timeout)
        except Exception as error:  # the oom part's figures stay
            report["mps"] = {"error": _outcome(error)}
        save()
    print(markdown(report))
    failed = [name for name in ("oom", "mps") if (report.get(name) or {}).get("error")]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
