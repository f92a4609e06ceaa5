"""The speech glue: plan validation, chunk order, pauses, timestamps offsets, joins, cancellation."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import torch

from worker.engine import Synthesis
from api.speech.contract import EDGE_FADE_SAMPLES, SpeechRequest, fade_edges
from api.speech.local import SpeechService
from worker.audio import SAMPLE_RATE
from api.settings import Settings
from worker.text import NormalizationOptions, NothingToSay, TextError, text_to_chunks
from worker.voices import VoiceBank, VoiceError
from worker.weights import VOICE_NAMES

FRAME = 600


class RecordingReplica:
    """A replica stand-in that returns a loud square wave (the worst case for clicks) per chunk."""

    def __init__(self, delay: float = 0.0):
        self.calls: list[list[int]] = []
        self.styles: list[torch.Tensor] = []
        self.speeds: list[float] = []
        self.delay = delay

    async def synthesize(self, ids, style, speed=1.0):
        self.calls.append(list(ids))
        self.styles.append(style)
        self.speeds.append(speed)
        await asyncio.sleep(self.delay)
        durations = np.full(len(ids) + 2, 2, dtype=np.int64)
        n = int(durations.sum()) * FRAME
        audio = np.where(np.arange(n) % 50 < 25, 0.8, -0.8).astype(np.float32)
        return Synthesis(audio=audio, durations=durations)


@pytest.fixture(scope="module")
def voices() -> VoiceBank:
    gen = torch.Generator().manual_seed(0)
    return VoiceBank({name: torch.randn(510, 256, generator=gen) for name in VOICE_NAMES})


def service(voices, replica) -> SpeechService:
    return SpeechService(replica, voices, Settings(first_chunk_phonemes=20, chunk_phonemes=60))


async def collect(svc, plan):
    return [piece async for piece in svc.stream(plan)]


def test_fade_edges_ramps_to_zero_and_keeps_the_middle():
    audio = np.ones(1000, dtype=np.float32)
    faded = fade_edges(audio)
    assert faded[0] == pytest.approx(0.0, abs=1e-6) and faded[-1] == pytest.approx(0.0, abs=1e-6)
    assert np.all(faded[EDGE_FADE_SAMPLES:-EDGE_FADE_SAMPLES] == 1.0)
    assert np.all(np.diff(faded[:EDGE_FADE_SAMPLES]) >= 0)
    assert fade_edges(np.ones(3, np.float32)).shape == (3,)  # shorter than two fades: no crash


def test_stream_yields_every_chunk_in_order_with_continuous_joins(voices):
    replica = RecordingReplica()
    svc = service(voices, replica)
    text = " ".join(["The quick brown fox jumps over the lazy dog."] * 6)
    plan = svc.plan(SpeechRequest(text, voice="af_heart"))
    assert len(plan.chunks) > 2, "the text should need several chunks at these sizes"
    pieces = asyncio.run(collect(svc, plan))
    assert [p.index for p in pieces] == list(range(len(plan.chunks)))
    assert [p.is_last for p in pieces] == [False] * (len(pieces) - 1) + [True]
    assert replica.calls == [c.ids for c in plan.chunks if c.ids]
    audio = np.concatenate([p.pcm for p in pieces])
    inner = max(np.abs(np.diff(p.pcm[EDGE_FADE_SAMPLES:-EDGE_FADE_SAMPLES])).max() for p in pieces)
    joins = np.cumsum([len(p.pcm) for p in pieces])[:-1]
    for j in joins:
        assert abs(float(audio[j]) - float(audio[j - 1])) <= inner


def test_word_times_are_absolute_and_increasing(voices):
    svc = service(voices, RecordingReplica())
    plan = svc.plan(SpeechRequest("One two three four five six seven eight nine ten. " * 3))
    pieces = asyncio.run(collect(svc, plan))
    words = [w for p in pieces for w in p.words]
    assert words, "timestamps expected"
    starts = [w.start for w in words]
    assert starts == sorted(starts)
    total = sum(p.seconds for p in pieces)
    assert words[-1].end <= total + 1e-6
    second_piece_start = pieces[0].seconds
    assert pieces[1].words[0].start >= second_piece_start - 1e-6


def test_pause_tag_appends_silence_of_that_length(voices):
    svc = service(voices, RecordingReplica())
    with_pause = asyncio.run(collect(svc, svc.plan(SpeechRequest("Hello there. [pause:0.5s] General Kenobi."))))
    without = asyncio.run(collect(svc, svc.plan(SpeechRequest("Hello there. General Kenobi."))))
    extra = sum(len(p.pcm) for p in with_pause) - sum(len(p.pcm) for p in without)
    assert extra == round(0.5 * SAMPLE_RATE)


def test_plan_rejects_bad_voice_and_empty_text_before_any_audio(voices):
    replica = RecordingReplica()
    svc = service(voices, replica)
    with pytest.raises(VoiceError):
        svc.plan(SpeechRequest("Hello.", voice="no_such_voice"))
    with pytest.raises(TextError):
        svc.plan(SpeechRequest("   ", voice="af_heart"))
    with pytest.raises(NothingToSay) as code_only:  # a live session skips such a piece; a request is refused
        svc.plan(SpeechRequest("```python\nprint(1)\n```", voice="af_heart"))
    assert code_only.value.code == "nothing_to_say" and code_only.value.param == "input"
    assert replica.calls == []


def test_ssml_voice_elements_read_their_parts_in_their_voices_and_languages(voices):
    replica = RecordingReplica()
    svc = service(voices, replica)
    plan = svc.plan(SpeechRequest('<speak>Hello there. <voice name="bm_george">Good morning.</voice> '
                                  '<voice name="ff_siwis">Bonjour à tous.</voice> Bye.</speak>', voice="af_heart"))
    spoken = [c for c in plan.chunks if c.ids]
    assert [c.voice for c in spoken] == [None, "bm_george", "ff_siwis", None]
    assert [plan.voice_spec_of(c) for c in spoken] == ["af_heart", "bm_george", "ff_siwis", "af_heart"]
    french = text_to_chunks("Bonjour à tous.", "f")[0]  # read by the French reader, not the English one
    assert spoken[2].phonemes == french.phonemes != text_to_chunks("Bonjour à tous.", "a")[0].phonemes
    asyncio.run(collect(svc, plan))
    for chunk, style in zip(spoken, replica.styles, strict=True):
        assert torch.equal(style, voices.style(plan.voice_of(chunk), len(chunk.ids)))


def test_ssml_prosody_rate_scales_the_requests_speed_within_its_bounds(voices):
    replica = RecordingReplica()
    svc = service(voices, replica)
    plan = svc.plan(SpeechRequest('Normal pace. <prosody rate="slow">Slowly now.</prosody> '
                                  '<prosody rate="+300%">Very fast.</prosody> <prosody volume="loud">Loud.</prosody>',
                                  speed=1.2))
    spoken = [c for c in plan.chunks if c.ids]
    assert [c.rate for c in spoken] == [1.0, 0.75, 4.0, 1.0]
    asyncio.run(collect(svc, plan))
    assert replica.speeds == pytest.approx([1.2, 0.9, 4.0, 1.2])  # 1.2 x 4 is past the model's 4.0
    slow = svc.plan(SpeechRequest('<prosody rate="50%">' + "The same words again. " * 3 + "</prosody>"))
    assert slow.estimated_seconds == pytest.approx(2 * svc.plan(SpeechRequest("The same words again. " * 3))
                                                   .estimated_seconds, rel=0.05)


def test_a_voice_element_with_an_unknown_name_is_an_input_error_and_markup_off_reads_it(voices):
    svc = service(voices, RecordingReplica())
    with pytest.raises(TextError, match=r"<voice name='am_nobody'> in the input: unknown voice") as err:
        svc.plan(SpeechRequest('Hi <voice name="am_nobody">there</voice>.'))
    assert err.value.param == "input"
    literal = svc.plan(SpeechRequest('Hi <voice name="bm_george">there</voice>.',
                                     normalization=NormalizationOptions(markup_normalization=False)))
    assert all(c.voice is None for c in literal.chunks) and literal.voices == {}


def test_a_voice_whose_language_the_server_cannot_read_is_the_voice_at_fault():
    """A voice file whose name gives a language no reader serves (`xf_`): the request's voice is at
    fault unless the request set lang_code; a <voice> element's, the input; phonemes need no reader."""
    gen = torch.Generator().manual_seed(1)
    bank = VoiceBank({name: torch.randn(510, 256, generator=gen) for name in ("af_heart", "xf_custom")})
    svc = service(bank, RecordingReplica())
    with pytest.raises(TextError, match=r"voice xf_custom: unknown lang_code 'x'.*pick another voice or set lang_code") \
            as err:
        svc.plan(SpeechRequest("Hello there.", voice="xf_custom"))
    assert err.value.param == "voice"
    assert svc.plan(SpeechRequest("Hello there.", voice="xf_custom", lang_code="a")).lang_code == "a"
    assert svc.plan(SpeechRequest("hɛlˈO", voice="xf_custom", phonemes=True)).chunks
    with pytest.raises(TextError, match=r"<voice name='xf_custom'> in the input: voice xf_custom: unknown lang_code") \
            as err:
        svc.plan(SpeechRequest('Hi <voice name="xf_custom">there</voice>.'))
    assert err.value.param == "input"


