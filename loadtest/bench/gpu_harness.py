"""Every GPU check of one device call: `python -m loadtest.bench.gpu_harness --out DIR [--call first]`.

A lent GPU comes for about 15 minutes, its start included, and a call may run 10. So one call runs
a fixed list of steps, each a subprocess in its own process group with its own time limit (SIGTERM
at its limit less a grace, SIGKILL at its limit, whatever it prints or does not print), in order:

  every call first installs the carried bundle (`.fleet`: what the GPU image lacks, loadtest/gpu_image.py)
  once, for every step, and says so; then
  first call (`--call first`, the default; limits in STEPS, their sum within --budget-s):
    smoke     one engine in the serving configuration (loadtest/bench/gpu_smoke.py): compile,
              capture, graphed replay against the same engine's eager run, into DIR/smoke.json at
              once; the steps after it take their fallback from it (failed before its engine was
              ready: eager, no graphs; compile failed: eager batches and the uncompiled tests;
              capture failed: compiled batches without graphs), each saying the smoke's phase and
              the exception's last line
    batch     `python -m loadtest.bench --batch 8,32`: eager batches and one by one first (written before
              anything compiles), then compiled-and-graphed batches beside them, and a lone
              60-phoneme chunk
    fleet     `python -m loadtest.gpu_fleet`: `serve` with its GPU defaults on the compile cache
              the smoke left, c = 1, then c = 128 and c = 256 each for its whole window
  second call (`--call second`): faults (an out-of-memory pass, a replica SIGKILLed under MPS), tests
    (pytest tests/unit/test_engine_gpu.py), arithmetic (eager batches under exact,
    exact-nondeterministic and fast stage-2 arithmetic: no compile, so it fits), then startup if time
    is left (eight serving engines starting together on the warm cache).

When time runs short, the steps cut are those of lowest priority (STEPS), not the last ones. Every
step's output goes to DIR/harness.log as it comes; DIR/gpu_results.json and DIR/gpu_results.md
are rewritten every few seconds while a step runs and after each, so a step stopped at its limit,
or the harness stopped by SIGTERM or SIGINT (it stops every step's process group first), still
leaves every figure measured. DIR holds at most 8 files, each under 16 MiB: what a device call
brings back.

`--rehearse-cpu` (or GPU_CALL_REHEARSAL=cpu in the environment: loadtest/image_rehearsal.py runs the
prepared command line so on a replica of the GPU image) runs the same call on a CPU: the same steps,
code and plumbing, with tiny weights, no CUDA graphs and no MPS, smaller batches, the fleet's levels
with shorter windows, and torch.compile through dynamo's eager
backend (TORCH_COMPILE_OVERRIDE_BACKENDS: inductor's C++ compile of the tiny decoder takes minutes
a family on a 2-core CPU); `--short` cuts it to about a minute on a quiet machine, compiled passes
off and without the optional step (the CI test).

Weights are full-size and random on a GPU (worker/model/random_init.py): the real ones cannot
travel, and cost depends on shapes, not values. The prepared device calls, with their step limits
and budgets, are in docs/performance.md ("The prepared GPU calls").
"""

from __future__ import annotations

import argparse
import codecs
import contextlib
import dataclasses
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from loadtest.bench import gpu_report

PY = sys.executable
REPO = Path(__file__).resolve().parents[2]
LOG_NAME = "harness.log"
LOG_CAP_BYTES = 12 << 20     # what comes back is 16 MiB a file: harness.log stops echoing steps past this
REFRESH_S = 10.0             # the report is rewritten this often while a step runs
END_RESERVE_S = 5.0          # kept from the budget for the last report


@dataclass(frozen=True)
class Step:
    """A step's place in a call: `priority` 1 is kept longest when time runs short; `limit_s` its
    own limit (SIGTERM at limit less grace, SIGKILL at limit); `floor_s` the least worth starting
    with (a step that cannot have its limit may run on what is left if that is at least this);
    `optional`: only on time left over, never reserved for."""

    name: str
    priority: int
    limit_s: float
    floor_s: float
    grace_s: float = 5.0
    optional: bool = False


