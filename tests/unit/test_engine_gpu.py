"""CUDA graphs against eager on the GPU (skipped without CUDA): the graphs replay the eager run on
the same padded shapes bit for bit; against the unpadded run, same durations and >= 30 dB SNR.
These run the uncompiled engine (compiled=False); the compiled passes have their own tests below.

These run on a lent GPU (`python -m loadtest.bench.gpu_harness`), never in CI. With torch's default TF32
convolutions the padded-against-unpadded and batch-against-single bounds failed on an H200 (28 and
9.6 dB); the engine turns TF32 off on CUDA (worker.engine.use_exact_cuda_arithmetic)."""

from __future__ import annotations

import types

import numpy as np
import pytest
import torch

from worker.engine import Engine, EngineConfig
from loadtest.bench.gpu_parity import PRECISION_BOUND_DB
from worker.model.random_init import full_config, random_state_dict, random_voices
from worker.reference import log_spectral_distance_db, snr_db

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

GRID = (64, 96, 128, 192, 256, 384, 512)


@pytest.fixture(scope="module")
def weights():
    cfg = full_config()
    return types.SimpleNamespace(source="random-full", config=cfg, state_dict=random_state_dict(cfg),
                                 voices=random_voices(["v"]), info={})


@pytest.fixture(scope="module")
def engines(weights):
    eager = Engine(weights, EngineConfig("cuda", "fp32", noise=False, cuda_graphs=False, bucketed=False, compiled=False))
    graphed = Engine(weights, EngineConfig("cuda", "fp32", noise=False, cuda_graphs=True, frame_grid=GRID, compiled=False))
    graphed.warmup()
    assert graphed.graphs is not None, "capture failed (see the log)"
    return eager, graphed


@pytest.mark.parametrize("n_tokens", [10, 40, 100])
def test_graphed_matches_eager(engines, weights, n_tokens):
    eager, graphed = engines
    g = torch.Generator().manual_seed(n_tokens)
    ids = torch.randint(1, 178, (n_tokens,), generator=g).tolist()
    style = weights.voices["v"][n_tokens - 1]
    a, b = eager.synthesize(ids, style), graphed.synthesize(ids, style)
    assert np.array_equal(a.durations, b.durations)
    assert len(a.audio) == len(b.audio)
    assert snr_db(a.audio, b.audio) >= 30.0


@pytest.mark.parametrize("noise", [False, True], ids=["noise-off", "noise-on"])
def test_graphs_replay_the_padded_eager_run_bit_for_bit(weights, noise):
    """Capture changes nothing: the graphs compute what the same code computes eagerly on the same
    padded shapes (deterministic cuDNN: the same input gives the same bits)."""
    padded = Engine(weights, EngineConfig("cuda", "fp32", noise=noise, cuda_graphs=False, bucketed=True, frame_grid=GRID,
                    compiled=False))
    graphed = Engine(weights, EngineConfig("cuda", "fp32", noise=noise, cuda_graphs=True, frame_grid=GRID, compiled=False))
    graphed.warmup()
    for n_tokens in (10, 100):
        ids = torch.randint(1, 178, (n_tokens,), generator=torch.Generator().manual_seed(n_tokens)).tolist()
        style = weights.voices["v"][n_tokens - 1]
        a, b = padded.synthesize(ids, style), graphed.synthesize(ids, style)
        assert np.array_equal(a.durations, b.durations)
        assert np.array_equal(a.audio, b.audio), n_tokens


def test_graphed_noise_is_reproducible(weights):
    engine = Engine(weights, EngineConfig("cuda", "fp32", noise=True, cuda_graphs=True, frame_grid=GRID, compiled=False))
    engine.warmup()
    ids = list(range(20, 50))
    style = weights.voices["v"][29]
    first, second = engine.synthesize(ids, style), engine.synthesize(ids, style)
    assert np.array_equal(first.audio, second.audio)


def test_reduced_precision_bound_on_cuda(engines, weights):
    eager, _ = engines
    ids = list(range(20, 80))
    style = weights.voices["v"][59]
    reference = eager.synthesize(ids, style)
    for dtype in ("bf16", "fp16"):
        other = Engine(weights, EngineConfig("cuda", dtype, noise=False, cuda_graphs=True, frame_grid=GRID, compiled=False))
        other.warmup()
        out = other.synthesize(ids, style)
        assert (np.abs(out.durations - reference.durations) <= 1).mean() >= 0.99, dtype
        assert log_spectral_distance_db(reference.audio, out.audio[: len(reference.audio)]) <= PRECISION_BOUND_DB, dtype


@pytest.mark.parametrize("noise", [False, True], ids=["noise-off", "noise-on"])
def test_eager_batch_matches_single_runs_on_cuda(engines, weights, noise):
    """synthesize_batch of an uncompiled engine runs eagerly (batch graphs need the compiled
    decoder): every item equals its single run. Noise off: the graphed engine's (the batch padded to its token and frame buckets);
    noise on: the unbucketed eager engine's (the graphs' noise buffer exists only if the engine was
    built with noise), each item drawing its single run's noise."""
    from worker.engine import BatchItem

    engine = engines[0] if noise else engines[1]
    engine.noise = noise
    try:
        items = []
        for k, n_tokens in enumerate((100, 10, 37)):
            g = torch.Generator().manual_seed(n_tokens)
            ids = torch.randint(1, 178, (n_tokens,), generator=g).tolist()
            items.append(BatchItem(ids, weights.voices["v"][n_tokens - 1], 1.0 + 0.2 * k))
        for item, got in zip(items, engine.synthesize_batch(items)):
            alone = engine.synthesize(item.ids, item.style, item.speed)
            assert np.array_equal(got.durations, alone.durations)
            assert len(got.audio) == len(alone.audio)
            assert snr_db(alone.audio, got.audio) >= 30.0
    finally:
        engine.noise = False


