"""A request's voice is resolved once, and each chunk's voice and speed travel to the replica in one
form: the job carries the voice's canonical spec (which any worker's VoiceBank turns into the same
pack) and the speed the plan decided, which is also the one the queue's estimate uses."""

from __future__ import annotations

import pytest
import torch

from api.settings import Settings
from api.speech.contract import SpeechRequest
from api.speech.fleet_admission import chunk_job
from api.speech.local import SpeechService
from api.speech.redis_link import decode_job
from worker.voices import Voice, VoiceBank, VoiceError
from worker.weights import VOICE_NAMES


def bank() -> VoiceBank:
    gen = torch.Generator().manual_seed(0)
    return VoiceBank({name: torch.randn(510, 256, generator=gen) for name in VOICE_NAMES})


class CountingBank(VoiceBank):
    """A VoiceBank that counts the specs it is asked to resolve."""

    asked: list[str]

    def resolution(self, spec: str):
        self.asked.append(spec)
        return super().resolution(spec)

    def resolve(self, spec: str, written_in_input: str | None = None) -> Voice:
        self.asked.append(spec)
        return super().resolve(spec, written_in_input)


@pytest.fixture
def service() -> SpeechService:
    voices = CountingBank(dict(bank()._builtin))
    voices.asked = []
    return SpeechService(None, voices, Settings(first_chunk_phonemes=20, chunk_phonemes=60))


def test_an_aliased_voice_is_resolved_once_for_the_inline_check_and_the_plan(service):
    request = SpeechRequest("Hello there.", voice="Narrator", speed=1.5,
                            voice_aliases={"narrator": ("af_bella(2)+af_sky(1)", 0.8)})
    voiced = service.voiced(request)
    service.plans_inline(request, voiced)
    plan = service.plan(request, voiced)
    assert service.voices.asked == ["af_bella(2)+af_sky(1)"]
    assert plan.request.voice == "af_bella(2)+af_sky(1)" and plan.request.speed == pytest.approx(1.2)
    assert plan.voice is voiced.voice


def test_a_voice_that_names_nothing_is_refused_at_planning_with_the_error_found_once(service):
    request = SpeechRequest("Hello there.", voice="nobody")
    voiced = service.voiced(request)
    assert service.plans_inline(request, voiced)  # refused at once: nothing to hand to the thread
    with pytest.raises(VoiceError, match="unknown voice 'nobody'"):
        service.plan(request, voiced)
    assert service.voices.asked == ["nobody"]


def test_each_job_carries_its_chunks_canonical_voice_and_the_speed_the_estimate_uses(service):
    plan = service.plan(SpeechRequest('Hello there. <voice name="af_bella(2)+am_adam(1)"><prosody rate="1.5">'
                                      'Quickly now.</prosody></voice> And back.', voice="alloy", speed=0.8))
    other = bank()  # another worker's bank: the same voices, nothing cached
    spoken = [c for c in plan.chunks if c.ids]
    assert sorted({round(plan.speed_of(c), 6) for c in spoken}) == [0.8, 1.2]
    for chunk in spoken:
        job = chunk_job(chunk.ids, plan.voice_of(chunk), plan.speed_of(chunk))
        ids, voice, speed = decode_job(job.payload)
        assert ids == list(chunk.ids) and job.phonemes == len(chunk.ids)
        assert speed == job.speed == plan.speed_of(chunk)
        assert voice == plan.voice_of(chunk).canonical
        assert torch.equal(other.resolve(voice).pack, plan.voice_of(chunk).pack)
    assert {decode_job(chunk_job(c.ids, plan.voice_of(c), 1.0).payload)[1] for c in spoken} == \
        {"af_alloy", "af_bella(2.0)+am_adam(1.0)"}
