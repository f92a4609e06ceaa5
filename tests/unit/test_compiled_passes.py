"""The compiled batched pass, checked on the CPU so CI guards the code CUDA serves.

On CUDA the engine runs stage 2's decoder through torch.compile (inductor) and captures it as CUDA
graphs per (batch bucket, frame bucket); here inductor's C++ backend compiles the same decoder, with
the same dynamic batch and frame dimensions, launched eagerly. A compiled batch must compute what
the eager batch computes: durations equal (stage 1 is not compiled), audio within the batch parity
bound of tests/unit/test_batch.py, for the eager batch and for each item's single run; a second
engine on the host must load what the first compiled instead of compiling again; and a CUDA
replica's start, replayed here (the compile, then the warm-ups its graph captures run), must
compile each shape family once and never again.

Cost: one compile of the tiny config's single-chunk and batch families, cached across runs in the
host's compile cache (~/.cache/kokoro-fleet/compile/<torch>-<cpu>), then a load from it; every
batch here stays within the replay's frame grid, so nothing compiles again.
"""

from __future__ import annotations

import os
import shutil

import numpy as np
import pytest
import torch

from worker.compile_cache import default_compile_cache_dir, shared_compile
from worker.cuda_graphs import BatchGraphs, CudaGraphs
from worker.engine import BatchItem, Engine, EngineConfig, stage2_arithmetic, use_exact_cuda_arithmetic
from worker.reference import snr_db

compiles = pytest.mark.skipif(shutil.which("g++") is None and shutil.which("c++") is None,
                              reason="inductor's CPU backend needs a C++ compiler")

PARITY_DB = 20.0  # a batch item against its single run: tests/unit/test_batch.py


def items_of(weights, lengths, speeds) -> list[BatchItem]:
    voice = next(iter(weights.voices.values()))
    return [BatchItem(torch.randint(1, 178, (n,), generator=torch.Generator().manual_seed(n)).tolist(),
                      voice[n - 1], speed) for n, speed in zip(lengths, speeds)]


# Eight frame buckets (multiples of 8, as the default grid's) within one region of the CPU's own
# choices, so only what the CUDA path shares can make a recompile here. On the CPU, dynamo guards a
# graph on choices CUDA does not make: ATen's convolution backend for a batch of one (its native
# kernel below 20,480 input elements, oneDNN above), the channels-last convolution's layout (33 to
# 160 frames), inductor's C++ sums over the first upsampling (accumulate helper past 4096 samples):
# compiled at the warm-up chunk's ~96 frames, a batch of one holds from 64 to 126 frames.
REPLAY_GRID = (64, 72, 80, 88, 96, 104, 112, 120)
REPLAY_BATCH_GRAPH_FRAMES = 768  # batch buckets 2, 4 and 8, each over several frame buckets


@pytest.fixture(scope="module")
def compiled_engine(tiny_weights):
    """A compiled engine started as a CUDA replica starts, replayed on the CPU: the single-chunk and
    batch families compiled under the host's compile lock, then, still holding it, the warm-ups that
    `CudaGraphs.capture` and `BatchGraphs.capture` run before capturing (every frame bucket with the
    single-chunk graphs' noise views, every batch cell), all counted by dynamo's own counters."""
    torch._dynamo.reset()  # the first compile of each family here, not a recompile of another model's
    engine = Engine(tiny_weights, EngineConfig("cpu", "fp32", compiled=True, bucketed=True, max_batch=8, frame_grid=REPLAY_GRID,
                    batch_graph_frames=REPLAY_BATCH_GRAPH_FRAMES))
    engine.compile_passes(("single", "batch"), then=lambda: (CudaGraphs(engine).warm_up(), BatchGraphs(engine).warm_up()))
    return engine


@pytest.fixture(scope="module")
def eager_engine(tiny_weights):
    return Engine(tiny_weights, EngineConfig("cpu", "fp32", compiled=False, bucketed=True, fused_kernels=False,
                  frame_grid=REPLAY_GRID))


@pytest.mark.slow
@compiles
def test_a_cuda_start_replayed_on_the_cpu_compiles_each_family_once(compiled_engine):
    """One graph per shape family (a batch of one, a batch) over every frame bucket and batch cell
    the capture warms up, and no recompile: a graph's noise with other strides than the compile's,
    say, would make dynamo compile the family again in every process, outside the compile lock."""
    record = compiled_engine.compile_record
    assert len(BatchGraphs(compiled_engine).cells) >= 20  # what the batch warm-up covered
    assert record.recompiles == [], record.describe()
    assert record.dynamo_compiles == 2, record.describe()
    assert record.error is None and record.seconds > 0


@pytest.mark.slow
@compiles
@pytest.mark.parametrize("lengths,speeds", [((30, 12, 25), (1.0, 1.3, 0.8)), ((7, 33, 20, 18, 26), (1.0,) * 5)],
                         ids=["3-items", "5-items"])  # each batch's longest within the grid: no compile here
