"""Text that remembers where it came from: every character of a rewritten text knows the range of
the request's input it was read from, so a spoken word maps back to what the user wrote.

Every reader of the text frontend (markup, the lexicon, the reading rules, the other languages'
readers) rewrites text; each rewrite goes through `MappedText.sub` (or `edited`, or `aligned` for a
reader that rewrites a whole text at once), which keeps, for every character of the result, the
source range of the characters it replaced. The readings themselves are computed as before (the
rewritten string is exactly what `re.sub` gives); only the map is new.

    text = MappedText.of("Your total is $12.99.")
    text = text.sub(MONEY, say_money)          # "Your total is twelve dollars and ninety-nine cents."
    text.span(14, 20)                          # (14, 20): "twelve" was read from "$12.99"

How a replacement is mapped onto the text it replaced (`_align`): what the two share at their start
and end is kept character by character ("Flight DL 2417" -> "Flight DL twenty-four seventeen":
"Flight DL " maps to itself); a replacement found whole inside the match maps there ("**bold**" ->
"bold"); words the two share map to themselves, the rest to what lies between them ("| a | b |" ->
"a, b."); anything else maps to the whole match ("$12.99" -> "twelve dollars and ninety-nine
cents", every word to "$12.99"). A reader that knows better says which group of its match a
replacement reads (`Reading`: `<sub alias="World Wide Web">WWW</sub>` reads "WWW").

The map is monotone (starts and ends never decrease along the text) and every character's range
lies within the input, so a word's span is the first character's start to the last one's end, and
the words of a text come out in order.
"""

from __future__ import annotations

import functools
import re
from difflib import SequenceMatcher
from typing import Callable, Iterable, NamedTuple

# Tokens a replacement and its match are compared by: a run of word characters, except that every
# Chinese or Japanese character is a token alone (those scripts write no spaces between words).
_CJK = "\u2e80-\u9fff\uf900-\ufaff\uff66-\uff9f"
_ALIGN_TOKEN = re.compile(rf"[{_CJK}]|[^\W{_CJK}]+")
_WORD_CHAR = re.compile(r"\w")


class Reading(NamedTuple):
    """A replacement that reads one group of its match (the rest of the match is markup around it):
    its characters map into that group, not the whole match."""

    text: str
    group: int | str


