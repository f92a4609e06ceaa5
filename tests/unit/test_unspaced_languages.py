"""Mandarin (`z`) and Japanese (`j`): the text frontend against misaki, the G2P Kokoro v1.0 was
trained on, and what we add to it (words for chunking and timestamps, English inside, no text lost)."""

from __future__ import annotations

import logging
import re
import threading
from pathlib import Path

import pytest

from worker.text import text_to_chunks
from worker.text.english import english_g2p
from worker.text.vocab import to_ids

LANGUAGES = Path(__file__).resolve().parents[1] / "data" / "languages"
SAMPLES = {"z": LANGUAGES / "mandarin.txt", "j": LANGUAGES / "japanese.txt"}
WHOLE = {"first_chunk_phonemes": 510, "chunk_phonemes": 510}  # one chunk per line, to compare with misaki's string


def misaki_phonemes(line: str, lang: str) -> str:
    """What Kokoro's own pipeline (`KPipeline(lang_code=...)` on Kokoro-82M) phonemizes a line to."""
    if lang == "z":
        from misaki.zh import ZHG2P

        return ZHG2P()(line)[0]
    from misaki.cutlet import Cutlet  # misaki.ja.JAG2P() is this (its default version)

    return Cutlet()(line)[0]


def misaki_after_our_normalization(line: str, lang: str) -> str:
    """misaki's reading of the line as our normalization gives it to the reader. A deliberate
    difference in Japanese: numbers are written as misaki reads them best (kanji from 100 up and
    before the counters of dates and people, worker/text/localized.py), so `一人3000円` is 'çitoɾʲi
    saɴʣeɴ eɴ', where misaki reads the digits' line 'kazɨto' (a name)."""
    from worker.text.normalize import normalize_text

    return misaki_phonemes(normalize_text(line, lang_code=lang) if lang == "j" else line, lang)


def ours(line: str, lang: str) -> str:
    return " ".join(c.phonemes for c in text_to_chunks(line, lang, **WHOLE))


def sample_lines(lang: str) -> list[str]:
    return SAMPLES[lang].read_text(encoding="utf-8").splitlines()


CASES = [(lang, line) for lang in SAMPLES for line in sample_lines(lang)]


@pytest.mark.parametrize("lang, line", CASES, ids=[f"{lang}{i}" for i, (lang, _) in enumerate(CASES)])
def test_each_sample_line_reads_as_misaki_reads_it(lang, line):
    expected, got = misaki_after_our_normalization(line, lang), ours(line, lang)
    if re.search(r"[A-Za-z]", line):
        # Deliberate difference: misaki passes Latin words through as letters; we read them as English.
        # The rest must agree: compare with each Latin word cut out of both sides, and the spaces
        # around it (misaki glues "ꭧʰɨ↗OpenAItɤ"; we read "ꭧʰɨ↗ ˌOpᵊnˈAˌI tɤ").
        for word in re.findall(r"[A-Za-z]+", line):
            expected = expected.replace(word, "", 1)
            got = got.replace(english_g2p(False).word(word).phonemes, "", 1)
        expected, got = expected.replace(" ", ""), got.replace(" ", "")
    if "”" in line:
        # Deliberate difference: a closing quote hugs the word before it ("ma?” tʰa→"); misaki's
        # Mandarin writes "ma? ”tʰa→". Same symbols, same order.
        expected, got = expected.replace(" ", ""), got.replace(" ", "")
    assert got == expected


@pytest.mark.parametrize("lang", SAMPLES)
def test_no_text_is_lost_and_no_space_is_added(lang):
    # lines without numbers, which come back as read (2024年 -> 二零二四年, 25分 -> にじゅうご分)
    text = "".join(line for line in sample_lines(lang) if not re.search(r"\d", line))
    chunks = text_to_chunks(text, lang)
    assert "".join(c.text for c in chunks) == text
    spoken = "".join(w.text for c in chunks for w in c.words)
    assert [c for c in spoken if c.isalpha()] == [c for c in text if c.isalpha()]  # every letter in a word


