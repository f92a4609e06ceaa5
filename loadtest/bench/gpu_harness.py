"""Every GPU check in one call: `python -m loadtest.bench.gpu_harness --out DIR [--budget-s 480]`.

A lent GPU comes for minutes, so this runs all the GPU work in one go, each step a subprocess with
its own time limit (a hang or a crash costs that step, not the others), everything it prints in
DIR/harness.log, and after every step the figures so far in DIR/gpu_results.json and a markdown
report DIR/gpu_results.md (what docs/performance.md's GPU figures and the issue note are made from).

Steps, most important first (`--steps` picks some):
  tests     pytest tests/unit/test_engine_gpu.py (graphed vs eager, noise, precision, batch on CUDA)
  check     python -m loadtest.bench.gpu_parity: parity and precision bounds, capture time and memory, then
            `kokoro-fleet bench --device cuda` over chunks of 30..510 phonemes, eager vs graphed,
            fp32 / bf16 / fp16
  replicas  python -m loadtest.bench.replica_sweep: 1..16 engine processes with and without CUDA MPS
  startup   python -m loadtest.bench.gpu_parity --startup 8: eight compiled engines start together on
            the host's compile cache (one compiles, seven load), then one alone on the warm cache
  batch     kokoro-fleet bench --batch 1,8,32: compiled-and-graphed batches beside eager batches
            and one by one (chunks of about 120 phonemes, bf16, exact stage-2 arithmetic)
  batch-fast  the same with fast stage-2 arithmetic (TF32, cudnn.benchmark)
  fleet     python -m loadtest.gpu_fleet: `kokoro-fleet serve --workers 8` under the load generator
            (needs the carried `.fleet` bundle; skipped without it)
  faults    python -m loadtest.bench.gpu_faults: a batch pass into a GPU filled but a headroom (the
            out-of-memory error, the job-by-job retry, the replica serving after), and one of three
            replicas SIGKILLed under CUDA MPS while all synthesize (do the others keep serving?)

A session's device time is short and the machine's start counts, so plan two calls back to back on
the warm machine, each well under the per-call limit, from the step times recorded in
loadtest/README.md ("Figures behind the code's choices"), which also lists the calls used so far.
DIR may be the same folder: each call rewrites the report from what its own steps measured.

The compiled passes (issue 38) in one call, compiles included (the startup step compiles into the
host's cache that batch and tests then load from; batch-fast may compile again, TF32 being part of
what dynamo guards on; tests without startup before them compile too, past their cap):
  `python -m loadtest.bench.gpu_harness --steps startup,batch,tests,batch-fast --budget-s 560`
(device command: `OUT=$OUT timeout 590 python3 -m loadtest.bench.gpu_harness --out $OUT --steps
startup,batch,tests,batch-fast --budget-s 560`, timeout_s 600).

GPU faults (issue 41), about two minutes: `OUT=$OUT timeout 170 python3 -m loadtest.bench.gpu_harness
--out $OUT --steps faults --budget-s 150` (timeout_s 180).

Weights are full-size and random (worker/model/random_init.py, speech-like durations): the real
ones cannot travel to a GPU box, and cost depends on shapes, not values.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PY = sys.executable
SIZES = "30,60,120,250,400,510"
BATCHES = "1,8,32"
REPLICA_COUNTS = "1,2,4,8,12,16"


def steps(work: Path, fleet_bundle: Path, replica_counts: str = REPLICA_COUNTS,
          mps: str = "both") -> dict[str, tuple[list[str], float]]:
    """name -> (command, its own time cap in seconds)."""
    return {
        "tests": ([PY, "-m", "pytest", "tests/unit/test_engine_gpu.py", "-q", "-p", "no:cacheprovider",
                   f"--junitxml={work / 'tests.xml'}"], 200),
        "check": ([PY, "-m", "loadtest.bench.gpu_parity", "--json", str(work / "check.json"), "--sizes", SIZES,
                   "--modes", "fp32,bf16,fp16", "--repeats", "4"], 200),
        "replicas": ([PY, "-m", "loadtest.bench.replica_sweep", "--counts", replica_counts, "--seconds", "5",
                      "--mps", mps, "--ready-timeout", "120", "--json", str(work / "replicas.json")], 300),
        "startup": ([PY, "-m", "loadtest.bench.gpu_parity", "--startup", "8", "--json", str(work / "startup.json")], 300),
        "batch": ([PY, "-m", "api.cli", "bench", "--device", "cuda", "--weights", "random-full", "--modes", "bf16",
                   "--batch", BATCHES, "--batch-phonemes", "120", "--repeats", "3", "--json",
                   str(work / "batch.json")], 150),
        "batch-fast": ([PY, "-m", "api.cli", "bench", "--device", "cuda", "--weights", "random-full", "--modes",
                        "bf16", "--batch", BATCHES, "--batch-phonemes", "120", "--repeats", "3", "--stage2", "fast",
                        "--json", str(work / "batch_fast.json")], 180),
        # {budget}: the step's own time limit less a margin, so it stops the fleet and writes what it has
        "fleet": ([PY, "-m", "loadtest.gpu_fleet", "--bundle", str(fleet_bundle), "--out", str(work / "fleet"),
                   "--budget-s", "{budget}", "--duration", "15"], 320),
        "faults": ([PY, "-m", "loadtest.bench.gpu_faults", "--json", str(work / "faults.json"), "--replicas", "3",
                    "--seconds", "8", "--ready-timeout", "45"], 140),
    }


class Harness:
    def __init__(self, out: Path, budget_s: float):
        self.out = out
        self.deadline = time.monotonic() + budget_s
        self.log = open(out / "harness.log", "a", encoding="utf-8", buffering=1)
        self.summary: dict = {"steps": {}, "environment": environment()}

    def say(self, message: str) -> None:
        line = f"[harness {time.strftime('%H:%M:%S')}] {message}"
        print(line, flush=True)
        self.log.write(line + "\n")

    def run(self, name: str, command: list[str], cap: float) -> None:
        left = self.deadline - time.monotonic()
        if left < 20:
            self.summary["steps"][name] = {"status": "skipped", "why": "out of time"}
            self.say(f"{name}: skipped (out of time)")
            return
        limit = min(cap, left - 5)
        command = [part.replace("{budget}", str(int(limit - 10))) for part in command]
        self.say(f"{name}: {' '.join(command)} (limit {limit:.0f} s)")
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        start = time.monotonic()
        with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                              start_new_session=True) as process:
            status = None
            try:
                for line in _lines_until(process, start + limit):
                    self.log.write(line)
                    print(line, end="", flush=True)
            except TimeoutError:
                os.killpg(process.pid, 9)
                status = "timed out"
            rc = process.wait()
        quit_stray_mps()
        status = status or ("ok" if rc == 0 else f"failed (rc {rc})")
        self.summary["steps"][name] = {"status": status, "seconds": round(time.monotonic() - start, 1)}
        self.say(f"{name}: {status} in {time.monotonic() - start:.0f} s")


def quit_stray_mps() -> None:
    """A step killed at its limit leaves the MPS daemon it started (it daemonizes, out of the killed
    process group): quit every one started under the sweep's or the server's pipe directories, so the
    next step measures what it means to."""
    import glob

    control = shutil.which("nvidia-cuda-mps-control")
    if control is None:
        return
    for pipe in glob.glob("/tmp/kokoro-mps-*/pipe") + glob.glob("/tmp/kokoro-fleet-mps/pipe"):
        with contextlib.suppress(Exception):
            subprocess.run([control], input="quit\n", text=True, capture_output=True, timeout=15,
                           env={**os.environ, "CUDA_MPS_PIPE_DIRECTORY": pipe})


def _lines_until(process: subprocess.Popen, deadline: float):
    """The process's output lines; TimeoutError once the deadline passes (a silent hang too)."""
    import selectors

    selector = selectors.DefaultSelector()
    selector.register(process.stdout, selectors.EVENT_READ)
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError
        if selector.select(timeout=min(left, 5.0)):
            line = process.stdout.readline()
            if not line:
                return
            yield line
        elif process.poll() is not None:
            return


