"""The inference engine: one KokoroModel on one device, token ids + style -> audio + durations.

On CUDA both stages run as CUDA graphs captured per bucket at start-up (stage 1 per token-count
bucket, stage 2 per frame-count bucket on a geometric grid), replayed per chunk; a chunk beyond
the largest frame bucket runs eagerly. Between the stages the engine reads the total frame count:
the only device-to-host sync before the audio itself comes back.

On CPU the same model code runs eagerly on exact shapes (padding would only add work there), the
generator on time-major activations as channels-last convolutions (worker/model/decoder.py), its
elementwise steps as torch.compile'd kernels. `auto` picks bf16 where the CPU runs it natively
(AVX512-BF16 or AMX: worker/cpu_features.py); else int8 where the CPU has AVX2: the generator's
residual blocks (resblocks and noise_res, about three quarters of a synthesis in float32) convolve
u8 activations with s8 weights through oneDNN, each convolution's input quantized per window of
600 steps with its own scale (per-tensor scales, kokoro-onnx's way, miss the parity bound: quiet
stretches lose their precision), while stage 1 (durations), F0 and the rest of the decoder stay
float32 (KokoroModel.use_int8); else fp32. Both pass the parity bound against fp32 on the real
weights (tests/unit/test_model.py).
`synthesize_batch` runs several chunks in one forward pass, each padded to the longest and masked
to its own lengths (worker/model/kokoro.py), eagerly on every device (no CUDA graphs per batch
size yet); each item draws its single run's noise, so its result does not depend on its mates.
Only torch, transformers, numpy and the standard library are imported, so this runs on a bare
GPU box.
"""

from __future__ import annotations

import logging
import math
import os
import time
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

from worker import cpu_features
from worker.audio import SAMPLE_RATE, SAMPLES_PER_FRAME
from worker.cpu_runtime import keep_freed_memory
from worker.device import resolve_device
from worker.model import KokoroModel
from worker.model.layers import kernels, use_compiled_kernels
from worker.weights.served_weights import fold, serving_state_dict

log = logging.getLogger("kokoro_fleet.engine")

TOKEN_BUCKETS = (16, 32, 64, 128, 256, 512)
HARMONICS = 9  # the sine source's 1 + 8 harmonics (noise is drawn per harmonic)
# Each mode's decoder dtype. int8 (CPU only) serves the float32 parameters and quantizes the
# generator's convolutions at start-up (KokoroModel.use_int8).
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16, "int8": torch.float32}


def frame_buckets(first: int = 32, last: int = 6144, ratio: float = 1.25) -> tuple[int, ...]:
    """A geometric grid of frame counts (multiples of 8), so padding wastes at most ~25%."""
    buckets, size = [], first
    while size < last:
        buckets.append(size)
        size = int(math.ceil(size * ratio / 8) * 8)
    buckets.append(last)
    return tuple(buckets)


