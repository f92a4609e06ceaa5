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
to its own lengths (worker/model/kokoro.py); each item draws its single run's noise, so its result
does not depend on its mates.

Compiled passes (CUDA by default, `compiled=True` elsewhere): stage 2's decoder runs through
torch.compile (inductor; KokoroModel.use_compiled_decode), one compile per shape family (a batch
of one, a batch), cached once per host (worker/compile_cache.py). On CUDA both the single-chunk
graphs and `BatchGraphs` (worker/cuda_graphs.py) capture it: one CUDA graph per (batch bucket,
frame bucket) within a memory bound, so a batch launches once; a batch beyond the grid runs
compiled, launched eagerly.
Stage 1 stays eager float32 for batches (it decides the durations, costs little beside stage 2
and holds LSTMs that dynamo cannot trace); single chunks replay its graphs as before.
A pass that runs out of device memory frees the allocator's cached blocks, logs one line and
raises: its caller retries a batch's jobs one at a time (api/speech/lease_loop.py) or fails them.
Only torch, transformers, numpy and the standard library are imported, so this runs on a bare
GPU box.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import time
from dataclasses import dataclass
from typing import Sequence

from pathlib import Path

import numpy as np
import torch

from worker import cpu_features
from worker.audio import SAMPLE_RATE, SAMPLES_PER_FRAME
from worker.cpu_runtime import keep_freed_memory
from worker.cuda_graphs import HARMONICS, TOKEN_BUCKETS, BatchGraphs, CudaGraphs
from worker.device import resolve_device
from worker.model import KokoroModel
from worker.model.layers import kernels, use_compiled_kernels
from worker.weights.served_weights import fold, serving_state_dict

log = logging.getLogger("kokoro_fleet.engine")

# Exact until a GPU run shows `fast` within the parity bounds (loadtest/bench/gpu_parity.py measures both):
# parity decides first, speed second.
STAGE2_ARITHMETIC = "exact"
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


@contextlib.contextmanager
def stage2_arithmetic(device: torch.device, fast: bool):
    """Stage 2 with TF32 and cudnn.benchmark (`fast`), back to exact arithmetic after it. Stage 1
    always runs exact: it decides the durations."""
    if device.type != "cuda" or not fast:
        yield
        return
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    torch.backends.cudnn.deterministic = False
    torch.backends.cudnn.benchmark = True
    try:
        yield
    finally:
        use_exact_cuda_arithmetic()


