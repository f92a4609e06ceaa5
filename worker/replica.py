"""A replica: one Engine per process, one inference at a time, never on the event loop."""

from __future__ import annotations

import asyncio
import time
from typing import Sequence

import torch

from worker.engine import Engine, Synthesis


class Replica:
    def __init__(self, engine: Engine):
        self.engine = engine
        self._one_at_a_time = asyncio.Semaphore(1)
        self.busy = False
        self.jobs_done = 0
        self.busy_seconds = 0.0
        self.audio_seconds = 0.0

    async def synthesize(self, ids: Sequence[int], style: torch.Tensor, speed: float = 1.0) -> Synthesis:
        """Queue behind the running job (FIFO), then run in a worker thread."""
        async with self._one_at_a_time:
            self.busy = True
            start = time.perf_counter()
            try:
                result = await asyncio.to_thread(self.engine.synthesize, ids, style, speed)
            finally:
                self.busy = False
                self.busy_seconds += time.perf_counter() - start
            self.jobs_done += 1
            self.audio_seconds += len(result.audio) / self.engine.sample_rate
            return result

    async def warmup(self) -> None:
        async with self._one_at_a_time:
            self.busy = True
            try:
                await asyncio.to_thread(self.engine.warmup)
            finally:
                self.busy = False
