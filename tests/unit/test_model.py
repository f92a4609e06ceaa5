"""Our Kokoro-82M against the reference KModel, padded against unpadded, noise and precision.

Random weights of the FULL config (worker.model.random_init: realistic durations and F0), and the
real offline bundle in the slow tests. The reference runs with its noise switched off the way the
ONNX export has it; ours with noise=False.
"""

from __future__ import annotations


import numpy as np
import pytest
import torch
import torch.nn.functional as F

from worker.engine import Engine, EngineConfig
from worker.model import COMPONENTS, KokoroModel
from worker.weights.random_full import random_full_weights
from worker.reference import (build_reference, log_spectral_distance_db, reference_noise_off,
                              reference_synthesize, snr_db)


@pytest.fixture(scope="module")
def random_full():
    return random_full_weights(["v"], seed=0)


@pytest.fixture(scope="module")
def quiet_fp32(random_full):
    """The plain CPU engine (float32, noise off, unpadded), shared by the tests that compare to it."""
    return Engine(random_full, EngineConfig("cpu", "fp32", noise=False))


def sample(n_tokens: int, seed: int, voices: dict) -> tuple[list[int], torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, 178, (n_tokens,), generator=g).tolist()
    pack = next(iter(voices.values()))
    return ids, pack[n_tokens - 1]


def test_state_dict_loads_strictly_and_round_trips(random_full):
    model = KokoroModel(random_full.config)
    model.load_components(random_full.state_dict)  # strict=True inside
    for name in COMPONENTS:
        ours = getattr(model, name).state_dict()
        assert set(ours) == set(random_full.state_dict[name])
        for key, value in random_full.state_dict[name].items():
            assert torch.equal(ours[key], value), key
    broken = {c: dict(sd) for c, sd in random_full.state_dict.items()}
    broken["decoder"].pop(next(iter(broken["decoder"])))
    with pytest.raises(RuntimeError, match="Missing key"):
        KokoroModel(random_full.config).load_components(broken)


@pytest.mark.slow
def test_parity_with_reference_random_full(random_full, quiet_fp32):
    reference = build_reference(random_full.config, random_full.state_dict)
    engine = quiet_fp32
    for n_tokens, seed in ((12, 1), (45, 2)):
        ids, style = sample(n_tokens, seed, random_full.voices)
        with reference_noise_off():
            ref_audio, ref_durations = reference_synthesize(reference, torch.tensor([[0, *ids, 0]]), style[None])
        ours = engine.synthesize(ids, style)
        assert np.array_equal(ours.durations, ref_durations.numpy())
        assert ours.audio.shape == ref_audio.shape
        assert snr_db(ref_audio.numpy(), ours.audio) >= 30.0


def test_padded_reduced_precision_runs(random_full):
    """A padded bf16 run (the CUDA-graph path's arithmetic) keeps its dtypes consistent (fp16 takes
    the same path; it is exercised on the GPU, CPU fp16 convolutions being very slow)."""
    ids, style = sample(10, 6, random_full.voices)
    out = Engine(random_full, EngineConfig("cpu", "bf16", noise=False, bucketed=True, fused_kernels=False)).synthesize(ids, style)
    assert np.isfinite(out.audio).all() and len(out.audio) == int(out.durations.sum()) * 600


def test_padded_run_equals_unpadded(random_full, quiet_fp32):
    plain = quiet_fp32
    padded = Engine(random_full, EngineConfig("cpu", "fp32", noise=False, bucketed=True))
    ids, style = sample(21, 3, random_full.voices)  # 23 tokens in the 32 bucket
    a, b = plain.synthesize(ids, style), padded.synthesize(ids, style)
    assert np.array_equal(a.durations, b.durations)
    frames = int(a.durations.sum())
    assert len(a.audio) == len(b.audio) == frames * 600
    assert snr_db(a.audio, b.audio) >= 30.0


def test_noise_is_seeded_and_reproducible(random_full):
    engine = Engine(random_full, EngineConfig("cpu", "fp32", seed=7, noise=True))
    ids, style = sample(10, 4, random_full.voices)
    first, second = engine.synthesize(ids, style), engine.synthesize(ids, style)
    assert np.array_equal(first.audio, second.audio)
    engine.seed = 8  # the seed is read per synthesis
    other_seed = engine.synthesize(ids, style)
    engine.noise = False
    quiet = engine.synthesize(ids, style)
    assert not np.array_equal(first.audio, other_seed.audio)
    assert not np.array_equal(first.audio, quiet.audio)