def free_cached_device_memory(device: torch.device) -> None:
    """Hand the caching allocator's unused blocks back to the device (CUDA only: the CPU's heap is
    the process's own)."""
    if device.type == "cuda":
        torch.cuda.empty_cache()


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
                 fused_kernels: bool | None = None, compiled: bool | None = None,
                 stage2: str = STAGE2_ARITHMETIC, max_batch: int = 1, batch_graph_frames: int = 16384,
                 compile_cache_dir: str | os.PathLike | None = None):
        """weights: a worker.weights.Weights. noise=False switches the
        excitation noise off (parity tests). bucketed: pad to buckets (default: on CUDA only).
        fused_kernels: torch.compile'd elementwise kernels on CPU (default on; the first engine in
        a fresh environment pays about half a minute of compiling at its first synthesis).
        compiled: stage 2's decoder through torch.compile (default: on CUDA; never in int8 mode,
        whose kernels are oneDNN's). stage2: `exact` or `fast` arithmetic for stage 2 on CUDA.
        max_batch: the largest batch served (batch graphs are captured up to its bucket).
        batch_graph_frames: the batch graphs' memory bound, batch bucket x frame bucket at most
        this. compile_cache_dir: the host's shared compile cache (worker/compile_cache.py)."""
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
        self.compiled = (self.device.type == "cuda") if compiled is None else compiled
        self.compiled = self.compiled and self.dtype != "int8"
        if stage2 not in ("exact", "fast"):
            raise ValueError(f"stage2 arithmetic {stage2!r}: expected exact or fast")
        self.fast_stage2 = stage2 == "fast"
        self.max_batch = max_batch
        self.batch_graph_frames = batch_graph_frames
        self.compile_cache_dir = compile_cache_dir
        self.compile_record = None
        # The compiled decoder fuses what the CPU's fused kernels would (and cannot trace through them).
        fused_default = self.device.type == "cpu" and not self.compiled
        self.fused_kernels = fused_default if fused_kernels is None else (fused_kernels and not self.compiled)
        # Built on `meta` around the served parameters themselves. On the CPU they are the pages of
        # the host's serving file, shared by every replica on the host; a GPU holds its own copy
        # anyway, so there they are folded in memory on their way to it.
        decoder_dtype = DTYPES[self.dtype]
        served = serving_state_dict(weights, decoder_dtype) if self.device.type == "cpu" else fold(weights, decoder_dtype)
        self.model = KokoroModel.for_serving(weights.config, served, decoder_dtype, self.device)
        if self.dtype == "int8":
            self.model.use_int8(cpu_features.int8_weight_levels())
        self.model.use_compiled_decode(self.compiled)
        self.generator = torch.Generator(device=self.device)
        self._noise = torch.empty(0, device=self.device)
        self._speed = torch.ones(1, device=self.device)
        self.model.positions(SAMPLES_PER_FRAME * self.frame_grid[-1] + 64)  # reserve the largest bucket
        self.graphs: CudaGraphs | None = None
        self.batch_graphs: BatchGraphs | None = None
        self.want_graphs = cuda_graphs and self.device.type == "cuda"
        self.pass_frames: int | None = None  # the longest item's frames in the pass in hand, once stage 1 has said

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
        with self._out_of_memory_freed(chunks=1, tokens=n_tokens):
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
        noise its single run draws. One item is a single run. On CUDA a batch within the graph grid
        replays its (batch bucket, frame bucket) graph; others run eagerly (compiled or not)."""
        for item in items:
            self._check(item.ids, item.speed)
        if len(items) <= 1:
            return [self.synthesize(item.ids, item.style, item.speed) for item in items]
        if self.device.type == "cpu":
            use_compiled_kernels(self.fused_kernels)
        with self._out_of_memory_freed(chunks=len(items), tokens=max(len(item.ids) + 2 for item in items)):
            return self._run_batch(items)

    @torch.inference_mode()
    def warmup(self) -> None:
        """Compile (compiled passes), capture CUDA graphs (CUDA), run a couple of short syntheses
        (oneDNN primitive caches)."""
        if self.compiled and self.compile_record is None:
            self._compile()
        if self.want_graphs and self.graphs is None:
            try:
                graphs = CudaGraphs(self)
                graphs.capture()
                self.graphs = graphs
            except Exception:  # a capture that fails must not take the replica down: serve eagerly
                log.exception("CUDA graph capture failed; serving eagerly")
                self.graphs = None
                torch.cuda.synchronize()
        if (self.want_graphs and self.compiled and self.max_batch > 1 and self.batch_graph_frames > 0
                and self.batch_graphs is None):
            try:
                batch_graphs = BatchGraphs(self)
                batch_graphs.capture()
                self.batch_graphs = batch_graphs
            except Exception:  # as above: batches then run compiled, launched eagerly
                log.exception("CUDA graph capture of batches failed; batches run without graphs")
                self.batch_graphs = None
                torch.cuda.synchronize()
        if self.compiled and self.device.type == "cpu":
            # A compiled CPU engine (tests, bench) would compile its single-chunk family here, which
            # takes minutes on a small CPU: it compiles at its first single chunk instead.
            return
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

    def _compile(self) -> None:
        """Compile the families this engine serves (a batch of one on CUDA, a batch when it batches)
        under the host's compile lock: the first replica on a host compiles, the others load."""
        from worker.compile_cache import default_compile_cache_dir, shared_compile

        directory = self.compile_cache_dir or default_compile_cache_dir(self.device)
        ids = [16, 43, 54, 16, 56, 57] * 5
        style = torch.zeros(2 * self.model.style_dim)
        families = ("single-" if self.device.type == "cuda" else "") + ("batch" if self.max_batch > 1 else "")
        key = f"decode-{self.dtype}-{families}-noise{int(self.noise)}-{'fast' if self.fast_stage2 else 'exact'}"
        with shared_compile(Path(directory), key) as record:
            if self.device.type == "cuda":
                self.synthesize(ids, style)
            if self.max_batch > 1:
                self.synthesize_batch([BatchItem(ids, style), BatchItem(ids[:20], style)])
        self.compile_record = record

    @contextlib.contextmanager
    def _out_of_memory_freed(self, chunks: int, tokens: int):
        """A pass that runs out of device memory fails (its jobs are retried or failed by the
        caller), but first hands the allocator's cached blocks back: the next pass, smaller or
        alone, then finds the memory this one could not."""
        self.pass_frames = None
        try:
            yield
        except torch.OutOfMemoryError:
            free_cached_device_memory(self.device)
            log.error("out of memory on %s in a pass of %d chunk(s), %d tokens and %s frames at most: the pass "
                      "failed, cached device memory freed for the next", self.device, chunks, tokens,
                      self.pass_frames if self.pass_frames is not None else "unknown")
            raise

    def _stage2_arithmetic(self):
        return stage2_arithmetic(self.device, self.fast_stage2)

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
        frames = self.pass_frames = int(durations.sum())  # the one sync
        bucket = self._frame_bucket(frames)
        # the compiled decoder serves padded runs only (an unpadded one would be a family of its own)
        n_frames = torch.tensor([frames], device=self.device) if bucket is not None or self.compiled else None
        with self._stage2_arithmetic():
            audio = model.stage2(durations, features, n_frames, bucket or frames, style,
                                 self.noise_for(bucket or frames))
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
        longest = self.pass_frames = max(frames)
        bucket = self._frame_bucket(longest) or longest
        audio = None if self.batch_graphs is None else self.batch_graphs.replay(durations, features, frames, styles)
        if audio is None:
            with self._stage2_arithmetic():
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
        return self.draw_batch_noise(torch.empty(len(frames), SAMPLES_PER_FRAME * bucket, HARMONICS,
                                                 device=self.device), frames)

    def draw_batch_noise(self, noise: torch.Tensor, frames: Sequence[int]) -> torch.Tensor:
        """Fill noise [>= B, 600 * bucket, 9] as `_batch_noise` describes (rows past B: zeros)."""
        noise.zero_()
        for row, f in enumerate(frames):
            single = self._frame_bucket(f) or f
            self.generator.manual_seed(self.seed)
            noise[row, :SAMPLES_PER_FRAME * single].normal_(generator=self.generator)
        return noise
