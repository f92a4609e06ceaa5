"""Word timestamps from the model's predicted durations.

The model predicts, for each input id, how many frames it lasts; a frame is 600 samples at 24 kHz
(25 ms). Durations cover the ids with the boundary pads: index 0 is the leading pad, index
len(ids) + 1 the trailing one. A word spanning ids [start, end) therefore starts after the frames of
durations[0 .. start] (pad included) and ends after those of durations[0 .. end].
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from worker.audio import FRAME_SECONDS


@dataclass
class WordTimestamp:
    word: str
    start: float  # seconds
    end: float
    input_start: int  # [input_start, input_end): the characters of the request's input it was read from
    input_end: int


def word_timestamps(chunk, durations: np.ndarray, offset_s: float = 0.0) -> list[WordTimestamp]:
    """Start and end (seconds, plus `offset_s`) of every word of `chunk`, from `durations`
    (int frames per id, pads included: length len(chunk.ids) + 2)."""
    frames = np.asarray(durations, dtype=np.int64).reshape(-1)
    if frames.size == 0 or not chunk.words:
        return []
    # edges[j] = frames in durations[:j]; id i (durations index i + 1) spans edges[i + 1] .. edges[i + 2].
    edges = np.concatenate([[0], np.cumsum(frames)])
    last = len(edges) - 1
    out = []
    for word in chunk.words:
        first_edge = min(word.start + 1, last)
        end_edge = min(word.end + 1, last)
        start = offset_s + float(edges[first_edge]) * FRAME_SECONDS
        end = offset_s + float(edges[end_edge]) * FRAME_SECONDS
        out.append(WordTimestamp(word.text, round(start, 3), round(max(end, start), 3), word.input_start,
                                 word.input_end))
    return out
