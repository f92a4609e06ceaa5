"""First audio stays fast under batching (issue 39, item 2): on a replica that leases up to 8 jobs a
pass (the simulated engine's batch cost), a new request's first chunk is leased before a backlog of
other requests' later chunks, alone if nothing else is due: a pass never waits to fill, and never
carries later chunks that are not due yet. ORDER is what is asserted (and printed), not timing."""

from __future__ import annotations

import asyncio

from api.speech.admission_client import AdmissionBounds, AdmissionClient, ChunkJob
from api.speech.redis_link import connect, encode_job
from api.speech.dispatcher import Dispatcher, DispatcherConfig, ReplicaJobRunner
from api.speech.worker_queue import WorkerQueueOwner
from worker.sim_engine import SimCost, SimReplica, sim_voices
from worker.audio import SECONDS_PER_PHONEME
from worker.voices import VoiceBank
from worker.weights import VOICE_NAMES


def chunk(phonemes: int) -> ChunkJob:
    return ChunkJob(encode_job([43] * phonemes, "af_heart", 1.0), phonemes)


def test_a_new_first_chunk_is_leased_before_a_backlog_of_later_chunks(redis_server):
    async def go():
        client = AdmissionClient(connect(redis_server.url), "w0", AdmissionBounds(0, 0),
                                 worker_queue=WorkerQueueOwner("w0"), ms_per_phoneme=SECONDS_PER_PHONEME * 1000)
        runner = ReplicaJobRunner(SimReplica(SimCost(1.0, 0.001)), VoiceBank(sim_voices(VOICE_NAMES), ""))
        replica = Dispatcher(connect(redis_server.url), "r0", runner, DispatcherConfig(batch_max=8),
                             run_batch=runner.run_batch, worker_queue=WorkerQueueOwner("r0"))
        passes = []

        async def one_pass() -> list[str]:
            jobs = await replica.lease_batch()
            passes.append([job.job_id for job in jobs])
            await replica.run_jobs(jobs)
            return passes[-1]

        # Six streams: a first chunk of 60 phonemes (4.5 s of audio), then three of 400 (30 s each).
        streams = [await client.admit([chunk(60), chunk(400), chunk(400), chunk(400)]) for _ in range(6)]
        first_chunks = {f"{t.request_id}#0" for t in streams}
        assert set(await one_pass()) == first_chunks  # one pass of the six first chunks
        # The backlog: 18 later chunks, due 4.5 s and more after their streams arrived.
        assert (await client.stats())["queued_jobs"] == 18
        new = await client.admit([chunk(60), chunk(400)])
        assert await one_pass() == [f"{new.request_id}#0"]  # first, and alone: nothing else is due
        assert (await client.stats())["queued_jobs"] == 19  # the backlog waited; the new stream's later chunk too
        for ticket in (*streams, new):
            await client.release(ticket.request_id)
        await client.client.aclose()
        await replica.client.aclose()
        return passes

    passes = asyncio.run(go())
    print("\nleased passes in order:", [[job.split("#")[1] for job in p] for p in passes])