# The GPU estimates behind the limits (H100/H200: a torch.compile of one shape family about a
# minute; 8 workers capture at once in 13-30 s; the fleet's last 8-worker start-up, and its levels'
# windows) are in docs/performance.md's prepared calls.
STEPS = {
    "smoke": Step("smoke", 1, 120, 90),
    "batch": Step("batch", 3, 135, 100),
    "fleet": Step("fleet", 2, 245, 235, grace_s=15),
    "tests": Step("tests", 2, 60, 40),
    "startup": Step("startup", 5, 90, 45, optional=True),
    "faults": Step("faults", 1, 110, 80),
    "arithmetic": Step("arithmetic", 3, 45, 35),
    # not in the prepared calls: by --steps only
    "check": Step("check", 3, 200, 120),
    "replicas": Step("replicas", 3, 300, 150),
}
CALLS = {"first": ("smoke", "batch", "fleet"), "second": ("faults", "tests", "arithmetic", "startup")}
BUDGETS = {"first": 525.0, "second": 240.0}
BUNDLE_INSTALL_S = 20.0      # the bundle's install at a call's start, out of its budget (15-20 s on the H200)
# The fleet step's levels on a GPU: c = 128 and c = 256 each get their whole window, c = 1 what is left.
FLEET_LEVELS, FLEET_WINDOW_S = "1,128,256", 15
# The CPU rehearsal's (limit, floor) per step: tiny weights on 2 shared cores, not a GPU's times.
REHEARSAL_LIMITS = {"smoke": (110, 60), "batch": (180, 60), "fleet": (210, 120), "tests": (70, 20), "startup": (90, 45),
                    "faults": (120, 60), "arithmetic": (120, 50), "check": (60, 30), "replicas": (120, 60)}
# Generous caps, for a 2-core machine shared with other jobs (imports alone took 10-60 s there
# under a load average of 10-14); on a quiet one the short call's steps end long before them.
SHORT_LIMITS = {"smoke": (90, 30), "batch": (90, 30), "fleet": (150, 60), "tests": (60, 20), "startup": (60, 30),
                "faults": (60, 30), "arithmetic": (60, 20), "check": (30, 15), "replicas": (60, 30)}
REHEARSAL_BUDGETS = {"full": 525.0, "short": 400.0}
# A rehearsal of the prepared command line as written (loadtest/image_rehearsal.py): set to `cpu`, the
# harness runs as with --rehearse-cpu, the call's budget and bundle as the command line gives them.
REHEARSAL_VARIABLE = "GPU_CALL_REHEARSAL"


def steps_for(ctx: "Context") -> dict[str, Step]:
    """STEPS, with the CPU rehearsal's limits when rehearsing."""
    if not ctx.rehearsal:
        return STEPS
    limits = SHORT_LIMITS if ctx.short else REHEARSAL_LIMITS
    return {name: dataclasses.replace(step, limit_s=limits[name][0], floor_s=limits[name][1],
                                      grace_s=min(step.grace_s, 8.0))
            for name, step in STEPS.items()}


# --- the steps' commands -----------------------------------------------------------------------------


@dataclass
class Context:
    """What the steps' commands depend on: where they write, the device and weights, and what the
    smoke step found (read from smoke.json once it ran)."""

    out: Path
    work: Path
    device: str = "cuda"
    weights: str = "random-full"
    rehearsal: bool = False
    short: bool = False
    fleet_bundle: Path | None = None
    compile_dir: str | None = None      # explicit compile cache; else the host's default (the smoke says which)
    artifacts_in: Path | None = None    # a folder of torch.compiler cache artifacts of an earlier call, same card
    smoke: dict | None = None
    smoke_planned: bool = True          # False: this call has no smoke step, so nothing to fall back from
    batch_family_ok: bool | None = None  # False: the batch step's compiled engine never got ready
    replica_counts: str = "1,2,4,8,12,16"
    mps: str = "both"
    bundle_env: dict[str, str] = dataclasses.field(default_factory=dict)  # what finds the installed bundle

    @property
    def cpu(self) -> bool:
        return self.device == "cpu"

    def fallback(self) -> dict:
        """What the steps after the smoke run: compiled passes only where the smoke compiled them,
        graphs only where it captured them (no smoke figures: neither). A call without a smoke
        step (`--steps tests,startup` after a first call) runs the serving defaults."""
        if self.smoke is None and not self.smoke_planned:
            return {"compiled": not self.short, "graphs": not self.cpu, "batch_graphs": not self.cpu,
                    "compile_dir": self.compile_dir, "why": ""}
        return gpu_report.fallback(self.smoke, self.cpu, compile_off=self.short)


