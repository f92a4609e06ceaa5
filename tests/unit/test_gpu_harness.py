"""The GPU harness's plumbing, on the CPU: step limits, the replica sweep's and the faults step's
figures, the report, and the CUDA arithmetic the engine asks for (the GPU side itself runs on a
lent GPU only)."""

from __future__ import annotations

import json
import sys
import time

import pytest
import torch

from loadtest.bench import gpu_faults, gpu_harness
from worker.engine import use_exact_cuda_arithmetic
from loadtest.bench.replica_sweep import CHUNK_MIX, summarize_phase


def test_a_step_past_its_limit_is_stopped_and_reported_and_the_next_still_runs(tmp_path):
    harness = gpu_harness.Harness(tmp_path, budget_s=60)
    harness.run("hangs", [sys.executable, "-c", "import time; print('started', flush=True); time.sleep(60)"], cap=2)
    harness.run("fails", [sys.executable, "-c", "raise SystemExit(3)"], cap=10)
    harness.run("works", [sys.executable, "-c", "print('fine')"], cap=10)
    steps = harness.summary["steps"]
    assert steps["hangs"]["status"] == "timed out" and steps["hangs"]["seconds"] < 10
    assert steps["fails"]["status"] == "failed (rc 3)"
    assert steps["works"]["status"] == "ok"
    log = (tmp_path / "harness.log").read_text()
    assert "started" in log and "fine" in log


def test_a_step_is_skipped_once_the_budget_is_spent(tmp_path):
    harness = gpu_harness.Harness(tmp_path, budget_s=10)  # under the 20 s a step needs at least
    harness.run("late", [sys.executable, "-c", "print('never')"], cap=10)
    assert harness.summary["steps"]["late"] == {"status": "skipped", "why": "out of time"}


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


def test_the_report_shows_each_steps_figures_and_names_the_failures(tmp_path):
    work = tmp_path
    (work / "check.json").write_text(json.dumps({
        "parity": [{"tokens": 100, "replays_padded_eager_exactly": True, "durations_equal": True, "snr_db": 46.4,
                    "lsd_db": 0.072, "frames": 400}],
        "precision": [{"dtype": "bf16", "tokens": 30, "durations_within_1": 1.0, "lsd_db": 1.06}],
        "capture": {"bf16": {"seconds": 7.6, "mib": 111, "stage1_graphs": 6, "stage2_graphs": 24}, "fp16": None},
        "noise_reproducible": True, "failures": ["fp16 CUDA graph capture failed (see the log)"]}))
    (work / "replicas.json").write_text(json.dumps([{
        "mps": True, "chunk_mix": list(CHUNK_MIX), "replicas_ready": [{}] * 8, "gpu_mib_per_replica": 6094.0,
        "gpu_used_mib_before": 4.0, "gpu_used_mib_after": 48756.0, "startup_s": 40.0,
        "phases": [{"replicas": 8, "chunks": 100, "audio_s_per_s": 561.4, "per_replica_audio_s_per_s": 70.2,
                    "latency_p50_ms": 160.9, "latency_p95_ms": 448.9, "by_size": {"60": {"p50_ms": 90.0}},
                    "sm_pct": 100.0}]}]))
    figures = gpu_harness.collect(work, {"steps": {"check": {"status": "failed (rc 1)", "seconds": 129.2}},
                                         "environment": {"gpu": "NVIDIA H200", "torch": "2.11"}})
    report = gpu_harness.markdown(figures)
    assert "# GPU harness: NVIDIA H200" in report
    assert "| check | failed (rc 1) | 129.2 |" in report
    assert "log-spectral distance 0.072 dB" in report and "SNR 46.4 dB" in report
    assert "| fp16 | FAILED |" in report
    assert "FAILED: fp16 CUDA graph capture failed" in report
    assert "| on | 8 | 561 | 70 | 160.9 | 448.9 | 90.0 | 100 |" in report
    assert "GPU memory per replica 6094 MiB" in report


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


def test_the_replica_step_measures_the_counts_and_mps_modes_asked_for(tmp_path):
    command, _ = gpu_harness.steps(tmp_path, tmp_path / ".fleet", replica_counts="8,12,16", mps="on")["replicas"]
    assert command[command.index("--counts") + 1] == "8,12,16"
    assert command[command.index("--mps") + 1] == "on"
    default, _ = gpu_harness.steps(tmp_path, tmp_path / ".fleet")["replicas"]
    assert default[default.index("--mps") + 1] == "both"
    assert default[default.index("--counts") + 1] == "1,2,4,8,12,16"


def test_the_fleets_own_log_comes_back_beside_the_report(tmp_path):
    """Only DIR comes back from a GPU box: the fleet step's log (the serve log's head, tail and
    start-up lines) must be copied there, or a slow start or a failure leaves no trace."""
    work, out = tmp_path / "work", tmp_path / "out"
    (work / "fleet").mkdir(parents=True)
    out.mkdir()
    gpu_harness.keep_logs(work, out)  # nothing yet: nothing copied, no error
    assert not list(out.iterdir())
    (work / "fleet" / "gpu_fleet.log").write_text("model ready in 101.8 s\n")
    gpu_harness.keep_logs(work, out)
    assert (out / "fleet.log").read_text() == "model ready in 101.8 s\n"


def test_the_faults_step_writes_its_figures_where_the_report_reads_them_and_they_come_back(tmp_path):
    command, cap = gpu_harness.steps(tmp_path, tmp_path / ".fleet")["faults"]
    assert command[1:3] == ["-m", "loadtest.bench.gpu_faults"] and cap <= 150
    written = command[command.index("--json") + 1]
    assert written == str(tmp_path / "faults.json")
    assert int(command[command.index("--replicas") + 1]) >= 2
    (tmp_path / "faults.json").write_text(json.dumps({"skipped": "no CUDA device"}))
    figures = gpu_harness.collect(tmp_path, {"steps": {"faults": {"status": "ok", "seconds": 1.0}},
                                             "environment": {"gpu": None}})
    assert figures["faults"] == {"skipped": "no CUDA device"}
    assert "## Faults" in gpu_harness.markdown(figures) and "Skipped: no CUDA device." in gpu_harness.markdown(figures)
    out = tmp_path / "out"
    out.mkdir()
    gpu_harness.keep_logs(tmp_path, out)
    assert json.loads((out / "faults.json").read_text()) == {"skipped": "no CUDA device"}


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
