"""Subtitles (SRT, WebVTT) of the user's own text, timed by the spoken words.

Every spoken word carries the span of the input it was read from (`input_start`, `input_end`:
code-point offsets), so a cue shows what the user wrote, not the reading: the five words "twelve
dollars and ninety-nine cents" are the one "$12.99" on screen. Markup is for the eye of another
reader: tags, Markdown's emphasis, link targets, list markers and Kokoro's own tags are left out,
entities decoded, whitespace collapsed. What the words do not cover but touches them is shown with
them (the full stop after "dog", the quote before "Hello", the "https://" unread before
"example.com"), and punctuation standing alone between them (" — ") too; other text nobody reads
(a code block) is not.

Cues are grouped the way subtitles are read: at most two lines of about 42 columns (a wide CJK
character counts two), one sentence per cue where it fits, a longer one cut at its clauses; on
screen from its first word for at least MIN_CUE_SECONDS where the audio allows, never more than
about MAX_CUE_SECONDS of speech, and gone LINGER_SECONDS after its last word, so a long pause is
not captioned. Cue times rise, the last ends within the audio.

    cues = build_cues(words, text, audio_seconds)     # pure: words + input + duration -> cues
    srt_text(cues), webvtt_text(cues)                 # -> the file

Streamed, `CaptionFile(fmt, text)` takes the audio piece by piece (`add(words, seconds)`) and
returns each time the file's next part, the cues that became final (a cue waits for the first word
of the next, which fixes where it may end); `finish()` returns the rest. Joined they are exactly
the file `build_cues` makes from all the words at once.

Words without a span (a phoneme request) are shown as spoken.
"""

from __future__ import annotations

import html
import re
import unicodedata
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

CAPTION_FORMATS = ("srt", "vtt")
LINE_COLUMNS = 42  # the common broadcast and streaming limit for Latin scripts
MIN_CUE_SECONDS = 1.0  # shorter flashes by unread
MAX_CUE_SECONDS = 7.0  # longer lingers; a sentence that runs past it is cut at a clause
LINGER_SECONDS = 0.5  # a cue stays this long after its last word, for the eye to finish, no longer
PAUSE_BREAK_SECONDS = 1.0  # silence this long between two words ends the cue before it
# A cue cut short of a full one only where it keeps at least this many columns; else at the last word.
MIN_CUT_COLUMNS = 16

# How strongly the text breaks after a word; a short sentence may share its cue with the next, a
# paragraph (a blank line, a list item, a heading, a block tag) never does.
NO_BREAK, CLAUSE, SENTENCE, PARAGRAPH = 0, 1, 2, 3
_SENTENCE_MARKS = ".!?…。！？"
_CLAUSE_MARKS = ",;:—–)]、，；：）"

# --- what is markup -----------------------------------------------------------------------------

# A tag of HTML or SSML (any name: in a caption, nothing that looks like one is text to show).
_TAG = re.compile(r"</?([A-Za-z][\w:.-]*)(?:\s+[^<>]*?)?\s*/?>")
# Tags that end a line on a page, or a sentence in SSML: a line break where they stand.
_BLOCK_TAG_NAMES = frozenset("blockquote br dd div dt h1 h2 h3 h4 h5 h6 hr li ol p pre s speak table td th tr ul"
                             .split())
# `[text](target)`, `![alt](src)`: the text stays; a target the words skipped is dropped.
_LINK = re.compile(r"!?\[([^\[\]]*)\]\([^()]*\)")
_LINK_TARGET = re.compile(r"\]\([^()\s]*(?:\s+\"[^\"]*\")?\)")
# Kokoro-FastAPI's inline tags: [pause:0.5s], [voice:am_adam], [rate:1.5].
_KOKORO_TAG = re.compile(r"\[(?:pause|voice|rate):[^\[\]]*\]", re.IGNORECASE)
_EMPHASIS = re.compile(r"(\*\*|__|~~|`+)(?=\S)(.+?)(?<=\S)\1|(?<![*\w])(\*)(?=[^\s*])(.+?)(?<=[^\s*])\*(?![*\w])"
                       r"|(?<![_\w])(_)(?=[^\s_])(.+?)(?<=[^\s_])_(?![_\w])")