def test_compiled_batch_equals_the_eager_batch_and_single_runs(tiny_weights, compiled_engine, eager_engine,
                                                               lengths, speeds):
    items = items_of(tiny_weights, lengths, speeds)
    compiled = compiled_engine.synthesize_batch(items)
    eager = eager_engine.synthesize_batch(items)
    for k, (item, got, expected) in enumerate(zip(items, compiled, eager)):
        alone = eager_engine.synthesize(item.ids, item.style, item.speed)
        where = f"item {k} ({len(item.ids)} phonemes, speed {item.speed})"
        assert np.array_equal(got.durations, expected.durations), where
        assert np.array_equal(got.durations, alone.durations), where
        assert len(got.audio) == len(expected.audio) == len(alone.audio), where
        assert np.isfinite(got.audio).all(), where
        assert snr_db(expected.audio, got.audio) >= PARITY_DB, where
        assert snr_db(alone.audio, got.audio) >= PARITY_DB, where


@pytest.mark.slow
@compiles
def test_a_second_engine_loads_what_the_first_compiled(tiny_weights, compiled_engine):
    """As a second replica process would: dynamo forgets this process's graphs, so the second
    engine's come from the host's cache on disk, compiled by nobody."""
    assert compiled_engine.compile_record is not None
    torch._dynamo.reset()
    second = Engine(tiny_weights, EngineConfig("cpu", "fp32", compiled=True, bucketed=True, max_batch=8, frame_grid=REPLAY_GRID,
                    batch_graph_frames=REPLAY_BATCH_GRAPH_FRAMES))  # the same configuration, as a host's replicas
    second.warmup()
    record = second.compile_record
    assert record.directory == compiled_engine.compile_record.directory
    assert record.loaded and record.graphs_compiled == 0 and record.graphs_loaded >= 1, record.describe()


def test_the_batch_grid_holds_the_buckets_up_to_the_largest_batch_within_the_memory_bound(tiny_weights):
    """The grid BatchGraphs would capture (its buffers are built on the engine's device; no capture here)."""
    engine = Engine(tiny_weights, EngineConfig("cpu", "fp32", compiled=False, bucketed=True, max_batch=12,
                    batch_graph_frames=3000, frame_grid=(32, 64, 128, 256, 512, 1024, 2048)))
    grid = BatchGraphs(engine)
    assert grid.batch_buckets == [2, 4, 8, 16]  # 12 rounds up to 16; 32 and 64 are past it
    assert set(grid.cells) == {(b, f) for b in (2, 4, 8, 16) for f in engine.frame_grid if b * f <= 3000}
    assert (2, 2048) not in grid.cells and (16, 128) in grid.cells and (16, 256) not in grid.cells
    assert [b * f for b, f in grid.cells] == sorted((b * f for b, f in grid.cells), reverse=True)
    assert grid.durations.shape[0] == 16 and grid.audio.numel() == 600 * max(b * f for b, f in grid.cells)


def test_each_stage2_arithmetic_holds_only_inside_stage2():
    """Three separate effects: `exact` changes nothing; `exact-nondeterministic` allows cuDNN's
    non-deterministic algorithms and nothing else; `fast` adds TF32 and cudnn.benchmark. Exact
    arithmetic again after stage 2 (the flags are process-wide and settable without a GPU; this
    puts them back)."""
    flags = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32,
             torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark)
    cuda = torch.device("cuda")

    def now():
        return {"tf32": (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32),
                "deterministic": torch.backends.cudnn.deterministic, "benchmark": torch.backends.cudnn.benchmark}

    exact = {"tf32": (False, False), "deterministic": True, "benchmark": False}
    try:
        use_exact_cuda_arithmetic()
        assert now() == exact
        with stage2_arithmetic(cuda, "exact"):
            assert now() == exact
        with stage2_arithmetic(cuda, "exact-nondeterministic"):
            assert now() == {**exact, "deterministic": False}
        assert now() == exact
        with stage2_arithmetic(cuda, "fast"):
            assert now() == {"tf32": (True, True), "deterministic": False, "benchmark": True}
        assert now() == exact
        with stage2_arithmetic(torch.device("cpu"), "fast"):  # the flags are CUDA's: left alone elsewhere
            assert now() == exact
        with pytest.raises(ValueError, match="exact-nondeterministic"), stage2_arithmetic(cuda, "tf32"):
            pass
    finally:
        (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32,
         torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark) = flags


def test_the_compile_cache_is_one_directory_per_torch_and_device_marked_per_configuration(tmp_path, monkeypatch):
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)  # put back after the test
    monkeypatch.delenv("TRITON_CACHE_DIR", raising=False)
    directory = default_compile_cache_dir(torch.device("cpu"), tmp_path)
    assert directory.parent == tmp_path / "compile"
    assert directory.name.startswith(torch.__version__.replace("+", "-"))
    assert all(c.isalnum() or c in "._-" for c in directory.name)
    with shared_compile(directory, "decode-fp32-batch-noise1-exact") as record:
        assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(directory)
    assert record.directory == directory and record.graphs_compiled == record.graphs_loaded == 0
    assert (directory / "decode-fp32-batch-noise1-exact.done").exists()
    with pytest.raises(RuntimeError), shared_compile(directory, "decode-bf16-batch-noise1-exact"):
        raise RuntimeError("a failed compile")
    assert not (directory / "decode-bf16-batch-noise1-exact.done").exists()  # the next process compiles it
