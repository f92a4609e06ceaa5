"""Word timestamps from durations (frames of 25 ms, pads at both ends)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np

from worker.text import Chunk, WordSpan, text_to_chunks
from worker.timestamps import FRAME_SECONDS, word_timestamps


def _chunk(words: list[tuple[str, int, int]], n_ids: int) -> Chunk:
    """Words over ids [start, end), each read from the input at [10 * k, 10 * k + len(word)) (its k-th)."""
    return Chunk("x", "x" * n_ids, list(range(1, n_ids + 1)),
                 [WordSpan(*w, 10 * k, 10 * k + len(w[0])) for k, w in enumerate(words)])


def test_frame_is_25_ms():
    assert FRAME_SECONDS == 0.025


def test_words_from_durations_with_pads():
    # ids: "ab cd" -> a b ␠ c d ; durations: pad, a, b, space, c, d, pad
    chunk = _chunk([("ab", 0, 2), ("cd", 3, 5)], 5)
    durations = np.array([4, 2, 3, 1, 5, 6, 8])
    stamps = word_timestamps(chunk, durations)
    # "ab" starts after the leading pad (4 frames = 0.1 s) and lasts 2 + 3 frames.
    assert [(w.word, w.start, w.end) for w in stamps] == [("ab", 0.1, 0.225), ("cd", 0.25, 0.525)]


def test_each_timestamp_carries_its_words_input_span():
    chunk = _chunk([("ab", 0, 2), ("cde", 3, 6)], 6)
    stamps = word_timestamps(chunk, np.array([1, 1, 1, 1, 1, 1, 1, 1]), offset_s=3.0)
    assert [(w.input_start, w.input_end) for w in stamps] == [(0, 2), (10, 13)]


def test_offset_shifts_everything():
    chunk = _chunk([("ab", 0, 2)], 2)
    stamps = word_timestamps(chunk, np.array([2, 1, 1, 2]), offset_s=10.0)
    assert (stamps[0].start, stamps[0].end) == (10.05, 10.1)


def test_zero_duration_word_has_equal_start_and_end():
    chunk = _chunk([("a", 0, 1), ("b", 2, 3)], 3)
    stamps = word_timestamps(chunk, np.array([1, 0, 1, 3, 1]))
    assert stamps[0].start == stamps[0].end == 0.025


def test_short_durations_never_index_out_of_range():
    chunk = _chunk([("ab", 0, 2), ("cd", 3, 5)], 5)
    stamps = word_timestamps(chunk, np.array([1, 1, 1]))  # a truncated array must not crash
    assert all(w.end >= w.start for w in stamps)


def test_real_chunk_words_are_ordered_and_within_audio():
    chunk = text_to_chunks("The quick brown fox jumps over the lazy dog.")[0]
    rng = np.random.default_rng(0)
    durations = rng.integers(1, 8, size=len(chunk.ids) + 2)
    stamps = word_timestamps(chunk, durations)
    assert [w.word for w in stamps] == "The quick brown fox jumps over the lazy dog".split()
    starts = [w.start for w in stamps]
    assert starts == sorted(starts)
    assert all(a.end <= b.start for a, b in zip(stamps, stamps[1:]))  # a space lies between words
    assert stamps[-1].end <= durations.sum() * FRAME_SECONDS


RECORDED = Path(__file__).resolve().parents[1] / "data" / "frontend_words_recorded.json"


def test_word_times_of_plain_texts_are_those_before_spans_existed():
    """Spans must not move a word: for the sample texts (English prose, Mandarin and Japanese lines),
    the chunks' ids (so the audio) and each word's ids are those the text frontend gave before
    spans existed (recorded from commit 78a4884 into tests/data/frontend_words_recorded.json: per
    chunk a hash of its ids and its words as [text, start, end]), and the same durations time
    every word as the recorded words time it."""
    rng = np.random.default_rng(7)
    for entry in json.loads(RECORDED.read_text(encoding="utf-8")):
        text = (RECORDED.parent / entry["text"]).read_text(encoding="utf-8")
        chunks = text_to_chunks(text, entry["lang"])
        assert [hashlib.sha256(json.dumps(c.ids).encode()).hexdigest()[:16] for c in chunks] == \
            [c["ids"] for c in entry["chunks"]], entry["text"]
        for chunk, before in zip(chunks, entry["chunks"]):
            durations = rng.integers(0, 12, size=len(chunk.ids) + 2)
            recorded = Chunk(chunk.text, chunk.phonemes, chunk.ids, [WordSpan(*w, 0, 0) for w in before["words"]])
            assert [(w.word, w.start, w.end) for w in word_timestamps(chunk, durations, 1.5)] == \
                [(w.word, w.start, w.end) for w in word_timestamps(recorded, durations, 1.5)]