def use_exact_cuda_arithmetic() -> None:
    """float32 that is float32, and the same result for the same input, on CUDA (process-wide: one
    engine per replica process).

    cuDNN convolutions default to TF32 in float32, which rounds differently per shape, so padding a
    chunk to its bucket or batching it would change its audio far beyond float rounding; the float32
    parts of every mode (durations, F0, the excitation source) need float32. Deterministic cuDNN
    makes a chunk's audio bit-identical run to run, as the seeded noise promises. Figures and cost:
    loadtest/README.md ("Figures behind the code's choices"; loadtest/bench/parity_diagnosis.py)."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False


def cpu_has_bf16() -> bool:
    """AVX512-BF16 or AMX: oneDNN then runs bf16 convolutions about twice as fast as float32."""
    return cpu_features.cpu_info().native("bf16")


def resolve_dtype(dtype: str, device: torch.device) -> str:
    """`auto`: the fastest mode that passes the parity bound (tests/unit/test_model.py checks the
    bound on CPU; loadtest/bench/gpu_parity.py on CUDA): bf16 on CUDA, on the CPU `cpu_auto_dtype`."""
    if dtype != "auto":
        if dtype not in DTYPES:
            raise ValueError(f"dtype {dtype!r}: expected auto, fp32, bf16, fp16 or int8")
        if dtype == "int8" and device.type != "cpu":
            raise ValueError("dtype 'int8' runs on the CPU only (oneDNN int8 convolutions)")
        return dtype
    if device.type == "cuda":
        return "bf16"
    return cpu_auto_dtype(cpu_features.cpu_info())


def cpu_auto_dtype(info: cpu_features.CpuInfo) -> str:
    """The fastest CPU mode that passes the parity bound here, never one the CPU would emulate:
    bf16 with AVX512-BF16 or AMX; else int8 (oneDNN's u8 x s8 convolutions, AVX2 and up: see
    KokoroModel.use_int8); else fp32."""
    if info.native("bf16"):
        return "bf16"
    return "int8" if info.has("avx2") else "fp32"


@dataclass(frozen=True)
class BatchItem:
    """One chunk job of a batch: what `Engine.synthesize` takes for one chunk."""

    ids: Sequence[int]
    style: torch.Tensor  # [2S]: the voice pack's row for len(ids)
    speed: float = 1.0


@dataclass
class Synthesis:
    audio: np.ndarray  # float32 [samples], 24 kHz mono
    durations: np.ndarray  # int64 [len(ids) + 2]: frames (600 samples each) per token, pads included


class Engine:
    sample_rate = SAMPLE_RATE
    frame_samples = SAMPLES_PER_FRAME
    max_phonemes = 510

    def __init__(self, weights, device: str = "cpu", dtype: str = "fp32", seed: int = 0, cuda_graphs: bool = True,
                 noise: bool = True, bucketed: bool | None = None, frame_grid: Sequence[int] | None = None,
                 fused_kernels: bool | None = None):
        """weights: a worker.weights.Weights. noise=False switches the
        excitation noise off (parity tests). bucketed: pad to buckets (default: on CUDA only).
        fused_kernels: torch.compile'd elementwise kernels on CPU (default on; the first engine in
        a fresh environment pays about half a minute of compiling at its first synthesis)."""
        self.device = resolve_device(device)
        self.dtype = resolve_dtype(dtype, self.device)
        if self.device.type == "cuda":
            use_exact_cuda_arithmetic()
        if self.device.type == "cpu" and (warning := cpu_features.precision_warning(self.dtype)):
            log.warning(warning)
        if self.device.type == "cpu" and self.dtype == "int8":
            # Within a synthesis, large activations reuse freed memory instead of faulting in fresh
            # pages: measured to pay in int8 mode (AVX2 CPUs), not in bf16, so bf16 keeps the
            # lower resident memory of glibc's default.
            keep_freed_memory()
        self.seed = seed
        self.noise = noise
        self.bucketed = (self.device.type == "cuda") if bucketed is None else bucketed
        self.frame_grid = tuple(frame_grid) if frame_grid is not None else frame_buckets()
        self.fused_kernels = (self.device.type == "cpu") if fused_kernels is None else fused_kernels
        # Built on `meta` around the served parameters themselves. On the CPU they are the pages of
        # the host's serving file, shared by every replica on the host; a GPU holds its own copy
        # anyway, so there they are folded in memory on their way to it.
        decoder_dtype = DTYPES[self.dtype]
        served = serving_state_dict(weights, decoder_dtype) if self.device.type == "cpu" else fold(weights, decoder_dtype)
        self.model = KokoroModel.for_serving(weights.config, served, decoder_dtype, self.device)
        if self.dtype == "int8":
            self.model.use_int8(cpu_features.int8_weight_levels())
        self.generator = torch.Generator(device=self.device)
        self._noise = torch.empty(0, device=self.device)
        self._speed = torch.ones(1, device=self.device)
        self.model.positions(SAMPLES_PER_FRAME * self.frame_grid[-1] + 64)  # reserve the largest bucket
        self.graphs: CudaGraphs | None = None
        self.want_graphs = cuda_graphs and self.device.type == "cuda"

    @property
    def label(self) -> str:
        """What the fleet's replica table shows of this engine: "torch <device> <precision>"."""
        return f"torch {self.device.type} {self.dtype}"

    # --- public ------------------------------------------------------------------------------------

    @torch.inference_mode()
    def synthesize(self, ids: Sequence[int], style: torch.Tensor, speed: float = 1.0) -> Synthesis:
        """ids: phoneme ids without the boundary pads; style: [2S] = [256] (the voice pack's row)."""
        self._check(ids, speed)
        n_tokens = len(ids) + 2
        style = style.reshape(1, -1).to(self.device, torch.float32)
        if self.device.type == "cpu":
            use_compiled_kernels(self.fused_kernels)
        if self.graphs is not None:
            audio, durations = self.graphs.run(ids, style, speed)
        else:
            audio, durations = self._run_eager(ids, style, speed)
        return Synthesis(audio=audio, durations=durations[:n_tokens])

    @torch.inference_mode()
    def synthesize_batch(self, items: Sequence[BatchItem]) -> list[Synthesis]:
        """Several chunk jobs in one forward pass; each result equals that item's `synthesize` alone
        (durations exactly, audio to float rounding: the padded shapes sum in other orders), and
        does not depend on its batch mates: every item is masked to its own lengths and draws the
        noise its single run draws. One item is a single run. Eager on every device (no CUDA graphs
        per batch size yet)."""
        for item in items:
            self._check(item.ids, item.speed)
        if len(items) <= 1:
            return [self.synthesize(item.ids, item.style, item.speed) for item in items]
        if self.device.type == "cpu":
            use_compiled_kernels(self.fused_kernels)
        results = self._run_batch(items)
        return results

    @torch.inference_mode()
    def warmup(self) -> None:
        """Capture CUDA graphs (CUDA) or run a couple of short syntheses (oneDNN primitive caches)."""
        if self.want_graphs and self.graphs is None:
            try:
                graphs = CudaGraphs(self)
                graphs.capture()
                self.graphs = graphs
            except Exception:  # a capture that fails must not take the replica down: serve eagerly
                log.exception("CUDA graph capture failed; serving eagerly")
                self.graphs = None
                torch.cuda.synchronize()
        ids = [16, 43, 54, 16, 56, 57] * 5
        style = torch.zeros(2 * self.model.style_dim)  # [2S]: a voice row (256 in Kokoro-82M)
        compiling = self.device.type == "cpu" and self.fused_kernels
        if compiling:
            cache = os.environ.get("TORCHINDUCTOR_CACHE_DIR", "torch's default cache")
            log.info("warming up: compiling the fused CPU kernels (about half a minute on a first start; "
                     "cached in %s for the next)", cache)
        start = time.perf_counter()
        for _ in range(2):
            self.synthesize(ids, style)
        if compiling:
            log.info("warm-up done in %.1f s (fused kernels %s)", time.perf_counter() - start,
                     "compiled" if kernels.compiled else "unavailable: running eagerly")

    # --- internals ---------------------------------------------------------------------------------

    def _check(self, ids: Sequence[int], speed: float) -> None:
        if len(ids) > self.max_phonemes:
            raise ValueError(f"{len(ids)} phonemes in one chunk; at most {self.max_phonemes}")
        if not speed > 0:
            raise ValueError(f"speed must be positive, got {speed}")

    def _frame_bucket(self, frames: int) -> int | None:
        """The frame bucket a padded run uses (None: unbucketed engine, or beyond the grid)."""
        return next((b for b in self.frame_grid if b >= frames), None) if self.bucketed else None

    def noise_for(self, frames: int) -> torch.Tensor | None:
        """Standard normal noise [1, 600 * frames, 9], the same for the same frame count (the
        generator is reseeded per synthesis), drawn into a buffer that only grows."""
        if not self.noise:
            return None
        numel = SAMPLES_PER_FRAME * frames * HARMONICS
        if self._noise.numel() < numel:
            self._noise = torch.empty(numel, device=self.device)
        self.generator.manual_seed(self.seed)
        return self._noise[:numel].normal_(generator=self.generator).view(1, -1, HARMONICS)

    def _run_eager(self, ids: Sequence[int], style: torch.Tensor, speed: float) -> tuple[np.ndarray, np.ndarray]:
        model = self.model
        n_tokens = len(ids) + 2
        if self.bucketed:
            bucket = next(b for b in TOKEN_BUCKETS if b >= n_tokens)
            tokens = torch.zeros(1, bucket, dtype=torch.long)
            tokens[0, 1:n_tokens - 1] = torch.as_tensor(ids, dtype=torch.long)
            length = torch.tensor([n_tokens], device=self.device)
        else:
            tokens = torch.tensor([[0, *ids, 0]], dtype=torch.long)
            length = None
        tokens = tokens.to(self.device)
        self._speed.fill_(speed)
        durations, features = model.stage1(tokens, length, style, self._speed)
        frames = int(durations.sum())  # the one sync
        bucket = self._frame_bucket(frames)
        if bucket is None:
            audio = model.stage2(durations, features, None, frames, style, self.noise_for(frames))
        else:
            n_frames = torch.tensor([frames], device=self.device)
            audio = model.stage2(durations, features, n_frames, bucket, style, self.noise_for(bucket))
        audio = audio[0, :frames * SAMPLES_PER_FRAME].float().cpu().numpy()
        return audio, durations[0].cpu().numpy()

    def _run_batch(self, items: Sequence[BatchItem]) -> list[Synthesis]:
        """B items padded to the longest (or its bucket, when bucketed), each masked to its own
        token and frame counts."""
        model, device = self.model, self.device
        n_tokens = [len(item.ids) + 2 for item in items]
        width = max(n_tokens)
        if self.bucketed:
            width = next(b for b in TOKEN_BUCKETS if b >= width)
        tokens = torch.zeros(len(items), width, dtype=torch.long)
        for row, item in enumerate(items):
            tokens[row, 1:n_tokens[row] - 1] = torch.as_tensor(item.ids, dtype=torch.long)
        tokens = tokens.to(device)
        lengths = torch.tensor(n_tokens, device=device)
        styles = torch.stack([item.style.reshape(-1) for item in items]).to(device, torch.float32)  # [B, 2S]
        speeds = torch.tensor([float(item.speed) for item in items], dtype=torch.float32, device=device)
        durations, features = model.stage1(tokens, lengths, styles, speeds)
        frames = durations.sum(dim=1).tolist()  # the one sync
        longest = max(frames)
        bucket = self._frame_bucket(longest) or longest
        audio = model.stage2(durations, features, torch.tensor(frames, device=device), bucket, styles,
                             self._batch_noise(frames, bucket))
        audio = audio.float().cpu().numpy()
        durations = durations.cpu().numpy()
        return [Synthesis(audio=audio[row, :f * SAMPLES_PER_FRAME], durations=durations[row, :n])
                for row, (f, n) in enumerate(zip(frames, n_tokens))]

    def _batch_noise(self, frames: Sequence[int], bucket: int) -> torch.Tensor | None:
        """[B, 600 * bucket, 9]: row i holds exactly the draw of item i's single run (`noise_for` of
        its frame count, or of its bucket when bucketed), zeros after it, so no item's audio
        depends on what it was batched with."""
        if not self.noise:
            return None
        noise = torch.zeros(len(frames), SAMPLES_PER_FRAME * bucket, HARMONICS, device=self.device)
        for row, f in enumerate(frames):
            single = self._frame_bucket(f) or f
            self.generator.manual_seed(self.seed)
            noise[row, :SAMPLES_PER_FRAME * single].normal_(generator=self.generator)
        return noise