class MappedText:
    """A string and, for each of its characters, the [start, end) range of the source it came from."""

    __slots__ = ("text", "starts", "ends", "anchor")

    def __init__(self, text: str, starts: list[int], ends: list[int], anchor: int = 0):
        self.text = text
        self.starts = starts
        self.ends = ends
        self.anchor = anchor  # where an empty text sits in the source

    @classmethod
    def of(cls, text: str, at: int = 0) -> "MappedText":
        """`text` as the source itself (its characters at offsets `at`, `at` + 1, ...)."""
        return cls(text, list(range(at, at + len(text))), list(range(at + 1, at + len(text) + 1)), at)

    def __len__(self) -> int:
        return len(self.text)

    def __repr__(self) -> str:
        return f"MappedText({self.text!r})"

    def __getitem__(self, index: slice) -> "MappedText":
        start, stop, _ = index.indices(len(self.text))
        stop = max(start, stop)
        return MappedText(self.text[start:stop], self.starts[start:stop], self.ends[start:stop], self._point(start))

    def __add__(self, other: "MappedText | str") -> "MappedText":
        return MappedText.join([self, other])

    @staticmethod
    def join(pieces: Iterable["MappedText | str"]) -> "MappedText":
        """The pieces one after another; a plain string among them maps to where it stands."""
        pieces = list(pieces)
        if not any(isinstance(p, str) for p in pieces) and len(pieces) == 1:
            return pieces[0]
        texts: list[str] = []
        starts: list[int] = []
        ends: list[int] = []
        anchor = None
        for i, piece in enumerate(pieces):
            if isinstance(piece, str):
                point = ends[-1] if ends else next((p._point(0) for p in pieces[i + 1:] if isinstance(p, MappedText)), 0)
                starts += [point] * len(piece)
                ends += [point] * len(piece)
                texts.append(piece)
                continue
            if anchor is None:
                anchor = piece.anchor
            texts.append(piece.text)
            starts += piece.starts
            ends += piece.ends
        return MappedText("".join(texts), starts, ends, anchor or 0)

    def _point(self, i: int) -> int:
        """The source offset of the boundary before character `i` (0 <= i <= len)."""
        if i < len(self.starts):
            return min(self.starts[i], self.ends[i - 1]) if i > 0 else self.starts[i]
        return self.ends[-1] if self.ends else self.anchor

    def span(self, start: int, end: int) -> tuple[int, int]:
        """The source range that characters [start, end) came from (a point for an empty range)."""
        if end > start:
            return self.starts[start], self.ends[end - 1]
        point = self._point(start)
        return point, point

    # --- rewriting ------------------------------------------------------------------------------

    def sub(self, pattern: re.Pattern | str, repl: Callable[[re.Match], "str | MappedText | Reading"] | str,
            count: int = 0) -> "MappedText":
        """`pattern.sub(repl, text)`, mapped: `repl` may also return a `Reading` or a MappedText
        (already mapped: pieces of this text)."""
        if isinstance(pattern, str):
            pattern = re.compile(pattern)
        edits: list[tuple[int, int, str | MappedText | Reading]] = []

        def record(m: re.Match) -> str:
            r = repl(m) if callable(repl) else m.expand(repl)
            said = r if isinstance(r, str) else r.text
            if said != m.group(0):
                edits.append((m.start(), m.end(), r if not isinstance(r, Reading) else (r, m.span(r.group))))
            return said

        rewritten = pattern.sub(record, self.text, count)
        return self.edited(edits, rewritten) if edits else self

    def replace(self, old: str, new: str) -> "MappedText":
        return self.sub(re.compile(re.escape(old)), lambda m: new) if old in self.text else self

    def strip(self, chars: str | None = None) -> "MappedText":
        stripped = self.text.strip(chars)
        if len(stripped) == len(self.text):
            return self
        start = len(self.text) - len(self.text.lstrip(chars))
        return self[start:start + len(stripped)]

    def edited(self, edits: list, rewritten: str | None = None) -> "MappedText":
        """This text with `edits` made: (start, end, replacement) in order, not overlapping; a
        replacement is a string, a MappedText, or (Reading, (group start, group end))."""
        starts: list[int] = []
        ends: list[int] = []
        texts: list[str] = []
        last = 0
        for a, b, replacement in edits:
            starts += self.starts[last:a]
            ends += self.ends[last:a]
            if rewritten is None:
                texts.append(self.text[last:a])
            if isinstance(replacement, MappedText):
                starts += replacement.starts
                ends += replacement.ends
                texts.append(replacement.text)
            else:
                if isinstance(replacement, tuple):
                    (said, _), (g0, g1) = replacement
                    if g1 <= g0:
                        g0, g1 = a, b
                else:
                    said, g0, g1 = replacement, a, b
                self._map_replacement(a, b, g0, g1, said, starts, ends)
                texts.append(said)
            last = b
        starts += self.starts[last:]
        ends += self.ends[last:]
        text = rewritten if rewritten is not None else "".join(texts) + self.text[last:]
        return MappedText(text, starts, ends, self._point(0) if not self.text else self.anchor)

    def _map_replacement(self, a: int, b: int, g0: int, g1: int, said: str, starts: list[int], ends: list[int]) -> None:
        """Append the ranges of `said`, which replaces characters [a, b) and reads [g0, g1) of them."""
        if not said:
            return
        if g0 == g1:  # nothing replaced: an insertion between two characters
            if _WORD_CHAR.search(said):  # a word where there was none: the characters around it
                lo = self.starts[g0 - 1] if g0 > 0 else self._point(g0)
                hi = self.ends[g0] if g0 < len(self.ends) else self._point(g0)
            else:
                lo = hi = self._point(g0)
            starts += [lo] * len(said)
            ends += [hi] * len(said)
            return
        for length, verbatim, t0, t1 in _align(self.text[g0:g1], said):
            t0, t1 = t0 + g0, t1 + g0
            if verbatim:
                starts += self.starts[t0:t1]
                ends += self.ends[t0:t1]
            elif t1 > t0:
                starts += [self.starts[t0]] * length
                ends += [self.ends[t1 - 1]] * length
            else:
                point = self._point(t0)
                starts += [point] * length
                ends += [point] * length

    def aligned(self, rewritten: str) -> "MappedText":
        """`rewritten`, the whole of this text rewritten by a reader that says not where (cn2an's
        numbers in a Mandarin text), mapped by what the two share."""
        if rewritten == self.text:
            return self
        if not self.text:
            return MappedText(rewritten, [self.anchor] * len(rewritten), [self.anchor] * len(rewritten), self.anchor)
        starts: list[int] = []
        ends: list[int] = []
        for length, verbatim, t0, t1 in _align(self.text, rewritten, local=True):
            if verbatim:
                starts += self.starts[t0:t1]
                ends += self.ends[t0:t1]
            elif t1 > t0:
                starts += [self.starts[t0]] * length
                ends += [self.ends[t1 - 1]] * length
            else:
                point = self._point(t0)
                starts += [point] * length
                ends += [point] * length
        return MappedText(rewritten, starts, ends, self.anchor)


# (length in the replacement, verbatim, start and end in the replaced text): verbatim segments are
# the replaced text's characters themselves (same length); the others map to their whole range.
Segment = tuple[int, bool, int, int]


