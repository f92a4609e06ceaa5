"""The GPU harness's plumbing, on the CPU: step limits that hold whatever a step prints, a stop by
signal that still writes the report, time given by priority, the fallbacks the smoke decides, the
report, the prepared calls' budgets, and a short rehearsal of the whole call; the replica sweep's
and the faults step's figures (the GPU side itself runs on a lent GPU only)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from loadtest.bench import gpu_faults, gpu_harness, gpu_report
from loadtest.bench.replica_sweep import CHUNK_MIX, summarize_phase
from worker.engine import use_exact_cuda_arithmetic

REPO = Path(__file__).resolve().parents[2]


def _harness(tmp_path, budget_s=60.0):
    (tmp_path / "out").mkdir(exist_ok=True)
    (tmp_path / "work").mkdir(exist_ok=True)
    return gpu_harness.Harness(tmp_path / "out", tmp_path / "work", budget_s)


def _gone(pid: int, within_s: float = 10.0) -> bool:
    """The process has exited (a zombie counts as gone: it runs nothing)."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            return True
        if state == "Z":
            return True
        time.sleep(0.1)
    return False


def test_a_step_that_prints_half_a_line_and_sleeps_is_stopped_within_its_limit(tmp_path):
    harness = _harness(tmp_path)
    start = time.monotonic()
    record = harness.run("half-line", [sys.executable, "-c", "import time; print('half a li', end='', flush=True); "
                                                             "time.sleep(60)"], limit=3, grace=1)
    assert record["status"] == "timed out"
    assert time.monotonic() - start < 3 + 3
    assert "half a li" in (tmp_path / "out" / "harness.log").read_text()
    assert "half a li" in (tmp_path / "work" / "half-line.log").read_text()


def test_a_step_deaf_to_sigterm_is_killed_at_its_limit_with_the_children_it_started(tmp_path):
    pid_file = tmp_path / "child.pid"
    code = ("import signal, subprocess, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
            "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
            f"open({str(pid_file)!r}, 'w').write(str(child.pid)); time.sleep(60)")
    start = time.monotonic()
    record = _harness(tmp_path).run("deaf", [sys.executable, "-c", code], limit=4, grace=1)
    assert record["status"] == "timed out" and time.monotonic() - start < 4 + 5
    assert _gone(int(pid_file.read_text()))


def test_steps_that_fail_or_work_say_so_and_the_next_still_runs(tmp_path):
    harness = _harness(tmp_path)
    harness.run("fails", [sys.executable, "-c", "raise SystemExit(3)"], limit=10)
    harness.run("works", [sys.executable, "-c", "print('fine')"], limit=10)
    steps = harness.summary["steps"]
    assert steps["fails"]["status"] == "failed (rc 3)" and steps["works"]["status"] == "ok"
    assert "fine" in (tmp_path / "out" / "harness.log").read_text()