class CudaGraphs:
    """Both stages captured per bucket, sharing one memory pool and static input buffers.

    Stage-1 graphs write the durations and features into fixed [1, Tmax] / [1, Tmax, D + S + D]
    buffers (Tmax = 512 tokens, the largest bucket; D = hidden_dim, S = style_dim: 1152 wide in
    Kokoro-82M; zeros past the bucket), which every stage-2 graph reads; so stage 2 depends on the
    frame bucket alone. The noise is drawn into its static buffer before each replay (outside the
    graph), from the engine's seeded generator.
    """

    def __init__(self, engine: Engine):
        self.engine = engine
        model = engine.model
        device = engine.device
        self.max_tokens = TOKEN_BUCKETS[-1]
        width = model.predictor.shared.input_size + model.hidden_dim  # (D + S) + D
        self.ids = torch.zeros(1, self.max_tokens, dtype=torch.long, device=device)
        self.n_tokens = torch.zeros(1, dtype=torch.long, device=device)
        self.style = torch.zeros(1, 2 * model.style_dim, device=device)
        self.speed = torch.ones(1, device=device)
        self.durations = torch.zeros(1, self.max_tokens, dtype=torch.long, device=device)
        self.features = torch.zeros(1, self.max_tokens, width, device=device)
        self.total = torch.zeros(1, dtype=torch.long, device=device)
        self.n_frames = torch.zeros(1, dtype=torch.long, device=device)
        largest = engine.frame_grid[-1]
        self.noise = torch.zeros(1, SAMPLES_PER_FRAME * largest, HARMONICS, device=device) if engine.noise else None
        self.pool = None
        self.stage1_graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.stage2_graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self.capture_seconds = 0.0
        self.graph_bytes = 0
        self.reserved_bytes = 0

    def _stage1(self, bucket: int) -> None:
        durations, features = self.engine.model.stage1(self.ids[:, :bucket], self.n_tokens, self.style, self.speed)
        self.durations.zero_()
        self.features.zero_()
        self.durations[:, :bucket].copy_(durations)
        self.features[:, :bucket].copy_(features)
        self.total.copy_(durations.sum(dim=1))

    def _stage2(self, bucket: int) -> torch.Tensor:
        noise = None if self.noise is None else self.noise[:, :SAMPLES_PER_FRAME * bucket]
        return self.engine.model.stage2(self.durations, self.features, self.n_frames, bucket, self.style, noise)

    def _prime(self) -> None:
        """Inputs that make every bucket run a realistic path during warm-up and capture (the
        values captured do not matter: replays read the buffers)."""
        self.ids.fill_(16)
        self.style.zero_()
        self.speed.fill_(1.0)

    def capture(self) -> None:
        start = time.perf_counter()
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        self._prime()
        grid = sorted(self.engine.frame_grid, reverse=True)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up: cuDNN / cuFFT plans, allocator, lazy init
            for bucket in sorted(TOKEN_BUCKETS, reverse=True):
                self.n_tokens.fill_(bucket)
                for _ in range(2):
                    self._stage1(bucket)
            for bucket in grid:
                self.n_frames.fill_(bucket)
                for _ in range(2):
                    self._stage2(bucket)
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        self.pool = torch.cuda.graph_pool_handle()
        for bucket in grid:  # largest first, so smaller ones reuse its pool memory
            self.n_frames.fill_(bucket)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self.pool):
                audio = self._stage2(bucket)
            self.stage2_graphs[bucket] = (graph, audio)
        for bucket in sorted(TOKEN_BUCKETS, reverse=True):
            self.n_tokens.fill_(bucket)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self.pool):
                self._stage1(bucket)
            self.stage1_graphs[bucket] = graph
        torch.cuda.synchronize()
        # The warm-up's activations (every bucket, eagerly) stay cached by the allocator unless given
        # back; the replays need only the graphs' private pool.
        torch.cuda.empty_cache()
        self.capture_seconds = time.perf_counter() - start
        self.graph_bytes = torch.cuda.memory_allocated() - before
        self.reserved_bytes = torch.cuda.memory_reserved()
        log.info("captured %d stage-1 and %d stage-2 CUDA graphs in %.1f s, %.0f MiB allocated (static buffers and "
                 "outputs), %.0f MiB reserved by torch in all", len(self.stage1_graphs), len(self.stage2_graphs),
                 self.capture_seconds, self.graph_bytes / 2**20, self.reserved_bytes / 2**20)

    def run(self, ids: Sequence[int], style: torch.Tensor, speed: float) -> tuple[np.ndarray, np.ndarray]:
        engine = self.engine
        n_tokens = len(ids) + 2
        bucket = next(b for b in TOKEN_BUCKETS if b >= n_tokens)
        host_ids = torch.zeros(1, bucket, dtype=torch.long)
        host_ids[0, 1:n_tokens - 1] = torch.as_tensor(ids, dtype=torch.long)
        self.ids[:, :bucket].copy_(host_ids, non_blocking=True)
        self.n_tokens.fill_(n_tokens)
        self.style.copy_(style)
        self.speed.fill_(speed)
        self.stage1_graphs[bucket].replay()
        frames = int(self.total.item())  # the one sync
        frame_bucket = next((b for b in engine.frame_grid if b >= frames), None)
        if frame_bucket is None:  # beyond the grid: eager on exact shapes
            durations = self.durations[:, :bucket]
            audio = engine.model.stage2(durations, self.features[:, :bucket], None, frames, self.style,
                                        engine.noise_for(frames))
        else:
            self.n_frames.fill_(frames)
            if self.noise is not None:
                engine.generator.manual_seed(engine.seed)
                self.noise[:, :SAMPLES_PER_FRAME * frame_bucket].normal_(generator=engine.generator)
            graph, audio = self.stage2_graphs[frame_bucket]
            graph.replay()
        audio = audio[0, :frames * SAMPLES_PER_FRAME].float().cpu().numpy()
        return audio, self.durations[0, :n_tokens].cpu().numpy()
