"""Text that arrives a few characters at a time (a language model's tokens), cut into pieces that
can be spoken on their own as soon as they are complete.

A live session (api/live.py) synthesizes each piece this module gives it. Kokoro speaks every
piece with its own intonation, so a cut inside a sentence is audible: pieces end where a reader
pauses anyway.

- A piece ends after a sentence's end (`.`, `!`, `?`, `…`, with any closing quotes or brackets)
  once a space follows it, so "3." waits to see whether "50" comes next; not after an
  abbreviation ("Mr.", "e.g.") or an initial ("J."). After `。`, `！` or `？` (Chinese, Japanese)
  nothing needs to follow: those languages put no space between sentences.
- A line break ends a piece: a model's Markdown lists, headings and table rows are lines.
- The opening pieces of a turn (of the session, after a flush or a pause: those that start within its
  first `OPENING_CHARS`) also end at a clause mark (`,` `;` `:` `—`) followed by a space, once they
  are `CLAUSE_PIECE_MIN_CHARS` long. The first audio should not wait for the end of a long first
  sentence, and nor should the second piece: a model writes a sentence of 30 words in about 4 s
  (8 words a second), far longer than a 6-word first piece takes to say, so the listener would hear
  that wait as silence. Once a turn has run `OPENING_CHARS`, the audio already said keeps ahead of
  the writing, and pieces end at sentence ends only (Kokoro's intonation is a whole sentence's).
- Text with no such mark is cut at its last space (a clause mark first) before `MAX_PIECE_CHARS`,
  so a run-on text still streams.
- Where the session reads markup (`reads_markup`), a fenced code block (``` or ~~~ lines) is
  dropped as it comes, line by line: read_markup would drop it from a whole text, but a piece is a
  line, and a code line alone no longer shows that it is code. Likewise a piece inside SSML's
  `<voice>` or `<prosody>` elements, cut from their opening tags, starts with those tags again.
- When the writer pauses (a model calling a tool after "Let me check that."), `settle()` ends the
  pieces that the next characters would have ended, as if a space came: the listener hears "Let me
  check that." during the pause, not after it. A word or sentence still unfinished waits, and so does
  a mark right after a digit ("costs $3." may become "$3.50", "1," "1,000"). After a pause the
  listener has caught up with the audio, so the next pieces are a turn's opening again.

    segmenter = TextSegmenter()
    segmenter.push("Hello there. How")   # ["Hello there."]
    segmenter.push(" are you?")          # []: "?" may still take a closing quote
    segmenter.push(" Fine")              # ["How are you?"]
    segmenter.push(". Let me check.")    # ["Fine."]
    segmenter.settle()                   # ["Let me check."]: the writer paused after it
    segmenter.flush()                    # "" (a flush also starts a new turn)

Each piece is a `TextPiece`, a string that also knows where its text stands in everything pushed
(`written_at`), so the words spoken from it point into what the writer sent.
"""

from __future__ import annotations

import re

from worker.text.markup import closes_code, code_fence, follow_speech_tags
from worker.text.read_abbreviations import ABBREVIATIONS

CLAUSE_PIECE_MIN_CHARS = 30
OPENING_CHARS = 200
MAX_PIECE_CHARS = 300

_SENTENCE_ENDS = ".!?…"
_UNSPACED_SENTENCE_ENDS = "。！？"
_CLOSERS = "\"'”’)]」』）*_"
_CLAUSE_MARKS = ",;:—"
# Words whose period is not a full stop: the normalizer's abbreviations, and titles it reads
# another way (Dr. may be Doctor or Drive, St. Saint or Street).
_NOT_ENDS = frozenset(k for k in ABBREVIATIONS if k.endswith(".")) | {"Dr.", "St.", "No.", "Mx.", "a.m.", "p.m."}
_INITIAL = re.compile(r"(?:\b|^)[A-Z]\.$")  # "J." in "J. R. R. Tolkien"
_LIST_NUMBER = re.compile(r"^\s*\d{1,3}\.$")  # "2." opening a numbered list item
_CLOSING_TAG = re.compile(r"</(?:[\w:-]+\s*>?)?$|</[\w:-]+\s*>")  # a closing tag, or what may become one
_CODE_LINE_GOES_ON = "x"  # stands for the start of a long code line: no closing fence starts so