SIGNALLED = """
import sys, time
from pathlib import Path
from loadtest.bench import gpu_harness as h
h.STEPS["sleepy"] = h.Step("sleepy", 1, 120, 10)
code = ("import os, subprocess, sys, time; child = subprocess.Popen([sys.executable, '-c', 'import time; "
        "time.sleep(120)']); open(sys.argv[1], 'w').write(str(child.pid)); print('half', end='', flush=True); "
        "time.sleep(120)")
h.step_command = lambda name, ctx, seconds: [sys.executable, "-c", code, sys.argv[3]]
ctx = h.Context(out=Path(sys.argv[1]), work=Path(sys.argv[2]), device="cpu")
sys.exit(h.run_call(ctx, ["sleepy", "smoke"], 200))
"""


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_to_the_harness_stops_every_steps_process_group_and_still_writes_the_report(tmp_path, signum):
    out, work, pid_file = tmp_path / "out", tmp_path / "work", tmp_path / "grandchild.pid"
    out.mkdir()
    work.mkdir()
    harness = subprocess.Popen([sys.executable, "-c", SIGNALLED, str(out), str(work), str(pid_file)], cwd=REPO,
                               env={**os.environ, "PYTHONPATH": str(REPO)}, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 60
    while not pid_file.exists() or not pid_file.read_text():
        assert harness.poll() is None and time.monotonic() < deadline, harness.stdout.read()
        time.sleep(0.1)
    harness.send_signal(signum)
    output, _ = harness.communicate(timeout=30)
    assert harness.returncode == 128 + signum, output
    assert _gone(int(pid_file.read_text()))
    report = json.loads((out / "gpu_results.json").read_text())
    assert report["steps"]["sleepy"]["status"] == f"stopped by signal {signum}"
    assert report["steps"]["smoke"]["status"] == "not run" and report["stopped"] == f"signal {signum}"
    assert "half" in (out / "harness.log").read_text()
    assert "The harness was stopped" in (out / "gpu_results.md").read_text()


def _steps(*specs):
    return [gpu_harness.Step(name, priority, limit, floor, optional=optional)
            for name, priority, limit, floor, optional in specs]


def test_time_goes_by_priority_not_by_order():
    steps = _steps(("smoke", 1, 100, 60, False), ("batch", 3, 80, 50, False), ("fleet", 2, 120, 90, False),
                   ("tests", 4, 60, 30, False), ("startup", 5, 90, 45, True))
    assert gpu_harness.allot(steps, 400) == {"smoke": 100, "batch": 80, "fleet": 120, "tests": 60}
    # short of time: batch (priority 3) does not fit whole and its floor does not fit what is left
    # after smoke and fleet; tests (priority 4, later in order) fit their floor and run
    assert gpu_harness.allot(steps, 265) == {"smoke": 100, "fleet": 120, "tests": 45}
    # the fleet is kept whole before the batch, which runs on what is left if that reaches its floor
    assert gpu_harness.allot(steps, 280) == {"smoke": 100, "fleet": 120, "batch": 60}
    # the optional step only on time left over, up to its limit
    assert gpu_harness.allot(steps, 500) == {"smoke": 100, "batch": 80, "fleet": 120, "tests": 60, "startup": 90}
    assert gpu_harness.allot(steps[1:], 10) == {}


def test_the_prepared_calls_fit_their_budgets():
    """Every call installs the bundle first (BUNDLE_INSTALL_S), then each step gets its whole limit."""
    end = gpu_harness.END_RESERVE_S + gpu_harness.BUNDLE_INSTALL_S
    for call, names in gpu_harness.CALLS.items():
        fixed = sum(gpu_harness.STEPS[n].limit_s for n in names if not gpu_harness.STEPS[n].optional)
        assert fixed + end <= gpu_harness.BUDGETS[call], call
        assert gpu_harness.allot([gpu_harness.STEPS[n] for n in names], gpu_harness.BUDGETS[call] - end).keys() >= \
            {n for n in names if not gpu_harness.STEPS[n].optional}, call
    for limits, budget in ((gpu_harness.REHEARSAL_LIMITS, gpu_harness.REHEARSAL_BUDGETS["full"]),
                           (gpu_harness.SHORT_LIMITS, gpu_harness.REHEARSAL_BUDGETS["short"])):
        for names in gpu_harness.CALLS.values():
            fixed = sum(limits[n][0] for n in names if not gpu_harness.STEPS[n].optional)
            assert fixed + end <= budget
    # the image rehearsal runs the first call's command line as written: its budget
    assert gpu_harness.REHEARSAL_BUDGETS["full"] == gpu_harness.BUDGETS["first"]


def test_the_fleet_step_leaves_its_start_up_the_time_the_last_gpu_start_took():
    """8 workers ready took 145 s on the H200 (docs/performance.md); the step's budget less its grace,
    the levels' windows (c = 128 and c = 256 whole) and the stop's reserve must leave at least that."""
    from loadtest import gpu_fleet

    step = gpu_harness.STEPS["fleet"]
    levels = [int(c) for c in gpu_harness.FLEET_LEVELS.split(",")]
    need = gpu_fleet.levels_need_s(levels, set(levels[1:]), gpu_harness.FLEET_WINDOW_S, 5.0)
    for seconds in (step.limit_s, step.floor_s):
        startup = seconds - gpu_harness.grace_of(step, seconds) - 15 - need
        assert startup >= 145, (seconds, startup)


def test_the_performance_page_gives_the_prepared_calls_with_the_codes_budgets_inside_their_limits():
    """docs/performance.md's run tool calls: the harness's budget inside the `timeout` around it,
    inside the call's timeout_s, and the first call within 9 minutes."""
    text = (REPO / "docs" / "performance.md").read_text()
    calls = re.findall(r"command: `timeout -k (\d+) (\d+) python3 -m loadtest\.bench\.gpu_harness --out \$OUT "
                       r"--call (\w+) --budget-s (\d+)`\n- timeout_s: `(\d+)`\n- carry: `\[\"\.fleet\"\]`", text)
    assert {c[2] for c in calls} == set(gpu_harness.CALLS), calls
    for kill, timeout, call, budget, timeout_s in calls:
        assert float(budget) == gpu_harness.BUDGETS[call]
        assert float(budget) + 5 <= int(timeout) and int(timeout) + int(kill) <= int(timeout_s) <= 600
    first = next(c for c in calls if c[2] == "first")
    assert int(first[4]) <= 540
    for name in gpu_harness.CALLS["first"] + gpu_harness.CALLS["second"]:  # the page's step tables: the code's limits
        step = gpu_harness.STEPS[name]
        limit = f"what is left, up to {step.limit_s:.0f}" if step.optional else f"{step.limit_s:.0f}"
        assert f"| {name} | {step.priority} | {limit} ({step.floor_s:.0f}) |" in text, name


def test_the_steps_after_the_smoke_take_their_fallback_from_it(tmp_path):
    ctx = gpu_harness.Context(out=tmp_path, work=tmp_path, fleet_bundle=tmp_path)
    ok = {"configuration": {"compile_cache_dir": "/cache/here"}, "compile": {"wanted": True, "ok": True},
          "graphs": {"single": {"wanted": True, "ok": True}, "batch": {"wanted": False, "ok": False}}}

    def command(name, smoke):
        ctx.smoke = smoke
        return gpu_harness.step_command(name, ctx, 150)

    def flag(command, name):
        return command[command.index(name) + 1]

    batch = command("batch", ok)
    assert (flag(batch, "--compiled"), flag(batch, "--cuda-graphs"), flag(batch, "--batch-graphs")) == ("on", "on", "on")
    assert flag(batch, "--batch") == "8,32" and flag(batch, "--batch-phonemes") == "120" and flag(batch, "--lone") == "60"
    fleet = command("fleet", ok)
    assert flag(fleet, "--compile-cache-dir") == "/cache/here" and "--compile" in fleet and "--cuda-graphs" in fleet
    assert flag(fleet, "--levels") == "1,128,256"
    assert "-k" not in command("tests", ok)
    ctx.batch_family_ok = False  # the batch step's compiled engine never got ready: the compiled tests would compile
    assert flag(command("tests", ok), "-k") == "not compiled"
    ctx.batch_family_ok = None

    failed = {**ok, "compile": {"wanted": True, "ok": False, "error": "BackendCompilerFailed"}}
    batch = command("batch", failed)
    assert flag(batch, "--compiled") == "off"
    assert "--no-compile" in command("fleet", failed)
    assert flag(command("tests", failed), "-k") == "not compiled"
    assert "compile failed" in gpu_report.fallback(failed, cpu=False)["why"]

    no_capture = {**ok, "graphs": {"single": {"wanted": True, "ok": False, "error": "capture failed"}}}
    batch = command("batch", no_capture)
    assert (flag(batch, "--compiled"), flag(batch, "--cuda-graphs")) == ("on", "off")
    assert "--no-cuda-graphs" in command("fleet", no_capture)
    unfinished = command("batch", None)  # no smoke figures at all: eager, no graphs
    assert (flag(unfinished, "--compiled"), flag(unfinished, "--cuda-graphs")) == ("off", "off")


def test_a_rehearsal_runs_the_same_steps_on_the_cpu(tmp_path):
    ctx = gpu_harness.Context(out=tmp_path, work=tmp_path, device="cpu", weights="tiny", rehearsal=True,
                              smoke={"compile": {"wanted": True, "ok": True}, "graphs": {}})
    for name in gpu_harness.CALLS["first"] + gpu_harness.CALLS["second"]:
        command = gpu_harness.step_command(name, ctx, 100)
        assert "cuda" not in command, name
    assert gpu_harness.step_environment(ctx)["TORCH_COMPILE_OVERRIDE_BACKENDS"] == ">=0:eager"
    # the bundle is installed once by the harness: the fleet step runs on what it installed
    assert gpu_harness.step_command("fleet", ctx, 100)[3:5] == ["--bundle", "none"]
    fleet = gpu_harness.step_command("fleet", ctx, 100)
    assert fleet[fleet.index("--levels") + 1] == gpu_harness.FLEET_LEVELS


def test_pytest_results_come_from_its_lines_when_it_was_stopped_before_the_xml(tmp_path):
    (tmp_path / "tests.log").write_text(
        "tests/unit/test_engine_gpu.py::test_graphed_matches_eager[10] PASSED                   [ 10%]\n"
        "tests/unit/test_engine_gpu.py::test_graphed_matches_eager[40] FAILED                   [ 20%]\n"
        "tests/unit/test_engine_gpu.py::test_compiled_batch_graphs_cover_their_grid_within_the_bound ")
    results = gpu_report.pytest_results(tmp_path / "tests.xml", tmp_path / "tests.log")
    assert (results["tests"], results["failures"]) == (2, 1)
    assert results["failed"] == ["tests/unit/test_engine_gpu.py::test_graphed_matches_eager[40]"]
    assert "FAILED tests/unit/test_engine_gpu.py::test_graphed_matches_eager[40]" in "\n".join(
        gpu_report.tests_markdown(results))


def _run_report(compiled=True, captured=30, batch=0, error=None):
    return {"device": "cuda", "card": "NVIDIA H100 80GB HBM3", "torch": "2.11.0+cu130", "dtype": "bf16",
            "compiled": compiled, "stage2": "exact",
            "graphs": {"single": {"wanted": True, "captured": captured, "error": error, "replays": 7},
                       "batch": {"wanted": batch > 0, "captured": batch, "error": None, "replays": 12}},
            "compile": {"loaded": True, "seconds": 9.5, "graphs_compiled": 0, "graphs_loaded": 2,
                        "dynamo_compiles": 2, "recompiles": []} if compiled else None}


def test_every_figure_says_how_it_ran(tmp_path):
    def by(audio_s_per_s, p50):
        return {"audio_s_per_s": audio_s_per_s, "latency_p50_s": p50, "audio_s_per_cpu_s": 1.0}

    (tmp_path / "batch.json").write_text(json.dumps({
        "meta": {"dtype": "bf16", "batch_phonemes": 120, "gpu": "NVIDIA H100 80GB HBM3", "stage2": "exact",
                 "torch": "2.11.0+cu130", "engines": {"eager": _run_report(compiled=False, captured=0),
                                                      "served": _run_report(batch=94)},
                 "compiled": {"loaded": True, "batch_graphs": {"count": 94, "batch_buckets": [2, 4, 8, 16, 32],
                                                               "capture_s": 33.0, "mib": 40.0, "reserved_mib": 7000.0}}},
        "batch": {"32": {"batched": by(639.0, 0.4), "served": by(2500.0, 0.109), "one_by_one": by(279.0, 1.0),
                         "speedup": 8.96}},
        "lone": {"phonemes": 60, "runs": 20, "audio_s": 4.65, "p50_s": 0.0121, "p95_s": 0.0130}}))
    (tmp_path / "smoke.json").write_text(json.dumps({
        "phase": "done", "configuration": {"dtype": "bf16", "device": "cuda", "compile": True},
        "compile": {"wanted": True, "ok": True, "loaded": False, "seconds": 61.0, "graphs_compiled": 1,
                    "graphs_loaded": 0, "dynamo_compiles": 1, "recompiles": [],
                    "recompile_reasons": ["Recompiling function decode: tensor 'noise' stride mismatch"]},
        "graphs": {"single": {"wanted": True, "ok": True, "captured": 30}, "batch": {"wanted": False}},
        "checks": {"rows": [{"what": "graphed vs eager, one chunk of 60 phonemes", "ok": True,
                             "detail": "durations equal True, identical True"}]},
        "artifacts": {"saved": "/out/compile-artifacts.bin", "bytes": 3 << 20}, "ready_s": 80.0, "weights_s": 9.0}))
    figures = gpu_report.collect(tmp_path, {"steps": {"batch": {"status": "ok", "seconds": 80.0, "limit_s": 150}},
                                            "environment": {"gpu": "NVIDIA H100 80GB HBM3", "torch": "2.11.0+cu130"}})
    report = gpu_report.markdown(figures)
    assert "# GPU harness: NVIDIA H100 80GB HBM3" in report and "| batch | ok | 80.0 | 150 |" in report
    assert "| 32 | 639 | 2500 | 109.0 | 279 | 8.96x |" in report
    assert "p50 **12.1 ms**" in report
    assert ("- served: bf16 on NVIDIA H100 80GB HBM3, torch 2.11.0+cu130; compiled; stage 2 exact; 30 single graphs "
            "captured, 7 replays; 94 batch graphs captured, 12 replays; compile: loaded in 9.5 s") in report
    assert "- eager: bf16 on NVIDIA H100 80GB HBM3, torch 2.11.0+cu130; eager (not compiled)" in report
    assert "| compile | ok: compiled in 61.0 s (1 graphs compiled, 0 loaded" in report
    assert "| recompile reason | `Recompiling function decode: tensor 'noise' stride mismatch` |" in report
    assert "| graphed vs eager, one chunk of 60 phonemes | ok: durations equal True, identical True |" in report
    assert "| compile cache artifacts | /out/compile-artifacts.bin (3.0 MiB) |" in report
    assert "Batch graphs: 94 (batch buckets [2, 4, 8, 16, 32]) captured in 33.0 s, 40 MiB allocated, 7000 MiB" in report
    failed = gpu_report.how_it_ran(_run_report(captured=0, error="RuntimeError: capture failed"))
    assert "single graphs FAILED (RuntimeError: capture failed)" in failed


def test_the_start_up_table_gives_each_engine_and_how_it_ran(tmp_path):
    (tmp_path / "startup.json").write_text(json.dumps({
        "workers": 2, "all_ready_s": 41.0, "together": [
            {"loaded": False, "compile_s": 61.0, "waited_s": 0.0, "ready_s": 80.0, "reserved_mib": 5000.0,
             "engine": _run_report()},
            {"error": "exited with 1 before it was ready"}]}))
    report = gpu_report.markdown(gpu_report.collect(tmp_path, {"steps": {}, "environment": {"gpu": "H100"}}))
    assert "| together #0 | compiled | 61.0 | 0.0 | 80.0 | 5000 | bf16 on NVIDIA H100 80GB HBM3" in report
    assert "| together #1 | FAILED exited with 1 before it was ready |" in report
    assert "Every engine ready or failed after 41.0 s" in report


def test_compile_artifacts_are_kept_when_they_fit_and_loaded_before_anything_compiles(tmp_path, monkeypatch):
    """torch.compiler's Mega-Cache (torch 2.7 on, 2.11 on the GPU box): saved where a step compiled
    and it fits what comes back from a device call, said why not otherwise; a folder's files loaded
    into the compile cache the engines use. (A real inductor compile takes a minute here.)"""
    from loadtest.bench import compile_artifacts

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "before"))  # use_compile_dir sets it; put back
    compiled = {"compile": {"graphs_compiled": 1}}
    monkeypatch.setattr(torch.compiler, "save_cache_artifacts", lambda: (b"mega" * 10, "info"), raising=False)
    kept = compile_artifacts.save_artifacts(tmp_path / "compile-artifacts-smoke.bin", compiled)
    assert kept["bytes"] == 40 and (tmp_path / "compile-artifacts-smoke.bin").read_bytes() == b"mega" * 10
    assert compile_artifacts.save_artifacts(tmp_path / "x.bin", {"compile": {"graphs_compiled": 0}})["saved"] is None
    monkeypatch.setattr(torch.compiler, "save_cache_artifacts", lambda: (b"\0" * gpu_report.FILE_LIMIT, "info"))
    too_big = compile_artifacts.save_artifacts(tmp_path / "big.bin", compiled)
    assert too_big["saved"] is None and "over the 16 MiB" in too_big["why"] and not (tmp_path / "big.bin").exists()
    loaded = []
    monkeypatch.setattr(torch.compiler, "load_cache_artifacts", lambda data: loaded.append(data) or "info",
                        raising=False)
    said = compile_artifacts.load_artifacts(tmp_path, tmp_path / "cache")
    assert loaded == [b"mega" * 10] and "compile-artifacts-smoke.bin" in said
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "cache")
    monkeypatch.delattr(torch.compiler, "save_cache_artifacts")
    assert "has no torch.compiler.save_cache_artifacts" in compile_artifacts.save_artifacts(tmp_path / "y.bin", compiled)["why"]


