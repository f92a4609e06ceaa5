"""The simulated engine (KOKORO_ENGINE=sim): the cost model's waits, one job at a time, the batch
rule, audio of the real model's length with durations that the timestamps can use, and that
nothing builds it unless the setting says `sim`.

The waits are checked through a recording `asyncio.sleep` (what the replica asked to wait), never
by timing them."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import torch

from worker import sim_engine
from worker.audio import SAMPLE_RATE, SAMPLES_PER_FRAME
from worker.engine import BatchItem
from api.settings import Settings
from worker.sim_engine import FRAMES_PER_TOKEN, LENGTH_SCALE, SimCost, SimReplica, sim_voices, token_frames
from api.speech.build import sim_cost
from api.speech.contract import SpeechRequest
from api.speech.local import SpeechService
from worker.audio import SECONDS_PER_PHONEME
from worker.text import text_to_chunks
from worker.voices import VoiceBank
from worker.weights import VOICE_NAMES

STYLE = torch.zeros(256)


class RecordingSleep:
    """Stands in for the simulated replica's asyncio.sleep: records each wait and when it began and ended
    relative to the others, and yields to the loop like a real sleep."""

    def __init__(self):
        self.waits: list[float] = []
        self.events: list[str] = []
        self.real_sleep = asyncio.sleep

    async def __call__(self, seconds: float) -> None:
        self.waits.append(seconds)
        self.events.append("start")
        await self.real_sleep(0.01)
        self.events.append("end")


@pytest.fixture
def sleeps(monkeypatch):
    recorder = RecordingSleep()
    monkeypatch.setattr(sim_engine, "_wait", recorder)
    return recorder


def test_the_engine_setting_defaults_to_torch_and_sim_costs_come_from_settings():
    assert Settings.from_env({}).engine == "torch"
    settings = Settings.from_env({"KOKORO_ENGINE": "sim", "KOKORO_SIM_CHUNK_MS": "4", "KOKORO_SIM_PHONEME_MS": "0.5"})
    cost = sim_cost(settings)
    assert settings.engine == "sim" and cost == SimCost(4.0, 0.5)
    assert cost.seconds(100) == pytest.approx((4 + 50) / 1000)


def test_a_chunk_waits_the_cost_models_time_and_counts_like_a_replica(sleeps):
    replica = SimReplica(SimCost(chunk_ms=10, phoneme_ms=0.2))
    ids = [50, 16, 51, 52, 4] * 20  # 100 phonemes
    result = asyncio.run(replica.synthesize(ids, STYLE, 1.0))
    assert sleeps.waits == [pytest.approx(0.010 + 100 * 0.0002)]
    assert replica.jobs_done == 1 and not replica.busy and replica.busy_seconds > 0
    assert replica.audio_seconds == pytest.approx(len(result.audio) / SAMPLE_RATE)


def test_jobs_run_one_at_a_time_in_arrival_order(sleeps):
    replica = SimReplica(SimCost(chunk_ms=1, phoneme_ms=0))
    busy_seen = []

    async def main():
        async def watch():
            while len(sleeps.events) < 6:
                busy_seen.append(replica.busy)
                await asyncio.sleep(0.002)

        watcher = asyncio.create_task(watch())
        await asyncio.gather(*(replica.synthesize([50 + i] * 10, STYLE) for i in range(3)))
        await watcher

    asyncio.run(main())
    assert sleeps.events == ["start", "end"] * 3  # never two waits at once
    assert replica.jobs_done == 3 and any(busy_seen)


def test_a_batch_waits_once_for_every_item_padded_to_the_longest(sleeps):
    replica = SimReplica(SimCost(chunk_ms=10, phoneme_ms=0.2))
    items = [BatchItem([50] * n, STYLE, 1.0) for n in (20, 100, 60)]
    results = asyncio.run(replica.synthesize_batch(items))
    assert sleeps.waits == [pytest.approx(0.010 + 3 * 100 * 0.0002)]
    assert [len(r.durations) for r in results] == [22, 102, 62]
    single = SimReplica().engine
    for item, result in zip(items, results):
        np.testing.assert_array_equal(result.audio, single.synthesize(item.ids, item.style, item.speed).audio)
    assert replica.jobs_done == 3


def test_a_cancelled_job_keeps_the_replica_busy_until_its_time_is_up(sleeps):
    """As with a GPU pass (and worker/replica.py's thread), the caller leaving does not end the work."""
    replica = SimReplica(SimCost(chunk_ms=1, phoneme_ms=0))

    async def main():
        task = asyncio.create_task(replica.synthesize([50] * 10, STYLE))
        await asyncio.sleep(0)  # into the wait
        while not sleeps.events:
            await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return list(sleeps.events)

    assert asyncio.run(main()) == ["start", "end"]
    assert not replica.busy


def test_audio_length_follows_the_durations_and_the_speed():
    engine = SimReplica().engine
    ids = [50, 16, 51, 52, 3, 16, 53] * 10
    normal = engine.synthesize(ids, STYLE, 1.0)
    fast = engine.synthesize(ids, STYLE, 2.0)
    assert normal.durations.dtype == np.int64 and len(normal.durations) == len(ids) + 2
    assert len(normal.audio) == int(normal.durations.sum()) * SAMPLES_PER_FRAME
    table = FRAMES_PER_TOKEN["start_pad"] + FRAMES_PER_TOKEN["end_pad"] + sum(
        FRAMES_PER_TOKEN["space"] if i == 16 else FRAMES_PER_TOKEN["pause"] if i == 3 else FRAMES_PER_TOKEN["phoneme"]
        for i in ids)
    assert abs(int(normal.durations.sum()) - table * LENGTH_SCALE) <= 1  # the table, scaled once
    assert normal.durations.min() >= 1
    assert len(fast.audio) == pytest.approx(len(normal.audio) / 2, rel=0.1)
    assert normal.audio.dtype == np.float32 and 0.1 < np.abs(normal.audio).max() <= 1.0
    assert np.array_equal(normal.audio, engine.synthesize(ids, STYLE, 1.0).audio)  # deterministic
    with pytest.raises(ValueError):
        engine.synthesize([50] * 511, STYLE)
    assert len(token_frames([], 1.0)) == 2  # the two pads


def test_speech_lasts_about_what_the_queue_estimates_for_real_text():
    """English sentences come out at about SECONDS_PER_PHONEME a phoneme, the rate the fleet's queue
    and the audio-length limit assume for the real model."""
    text = ("The fleet exists to serve an H100's worth of speech. Everything about it was measured with two "
            "CPU replicas, which are slower than real time; so a simulated engine stands in, and waits.")
    engine = SimReplica().engine
    phonemes = frames = 0
    for chunk in text_to_chunks(text, "a"):
        if chunk.ids:
            phonemes += len(chunk.ids)
            frames += int(engine.synthesize(chunk.ids, STYLE).durations.sum())
    seconds = frames * SAMPLES_PER_FRAME / SAMPLE_RATE
    assert seconds == pytest.approx(phonemes * SECONDS_PER_PHONEME, rel=0.25)


def test_a_sim_service_streams_pieces_with_word_timestamps(sleeps):
    service = SpeechService(SimReplica(SimCost(1, 0)), VoiceBank(sim_voices(VOICE_NAMES)),
                            Settings.from_env({"KOKORO_ENGINE": "sim"}))

    async def main():
        plan = await service.admit(SpeechRequest("Hello there, simulated world. A second sentence.",
                                                 voice="af_bella(2)+af_sky(1)"))
        return [piece async for piece in service.stream(plan)]

    pieces = asyncio.run(main())
    words = [w for p in pieces for w in p.words]
    assert sum(p.seconds for p in pieces) > 1.0
    assert [w.word for w in words][:2] == ["Hello", "there"]
    assert all(a.end <= b.start + 1e-6 for a, b in zip(words, words[1:]))


def test_build_service_builds_the_sim_only_when_asked(monkeypatch):
    """The default engine never falls back to the simulation: with weights that cannot load, the
    build fails instead."""
    from api.speech.build import build_service
    from worker.weights import WeightsError

    sim = asyncio.run(build_service(Settings.from_env({"KOKORO_ENGINE": "sim"})))
    assert isinstance(sim.replica, SimReplica)

    def no_weights(settings):
        raise WeightsError("no weights here")

    monkeypatch.setattr("worker.weights.load_weights", no_weights)
    with pytest.raises(WeightsError):
        asyncio.run(build_service(Settings.from_env({})))


def test_say_refuses_the_simulated_engine_and_names_the_setting(monkeypatch, tmp_path, capsys):
    """`say` is for listening to the model: with KOKORO_ENGINE=sim it writes no synthetic stand-in."""
    from cli.main import main

    monkeypatch.setattr("api.settings._current", Settings.from_env({"KOKORO_ENGINE": "sim"}))
    out = tmp_path / "out.wav"
    assert main(["say", "Hello there.", "-o", str(out)]) == 2
    assert "KOKORO_ENGINE=sim" in capsys.readouterr().err and not out.exists()


def test_the_engines_name_themselves_for_the_replica_table(tiny_weights):
    from worker.engine import Engine, EngineConfig

    assert SimReplica().engine.label == "sim"
    assert Engine(tiny_weights, EngineConfig("cpu", "int8", fused_kernels=False)).label == "torch cpu int8"
