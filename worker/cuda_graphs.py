"""CUDA graphs of the engine's passes (worker/engine.py), captured per bucket at start-up.

`CudaGraphs`: a single chunk's two stages, stage 1 per token-count bucket and stage 2 per
frame-count bucket. `BatchGraphs`: stage 2 of a batch per (batch bucket, frame bucket) within a
memory bound. Each takes the `worker.engine.Engine` whose model, buffers and seeded generator it
captures; padding is masked or trimmed, so a replay gives the eager run's audio.
"""

from __future__ import annotations

import contextlib
import logging
import time
from typing import Iterator, Sequence

import numpy as np
import torch

from worker.audio import SAMPLES_PER_FRAME

log = logging.getLogger("kokoro_fleet.engine")

TOKEN_BUCKETS = (16, 32, 64, 128, 256, 512)
BATCH_BUCKETS = (2, 4, 8, 16, 32, 64)
HARMONICS = 9  # the sine source's 1 + 8 harmonics (noise is drawn per harmonic)


@contextlib.contextmanager
def capture_session(graphs: "CudaGraphs | BatchGraphs") -> Iterator[None]:
    """Around the captures of `graphs`: first its eager `warm_up` on a side stream (torch's recipe for
    capturing: cuDNN / cuFFT plans, allocator, lazy init off the capture stream), then, once the
    captures in the body are done, the warm-up's activations (every bucket, eagerly) given back to
    the device (the replays need only the graphs' private pool), and what it all took in
    `capture_seconds`, `graph_bytes` and `reserved_bytes`."""
    start = time.perf_counter()
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        graphs.warm_up()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    yield
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    graphs.capture_seconds = time.perf_counter() - start
    graphs.graph_bytes = torch.cuda.memory_allocated() - before
    graphs.reserved_bytes = torch.cuda.memory_reserved()