def _align(t: str, r: str, local: bool = False) -> list[Segment]:
    """How replacement `r` maps onto the text `t` it replaces, in order (see the module docstring).
    A word in `r` where `t` has none between the words they share maps to the whole of `t`, or,
    `local`, to the shared words around it (a whole text rewritten in places)."""
    n, m = len(t), len(r)
    limit = min(n, m)
    p = 0
    while p < limit and t[p] == r[p]:
        p += 1
    s = 0
    while s < limit - p and t[n - 1 - s] == r[m - 1 - s]:
        s += 1
    head: list[Segment] = [(p, True, 0, p)] if p else []
    tail: list[Segment] = [(s, True, n - s, n)] if s else []
    tm, rm = t[p:n - s], r[p:m - s]
    if not rm:
        return head + tail
    if not tm.strip():
        if _WORD_CHAR.search(rm):
            return _inserted_word(t, r, p, s, local)
        return head + [(len(rm), False, p, n - s)] + tail
    if _WORD_CHAR.search(rm):  # words: mapped onto the match's own where they are found
        at = tm.find(rm)
        if at >= 0:
            return head + [(len(rm), True, p + at, p + at + len(rm))] + tail
        middle = _shared_words(tm, rm, p, local)
        if middle is _INSERTS_WORDS:
            return [(m, False, 0, n)]
        if middle is not None:
            return head + middle + tail
    return head + [(len(rm), False, p, n - s)] + tail


def _inserted_word(t: str, r: str, p: int, s: int, local: bool) -> list[Segment]:
    """Words inserted at `p` between a shared head and tail: mapped to the whole of `t`, or,
    `local`, to the word on each side of the insertion."""
    if not local:
        return [(len(r), False, 0, len(t))]
    n, m = len(t), len(r)
    left = p
    while left > 0 and t[left - 1].isalnum():
        left -= 1
    right = n - s
    while right < n and t[right].isalnum():
        right += 1
    if left == right:
        left, right = max(0, left - 1), min(n, right + 1)
    head = [(left, True, 0, left)] if left else []
    r_right = m - (n - right)
    tail = [(n - right, True, right, n)] if right < n else []
    return head + [(r_right - left, False, left, right)] + tail


_INSERTS_WORDS: list[Segment] = []  # _shared_words' answer when the replacement adds words over nothing


def _shared_words(tm: str, rm: str, offset: int, local: bool) -> list[Segment] | None:
    """The middle of a replacement mapped by the words it shares with the middle of the text it
    replaces; None when they share none; `_INSERTS_WORDS` when the replacement puts a word where the
    text has none (unless `local`: then that word maps to its neighbours)."""
    t_tokens = [(x.group(0), x.start(), x.end()) for x in _ALIGN_TOKEN.finditer(tm)]
    if not any(w in rm for w, _, _ in t_tokens):  # most rewrites: digits or signs read as words
        return None
    r_tokens = [(x.group(0), x.start(), x.end()) for x in _ALIGN_TOKEN.finditer(rm)]
    if not {w for w, _, _ in t_tokens}.intersection(w for w, _, _ in r_tokens):
        return None
    matcher = SequenceMatcher(None, [w for w, _, _ in t_tokens], [w for w, _, _ in r_tokens], autojunk=False)
    segments: list[Segment] = []
    inserting: set[int] = set()  # the segments that insert words where the text has none
    t_at = r_at = 0  # how far the segments have covered tm and rm

    def gap(t_end: int, r_end: int) -> None:
        gap_t, gap_r = tm[t_at:t_end], rm[r_at:r_end]
        if not gap_r:
            return
        if gap_t == gap_r:
            segments.append((len(gap_r), True, offset + t_at, offset + t_end))
            return
        if not gap_t.strip() and _WORD_CHAR.search(gap_r):
            inserting.add(len(segments))
        segments.append((len(gap_r), False, offset + t_at, offset + t_end))

    for ti, ri, size in matcher.get_matching_blocks():
        for k in range(size):
            _, t0, t1 = t_tokens[ti + k]
            _, r0, r1 = r_tokens[ri + k]
            gap(t0, r0)
            segments.append((r1 - r0, True, offset + t0, offset + t1))
            t_at, r_at = t1, r1
    gap(len(tm), len(rm))
    if not inserting:
        return segments
    return _absorb_inserted_words(segments, inserting) if local else _INSERTS_WORDS


def _absorb_inserted_words(segments: list[Segment], inserting: set[int]) -> list[Segment]:
    """Segments where each one that inserts words over nothing takes in its neighbours, so its
    words map to what stands around them."""
    out: list[Segment] = []
    i = 0
    while i < len(segments):
        length, verbatim, t0, t1 = segments[i]
        if i in inserting:
            if out:
                previous = out.pop()
                length, t0 = length + previous[0], previous[2]
            if i + 1 < len(segments):
                following = segments[i + 1]
                length, t1 = length + following[0], following[3]
                i += 1
            verbatim = False
        out.append((length, verbatim, t0, t1))
        i += 1
    return out


def plain_or_mapped(read: Callable) -> Callable:
    """Let a reader written for MappedText (its first argument) take a plain string too, and give a
    plain string back then: the tests, the CLI and the live segmenter call the readers so."""
    @functools.wraps(read)
    def either(text, *args, **kwargs):
        if isinstance(text, MappedText):
            return read(text, *args, **kwargs)
        return read(MappedText.of(text), *args, **kwargs).text

    return either