class _GraphedEngine:
    """What the smoke's checks touch of a CUDA engine: graphs that replay, eager runs without them
    (`drift`: how far the eager audio strays from the replay)."""

    max_batch = 4

    def __init__(self, drift=0.0, other_durations=False):
        self.graphs, self.batch_graphs = "single graphs", "batch graphs"
        self.drift, self.other_durations = drift, other_durations

    def _run(self, ids):
        import numpy as np

        from worker.engine import Synthesis

        eager = self.graphs is None
        audio = np.sin(np.arange(600 * len(ids), dtype=np.float32) / 7.0) + (self.drift if eager else 0.0)
        durations = np.full(len(ids) + 2, 2 + int(eager and self.other_durations))
        return Synthesis(audio=audio.astype(np.float32), durations=durations)

    def synthesize(self, ids, style, speed=1.0):
        return self._run(ids)

    def synthesize_batch(self, items):
        assert (self.graphs is None) == (self.batch_graphs is None)
        return [self._run(item.ids) for item in items]


def test_the_smokes_replay_check_sets_the_graphs_aside_for_the_eager_run_and_puts_them_back():
    from types import SimpleNamespace

    from loadtest.bench import gpu_smoke
    from loadtest.bench.engine_bench import PASSAGE

    weights = SimpleNamespace(config={"vocab": {p: k + 1 for k, p in enumerate(sorted(set(PASSAGE)))}},
                              voices={"v": torch.zeros(510, 256)})
    engine = _GraphedEngine()
    rows = list(gpu_smoke.checks(engine, None, weights))
    assert [r["what"] for r in rows] == ["graphed vs eager, one chunk of 60 phonemes",
                                         "graphed vs eager, one chunk of 250 phonemes", "graphed vs eager, a batch of 4"]
    assert all(r["ok"] for r in rows) and rows[0]["identical"]
    assert (engine.graphs, engine.batch_graphs) == ("single graphs", "batch graphs")
    assert not any(r["ok"] for r in gpu_smoke.checks(_GraphedEngine(drift=0.05), None, weights))  # ~20 dB: not rounding
    assert not any(r["ok"] for r in gpu_smoke.checks(_GraphedEngine(other_durations=True), None, weights))