def test_bf16_keeps_the_parity_bound(random_full, quiet_fp32):
    fp32 = quiet_fp32
    bf16 = Engine(random_full, EngineConfig("cpu", "bf16", noise=False))
    ids, style = sample(40, 5, random_full.voices)
    a, b = fp32.synthesize(ids, style), bf16.synthesize(ids, style)
    assert (np.abs(a.durations - b.durations) <= 1).mean() >= 0.99
    assert log_spectral_distance_db(a.audio, b.audio) <= 1.0
    # so `auto` may pick it where the CPU runs bf16 convolutions natively (int8 or fp32 elsewhere)
    from worker.cpu_features import cpu_info
    from worker.engine import cpu_has_bf16, resolve_dtype

    other = "int8" if cpu_info().has("avx2") else "fp32"
    assert resolve_dtype("auto", torch.device("cpu")) == ("bf16" if cpu_has_bf16() else other)


def test_engine_rejects_what_it_cannot_synthesize(quiet_fp32):
    engine = quiet_fp32
    style = torch.zeros(256)
    with pytest.raises(ValueError, match="at most 510"):
        engine.synthesize([16] * 511, style)
    with pytest.raises(ValueError, match="speed"):
        engine.synthesize([16], style, speed=0.0)


# --- the sizes come from the config: the tiny one -------------------------------------------------

def test_tiny_config_sizes_reach_every_stage(tiny_weights):
    """hidden_dim, decoder_dim, decoder_asr_res_dim and upsample_initial_channel are read from the
    config everywhere (stage 2's feature split, the decoder, the engine's static buffers): the tiny
    model runs padded and unpadded to the same audio, at 600 samples per frame."""
    from worker.cuda_graphs import CudaGraphs

    plain = Engine(tiny_weights, EngineConfig("cpu", "fp32", noise=False, fused_kernels=False))
    padded = Engine(tiny_weights, EngineConfig("cpu", "fp32", noise=False, bucketed=True, fused_kernels=False))
    ids, style = sample(21, 3, tiny_weights.voices)
    a, b = plain.synthesize(ids, style), padded.synthesize(ids, style)
    assert np.array_equal(a.durations, b.durations)
    assert len(a.audio) == len(b.audio) == int(a.durations.sum()) * 600
    assert np.isfinite(a.audio).all() and snr_db(a.audio, b.audio) >= 30.0
    # the CUDA-graph static buffers (allocated on CPU here) are as wide as stage 1's features
    cfg = tiny_weights.config
    tokens = torch.tensor([[0, *ids, 0]])
    _, features = plain.model.stage1(tokens, None, style.reshape(1, -1), torch.ones(1))
    assert features.shape[-1] == 2 * cfg["hidden_dim"] + cfg["style_dim"]
    assert CudaGraphs(plain).features.shape[-1] == features.shape[-1]


# --- the real weights (offline bundle) -----------------------------------------------------------

REAL_PHONEMES = "həlˈoʊ fɹʌm kˈoʊkəɹoʊ flˈit. ðɪs ɪz ɐ tˈɛst ʌv ðə pˈæɹɪti."


@pytest.fixture(scope="module")
def real_sample(real_weights):
    vocab = real_weights.config["vocab"]
    ids = [vocab[p] for p in REAL_PHONEMES if p in vocab]
    return ids, real_weights.voices["af_heart"][len(ids) - 1]


@pytest.fixture(scope="module")
def real_fp32(real_weights):
    return Engine(real_weights, EngineConfig("cpu", "fp32", noise=False))


@pytest.mark.slow
def test_real_weights_load_strictly_and_match_the_reference(real_weights, real_sample, real_fp32):
    reference = build_reference(real_weights.config, real_weights.state_dict)  # strict inside
    engine = real_fp32
    ids, style = real_sample
    with reference_noise_off():
        ref_audio, ref_durations = reference_synthesize(reference, torch.tensor([[0, *ids, 0]]), style[None])
    ours = engine.synthesize(ids, style)
    assert np.array_equal(ours.durations, ref_durations.numpy())
    assert snr_db(ref_audio.numpy(), ours.audio) >= 30.0


