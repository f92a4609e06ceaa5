"""The CPU side of a replica: which precision `auto` picks for the CPU's flags (faked here), the
warning for a forced precision the CPU would emulate, the thread share, and the inference
thread's lower priority (its OpenMP pool included)."""

from __future__ import annotations

import asyncio
import logging
import os
import threading

import pytest
import torch

from worker import cpu_features
from worker.cpu_features import parse_cpuinfo, precision_warning
from worker.cpu_runtime import inference_threads, thread_niceness
from worker.engine import Engine, EngineConfig, resolve_dtype
from worker.replica import Replica

AVX2_EPYC = """processor	: 0
model name	: AMD EPYC 7B12
flags		: fpu sse sse2 ssse3 sse4_1 sse4_2 avx f16c fma avx2 bmi1 bmi2
"""
ICE_LAKE = """processor	: 0
model name	: Intel(R) Xeon(R) Platinum 8375C CPU @ 2.90GHz
flags		: fpu sse2 avx avx2 fma avx512f avx512_vnni
"""
OLD_XEON = """processor	: 0
model name	: Intel(R) Xeon(R) CPU E5-2680 0 @ 2.70GHz
flags		: fpu sse2 sse4_1 sse4_2 avx
"""
SAPPHIRE_RAPIDS = """processor	: 0
model name	: Intel(R) Xeon(R) Platinum 8480+
flags		: fpu sse2 avx avx2 fma avx512f avx512_vnni avx512_bf16 avx512_fp16 amx_bf16 amx_int8 amx_tile
"""


@pytest.fixture
def fake_cpu(monkeypatch):
    def use(text: str):
        info = parse_cpuinfo(text)
        monkeypatch.setattr(cpu_features, "cpu_info", lambda: info)
        return info

    return use


def test_cpuinfo_is_parsed_into_model_and_flags():
    info = parse_cpuinfo(AVX2_EPYC)
    assert info.model == "AMD EPYC 7B12" and info.has("avx2") and not info.has("avx512f")
    assert info.native("fp32") and not info.native("bf16") and not info.native("fp16")
    assert "avx2" in info.summary() and "avx512_bf16" not in info.summary()
    amx = parse_cpuinfo(SAPPHIRE_RAPIDS)
    assert amx.native("bf16") and amx.native("fp16")
    assert "amx_bf16" in amx.summary()


def test_auto_picks_the_fastest_mode_the_cpu_runs_natively(fake_cpu):
    """bf16 with AVX512-BF16 or AMX; int8 (oneDNN u8 x s8 convolutions) with AVX2 but no native
    bf16; fp32 without AVX2. Never a precision the CPU would emulate."""
    cpu = torch.device("cpu")
    fake_cpu(AVX2_EPYC)
    assert resolve_dtype("auto", cpu) == "int8"
    fake_cpu(SAPPHIRE_RAPIDS)
    assert resolve_dtype("auto", cpu) == "bf16"
    fake_cpu(ICE_LAKE)
    assert resolve_dtype("auto", cpu) == "int8"
    fake_cpu(OLD_XEON)
    assert resolve_dtype("auto", cpu) == "fp32"
    with pytest.raises(ValueError, match="CPU only"):
        resolve_dtype("int8", torch.device("cuda"))


def test_int8_weights_are_7_bit_without_vnni():
    """AVX2's vpmaddubsw adds u8 x s8 pairs in saturating 16 bits: 255 * 127 * 2 overflows, 255 * 63 * 2 not."""
    assert cpu_features.int8_weight_levels(parse_cpuinfo(AVX2_EPYC)) == 63
    assert cpu_features.int8_weight_levels(parse_cpuinfo(ICE_LAKE)) == 127
    assert cpu_features.int8_weight_levels(parse_cpuinfo(SAPPHIRE_RAPIDS)) == 127