def test_what_comes_back_from_the_device_is_checked(tmp_path):
    for k in range(9):
        (tmp_path / f"f{k}.json").write_text("{}")
    (tmp_path / "big.bin").write_bytes(b"\0" * gpu_report.FILE_LIMIT)
    problems = gpu_report.out_problems(tmp_path)
    assert any("big.bin is 16.0 MiB" in p for p in problems) and any("10 files" in p for p in problems)


def test_the_fleets_own_log_comes_back_beside_the_report(tmp_path):
    """Only DIR comes back from a GPU box: the fleet step's log (the serve log's head, tail and
    start-up lines) must be copied there, or a slow start or a failure leaves no trace."""
    work, out = tmp_path / "work", tmp_path / "out"
    (work / "fleet").mkdir(parents=True)
    out.mkdir()
    gpu_report.write(out, work, {"steps": {}, "environment": {}})
    assert not (out / "fleet.log").exists()
    (work / "fleet" / "gpu_fleet.log").write_text("model ready in 101.8 s\n")
    gpu_report.write(out, work, {"steps": {}, "environment": {}})
    assert (out / "fleet.log").read_text() == "model ready in 101.8 s\n"
    assert sorted(p.name for p in out.iterdir()) == ["fleet.log", "gpu_results.json", "gpu_results.md"]


