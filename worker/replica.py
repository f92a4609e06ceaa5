"""A replica: one Engine per process, one inference at a time, never on the event loop.

Inference runs in the replica's own thread, at lower priority than the event loop (see
worker/cpu_runtime.py): the loop must answer admissions and 503s while the replica computes.
"""

from __future__ import annotations

import asyncio
import time
from typing import Sequence

import torch

from worker.cpu_runtime import inference_executor
from worker.engine import Engine, Synthesis


class Replica:
    def __init__(self, engine: Engine, niceness: int = 0):
        """niceness: added to the inference thread's (and its OpenMP pool's) scheduling niceness."""
        self.engine = engine
        self._executor = inference_executor(niceness)
        self._one_at_a_time = asyncio.Semaphore(1)
        self.busy = False
        self.jobs_done = 0
        self.busy_seconds = 0.0
        self.audio_seconds = 0.0

    async def synthesize(self, ids: Sequence[int], style: torch.Tensor, speed: float = 1.0) -> Synthesis:
        """Queue behind the running job (FIFO), then run in a worker thread."""
        result = await self._exclusive(self.engine.synthesize, ids, style, speed)
        self.jobs_done += 1
        self.audio_seconds += len(result.audio) / self.engine.sample_rate
        return result

    async def warmup(self) -> None:
        await self._exclusive(self.engine.warmup)

    async def _exclusive(self, fn, *args):
        async with self._one_at_a_time:
            self.busy = True
            start = time.perf_counter()
            work = asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)
            try:
                return await asyncio.shield(work)
            except asyncio.CancelledError:
                # The caller left (a client disconnected), but a thread cannot be interrupted: hold the
                # lock and stay busy until the inference really ends, so the next job never overlaps it.
                while not work.done():
                    try:
                        await asyncio.wait({work})
                    except asyncio.CancelledError:
                        pass
                raise
            finally:
                self.busy = False
                self.busy_seconds += time.perf_counter() - start
