"""The inference engine: one KokoroModel on one device, token ids + style -> audio + durations.

`Engine(weights, EngineConfig(...))` is the one way to build one; which passes it runs (precision,
padded or exact shapes, compiled / fused / eager decoder kernels, CUDA graphs for single chunks and
for batches) is decided once, at construction, in `EnginePasses.choose`, read top to bottom there.

On CUDA both stages run as CUDA graphs captured per bucket at start-up (stage 1 per token-count
bucket, stage 2 per frame-count bucket on a geometric grid), replayed per chunk; a chunk beyond
the largest frame bucket runs eagerly. Between the stages the engine reads the total frame count:
the only device-to-host sync before the audio itself comes back.

On CPU the same model code runs eagerly on exact shapes (padding would only add work there), the
generator on time-major activations as channels-last convolutions (worker/model/decoder.py), its
elementwise steps as torch.compile'd kernels once they are compiled (`warmup`, or `compile_kernels`
in a thread of its own while the engine serves with the eager ones: worker/replica.py). `auto` picks bf16 where the CPU runs it natively
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
of one, a batch), cached once per host (worker/compile_cache.py), the host's compile lock held
through the captures that follow. On CUDA both the single-chunk graphs and `BatchGraphs`
(worker/cuda_graphs.py) capture it: one CUDA graph per (batch bucket, frame bucket) within a
memory bound, so a batch launches once; a batch beyond the grid runs compiled, launched eagerly.
`run_report` says how the engine runs: compiled or not, graphs captured and replayed or why not.
Stage 1 stays eager float32 for batches (it decides the durations, costs little beside stage 2
and holds LSTMs that dynamo cannot trace); single chunks replay its graphs as before.
A pass that runs out of device memory frees the allocator's cached blocks, logs one line and
raises: its caller retries a batch's jobs one at a time (api/speech/dispatcher.py) or fails them.
Only torch, transformers, numpy and the standard library are imported, so this runs on a bare
GPU box.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import logging
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import torch

from worker import cpu_features
from worker.arithmetic import STAGE2_DEFAULT, check_stage2_mode, stage2_arithmetic, use_exact_cuda_arithmetic, uses_tf32
from worker.audio import SAMPLE_RATE, SAMPLES_PER_FRAME
from worker.cpu_runtime import keep_freed_memory
from worker.cuda_graphs import HARMONICS, TOKEN_BUCKETS, BatchGraphs, CudaGraphs
from worker.device import resolve_device
from worker.model import KokoroModel
from worker.model.layers import kernels, use_compiled_kernels
from worker.weights.served_weights import fold, serving_state_dict

log = logging.getLogger("kokoro_fleet.engine")

__all__ = ["BatchItem", "DTYPES", "Engine", "Synthesis", "resolve_device", "resolve_dtype", "stage2_arithmetic",
           "use_exact_cuda_arithmetic"]
# The short chunk every warm-up and compile runs (phoneme ids of ordinary English).
WARMUP_IDS = [16, 43, 54, 16, 56, 57] * 5
# A long chunk the fused-kernel compile runs too: beyond one int8 quantization window (600 steps)
# the kernels meet sizes dynamo specializes apart from a short chunk's, and would otherwise
# compile those variants while serving.
LONG_WARMUP_IDS = WARMUP_IDS * 10
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


@dataclass(frozen=True)
class EngineConfig:
    """How an engine runs (api/speech/build.py makes the server's from its settings).

    noise=False switches the excitation noise off (parity tests). bucketed: pad to buckets
    (default: on CUDA only); frame_grid: stage 2's frame buckets (default `frame_buckets()`).
    fused_kernels: torch.compile'd elementwise kernels on CPU (default on), compiled by `warmup` or
    `compile_kernels`; eager kernels until then. compiled: stage 2's decoder through torch.compile
    (default: on CUDA; never in int8 mode, whose kernels are oneDNN's). stage2: stage 2's
    arithmetic on CUDA, `exact`, `exact-nondeterministic` or `fast` (worker/arithmetic.py).
    cuda_graphs: capture the single-chunk passes as CUDA graphs (CUDA only); batch_graphs: the
    batches' (compiled engines only; None: as cuda_graphs). max_batch: the largest batch served
    (batch graphs are captured up to its bucket). batch_graph_frames: the batch graphs' memory
    bound, batch bucket x frame bucket at most this. compile_cache_dir: the host's shared compile
    cache (worker/compile_cache.py).
    """

    device: str = "cpu"
    dtype: str = "fp32"
    seed: int = 0
    cuda_graphs: bool = True
    noise: bool = True
    bucketed: bool | None = None
    frame_grid: Sequence[int] | None = None
    fused_kernels: bool | None = None
    compiled: bool | None = None
    stage2: str = STAGE2_DEFAULT
    max_batch: int = 1
    batch_graph_frames: int = 16384
    compile_cache_dir: str | os.PathLike | None = None
    batch_graphs: bool | None = None


@dataclass(frozen=True)
class EnginePasses:
    """Which passes an engine runs, chosen once, at construction, from its config and device
    (`choose`); `Engine.run_report` shows them. Every synthesis takes one of two paths:

    - one chunk (`Engine.synthesize`): replayed CUDA graphs of both stages (`graphs`), else stage 1
      then stage 2 run eagerly (`Engine._run_eager`);
    - a batch (`Engine.synthesize_batch`): stage 1 eagerly, then stage 2 as a replayed batch graph
      (`batch_graphs`), else eagerly (`Engine._run_batch`).

    Each path runs its stage 2 with the decoder's kernels: `compiled` (torch.compile'd stage 2),
    `fused` (the CPU's torch.compile'd elementwise kernels once compiled, eager until then) or
    `eager`, on `bucketed` shapes (padded to buckets: what graphs and compiled passes need) or exact
    ones, with the generator's convolutions in int8 where `dtype` is int8.
    """

    dtype: str            # resolved precision: fp32, bf16, fp16 or int8
    bucketed: bool        # pad to token and frame buckets (default: on CUDA)
    decoder: str          # "compiled", "fused" or "eager"
    graphs: bool          # capture the single-chunk passes as CUDA graphs
    batch_graphs: bool    # capture batches' stage 2 as CUDA graphs (compiled engines that batch)

    @classmethod
    def choose(cls, config: EngineConfig, device: torch.device) -> "EnginePasses":
        dtype = resolve_dtype(config.dtype, device)
        cuda = device.type == "cuda"
        compiled = (cuda if config.compiled is None else config.compiled) and dtype != "int8"
        # The compiled decoder fuses what the CPU's fused kernels would (and cannot trace through them).
        fused = (device.type == "cpu" and not compiled) if config.fused_kernels is None else config.fused_kernels
        decoder = "compiled" if compiled else "fused" if fused else "eager"
        graphs = config.cuda_graphs and cuda
        batch_graphs = config.cuda_graphs if config.batch_graphs is None else config.batch_graphs
        batch_graphs = (bool(batch_graphs) and cuda and compiled and config.max_batch > 1
                        and config.batch_graph_frames > 0)
        bucketed = cuda if config.bucketed is None else config.bucketed
        return cls(dtype, bucketed, decoder, graphs, batch_graphs)


class Engine:
    sample_rate = SAMPLE_RATE
    frame_samples = SAMPLES_PER_FRAME
    max_phonemes = 510

    def __init__(self, weights, config: EngineConfig = EngineConfig()):
        """weights: a worker.weights.Weights; config: how it runs (`Engine(weights, EngineConfig("cpu",
        "fp32", noise=False))`)."""
        self.config = config
        self.device = resolve_device(config.device)
        self.passes = EnginePasses.choose(config, self.device)
        self.dtype = self.passes.dtype
        self._prepare_host()
        # Read per synthesis (tests switch them between runs).
        self.seed = config.seed
        self.noise = config.noise
        self.frame_grid = tuple(config.frame_grid) if config.frame_grid is not None else frame_buckets()
        self.stage2 = check_stage2_mode(config.stage2)
        self.compile_record = None  # what the start-up compile did (compiled passes, or the fused CPU kernels)
        # Dynamo's counters from here: the record counts every compile of the engine's start.
        self._tally = self._new_tally() if self.compiled else None
        self._kernels_compiled = False  # the fused kernels in service (set between passes only)
        self.model = self._served_model(weights)
        self.generator = torch.Generator(device=self.device)
        self._noise = torch.empty(0, device=self.device)
        self._speed = torch.ones(1, device=self.device)
        self.model.positions(SAMPLES_PER_FRAME * self.frame_grid[-1] + 64)  # reserve the largest bucket
        self.graphs: CudaGraphs | None = None  # captured by `warmup` when the passes want them
        self.batch_graphs: BatchGraphs | None = None
        self.capture_errors: dict[str, str | None] = {"single": None, "batch": None}
        self.pass_frames: int | None = None  # the longest item's frames in the pass in hand, once stage 1 has said

    def _prepare_host(self) -> None:
        """What the device and precision ask of the process, once."""
        if self.device.type == "cuda":
            use_exact_cuda_arithmetic()
        if self.device.type == "cpu" and (warning := cpu_features.precision_warning(self.dtype)):
            log.warning(warning)
        if self.device.type == "cpu" and self.dtype == "int8":
            # Within a synthesis, large activations reuse freed memory instead of faulting in fresh
            # pages: measured to pay in int8 mode (AVX2 CPUs), not in bf16, so bf16 keeps the
            # lower resident memory of glibc's default.
            keep_freed_memory()

    def _served_model(self, weights) -> KokoroModel:
        """The model, built on `meta` around the served parameters themselves. On the CPU they are the
        pages of the host's serving file, shared by every replica on the host; a GPU holds its own copy
        anyway, so there they are folded in memory on their way to it."""
        decoder_dtype = DTYPES[self.dtype]
        served = serving_state_dict(weights, decoder_dtype) if self.device.type == "cpu" else fold(weights, decoder_dtype)
        model = KokoroModel.for_serving(weights.config, served, decoder_dtype, self.device)
        if self.dtype == "int8":
            model.use_int8(cpu_features.int8_weight_levels())
        model.use_compiled_decode(self.compiled)
        return model

    # --- the passes chosen (EnginePasses), and the config, as the rest of the engine reads them ----

    @property
    def bucketed(self) -> bool:
        return self.passes.bucketed

    @property
    def compiled(self) -> bool:
        return self.passes.decoder == "compiled"

    @property
    def fused_kernels(self) -> bool:
        return self.passes.decoder == "fused"

    @property
    def max_batch(self) -> int:
        return self.config.max_batch

    @property
    def batch_graph_frames(self) -> int:
        return self.config.batch_graph_frames

    @property
    def label(self) -> str:
        """What the fleet's replica table shows of this engine: "torch <device> <precision>"."""
        return f"torch {self.device.type} {self.dtype}"

    @property
    def kernels(self) -> str:
        """Which kernels the passes run now: `compiled` (the compiled decoder, or the fused CPU
        kernels once in service) or `eager`."""
        return "compiled" if self.compiled or (self.fused_kernels and self._kernels_compiled) else "eager"

    @property
    def kernels_pending(self) -> bool:
        """Fused CPU kernels wanted and not compiled yet (`compile_kernels`)."""
        return self.fused_kernels and self.compile_record is None and not kernels.broken

    # --- public ------------------------------------------------------------------------------------

    @torch.inference_mode()
    def synthesize(self, ids: Sequence[int], style: torch.Tensor, speed: float = 1.0) -> Synthesis:
        """ids: phoneme ids without the boundary pads; style: [2S] = [256] (the voice pack's row)."""
        self._check(ids, speed)
        n_tokens = len(ids) + 2
        style = style.reshape(1, -1).to(self.device, torch.float32)
        if not style.is_inference():  # a tensor made here, as every other input: dynamo guards on the kind
            style = style.clone()
        if self.device.type == "cpu":
            use_compiled_kernels(self.fused_kernels and self._kernels_compiled)
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
            use_compiled_kernels(self.fused_kernels and self._kernels_compiled)
        with self._out_of_memory_freed(chunks=len(items), tokens=max(len(item.ids) + 2 for item in items)):
            return self._run_batch(items)

    @torch.inference_mode()
    def warmup(self, compile_kernels: bool = True) -> None:
        """Compile the compiled passes and capture the CUDA graphs (CUDA), holding the host's
        compile lock through both when this process compiles; run a couple of short syntheses
        (oneDNN primitive caches). On the CPU the fused kernels are compiled here too, unless
        `compile_kernels` is False: the caller then serves eagerly and runs `compile_kernels` in a
        thread of its own (worker/replica.py)."""
        if self.compiled and self.compile_record is None:
            self.compile_passes(self.families, then=self._capture_graphs)
        else:
            self._capture_graphs()
        if self.compiled and self.device.type == "cpu":
            # A compiled CPU engine (tests, bench) would compile its single-chunk family here, which
            # takes minutes on a small CPU: it compiles at its first single chunk instead.
            return
        if compile_kernels and self.kernels_pending:
            self.compile_kernels()  # its syntheses warm the shared model's oneDNN caches too
            self.switch_to_compiled_kernels()
            return
        for _ in range(2):
            self.synthesize(WARMUP_IDS, torch.zeros(2 * self.model.style_dim))

    @property
    def families(self) -> tuple[str, ...]:
        """The compiled decoder's shape families this engine serves: a batch of one on CUDA
        (dynamo specializes size 1), a batch when it batches."""
        return (("single",) if self.device.type == "cuda" else ()) + (("batch",) if self.max_batch > 1 else ())

    def compile_passes(self, families: Sequence[str], then: Callable[[], None] | None = None):
        """Compile the decoder's `families` ("single", "batch") under the host's compile lock
        (worker/compile_cache.py: the first process on a host compiles, the others load), then run
        `then` (the start's warm-ups and captures) still holding it; the record counts both."""
        from worker.compile_cache import default_compile_cache_dir, shared_compile

        directory = Path(self.config.compile_cache_dir or default_compile_cache_dir(self.device))
        key = (f"decode-{self.dtype}-{'-'.join(families)}-noise{int(self.noise)}-"
               f"{'fast' if uses_tf32(self.stage2) else 'exact'}")
        tally = self._tally = self._tally or self._new_tally()
        with torch.inference_mode(), shared_compile(directory, key, "compiled passes", tally) as record:
            style = torch.zeros(2 * self.model.style_dim)
            if "single" in families:
                self.synthesize(WARMUP_IDS, style)
            if "batch" in families:
                self.synthesize_batch([BatchItem(WARMUP_IDS, style), BatchItem(WARMUP_IDS[:20], style)])
            tally.planned_compiles_done()  # one graph per family: whatever compiles next is a recompile
            if then is not None:
                then()
        self.compile_record = record
        return record

    def compile_kernels(self):
        """Compile the fused CPU kernels in the calling thread, on a view of this engine, while the
        engine itself may serve with eager kernels in another thread; returns the CompileRecord.
        Under the host's lock in inductor's cache directory: the first process on a host compiles,
        the others wait for it and load what it wrote. `switch_to_compiled_kernels` then puts them in
        service, between two passes."""
        from worker.compile_cache import CompileRecord, inductor_cache_dir, shared_compile

        view = self.view()
        view._kernels_compiled = True
        directory, key = inductor_cache_dir(), self._kernels_key()
        record = CompileRecord(directory, "fused CPU kernels")
        start, tally = time.perf_counter(), self._new_tally()
        try:
            with shared_compile(directory, key, "fused CPU kernels", tally) as record:
                style = torch.zeros(2 * self.model.style_dim)
                view.synthesize(WARMUP_IDS, style)
                view.synthesize(LONG_WARMUP_IDS, style)
                tally.planned_compiles_done()  # a variant per channel count, dtype and size class: all planned
                view.synthesize(WARMUP_IDS, style)
                if kernels.broken:
                    raise RuntimeError("torch.compile failed (see the warning above)")
        except Exception as error:  # noqa: BLE001 - a failed compile serves eagerly, and says so
            record.error, record.seconds = f"{type(error).__name__}: {error}", time.perf_counter() - start
            log.warning("pid %d: %s", os.getpid(), record.describe())
        self.compile_record = record
        return record

    def _kernels_key(self) -> str:
        """The fused kernels' name in the host's compile cache: what they are compiled for."""
        return (f"fused-kernels-{self.dtype}-{self.model.hidden_dim}x{self.model.style_dim}-"
                f"{len(WARMUP_IDS)}-{len(LONG_WARMUP_IDS)}")  # the chunk lengths its compile runs

    @property
    def kernels_cached(self) -> bool:
        """The host's compile cache holds this engine's fused CPU kernels: `compile_kernels` loads
        them (seconds) instead of compiling (a minute or more on a small CPU)."""
        from worker.compile_cache import compile_marker, inductor_cache_dir

        return compile_marker(inductor_cache_dir(), self._kernels_key()).exists()

    def switch_to_compiled_kernels(self) -> bool:
        """Put the fused kernels `compile_kernels` made in service (call between passes: a pass
        reads the choice once, at its start). Returns whether they are in service."""
        record = self.compile_record
        self._kernels_compiled = (self.fused_kernels and record is not None and record.error is None
                                  and not kernels.broken)
        return self._kernels_compiled

    def view(self) -> "Engine":
        """This engine's model and settings with noise, speed and generator buffers of its own and no
        CUDA graphs: for work in a second thread (the baseline's concurrent slots, the background
        compile) that must not touch the buffers of the passes in hand."""
        view = copy.copy(self)
        view.graphs = view.batch_graphs = None
        view.passes = dataclasses.replace(self.passes, graphs=False, batch_graphs=False)
        view.generator = torch.Generator(device=self.device)
        view._noise = torch.empty(0, device=self.device)
        view._speed = torch.ones(1, device=self.device)
        return view

    def run_report(self) -> dict:
        """How this engine runs, JSON-ready: device, card, torch version, precision, compiled or
        not, stage 2's arithmetic, which kernels, the CUDA graphs (wanted, captured, why not,
        replays) and what its start-up compile did (worker/compile_cache.py's CompileRecord)."""
        from worker.compile_cache import device_name

        single, batch = self.graphs, self.batch_graphs
        return {
            "device": self.device.type, "card": device_name(self.device), "torch": torch.__version__,
            "dtype": self.dtype, "compiled": self.compiled, "stage2": self.stage2, "kernels": self.kernels,
            "graphs": {
                "single": {"wanted": self.passes.graphs, "captured": single.count if single else 0,
                           "error": self.capture_errors["single"], "replays": single.replays if single else 0,
                           "beyond_grid": single.beyond_grid if single else 0},
                "batch": {"wanted": self.passes.batch_graphs, "captured": len(batch.graphs) if batch else 0,
                          "error": self.capture_errors["batch"], "replays": batch.replays if batch else 0,
                          "beyond_grid": batch.beyond_grid if batch else 0}},
            "compile": None if self.compile_record is None else self.compile_record.as_dict(),
        }

    # --- internals ---------------------------------------------------------------------------------

    @staticmethod
    def _new_tally():
        from worker.compile_cache import CompileTally

        return CompileTally()

    def _capture_graphs(self) -> None:
        """The single-chunk and batch CUDA graphs this engine wants. A capture that fails must not
        take the replica down: it serves without those graphs, and says why (log, `run_report`)."""
        if self.passes.graphs and self.graphs is None:
            try:
                graphs = CudaGraphs(self)
                graphs.capture()
                self.graphs = graphs
            except Exception as error:
                log.exception("CUDA graph capture failed; serving eagerly")
                self.capture_errors["single"] = f"{type(error).__name__}: {error}"
                self.graphs = None
                torch.cuda.synchronize()
        if self.passes.batch_graphs and self.batch_graphs is None:
            try:
                batch_graphs = BatchGraphs(self)
                batch_graphs.capture()
                self.batch_graphs = batch_graphs
            except Exception as error:  # as above: batches then run compiled, launched eagerly
                log.exception("CUDA graph capture of batches failed; batches run without graphs")
                self.capture_errors["batch"] = f"{type(error).__name__}: {error}"
                self.batch_graphs = None
                torch.cuda.synchronize()

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
        return stage2_arithmetic(self.device, self.stage2)

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