def test_a_short_rehearsal_of_the_first_call_runs_every_step_and_writes_the_report(tmp_path):
    """`--rehearse-cpu --short`: the first call's steps, code and plumbing on this CPU (tiny weights,
    no graphs, compiled passes off; the full rehearsal compiles).
    About a minute on a quiet 2-core machine, several beside other jobs."""
    out = tmp_path / "out"
    done = subprocess.run([sys.executable, "-m", "loadtest.bench.gpu_harness", "--rehearse-cpu", "--short", "--out",
                           str(out), "--fleet-bundle", str(tmp_path / "no-bundle")], cwd=REPO,
                          env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True, timeout=600)
    report = json.loads((out / "gpu_results.json").read_text())
    steps = report["steps"]
    assert list(steps) == [n for n in gpu_harness.CALLS["first"] if not gpu_harness.STEPS[n].optional], done.stdout[-3000:]
    for name in ("smoke", "batch", "fleet"):
        assert steps[name]["status"] == "ok", (name, steps[name], done.stdout[-3000:])
    smoke = json.loads((out / "smoke.json").read_text())
    assert smoke["phase"] == "done" and smoke["configuration"]["device"] == "cpu"
    assert smoke["compile"]["wanted"] is False and smoke["engine"]["compiled"] is False
    assert report["batch"]["meta"]["engines"]["served"]["card"] == report["environment"]["host_cpu"]
    assert report["batch"]["lone"]["runs"] == 5 and "1" in report["fleet"]["meta"]["levels"].__str__()
    assert report["fleet"]["levels"][0]["ok"] > 0 and report["fleet"]["levels"][0]["errors"] == 0
    assert "Rehearsal on the CPU" in (out / "gpu_results.md").read_text()
    assert not gpu_report.out_problems(out)
    assert done.returncode == 0, done.stdout[-3000:]


