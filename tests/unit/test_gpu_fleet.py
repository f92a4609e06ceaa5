"""loadtest/gpu_fleet.py's pieces that need no GPU, bundle or server: which wheels it installs,
the results it writes whatever stage it stopped at, and that it imports nothing beyond the standard
library before the bundle is installed."""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from loadtest import gpu_fleet


def _wheel(directory: Path, dist: str, version: str) -> Path:
    path = directory / f"{dist.replace('-', '_')}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(f"{dist.replace('-', '_')}/__init__.py", "")
    return path


def test_installs_what_is_missing_or_older_and_pydantic_with_its_core(tmp_path, monkeypatch):
    have = {"fastapi": None, "anyio": "4.20.0", "typing-extensions": "4.10.0", "pydantic": "2.14.4",
            "pydantic-core": "2.40.0"}
    monkeypatch.setattr(gpu_fleet, "_installed_version", lambda dist: have[dist])
    wheels = [_wheel(tmp_path, "fastapi", "0.165.0"), _wheel(tmp_path, "anyio", "4.16.0"),
              _wheel(tmp_path, "typing_extensions", "4.16.0"), _wheel(tmp_path, "pydantic", "2.14.4"),
              _wheel(tmp_path, "pydantic_core", "2.50.5")]
    chosen, why = gpu_fleet.choose_wheels(wheels)
    assert {gpu_fleet._dist_of(w) for w in chosen} == {"fastapi", "typing-extensions", "pydantic-core", "pydantic"}
    assert why["anyio"].startswith("keep the box's 4.20.0")
    assert why["pydantic"].startswith("install (with pydantic-core")


def test_version_order():
    key = gpu_fleet._version_key
    assert key("4.9.0") < key("4.16.0") < key("4.16.1") and key("0.5.14") > key("0.5.9")
    assert key("2026.10.19.post1") > key("2026.10.19")


def test_results_are_written_whatever_stage_it_stopped_at(tmp_path):
    result = {"meta": {"workers": 8, "engine": "torch", "weights": "random-full", "random_weights": True},
              "levels": [{"concurrency": 1, "error": "no summary.json (exit 1)"}], "notes": [],
              "error": "RuntimeError: serve exited with 1 while starting"}
    gpu_fleet.write_results(tmp_path, result)
    assert json.loads((tmp_path / gpu_fleet.OUT_JSON).read_text())["error"].startswith("RuntimeError")
    md = (tmp_path / gpu_fleet.OUT_MD).read_text()
    assert "RANDOM weights" in md and "Stopped early" in md and "no summary.json" in md
    level = {"concurrency": 8, "ok": 10, "rejected_503": 2, "errors": 0, "requests_per_s": 1.5,
             "audio_s_per_wall_s": 30.0, "mean_in_flight": 7.9, "gpu": {"util_pct_mean": 50.0, "util_pct_max": 90.0,
                                                                       "mem_used_mib_max": 20000.0},
             **{k: {"p50": 0.1, "p95": 0.2, "p99": 0.3} for k in ("ttfa_s", "e2e_s", "rtf")}}
    gpu_fleet.write_results(tmp_path, {**result, "levels": [level], "error": None})
    assert "| 8 | 10 | 2 | 0 | 1.50 | 30.0 | 100 | 200 | 300 |" in (tmp_path / gpu_fleet.OUT_MD).read_text()


