"""Subtitles from word timestamps (api/subtitles.py): cues of the user's own text, read back by real
subtitle parsers (`srt`, `webvtt-py`). The words here are built by hand as the text frontend gives
them: each spoken word with the span of the input it was read from."""

from __future__ import annotations

import html
from dataclasses import dataclass

import pytest
import srt
import webvtt
from hypothesis import given, settings
from hypothesis import strategies as st

from api.subtitles import (LINE_COLUMNS, LINGER_SECONDS, MAX_CUE_SECONDS, MIN_CUE_SECONDS, CaptionFile, build_cues,
                           caption_format_of, columns, srt_text, visible_text, webvtt_text)

WORD_S, GAP_S = 0.3, 0.05


@dataclass
class Word:
    word: str
    start: float
    end: float
    input_start: int | None = None
    input_end: int | None = None


def spoken(text: str, readings: list[tuple[str, str]], pauses: dict[int, float] | None = None) -> list[Word]:
    """Words of `text` read as `readings`: (source, spoken words) in order, each source found after
    the last; a word lasts WORD_S, GAP_S apart, plus `pauses[i]` seconds of silence before word i."""
    words, cursor, t = [], 0, 0.0
    for source, reading in readings:
        at = text.index(source, cursor)
        cursor = at + len(source)
        for w in reading.split():
            t += (pauses or {}).get(len(words), 0.0)
            words.append(Word(w, round(t, 3), round(t + WORD_S, 3), at, cursor))
            t += WORD_S + GAP_S
    return words


def plain(text: str) -> list[tuple[str, str]]:
    """Every word of a plain text read as written (its punctuation outside the span)."""
    return [(w.strip('.,;:!?"“”()—'), w.strip('.,;:!?"“”()—')) for w in text.split() if w.strip('.,;:!?"“”()—')]


def parsed_srt(text: str) -> list[tuple[int, int, str]]:
    return [(int(c.start.total_seconds() * 1000), int(c.end.total_seconds() * 1000), c.content)
            for c in srt.parse(text)]


def parsed_vtt(text: str) -> list[tuple[int, int, str]]:
    return [(c.start_time.in_milliseconds(), c.end_time.in_milliseconds(), html.unescape(c.text))
            for c in webvtt.from_string(text)]


def check_cues(cues: list[tuple[int, int, str]], audio_s: float) -> None:
    """Cue times rise, each cue after the one before, the last within the audio; two lines at most."""
    assert cues
    for (s1, e1, _), (s2, _, _) in zip(cues, cues[1:]):
        assert s1 < e1 <= s2, cues
    assert 0 <= cues[0][0] and cues[-1][1] <= audio_s * 1000, cues
    assert all(len(text.split("\n")) <= 2 for *_, text in cues), cues


def both(words, text, audio_s) -> list[tuple[int, int, str]]:
    """The cues through both formats and both parsers, which must agree."""
    cues = build_cues(words, text, audio_s)
    from_srt, from_vtt = parsed_srt(srt_text(cues)), parsed_vtt(webvtt_text(cues))
    assert from_srt == from_vtt
    check_cues(from_srt, audio_s)
    return from_srt


def flat(cues) -> str:
    return " ".join(text.replace("\n", " ") for *_, text in cues)


def test_cues_show_the_input_not_the_reading():
    text = 'Your total is $12.99. "Hello," she said — and left. Dr. Smith agreed.'
    words = spoken(text, [("Your", "Your"), ("total", "total"), ("is", "is"),
                          ("$12.99", "twelve dollars and ninety-nine cents"), ("Hello", "Hello"), ("she", "she"),
                          ("said", "said"), ("and", "and"), ("left", "left"), ("Dr.", "doctor"), ("Smith", "Smith"),
                          ("agreed", "agreed")])
    audio_s = words[-1].end + 0.4
    cues = both(words, text, audio_s)
    assert flat(cues) == text
    # one sentence a cue: "$12.99" is on screen from "twelve" to "cents"
    assert [c[2] for c in cues] == ["Your total is $12.99.", '"Hello," she said — and left.', "Dr. Smith agreed."]
    assert cues[0][0] == 0 and cues[1][0] == round(words[8].start * 1000)  # from its first word
    assert cues[-1][1] == round((words[-1].end + LINGER_SECONDS) * 1000) - 100  # the audio's end came first