def test_an_isa_cap_hides_the_flags_above_it(monkeypatch):
    """ONEDNN_MAX_CPU_ISA=AVX2 (what `python -m loadtest.bench --isa avx2` sets) makes cpu_info() report
    the CPU as oneDNN may use it: `auto` then picks what it picks on an AVX2-only CPU."""
    flags = parse_cpuinfo(SAPPHIRE_RAPIDS).flags
    assert cpu_features.capped_flags(flags, "AVX2") == {"fpu", "sse2", "avx", "avx2", "fma"}
    assert "avx512_vnni" in cpu_features.capped_flags(flags, "AVX512_CORE_VNNI")
    assert "avx512_bf16" not in cpu_features.capped_flags(flags, "AVX512_CORE_VNNI")
    assert cpu_features.capped_flags(flags, None) == flags
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "avx2")
    cpu_features.cpu_info.cache_clear()
    try:
        info = cpu_features.cpu_info()
        assert info.cap == "AVX2" and not any(f.startswith(("avx512", "amx")) for f in info.flags)
        assert "capped at AVX2" in info.summary()
        assert resolve_dtype("auto", torch.device("cpu")) == ("int8" if info.has("avx2") else "fp32")
    finally:
        monkeypatch.delenv("ONEDNN_MAX_CPU_ISA")
        cpu_features.cpu_info.cache_clear()


def test_forced_bf16_without_native_bf16_warns_at_start(fake_cpu, tiny_weights, caplog):
    fake_cpu(AVX2_EPYC)
    with caplog.at_level(logging.WARNING, logger="kokoro_fleet.engine"):
        Engine(tiny_weights, EngineConfig("cpu", "bf16", fused_kernels=False))
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, warnings
    assert "KOKORO_DTYPE=bf16" in warnings[0] and "avx512_bf16" in warnings[0] and "AMD EPYC 7B12" in warnings[0]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="kokoro_fleet.engine"):
        Engine(tiny_weights, EngineConfig("cpu", "fp32", fused_kernels=False))
    assert not [r for r in caplog.records if r.levelno == logging.WARNING]
    fake_cpu(SAPPHIRE_RAPIDS)
    assert precision_warning("bf16") is None and "avx512_fp16" in precision_warning("fp16", parse_cpuinfo(AVX2_EPYC))