_ENTITY = re.compile(r"&(?:#\d+|#x[0-9a-fA-F]+|[A-Za-z][A-Za-z0-9]*);")
# A Markdown line's own marks: heading, quote, bullet, task box, rule, table divider.
_LINE_MARK = re.compile(r"(?m)^[ \t]*(?:#{1,6}[ \t]+|(?:>[ \t]?)+|[-*+•][ \t]+(?:\[[ xX]\][ \t]+)?)")
_RULE = re.compile(r"(?m)^[ \t]*(?:([-*_])(?:[ \t]*\1){2,}|\|?[ \t]*:?-{2,}:?[ \t]*(?:\|[ \t]*:?-{2,}:?[ \t]*)*\|?)"
                   r"[ \t]*$")
# A line that is its own unit: a heading, list item, quote or table row.
_MARKED_LINE = re.compile(r"[ \t]*(?:#{1,6}[ \t]|>|[-*+•][ \t]|\d{1,3}[.)][ \t]|\|)")
_EDGE_MARKS = "*_~`"
# Punctuation that is markup's, not the text's, when no word covers it.
_MARKUP_PUNCTUATION = frozenset("*_#[]\\`@&%{}")


def _tags_out(source: str) -> str:
    return _TAG.sub(lambda m: "\n\n" if m.group(1).lower() in _BLOCK_TAG_NAMES else "", source)


def _entities(source: str) -> str:
    return _ENTITY.sub(lambda m: html.unescape(m.group(0)), source)


def _line_marks_out(text: str, at_line_start: bool) -> str:
    """`text` without Markdown's line marks, which stand only where a line starts: at its own
    start if `at_line_start`, else after its first line break."""
    head, tail = ("", text) if at_line_start else text.partition("\n")[0::2]
    if not at_line_start and "\n" not in text:
        return text
    return head + ("" if at_line_start else "\n") + _LINE_MARK.sub("", _RULE.sub("", tail))


def visible_text(source: str, at_line_start: bool = False) -> str:
    """What a reader sees of `source`, a span of the input: markup out, whitespace collapsed."""
    text = _line_marks_out(_tags_out(source), at_line_start)
    text = _KOKORO_TAG.sub(" ", _LINK.sub(r"\1", text))
    text = _entities(_EMPHASIS.sub(lambda m: m.group(m.lastindex), text))
    text = " ".join(text.split())
    bare = text.strip(_EDGE_MARKS)  # a mark whose pair lies outside the span
    return bare or text


def _punctuation(run: str) -> str:
    """The punctuation a reader sees in `run`, text no word was read from and standing alone."""
    return "".join(c for c in run if unicodedata.category(c).startswith("P") and c not in _MARKUP_PUNCTUATION)


def _unmarked(run: str) -> str:
    """`run`, touching a word no space apart, as a reader sees it: part of that word ("https://"
    before the "example.com" read), markup's own marks aside."""
    return "".join(c for c in run if c not in _MARKUP_PUNCTUATION)