def environment() -> dict:
    """The machine, read without opening a CUDA context here: the harness would hold one through
    every step (memory the replica sweep counts, and a client outside the MPS daemon it starts)."""
    info = {"python": sys.version.split()[0]}
    try:
        import torch

        info["torch"] = torch.__version__
    except Exception as error:  # the report says so rather than failing
        info["torch_error"] = repr(error)
    if shutil.which("nvidia-smi"):
        info["nvidia_smi"] = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,clocks.max.sm",
                                             "--format=csv,noheader"], capture_output=True, text=True).stdout.strip()
        info["gpu"] = info["nvidia_smi"].split(",")[0].strip() or None
    return info


# --- the report --------------------------------------------------------------------------------------


def _read(path: Path):
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def collect(work: Path, summary: dict) -> dict:
    figures = dict(summary)
    for name, file in (("check", "check.json"), ("bench", "check.json.bench.json"), ("batch", "batch.json"),
                       ("batch_fast", "batch_fast.json"), ("startup", "startup.json"),
                       ("replicas", "replicas.json"), ("fleet", "fleet/gpu_fleet.json"), ("faults", "faults.json")):
        value = _read(work / file)
        if value is not None:
            figures[name] = value
    with contextlib.suppress(OSError):
        figures["fleet_markdown"] = (work / "fleet" / "gpu_fleet.md").read_text(encoding="utf-8")
    tests = work / "tests.xml"
    if tests.exists():
        import xml.etree.ElementTree as ET

        suite = ET.parse(tests).getroot()
        suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
        figures["tests"] = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
    return figures


