"""VoiceBank over random [510, 256] packs: names, OpenAI aliases, mixes, errors, style rows."""

from __future__ import annotations

import pytest
import torch

from worker.voices import OPENAI_VOICES, Voice, VoiceBank, VoiceError, openai_voice_table

NAMES = ["af_heart", "af_bella", "af_sky", "af_alloy", "af_nova", "af_sarah", "af_jessica", "am_michael",
         "am_echo", "am_onyx", "am_fenrir", "am_liam", "bm_george", "bm_fable", "bf_emma", "ef_dora",
         "ff_siwis", "hf_alpha", "if_sara", "jf_alpha", "pm_alex", "zf_xiaobei"]


@pytest.fixture(scope="module")
def bank():
    gen = torch.Generator().manual_seed(0)
    return VoiceBank({n: torch.randn(510, 256, generator=gen) for n in NAMES})


def test_resolve_a_name(bank):
    voice = bank.resolve("af_bella")
    assert voice.name == "af_bella" and voice.lang_code == "a" and voice.pack.shape == (510, 256)
    assert bank.resolve("bm_george").lang_code == "b"
    assert bank.resolve("ff_siwis").lang_code == "f"


def test_names_are_case_insensitive(bank):
    assert torch.equal(bank.resolve("AF_Bella").pack, bank.resolve("af_bella").pack)


def test_every_openai_name_resolves_to_its_table_entry(bank):
    assert set(OPENAI_VOICES) == {"alloy", "ash", "ballad", "coral", "echo", "fable", "onyx", "nova", "sage",
                                  "shimmer", "verse", "marin", "cedar"}
    for openai, (kokoro, _) in OPENAI_VOICES.items():
        assert torch.equal(bank.resolve(openai).pack, bank.resolve(kokoro).pack), openai


def test_openai_table_markdown_lists_every_row():
    table = openai_voice_table().splitlines()
    assert table[0].startswith("| OpenAI voice |") and len(table) == 2 + len(OPENAI_VOICES)
    assert "| `nova` | `af_nova` |" in openai_voice_table()


def test_equal_mix_is_the_mean(bank):
    mix = bank.resolve("af_bella+af_sky")
    expected = (bank.resolve("af_bella").pack + bank.resolve("af_sky").pack) / 2
    assert torch.allclose(mix.pack, expected, atol=1e-6)
    assert mix.lang_code == "a"


def test_weighted_mix_normalizes_weights(bank):
    mix = bank.resolve("af_bella(2)+af_sky(1)")
    expected = bank.resolve("af_bella").pack * (2 / 3) + bank.resolve("af_sky").pack * (1 / 3)
    assert torch.allclose(mix.pack, expected, atol=1e-6)
    assert torch.allclose(bank.resolve("af_bella(4) + af_sky(2)").pack, mix.pack, atol=1e-6)
    assert mix.name == "af_bella(0.667)+af_sky(0.333)"


def test_subtracting_a_voice_as_kokoro_fastapi_does(bank):
    bella, sky, heart = (bank.resolve(n).pack for n in ("af_bella", "af_sky", "af_heart"))
    mix = bank.resolve("af_bella(2)-af_sky(1)")
    assert torch.allclose(mix.pack, bella * (2 / 3) - sky * (1 / 3), atol=1e-6)
    assert mix.name == "af_bella(0.667)-af_sky(0.333)" and mix.lang_code == "a"
    assert torch.allclose(bank.resolve(mix.name).pack, mix.pack, atol=1e-2)  # the name reads back (3 digits)
    three = bank.resolve("af_bella - af_sky + af_heart")
    assert torch.allclose(three.pack, (bella - sky + heart) / 3, atol=1e-6)
    assert not torch.allclose(bank.resolve("af_bella+af_sky").pack, bank.resolve("af_bella-af_sky").pack)


def test_mix_language_follows_the_first_voice(bank):
    assert bank.resolve("bf_emma+af_sky").lang_code == "b"


