"""A replica: one Engine per process, one inference at a time, never on the event loop.

`BaselineReplica` is the comparison point for `loadtest compare`: one model running up to four
chunks at once in threads, as Kokoro-FastAPI does.

Inference runs in the replica's own thread, at lower priority than the event loop (see
worker/cpu_runtime.py): the loop must answer admissions and 503s while the replica computes.
A replica's audio leaves on the 16-bit PCM grid (worker/audio.py): the form it crosses processes in.

A replica keeps its recent syntheses (`SynthesisCache`, KOKORO_SYNTHESIS_CACHE_MIB): a phone bot
says "Please hold." and an agent "Let me check that for you." thousands of times a day, and the
engine is deterministic (its noise is seeded), so a chunk it has made before comes back at once,
bit for bit, without waiting for the replica or costing it anything.

A CPU replica serves as soon as its weights are loaded, with the eager elementwise kernels: the
fused ones compile (or load from the host's cache, worker/compile_cache.py) in a thread of their
own, outside the one-at-a-time lock, and go into service between two passes
(`compile_kernels_in_background`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import time
from collections import OrderedDict
from typing import Sequence

import numpy as np
import torch

from worker.audio import SAMPLE_RATE, from_pcm16, on_pcm16_grid, to_pcm16
from worker.cpu_runtime import inference_executor, return_freed_memory
from worker.engine import BatchItem, Engine, Synthesis

# Kokoro-FastAPI runs up to four chunks on its one model at once; the baseline copies that.
BASELINE_CONCURRENCY = 4
# A CPU replica idle this long hands its free heap pages back (cpu_runtime.return_freed_memory);
# never between back-to-back jobs, where the trim and the page faults after it cost throughput.
IDLE_BEFORE_TRIM_S = 5.0


class SynthesisCache:
    """The most recently used syntheses, by their whole input (ids, style row, speed), within
    `max_bytes` of 16-bit audio: the least recently used go first."""

    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self.bytes = 0
        self.hits = 0
        self.hit_audio_seconds = 0.0
        self._entries: OrderedDict[bytes, tuple[np.ndarray, np.ndarray]] = OrderedDict()

    @staticmethod
    def key(ids: Sequence[int], style: torch.Tensor, speed: float) -> bytes:
        digest = hashlib.blake2b(np.asarray(ids, dtype=np.int64).tobytes(), digest_size=20)
        digest.update(style.detach().to("cpu", torch.float32).contiguous().numpy().tobytes())
        digest.update(np.float64(speed).tobytes())
        return digest.digest()

    def __contains__(self, key: bytes) -> bool:
        return key in self._entries

    def get(self, key: bytes) -> Synthesis | None:
        entry = self._entries.get(key)
        if entry is None:
            return None
        self._entries.move_to_end(key)
        pcm, durations = entry
        self.hits += 1
        self.hit_audio_seconds += len(pcm) / SAMPLE_RATE
        return Synthesis(audio=from_pcm16(pcm), durations=durations.copy())

    def put(self, key: bytes, result: Synthesis) -> None:
        pcm = to_pcm16(result.audio)  # exact: a replica's audio is on the 16-bit grid
        size = pcm.nbytes + result.durations.nbytes
        if size > self.max_bytes or key in self._entries:
            return
        self._entries[key] = (pcm, result.durations.copy())
        self.bytes += size
        while self.bytes > self.max_bytes:
            _, (old_pcm, old_durations) = self._entries.popitem(last=False)
            self.bytes -= old_pcm.nbytes + old_durations.nbytes

    def __len__(self) -> int:
        return len(self._entries)


class Replica:
    def __init__(self, engine: Engine, niceness: int = 0, idle_before_trim_s: float = IDLE_BEFORE_TRIM_S,
                 cache_bytes: int = 0):
        """niceness: added to the inference thread's (and its OpenMP pool's) scheduling niceness;
        cache_bytes: the bound of its SynthesisCache (0: none)."""
        self.engine = engine
        self.cache = SynthesisCache(cache_bytes) if cache_bytes > 0 else None
        self._executor = inference_executor(niceness)
        self._niceness = niceness
        self.kernels_compiling = False  # the fused CPU kernels compile in the background, not in service yet
        self._one_at_a_time = asyncio.Semaphore(1)
        # Only a CPU engine's activations live in the process heap; a GPU's live in its own pool.
        on_cpu = getattr(getattr(engine, "device", None), "type", None) == "cpu"
        self._idle_before_trim_s = idle_before_trim_s if on_cpu else None
        self._idle_timer: asyncio.TimerHandle | None = None
        self._trim_task: asyncio.Task | None = None
        self.busy = False
        self.jobs_done = 0
        self.busy_seconds = 0.0
        self.audio_seconds = 0.0

    async def synthesize(self, ids: Sequence[int], style: torch.Tensor, speed: float = 1.0) -> Synthesis:
        """From the cache at once, else queue behind the running job (FIFO), then run in a worker thread."""
        key = self.cache.key(ids, style, speed) if self.cache is not None else None
        if key is not None and (cached := self.cache.get(key)) is not None:
            return cached
        result = served(await self._exclusive(self.engine.synthesize, ids, style, speed))
        self.jobs_done += 1
        self.audio_seconds += len(result.audio) / self.engine.sample_rate
        if key is not None:
            self.cache.put(key, result)
        return result

    async def synthesize_batch(self, items: Sequence[BatchItem]) -> list[Synthesis]:
        """Several chunk jobs in one engine call (one forward pass once batching exists), under the
        same one-at-a-time lock as single jobs; those in the cache are not computed again."""
        keys = [self.cache.key(i.ids, i.style, i.speed) for i in items] if self.cache is not None else None
        results: list[Synthesis | None] = [self.cache.get(k) for k in keys] if keys else [None] * len(items)
        missing = [k for k, r in enumerate(results) if r is None]
        if missing:
            made = [served(r) for r in await self._exclusive(self.engine.synthesize_batch, [items[k] for k in missing])]
            self.jobs_done += len(made)
            self.audio_seconds += sum(len(r.audio) for r in made) / self.engine.sample_rate
            for k, result in zip(missing, made, strict=True):
                results[k] = result
                if keys:
                    self.cache.put(keys[k], result)
        return results  # type: ignore[return-value]

    async def warmup(self, compile_kernels: bool = True) -> None:
        """The engine's warm-up in the inference thread; compile_kernels=False leaves the fused CPU
        kernels to `compile_kernels_in_background` (the replica then serves eagerly meanwhile)."""
        await (self._exclusive(self.engine.warmup) if compile_kernels else
               self._exclusive(self.engine.warmup, False))

    @property
    def kernels_pending(self) -> bool:
        """Fused CPU kernels wanted and neither compiled nor compiling yet."""
        return bool(getattr(self.engine, "kernels_pending", False)) and not self.kernels_compiling

    async def compile_kernels_in_background(self):
        """Compile the fused CPU kernels in a thread of their own (at the inference thread's
        niceness; passes go on meanwhile with the eager kernels), then put them in service through
        the one-at-a-time lock, so between two passes. Returns the CompileRecord (its `error` set
        when the compile failed: the replica then keeps the eager kernels), None when nothing was
        pending."""
        if not self.kernels_pending:
            return None
        self.kernels_compiling = True
        compiler = inference_executor(self._niceness)  # its own thread: minutes of work, not a pass
        try:
            record = await asyncio.get_running_loop().run_in_executor(compiler, self.engine.compile_kernels)
            if record.error is None:
                await self._exclusive(self.engine.switch_to_compiled_kernels)
            return record
        finally:
            compiler.shutdown(wait=False)
            self.kernels_compiling = False

    async def _exclusive(self, fn, *args):
        async with self._one_at_a_time:
            self.busy = True
            start = time.perf_counter()
            try:
                return await run_to_completion(asyncio.get_running_loop().run_in_executor(self._executor, fn, *args))
            finally:
                self.busy = False
                self.busy_seconds += time.perf_counter() - start
                self._trim_when_idle()

    def _trim_when_idle(self) -> None:
        """(Re)start the idle clock: a replica with no job for IDLE_BEFORE_TRIM_S trims its heap."""
        if self._idle_before_trim_s is None:
            return
        if self._idle_timer is not None:
            self._idle_timer.cancel()
        self._idle_timer = asyncio.get_running_loop().call_later(self._idle_before_trim_s, self._trim_if_still_idle)

    def _trim_if_still_idle(self) -> None:
        self._idle_timer = None
        if self.busy or self._one_at_a_time.locked():  # a job started: its end restarts the clock
            return
        self._trim_task = asyncio.get_running_loop().create_task(self._trim())

    async def _trim(self) -> None:
        """In the inference thread, under the one-at-a-time lock: a job arriving meanwhile waits for
        the trim (at most about 50 ms), and the next trim waits for a new idle spell."""
        async with self._one_at_a_time:
            await run_to_completion(asyncio.get_running_loop().run_in_executor(self._executor, return_freed_memory))


def served(result: Synthesis) -> Synthesis:
    """The engine's synthesis as a replica hands it out: its audio on the 16-bit PCM grid."""
    return dataclasses.replace(result, audio=on_pcm16_grid(result.audio))