def test_a_phase_counts_the_chunks_finished_inside_its_window():
    # (size, seconds, audio seconds, finished at): one before, three inside, one after the window
    chunks = [(60, 0.02, 4.0, 9.9), (60, 0.02, 4.0, 10.5), (510, 0.10, 38.0, 11.0), (60, 0.04, 4.0, 11.9),
              (510, 0.10, 38.0, 12.1)]
    phase = summarize_phase(chunks, replicas=2, start=10.0, end=12.0)
    assert phase["chunks"] == 3
    assert phase["audio_s_per_s"] == pytest.approx(46.0 / 2.0)
    assert phase["per_replica_audio_s_per_s"] == pytest.approx(46.0 / 4.0)
    assert phase["by_size"]["60"]["count"] == 2 and phase["by_size"]["60"]["p50_ms"] == pytest.approx(30.0)
    assert set(phase["by_size"]) <= {str(s) for s in CHUNK_MIX}
    assert summarize_phase([], replicas=1, start=0, end=1) == {"replicas": 1, "chunks": 0}


def test_cuda_engines_ask_for_float32_without_tf32_and_deterministic_cudnn():
    """The GPU showed what TF32 does to padded against unpadded runs (worker.engine); the flags are
    process-wide, so this puts them back."""
    flags = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32,
             torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark)
    try:
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = False, True
        use_exact_cuda_arithmetic()
        assert not torch.backends.cuda.matmul.allow_tf32 and not torch.backends.cudnn.allow_tf32
        assert torch.backends.cudnn.deterministic and not torch.backends.cudnn.benchmark
    finally:
        (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32,
         torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark) = flags


