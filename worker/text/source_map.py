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
# In a whole text rewritten in places, its punctuation anchors the rewrites too ("0%，0个" -> "百分之零，零个").
_ALIGN_TOKEN_OR_SIGN = re.compile(rf"[{_CJK}]|[^\W{_CJK}]+|[^\w\s]")
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
            count: int = 0, by_words: bool = False) -> "MappedText":
        """`pattern.sub(repl, text)`, mapped: `repl` may also return a `Reading` or a MappedText
        (already mapped: pieces of this text). `by_words`: the words a replacement keeps of its
        match map to themselves wherever they stand (markup unwrapping them), not only at its ends."""
        if isinstance(pattern, str):
            pattern = re.compile(pattern)
        if not callable(repl):
            repl = _template(repl)
        edits: list[tuple[int, int, str | MappedText | Reading]] = []

        def record(m: re.Match) -> str:
            r = repl(m)
            said = r if isinstance(r, str) else r.text
            if said != m.group(0):
                edits.append((m.start(), m.end(), r if not isinstance(r, Reading) else (r, m.span(r.group))))
            return said

        rewritten = pattern.sub(record, self.text, count)
        return self.edited(edits, rewritten, by_words) if edits else self

    def replace(self, old: str, new: str) -> "MappedText":
        return self.sub(re.compile(re.escape(old)), lambda m: new) if old in self.text else self

    def strip(self, chars: str | None = None) -> "MappedText":
        stripped = self.text.strip(chars)
        if len(stripped) == len(self.text):
            return self
        start = len(self.text) - len(self.text.lstrip(chars))
        return self[start:start + len(stripped)]

    def edited(self, edits: list, rewritten: str | None = None, by_words: bool = False) -> "MappedText":
        """This text with `edits` made: (start, end, replacement) in order, not overlapping; a
        replacement is a string, a MappedText, or (Reading, (group start, group end)). `rewritten`:
        the resulting text, when the caller has it already (`sub`)."""
        starts, ends = self.starts[:], self.ends[:]
        for a, b, replacement in reversed(edits):  # from the end: the earlier edits' offsets hold
            if isinstance(replacement, MappedText):
                starts[a:b], ends[a:b] = replacement.starts, replacement.ends
                continue
            if isinstance(replacement, tuple):
                (said, _), (g0, g1) = replacement
                if g1 <= g0:
                    g0, g1 = a, b
            else:
                said, g0, g1 = replacement, a, b
            starts[a:b], ends[a:b] = self._replacement_ranges(g0, g1, said, by_words)
        if rewritten is None:
            texts, last = [], 0
            for a, b, replacement in edits:
                said = replacement if isinstance(replacement, str) else (
                    replacement.text if isinstance(replacement, MappedText) else replacement[0].text)
                texts += [self.text[last:a], said]
                last = b
            rewritten = "".join(texts) + self.text[last:]
        return MappedText(rewritten, starts, ends, self._point(0) if not self.text else self.anchor)

    def _replacement_ranges(self, g0: int, g1: int, said: str, by_words: bool) -> tuple[list[int], list[int]]:
        """The ranges of the characters of `said`, which reads characters [g0, g1) (`_align`)."""
        if not said:
            return [], []
        if g0 == g1:  # nothing replaced: an insertion between two characters
            if _WORD_CHAR.search(said):  # a word where there was none: the characters around it
                lo = self.starts[g0 - 1] if g0 > 0 else self._point(g0)
                hi = self.ends[g0] if g0 < len(self.ends) else self._point(g0)
            else:
                lo = hi = self._point(g0)
            return [lo] * len(said), [hi] * len(said)
        return self._ranges(_align(self.text[g0:g1], said, by_words), g0)

    def _ranges(self, segments: list["Segment"], offset: int = 0) -> tuple[list[int], list[int]]:
        """The ranges of a replacement's characters from its `segments` over this text from `offset`."""
        starts: list[int] = []
        ends: list[int] = []
        for length, verbatim, t0, t1 in segments:
            t0, t1 = t0 + offset, t1 + offset
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
        return starts, ends

    def aligned(self, rewritten: str) -> "MappedText":
        """`rewritten`, the whole of this text rewritten by a reader that says not where (cn2an's
        numbers in a Mandarin text), mapped by what the two share."""
        if rewritten == self.text:
            return self
        if not self.text:
            return MappedText(rewritten, [self.anchor] * len(rewritten), [self.anchor] * len(rewritten), self.anchor)
        return MappedText(rewritten, *self._ranges(_align(self.text, rewritten, local=True)), self.anchor)


