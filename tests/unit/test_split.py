"""Splitting: no chunk over 510 phonemes, nothing lost, first chunk short, pauses honoured."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from worker.text import MAX_PHONEMES, NormalizationOptions, text_to_chunks
from worker.text.markup import KOKORO_MARKUP
from worker.text.normalize import clean_text, normalize_text
from worker.text.vocab import to_ids

TEXTS = Path(__file__).resolve().parents[1] / "data" / "texts"
RAW = NormalizationOptions(normalize=False)


def _squeeze(text: str) -> str:
    return re.sub(r"\s+", "", text)


def _check_invariants(text: str, chunks, options=None, lang="a") -> None:
    for c in chunks:
        assert len(c.ids) <= MAX_PHONEMES
        assert c.ids == to_ids(c.phonemes)                  # phonemes and ids agree symbol for symbol
        for w in c.words:
            assert 0 <= w.start < w.end <= len(c.ids)
    # Nothing lost: every non-space character of the (normalized) input is in the chunks, in order.
    expected = _squeeze(KOKORO_MARKUP.sub(" ", normalize_text(text, options, lang)))
    assert _squeeze("".join(c.text for c in chunks)) == expected


# Text that mixes words, punctuation, digits, emoji, control characters and other scripts.
_alphabet = st.one_of(
    st.sampled_from(list("abcdefghij klmnop qrstuvwxyz ABCXYZ .,;:!?—-'\"()\n\t")),
    st.characters(),  # arbitrary Unicode, control characters and surrogates-free planes included
    st.sampled_from(["😀", "👩‍👩‍👧", "🇫🇷", "\u200b", "\x00", "\x07", "\u0301", "中文", "Привет", "ß"]),
)
_piece = st.lists(_alphabet, max_size=30).map("".join)
_words = st.lists(_piece, max_size=60).map(" ".join)
_long_word = st.integers(min_value=100, max_value=3000).map(lambda n: "x" * n)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_words)
def test_property_raw_text(text):
    _check_invariants(text, text_to_chunks(text, "a", RAW), RAW)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_words)
def test_property_normalized_text(text):
    _check_invariants(text, text_to_chunks(text, "a"))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.one_of(_long_word, st.sampled_from(["word", "and", "again."])), min_size=1, max_size=6).map(" ".join))
def test_property_very_long_words(text):
    _check_invariants(text, text_to_chunks(text, "a", RAW), RAW)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_words)
def test_property_espeak_language(text):
    _check_invariants(text, text_to_chunks(text, "e"), lang="e")


@pytest.mark.slow
def test_twenty_thousand_characters_without_punctuation():
    words = "alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike".split()
    text = " ".join(words[i % len(words)] for i in range(3000))[:20_000]
    chunks = text_to_chunks(text)
    _check_invariants(text, chunks)
    assert len(chunks) > 20
    assert all(len(c.ids) > 50 for c in chunks[:-1])  # cuts at word boundaries, not into dust
    assert [w.text for c in chunks for w in c.words] == text.split()


def test_twenty_thousand_characters_one_word():
    text = "abcdefghij" * 2000
    chunks = text_to_chunks(text, "a", RAW)
    _check_invariants(text, chunks, RAW)
    assert len(chunks) > 1


def test_first_chunk_short_later_chunks_long():
    text = (TEXTS / "paragraphs.txt").read_text()
    chunks = text_to_chunks(text, first_chunk_phonemes=100, chunk_phonemes=400)
    assert len(chunks[0].ids) <= 100
    assert all(len(c.ids) <= MAX_PHONEMES for c in chunks)
    middle = [len(c.ids) for c in chunks[1:-1]]
    assert sum(middle) / len(middle) > 200  # later chunks pack whole sentences


def test_later_chunks_double_in_size_until_the_largest_target():
    # Many short sentences: each chunk packs sentences up to its target, so the sizes follow the
    # targets 60, 120, 240, 400, 400, ... (a chunk can end a sentence short of its target).
    names = ["apple", "river", "garden", "window", "silver", "morning", "candle", "harbor"]
    text = " ".join(f"The {names[n % 8]} sentence is short and plain." for n in range(80))
    chunks = text_to_chunks(text, first_chunk_phonemes=60, chunk_phonemes=400)
    sizes = [len(c.ids) for c in chunks]
    targets = [60, 120, 240] + [400] * (len(sizes) - 3)
    assert all(size <= target for size, target in zip(sizes[:-1], targets)), sizes
    assert all(size > target * 0.6 for size, target in zip(sizes[:-1], targets)), sizes
    assert sizes[1] > sizes[0] and sizes[2] > sizes[1] and sizes[3] > sizes[2]
    assert " ".join(c.text for c in chunks).split() == text.split()


def test_sentence_boundaries_preferred():
    text = "One two three four five. Six seven eight nine ten. Eleven twelve thirteen."
    chunks = text_to_chunks(text, first_chunk_phonemes=30, chunk_phonemes=30)
    assert [c.text for c in chunks] == ["One two three four five.", "Six seven eight nine ten.",
                                        "Eleven twelve thirteen."]


def test_clause_boundary_when_sentence_too_long():
    clause = "the quick brown fox jumps over the lazy dog"
    text = f"{clause}, {clause}; {clause}, {clause}."
    chunks = text_to_chunks(text, first_chunk_phonemes=80, chunk_phonemes=80)
    assert all(c.text.endswith((",", ";", ".")) for c in chunks)
    assert len(chunks) >= 2


def test_first_chunk_is_a_clause_of_a_long_first_sentence():
    text = ("When the storm finally passed over the valley, the villagers came out of their houses, "
            "looked at the broken fences and the flooded fields, and began, slowly, to repair what they could.")
    chunks = text_to_chunks(text, first_chunk_phonemes=100, chunk_phonemes=400)
    assert chunks[0].text.endswith(",") and len(chunks[0].ids) <= 100   # a clause, not the sentence
    assert len(chunks) == 2 and chunks[1].text.endswith("could.")      # the rest fits one later chunk


def test_pause_tags_become_pause_after():
    chunks = text_to_chunks("Hello there. [pause:0.5s] General Kenobi. [pause:250ms]")
    assert [c.text for c in chunks] == ["Hello there.", "General Kenobi."]
    assert [c.pause_after for c in chunks] == [0.5, 0.25]


def test_leading_pause_is_a_chunk_without_ids():
    chunks = text_to_chunks("[pause:1s] Hi.")
    assert chunks[0].ids == [] and chunks[0].pause_after == 1.0
    assert chunks[1].text == "Hi."


def test_nothing_to_say_gives_chunks_without_ids():
    chunks = text_to_chunks("😀 🇫🇷")
    assert chunks and not any(c.ids for c in chunks)
    assert _squeeze("".join(c.text for c in chunks)) == "😀🇫🇷"


def test_unknown_symbols_in_custom_phonemes_are_dropped_with_a_warning(caplog):
    chunks = text_to_chunks("Say [it](/ɪtΩ/) now")
    assert chunks[0].phonemes == "sˈA ɪt nˈW"
    assert any("not in Kokoro's vocabulary" in r.message for r in caplog.records)


def test_a_dropped_symbol_is_warned_about_once(caplog):
    caplog.set_level(logging.WARNING, logger="worker.text.vocab")
    text_to_chunks(" ".join(["Say [it](/ɪtЖ/) now"] * 50))
    warned = [r for r in caplog.records if "not in Kokoro's vocabulary" in r.message and r.levelno == logging.WARNING]
    assert len(warned) <= 1  # 50 in one request logged 50 lines
    caplog.clear()
    text_to_chunks("Say [it](/ɪtЖ/) now")
    assert not [r for r in caplog.records if r.levelno == logging.WARNING]


def test_word_spans_point_at_the_words_phonemes():
    chunk = text_to_chunks("Hello, big world!")[0]
    spans = {w.text: chunk.phonemes[w.start:w.end] for w in chunk.words}
    assert spans == {"Hello": "həlˈO", "big": "bˈɪɡ", "world": "wˈɜɹld"}


def test_unknown_language_is_a_text_error_naming_the_supported_ones():
    from worker.text import TextError

    with pytest.raises(TextError, match="unknown lang_code") as raised:
        text_to_chunks("hi", "q")
    assert raised.value.param == "lang_code"
    assert "j (ja)" in str(raised.value) and "z (zh)" in str(raised.value)


def test_clean_text_removes_controls_keeps_words():
    assert clean_text("a\x00b\u200bc\td\r\ne") == "a bc d\ne"
    assert clean_text("one\x07two") == "one two"
    assert clean_text("zero\u200bwidth") == "zerowidth"


def test_first_chunk_without_an_early_clause_ends_at_a_word_near_its_target():
    # No punctuation until far past the first chunk's target: waiting for the comma would make the
    # first chunk hold most of the paragraph and the first audio late.
    text = ("Version two point four point one fixes a crash when importing large files from older "
            "releases of the desktop application, and adds a dark theme.")
    chunks = text_to_chunks(text, first_chunk_phonemes=60, chunk_phonemes=400)
    assert len(chunks) >= 2
    assert 15 <= len(chunks[0].ids) <= 60
    assert " ".join(c.text for c in chunks).split() == text.split()


@pytest.mark.parametrize("text, lang, first", [
    # said in words, a number is one unit: the first chunk ends before it, not at "one | billion"
    ("The total was $1,234,567,890.55 in the end.", "a", "The total was"),
    ("In 2024 we shipped 1,234,567 units across 45 countries and 12 regions, growing fast.", "a",
     "In twenty twenty-four we shipped"),
    # nor inside Japanese kanji numerals at misaki's word break (十二億三千 | 四百五十六万...)
    ("1,234,567,890円です。", "j", "十二億三千四百五十六万七千八百九十円です。"),
])
def test_the_first_chunk_does_not_end_inside_a_number(text, lang, first):
    chunks = text_to_chunks(text, lang, first_chunk_phonemes=60, chunk_phonemes=400)
    assert chunks[0].text == first


def test_a_number_too_long_for_one_chunk_is_still_cut():
    text = " ".join(["one hundred twenty-three"] * 60)  # over 510 phonemes with no other boundary
    chunks = text_to_chunks(text, first_chunk_phonemes=60, chunk_phonemes=400)
    assert len(chunks) >= 2 and all(len(c.ids) <= MAX_PHONEMES for c in chunks)
    assert " ".join(c.text for c in chunks).split() == text.split()


def test_phonemes_of_a_long_text_split_again_into_the_texts_own_chunks():
    """Phonemes spoken as given (/dev/generate_from_phonemes) chunk by the same rules as text: the
    phonemes of a long text give back its chunks, id for id, each within the model's limit."""
    from worker.text import phonemes_to_chunks

    text = (TEXTS / "paragraphs.txt").read_text(encoding="utf-8")[:3000]
    chunks = text_to_chunks(text)
    again = phonemes_to_chunks(" ".join(c.phonemes for c in chunks))
    assert len(chunks) > 3 and [c.ids for c in again] == [c.ids for c in chunks]
    assert all(len(c.ids) <= MAX_PHONEMES for c in again)
    words = [w.text for c in again for w in c.words]  # the phoneme words, punctuation left as boundaries
    assert len(words) > 100 and not any(set(w) & set(".,;:!?“”()") for w in words)


def test_phonemes_outside_the_vocabulary_are_refused_by_name():
    from worker.text import TextError, phonemes_to_chunks

    with pytest.raises(TextError) as caught:
        phonemes_to_chunks("həlˈO wˈɜɹld 3 ☃")
    assert caught.value.param == "phonemes" and "'3'" in str(caught.value) and "U+2603" in str(caught.value)