def test_markup_is_left_out_and_whitespace_collapsed():
    text = ('## Steps\n\n- **Mix** the [flour](https://x.org/flour) &amp; sugar\n- Bake<break time="500ms"/>   well\n\n'
            '<speak>Say <sub alias="World Wide Web">WWW</sub> [pause:1s] twice.</speak>')
    words = spoken(text, [("Steps", "Steps"), ("Mix", "Mix"), ("the", "the"), ("flour", "flour"), ("&amp;", "and"),
                          ("sugar", "sugar"), ("Bake", "Bake"), ("well", "well"), ("Say", "Say"),
                          ('<sub alias="World Wide Web">WWW</sub>', "World Wide Web"), ("twice", "twice")])
    cues = both(words, text, words[-1].end)
    assert flat(cues) == "Steps Mix the flour & sugar Bake well Say WWW twice."
    # a heading, each list item and the SSML paragraph end where a sentence would
    assert [c[2] for c in cues] == ["Steps", "Mix the flour & sugar", "Bake well", "Say WWW twice."]


def test_visible_text_of_a_span():
    assert visible_text("**Mix**") == "Mix" and visible_text("<b>bold</b>") == "bold"
    assert visible_text("[Kokoro](/kˈOkəɹO/)") == "Kokoro" and visible_text("a  \n b") == "a b"
    assert visible_text("5 * 3") == "5 * 3" and visible_text("snake_case_name") == "snake_case_name"
    assert visible_text("*") == "*"  # a symbol read aloud stays


def test_a_long_sentence_is_cut_at_its_clauses_into_two_line_cues():
    text = ("When the river rose over the old stone bridge, the villagers, who had seen floods before, carried "
            "their furniture upstairs, led the animals to the hill behind the church, and waited through the "
            "night for the water to fall.")
    words = spoken(text, plain(text))
    cues = both(words, text, words[-1].end + 0.3)
    assert flat(cues) == text
    lines = [line for *_, t in cues for line in t.split("\n")]
    assert all(columns(line) <= LINE_COLUMNS for line in lines), lines
    assert all(t.endswith((",", ".")) for *_, t in cues), cues  # each cue ends at a clause
    # speech on screen: at least the minimum, at most the maximum plus the moment after the last word
    assert all(MIN_CUE_SECONDS * 1000 <= e - s <= (MAX_CUE_SECONDS + LINGER_SECONDS) * 1000 for s, e, _ in cues)


def test_a_short_sentence_stays_long_enough_and_a_pause_is_not_captioned():
    text = "Yes. Then, after a long wait, the answer came."
    words = spoken(text, plain(text), pauses={1: 3.0})  # three seconds of silence after "Yes."
    cues = both(words, text, words[-1].end + 0.3)
    assert [c[2] for c in cues] == ["Yes.", "Then, after a long wait, the answer came."]
    (s1, e1, _), (s2, _, _) = cues
    assert e1 - s1 == MIN_CUE_SECONDS * 1000  # "Yes." alone lasts 0.3 s: shown for the minimum
    assert s2 - e1 > 2000  # gone during the pause
    # two short sentences close together share a cue instead of flashing by one after the other
    text = "Hi. Go on. The rest of it follows here."
    cues = both(spoken(text, plain(text)), text, 3.5)
    assert cues[0][2] == "Hi. Go on."


def test_a_pause_inside_a_sentence_ends_the_cue():
    text = "Wait for it and then the end."
    words = spoken(text, plain(text), pauses={3: 2.0})  # silence after "it"
    cues = both(words, text, words[-1].end)
    assert [c[2] for c in cues] == ["Wait for it", "and then the end."]
    assert cues[0][1] <= round((words[2].end + LINGER_SECONDS) * 1000)


def test_chinese_has_no_spaces_and_wide_characters_count_double():
    text = "春天来了，公园里的花都开了。孩子们在草地上跑来跑去，一直玩到太阳下山才回家吃饭休息。"
    readings = [(c, c) for c in text if c not in "，。"]
    cues = both(spoken(text, readings), text, len(readings) * (WORD_S + GAP_S))
    assert "".join(c[2].replace("\n", "") for c in cues) == text
    assert all(columns(line) <= LINE_COLUMNS for *_, t in cues for line in t.split("\n"))
    assert cues[0][2] == "春天来了，公园里的花都开了。"


def test_words_without_a_span_are_shown_as_spoken():
    words = [Word("kəkˈɔɹO", 0.0, 0.5), Word("ɹˈidz", 0.6, 1.0)]
    assert both(words, "kəkˈɔɹO ɹˈidz", 1.2)[0][2] == "kəkˈɔɹO ɹˈidz"
    assert build_cues([], "nothing spoken", 1.0) == [] and srt_text([]) == ""
    assert parsed_vtt(webvtt_text([])) == []


def test_the_last_cue_ends_within_the_audio_even_when_the_words_run_past_it():
    text = "One two."
    words = spoken(text, plain(text))
    cues = both(words, text, words[-1].end - 0.1)  # the timestamps' rounding past the last sample
    assert cues[-1][1] <= round((words[-1].end - 0.1) * 1000)