def test_mixes_are_cached(bank):
    first = bank.resolve("af_heart(3)+am_echo(1)")
    assert bank.resolve("af_heart(3)+am_echo(1)") is first


def test_mix_cache_is_bounded(bank):
    from worker import voices

    for i in range(voices.MIX_CACHE_SIZE + 10):
        bank.resolve(f"af_heart({i + 1})+af_sky(1)")
    assert len(bank._mixes) <= voices.MIX_CACHE_SIZE


@pytest.mark.parametrize("spec, problem", [
    ("af_bella++af_sky", "empty part"),
    ("+af_bella", "empty part"),
    ("af_bella-", "empty part"),
    ("af_bella+-af_sky", "empty part"),
    ("-af_bella+af_sky", "starts with '-'"),
    ("af_bella(x)", "not a number"),
    ("af_bella(0)", "positive"),
    ("af_bella(-1)", "positive"),
    ("af_bella(nan)", "positive"),
    ("af_bella(2", "cannot read"),
    ("../../etc/passwd", "cannot read"),
    ("af_nobody", "unknown voice 'af_nobody'"),
    ("", "empty"),
])
def test_malformed_specs_raise_voice_error_naming_the_problem(bank, spec, problem):
    with pytest.raises(VoiceError) as err:
        bank.resolve(spec)
    message = str(err.value)
    assert problem in message
    if "empty" != problem:
        assert "GET /v1/audio/voices" in message or "e.g. af_bella(2)+af_sky(1)" in message
    assert err.value.param == "voice"


def test_unknown_voice_message_lists_how_to_find_names(bank):
    with pytest.raises(VoiceError, match=r"GET /v1/audio/voices lists the 22 valid names") as err:
        bank.resolve("nobody")
    assert "did you mean" not in str(err.value)


@pytest.mark.parametrize("typo, meant", [("af_hart", "af_heart"), ("af_bela", "af_bella"), ("alloi", "alloy")])
def test_a_misspelt_voice_is_answered_with_the_likely_name(bank, typo, meant):
    with pytest.raises(VoiceError, match=rf"unknown voice '{typo}' in '{typo}'; did you mean '{meant}'\?"):
        bank.resolve(typo)


def test_style_row_follows_phoneme_count_and_is_clamped(bank):
    voice = bank.resolve("af_heart")
    assert torch.equal(bank.style(voice, 1), voice.pack[0])
    assert torch.equal(bank.style(voice, 37), voice.pack[36])
    assert torch.equal(bank.style(voice, 510), voice.pack[509])
    assert torch.equal(bank.style(voice, 5000), voice.pack[509])
    assert torch.equal(bank.style(voice, 0), voice.pack[0])
    assert bank.style(voice, 37).shape == (256,)


def test_official_pack_layout_is_flattened():
    bank = VoiceBank({"af_heart": torch.zeros(510, 1, 256)})
    assert bank.resolve("af_heart").pack.shape == (510, 256)


def test_list_gives_language_and_gender(bank):
    infos = {v.name: v for v in bank.list()}
    assert len(infos) == len(NAMES)
    assert (infos["af_heart"].language, infos["af_heart"].gender) == ("en-us", "female")
    assert (infos["bm_george"].language, infos["bm_george"].gender) == ("en-gb", "male")
    assert (infos["jf_alpha"].language, infos["zf_xiaobei"].language) == ("ja", "zh")
    assert infos["pm_alex"].lang_code == "p"


@pytest.mark.slow  # building the tiny weights takes ~20 s on this CPU
def test_tiny_weights_voices_work(tiny_weights):
    from worker.weights import VOICE_NAMES

    bank = VoiceBank(tiny_weights.voices)
    assert set(bank.names) == set(VOICE_NAMES) and len(VOICE_NAMES) == 54
    for openai in OPENAI_VOICES:  # every OpenAI name maps to a real v1.0 voice
        assert isinstance(bank.resolve(openai), Voice)
