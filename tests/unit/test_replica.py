"""The replica runs one inference at a time, off the event loop."""

from __future__ import annotations

import asyncio
import threading
import time

import numpy as np
import pytest
import torch

from worker.audio import from_pcm16, to_pcm16
from worker.engine import Synthesis
from worker.replica import Replica


class SlowEngine:
    """An engine stand-in whose synthesis blocks its thread for a while and records overlap."""

    sample_rate = 24000

    def __init__(self, seconds: float):
        self.seconds = seconds
        self.running = 0
        self.most_at_once = 0
        self.lock = threading.Lock()
        self.order: list[int] = []
        self.warmed = False

    def synthesize(self, ids, style, speed=1.0) -> Synthesis:
        with self.lock:
            self.running += 1
            self.most_at_once = max(self.most_at_once, self.running)
        time.sleep(self.seconds)  # blocks the calling thread, as real inference does
        with self.lock:
            self.running -= 1
            self.order.append(ids[0])
        return Synthesis(audio=np.zeros(2400, dtype=np.float32), durations=np.full(len(ids) + 2, 2))

    def warmup(self) -> None:
        time.sleep(self.seconds)
        self.warmed = True


def test_one_job_at_a_time_in_arrival_order_and_loop_stays_responsive():
    engine = SlowEngine(0.15)
    replica = Replica(engine)

    async def main():
        ticks = 0
        done = asyncio.Event()

        async def ticker():
            nonlocal ticks
            while not done.is_set():
                ticks += 1
                await asyncio.sleep(0.01)

        tick_task = asyncio.create_task(ticker())
        jobs = [asyncio.create_task(replica.synthesize([i], torch.zeros(256))) for i in range(4)]
        await asyncio.sleep(0.05)
        busy_while_running = replica.busy
        results = await asyncio.gather(*jobs)
        done.set()
        await tick_task
        return ticks, busy_while_running, results

    start = time.perf_counter()
    ticks, busy_while_running, results = asyncio.run(main())
    elapsed = time.perf_counter() - start
    assert engine.most_at_once == 1
    assert engine.order == [0, 1, 2, 3]
    assert elapsed >= 4 * 0.15
    # the loop kept running: ~60 ticks in 0.6 s; a blocked loop would manage about one per job
    assert ticks >= 20
    assert busy_while_running and not replica.busy
    assert replica.jobs_done == 4
    assert replica.audio_seconds == pytest.approx(4 * 0.1)
    assert replica.busy_seconds >= 4 * 0.15 * 0.9
    assert all(r.audio.shape == (2400,) for r in results)


def test_warmup_runs_off_the_loop():
    engine = SlowEngine(0.1)
    replica = Replica(engine)

    async def main():
        ticks = 0

        async def ticker():
            nonlocal ticks
            for _ in range(1000):
                ticks += 1
                await asyncio.sleep(0.005)

        task = asyncio.create_task(ticker())
        await replica.warmup()
        task.cancel()
        return ticks

    assert asyncio.run(main()) >= 5
    assert engine.warmed


def test_replica_with_a_real_tiny_engine(tiny_weights):
    from worker.engine import Engine, EngineConfig

    engine = Engine(tiny_weights, EngineConfig("cpu", "fp32", fused_kernels=False))
    replica = Replica(engine)
    ids, style = [50, 83, 54, 16, 56], tiny_weights.voices["af_heart"][4]
    result = asyncio.run(replica.synthesize(ids, style))
    assert result.durations.shape == (7,)
    assert len(result.audio) == int(result.durations.sum()) * 600
    assert replica.jobs_done == 1
    # Handed out on the 16-bit PCM grid, so it crosses processes as int16 and comes back the same.
    raw = engine.synthesize(ids, style).audio
    assert not np.array_equal(result.audio, raw)
    assert np.max(np.abs(result.audio - np.clip(raw, -1, 1))) <= 0.5 / 32767 + 1e-9
    np.testing.assert_array_equal(from_pcm16(to_pcm16(result.audio)), result.audio)


def test_a_cancelled_caller_does_not_let_the_next_job_overlap_its_inference():
    engine = SlowEngine(0.2)
    replica = Replica(engine)

    async def main():
        first = asyncio.create_task(replica.synthesize([1], torch.zeros(256)))
        await asyncio.sleep(0.05)  # the first inference is running in its thread
        first.cancel()  # its client disconnected
        await asyncio.sleep(0)
        busy_after_cancel = replica.busy
        await replica.synthesize([2], torch.zeros(256))
        with pytest.raises(asyncio.CancelledError):
            await first
        return busy_after_cancel

    busy_after_cancel = asyncio.run(main())
    assert busy_after_cancel, "the replica is still busy until the orphaned inference ends"
    assert engine.most_at_once == 1
    assert engine.order == [1, 2]
    assert replica.jobs_done == 1