def test_workers_share_the_cores():
    assert inference_threads(0, workers=2, cores=2) == 1
    assert inference_threads(0, workers=1, cores=2) == 2
    assert inference_threads(0, workers=4, cores=16) == 4
    assert inference_threads(0, workers=3, cores=2) == 1  # never zero
    assert inference_threads(3, workers=2, cores=2) == 3  # KOKORO_THREADS wins
    assert inference_threads(0, workers=0) >= 1


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_each_worker_takes_its_share_of_the_cores_on_a_gpu_too(device, monkeypatch, tmp_path):
    """A GPU worker's host-side torch work (weights, per-request CPU tensors) must not start one
    OpenMP thread per core in every one of 8 workers. Nothing here touches CUDA: the thread count
    is set before any engine exists."""
    from worker import cpu_runtime

    monkeypatch.setattr(cpu_runtime, "usable_cores", lambda: 16)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(7)  # neither the share nor the default
        cpu_runtime.configure_process(cache_dir=str(tmp_path), threads=0, workers=8, device=device,
                                      inference_nice=0)
        assert torch.get_num_threads() == 2  # 16 cores / 8 workers
    finally:
        torch.set_num_threads(before)


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="per-thread niceness is read from Linux /proc")
def test_a_cpu_engine_keeps_freed_memory_unless_the_environment_tunes_malloc():
    """glibc malloc without mmap'd chunks (freed activations are reused, not faulted in anew) once
    a CPU engine exists, until it hands the free pages back; a MALLOC_* variable in the environment
    leaves malloc alone. Each case runs in a fresh interpreter: the setting is process-wide."""
    import platform
    import subprocess
    import sys

    if platform.libc_ver()[0] != "glibc":
        pytest.skip("glibc only")
    probe = "from worker.cpu_runtime import keep_freed_memory; print(keep_freed_memory(), keep_freed_memory())"
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "GLIBC_TUNABLES"}

    def run(code=probe, **extra):
        return subprocess.run([sys.executable, "-c", code], env={**env, **extra}, capture_output=True, text=True,
                              check=True).stdout.split()

    assert run() == ["True", "True"]
    assert run(MALLOC_MMAP_MAX_="65536") == ["False", "False"]
    # freed memory stays resident until return_freed_memory() (a CPU replica's, once idle)
    # finds more than its slack above the last trim. A small tensor first: torch's first-time
    # allocations (its thread pool; 6 MiB more with the CUDA build of torch) are not the freed memory.
    memory = ("import torch; from worker.cpu_runtime import keep_freed_memory, return_freed_memory\n"
              "rss = lambda: int(open('/proc/self/statm').read().split()[1]) * 4096 >> 20\n"
              "keep_freed_memory(); warm = torch.ones(1 << 20, dtype=torch.uint8); del warm\n"
              "return_freed_memory(0); before = rss()\n"
              "x = torch.ones(64 << 20, dtype=torch.uint8); del x\n"
              "kept = rss(); return_freed_memory(256 << 20); kept_in_slack = rss(); return_freed_memory(0)\n"
              "print(kept - before, kept_in_slack - before, rss() - before)")
    kept, kept_in_slack, left = map(int, run(memory))
    assert kept >= 60 and kept_in_slack >= 60 and left < 8
    assert run(GLIBC_TUNABLES="glibc.malloc.mmap_threshold=1048576") == ["False", "False"]
    # An engine asks for it in int8 mode only, where it was measured to pay; bf16 and fp32 keep
    # glibc's default and its lower resident memory.
    engine = ("import sys; from api.settings import Settings, weights_source\n"
              "from worker.weights import load_weights\n"
              "from worker.engine import Engine, EngineConfig; from worker.cpu_runtime import _KEEP_FREED\n"
              "Engine(load_weights(weights_source(Settings.from_env({'KOKORO_WEIGHTS': 'tiny'}))), EngineConfig('cpu', sys.argv[1], "
              "fused_kernels=False)); print(_KEEP_FREED['applied'])")
    assert [run(engine.replace("sys.argv[1]", repr(mode)))[0] for mode in ("int8", "bf16", "fp32")] == \
        ["True", "False", "False"]


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="resident memory is read from Linux /proc")
def test_freed_memory_goes_back_past_the_slack_with_glibcs_default_malloc_too():
    """bf16 and fp32 engines keep glibc's default malloc, which still holds freed small blocks below
    a live one (a fragmented heap: a replica reached 2.3 GB between requests); return_freed_memory
    hands them back once they pass the slack. Fresh interpreter: the trim floor is process-wide."""
    import platform
    import subprocess
    import sys

    if platform.libc_ver()[0] != "glibc":
        pytest.skip("glibc only")
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "GLIBC_TUNABLES"}
    fragment = ("import torch; from worker.cpu_runtime import return_freed_memory, _KEEP_FREED\n"
                "rss = lambda: int(open('/proc/self/statm').read().split()[1]) * 4096 >> 20\n"
                "return_freed_memory(0); before = rss()\n"
                "blocks = [torch.ones(16 << 10) for _ in range(2048)]; last = blocks[-1]; del blocks\n"  # 2048 x 64 KiB
                "kept = rss(); return_freed_memory(256 << 20); kept_in_slack = rss(); return_freed_memory(0)\n"
                "print(_KEEP_FREED['applied'], kept - before, kept_in_slack - before, rss() - before)")
    out = subprocess.run([sys.executable, "-c", fragment], env=env, capture_output=True, text=True, check=True)
    applied, kept, kept_in_slack, left = out.stdout.split()
    assert applied == "False"  # glibc's default malloc throughout
    assert int(kept) >= 100 and int(kept_in_slack) >= 100 and int(left) < 16, out.stdout


def test_inference_and_its_openmp_pool_run_at_raised_niceness(tiny_weights):
    base = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    if base + 3 > 19:
        pytest.skip("this process is already at the lowest priority")
    engine = Engine(tiny_weights, EngineConfig("cpu", "fp32", fused_kernels=False))
    replica = Replica(engine, niceness=3)
    threads_before = torch.get_num_threads()
    torch.set_num_threads(2)  # the pool then has one thread beside the inference thread
    try:
        asyncio.run(replica.synthesize([16, 43, 54, 16, 56, 57] * 4, torch.zeros(2 * engine.model.style_dim)))
        inference_tid = replica._executor.submit(threading.get_native_id).result()
    finally:
        torch.set_num_threads(threads_before)
    assert thread_niceness(inference_tid) == base + 3
    assert thread_niceness(threading.get_native_id()) == base, "the calling (event-loop) thread keeps its niceness"
    raised = [int(t) for t in os.listdir("/proc/self/task") if thread_niceness(int(t)) == base + 3]
    assert len(raised) >= 2, "the OpenMP threads the inference thread started should inherit its niceness"


