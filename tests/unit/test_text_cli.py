"""`kokoro-fleet normalize` and `kokoro-fleet phonemize`, through the real CLI dispatcher."""

from __future__ import annotations

import importlib.resources
import json

from cli.main import main


def _lexicon_entry(word: str) -> str:
    with importlib.resources.files("misaki.data").joinpath("us_gold.json").open(encoding="utf-8") as f:
        return json.load(f)[word]


def test_normalize_prints_the_normalized_text(capsys):
    assert main(["normalize", "Dr.", "Smith", "paid", "$3.50", "at", "9:05", "p.m."]) == 0
    assert capsys.readouterr().out.strip() == "Doctor Smith paid three dollars and fifty cents at nine oh five PM."


def test_normalize_reads_stdin(capsys, monkeypatch):
    import io

    monkeypatch.setattr("sys.stdin", io.StringIO("3 cats\n"))
    assert main(["normalize"]) == 0
    assert capsys.readouterr().out.strip() == "three cats"


def test_phonemize_lexicon_word_says_lexicon(capsys):
    assert main(["phonemize", "hello"]) == 0
    out = capsys.readouterr().out
    line = next(l for l in out.splitlines() if l.strip().startswith("hello"))
    assert _lexicon_entry("hello") in line and "misaki lexicon" in line


def test_phonemize_invented_word_says_espeak(capsys):
    assert main(["phonemize", "blorfington"]) == 0
    out = capsys.readouterr().out
    line = next(l for l in out.splitlines() if l.strip().startswith("blorfington"))
    assert "espeak-ng" in line


def test_phonemize_prints_chunks(capsys):
    assert main(["phonemize", "--first-chunk", "20", "--ids", "One two three. Four five six."]) == 0
    out = capsys.readouterr().out
    assert "chunk 0:" in out and "chunk 1:" in out and "ids:" in out


def test_phonemize_json(capsys):
    assert main(["phonemize", "--json", "Say [Kokoro](/kˈOkəɹO/) twice."]) == 0
    data = json.loads(capsys.readouterr().out)
    sources = {w["word"]: w["source"] for w in data["words"]}
    assert sources["Kokoro"] == "custom" and sources["twice"] == "lexicon"
    assert data["chunks"][0]["phonemes"].startswith("sˈA kˈOkəɹO")


def test_phonemize_other_language(capsys):
    assert main(["phonemize", "--lang", "e", "hola"]) == 0
    assert "espeak-ng" in capsys.readouterr().out


def test_phonemize_mandarin_and_japanese_names_the_reader(capsys):
    assert main(["phonemize", "--lang", "z", "你好，世界。"]) == 0
    out = capsys.readouterr().out
    assert "ni↓xau↓" in out and "pypinyin" in out
    assert main(["phonemize", "--lang", "j", "こんにちは。"]) == 0
    assert "MeCab" in capsys.readouterr().out


def test_unknown_language_exits_2_with_the_reason(capsys):
    assert main(["phonemize", "--lang", "q", "hello"]) == 2
    assert "unknown lang_code" in capsys.readouterr().err


def test_frontend_timing_figure(capsys):
    from loadtest.bench.text_bench import main as bench_main, time_frontend

    result = time_frontend(repeats=1)
    assert result["files"] == 3 and result["phonemes"] > 1000
    assert bench_main([]) == 0
    assert "normalize + G2P + split" in capsys.readouterr().out


def test_first_request_figure_runs_both_ways_in_fresh_processes():
    from loadtest.bench.text_bench import compare_first_requests

    results = compare_first_requests("j", repeats=1)
    assert [r["preloaded"] for r in results] == [False, True]
    assert all(r["lang"] == "j" and r["chars"] > 10 and r["admit_ms"] > 0 and r["longest_stall_ms"] > 0
               for r in results)