@pytest.mark.slow
def test_real_weights_padded_and_bf16(real_weights, real_sample, real_fp32):
    ids, style = real_sample
    plain = real_fp32.synthesize(ids, style)
    padded = Engine(real_weights, EngineConfig("cpu", "fp32", noise=False, bucketed=True)).synthesize(ids, style)
    assert np.array_equal(plain.durations, padded.durations)
    assert snr_db(plain.audio, padded.audio) >= 30.0
    bf16 = Engine(real_weights, EngineConfig("cpu", "bf16", noise=False)).synthesize(ids, style)
    assert (np.abs(plain.durations - bf16.durations) <= 1).mean() >= 0.99
    assert log_spectral_distance_db(plain.audio, bf16.audio) <= 1.0
    # the CUDA-graph path's arithmetic: padded, bf16, eager elementwise kernels
    graph_like = Engine(real_weights, EngineConfig("cpu", "bf16", noise=False, bucketed=True, fused_kernels=False))
    out = graph_like.synthesize(ids, style)
    assert (np.abs(plain.durations - out.durations) <= 1).mean() >= 0.99
    assert log_spectral_distance_db(plain.audio, out.audio) <= 1.0


@pytest.mark.slow
@pytest.mark.parametrize("size", [100, 250])
def test_real_weights_int8_keeps_the_parity_bound(real_weights, real_fp32, size):
    """The int8 mode (`auto` on CPUs with AVX2 but no native bf16) against float32 on the bench's
    chunks: durations within a frame for 99% of tokens, log-spectrogram within 1 dB; its noise
    is seeded like every mode's."""
    from loadtest.bench.engine_bench import chunk_ids

    ids = chunk_ids(real_weights.config["vocab"], size)
    style = real_weights.voices["af_heart"][len(ids) - 1]
    plain = real_fp32.synthesize(ids, style)
    int8 = Engine(real_weights, EngineConfig("cpu", "int8", noise=False))
    out = int8.synthesize(ids, style)
    within = (np.abs(plain.durations - out.durations) <= 1).mean()
    lsd = log_spectral_distance_db(plain.audio, out.audio)
    print(f"int8 vs fp32, {size} phonemes: durations within a frame {within:.3f}, log-spectral distance {lsd:.2f} dB")
    assert len(out.durations) == len(ids) + 2 and within >= 0.99
    assert len(out.audio) == int(out.durations.sum()) * 600
    assert lsd <= 1.0
    int8.noise, int8.seed = True, 7
    first, again = int8.synthesize(ids, style), int8.synthesize(ids, style)
    assert np.array_equal(first.audio, again.audio), "seeded noise must give the same audio"