def test_a_bad_voice_is_found_missing_without_an_error_and_refused_when_planned(voices):
    svc = service(voices, RecordingReplica())
    assert svc.voice_for(SpeechRequest("Hi.", voice="nobody")) is None
    with pytest.raises(VoiceError, match="unknown voice 'nobody'"):
        asyncio.run(svc.admit(SpeechRequest("Hi.", voice="nobody")))
    assert svc.voice_for(SpeechRequest("Hi.", voice="nova")).name == "af_nova"
    assert voices.find("bm_george(2)+af_heart").lang_code == "b" and voices.find("echo").name == "am_echo"
    assert [voices.find(s) for s in ("nobody", "", "-af_heart", "af_heart(", "+", "af_heart(-1)")] == [None] * 6


def test_kokoro_fastapi_voice_tags_read_as_the_ssml_they_stand_for(voices):
    """`[voice:...]` and `[rate:...]` (allowed per request) give the chunks, voices and speeds the
    equivalent SSML gives; not allowed, they are text."""
    svc = service(voices, RecordingReplica())
    tagged = svc.plan(SpeechRequest("Hello there. [voice:bm_george] Good morning. [rate:1.5] Quickly now. "
                                    "[voice:ff_siwis] Bonjour à tous.", voice="af_heart", speed=1.2,
                                    voice_tags=True))
    ssml = svc.plan(SpeechRequest('Hello there. <voice name="bm_george"> Good morning. <prosody rate="1.5"> '
                                  'Quickly now. </prosody></voice><voice name="ff_siwis"> Bonjour à tous.</voice>',
                                  voice="af_heart", speed=1.2))
    assert [(c.phonemes, c.voice, c.rate) for c in tagged.chunks] == [(c.phonemes, c.voice, c.rate) for c in ssml.chunks]
    assert [tagged.speed_of(c) for c in tagged.chunks if c.ids] == pytest.approx([1.2, 1.2, 1.8, 1.2])
    assert [c.voice for c in tagged.chunks if c.ids] == [None, "bm_george", "bm_george", "ff_siwis"]
    as_text = svc.plan(SpeechRequest("Hello there. [voice:bm_george] Good morning.", voice="af_heart"))
    assert all(c.voice is None for c in as_text.chunks)