class TextPiece(str):
    """A piece as it is read: the `<voice>` and `<prosody>` tags it is inside of, reopened
    (`reopened` characters), then its text, which starts at `offset` in all the text pushed."""

    offset: int
    reopened: int

    def __new__(cls, text: str, offset: int = 0, reopened: int = 0) -> "TextPiece":
        piece = super().__new__(cls, text)
        piece.offset, piece.reopened = offset, reopened
        return piece

    def written_at(self, i: int) -> int:
        """Where character `i` of the piece (or the boundary before it) stands in all the text
        pushed; a reopened tag stands where the piece's text starts."""
        return self.offset + max(0, i - self.reopened)


class TextSegmenter:
    def __init__(self, clause_piece_min_chars: int = CLAUSE_PIECE_MIN_CHARS, opening_chars: int = OPENING_CHARS,
                 max_piece_chars: int = MAX_PIECE_CHARS, reads_markup: bool = True):
        self.clause_piece_min_chars = clause_piece_min_chars
        self.opening_chars = opening_chars
        self.max_piece_chars = max_piece_chars
        self.reads_markup = reads_markup
        self.open_tags: list[str] = []  # the <voice> and <prosody> elements open, outermost first
        self.buffer = ""
        self.consumed = 0  # characters pushed before the buffer's first (cut, dropped or cleared)
        self.turn_chars = 0  # cut into pieces since the session's start, the last flush or pause
        self.line_start = True  # the buffer starts a line
        self.fence: str | None = None  # inside a code block: the fence that opened it

    def push(self, text: str) -> list[TextPiece]:
        """Add text; return the pieces it completed, in order (stripped, never blank)."""
        self.buffer += text
        return self._cut()

    def settle(self) -> list[TextPiece]:
        """The writer paused: the pieces that a space after the buffered text would complete
        (stripped, never blank). What stays buffered is an unfinished sentence (or word)."""
        pieces = self._cut(settled=True)
        self.turn_chars = 0
        return pieces

    def _cut(self, settled: bool = False) -> list[TextPiece]:
        pieces = []
        while True:
            if self.reads_markup and self._skip_code():
                continue
            if self.fence is not None or (self.reads_markup and self._fence_line_coming()):
                break  # code whose line is not complete yet, or a line that may open a code block
            end = self._piece_end(settled)
            if end is None:
                break
            piece, start = self.buffer[:end], self.consumed
            self._drop_to(self.buffer[end:])
            self.turn_chars += end
            self.line_start = piece.endswith("\n")
            if piece.strip():
                pieces.append(self._as_read(piece, start))
        return pieces

    def flush(self) -> TextPiece:
        """Everything buffered, as one piece ("" when there is nothing to say: an unclosed code
        block ends with the turn)."""
        while self.reads_markup and self._skip_code():
            pass
        code = self.fence is not None or (self.reads_markup and self._fence_line_coming(final=True))
        piece = TextPiece("") if code or not self.buffer.strip() else self._as_read(self.buffer, self.consumed)
        self.clear()
        return piece

    def clear(self) -> None:
        self._drop_to("")
        self.turn_chars = 0
        self.line_start = True
        self.fence = None
        self.open_tags = []

    def _drop_to(self, rest: str) -> None:
        """The buffer becomes `rest`, its end: what went before it is cut, dropped or cleared."""
        self.consumed += len(self.buffer) - len(rest)
        self.buffer = rest

    def _as_read(self, cut: str, offset: int) -> TextPiece:
        """The text `cut` from `offset` of all pushed, stripped and opened with the `<voice>` and
        `<prosody>` tags it is inside of; those it opens and closes are followed for the next piece."""
        piece = cut.strip()
        offset += len(cut) - len(cut.lstrip())
        if not self.reads_markup:
            return TextPiece(piece, offset)
        inside = "".join(self.open_tags)
        follow_speech_tags(piece, self.open_tags)
        return TextPiece(inside + piece, offset, len(inside))

    def _fence_line_coming(self, final: bool = False) -> bool:
        """Whether the buffer starts a line that opens a code block, or may once more comes ("``";
        not when the text is `final`), with its line break still to come: "```word. " must not be
        cut as a sentence."""
        head = self.buffer.lstrip(" \t")
        if not (self.line_start or head.startswith("\n")):
            return False
        text = head.lstrip(" \t\n")  # blank lines before it
        line = text.partition("\n")[0]
        if "\n" in text or not line or len(line) > self.max_piece_chars:  # no fence line is that long
            return False
        return code_fence(line) is not None or (not final and line[0] in "`~" and len(line) < 3
                                                and set(line) == {line[0]})

    def _skip_code(self) -> bool:
        """Drop a code block's opening fence line, or inside one its complete lines (and the
        closing fence, which ends it); whether it dropped anything. A line counts once its line
        break has come, even after a pause: "```" may still become "```py" or "````"."""
        if self.fence is None:
            line, rest = _first_line(self.buffer)
            first = True
            while rest is not None and not line.strip():  # blank lines before it: it starts a line
                line, rest = _first_line(rest)
                first = False
            if rest is None or (first and not self.line_start) or (fence := code_fence(line)) is None:
                return False
            self._drop_to(rest)
            self.fence, self.line_start = fence, True
            return True
        dropped = False
        while self.fence is not None:
            line, rest = _first_line(self.buffer)
            if rest is None:
                if len(line) > self.max_piece_chars:  # too long to close the block: keep a mark of it, not it
                    self._drop_to(_CODE_LINE_GOES_ON)
                    dropped = True
                return dropped
            if closes_code(self.fence, line):
                self.fence = None
            self._drop_to(rest)
            dropped = True
        return dropped

    def _piece_end(self, settled: bool = False) -> int | None:
        """Where the buffer's first complete piece ends, or None while it is not complete yet.
        `settled`: no more text is coming for now, so the buffer's end counts as a space."""
        text = self.buffer
        for i, ch in enumerate(text):
            if ch == "\n":
                if text[:i].strip():
                    return i + 1
            elif ch in _SENTENCE_ENDS or ch in _UNSPACED_SENTENCE_ENDS:
                end = _after_closers(text, i + 1)
                if end == len(text) and (not settled or _number_may_go_on(text, i)):
                    return None  # what follows decides: wait for it
                spaced = end == len(text) or text[end].isspace()
                if ch in _UNSPACED_SENTENCE_ENDS or (spaced and not _is_abbreviation(text[:i + 1])):
                    return end
            elif (ch in _CLAUSE_MARKS and self.turn_chars < self.opening_chars and i + 1 >= self.clause_piece_min_chars
                  and (text[i + 1].isspace() if i + 1 < len(text) else settled and not _number_may_go_on(text, i))):
                return i + 1
            if i + 1 >= self.max_piece_chars:
                return _last_break(text[:i + 1])
        return None