def test_the_faults_step_without_cuda_says_skipped_and_succeeds(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert gpu_faults.main(["--json", str(tmp_path / "faults.json")]) == 0
    assert json.loads((tmp_path / "faults.json").read_text()) == {"skipped": "no CUDA device"}
    assert "Skipped: no CUDA device." in capsys.readouterr().out
    with pytest.raises(SystemExit):  # one replica killed leaves none to watch
        gpu_faults.main(["--json", str(tmp_path / "faults.json"), "--replicas", "1"])


def test_a_survivors_chunks_are_counted_either_side_of_the_kill():
    chunks = [(9.0, "ok"), (9.5, "ok"), (10.0, "ok"), (10.2, "RuntimeError: CUDA error: unspecified launch failure"),
              (10.4, "RuntimeError: CUDA error: unspecified launch failure"), (10.6, "ok")]
    assert gpu_faults.split_at_kill(chunks, kill_at=10.0) == {
        "ok_before": 2, "failed_before": 0, "ok_after": 2, "failed_after": 2,
        "failures_after": ["RuntimeError: CUDA error: unspecified launch failure"]}
    assert gpu_faults.split_at_kill([], kill_at=0.0) == {"ok_before": 0, "failed_before": 0, "ok_after": 0,
                                                        "failed_after": 0}


def test_the_faults_report_shows_the_out_of_memory_pass_and_each_survivor():
    report = {
        "oom": {"batch": 8, "phonemes": 400, "single_before": "ok", "single_peak_mib": 900.0,
                "device_total_mib": 81559.0, "free_before_fill_mib": 79000.0, "headroom_mib": 2700.0,
                "filler_mib": 76300.0, "reserved_before_mib": 1500.0,
                "batch_filled": "OutOfMemoryError: CUDA out of memory. Tried to allocate 3.52 GiB",
                "reserved_after_failure_mib": 77800.0, "one_at_a_time_filled": ["ok"] * 7 + ["OutOfMemoryError: x"],
                "batch_after_free": "ok", "single_after_free": "ok", "replica_idle_after": True},
        "mps": {"replicas": 3, "seconds": 8.0, "mps_active": True, "killed": {"exit_code": -9, "at_s": 4.0},
                "survivors": {"1": {"ok_before": 40, "failed_before": 0, "ok_after": 38, "failed_after": 0,
                                    "exit_code": 0},
                              "2": {"ok_before": 41, "failed_before": 0, "ok_after": 3, "failed_after": 30,
                                    "failures_after": ["RuntimeError: CUDA error: unspecified launch failure"],
                                    "exit_code": 0}},
                "respawned": {"started": False, "error": "a replica exited with code 1"},
                "mps_clients_before": {"4242": ["1", "2", "3"]}, "mps_clients_after_kill": {"4242": ["2", "3"]}},
    }
    text = gpu_faults.markdown(report)
    assert "76300 MiB of 81559 MiB filled, 2700 MiB left" in text
    assert "batch of 8, memory filled: OutOfMemoryError: CUDA out of memory. Tried to allocate 3.52 GiB" in text
    assert "7 of 8 ok; OutOfMemoryError: x" in text and "memory freed: batch ok, single chunk ok" in text
    assert "SIGKILL of one of 3 replicas under MPS, 4.0 s into a 8 s run (exit code -9)" in text
    assert "| 1 | 40 | 0 | 38 | 0 | 0 | - |" in text
    assert "| 2 | 41 | 0 | 3 | 30 | 0 | RuntimeError: CUDA error: unspecified launch failure |" in text
    assert "A replica started after the kill: FAILED: a replica exited with code 1" in text
    assert "after it {'4242': ['2', '3']}" in text


def test_survivors_are_read_each_once_and_one_that_dies_too_says_so():
    import queue
    from types import SimpleNamespace

    results = queue.Queue()
    results.put(("chunks", {"index": 2, "chunks": [(1.0, "ok"), (3.0, "ok")]}))
    results.put(("error", {"index": 3, "error": "RuntimeError: CUDA error: an illegal memory access"}))
    processes = [SimpleNamespace(exitcode=-9), SimpleNamespace(exitcode=1), SimpleNamespace(exitcode=0),
                 SimpleNamespace(exitcode=0)]
    survivors = gpu_faults._survivors(results, processes, victim=0, kill_at=2.0, deadline=time.perf_counter() + 30)
    assert survivors == {1: {"error": "exited with code 1 before it reported"},
                         2: {"ok_before": 1, "failed_before": 0, "ok_after": 1, "failed_after": 0},
                         3: {"error": "RuntimeError: CUDA error: an illegal memory access"}}


def test_the_bundle_is_installed_once_at_the_start_for_every_step(tmp_path, monkeypatch):
    """A carried bundle's wheel the machine lacks is installed before the first step, and every
    step's environment imports it."""
    import zipfile

    bundle = tmp_path / "bundle"
    (bundle / "wheels").mkdir(parents=True)
    with zipfile.ZipFile(bundle / "wheels" / "kokoro_bundle_probe-1.0-py3-none-any.whl", "w") as z:
        z.writestr("kokoro_bundle_probe/__init__.py", "WHERE = __file__\n")
        z.writestr("kokoro_bundle_probe-1.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: kokoro-bundle-probe\n"
                                                                 "Version: 1.0\n")
        z.writestr("kokoro_bundle_probe-1.0.dist-info/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\n"
                                                              "Tag: py3-none-any\n")
        z.writestr("kokoro_bundle_probe-1.0.dist-info/RECORD", "")
    out, work = tmp_path / "out", tmp_path / "work"
    out.mkdir()
    work.mkdir()
    for name in ("first", "second"):
        monkeypatch.setitem(gpu_harness.STEPS, name, gpu_harness.Step(name, 1, 60, 10))
    monkeypatch.setattr(gpu_harness, "step_command", lambda name, ctx, seconds: [
        sys.executable, "-c", f"import kokoro_bundle_probe; print('{name} imports', kokoro_bundle_probe.WHERE)"])
    ctx = gpu_harness.Context(out=out, work=work, device="cpu", fleet_bundle=bundle, smoke_planned=False)
    assert gpu_harness.run_call(ctx, ["first", "second"], 200) == 0
    log = (out / "harness.log").read_text()
    assert log.count("bundle: installed") == 1 and log.index("bundle: installed") < log.index("first imports")
    assert f"second imports {work / 'site'}" in log
    report = json.loads((out / "gpu_results.json").read_text())
    assert report["bundle"]["status"] == "installed"
    assert report["bundle"]["wheels"]["kokoro-bundle-probe"] == "install 1.0 (missing)"


def test_a_smoke_that_failed_before_its_engine_was_ready_says_where_and_why(tmp_path):
    """The fallback names the phase and the exception's last line, in the step table and in the
    report's first lines."""
    smoke = {"phase": "weights", "failed_phase": "weights", "configuration": {"compile_cache_dir": "/c"},
             "error": "ModuleNotFoundError: No module named 'num2words'"}
    fb = gpu_report.fallback(smoke, cpu=False)
    assert (fb["compiled"], fb["graphs"]) == (False, False)
    assert fb["why"] == ("the smoke failed in its weights phase (ModuleNotFoundError: No module named 'num2words'): "
                         "eager passes, no graphs")
    killed = gpu_report.fallback({"phase": "warmup", "compile": {}}, cpu=False)["why"]
    assert "warmup phase (no exception: stopped at its limit)" in killed
    failed_compile = {"phase": "done", "compile": {"wanted": True, "ok": False,
                                                   "error": "Traceback ...\nBackendCompilerFailed: boom"}}
    assert "(BackendCompilerFailed: boom)" in gpu_report.fallback(failed_compile, cpu=False)["why"]
    text = gpu_report.markdown({"steps": {"smoke": {"status": "failed (rc 1)"},
                                          "batch": {"status": "ok", "fallback": fb["why"]}}, "environment": {}})
    assert fb["why"] in "\n".join(text.splitlines()[:4])


def test_the_smoke_writes_its_phase_and_the_exceptions_last_line_before_it_fails(tmp_path, monkeypatch):
    from loadtest.bench import gpu_smoke

    def fails(args, report, save):
        report["phase"] = "weights"
        raise ModuleNotFoundError("No module named 'num2words'")

    monkeypatch.setattr(gpu_smoke, "smoke_phases", fails)
    with pytest.raises(ModuleNotFoundError):
        gpu_smoke.main(["--json", str(tmp_path / "smoke.json"), "--device", "cpu", "--weights", "tiny"])
    smoke = json.loads((tmp_path / "smoke.json").read_text())
    assert smoke["failed_phase"] == "weights"
    assert smoke["error"] == "ModuleNotFoundError: No module named 'num2words'"