async def run_to_completion(work: asyncio.Future):
    """`work`'s result. A caller cancelled meanwhile (a client disconnected) cannot interrupt a
    launched inference (a thread cannot be, a GPU pass is not): it waits until the work really ends,
    still holding the replica's lock, so the next job never overlaps it, and then re-raises."""
    try:
        return await asyncio.shield(work)
    except asyncio.CancelledError:
        while not work.done():
            try:
                await asyncio.wait({work})
            except asyncio.CancelledError:
                pass
        raise


class BaselineReplica:
    """One model, up to `concurrency` chunks on it at once in worker threads (Kokoro-FastAPI's
    `Semaphore(4)`). Each concurrent slot has its own view of the engine (shared model weights,
    own noise and speed buffers, no CUDA graphs: their static buffers cannot be shared)."""

    def __init__(self, engine, concurrency: int = BASELINE_CONCURRENCY):
        self.engine = engine
        self._views: asyncio.Queue = asyncio.Queue()
        for _ in range(concurrency):
            self._views.put_nowait(engine.view())
        self._slots = asyncio.Semaphore(concurrency)
        self.concurrency = concurrency
        self.running = 0
        self.jobs_done = 0
        self.busy_seconds = 0.0  # wall seconds with at least one chunk running
        self.audio_seconds = 0.0
        self._busy_since: float | None = None

    @property
    def busy(self) -> bool:
        return self.running > 0

    async def synthesize(self, ids, style, speed: float = 1.0):
        async with self._slots:
            view = await self._views.get()
            self._enter()
            try:
                result = served(await asyncio.to_thread(view.synthesize, ids, style, speed))
            finally:
                self._leave()
                self._views.put_nowait(view)
            self.jobs_done += 1
            self.audio_seconds += len(result.audio) / self.engine.sample_rate
            return result

    async def warmup(self) -> None:
        """The engine's warm-up, fused kernels compiled before serving; then fresh views, which copy
        the engine's kernel choice."""
        await asyncio.to_thread(self.engine.warmup)
        views = [self.engine.view() for _ in range(self.concurrency)]
        while not self._views.empty():
            self._views.get_nowait()
        for view in views:
            self._views.put_nowait(view)

    def _enter(self) -> None:
        if self.running == 0:
            self._busy_since = time.perf_counter()
        self.running += 1

    def _leave(self) -> None:
        self.running -= 1
        if self.running == 0 and self._busy_since is not None:
            self.busy_seconds += time.perf_counter() - self._busy_since
            self._busy_since = None