@dataclass(frozen=True)
class Gap:
    """What lies between two read spans: what is shown after the first (`closing`: what touches it,
    and the punctuation that stands alone on its line), before the second (`opening`: what touches it),
    whether a space parts them, and how strong a break it is (NO_BREAK ... PARAGRAPH)."""

    closing: str
    opening: str
    spaced: bool
    breaks: int

    @classmethod
    def of(cls, raw: str, at_line_start: bool = False, marked_lines: bool = False, numbering: bool = False) -> "Gap":
        """The gap `raw`; `at_line_start`: it starts a line; `marked_lines`: the line before it or
        after it is one of its own kind (a heading, list item, quote or table row); `numbering`:
        it follows a list item's number ("1." is not a sentence)."""
        gap = _tags_out(raw)
        new_item = bool(re.search(r"\n[ \t]*(?:#{1,6}[ \t]|>|[-*+•][ \t]|\|)", gap)) or (marked_lines and "\n" in gap)
        gap = _line_marks_out(gap, at_line_start)
        gap = _entities(_KOKORO_TAG.sub(" ", _LINK_TARGET.sub("", gap)))
        runs = gap.split()
        if len(runs) == 1 and not gap[:1].isspace() and not gap[-1:].isspace():  # nothing parts them
            closing, opening = _unmarked(runs[0]), ""
        else:
            first = runs.pop(0) if runs and not gap[:1].isspace() else ""
            last = runs.pop() if runs and not gap[-1:].isspace() else ""
            # what stands alone between them (" — ") goes with the first; across lines (code) it is dropped
            middle = " ".join(p for p in map(_punctuation, runs) if p) if "\n" not in gap.strip() else ""
            closing = _unmarked(first) + (" " + middle if middle else "")
            opening = _unmarked(last)
        if new_item or "\n\n" in re.sub(r"[ \t]+", "", gap):
            breaks = PARAGRAPH
        elif numbering:
            breaks = NO_BREAK
        elif any(c in _SENTENCE_MARKS for c in closing):
            breaks = SENTENCE
        elif any(c in _CLAUSE_MARKS for c in closing) or any(c in "(—–" for c in opening) or _KOKORO_TAG.search(raw):
            breaks = CLAUSE
        else:
            breaks = NO_BREAK
        return cls(closing, opening, any(c.isspace() for c in gap), breaks)

    @classmethod
    def after(cls, text: str, start: int, end: int, next_start: int) -> "Gap":
        """The gap after the span text[start:end], up to the next span's start."""
        line, next_line = text.rfind("\n", 0, start) + 1, text.rfind("\n", 0, next_start) + 1
        raw = text[end:next_start]
        numbering = not text[line:start].strip() and re.fullmatch(r"\d{1,3}", text[start:end]) and \
            re.match(r"[.)][ \t]", raw)
        return cls.of(raw, at_line_start=end == 0 or text[end - 1] == "\n",
                      marked_lines=bool(_MARKED_LINE.match(text, line) or _MARKED_LINE.match(text, next_line)),
                      numbering=bool(numbering))


# --- the pieces of a cue -----------------------------------------------------------------------

@dataclass
class ShownWord:
    """One unit on screen: the visible text of one span of the input (the words read from it,
    from the first's start to the last's end), with the punctuation around it."""

    text: str
    start: float
    end: float
    spaced: bool = True  # a space before it
    breaks: int = NO_BREAK  # after it


def columns(text: str) -> int:
    """Screen columns of `text`: a wide (CJK) character takes two."""
    return sum(2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in text)


def _joined(words: list[ShownWord]) -> str:
    return "".join((" " if w.spaced and i else "") + w.text for i, w in enumerate(words))


# Choosing where the first line of two ends: columns of imbalance a break after a sentence or a
# clause is worth, and what one after a word that leads into the next ("the", "of") costs.
_LINE_END_BONUS = {NO_BREAK: 0, CLAUSE: 20, SENTENCE: 40, PARAGRAPH: 40}
_DANGLING = frozenset("a an the of to in on at for with by from and or but his her its my your our their".split())
_DANGLING_PENALTY = 8


def _breakable(words: list[ShownWord], k: int) -> bool:
    """Whether a line may end before words[k]: at a space, or between two wide (CJK) characters,
    never inside what is written as one ("example.com/help")."""
    return words[k].spaced or columns(words[k - 1].text[-1:]) == 2 or columns(words[k].text[:1]) == 2


def cue_lines(words: list[ShownWord]) -> tuple[list[str], int]:
    """The best two-line layout of `words` (one line when it fits) and the columns it runs over
    the limit (0 when it fits). A line ends at a sentence or clause where it can, else the lines
    are kept even."""
    whole = _joined(words)
    over = max(0, columns(whole) - LINE_COLUMNS)
    best: tuple[float, int, list[str]] = (1000 * over, over, [whole])
    if not over:
        return [whole], 0
    for k in range(1, len(words)):
        if not _breakable(words, k):
            continue
        top, bottom = _joined(words[:k]), _joined(words[k:])
        over = max(0, columns(top) - LINE_COLUMNS) + max(0, columns(bottom) - LINE_COLUMNS)
        cost = 1000 * over + abs(columns(top) - columns(bottom)) - _LINE_END_BONUS[words[k - 1].breaks] + \
            (_DANGLING_PENALTY if words[k - 1].text.lower() in _DANGLING else 0)
        if cost < best[0]:
            best = (cost, over, [top, bottom])
    return best[2], best[1]


@dataclass(frozen=True)
class Cue:
    start_ms: int
    end_ms: int
    lines: tuple[str, ...]

    @property
    def text(self) -> str:
        return "\n".join(self.lines)