def markdown(figures: dict) -> str:
    env = figures["environment"]
    lines = [f"# GPU harness: {env.get('gpu') or 'no GPU'}", "",
             f"torch {env.get('torch')}, python {env.get('python')}; {env.get('nvidia_smi', '')}", "",
             "| step | status | seconds |", "|---|---|---|"]
    lines += [f"| {n} | {s['status']} | {s.get('seconds', '-')} |" for n, s in figures["steps"].items()]
    if "tests" in figures:
        t = figures["tests"]
        lines += ["", f"tests/unit/test_engine_gpu.py: {t['tests']} tests, {t['failures']} failed, "
                      f"{t['errors']} errors, {t['skipped']} skipped"]
    check = figures.get("check")
    if check:
        lines += ["", "## Parity (full-size random weights)", "", "| check | tokens | result |", "|---|---|---|"]
        from loadtest.bench.gpu_parity import PADDING_BOUND_DB, PRECISION_BOUND_DB

        for row in check.get("parity", []):
            lines.append(f"| graphed vs eager fp32 | {row['tokens']} | replays the padded eager run exactly "
                         f"{row['replays_padded_eager_exactly']}; against the unpadded run durations equal "
                         f"{row['durations_equal']}, log-spectral distance {row['lsd_db']:.3f} dB (bound "
                         f"{PADDING_BOUND_DB}), SNR {row['snr_db']:.1f} dB |")
        for row in check.get("precision", []):
            lines.append(f"| {row['dtype']} graphed vs fp32 eager | {row['tokens']} | durations within 1 frame "
                         f"{row['durations_within_1']:.1%}, log-spectral distance {row['lsd_db']:.2f} dB (bound "
                         f"{PRECISION_BOUND_DB}) |")
        if "noise_reproducible" in check:
            lines.append(f"| noise on, same input twice | 40 | identical {check['noise_reproducible']} |")
        lines += ["", "| dtype | capture s | graphs MiB | stage-1 / stage-2 graphs |", "|---|---|---|---|"]
        for dtype, c in check.get("capture", {}).items():
            lines.append(f"| {dtype} | " + ("FAILED | - | - |" if c is None else
                                            f"{c['seconds']:.1f} | {c['mib']:.0f} | {c['stage1_graphs']} / {c['stage2_graphs']} |"))
        if check.get("failures"):
            lines += ["", "FAILED: " + "; ".join(check["failures"])]
    bench = figures.get("bench")
    if bench:
        lines += ["", "## Engine: one chunk at a time (kokoro-fleet bench --device cuda)", "",
                  "| phonemes | audio s | contender | p50 ms | p95 ms | audio-s/s (x real time) |", "|---|---|---|---|---|---|"]
        for size, by_name in bench["results"].items():
            for name, r in by_name.items():
                lines.append(f"| {size} | {r['audio_s']:.2f} | {name} | {1000 * r['p50_s']:.1f} | {1000 * r['p95_s']:.1f} | "
                             f"{r['audio_s_per_s']:.0f} |")
        peak = bench["meta"].get("peak_memory_bytes", {})
        if peak:
            lines += ["", "Peak GPU memory per engine (torch allocator; the CUDA context adds ~500 MiB): "
                      + ", ".join(f"{n} {b / 2**20:.0f} MiB" for n, b in peak.items())]
    for key in ("batch", "batch_fast"):
        if figures.get(key):
            lines += batch_markdown(figures[key])
    startup = figures.get("startup")
    if startup:
        lines += ["", f"## Start-up: {startup['workers']} compiled engines together, then one alone", "",
                  "| engine | compiled or loaded | compile s | waited s | ready s | reserved MiB |", "|---|---|---|---|---|---|"]
        rows = [(f"together #{k}", r) for k, r in enumerate(startup["together"])] + [("alone, warm", startup["alone_warm"])]
        for name, r in rows:
            lines.append(f"| {name} | FAILED | - | - | - | - |" if r is None else
                         f"| {name} | {'loaded' if r['loaded'] else 'compiled'} | {r['compile_s']:.1f} | "
                         f"{r['waited_s']:.1f} | {r['ready_s']:.1f} | {r['reserved_mib']:.0f} |")
    replicas = figures.get("replicas")
    if replicas:
        from loadtest.bench.replica_sweep import markdown as replica_table

        lines += ["", "## Replicas: N engine processes on one GPU (bf16, CUDA graphs, chunk mix "
                      f"{replicas[0].get('chunk_mix')} phonemes)", "", replica_table(replicas)]
    if figures.get("faults"):
        from loadtest.bench.gpu_faults import markdown as faults_markdown

        lines += ["", "## Faults: out of memory in a pass, a replica SIGKILLed under MPS", "",
                  faults_markdown(figures["faults"])]
    if figures.get("fleet_markdown"):
        lines += ["", "## The whole fleet (kokoro-fleet serve --workers 8, random full-size weights)", "",
                  figures["fleet_markdown"]]
    return "\n".join(lines) + "\n"