def test_int8_conv_is_the_window_quantized_conv():
    """int8_conv = conv(Snake(AdaIN(x))) with the Snake output quantized per window (with the halo
    the window's outputs read, zeros beyond the ends), exactly up to float rounding; and close to
    the float32 conv."""
    from worker.model import layers

    g = torch.Generator().manual_seed(0)
    C, T, k, d, window = 24, 1000, 7, 3, 128
    conv = layers.WNConv1d(C, C, k, 1, dilation=d, padding=(k - 1) * d // 2)
    conv.fold()
    conv.requires_grad_(False)
    x = layers.time_major(torch.randn(1, C, T, generator=g) * torch.linspace(0.01, 3, T))  # loud and quiet
    scale, shift = torch.rand(1, C, 1, generator=g) + 0.5, torch.randn(1, C, 1, generator=g) * 0.1
    alpha = torch.rand(1, C, 1, generator=g) + 0.2
    y = layers._styled_snake(x, scale, shift, alpha, 1 / alpha, torch.float32)
    exact = F.conv1d(y, conv.weight, conv.bias, 1, conv.padding, d)
    conv.use_int8(63, window)
    residual = layers.time_major(torch.randn(1, C, T, generator=g))
    for kernels_compiled in (False, True):
        layers.use_compiled_kernels(kernels_compiled)
        out, (mean, var) = layers.int8_conv(x, scale, shift, alpha, 1 / alpha, layers.Span(), conv)
        assert out.shape == (1, C, T) and out.stride(1) == 1  # time-major, like the float path
        v, m = torch.var_mean(out, dim=-1, keepdim=True, correction=0)
        assert torch.allclose(mean, m, atol=1e-5) and torch.allclose(var, v, rtol=1e-4)
        # the same arithmetic in float: dequantized windows, dequantized weights, valid convolutions
        q, step, zero = layers._styled_snake_int8(*(a.transpose(1, 2) for a in (x, scale, shift, alpha, 1 / alpha)),
                                                  None, window, conv.padding[0])
        _, w_scales, _, _ = conv._int8
        weight = torch.round(conv.weight / w_scales[:, None, None]).clamp(-63, 63) * w_scales[:, None, None]
        windows = (q[0].float() - zero[0, :, None, None]) * step[0, :, None, None]  # [N, W + 2 halo, C]
        reference = F.conv1d(windows.transpose(1, 2), weight, conv.bias, 1, 0, d)  # [N, C, W]
        reference = reference.transpose(0, 1).reshape(C, -1)[:, :T]
        assert torch.allclose(out[0], reference, rtol=1e-4, atol=1e-4 * float(reference.abs().max()))
        assert float((out - exact).norm() / exact.norm()) < 0.02
        with_residual, _ = layers.int8_conv(x, scale, shift, alpha, 1 / alpha, layers.Span(), conv, residual=residual)
        assert torch.allclose(with_residual, out + residual, atol=1e-5)


def test_fused_kernels_match_eager_ones():
    from worker.model import layers

    g = torch.Generator().manual_seed(0)
    x = torch.randn(1, 16, 999, generator=g) * 3 + 1
    scale, shift = torch.rand(1, 16, 1, generator=g) + 0.5, torch.randn(1, 16, 1, generator=g)
    alpha = torch.rand(1, 16, 1, generator=g) + 0.2
    eager = (layers._stats(x, 1e-5), layers._styled_snake(x, scale, shift, alpha, 1 / alpha, torch.float32),
             layers._styled_leaky_relu(x, scale, shift, 0.2))
    var, mean = torch.var_mean(x, dim=-1, keepdim=True, correction=0)
    assert torch.allclose(eager[0][0], mean, atol=1e-5) and torch.allclose(eager[0][1], torch.rsqrt(var + 1e-5), rtol=1e-4)
    layers.use_compiled_kernels(True)
    k = layers.kernels
    fused = (k.stats(x, 1e-5), k.snake(x, scale, shift, alpha, 1 / alpha, torch.float32), k.leaky_relu(x, scale, shift, 0.2))
    assert k.compiled, "the compiled kernels fell back to eager"
    assert all(torch.allclose(a, b, rtol=1e-4, atol=1e-5) for a, b in zip(eager[0], fused[0]))
    assert torch.allclose(eager[1], fused[1], rtol=1e-4, atol=1e-4)
    assert torch.allclose(eager[2], fused[2], rtol=1e-5, atol=1e-5)
    bf16 = k.snake(x.bfloat16(), scale, shift, alpha, 1 / alpha, torch.bfloat16)
    assert bf16.dtype == torch.bfloat16 and torch.allclose(bf16.float(), eager[1], rtol=2e-2, atol=2e-2)


def test_fused_kernels_stay_compiled_across_many_variants_in_a_worker_thread():
    """Syntheses run in worker threads, where dynamo's settings are the thread's own: the raised
    recompile limit must hold there, or the many (channels, dtype, grad mode) variants of a process
    holding two models hit the default 8 and every kernel falls back to eager."""
    import threading

    from worker.model import layers

    layers.use_compiled_kernels(True)
    k = layers.kernels
    seen = {}

    def run():
        layers.use_compiled_kernels(True)  # the choice is the thread's own, as an engine makes it per synthesis
        for dtype in (torch.float32, torch.bfloat16):
            for grad in (False, True):
                for channels in (16, 22, 48, 96, 1090):
                    x = torch.randn(1, channels, 37).to(dtype)
                    ones = torch.ones(1, channels, 1)
                    with torch.set_grad_enabled(grad):
                        k.snake(x, ones, ones * 0, ones, ones, dtype)
                        k.stats(x, 1e-5)
        seen["limit"] = torch._dynamo.config.recompile_limit
        seen["compiled"] = k.compiled

    worker = threading.Thread(target=run)
    worker.start()
    worker.join()
    assert seen["limit"] >= 64 and seen["compiled"] and k.compiled and not k.broken