class CudaGraphs:
    """Both stages captured per bucket, sharing one memory pool and static input buffers.

    Stage-1 graphs write the durations and features into fixed [1, Tmax] / [1, Tmax, D + S + D]
    buffers (Tmax = 512 tokens, the largest bucket; D = hidden_dim, S = style_dim: 1152 wide in
    Kokoro-82M; zeros past the bucket), which every stage-2 graph reads; so stage 2 depends on the
    frame bucket alone. The noise is drawn into its static buffer before each replay (outside the
    graph), from the engine's seeded generator. The buffer is flat and each bucket reads a
    contiguous view of its start, the layout the compiled decoder was traced with
    (`Engine.noise_for`): a slice of a [1, frames, 9] buffer would carry the largest bucket's
    stride, and dynamo would compile the family again for it.
    """

    def __init__(self, engine):
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
        self.noise = torch.zeros(SAMPLES_PER_FRAME * largest * HARMONICS, device=device) if engine.noise else None
        self.pool = None
        self.stage1_graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.stage2_graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self.capture_seconds = 0.0
        self.graph_bytes = 0
        self.reserved_bytes = 0
        self.replays = 0  # chunks whose stage 2 replayed a graph (a host-side count: no sync)
        self.beyond_grid = 0  # chunks past the largest frame bucket, run eagerly

    @property
    def count(self) -> int:
        """The graphs captured, both stages."""
        return len(self.stage1_graphs) + len(self.stage2_graphs)

    def _stage1(self, bucket: int) -> None:
        durations, features = self.engine.model.stage1(self.ids[:, :bucket], self.n_tokens, self.style, self.speed)
        self.durations.zero_()
        self.features.zero_()
        self.durations[:, :bucket].copy_(durations)
        self.features[:, :bucket].copy_(features)
        self.total.copy_(durations.sum(dim=1))

    def _noise(self, bucket: int) -> torch.Tensor | None:
        """[1, 600 * bucket, 9], contiguous: the start of the flat buffer."""
        return None if self.noise is None else self.noise[:SAMPLES_PER_FRAME * bucket * HARMONICS].view(1, -1, HARMONICS)

    def _stage2(self, bucket: int) -> torch.Tensor:
        noise = self._noise(bucket)
        return self.engine.model.stage2(self.durations, self.features, self.n_frames, bucket, self.style, noise)

    def _prime(self) -> None:
        """Inputs that make every bucket run a realistic path during warm-up and capture (the
        values captured do not matter: replays read the buffers)."""
        self.ids.fill_(16)
        self.style.zero_()
        self.speed.fill_(1.0)

    def warm_up(self) -> None:
        """Every bucket of both stages run twice eagerly on the static buffers, as capture does
        before capturing (cuDNN / cuFFT plans, allocator, lazy init); device-agnostic, so a CPU run
        replays what the compiled decoder sees during a capture (tests/unit/test_compiled_passes.py)."""
        self._prime()
        for bucket in sorted(TOKEN_BUCKETS, reverse=True):
            self.n_tokens.fill_(bucket)
            for _ in range(2):
                self._stage1(bucket)
        with self.engine._stage2_arithmetic():
            for bucket in sorted(self.engine.frame_grid, reverse=True):
                self.n_frames.fill_(bucket)
                for _ in range(2):
                    self._stage2(bucket)

    def capture(self) -> None:
        with capture_session(self):
            self.pool = torch.cuda.graph_pool_handle()
            for bucket in sorted(self.engine.frame_grid, reverse=True):  # largest first: smaller ones reuse its pool
                self.n_frames.fill_(bucket)
                graph = torch.cuda.CUDAGraph()
                with self.engine._stage2_arithmetic(), torch.cuda.graph(graph, pool=self.pool):
                    audio = self._stage2(bucket)
                self.stage2_graphs[bucket] = (graph, audio)
            for bucket in sorted(TOKEN_BUCKETS, reverse=True):
                self.n_tokens.fill_(bucket)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=self.pool):
                    self._stage1(bucket)
                self.stage1_graphs[bucket] = graph
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
        frames = engine.pass_frames = int(self.total.item())  # the one sync
        frame_bucket = next((b for b in engine.frame_grid if b >= frames), None)
        if frame_bucket is None:  # beyond the grid: eager on exact shapes
            self.beyond_grid += 1
            durations = self.durations[:, :bucket]
            n_frames = self.total if engine.compiled else None  # see Engine._run_eager
            with engine._stage2_arithmetic():
                audio = engine.model.stage2(durations, self.features[:, :bucket], n_frames, frames, self.style,
                                            engine.noise_for(frames))
        else:
            self.n_frames.fill_(frames)
            if self.noise is not None:
                engine.generator.manual_seed(engine.seed)
                self._noise(frame_bucket).normal_(generator=engine.generator)
            graph, audio = self.stage2_graphs[frame_bucket]
            graph.replay()
            self.replays += 1
        audio = audio[0, :frames * SAMPLES_PER_FRAME].float().cpu().numpy()
        return audio, self.durations[0, :n_tokens].cpu().numpy()