def grace_of(step: Step, seconds: float) -> float:
    """Seconds between a step's SIGTERM and its SIGKILL, out of the `seconds` it was given."""
    return min(step.grace_s, seconds / 3)


def step_command(name: str, ctx: Context, seconds: float) -> list[str]:
    """The command of step `name`, given what the smoke found; `seconds` is the step's limit (the
    fleet keeps within it by itself, ending before its SIGTERM, and writes what it has)."""
    cpu, work, fb = ctx.cpu, ctx.work, ctx.fallback()
    device = ["--device", ctx.device, "--weights", ctx.weights]
    cache = ["--compile-cache-dir", ctx.compile_dir] if ctx.compile_dir else []
    if name == "smoke":  # serve's own batch bound (its GPU default): the batch family is the batch step's
        return [PY, "-m", "loadtest.bench.gpu_smoke", "--json", str(ctx.out / "smoke.json"), *device, *cache,
                "--artifacts-out", str(ctx.out / gpu_report.ARTIFACTS.format(step="smoke")),
                *(["--artifacts-in", str(ctx.artifacts_in)] if ctx.artifacts_in else []),
                *(["--compile", "off"] if ctx.short else [])]
    if name in ("batch", "arithmetic"):
        batches = ("2" if ctx.short else "2,4") if cpu else "8,32"
        command = [PY, "-m", "loadtest.bench", *device, *cache, "--modes", "auto", "--batch", batches,
                   "--batch-phonemes", "40" if cpu else "120", "--repeats", "2" if cpu else "3",
                   "--json", str(work / f"{name}.json")]
        if cpu:
            command.append("--no-fused")  # the fused CPU kernels' compile: half a minute here, none on a GPU
        if name == "arithmetic":  # eager: each arithmetic would be a compile of its own (TF32 is in the guards)
            return command + ["--compiled", "off", "--cuda-graphs", "off",
                              "--stage2", "exact,exact-nondeterministic,fast"]
        return command + ["--lone", "30" if cpu else "60", "--lone-runs", "5" if cpu else "20",
                          "--artifacts-out", str(ctx.out / gpu_report.ARTIFACTS.format(step="batch")),
                          "--compiled", "on" if fb["compiled"] else "off",
                          "--cuda-graphs", "on" if fb["graphs"] else "off",
                          "--batch-graphs", "on" if fb["batch_graphs"] else "off"]
    if name == "fleet":  # the bundle was installed at the call's start (install_bundle): --bundle none
        command = [PY, "-m", "loadtest.gpu_fleet", "--bundle", "none", "--out", str(work / "fleet"), *device,
                   "--budget-s", str(int(seconds - grace_of(steps_for(ctx)["fleet"], seconds))),
                   "--stop-reserve-s", "8" if cpu else "15",
                   *(["--compile-cache-dir", fb["compile_dir"]] if fb["compile_dir"] else []),
                   "--compile" if fb["compiled"] else "--no-compile",
                   "--cuda-graphs" if fb["graphs"] else "--no-cuda-graphs"]
        if cpu:  # tiny on 2 shared cores: the GPU's levels, shorter windows, one-sentence texts
            return command + ["--workers", "1" if ctx.short else "2", "--mps", "off", "--levels",
                              "1" if ctx.short else FLEET_LEVELS, "--duration", "3" if ctx.short else "8",
                              "--texts", "short"]
        return command + ["--levels", FLEET_LEVELS, "--duration", str(FLEET_WINDOW_S)]
    if name == "tests":  # the compiled tests batch: without the batch family in the cache they would compile it
        compiled = fb["compiled"] and ctx.batch_family_ok is not False
        return [PY, "-m", "pytest", "tests/unit/test_engine_gpu.py", "-v", "-p", "no:cacheprovider",
                f"--junitxml={work / 'tests.xml'}", *([] if compiled else ["-k", "not compiled"])]
    if name == "startup":
        return [PY, "-m", "loadtest.bench.gpu_smoke", "--together", "2" if cpu else "8", "--json",
                str(work / "startup.json"), *device,
                *(["--compile-cache-dir", fb["compile_dir"]] if fb["compile_dir"] else []),
                "--compile", "on" if fb["compiled"] else "off", "--cuda-graphs", "on" if fb["graphs"] else "off"]
    if name == "faults":
        return [PY, "-m", "loadtest.bench.gpu_faults", "--json", str(ctx.out / "faults.json"), "--replicas", "3",
                "--seconds", "8", "--ready-timeout", "90" if cpu else "45",  # three replicas' imports on 2 cores
                *(["--device", "cpu", "--weights", ctx.weights, "--parts", "mps"] if cpu else [])]
    if name == "check":
        return [PY, "-m", "loadtest.bench.gpu_parity", "--json", str(work / "check.json"), "--sizes",
                "30,60,120,250,400,510", "--modes", "fp32,bf16,fp16", "--repeats", "4"]
    if name == "replicas":
        return [PY, "-m", "loadtest.bench.replica_sweep", "--counts", ctx.replica_counts, "--seconds", "5",
                "--mps", ctx.mps, "--ready-timeout", "120", "--json", str(work / "replicas.json"),
                *(["--device", "cpu", "--weights", ctx.weights] if cpu else [])]
    raise ValueError(f"no step {name!r}: one of {', '.join(STEPS)}")