def _fits(words: list[ShownWord]) -> bool:
    return cue_lines(words)[1] == 0 and words[-1].end - words[0].start <= MAX_CUE_SECONDS


def _cut(words: list[ShownWord]) -> int:
    """Where to end a cue that `words` overflow (k: before words[k], 0 < k < len(words)): after its
    last sentence, else after its last clause that leaves the cue MIN_CUT_COLUMNS or more, else at
    the last place a line may end."""
    for k in range(len(words) - 1, 0, -1):
        if words[k - 1].breaks >= SENTENCE:
            return k
    for k in range(len(words) - 1, 0, -1):
        if words[k - 1].breaks == CLAUSE and columns(_joined(words[:k])) >= MIN_CUT_COLUMNS:
            return k
    return next((k for k in range(len(words) - 1, 0, -1) if _breakable(words, k)), len(words) - 1)


# --- words -> cues, as they come ----------------------------------------------------------------

def _span(word: Any, size: int) -> tuple[int, int] | None:
    start, end = getattr(word, "input_start", None), getattr(word, "input_end", None)
    if start is None or end is None:
        return None
    start = min(max(0, int(start)), size)
    return start, min(max(start, int(end)), size)


class CueBuilder:
    """Cues from the words of `text` as they come, in time order; see the module docstring."""

    def __init__(self, text: str):
        self.text = text
        self._span: tuple[int, int] | None = None  # the span being read, its words so far
        self._span_words: list[Any] = []
        self._opening, self._spaced = "", True  # punctuation before that span, a space before it
        self._started = False  # a word has come
        self._cue: list[ShownWord] = []
        self._last_end_ms = 0

    def add(self, words: Iterable[Any]) -> list[Cue]:
        """Take the next words (objects with `word`, `start`, `end` in seconds and, where known,
        `input_start`, `input_end`); the cues that became final."""
        done: list[Cue] = []
        for word in words:
            span = _span(word, len(self.text))
            if span is not None and self._span is not None and span[0] < self._span[1]:
                self._span = (self._span[0], max(span[1], self._span[1]))  # the same source (or overlapping)
                self._span_words.append(word)
                continue
            if self._span is not None:  # a word without a span stands where the last span ended
                self._close_span(span[0] if span is not None else self._span[1], done)
            if span is None:  # shown as spoken
                self._take(ShownWord(word.word, float(word.start), float(max(word.end, word.start))), done)
            else:
                if not self._started:  # what opens the text: a quote, not the markup before it
                    self._opening = Gap.of(" " + self.text[:span[0]], at_line_start=True).opening
                self._span, self._span_words = span, [word]
            self._started = True
        return done

    def finish(self, audio_seconds: float) -> list[Cue]:
        """The cues still open, the last one ending within `audio_seconds` of audio."""
        done: list[Cue] = []
        if self._span is not None:
            self._close_span(len(self.text), done)
        if self._cue:
            done.append(self._emit(self._cue, None, audio_seconds))
            self._cue = []
        return done

    def _close_span(self, next_start: int, done: list[Cue]) -> None:
        """The span read so far becomes a shown word, now that the next one's start is known (the
        text's length at its end)."""
        start, end = self._span
        at_line_start = start == 0 or self.text[start - 1] == "\n"
        gap = Gap.after(self.text, start, end, next_start)
        shown = visible_text(self.text[start:end], at_line_start) or " ".join(w.word for w in self._span_words)
        first, last = self._span_words[0], self._span_words[-1]
        word = ShownWord(self._opening + shown + gap.closing, float(first.start), float(max(last.end, first.start)),
                         spaced=self._spaced, breaks=gap.breaks)
        self._opening, self._spaced = gap.opening, gap.spaced
        self._span, self._span_words = None, []
        self._take(word, done)

    def _take(self, word: ShownWord, done: list[Cue]) -> None:
        if not word.text.strip():
            return
        cue = self._cue
        if cue:
            last = cue[-1]
            if word.start - last.end >= PAUSE_BREAK_SECONDS or last.breaks == PARAGRAPH or (
                    last.breaks == SENTENCE and last.end - cue[0].start >= MIN_CUE_SECONDS):
                done.append(self._emit(cue, word.start, None))
                cue = []
        cue = cue + [word]
        while len(cue) > 1 and not _fits(cue):
            k = _cut(cue)
            done.append(self._emit(cue[:k], cue[k].start, None))
            cue = cue[k:]
        self._cue = cue

    def _emit(self, words: list[ShownWord], next_start: float | None, audio_seconds: float | None) -> Cue:
        """A cue's final times: from its first word to LINGER_SECONDS after its last, at least
        MIN_CUE_SECONDS where the next cue (or the audio's end) leaves room, never past either."""
        limit_ms = round(next_start * 1000) if next_start is not None else int(audio_seconds * 1000)
        start = words[0].start
        end = words[-1].end + LINGER_SECONDS
        if end - start < MIN_CUE_SECONDS:
            end = start + MIN_CUE_SECONDS
        end_ms = min(round(end * 1000), limit_ms)
        start_ms = min(max(round(start * 1000), self._last_end_ms), end_ms)
        if end_ms - start_ms < MIN_CUE_SECONDS * 1000:  # no room after: take some before, if the last cue left it
            start_ms = max(self._last_end_ms, min(start_ms, end_ms - round(MIN_CUE_SECONDS * 1000)))
        if end_ms <= start_ms:  # words with no length at the very end: one millisecond, inside the audio
            start_ms = max(self._last_end_ms, end_ms - 1)
            end_ms = start_ms + 1 if end_ms <= start_ms else end_ms
        self._last_end_ms = end_ms
        return Cue(start_ms, end_ms, tuple(cue_lines(words)[0]))


