"""VoiceBank over random [510, 256] packs: names, OpenAI aliases, mixes, errors, style rows, and the
deployment's own voice files (KOKORO_VOICES_DIR)."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import numpy as np
import pytest
import torch

import worker.voices as voices_module
from worker.voices import (OPENAI_VOICES, Voice, VoiceBank, VoiceError, VoiceFileError, check_voice_dir,
                           openai_voice_table, voice_file)

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


# --- the deployment's own voices: KOKORO_VOICES_DIR ----------------------------------------------


def _pack(seed: int) -> torch.Tensor:
    return torch.randn(510, 256, generator=torch.Generator().manual_seed(seed))


def _save(path, pack: torch.Tensor) -> None:
    """A voice file in the format its suffix names; written beside and renamed in, as a deploy tool does."""
    tmp = path.with_name("." + path.name)
    if path.suffix == ".pt":
        torch.save(pack.reshape(510, 1, 256).clone(), tmp)
    elif path.suffix == ".npy":
        with open(tmp, "wb") as f:
            np.save(f, pack.numpy())
    else:
        tmp.write_bytes(pack.numpy().astype("<f4").tobytes())
    tmp.rename(path)


@pytest.fixture
def voices_dir(tmp_path, monkeypatch):
    monkeypatch.setattr(voices_module, "RECHECK_S", 0.0)  # every look lists the directory again
    return tmp_path


@pytest.mark.parametrize("suffix", [".pt", ".bin", ".npy"])
def test_a_voice_file_is_served_by_its_name_in_its_language(voices_dir, suffix):
    _save(voices_dir / f"BM_Narrator{suffix}", _pack(1))
    bank = VoiceBank({"af_heart": _pack(0)}, voices_dir)
    voice = bank.resolve("bm_narrator")
    assert voice.lang_code == "b" and torch.equal(voice.pack, _pack(1))
    infos = {v.name: v for v in bank.list()}
    assert (infos["bm_narrator"].language, infos["bm_narrator"].gender) == ("en-gb", "male")
    assert set(infos) == {"af_heart", "bm_narrator"}
    mix = bank.resolve("af_heart+bm_narrator")
    assert torch.allclose(mix.pack, (_pack(0) + _pack(1)) / 2)


def test_a_combined_voice_saved_in_the_directory_is_the_same_mix(voices_dir):
    bank = VoiceBank({"af_heart": _pack(0), "am_adam": _pack(1)}, voices_dir)
    mix = bank.resolve("af_heart(2)+am_adam(1)")
    (voices_dir / "af_house.pt").write_bytes(voice_file(mix))  # what /v1/audio/voices/combine answers
    assert torch.equal(bank.resolve("af_house").pack, mix.pack)


def test_a_file_dropped_in_is_served_by_the_next_request_naming_it(tmp_path):
    bank = VoiceBank({"af_heart": _pack(0)}, tmp_path)  # RECHECK_S as served: 1 s
    bank.names  # listed just now
    _save(tmp_path / "af_new.pt", _pack(2))
    assert torch.equal(bank.resolve("af_new").pack, _pack(2))  # a miss lists the directory at once


def test_a_changed_file_replaces_the_voice_and_its_mixes(voices_dir):
    _save(voices_dir / "af_brand.pt", _pack(1))
    bank = VoiceBank({"af_heart": _pack(0)}, voices_dir)
    before = bank.resolve("af_heart+af_brand").pack
    _save(voices_dir / "af_brand.pt", _pack(2))
    assert torch.equal(bank.resolve("af_brand").pack, _pack(2))
    assert torch.allclose(bank.resolve("af_heart+af_brand").pack, (_pack(0) + _pack(2)) / 2)
    assert not torch.allclose(before, (_pack(0) + _pack(2)) / 2)


def test_a_broken_edit_keeps_the_voice_as_it_was_and_says_why(voices_dir):
    _save(voices_dir / "af_brand.pt", _pack(1))
    bank = VoiceBank({"af_heart": _pack(0)}, voices_dir)
    (voices_dir / "af_brand.pt").write_bytes(b"half a file")
    assert torch.equal(bank.resolve("af_brand").pack, _pack(1))
    error = bank.directory_status()["errors"]["af_brand.pt"]
    assert "af_brand.pt: cannot read it as a voice" in error and "the voice as read before stays" in error
    _save(voices_dir / "af_brand.pt", _pack(3))  # mended
    assert torch.equal(bank.resolve("af_brand").pack, _pack(3))
    assert bank.directory_status()["errors"] == {}


def test_a_removed_file_removes_its_voice(voices_dir):
    _save(voices_dir / "af_brand.pt", _pack(1))
    bank = VoiceBank({"af_heart": _pack(0)}, voices_dir)
    assert "af_brand" in bank.names
    (voices_dir / "af_brand.pt").unlink()
    with pytest.raises(VoiceError, match="unknown voice 'af_brand'"):
        bank.resolve("af_brand")


def test_a_file_may_replace_a_voice_of_the_weights(voices_dir):
    _save(voices_dir / "af_heart.bin", _pack(5))
    bank = VoiceBank({"af_heart": _pack(0)}, voices_dir)
    assert torch.equal(bank.resolve("af_heart").pack, _pack(5))
    (voices_dir / "af_heart.bin").unlink()
    assert torch.equal(bank.resolve("af_heart").pack, _pack(0))


@pytest.mark.parametrize("name, content, problem", [
    ("brand.pt", "pack", "a voice file's name gives the voice's language and gender"),
    ("xf_brand.pt", "pack", "languages: a en-us, b en-gb"),
    ("af_brand.pt", "short", "shape [510, 128], expected [510, 1, 256] or [510, 256]"),
    ("af_brand.pt", "nan", "NaN or infinite"),
    ("af_brand.pt", "ints", "not a float tensor"),
    ("af_brand.pt", "dict", "holds dict"),
    ("af_brand.bin", "short", "a .bin voice is raw float32 [510, 256], 522240 bytes"),
    ("af_brand.npy", "junk", "cannot read it as a voice"),
    ("af_brand.pt", "huge", "far more than a voice"),
])
def test_a_file_that_does_not_read_is_skipped_and_named(voices_dir, name, content, problem):
    path = voices_dir / name
    if content == "pack":
        _save(path, _pack(1))
    elif content == "short":
        if path.suffix == ".bin":
            path.write_bytes(b"\0" * 1000)
        else:
            torch.save(torch.zeros(510, 128), path)
    elif content == "nan":
        torch.save(torch.full((510, 1, 256), float("nan")), path)
    elif content == "ints":
        torch.save(torch.zeros(510, 1, 256, dtype=torch.int32), path)
    elif content == "dict":
        torch.save({"voice": torch.zeros(510, 256)}, path)
    elif content == "huge":
        path.write_bytes(b"\0" * (voices_module.MAX_VOICE_FILE_BYTES + 1))
    else:
        path.write_bytes(b"not numpy")
    bank = VoiceBank({"af_heart": _pack(0)}, voices_dir)
    assert bank.names == ["af_heart"]
    status = bank.directory_status()
    assert problem in status["errors"][name] and "not served" in status["errors"][name]
    with pytest.raises(VoiceError, match="its file in the server's voices directory does not read"):
        bank.resolve(path.stem)  # the request hears the file is there but broken, not where it lies
    with pytest.raises(VoiceFileError, match=re.escape(problem)):
        check_voice_dir(voices_dir)


def test_two_files_of_one_name_serve_the_first_and_name_the_second(voices_dir):
    _save(voices_dir / "af_brand.bin", _pack(1))
    _save(voices_dir / "af_brand.pt", _pack(2))
    bank = VoiceBank({"af_heart": _pack(0)}, voices_dir)
    assert torch.equal(bank.resolve("af_brand").pack, _pack(1))
    assert "af_brand is also given by another file here" in bank.directory_status()["errors"]["af_brand.pt"]
    (voices_dir / "af_brand.bin").unlink()
    assert torch.equal(bank.resolve("af_brand").pack, _pack(2))  # the other file is served now
    assert bank.directory_status()["errors"] == {}


def test_other_files_in_the_directory_are_left_alone(voices_dir):
    (voices_dir / "README.md").write_text("our voices")
    (voices_dir / ".af_tmp.pt").write_bytes(b"being written")
    _save(voices_dir / "af_brand.pt", _pack(1))
    bank = VoiceBank({"af_heart": _pack(0)}, voices_dir)
    assert bank.names == ["af_brand", "af_heart"] and bank.directory_status()["errors"] == {}


def test_check_voice_dir_refuses_a_missing_directory(tmp_path):
    with pytest.raises(VoiceFileError, match="KOKORO_VOICES_DIR .*: no such directory"):
        check_voice_dir(tmp_path / "voicse")
    _save(tmp_path / "af_brand.npy", _pack(1))
    assert set(check_voice_dir(tmp_path)) == {"af_brand"}


def test_serve_refuses_a_voice_file_that_does_not_read_before_starting(tmp_path):
    (tmp_path / "af_brand.pt").write_bytes(b"half a file")
    run = subprocess.run([sys.executable, "-m", "cli.main", "serve", "--workers", "1"], capture_output=True, text=True,
                         timeout=60, env={**os.environ, "KOKORO_VOICES_DIR": str(tmp_path)})
    assert run.returncode != 0
    assert "kokoro-fleet serve: KOKORO_VOICES_DIR: " in run.stderr and "af_brand.pt: cannot read it" in run.stderr


def test_the_directory_is_logged_when_it_changes_not_at_every_look(voices_dir, caplog):
    caplog.set_level("INFO", logger="kokoro_fleet.voices")
    bank = VoiceBank({"af_heart": _pack(0)}, voices_dir)
    for _ in range(3):
        bank.names
    _save(voices_dir / "af_brand.pt", _pack(1))
    for _ in range(3):
        bank.names
    said = [r.getMessage() for r in caplog.records if "voices from" in r.getMessage()]
    assert said == [f"voices from {voices_dir}: none yet", f"voices from {voices_dir}: af_brand"]