# (length in the replacement, verbatim, start and end in the replaced text): verbatim segments are
# the replaced text's characters themselves (same length); the others map to their whole range.
Segment = tuple[int, bool, int, int]


def _align(t: str, r: str, by_words: bool = False, local: bool = False) -> list[Segment]:
    """How replacement `r` maps onto the text `t` it replaces, in order (see the module docstring).
    What the two share at their ends counts in whole whitespace-separated tokens ("$5-10" -> "5 to
    $10" shares no "10": the sign moved), unless `local`. With `by_words` (markup, which keeps the
    words it unwraps) or `local` (a whole text rewritten in places), the words shared inside count
    too. A word in `r` where `t` has none maps to the whole of `t`, or, `local`, to the words
    around it."""
    n, m = len(t), len(r)
    if not (by_words or local) and n and m and t[0] != r[0] and t[-1] != r[-1] and not t.isspace():
        at = t.find(r)  # shares no end with its match (most readings): in it, or all of it
        return [(m, True, at, at + m)] if at >= 0 and _WORD_CHAR.search(r) else [(m, False, 0, n)]
    limit = min(n, m)
    p = 0
    while p < limit and t[p] == r[p]:
        p += 1
    s = 0
    while s < limit - p and t[n - 1 - s] == r[m - 1 - s]:
        s += 1
    if not local:
        while p and not (_token_edge(t, p) and _token_edge(r, p)):
            p -= 1
        while s and not (_token_edge(t, n - s) and _token_edge(r, m - s)):
            s -= 1
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
        middle = _shared_words(tm, rm, p, local) if by_words or local else None
        if middle is _INSERTS_WORDS:
            return [(m, False, 0, n)]
        if middle is not None:
            return head + middle + tail
    return head + [(len(rm), False, p, n - s)] + tail


def _token_edge(text: str, i: int) -> bool:
    """Whether position `i` of `text` is the start or end of a whitespace-separated token."""
    return i == 0 or i == len(text) or text[i - 1].isspace() or text[i].isspace()


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
    tokens = _ALIGN_TOKEN_OR_SIGN if local else _ALIGN_TOKEN
    t_tokens = [(x.group(0), x.start(), x.end()) for x in tokens.finditer(tm)]
    if not any(w in rm for w, _, _ in t_tokens):  # most rewrites: digits or signs read as words
        return None
    r_tokens = [(x.group(0), x.start(), x.end()) for x in tokens.finditer(rm)]
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
        # the signs and spaces both start and end with are their own ("，50%" -> "，百分之五十")
        lead = 0
        while lead < min(len(gap_t), len(gap_r)) and gap_t[lead] == gap_r[lead] and not _WORD_CHAR.match(gap_t[lead]):
            lead += 1
        trail = 0
        while (trail < min(len(gap_t), len(gap_r)) - lead and gap_t[-1 - trail] == gap_r[-1 - trail]
               and not _WORD_CHAR.match(gap_t[-1 - trail])):
            trail += 1
        if lead:
            segments.append((lead, True, offset + t_at, offset + t_at + lead))
        if len(gap_r) - lead - trail:
            if not gap_t[lead:len(gap_t) - trail].strip() and _WORD_CHAR.search(gap_r):
                inserting.add(len(segments))
            segments.append((len(gap_r) - lead - trail, False, offset + t_at + lead, offset + t_end - trail))
        if trail:
            segments.append((trail, True, offset + t_end - trail, offset + t_end))

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


_GROUP_REFERENCE = re.compile(r"\\(\d{1,2})")


@functools.lru_cache(maxsize=64)
def _template(template: str) -> Callable[[re.Match], str]:
    """A replacement template as `re.sub` reads it ("\\1 to "), as a function of the match
    (`Match.expand` would parse the template again at every match)."""
    if "\\" not in template:
        return lambda m: template
    pieces = _GROUP_REFERENCE.split(template)  # literal, group number, literal, ...
    if any("\\" in literal for literal in pieces[::2]):  # another escape: re's own reading
        return lambda m: m.expand(template)
    return lambda m: "".join(piece if i % 2 == 0 else (m.group(int(piece)) or "") for i, piece in enumerate(pieces))


def plain_or_mapped(read: Callable) -> Callable:
    """Let a reader written for MappedText (its first argument) take a plain string too, and give a
    plain string back then: the tests, the CLI and the live segmenter call the readers so."""
    @functools.wraps(read)
    def either(text, *args, **kwargs):
        if isinstance(text, MappedText):
            return read(text, *args, **kwargs)
        return read(MappedText.of(text), *args, **kwargs).text

    return either