def step_environment(ctx: Context) -> dict[str, str]:
    env = {**os.environ, **ctx.bundle_env, "PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1"}
    if ctx.rehearsal:
        # dynamo traces, guards and counts as on the GPU; inductor's C++ compile would take minutes here
        env["TORCH_COMPILE_OVERRIDE_BACKENDS"] = ">=0:eager"
        # a chosen inductor cache: no process probes the vector ISA (a C++ probe compiled, then loaded by a
        # python -c that imports torch, per ISA and process: minutes on 2 loaded cores, and no C++ kernel
        # is generated under the eager backend)
        env.setdefault("TORCHINDUCTOR_CACHE_DIR", str(ctx.work / "inductor"))
        env["CUDA_VISIBLE_DEVICES"] = ""
        # one thread a process: two OpenMP threads per process on 2 cores shared with other jobs
        # spun against each other (a tiny 30-phoneme chunk took 14-19 s, against 1.2 s with one)
        env["OMP_NUM_THREADS"] = "1"
    return env


# --- time: what runs, by priority ---------------------------------------------------------------------


def allot(steps: list[Step], left_s: float) -> dict[str, float]:
    """Seconds for each of `steps` (those still to run) out of `left_s`; a step absent is cut. By
    priority, each gets its limit, or what the steps before it in priority left if that reaches its
    floor; optional steps only what all the others leave."""
    given: dict[str, float] = {}
    ranked = sorted((s for s in steps if not s.optional), key=lambda s: s.priority)
    for step in ranked + [s for s in steps if s.optional]:
        rest = left_s - sum(given.values())
        if rest >= step.floor_s and rest > 0:
            given[step.name] = min(step.limit_s, rest)
    return given


# --- running a step -------------------------------------------------------------------------------------


class Stopped(Exception):
    """SIGTERM or SIGINT reached the harness."""

    def __init__(self, signum: int):
        super().__init__(f"signal {signum}")
        self.signum = signum