def test_the_script_imports_only_the_standard_library():
    """The project's own modules it imports are loadtest's and api.ports (the one free_port, which
    imports only the standard library); nothing else is installed where it runs."""
    code = ("import sys; before = set(sys.modules); import loadtest.gpu_fleet; new = set(sys.modules) - before; "
            "extra = {m.split('.')[0] for m in new} - set(sys.stdlib_module_names) - {'loadtest', 'api'}; "
            "print(sorted(extra), sorted(m for m in new if m.split('.')[0] == 'api'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).resolve().parents[2]).stdout.strip()
    assert out == "[] ['api', 'api.ports']"


def test_the_bundle_carries_no_cjk_dictionaries_and_what_serving_imports_at_start():
    from loadtest import gpu_image

    carried, _ = gpu_image.read_plan()
    assert not {"jieba", "pypinyin", "unidic-lite", "fugashi", "cn2an"} & set(carried)
    assert {"num2words", "fastapi-offline", "fastapi", "uvicorn", "redis", "av", "misaki"} <= set(carried)


def test_c128_and_c256_get_their_whole_window_and_c1_what_is_left():
    full, levels = {128, 256}, [1, 128, 256]
    need = gpu_fleet.levels_need_s(levels, full, 15, 5)
    overhead = gpu_fleet.LEVEL_OVERHEAD_S
    assert need == 5 + 15 + 15 + 3 * overhead
    # plenty: c = 1 its whole window too
    assert gpu_fleet.level_window(1, [128, 256], full, 200, 15, 5) == 15
    # short: c = 1 shrinks, the full levels keep theirs
    left = 2 * (15 + overhead) + 7 + overhead
    assert gpu_fleet.level_window(1, [128, 256], full, left, 15, 5) == 7
    assert gpu_fleet.level_window(128, [256], full, 2 * (15 + overhead), 15, 5) == 15
    # a full level that cannot have its window is skipped, not shortened; c = 1 under its least too
    assert gpu_fleet.level_window(256, [], full, 15 + overhead - 1, 15, 5) is None
    assert gpu_fleet.level_window(1, [128, 256], full, 2 * (15 + overhead) + 4 + overhead, 15, 5) is None


@pytest.mark.parametrize("processes, listed", [("nvidia-cuda-mps-server\n", True),
                                               ("/opt/torch/.venv/bin/python3\n" * 8, False)])
def test_mps_is_read_from_the_gpus_processes_not_only_from_the_log(processes, listed, tmp_path, monkeypatch):
    """serve may log that a daemon runs while CUDA runs without it (a dead daemon's pipe): the
    report says what nvidia-smi lists too, and its markdown says plainly when the replicas time-slice."""
    smi = tmp_path / "nvidia-smi"
    smi.write_text(f"#!/bin/sh\ncat <<'END'\n{processes}END\n")
    smi.chmod(0o755)
    monkeypatch.setattr(gpu_fleet.shutil, "which", lambda name: str(smi) if name == "nvidia-smi" else None)
    state = gpu_fleet.mps_state("... INFO kokoro_fleet.serve: MPS: a daemon already runs (pipe /tmp/p): using it\n")
    assert state["serve_log"] == "MPS: a daemon already runs (pipe /tmp/p): using it"
    assert state["mps_server_listed"] is listed
    sentence = gpu_fleet.markdown({"mps": state})
    assert ("time-slice" in sentence) is (not listed)


def test_each_level_reports_its_refusals_per_second_and_redis_cpu_and_bytes(tmp_path, redis_server):
    """The report gives every level's 503s per second, its Retry-After, and the Redis's CPU share and
    bytes per second from two INFO readings (issue 39: is Redis the next wall?)."""
    port = int(redis_server.url.rsplit(":", 1)[1].split("/")[0])
    before = gpu_fleet.redis_info(port)
    assert set(before) == set(gpu_fleet.REDIS_FIGURES)
    import socket

    with socket.create_connection(("127.0.0.1", port)) as s:  # 100 kB in through the network counter
        s.sendall(b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$100000\r\n" + b"x" * 100_000 + b"\r\n")
        assert s.recv(16) == b"+OK\r\n"
    after = gpu_fleet.redis_info(port)
    load = gpu_fleet.redis_load(before, after, 2.0)
    assert 50_000 <= load["net_in_bytes_per_s"] < 52_000 and load["cpu_core_fraction"] >= 0
    assert gpu_fleet.redis_load(before, {}, 2.0) is None and gpu_fleet.redis_info(1) == {}

    level = {"concurrency": 64, "ok": 10, "rejected_503": 300, "errors": 0, "requests_per_s": 1.0,
             "audio_s_per_wall_s": 30.0, "mean_in_flight": 20.0, "gpu": None, "refused_per_s": 20.0,
             "redis": {"cpu_core_fraction": 0.25, "net_in_bytes_per_s": 3_000_000, "net_out_bytes_per_s": 12_000_000},
             **{k: {"p50": 0.1, "p95": 0.2, "p99": 0.3} for k in ("ttfa_s", "e2e_s", "rtf")},
             "retry_after_s": {"p50": 0.4, "p95": 1.2}}
    gpu_fleet.write_results(tmp_path, {"meta": {}, "levels": [level], "notes": []})
    md = (tmp_path / gpu_fleet.OUT_MD).read_text()
    assert "| 503/s | Retry-After p50/p95 ms | Redis CPU % of a core | Redis in/out MB/s |" in md
    assert md.rstrip().endswith("| 20.0 | 400/1200 | 25 | 3.0/12.0 |")


def test_how_the_replicas_started_is_read_from_serves_log():
    """Each engine's compile record (worker/compile_cache.py), a failed capture, and serve's replica
    plan (api/gpu_sharing.py: without MPS one batching replica, the other workers fronts), so the
    fleet's figures say how they ran and the memory per replica divides by the replicas there are."""
    log = ("INFO kokoro_fleet.serve: replicas: 1 of 8 workers, batches of up to 16 chunks, the other workers HTTP "
           "fronts: without MPS the GPU time-slices\n"
           "INFO kokoro_fleet.compile_cache: pid 3: compiled passes compiled in 61.0 s (1 graphs compiled, 0 loaded)\n"
           "INFO kokoro_fleet.compile_cache: pid 4: compiled passes loaded from the host's cache in 9.1 s\n"
           "ERROR kokoro_fleet.engine: CUDA graph capture of batches failed; batches run without graphs\n")
    assert gpu_fleet.engines_in_log(log) == {"replicas": 1, "batch_max": 16, "compiled": 1, "loaded": 1,
                                             "compile_failed": 0, "capture_failed": 1, "recompile_lines": 0}
    sentence = gpu_fleet.markdown({"engines": gpu_fleet.engines_in_log(log), "meta": {"compile": True}})
    assert "serve's plan: 1 replicas, batches of up to 16 chunks" in sentence and "1 captures failed" in sentence
