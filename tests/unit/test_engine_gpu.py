"""CUDA graphs against eager on the GPU (skipped without CUDA): the graphs replay the eager run on
the same padded shapes bit for bit; against the unpadded run, same durations and >= 30 dB SNR.

These run on a lent GPU (`python -m loadtest.bench.gpu_harness`), never in CI. With torch's default TF32
convolutions the padded-against-unpadded and batch-against-single bounds failed on an H200 (28 and
9.6 dB); the engine turns TF32 off on CUDA (worker.engine.use_exact_cuda_arithmetic)."""

from __future__ import annotations

import types

import numpy as np
import pytest
import torch

from worker.engine import Engine
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
    eager = Engine(weights, "cuda", "fp32", noise=False, cuda_graphs=False, bucketed=False)
    graphed = Engine(weights, "cuda", "fp32", noise=False, cuda_graphs=True, frame_grid=GRID)
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
    padded = Engine(weights, "cuda", "fp32", noise=noise, cuda_graphs=False, bucketed=True, frame_grid=GRID)
    graphed = Engine(weights, "cuda", "fp32", noise=noise, cuda_graphs=True, frame_grid=GRID)
    graphed.warmup()
    for n_tokens in (10, 100):
        ids = torch.randint(1, 178, (n_tokens,), generator=torch.Generator().manual_seed(n_tokens)).tolist()
        style = weights.voices["v"][n_tokens - 1]
        a, b = padded.synthesize(ids, style), graphed.synthesize(ids, style)
        assert np.array_equal(a.durations, b.durations)
        assert np.array_equal(a.audio, b.audio), n_tokens


def test_graphed_noise_is_reproducible(weights):
    engine = Engine(weights, "cuda", "fp32", noise=True, cuda_graphs=True, frame_grid=GRID)
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
        other = Engine(weights, "cuda", dtype, noise=False, cuda_graphs=True, frame_grid=GRID)
        other.warmup()
        out = other.synthesize(ids, style)
        assert (np.abs(out.durations - reference.durations) <= 1).mean() >= 0.99, dtype
        assert log_spectral_distance_db(reference.audio, out.audio[: len(reference.audio)]) <= PRECISION_BOUND_DB, dtype


@pytest.mark.parametrize("noise", [False, True], ids=["noise-off", "noise-on"])
def test_eager_batch_matches_single_runs_on_cuda(engines, weights, noise):
    """synthesize_batch on CUDA runs eagerly (no graphs per batch size yet): every item equals its
    single run. Noise off: the graphed engine's (the batch padded to its token and frame buckets);
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