def test_compiled_kernels_are_cached_beside_the_weights(tmp_path, monkeypatch):
    from torch._inductor.runtime.runtime_utils import default_cache_dir

    from worker.cpu_runtime import use_compile_cache, vector_isa

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", default_cache_dir())  # what torch sets on first use
    # one directory per vector ISA: torch's cache would hand AVX2 kernels to an AVX-512 process
    isa = vector_isa()
    assert isa.startswith(("avx512", "avx2", "asimd", "sve", "vsx", "zvector", "scalar")) and " " not in isa, isa
    assert use_compile_cache(tmp_path) == tmp_path / "inductor" / isa
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "inductor" / isa)
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "mine"))  # the user's own choice stays
    assert use_compile_cache(tmp_path) == tmp_path / "mine"


def test_the_kernel_cache_needs_no_compiler(tmp_path, monkeypatch):
    """The CPU image has no C++ compiler: torch's ISA probe raises there, and the replica must still
    start (its kernels then run eagerly), its cache directory named after ATen's capability."""
    import torch
    from torch._inductor import cpu_vec_isa
    from torch._inductor.exc import InvalidCxxCompiler
    from torch._inductor.runtime.runtime_utils import default_cache_dir

    from worker.cpu_runtime import use_compile_cache, vector_isa

    def no_compiler():
        raise InvalidCxxCompiler()

    monkeypatch.setattr(cpu_vec_isa, "pick_vec_isa", no_compiler)
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", default_cache_dir())
    expected = f"{torch.backends.cpu.get_cpu_capability().lower()}-no-compiler"
    assert vector_isa() == expected
    assert use_compile_cache(tmp_path) == tmp_path / "inductor" / expected


# --- the real weights: the auto mode's parity, and the bench against onnxruntime ---------------------

@pytest.mark.slow
def test_auto_mode_keeps_the_parity_bound_on_the_real_weights(real_weights):
    from loadtest.bench.engine_bench import chunk_ids
    from worker.reference import log_spectral_distance_db

    ids = chunk_ids(real_weights.config["vocab"], 100)
    style = real_weights.voices["af_heart"][len(ids) - 1]
    fp32 = Engine(real_weights, EngineConfig("cpu", "fp32", noise=False)).synthesize(ids, style)
    auto = Engine(real_weights, EngineConfig("cpu", "auto", noise=False))
    out = auto.synthesize(ids, style)
    print(f"auto = {auto.dtype} on {cpu_features.cpu_info().summary()}")
    assert len(out.durations) == len(ids) + 2  # word timestamps need every token's duration
    assert (abs(out.durations - fp32.durations) <= 1).mean() >= 0.99
    assert log_spectral_distance_db(fp32.audio, out.audio) <= 1.0
    noisy = Engine(real_weights, EngineConfig("cpu", "auto", seed=7))
    first, again = noisy.synthesize(ids, style), noisy.synthesize(ids, style)
    assert (first.audio == again.audio).all(), "seeded noise must give the same audio"


@pytest.mark.slow
def test_bench_times_onnxruntime_beside_our_modes(real_weights, capsys):
    import argparse

    from loadtest.bench import engine_bench as bench

    parser = argparse.ArgumentParser()
    bench.configure(parser)
    args = parser.parse_args(["--sizes", "30", "--repeats", "1", "--modes", "auto", "--no-reference", "--device", "cpu"])
    assert bench.run(args) == 0
    out = capsys.readouterr().out
    assert f"cpu: {cpu_features.cpu_info().model}" in out
    rows = {line.split()[1]: line.split() for line in out.splitlines() if line.strip().startswith("30 ")}
    assert bench.ONNXRUNTIME in rows, out
    ours = next(row for name, row in rows.items() if name.startswith("ours-auto"))
    assert ours[7].endswith("x") and float(ours[7][:-1]) > 0, out  # our speed over onnxruntime's
