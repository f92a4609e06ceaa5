"""A fake job runner for the queue tests: no model, just time and silence.

A job's payload says how long the "synthesis" takes and how much audio it yields; the PCM is
int16 samples all equal to the chunk index, so a test can tell which chunk it got back.
"""

from __future__ import annotations

import asyncio
import json

import numpy as np

from worker.audio import SAMPLES_PER_FRAME as FRAME_SAMPLES
MS_PER_PHONEME = 75  # the fake voice speaks 3 frames (75 ms) per phoneme


def fake_payload(phonemes: int, work_s: float, fail: bool = False) -> bytes:
    return json.dumps({"phonemes": phonemes, "work_s": work_s, "fail": fail}).encode()


async def fake_run_job(job):
    spec = json.loads(job.payload)
    await asyncio.sleep(spec["work_s"])
    if spec.get("fail"):
        raise RuntimeError("the fake model refused this chunk")
    durations = np.full(spec["phonemes"] + 2, 3, dtype=np.int64)  # pads included, as the engine does
    pcm = np.full(int(durations.sum()) * FRAME_SAMPLES, job.index, dtype=np.int16).tobytes()
    return pcm, durations


async def fake_run_batch(batch):
    """One 'forward pass' for a batch: the fake jobs run side by side."""
    return list(await asyncio.gather(*(fake_run_job(job) for job in batch)))