class Harness:
    def __init__(self, out: Path, work: Path, budget_s: float, on_progress=None):
        self.out, self.work = out, work
        self.started = time.monotonic()
        self.deadline = self.started + budget_s
        self.log = open(out / LOG_NAME, "a", encoding="utf-8", buffering=1)
        self.logged = 0
        self.summary: dict = {"budget_s": budget_s, "steps": {}, "environment": environment()}
        self.on_progress = on_progress or (lambda: None)

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def say(self, message: str) -> None:
        line = f"[harness {time.monotonic() - self.started:6.1f}s] {message}\n"
        sys.stdout.write(line)
        sys.stdout.flush()
        self.log.write(line)

    def _echo(self, text: str, output) -> None:
        output.write(text)
        sys.stdout.write(text)
        sys.stdout.flush()
        if self.logged < LOG_CAP_BYTES:
            self.log.write(text)
            self.logged += len(text)
            if self.logged >= LOG_CAP_BYTES:
                self.log.write(f"\n[harness] {LOG_NAME} is full: the steps' output goes on in {self.work}\n")

    def run(self, name: str, command: list[str], limit: float, grace: float = 5.0,
            env: dict[str, str] | None = None) -> dict:
        """`command` in a process group of its own, for `limit` seconds at most: SIGTERM at `limit -
        grace`, SIGKILL at `limit`. Its output is read as it comes, never a line at a time (a
        partial line must not hold the limit up). Returns (and records) its status and seconds."""
        start = time.monotonic()
        record = self.summary["steps"][name] = {"status": "running", "limit_s": round(limit)}
        self.say(f"{name}: {' '.join(command)} (limit {limit:.0f} s)")
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        with open(self.work / f"{name}.log", "w", encoding="utf-8") as output:
            process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=REPO,
                                       env=env or {**os.environ, "PYTHONUNBUFFERED": "1"}, start_new_session=True)
            status = None
            try:
                status = self._follow(process, output, decoder, start + limit - grace, start + limit)
            except Stopped as stop:
                status = f"stopped by signal {stop.signum}"
                raise
            finally:
                # what is left of the group (all of it, when stopped): children it left behind too
                _stop_group(process, grace=0 if status == "timed out" else min(grace, 10.0))
                process.stdout.close()
                quit_stray_mps()
                if status is None:
                    status = "ok" if process.returncode == 0 else f"failed (rc {process.returncode})"
                record.update(status=status, seconds=round(time.monotonic() - start, 1))
                self.say(f"{name}: {status} in {record['seconds']:.0f} s")
        return record

    def _follow(self, process: subprocess.Popen, output, decoder, term_at: float, kill_at: float) -> str | None:
        fd = process.stdout.fileno()
        os.set_blocking(fd, False)
        timed_out = False
        next_refresh = time.monotonic() + REFRESH_S
        while True:
            now = time.monotonic()
            if now >= kill_at:
                return "timed out"
            if now >= term_at and not timed_out:
                timed_out = True
                self.say(f"{kill_at - now:.0f} s before its limit: SIGTERM to the step's process group")
                _signal_group(process, signal.SIGTERM)
            if now >= next_refresh:
                self.on_progress()
                next_refresh = now + REFRESH_S
            wait = min((term_at if not timed_out else kill_at) - now, next_refresh - now, 1.0)
            ready, _, _ = select.select([fd], [], [], max(0.0, wait))
            data = b""
            if ready:
                with contextlib.suppress(BlockingIOError):
                    data = os.read(fd, 1 << 16)
                if data:
                    self._echo(decoder.decode(data), output)
                    continue
            if process.poll() is not None and (not ready or not data):
                # exited: drain what is left (a grandchild holding the pipe must not hold us here)
                with contextlib.suppress(BlockingIOError, OSError):
                    while data := os.read(fd, 1 << 16):
                        self._echo(decoder.decode(data), output)
                self._echo(decoder.decode(b"", final=True), output)
                return "timed out" if timed_out else None


def _signal_group(process: subprocess.Popen, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signum)


