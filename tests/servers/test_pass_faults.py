"""A replica whose pass raises (issue 41, item 5: GPU faults, the path a CPU can run): the tiny
engine's stage 2 raises torch.OutOfMemoryError, as CUDA's allocator does when a pass does not fit,
behind the real Replica, ReplicaJobRunner and Dispatcher on a real redis-server, and behind the app
in process (the local service). The OOM itself, and MPS with a killed worker, are measured on a
GPU by `python -m loadtest.bench.gpu_faults` (the GPU harness's `faults` step)."""

from __future__ import annotations

import asyncio
import logging

import numpy as np
import pytest
import torch
from app_client import started_app_client
from test_queue import assert_idle, collect, owner

from api.app import create_app
from api.settings import Settings
from api.speech.local import SpeechService
from api.speech.admission_client import ChunkJob, RequestFailed
from api.speech.redis_link import connect, encode_job
from api.speech.dispatcher import DELIVERED, Dispatcher, DispatcherConfig, ReplicaJobRunner
from api.speech.worker_queue import WorkerQueueOwner
from worker import engine as engine_module
from worker.engine import Engine, EngineConfig
from worker.replica import Replica
from worker.voices import VoiceBank

VOICE = "af_heart"
# A chunk this long runs out of memory even alone; any batch runs out of memory while `batch_ooms` lasts.
TOO_BIG_PHONEMES = 60


class OutOfMemoryPasses:
    """Wraps the model's stage 2: raises torch.OutOfMemoryError for a pass the injected fault says
    does not fit, else runs the real one."""

    def __init__(self, stage2, batch_ooms: int):
        self.stage2 = stage2
        self.batch_ooms = batch_ooms
        self.next_ooms = 0  # the next passes that fail, whatever their size
        self.passes: list[tuple[int, str]] = []  # (chunks, "ok" | "oom")

    def __call__(self, durations, *args, **kwargs):
        chunks, width = durations.shape[0], durations.shape[1]
        if width >= TOO_BIG_PHONEMES + 2 or (chunks > 1 and self.batch_ooms > 0) or self.next_ooms > 0:
            self.batch_ooms = max(0, self.batch_ooms - (chunks > 1))
            self.next_ooms = max(0, self.next_ooms - 1)
            self.passes.append((chunks, "oom"))
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (injected by the test)")
        self.passes.append((chunks, "ok"))
        return self.stage2(durations, *args, **kwargs)


@pytest.fixture
def faulty_engine(tiny_weights):
    engine = Engine(tiny_weights, EngineConfig("cpu", "fp32", fused_kernels=False, max_batch=4))
    engine.model.stage2 = OutOfMemoryPasses(engine.model.stage2, batch_ooms=1)
    return engine


def ids(phonemes: int) -> list[int]:
    return [(16, 43, 54, 56, 57)[k % 5] for k in range(phonemes)]


def test_an_out_of_memory_pass_frees_the_device_cache_on_cuda_only(monkeypatch):
    emptied = []
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: emptied.append(True))
    engine_module.free_cached_device_memory(torch.device("cpu"))
    assert emptied == []
    engine_module.free_cached_device_memory(torch.device("cuda", 0))
    assert emptied == [True]


def test_an_out_of_memory_pass_raises_says_so_once_and_the_engine_serves_the_next(faulty_engine, tiny_weights,
                                                                                   caplog):
    style = tiny_weights.voices[VOICE][TOO_BIG_PHONEMES - 1]
    with caplog.at_level(logging.ERROR, logger="kokoro_fleet.engine"):
        with pytest.raises(torch.OutOfMemoryError):
            faulty_engine.synthesize(ids(TOO_BIG_PHONEMES), style)
    [line] = [r.getMessage() for r in caplog.records if r.name == "kokoro_fleet.engine"]
    frames = faulty_engine.pass_frames
    assert frames is not None and frames > 0  # stage 1 ran: the line names the pass's frames
    assert line.startswith(f"out of memory on cpu in a pass of 1 chunk(s), {TOO_BIG_PHONEMES + 2} tokens and "
                           f"{frames} frames at most")
    result = faulty_engine.synthesize(ids(20), tiny_weights.voices[VOICE][19])
    assert len(result.audio) > 0 and len(result.durations) == 22