def test_voice_aliases_name_voices_with_their_own_pace(voices):
    """An alias as the request's voice carries its voice and pace into the plan (and so into a fleet's
    jobs); in a tag, a voice's pace replaces the one before, and `[rate:]` scales the voice speaking."""
    svc = service(voices, RecordingReplica())
    aliases = {"narrator": ("af_bella(2)+af_sky", 0.8), "villain": ("am_michael", 1.0)}
    plan = svc.plan(SpeechRequest("Once upon a time. [voice:villain] Never! [voice:Narrator] He said. "
                                  "[rate:1.25] Then ran.", voice="Narrator", speed=1.0, voice_tags=True,
                                  voice_aliases=aliases))
    assert plan.request.voice == "af_bella(2)+af_sky" and plan.voice.name == voices.resolve("af_bella(2)+af_sky").name
    read = {c.text: (plan.voice_spec_of(c), plan.speed_of(c)) for c in plan.chunks if c.ids}
    assert read["time."] == ("af_bella(2)+af_sky", pytest.approx(0.8))
    assert read["Never!"] == ("am_michael", pytest.approx(1.0))           # the villain at its own pace
    assert read["He said."] == ("af_bella(2)+af_sky", pytest.approx(0.8))
    assert read["Then ran."] == ("af_bella(2)+af_sky", pytest.approx(1.0))  # 1.25 x the narrator's 0.8
    plain = svc.plan(SpeechRequest("Once.", voice="villain", voice_aliases=aliases))  # no tags needed for `voice`
    assert plain.request.voice == "am_michael"


@pytest.mark.parametrize("text, problem", [
    ("Hi [voice:am_nobody] there.", "[voice:am_nobody] in the input: unknown voice 'am_nobody'"),
    ("Hi [rate:fast] there.", "[rate:fast] in the input: a rate is a positive number"),
    ("Hi [rate:0] there.", "[rate:0] in the input: a rate is a positive number"),
    ('Hi [voice:a"b] there.', "name a voice, a mix"),
])
def test_a_tag_it_cannot_read_is_an_input_error_naming_it(voices, text, problem):
    with pytest.raises(TextError) as err:
        service(voices, RecordingReplica()).plan(SpeechRequest(text, voice_tags=True))
    assert problem in str(err.value) and err.value.param == "input"