class BatchGraphs:
    """Stage 2 of a batch captured per (batch bucket, frame bucket): a batch of B chunks launches
    once, as a single chunk does.

    The grid holds the batch buckets up to the engine's largest batch and, for each, the frame
    buckets whose batch x frames stays within `batch_graph_frames` (the pool's activations grow with
    it). Every graph reads static [Bmax, Tmax] inputs and writes its audio into one shared output
    buffer, so the graphs share one memory pool (a replay reuses the pool's memory, never the
    outputs of another). Stage 1 runs eagerly (exact float32) before; its outputs are copied in,
    rows past B hold one masked frame (their audio is never read). Noise as `_batch_noise` draws it.
    """

    def __init__(self, engine):
        self.engine = engine
        model, device = engine.model, engine.device
        top = next((b for b in BATCH_BUCKETS if b >= engine.max_batch), BATCH_BUCKETS[-1])
        self.cells = sorted(((b, f) for b in BATCH_BUCKETS if b <= top for f in engine.frame_grid
                             if b * f <= engine.batch_graph_frames), key=lambda c: (-c[0] * c[1], -c[0]))
        if not self.cells:
            raise ValueError(f"no batch graph fits batch_graph_frames={engine.batch_graph_frames}")
        self.batch_buckets = sorted({b for b, _ in self.cells})
        rows, most = self.batch_buckets[-1], max(b * f for b, f in self.cells)
        max_tokens = TOKEN_BUCKETS[-1]
        width = model.predictor.shared.input_size + model.hidden_dim
        self.durations = torch.zeros(rows, max_tokens, dtype=torch.long, device=device)
        self.features = torch.zeros(rows, max_tokens, width, device=device)
        self.n_frames = torch.ones(rows, dtype=torch.long, device=device)
        self.style = torch.zeros(rows, 2 * model.style_dim, device=device)
        self.noise = torch.zeros(SAMPLES_PER_FRAME * most * HARMONICS, device=device) if engine.noise else None
        self.audio = torch.zeros(SAMPLES_PER_FRAME * most, device=device)
        self.graphs: dict[tuple[int, int], torch.cuda.CUDAGraph] = {}
        self.capture_seconds = 0.0
        self.graph_bytes = 0
        self.reserved_bytes = 0
        self.replays = 0  # batches that replayed a graph (a host-side count: no sync)
        self.beyond_grid = 0  # batches outside the grid, run compiled without a graph

    def _noise(self, batch: int, frames: int) -> torch.Tensor | None:
        if self.noise is None:
            return None
        return self.noise[:batch * SAMPLES_PER_FRAME * frames * HARMONICS].view(batch, -1, HARMONICS)

    def _audio(self, batch: int, frames: int) -> torch.Tensor:
        return self.audio[:batch * SAMPLES_PER_FRAME * frames].view(batch, -1)

    def _stage2(self, batch: int, frames: int) -> None:
        audio = self.engine.model.stage2(self.durations[:batch], self.features[:batch], self.n_frames[:batch], frames,
                                         self.style[:batch], self._noise(batch, frames))
        self._audio(batch, frames).copy_(audio)

    def warm_up(self) -> None:
        """Every cell run once eagerly on the static buffers, as capture does before capturing
        (kernels, plans, allocator); device-agnostic, as `CudaGraphs.warm_up`."""
        self.durations.fill_(1)  # a realistic path (the values captured do not matter: replays read the buffers)
        with self.engine._stage2_arithmetic():
            for batch, frames in self.cells:
                self.n_frames.fill_(frames)
                self._stage2(batch, frames)

    def capture(self) -> None:
        engine = self.engine
        with capture_session(self):
            # one pool with the single-chunk graphs: their replays never interleave with these
            pool = engine.graphs.pool if engine.graphs is not None else torch.cuda.graph_pool_handle()
            for batch, frames in self.cells:  # largest first, so smaller ones reuse its pool memory
                self.n_frames.fill_(frames)
                graph = torch.cuda.CUDAGraph()
                with engine._stage2_arithmetic(), torch.cuda.graph(graph, pool=pool):
                    self._stage2(batch, frames)
                self.graphs[(batch, frames)] = graph
        log.info("captured %d batch graphs (batch buckets %s, batch x frames <= %d) in %.1f s, %.0f MiB allocated, "
                 "%.0f MiB reserved by torch in all", len(self.graphs), self.batch_buckets,
                 engine.batch_graph_frames, self.capture_seconds, self.graph_bytes / 2**20, self.reserved_bytes / 2**20)

    def replay(self, durations: torch.Tensor, features: torch.Tensor, frames: Sequence[int],
               styles: torch.Tensor) -> torch.Tensor | None:
        """Stage 2 of a batch whose stage 1 gave durations [B, T], features [B, T, W] and per item
        `frames`: audio [B, 600 * frame bucket] (a view of the shared output, valid until the next
        replay), or None when the batch is beyond the grid."""
        engine = self.engine
        B, T = durations.shape
        frame_bucket = engine._frame_bucket(max(frames))
        batch = next((b for b in self.batch_buckets if b >= B), None)
        graph = self.graphs.get((batch, frame_bucket))
        if graph is None:
            self.beyond_grid += 1
            return None
        self.durations[:batch].zero_()
        self.durations[:B, :T].copy_(durations)
        self.features[:batch].zero_()
        self.features[:B, :T].copy_(features)
        self.n_frames[:batch].fill_(1)
        self.n_frames[:B].copy_(torch.tensor(frames), non_blocking=True)
        self.style[:batch].zero_()
        self.style[:B].copy_(styles)
        if self.noise is not None:
            engine.draw_batch_noise(self._noise(batch, frame_bucket), frames)
        graph.replay()
        self.replays += 1
        return self._audio(batch, frame_bucket)[:B]