def _first_line(text: str) -> tuple[str, str | None]:
    """The first line of `text` and what follows its line break (None: the line has none yet)."""
    line, newline, rest = text.partition("\n")
    return line, rest if newline else None


def _after_closers(text: str, i: int) -> int:
    """Past the closing marks after a sentence's end at `i`: quotes, brackets, emphasis, and
    closing tags ("here.</voice> Now"); the text's end while a tag may still be closing one."""
    while i < len(text):
        if text[i] in _CLOSERS or text[i] in _SENTENCE_ENDS:
            i += 1
        elif text[i] == "<" and (tag := _CLOSING_TAG.match(text, i)) is not None:
            if not tag.group(0).endswith(">"):
                return len(text)  # "</voi": wait for the rest
            i = tag.end()
        else:
            break
    return i


def _number_may_go_on(text: str, i: int) -> bool:
    """Whether the mark at `i`, the buffer's last character, follows a digit and may be inside a
    number still being written ("$3." before "50", "1," before "000", "3:" before "30"): a writer's
    pause there is no end; the next text, a flush or the end decides."""
    return i + 1 == len(text) and text[i] in ".,:" and i > 0 and text[i - 1].isdigit()


def _is_abbreviation(text: str) -> bool:
    """Whether the period closing `text` belongs to an abbreviation, an initial or a list number."""
    if not text.endswith("."):
        return False
    word = text.rsplit(None, 1)[-1].lstrip("(\"'“‘")
    return word in _NOT_ENDS or bool(_INITIAL.search(word)) or bool(_LIST_NUMBER.match(text))


def _last_break(text: str) -> int:
    """Where to cut a piece that reached the length bound: after its last clause mark that a space
    follows, else at its last space, else (one long word) right there."""
    clause = max((i + 1 for i in range(len(text) - 1) if text[i] in _CLAUSE_MARKS and text[i + 1].isspace()),
                 default=0)
    if clause:
        return clause
    space = max(text.rfind(" "), text.rfind("\t"), text.rfind("\u3000"))
    return space + 1 if space > 0 else len(text)