def build_cues(words: Iterable[Any], text: str, audio_seconds: float) -> list[Cue]:
    """The cues of `text` spoken as `words` in `audio_seconds` of audio."""
    builder = CueBuilder(text)
    return builder.add(words) + builder.finish(audio_seconds)


# --- cues -> a file -----------------------------------------------------------------------------

def _clock(ms: int, decimal: str) -> str:
    return f"{ms // 3_600_000:02d}:{ms // 60_000 % 60:02d}:{ms // 1000 % 60:02d}{decimal}{ms % 1000:03d}"


def srt_text(cues: Iterable[Cue], first_number: int = 1) -> str:
    """SubRip: numbered blocks, `HH:MM:SS,mmm` times."""
    return "".join(f"{n}\n{_clock(c.start_ms, ',')} --> {_clock(c.end_ms, ',')}\n{c.text}\n\n"
                   for n, c in enumerate(cues, first_number))


def _vtt_escaped(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


WEBVTT_HEADER = "WEBVTT\n\n"


def webvtt_text(cues: Iterable[Cue], header: bool = True) -> str:
    """WebVTT: the header, then blocks with `HH:MM:SS.mmm` times and the text escaped."""
    body = "".join(f"{_clock(c.start_ms, '.')} --> {_clock(c.end_ms, '.')}\n{_vtt_escaped(c.text)}\n\n" for c in cues)
    return (WEBVTT_HEADER if header else "") + body


class CaptionFile:
    """A subtitle file in `fmt` ("srt" or "vtt") of `text`, written as the audio comes: `add`
    takes a piece's words and its length, and returns the file's next part (the header with the
    first); `finish` returns its end."""

    def __init__(self, fmt: str, text: str):
        if fmt not in CAPTION_FORMATS:
            raise ValueError(f"unknown caption format {fmt!r}: {', '.join(CAPTION_FORMATS)}")
        self.fmt = fmt
        self.builder = CueBuilder(text)
        self.audio_seconds = 0.0
        self.count = 0  # cues written
        self.begun = False  # a part returned (WebVTT's header goes with the first)

    def add(self, words: Iterable[Any], audio_seconds: float) -> str:
        self.audio_seconds += audio_seconds
        return self._text(self.builder.add(words))

    def finish(self) -> str:
        return self._text(self.builder.finish(self.audio_seconds))

    def _text(self, cues: list[Cue]) -> str:
        text = srt_text(cues, self.count + 1) if self.fmt == "srt" else webvtt_text(cues, header=not self.begun)
        self.count += len(cues)
        self.begun = True
        return text


def caption_format_of(path: str) -> str:
    """The caption format a file name asks for by its suffix; ValueError for another."""
    suffix = path.rsplit(".", 1)[-1].lower() if "." in path else ""
    if suffix not in CAPTION_FORMATS:
        raise ValueError(f"cannot tell the caption format of {path!r}: name it .srt or .vtt")
    return suffix