def _stop_group(process: subprocess.Popen, grace: float) -> None:
    """The step's whole process group: SIGTERM, `grace` seconds for its leader, then SIGKILL to
    whatever is left of the group (children it left behind too)."""
    if process.poll() is None and grace > 0:
        _signal_group(process, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(grace)
    _signal_group(process, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(10)


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


def environment() -> dict:
    """The machine, read without opening a CUDA context here: the harness would hold one through
    every step (memory the replica sweep counts, and a client outside the MPS daemon it starts)."""
    import platform

    info = {"python": sys.version.split()[0], "host_cpu": _cpu_model(), "cores": os.cpu_count(),
            "machine": platform.machine()}
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


def _cpu_model() -> str | None:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return None


# --- the call ---------------------------------------------------------------------------------------------


def install_bundle(ctx: Context, harness: Harness, names: list[str]) -> None:
    """The carried bundle, once, before any step: its wheels that this machine lacks (or holds older)
    and its libraries and programs (redis-server, espeak-ng) into the scratch folder; every step's
    environment finds them (ctx.bundle_env). Its absence or failure is said, and the steps run on."""
    from loadtest import gpu_fleet

    record = harness.summary["bundle"] = {"folder": str(ctx.fleet_bundle) if ctx.fleet_bundle else None}
    if ctx.fleet_bundle is None or not ctx.fleet_bundle.is_dir():
        record["status"] = "none: this machine's packages" if ctx.rehearsal else f"no bundle at {ctx.fleet_bundle}"
        harness.say(f"bundle: {record['status']}")
        return
    started = time.monotonic()
    try:
        env, installed = gpu_fleet.install_bundle(ctx.fleet_bundle, ctx.work / "site", ctx.work / "root",
                                                  keep_libs=False, log=lambda m: harness.say(f"bundle: {m}"))
    except Exception as error:  # noqa: BLE001 (said, and the steps run on: each says what it lacks)
        record.update(status="failed", error=gpu_report.last_line(error))
        harness.say(f"bundle: install FAILED: {record['error']}")
        return
    ctx.bundle_env = {k: env[k] for k in ("PATH", "LD_LIBRARY_PATH", "PYTHONPATH", "ESPEAK_DATA_PATH") if k in env}
    record.update(status="installed", seconds=round(time.monotonic() - started, 1), **installed)
    harness.say(f"bundle: installed in {record['seconds']:.1f} s for every step ({', '.join(names)})")



def run_call(ctx: Context, names: list[str], budget_s: float) -> int:
    """Run the steps `names` in order within `budget_s`; the report is rewritten as figures come."""
    harness = Harness(ctx.out, ctx.work, budget_s)
    table = steps_for(ctx)
    summary = harness.summary
    summary.update({"call": names, "rehearsal": "cpu" + (" short" if ctx.short else "") if ctx.rehearsal else None,
                    "work": str(ctx.work)})

    def write_report() -> None:
        gpu_report.write(ctx.out, ctx.work, summary)

    harness.on_progress = write_report
    harness.say(f"environment: {json.dumps(summary['environment'])}")
    harness.say("plan: " + ", ".join(f"{n} ({table[n].limit_s:.0f} s, priority {table[n].priority}"
                                      + (", if time is left" if table[n].optional else "") + ")" for n in names)
                + f"; budget {budget_s:.0f} s")
    install_bundle(ctx, harness, names)
    write_report()
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}

    def stop(signum, frame):
        for sig in previous:  # one stop: what follows (stopping the step, the report) must not be cut short
            signal.signal(sig, signal.SIG_IGN)
        raise Stopped(signum)

    for sig in previous:
        signal.signal(sig, stop)
    try:
        for k, name in enumerate(names):
            step = table[name]
            given = allot([table[n] for n in names[k:]], harness.left() - END_RESERVE_S)
            if name == "fleet" and not ctx.rehearsal and not (ctx.fleet_bundle and ctx.fleet_bundle.is_dir()):
                summary["steps"][name] = {"status": "skipped", "why": f"no fleet bundle at {ctx.fleet_bundle}"}
                harness.say(f"{name}: skipped (no fleet bundle)")
            elif name not in given:
                why = (f"cut: {max(0.0, harness.left()):.0f} s left" if step.optional else
                       f"cut: {max(0.0, harness.left()):.0f} s left, kept for steps of higher priority")
                summary["steps"][name] = {"status": "skipped", "why": why}
                harness.say(f"{name}: {why}")
            else:
                if name != "smoke" and ctx.smoke is None:
                    ctx.smoke = gpu_report.read_json(ctx.out / "smoke.json")
                fb = ctx.fallback()
                if name in ("batch", "fleet", "tests", "startup") and fb["why"]:
                    harness.say(f"{name}: {fb['why']}")
                harness.run(name, step_command(name, ctx, given[name]), given[name],
                            grace_of(step, given[name]), env=step_environment(ctx))
                if name == "smoke":
                    ctx.smoke = gpu_report.read_json(ctx.out / "smoke.json")
                if name == "batch" and fb["compiled"]:
                    record = ((gpu_report.read_json(ctx.work / "batch.json") or {}).get("meta") or {}).get("compiled")
                    ctx.batch_family_ok = bool(record) and not record.get("error")
                    if not ctx.batch_family_ok:
                        harness.say("batch: its compiled engine never got ready: the tests leave the compiled ones out")
                if name != "smoke" and fb["why"]:
                    summary["steps"][name]["fallback"] = fb["why"]
            write_report()
    except Stopped as stop_signal:
        summary["stopped"] = f"signal {stop_signal.signum}"
        for name in names:
            summary["steps"].setdefault(name, {"status": "not run", "why": f"harness stopped by signal {stop_signal.signum}"})
        harness.say(f"stopped by signal {stop_signal.signum}: every step's process group stopped; writing the report")
        write_report()
        return 128 + stop_signal.signum
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    report = gpu_report.write(ctx.out, ctx.work, summary)
    sys.stdout.write(report)
    for problem in gpu_report.out_problems(ctx.out):
        harness.say(f"WARNING: {problem}")
    return 0 if all(s["status"] in ("ok", "skipped") for s in summary["steps"].values()) else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.environ.get("OUT", "gpu-results"), help="where the results go")
    parser.add_argument("--call", default="first", choices=sorted(CALLS), help="the prepared call's steps")
    parser.add_argument("--steps", default="", help="these steps instead of the call's, in this order")
    parser.add_argument("--budget-s", type=float, default=0.0, help="seconds for every step together "
                        "(default: the call's, first 520, second 170; a rehearsal 575, short 400)")
    parser.add_argument("--fleet-bundle", default=".fleet", help="the carried wheels and packages of the fleet step")
    parser.add_argument("--compile-cache-dir", default="", help="the compile cache every step uses "
                        "(default: the host's, KOKORO_CACHE_DIR/compile/<torch>-<card>; a rehearsal: a fresh one)")
    parser.add_argument("--compile-artifacts", default="", help="a folder of torch.compiler cache artifacts of an "
                        "earlier call on the same card and torch (its compile-artifacts-*.bin): the smoke loads them "
                        "before it compiles")
    parser.add_argument("--rehearse-cpu", action="store_true", help="the same call on this CPU: tiny weights, "
                        f"no CUDA graphs, no MPS (also: {REHEARSAL_VARIABLE}=cpu in the environment)")
    parser.add_argument("--short", action="store_true",
                        help="--rehearse-cpu in about a minute: compiled passes off, no optional step")
    parser.add_argument("--replica-counts", default="1,2,4,8,12,16", help="replicas step: the counts to measure")
    parser.add_argument("--mps", default="both", choices=["off", "on", "both"],
                        help="replicas step: time-sliced (off), under CUDA MPS (on), or both (two start-ups)")
    args = parser.parse_args(argv)
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="kokoro-gpu-"))
    names = [s for s in args.steps.split(",") if s]
    if not names:  # the call's steps; --short leaves the optional one out
        names = [n for n in CALLS[args.call] if not (args.short and STEPS[n].optional)]
    unknown = [n for n in names if n not in STEPS]
    if unknown:
        parser.error(f"unknown steps {unknown}: one of {', '.join(STEPS)}")
    bundle = Path(args.fleet_bundle).resolve()  # the steps run in the repository's root
    rehearse = args.rehearse_cpu or os.environ.get(REHEARSAL_VARIABLE) == "cpu"
    if rehearse and not bundle.is_dir():
        bundle = None  # this machine's packages
    ctx = Context(out=out, work=work, fleet_bundle=bundle,
                  compile_dir=args.compile_cache_dir or None,
                  artifacts_in=Path(args.compile_artifacts).resolve() if args.compile_artifacts else None,
                  replica_counts=args.replica_counts, mps=args.mps)
    ctx.smoke_planned = "smoke" in names
    if rehearse:
        ctx.device, ctx.weights, ctx.rehearsal, ctx.short = "cpu", "tiny", True, args.short
        ctx.compile_dir = ctx.compile_dir or str(work / "compile-cache")
    budget = args.budget_s or (REHEARSAL_BUDGETS["short" if args.short else "full"] if rehearse
                               else BUDGETS[args.call])
    return run_call(ctx, names, budget)


if __name__ == "__main__":
    sys.exit(main())