@pytest.mark.parametrize("lang", SAMPLES)
def test_long_text_is_cut_between_sentences_into_chunks_that_fit(lang, caplog):
    text = SAMPLES[lang].read_text(encoding="utf-8").replace("\n", "") * 3
    with caplog.at_level(logging.WARNING):
        chunks = text_to_chunks(text, lang)
    assert not any("not in Kokoro's vocabulary" in r.message for r in caplog.records)
    assert len(chunks) >= 4
    assert len(chunks[0].ids) <= 60
    assert all(len(c.ids) <= 510 for c in chunks)
    for chunk in chunks[1:-1]:  # later chunks pack whole sentences
        assert chunk.phonemes.rstrip("”")[-1] in ".!?", chunk.phonemes[-20:]


def test_chinese_words_are_spaced_for_the_model_and_timestamped():
    chunk = text_to_chunks("你好，世界。", "z")[0]
    assert chunk.text == "你好，世界。"
    assert chunk.phonemes == "ni↓xau↓, ʂɨ↘ʨje↘."
    assert {w.text: chunk.phonemes[w.start:w.end] for w in chunk.words} == {"你好": "ni↓xau↓", "世界": "ʂɨ↘ʨje↘"}


def test_latin_words_inside_chinese_and_japanese_are_read_as_english():
    kokoro = english_g2p(False).word("Kokoro").phonemes
    for text, lang in (("我们用Kokoro说话。", "z"), ("Kokoroで話します。", "j")):
        chunk = text_to_chunks(text, lang)[0]
        spans = {w.text: chunk.phonemes[w.start:w.end] for w in chunk.words}
        assert spans["Kokoro"] == kokoro, (text, spans)
        assert len(chunk.words) >= 3


def test_mandarin_numbers_and_markup():
    chunks = text_to_chunks("大约10%。[pause:0.5s]第2个。", "z")
    assert [c.text for c in chunks] == ["大约百分之十。", "第二个。"]
    assert chunks[0].pause_after == 0.5
    assert chunks[0].phonemes == "ta↘ɥe→ " + misaki_phonemes("百分之十。", "z")


def test_japanese_reading_depends_on_what_follows():
    # MeCab reads 円 as "en" with the clause around it, as misaki (which reads whole lines) does.
    chunk = text_to_chunks("料金は一人3000円で、去年より高い。", "j", **WHOLE)[0]
    assert chunk.phonemes == misaki_after_our_normalization("料金は一人3000円で、去年より高い。", "j")
    assert "çitoɾʲi saɴʣeɴ eɴ de" in chunk.phonemes  # 一人, per person: misaki read the digits' line 'kazɨto'


def test_japanese_wave_dash_before_a_number_reads_kara():
    text = "参加者は10〜20人です。"
    assert ours(text, "j") == misaki_after_our_normalization(text, "j")
    assert "ʥɨː kaɾa ɲiʥɨː ɲiɴ" in ours(text, "j")


def test_geminate_stops_stay_inside_one_word():
    chunk = text_to_chunks("ちょっと待って。", "j")[0]
    assert chunk.phonemes == "ʨoʔto maʔte."
    assert [w.text for w in chunk.words] == ["ちょっと", "待って"]


def test_symbols_alone_are_silent_and_every_phoneme_is_in_the_vocabulary(caplog):
    with caplog.at_level(logging.WARNING):
        for lang in SAMPLES:
            chunks = text_to_chunks("★ 🎉 ・", lang)
            assert not any(c.ids for c in chunks)
            for line in sample_lines(lang):
                for c in text_to_chunks(line, lang):
                    assert len(to_ids(c.phonemes)) == len(c.phonemes)
    assert not caplog.records


def test_many_threads_read_as_one_does():
    """The text frontend runs in several threads at once; MeCab's tagger and jieba's are shared."""
    lines = [(lang, line) for lang, line in CASES] * 4
    expected = {(lang, line): ours(line, lang) for lang, line in CASES}
    errors: list[str] = []

    def work(part):
        for lang, line in part:
            got = ours(line, lang)
            if got != expected[(lang, line)]:
                errors.append(f"{lang}: {got!r}")

    threads = [threading.Thread(target=work, args=(lines[i::8],)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors


@pytest.mark.parametrize("alias, code", [("zh", "z"), ("zh-cn", "z"), ("ja", "j"), ("Z", "z")])
def test_language_aliases(alias, code):
    assert ours("你好。" if code == "z" else "こんにちは。", alias) == ours("你好。" if code == "z" else "こんにちは。", code)
