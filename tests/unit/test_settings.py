"""Settings fail early: an enumerated setting outside its choices stops the program as the
settings are read, with one line naming the variable and what it accepts."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from api.settings import Settings, SettingsError

ENUMERATED = {
    "KOKORO_DTYPE": ("bf16", "bf17", "auto, fp32, bf16, fp16"),
    "KOKORO_ENGINE": ("sim", "simulated", "torch, sim"),
    "KOKORO_DEVICE": ("cuda:1", "gpu", "auto, cuda, cpu or cuda:N"),
    "KOKORO_DISPATCH": ("local", "sharde", "shared, local"),
    "KOKORO_MPS": ("off", "yes", "auto, on, off"),
    "KOKORO_WEIGHTS": ("random-full", "ofline", "offline, official, tiny, random-full or an existing directory"),
}


@pytest.mark.parametrize("env", sorted(ENUMERATED))
def test_enumerated_settings_accept_their_choices_and_name_them_on_a_typo(env):
    good, typo, choices = ENUMERATED[env]
    field = next(f.name for f in Settings.__dataclass_fields__.values() if f.metadata["env"] == env)
    assert getattr(Settings.from_env({env: good}), field) == good
    with pytest.raises(SettingsError) as error:
        Settings.from_env({env: typo})
    assert env in str(error.value) and repr(typo) in str(error.value) and choices in str(error.value)


def test_weights_accept_an_existing_directory(tmp_path):
    assert Settings.from_env({"KOKORO_WEIGHTS": str(tmp_path)}).weights == str(tmp_path)
    with pytest.raises(SettingsError, match="KOKORO_WEIGHTS"):
        Settings.from_env({"KOKORO_WEIGHTS": str(tmp_path / "nowhere")})


def test_a_mistyped_dtype_stops_serve_at_once_with_one_line():
    env = dict(os.environ, KOKORO_DTYPE="bf17", KOKORO_PORT="1")  # port 1: nothing may ever listen
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "cli.main", "serve", "--workers", "2"],
                          capture_output=True, text=True, env=env, timeout=120)
    elapsed = time.monotonic() - started
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "KOKORO_DTYPE" in lines[0] and "auto, fp32, bf16, fp16, int8" in lines[0] and "Traceback" not in proc.stderr
    print(f"serve with KOKORO_DTYPE=bf17 exited {proc.returncode} after {elapsed:.2f} s: {lines[0]}")


def test_the_weights_command_reads_only_the_settings_it_uses():
    """docker/entrypoint.sh asks `kokoro-fleet weights` first: a mistyped server setting is refused
    by `serve` (or the entrypoint), not reported as unusable weights."""
    env = dict(os.environ, KOKORO_MPS="bogus", KOKORO_DISPATCH="sharde", KOKORO_WEIGHTS="tiny")
    shown = subprocess.run([sys.executable, "-m", "cli.main", "weights", "--json"],
                           capture_output=True, text=True, env=env, timeout=300)
    assert shown.returncode == 0 and '"source": "tiny"' in shown.stdout, shown.stderr
    typo = subprocess.run([sys.executable, "-m", "cli.main", "weights"], capture_output=True, text=True,
                          env=dict(env, KOKORO_WEIGHTS="ofline"), timeout=120)
    assert typo.returncode != 0 and "KOKORO_WEIGHTS" in typo.stderr and "Traceback" not in typo.stderr


def test_batch_max_is_a_whole_number_of_at_least_one():
    assert Settings.from_env({}).batch_max == 1
    assert Settings.from_env({"KOKORO_BATCH_MAX": "4"}).batch_max == 4
    for bad in ("0", "-2", "four", "2.5"):
        with pytest.raises(SettingsError) as error:
            Settings.from_env({"KOKORO_BATCH_MAX": bad})
        assert "KOKORO_BATCH_MAX" in str(error.value) and "an integer of at least 1" in str(error.value)


def test_preload_languages_takes_codes_or_all_and_names_the_codes_on_a_typo():
    from worker.text.g2p import SUPPORTED_CODES
    from api.settings import LANGUAGE_CODES

    assert LANGUAGE_CODES == SUPPORTED_CODES
    assert Settings.from_env({"KOKORO_PRELOAD_LANGUAGES": "z, j,z"}).preload_language_codes() == ("z", "j")
    assert Settings.from_env({"KOKORO_PRELOAD_LANGUAGES": "all"}).preload_language_codes() == LANGUAGE_CODES
    assert Settings().preload_language_codes() == ("a", "b")
    with pytest.raises(SettingsError) as error:
        Settings.from_env({"KOKORO_PRELOAD_LANGUAGES": "a,zh"})
    assert "KOKORO_PRELOAD_LANGUAGES" in str(error.value) and "a, b, e, f, h, i, j, p, z" in str(error.value)


def test_api_keys_are_named_for_the_log_and_metrics_never_shown():
    import hashlib

    from api.state import parse_api_keys

    pairs = parse_api_keys(" support-bot:sk-123 , sk-plain,, reader.v2:a:b, bad name:sk-x ")
    assert pairs[0] == ("support-bot", "sk-123")
    assert pairs[1] == ("key-" + hashlib.sha256(b"sk-plain").hexdigest()[:6], "sk-plain")
    assert pairs[2] == ("reader.v2", "a:b")  # only the first colon names
    assert pairs[3] == ("key-" + hashlib.sha256(b"bad name:sk-x").hexdigest()[:6], "bad name:sk-x")  # not a name
    assert parse_api_keys("") == ()