def test_a_cpu_replica_trims_its_heap_once_idle_never_between_back_to_back_jobs(monkeypatch):
    """The free heap pages go back (cpu_runtime.return_freed_memory) after an idle spell, in the
    inference thread and never overlapping a job; jobs that follow each other closely keep them."""
    import worker.replica

    engine = SlowEngine(0.05)
    engine.device = torch.device("cpu")
    trims = []  # (thread name, jobs running on the engine at the time)
    monkeypatch.setattr(worker.replica, "return_freed_memory",
                        lambda: trims.append((threading.current_thread().name, engine.running)))
    replica = Replica(engine, idle_before_trim_s=0.3)

    async def main():
        for i in range(6):  # back to back, 0.05 s apart: well under the idle spell
            await replica.synthesize([i], torch.zeros(256))
            await asyncio.sleep(0.05)
        during = len(trims)
        await asyncio.sleep(0.8)  # idle: one trim
        after_idle = len(trims)
        await asyncio.sleep(0.8)  # still idle: no job since, no second trim
        return during, after_idle, len(trims)

    during, after_idle, total = asyncio.run(main())
    assert (during, after_idle, total) == (0, 1, 1)
    assert trims[0][0].startswith("inference") and trims[0][1] == 0


def test_a_gpu_replica_never_trims_the_heap(monkeypatch):
    import worker.replica

    engine = SlowEngine(0.01)
    engine.device = torch.device("cuda")  # a stand-in: nothing runs on it
    trims = []
    monkeypatch.setattr(worker.replica, "return_freed_memory", lambda: trims.append(1))
    replica = Replica(engine, idle_before_trim_s=0.05)

    async def main():
        await replica.synthesize([1], torch.zeros(256))
        await asyncio.sleep(0.3)

    asyncio.run(main())
    assert trims == []


class CountingEngine(SlowEngine):
    """SlowEngine whose audio depends on its input, with a batch path that records what it ran."""

    def synthesize(self, ids, style, speed=1.0) -> Synthesis:
        super().synthesize(ids, style, speed)
        audio = np.full(2400, (sum(ids) % 100) / 200 + float(style[0]) / 10 + speed / 100, dtype=np.float32)
        return Synthesis(audio=audio, durations=np.full(len(ids) + 2, 2))

    def synthesize_batch(self, items):
        self.batches = getattr(self, "batches", []) + [[list(i.ids) for i in items]]
        return [self.synthesize(i.ids, i.style, i.speed) for i in items]


def test_a_chunk_made_before_comes_from_the_cache_at_once_bit_for_bit():
    engine = CountingEngine(0.3)
    replica = Replica(engine, cache_bytes=1 << 20)
    style = torch.full((256,), 0.5)

    async def main():
        first = await replica.synthesize([1, 2, 3], style)
        busy = asyncio.create_task(replica.synthesize([9, 9], style))  # holds the replica for 0.3 s
        await asyncio.sleep(0.05)
        again = await replica.synthesize([1, 2, 3], style.clone())  # an equal style row, another tensor
        ahead_of_busy = not busy.done()
        await busy
        other_speed = await replica.synthesize([1, 2, 3], style, speed=1.5)
        return first, again, ahead_of_busy, other_speed

    first, again, ahead_of_busy, other_speed = asyncio.run(main())
    np.testing.assert_array_equal(first.audio, again.audio)
    np.testing.assert_array_equal(first.durations, again.durations)
    assert ahead_of_busy  # answered while the busy job still ran: not queued behind it
    assert not np.array_equal(other_speed.audio, first.audio)  # another speed: computed, not reused
    assert engine.order == [1, 9, 1] and replica.jobs_done == 3
    assert (replica.cache.hits, len(replica.cache)) == (1, 3)
    assert replica.cache.hit_audio_seconds == pytest.approx(0.1)


def test_the_cache_keeps_the_most_recently_used_within_its_bound():
    engine = CountingEngine(0.0)
    per_entry = 2400 * 2 + 5 * 8  # 16-bit audio and the durations of a 3-id chunk
    replica = Replica(engine, cache_bytes=2 * per_entry)
    style = torch.zeros(256)

    async def main():
        for ids in ([1, 1, 1], [2, 2, 2], [1, 1, 1], [3, 3, 3], [1, 1, 1], [2, 2, 2]):
            await replica.synthesize(ids, style)

    asyncio.run(main())
    # [1] stays (used again before [3] came), [2] was pushed out by [3] and made again
    assert engine.order == [1, 2, 3, 2] and replica.cache.hits == 2
    assert replica.cache.bytes <= 2 * per_entry and len(replica.cache) == 2