def batch_markdown(batch: dict) -> list[str]:
    meta = batch["meta"]
    compiled = meta.get("compiled") or {}
    lines = ["", f"## Batched forward pass ({meta['dtype']}, chunks of about {meta['batch_phonemes']} phonemes, "
                 f"{meta.get('gpu')}, stage 2 {meta.get('stage2')})", "",
             "| batch | audio-s/s eager | audio-s/s compiled+graphs | compiled p50 ms | audio-s/s one by one | "
             "speed-up |", "|---|---|---|---|---|---|"]
    for size, r in batch["batch"].items():
        c = r.get("compiled", {})
        lines.append(f"| {size} | {r['batched']['audio_s_per_s']:.0f} | {c.get('audio_s_per_s', float('nan')):.0f} | "
                     f"{1000 * c.get('latency_p50_s', float('nan')):.1f} | {r['one_by_one']['audio_s_per_s']:.0f} | "
                     f"{r['speedup']:.2f}x |")
    if compiled:
        graphs = compiled.get("batch_graphs") or {}
        lines += ["", f"Compiled passes {'loaded' if compiled['loaded'] else 'compiled'} in {compiled['seconds']:.1f} s; "
                      f"{graphs.get('count', 0)} batch graphs, {graphs.get('mib', 0):.0f} MiB allocated, "
                      f"{graphs.get('reserved_mib', 0):.0f} MiB reserved in all"]
    return lines


# The steps' own logs worth keeping beside the report: the fleet's holds the serve log's head, tail
# and start-up lines, the only record of where a slow start or a failure went; the faults step's
# figures hold the MPS daemon's log tails.
KEPT_LOGS = {"fleet/gpu_fleet.log": "fleet.log", "fleet/gpu_fleet.md": "fleet.md", "faults.json": "faults.json"}


def keep_logs(work: Path, out: Path) -> None:
    for source, name in KEPT_LOGS.items():
        if (work / source).is_file():
            shutil.copyfile(work / source, out / name)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.environ.get("OUT", "gpu-results"), help="where the results go")
    parser.add_argument("--budget-s", type=float, default=480.0, help="seconds for every step together")
    parser.add_argument("--steps", default="tests,check,replicas,batch,fleet")
    parser.add_argument("--fleet-bundle", default=".fleet", help="the carried wheels and packages of the fleet step")
    parser.add_argument("--replica-counts", default=REPLICA_COUNTS, help="replicas step: the counts to measure")
    parser.add_argument("--mps", default="both", choices=["off", "on", "both"],
                        help="replicas step: time-sliced (off), under CUDA MPS (on), or both (two start-ups)")
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="kokoro-gpu-"))
    harness = Harness(out, args.budget_s)
    harness.say(f"environment: {json.dumps(harness.summary['environment'])}")
    table = steps(work, Path(args.fleet_bundle), args.replica_counts, args.mps)
    for name in [s for s in args.steps.split(",") if s]:
        if name == "fleet" and not Path(args.fleet_bundle).is_dir():
            harness.summary["steps"][name] = {"status": "skipped", "why": f"no bundle at {args.fleet_bundle}"}
            continue
        command, cap = table[name]
        harness.run(name, command, cap)
        keep_logs(work, out)
        figures = collect(work, harness.summary)
        (out / "gpu_results.json").write_text(json.dumps(figures, indent=2), encoding="utf-8")
        (out / "gpu_results.md").write_text(markdown(figures), encoding="utf-8")
    print((out / "gpu_results.md").read_text(encoding="utf-8"))
    return 0 if all(s["status"] == "ok" for s in harness.summary["steps"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