def test_cancelling_the_consumer_stops_after_the_chunk_in_flight(voices):
    replica = RecordingReplica(delay=0.05)
    svc = service(voices, replica)
    plan = svc.plan(SpeechRequest(" ".join(["A long sentence that keeps going and going."] * 10)))
    assert len(plan.chunks) > 3

    async def take_first_then_drop():
        stream = svc.stream(plan)
        await stream.__anext__()
        await stream.aclose()  # what the server does when the client disconnects

    asyncio.run(take_first_then_drop())
    assert len(replica.calls) == 1


def test_plan_refuses_audio_longer_than_the_configured_cap(voices):
    text = " ".join(["This sentence takes a couple of seconds to say."] * 20)
    capped = SpeechService(RecordingReplica(), voices, Settings(max_request_audio_seconds=10.0))
    with pytest.raises(TextError, match="split the text"):
        capped.plan(SpeechRequest(text))
    assert capped.plan(SpeechRequest("Short and sweet.")).estimated_seconds < 10.0
    uncapped = SpeechService(RecordingReplica(), voices, Settings())
    assert uncapped.plan(SpeechRequest(text)).estimated_seconds > 10.0


def test_language_errors_name_the_field_that_chose_the_language(voices):
    svc = service(voices, RecordingReplica())
    with pytest.raises(TextError) as by_request:
        svc.plan(SpeechRequest("Hello.", voice="af_heart", lang_code="xx"))
    assert by_request.value.param == "lang_code"
    assert svc.plan(SpeechRequest("你好。", voice="zf_xiaobei")).lang_code == "z"
    # A voice directory may hold voices of languages we cannot read (Korean, say): the voice chose it.
    gen = torch.Generator().manual_seed(1)
    korean = service(VoiceBank({"kf_test": torch.randn(510, 256, generator=gen)}), RecordingReplica())
    with pytest.raises(TextError) as by_voice:
        korean.plan(SpeechRequest("Hello.", voice="kf_test"))
    assert by_voice.value.param == "voice" and "kf_test" in str(by_voice.value)
    assert korean.plan(SpeechRequest("Hello.", voice="kf_test", lang_code="a")).lang_code == "a"


def test_a_language_reader_loads_off_the_event_loop_then_short_texts_plan_inline(voices, monkeypatch):
    """Planning a short text on the event loop is cheaper than a thread hop, but not the first
    text of a language: loading its reader (Mandarin's dictionaries about 0.7 s) would stall
    every stream of the worker. Until the reader is loaded such a text goes to the thread."""
    from worker.text import chunks

    monkeypatch.setattr(chunks, "_loaded_languages", set())  # as in a fresh process
    svc = service(voices, RecordingReplica())
    mandarin = SpeechRequest("你好，世界。", voice="zf_xiaobei")
    assert not svc.plans_inline(mandarin) and not svc.plans_inline(SpeechRequest("Hi.", voice="af_heart"))
    assert svc.plans_inline(SpeechRequest("hɛlˈO", phonemes=True))  # phonemes need no reader
    assert svc.plans_inline(SpeechRequest("Hi.", voice="nobody"))  # refused at once anyway
    assert svc.plans_inline(SpeechRequest("Hi.", voice="af_heart", lang_code="xx"))
    plan = asyncio.run(svc.plan_off_loop(mandarin))  # in the text thread, which loads the reader
    assert plan.lang_code == "z" and plan.chunks[0].ids
    assert svc.plans_inline(mandarin) and svc.plans_inline(SpeechRequest("你好。", voice="af_heart", lang_code="zh"))
    assert not svc.plans_inline(SpeechRequest("Hi.", voice="af_heart"))  # English: still to load
    assert not svc.plans_inline(SpeechRequest("你好。" * 100, voice="zf_xiaobei"))  # long: always the thread


def test_warmup_loads_the_preloaded_languages(voices, monkeypatch):
    from worker.text import chunks, language_loaded

    class Warm(RecordingReplica):
        async def warmup(self):
            pass

    monkeypatch.setattr(chunks, "_loaded_languages", set())
    asyncio.run(SpeechService(Warm(), voices, Settings(preload_languages="j,z")).warmup())
    assert [c for c in "abefhijpz" if language_loaded(c)] == ["j", "z"]
    asyncio.run(SpeechService(Warm(), voices, Settings()).warmup())  # the default: both Englishes
    assert [c for c in "abefhijpz" if language_loaded(c)] == ["a", "b", "j", "z"]