def test_a_batch_computes_only_what_the_cache_lacks():
    from worker.engine import BatchItem

    engine = CountingEngine(0.0)
    replica = Replica(engine, cache_bytes=1 << 20)
    style = torch.zeros(256)

    async def main():
        alone = await replica.synthesize([4, 4], style)
        batch = await replica.synthesize_batch([BatchItem([5, 5], style), BatchItem([4, 4], style),
                                                BatchItem([6], style)])
        return alone, batch

    alone, batch = asyncio.run(main())
    assert engine.batches == [[[5, 5], [6]]]
    np.testing.assert_array_equal(batch[1].audio, alone.audio)
    assert replica.jobs_done == 3 and replica.cache.hits == 1


def test_no_cache_without_its_memory():
    replica = Replica(CountingEngine(0.0))
    asyncio.run(replica.synthesize([1], torch.zeros(256)))
    assert replica.cache is None and replica.jobs_done == 1


def test_the_engine_is_deterministic_so_its_cached_audio_is_what_it_would_make(tiny_weights):
    """The cache is exact only because the engine's noise is seeded: a chunk made again, after
    others, is the same bit for bit."""
    from worker.engine import Engine, EngineConfig

    engine = Engine(tiny_weights, EngineConfig("cpu", "fp32", fused_kernels=False))
    cached, fresh = Replica(engine, cache_bytes=1 << 20), Replica(engine)
    ids, style = [50, 83, 54, 16, 56], tiny_weights.voices["af_heart"][4]

    async def main():
        first = await cached.synthesize(ids, style)
        await fresh.synthesize([43, 16, 61, 57], tiny_weights.voices["am_adam"][3])  # the noise moves on
        return first, await cached.synthesize(ids, style), await fresh.synthesize(ids, style)

    first, from_cache, made_again = asyncio.run(main())
    assert cached.cache.hits == 1 and cached.jobs_done == 1
    np.testing.assert_array_equal(from_cache.audio, made_again.audio)
    np.testing.assert_array_equal(first.durations, made_again.durations)


class CompilingEngine(SlowEngine):
    """A SlowEngine with fused kernels to compile: the compile blocks its own thread for a while,
    and the switch records whether a synthesis was running when it happened."""

    def __init__(self, seconds: float, compile_s: float, error: str | None = None):
        super().__init__(seconds)
        self.compile_s, self.error = compile_s, error
        self.compile_record = None
        self.kernels = "eager"
        self.compile_thread: str | None = None
        self.running_at_switch: int | None = None

    @property
    def kernels_pending(self) -> bool:
        return self.compile_record is None

    def warmup(self, compile_kernels: bool = True) -> None:
        assert compile_kernels is False, "the replica's server warms up eagerly and compiles in the background"
        super().warmup()

    def compile_kernels(self):
        from worker.compile_cache import CompileRecord

        self.compile_thread = threading.current_thread().name
        time.sleep(self.compile_s)
        self.compile_record = CompileRecord(".", "fused CPU kernels", seconds=self.compile_s, error=self.error)
        return self.compile_record

    def switch_to_compiled_kernels(self) -> bool:
        with self.lock:
            self.running_at_switch = self.running
        self.kernels = "compiled"
        return True


def test_the_replica_serves_eagerly_while_its_kernels_compile_then_switches_between_passes():
    engine = CompilingEngine(0.05, compile_s=0.6)
    replica = Replica(engine)

    async def main():
        await replica.warmup(compile_kernels=False)
        assert replica.kernels_pending and not replica.kernels_compiling
        compile_task = asyncio.create_task(replica.compile_kernels_in_background())
        await asyncio.sleep(0.05)
        assert replica.kernels_compiling and not replica.kernels_pending
        seen = []  # the kernels each pass ran with
        while not compile_task.done():  # passes go on, one at a time, while the compile runs
            seen.append(engine.kernels)
            await replica.synthesize([len(seen)], torch.zeros(256))
        return seen, await compile_task

    seen, record = asyncio.run(main())
    assert len(seen) >= 5 and seen[:5] == ["eager"] * 5
    assert record.error is None and engine.kernels == "compiled" and not replica.kernels_compiling
    assert engine.compile_thread and not engine.compile_thread.startswith("asyncio")  # a thread of its own
    assert engine.running_at_switch == 0  # switched between two passes, never during one
    assert engine.most_at_once == 1


def test_a_failed_kernel_compile_keeps_the_eager_kernels():
    engine = CompilingEngine(0.01, compile_s=0.05, error="RuntimeError: no compiler")
    replica = Replica(engine)

    async def main():
        await replica.warmup(compile_kernels=False)
        return await replica.compile_kernels_in_background()

    record = asyncio.run(main())
    assert record.error == "RuntimeError: no compiler" and engine.kernels == "eager"
    assert engine.running_at_switch is None and not replica.kernels_compiling
    assert asyncio.run(replica.compile_kernels_in_background()) is None  # nothing pending: nothing to do