def test_an_out_of_memory_batch_runs_again_job_by_job_and_only_the_chunk_too_big_alone_fails(
        redis_server, faulty_engine, tiny_weights, caplog):
    async def go():
        replica = Replica(faulty_engine)
        runner = ReplicaJobRunner(replica, VoiceBank(tiny_weights.voices))
        rep = Dispatcher(connect(redis_server.url), "r0", runner, DispatcherConfig(batch_max=4),
                         run_batch=runner.run_batch, worker_queue=WorkerQueueOwner("r0"))
        client = owner(redis_server.url)

        def request(phonemes: int) -> list[ChunkJob]:
            return [ChunkJob(encode_job(ids(phonemes), VOICE, 1.0), phonemes)]

        # 36 and 60 phonemes are within the batch's size ratio: the three ride one pass.
        a, big, c = [await client.admit(request(p)) for p in (36, TOO_BIG_PHONEMES, 36)]
        batch = await rep.lease_batch()
        assert len(batch) == 3
        assert await rep.run_jobs(batch) == [DELIVERED] * 3        # the big chunk's error is delivered too
        passes = faulty_engine.model.stage2.passes
        assert passes[0] == (3, "oom") and sorted(passes[1:]) == [(1, "ok"), (1, "ok"), (1, "oom")]
        assert rep.batch_fallbacks == 1
        with pytest.raises(RequestFailed, match="chunk 0 failed on replica r0: OutOfMemoryError: CUDA out of memory"):
            await collect(client, big)
        alone = faulty_engine.synthesize(ids(36), tiny_weights.voices[VOICE][35])
        for ticket in (a, c):
            [result] = await collect(client, ticket)
            assert np.array_equal(result.durations, alone.durations)   # the retry's own audio, whole
        assert not replica.busy and not replica._one_at_a_time.locked()

        # The same replica serves the next batch in one pass.
        d, e = [await client.admit(request(p)) for p in (30, 30)]
        again = await rep.lease_batch()
        assert len(again) == 2 and await rep.run_jobs(again) == [DELIVERED] * 2
        assert passes[-1] == (2, "ok") and rep.batch_fallbacks == 1
        for ticket in (d, e):
            assert len(await collect(client, ticket)) == 1
        for ticket in (a, big, c, d, e):
            await client.release(ticket.request_id)
        await assert_idle(client)
        await client.client.aclose()
        await rep.client.aclose()

    with caplog.at_level(logging.ERROR, logger="kokoro_fleet.engine"):
        asyncio.run(go())
    lines = [r.getMessage() for r in caplog.records if r.name == "kokoro_fleet.engine"]
    assert [line.split(",")[0] for line in lines] == ["out of memory on cpu in a pass of 3 chunk(s)",
                                                      "out of memory on cpu in a pass of 1 chunk(s)"]


def test_the_app_answers_a_failed_pass_with_an_openai_error_and_serves_the_next_request(faulty_engine,
                                                                                        tiny_weights):
    """The local service (no Redis): a request whose first chunk runs out of memory gets a 500 in
    OpenAI's error shape, no audio (the OpenAI client retries a 500), an SSE stream an `error`
    event; the replica then serves the next request."""
    service = SpeechService(Replica(faulty_engine), VoiceBank(tiny_weights.voices),
                            Settings.from_env({"KOKORO_WEIGHTS": "tiny"}))
    app = create_app(service.settings, service=service)
    passes = faulty_engine.model.stage2

    async def go():
        async with started_app_client(app, raise_app_exceptions=False) as http:
            assert app.state.kokoro.ready, app.state.kokoro.load_error
            body = {"input": "Hello there, my friend.", "voice": VOICE, "response_format": "pcm"}
            passes.next_ooms = 1
            failed = await http.post("/v1/audio/speech", json={**body, "stream": False})
            passes.next_ooms = 1
            sse = await http.post("/v1/audio/speech", json={**body, "stream_format": "sse"})
            served = await http.post("/v1/audio/speech", json={**body, "stream": False})
            return failed, sse, served

    failed, sse, served = asyncio.run(go())
    assert failed.status_code == 500
    error = failed.json()["error"]
    assert error["type"] == "server_error" and error["code"] == "internal_error" and "Traceback" not in failed.text
    assert '"type":"error"' in sse.text.replace(" ", "") and "speech.audio.done" not in sse.text
    assert passes.passes[-3:] == [(1, "oom"), (1, "oom"), (1, "ok")]
    assert served.status_code == 200 and len(served.content) > 0