# --- compiled passes: the decoder through torch.compile, captured per (batch bucket, frame bucket) ---

# A batch item against its single run (tests/unit/test_batch.py's bound).
BATCH_PARITY_DB = 20.0
# The batch graphs' bound here: batch buckets 2, 4 and 8, the 8-chunk batches up to 512 frames each
# (the 5-item case below, 120 phonemes its longest, lands in the cell (8, 384)).
BATCH_GRAPH_FRAMES = 4096


@pytest.fixture(scope="module")
def compiled_engine(weights):
    """What a replica serves with (bf16, noise on, the default frame grid, so it shares the host's
    compile cache with `python -m loadtest.bench`), batches up to 8 on a small batch grid."""
    engine = Engine(weights, EngineConfig("cuda", "bf16", compiled=True, cuda_graphs=True, max_batch=8,
                    batch_graph_frames=BATCH_GRAPH_FRAMES))
    engine.warmup()
    assert engine.graphs is not None and engine.batch_graphs is not None, engine.capture_errors
    return engine


def mixed_items(weights, lengths, speeds=None):
    from worker.engine import BatchItem

    speeds = speeds or [1.0] * len(lengths)
    return [BatchItem(torch.randint(1, 178, (n,), generator=torch.Generator().manual_seed(n)).tolist(),
                      weights.voices["v"][n - 1], s) for n, s in zip(lengths, speeds)]


def test_the_compiled_start_compiles_each_family_once_and_captures_every_graph(compiled_engine):
    """A batch of one and a batch: two graphs traced by dynamo over the compile, every warm-up and
    every capture, no recompile (tests/unit/test_compiled_passes.py replays the same on the CPU)."""
    record = compiled_engine.compile_record
    assert record.recompiles == [] and record.dynamo_compiles == 2, record.describe()
    report = compiled_engine.run_report()
    assert report["device"] == "cuda" and report["compiled"] and report["stage2"] == "exact"
    for family, graphs in report["graphs"].items():
        assert graphs["wanted"] and graphs["captured"] > 0 and graphs["error"] is None, (family, graphs)


def test_compiled_batch_graphs_cover_their_grid_within_the_bound(compiled_engine):
    graphs = compiled_engine.batch_graphs
    assert compiled_engine.compile_record is not None
    assert graphs.batch_buckets == [2, 4, 8]
    assert set(graphs.graphs) == set(graphs.cells)
    assert all(b * f <= compiled_engine.batch_graph_frames for b, f in graphs.cells)


@pytest.mark.parametrize("lengths", [(60, 45, 52), (120, 10, 90, 33, 64)], ids=["3-items", "5-items"])
def test_compiled_graphed_batch_items_equal_their_single_runs(compiled_engine, weights, lengths):
    """The batch replays a (batch bucket, frame bucket) graph, each single run its own graphs."""
    items = mixed_items(weights, lengths, [1.0 + 0.1 * k for k in range(len(lengths))])
    frames = [int(compiled_engine.synthesize(i.ids, i.style, i.speed).durations.sum()) for i in items]
    batch_graphs = compiled_engine.batch_graphs
    cell = (next(b for b in (2, 4, 8) if b >= len(items)), compiled_engine._frame_bucket(max(frames)))
    assert cell in batch_graphs.graphs, f"{cell} is outside the batch grid (batch x frames <= {BATCH_GRAPH_FRAMES})"
    replays = batch_graphs.replays
    batch = compiled_engine.synthesize_batch(items)
    assert batch_graphs.replays == replays + 1  # the batch replayed its graph
    for item, got in zip(items, batch):
        alone = compiled_engine.synthesize(item.ids, item.style, item.speed)
        assert np.array_equal(got.durations, alone.durations)
        assert len(got.audio) == len(alone.audio)
        assert snr_db(alone.audio, got.audio) >= BATCH_PARITY_DB


def test_compiled_batch_beyond_the_grid_still_runs(compiled_engine, weights):
    """Nine items: past the largest batch bucket, so stage 2 runs compiled, launched eagerly."""
    items = mixed_items(weights, [30 + 5 * k for k in range(9)])
    beyond = compiled_engine.batch_graphs.beyond_grid
    batch = compiled_engine.synthesize_batch(items)
    assert compiled_engine.batch_graphs.beyond_grid == beyond + 1
    for item, got in zip(items, batch):
        alone = compiled_engine.synthesize(item.ids, item.style, item.speed)
        assert np.array_equal(got.durations, alone.durations)
        assert snr_db(alone.audio, got.audio) >= BATCH_PARITY_DB


@pytest.mark.parametrize("n_tokens", [30, 120])
def test_compiled_bf16_against_eager_fp32(compiled_engine, weights, n_tokens):
    """Durations exact (stage 1 stays float32 without TF32), audio within the precision bound of
    the padded eager fp32 run (the same padded shapes, so the same noise draws)."""
    padded = Engine(weights, EngineConfig("cuda", "fp32", compiled=False, cuda_graphs=False, bucketed=True))
    ids = torch.randint(1, 178, (n_tokens,), generator=torch.Generator().manual_seed(n_tokens)).tolist()
    style = weights.voices["v"][n_tokens - 1]
    a, b = padded.synthesize(ids, style), compiled_engine.synthesize(ids, style)
    assert np.array_equal(a.durations, b.durations)
    assert log_spectral_distance_db(a.audio, b.audio) <= PRECISION_BOUND_DB
