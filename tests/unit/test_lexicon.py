"""The deployment's own pronunciations (KOKORO_LEXICON): which words they reach, what they leave
alone, how a malformed file is refused, and that the server's text frontend and `serve` use them."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from worker.text import LexiconError, load_lexicon, text_to_chunks

ENTRIES = {
    "Kokoro": "kˈOkəɹO",           # a capital: matches as written
    "nginx": "ˈɛnʤɪnˌɛks",         # lowercase: any capitalization
    "US": "jˌuˈɛs",                # "us" stays the pronoun
    "Kokoro Fleet": "kˈOkəɹO flˈit",  # a phrase, longer than its first word: wins over it
    "H100": "ˈAʧ wˈʌn hˈʌndɹəd",   # digits the number rules would otherwise read
    "z": {"Kokoro": "kʰo→kʰo→lwo→"},  # Mandarin's own
}


@pytest.fixture()
def lexicon(tmp_path):
    path = tmp_path / "lexicon.json"
    path.write_text(json.dumps(ENTRIES, ensure_ascii=False), encoding="utf-8")
    return load_lexicon(str(path))


@pytest.mark.parametrize("text, marked", [
    ("Kokoro is fast.", "[Kokoro](/kˈOkəɹO/) is fast."),
    ("kokoro is not an entry in lowercase", "kokoro is not an entry in lowercase"),
    ("nginx, Nginx, NGINX", "[nginx](/ˈɛnʤɪnˌɛks/), [Nginx](/ˈɛnʤɪnˌɛks/), [NGINX](/ˈɛnʤɪnˌɛks/)"),
    ("Tell us about the US.", "Tell us about the [US](/jˌuˈɛs/)."),
    ("Kokoro Fleet on an H100", "[Kokoro Fleet](/kˈOkəɹO flˈit/) on an [H100](/ˈAʧ wˈʌn hˈʌndɹəd/)"),
    # not inside another word, an address or an existing link
    ("Kokoros, preKokoro, Kokoro-based, Kokoro_x", "Kokoros, preKokoro, Kokoro-based, Kokoro_x"),
    ("see Kokoro.dev or me@Kokoro.dev or /Kokoro", "see Kokoro.dev or me@Kokoro.dev or /Kokoro"),
    ("Kokoro.", "[Kokoro](/kˈOkəɹO/)."),
    ("[Kokoro](/kOkOrO/) [pause:1s] Kokoro", "[Kokoro](/kOkOrO/) [pause:1s] [Kokoro](/kˈOkəɹO/)"),
])
def test_entries_mark_whole_words_only(lexicon, text, marked):
    assert lexicon.mark(text, "a") == marked


def test_markdown_links_and_switches_around_it(lexicon):
    from worker.text import NormalizationOptions, normalize_text

    # read after the Markdown, so a link's text is a word again
    read = normalize_text("See the [Kokoro docs](https://x.org).", lexicon=lexicon)
    assert read == "See the [Kokoro](/kˈOkəɹO/) docs."
    # and with normalization off too: it is the deployment's word, not a rule
    raw = NormalizationOptions(normalize=False)
    assert normalize_text("Kokoro 3", raw, lexicon=lexicon) == "[Kokoro](/kˈOkəɹO/) 3"


def test_language_sections_win_in_their_language(lexicon):
    assert lexicon.mark("Kokoro", "z") == "[Kokoro](/kʰo→kʰo→lwo→/)"
    assert lexicon.mark("nginx", "z") == "[nginx](/ˈɛnʤɪnˌɛks/)"  # every language's entries still apply
    assert lexicon.mark("Kokoro", "e") == "[Kokoro](/kˈOkəɹO/)"


def test_the_text_frontend_speaks_the_entries_and_keeps_the_words(lexicon):
    chunks = text_to_chunks("Kokoro Fleet serves 3 replicas on an H100.", "a", lexicon=lexicon)
    phonemes = " ".join(c.phonemes for c in chunks)
    assert phonemes.startswith("kˈOkəɹO flˈit ") and "ˈAʧ wˈʌn hˈʌndɹəd." in phonemes
    assert "θɹˈi" in phonemes  # the rest is normalized as ever: "3" read "three"
    assert "ɐn ˈAʧ" in phonemes  # "an" before the entry's vowel, as before any word
    words = [w.text for c in chunks for w in c.words]
    assert words[0] == "Kokoro Fleet" and words[-1] == "H100"  # captions show the text as written
    assert text_to_chunks("Kokoro", "a")[0].phonemes != "kˈOkəɹO"  # without it: the G2P's own reading


@pytest.mark.parametrize("content, message", [
    ("not json", "not JSON"),
    ('["Kokoro"]', "expected a JSON object"),
    ('{"Kokoro": "kokoro$"}', "outside Kokoro's alphabet: \\$"),
    ('{"Kokoro": "ko(ko)ro"}', "outside Kokoro's alphabet: \\( \\)"),
    ('{"Kokoro": ""}', "needs its phonemes"),
    ('{"Kokoro": 3}', "needs its phonemes"),
    ('{"  ": "kO"}', "cannot be an entry"),
    ('{"a[b]": "kO"}', "cannot be an entry"),
    ('{"zh-tw": {"Kokoro": "kO"}}', "section 'zh-tw' is not a language code; use one of a, b, e"),
])
def test_a_malformed_file_is_refused_with_the_entry_named(tmp_path, content, message):
    path = tmp_path / "bad.json"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(LexiconError, match=message) as error:
        load_lexicon(str(path))
    assert str(path) in str(error.value)


def test_no_file_no_lexicon_and_a_missing_file_named(tmp_path):
    assert not load_lexicon("") and not load_lexicon(None)
    assert load_lexicon("").mark("Kokoro", "a") == "Kokoro"
    with pytest.raises(LexiconError, match="cannot read it"):
        load_lexicon(str(tmp_path / "missing.json"))


def test_serve_refuses_a_malformed_lexicon_before_starting(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text('{"Kokoro": "kokoro$"}', encoding="utf-8")
    run = subprocess.run([sys.executable, "-m", "cli.main", "serve", "--workers", "1"], capture_output=True, text=True,
                         timeout=60, env={**os.environ, "KOKORO_LEXICON": str(path)})
    assert run.returncode != 0
    assert "kokoro-fleet serve: KOKORO_LEXICON" in run.stderr and "$" in run.stderr


def test_the_phonemize_cli_reads_with_the_lexicon(lexicon, tmp_path, capsys):
    from cli.main import main

    assert main(["phonemize", "--lexicon", lexicon.source, "--json", "Kokoro"]) == 0
    words = json.loads(capsys.readouterr().out)["words"]
    assert words == [{"word": "Kokoro", "phonemes": "kˈOkəɹO", "source": "custom"}]


def test_the_server_reads_every_request_with_it(lexicon):
    from fastapi.testclient import TestClient

    from api.app import create_app
    from api.settings import Settings

    app = TestClient(create_app(Settings().replace(lexicon=lexicon.source)))
    body = app.post("/dev/phonemize", json={"text": "Run nginx on the H100."}).json()
    # "the" read as before a vowel, the entry's
    assert body["phonemes"] == "ɹˈʌn ˈɛnʤɪnˌɛks ˌɔn ði ˈAʧ wˈʌn hˈʌndɹəd."


# --- edits while serving ---------------------------------------------------------------------------

def _write(path, entries) -> None:
    path.write_text(entries if isinstance(entries, str) else json.dumps(entries, ensure_ascii=False), encoding="utf-8")


def test_an_edit_takes_effect_and_a_broken_one_keeps_the_entries_before(tmp_path, monkeypatch, caplog):
    from worker.text import lexicon as lexicon_module

    monkeypatch.setattr(lexicon_module, "RECHECK_S", 0.0)
    path = tmp_path / "lexicon.json"
    _write(path, {"Kokoro": "kˈOkəɹO"})
    assert load_lexicon(str(path)).mark("Kokoro on nginx", "a") == "[Kokoro](/kˈOkəɹO/) on nginx"
    _write(path, {"Kokoro": "kˈOkəɹO", "nginx": "ˈɛnʤɪnˌɛks"})
    assert load_lexicon(str(path)).mark("Kokoro on nginx", "a") == "[Kokoro](/kˈOkəɹO/) on [nginx](/ˈɛnʤɪnˌɛks/)"
    status = lexicon_module.lexicon_status(str(path))
    assert status["entries"] == 2 and status["error"] is None

    _write(path, '{"Kokoro": "kˈOkəɹO", "nginx": ')  # half written, or a typo
    with caplog.at_level("ERROR", logger="kokoro_fleet.text"):
        for _ in range(3):
            assert load_lexicon(str(path)).words("a") == {"Kokoro": "kˈOkəɹO", "nginx": "ˈɛnʤɪnˌɛks"}
    assert len([r for r in caplog.records if "not JSON" in r.message]) == 1, "logged once per version of the file"
    assert "not JSON" in lexicon_module.lexicon_status(str(path))["error"]
    path.unlink()  # removed: still the entries before
    assert len(load_lexicon(str(path)).words("a")) == 2
    assert "cannot read it" in lexicon_module.lexicon_status(str(path))["error"]

    _write(path, {"nginx": "ˈɛnʤɪnˌɛks"})  # mended
    assert load_lexicon(str(path)).words("a") == {"nginx": "ˈɛnʤɪnˌɛks"}
    assert lexicon_module.lexicon_status(str(path))["error"] is None


def test_the_file_is_looked_at_at_most_once_per_recheck_interval(tmp_path, monkeypatch):
    from worker.text import lexicon as lexicon_module

    monkeypatch.setattr(lexicon_module, "RECHECK_S", 3600.0)
    path = tmp_path / "lexicon.json"
    _write(path, {"Kokoro": "kˈOkəɹO"})
    first = load_lexicon(str(path))
    _write(path, {"nginx": "ˈɛnʤɪnˌɛks"})
    assert load_lexicon(str(path)) is first  # not looked at again yet
    monkeypatch.setattr(lexicon_module, "RECHECK_S", 0.0)
    assert load_lexicon(str(path)).words("a") == {"nginx": "ˈɛnʤɪnˌɛks"}


def test_the_server_speaks_an_edit_without_a_restart_and_health_shows_a_broken_one(tmp_path, monkeypatch):
    from fastapi.testclient import TestClient

    from api.app import create_app
    from api.settings import Settings
    from worker.text import lexicon as lexicon_module

    monkeypatch.setattr(lexicon_module, "RECHECK_S", 0.0)
    path = tmp_path / "lexicon.json"
    _write(path, {"nginx": "ˈɛnʤɪnˌɛks"})
    app = TestClient(create_app(Settings().replace(lexicon=str(path))))

    def phonemes() -> str:
        return app.post("/dev/phonemize", json={"text": "Kokoro"}).json()["phonemes"]

    before = phonemes()
    assert before != "kˈOkəɹO"
    _write(path, {"nginx": "ˈɛnʤɪnˌɛks", "Kokoro": "kˈOkəɹO"})
    assert phonemes() == "kˈOkəɹO"
    _write(path, {"Kokoro": "kokoro$"})
    assert phonemes() == "kˈOkəɹO"
    health = app.get("/health").json()["lexicon"]
    assert health["path"] == str(path) and health["entries"] == 2 and "$" in health["error"]