def test_webvtt_escapes_what_it_must():
    text = "If a < b & c > d, say so."
    words = spoken(text, [("If", "If"), ("a", "a"), ("<", "less than"), ("b", "b"), ("&", "and"), ("c", "c"), (">", "greater than"),
                          ("d", "d"), ("say", "say"), ("so", "so")])
    cue = build_cues(words, text, 10.0)
    assert "a &lt; b &amp; c &gt; d" in webvtt_text(cue) and parsed_vtt(webvtt_text(cue))[0][2] == text
    assert parsed_srt(srt_text(cue))[0][2] == text


def test_caption_format_of_a_file_name():
    assert caption_format_of("talk.SRT") == "srt" and caption_format_of("a/b.vtt") == "vtt"
    with pytest.raises(ValueError, match=r"\.srt or \.vtt"):
        caption_format_of("talk.txt")
    with pytest.raises(ValueError):
        CaptionFile("json", "x")


# --- streamed: the parts joined are the file -----------------------------------------------------

TEXT_WORDS = st.lists(st.sampled_from(["alpha", "bo", "the", "$12.99", "well-known", "Dr.", "“quoted”", "x",
                                       "longerwordhere", "**bold**", "<b>tag</b>", "(aside)"]), min_size=1, max_size=80)
PUNCTUATION = st.sampled_from(["", "", "", ",", ".", "!", ";", " —", "\n\n"])


@settings(max_examples=150, deadline=None)
@given(tokens=TEXT_WORDS, marks=st.lists(PUNCTUATION, min_size=80, max_size=80),
       durations=st.lists(st.floats(0.0, 2.5), min_size=80, max_size=80),
       cuts=st.sets(st.integers(1, 79)), fmt=st.sampled_from(["srt", "vtt"]))
def test_streamed_parts_join_to_the_whole_file_and_keep_the_rules(tokens, marks, durations, cuts, fmt):
    text, readings = "", []
    for token, mark in zip(tokens, marks):
        text += ("" if not text or text.endswith("\n") else " ") + token
        readings.append((token, "one two" if token == "$12.99" else "word"))
        text += mark
    words, t = [], 0.0
    cursor = 0
    for (source, reading), seconds in zip(readings, durations):
        at = text.index(source, cursor)
        cursor = at + len(source)
        for w in reading.split():
            words.append(Word(w, round(t, 3), round(t + seconds, 3), at, cursor))
            t += seconds + 0.05
    audio_s = t + 0.2
    whole = (srt_text if fmt == "srt" else webvtt_text)(build_cues(words, text, audio_s))
    caption = CaptionFile(fmt, text)
    edges = [0, *sorted(c for c in cuts if c < len(words)), len(words)]
    pieces = [words[a:b] for a, b in zip(edges, edges[1:])]
    parts = [caption.add(p, audio_s if i == len(pieces) - 1 else 0.0) for i, p in enumerate(pieces)]
    assert "".join(parts) + caption.finish() == whole
    cues = parsed_srt(whole) if fmt == "srt" else parsed_vtt(whole)
    check_cues(cues, audio_s)
    for *_, cue in cues:  # a line over the limit holds one word too long to break
        for line in cue.split("\n"):
            assert columns(line) <= LINE_COLUMNS or " " not in line, cue


def test_headings_and_list_items_are_cues_of_their_own():
    text = "# Shopping\nBuy these:\n1. Apples\n2. Pears and plums\n\n| Item | Price |\n|---|---|\n| Tea | $3 |"
    words = spoken(text, [("Shopping", "Shopping"), ("Buy", "Buy"), ("these", "these"), ("1", "one"),
                          ("Apples", "Apples"), ("2", "two"), ("Pears", "Pears"), ("and", "and"), ("plums", "plums"),
                          ("Item", "Item"), ("Price", "Price"), ("Tea", "Tea"), ("$3", "three dollars")])
    cues = both(words, text, words[-1].end)
    assert [c[2] for c in cues] == ["Shopping", "Buy these:", "1. Apples", "2. Pears and plums", "Item Price",
                                    "Tea $3"]


def test_what_is_written_as_one_stays_one():
    """A URL read in parts ("https://" unread, "example", "dot", "com", "slash", "help") is shown as
    written, whole on one line, never cut inside."""
    text = "For the full set of instructions and answers visit https://example.com/help today."
    words = spoken(text, [*plain(text.split("https")[0]), ("example", "example"), (".", "dot"), ("com", "com"),
                          ("/", "slash"), ("help", "help"), ("today", "today")])
    cues = both(words, text, words[-1].end + 0.5)
    assert flat(cues) == text
    assert any("https://example.com/help" in line for *_, t in cues for line in t.split("\n")), cues
