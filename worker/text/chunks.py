"""From a request's text to chunks the model can take: at most 510 phonemes each.

Where to cut, in order of preference: the end of a sentence, the end of a clause (`;` `:` `—`), a
comma, any word boundary, and only for a single "word" longer than the limit (a hash, a URL-length
string) inside that word. Every token lands in exactly one chunk, so no text is lost and no chunk
exceeds the limit whatever the input.

The first chunk aims at `first_chunk_phonemes` (a clause or a short sentence) so the first audio
comes fast; each later chunk aims at twice the one before (60, 120, 240, ...) until `chunk_phonemes`,
packing whole sentences, for throughput. Doubling keeps a stream ahead of its listener: chunk k is
synthesized while chunks 0..k-1 play, and they last about as long as chunk k, so a replica needs
roughly real time plus its queueing headroom (on a replica only a few times faster than real time,
a whole sentence can push chunk 1 past its target); a jump from 60 straight to 400 phonemes would
need almost 7x real time before any queueing. A `[pause:0.5s]` tag ends the chunk before it and
becomes that chunk's `pause_after`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from worker.text.text_errors import TextError
from worker.text.g2p import CLAUSE_END, SENTENCE_END, Token, language_problem, resolve_language, text_to_tokens
from worker.text.lexicon import Lexicon
from worker.text.normalize import NormalizationOptions, normalize_text
from worker.text.source_map import MappedText
from worker.text.vocab import to_ids, to_phonemes, vocab

MAX_PHONEMES = 510  # the model's context is 512 ids, two of them the boundary pads

# Boundary strengths after a token.
WORD, COMMA, CLAUSE, SENTENCE = 0, 1, 2, 3
_CLOSERS = frozenset("”)")


@dataclass
class WordSpan:
    text: str
    start: int  # [start, end): indices into Chunk.ids
    end: int
    input_start: int  # [input_start, input_end): the characters of the request's input it was read from
    input_end: int


@dataclass
class Chunk:
    text: str
    phonemes: str
    ids: list[int]
    words: list[WordSpan] = field(default_factory=list)
    pause_after: float = 0.0  # seconds of silence after this chunk
    voice: str | None = None  # the voice SSML's <voice name> gave this chunk's text (None: the request's)
    rate: float = 1.0  # SSML's <prosody rate> for it, times the request's speed


def text_to_chunks(
    text: str | MappedText,
    lang_code: str = "a",
    options: NormalizationOptions | None = None,
    first_chunk_phonemes: int = 60,
    chunk_phonemes: int = 400,
    lexicon: Lexicon | None = None,
) -> list[Chunk]:
    """Normalize (with the deployment's `lexicon`, KOKORO_LEXICON), phonemize and split `text`.
    Raises TextError for an unsupported language. The words' input spans are offsets into `text`,
    or, for a MappedText (a part of a request's input), into the input it maps to.

    Returns at least one chunk for non-empty text; a text with nothing pronounceable (only emoji)
    gives chunks without ids, and the caller decides whether that is an error.
    """
    code = resolve_language(lang_code)
    normalized = normalize_text(text if isinstance(text, MappedText) else MappedText.of(text), options, code, lexicon)
    tokens = text_to_tokens(normalized, code)
    return split_tokens(tokens, first_chunk_phonemes, chunk_phonemes)


# A text per language that reaches its reader, numbers included (each language reads them its own way).
_WARM_TEXT = {"j": "こんにちは、1回目です。", "z": "你好，第1次。"}
_loaded_languages: set[str] = set()


def load_language(lang_code: str) -> None:
    """Load the text reader of `lang_code` now (a fraction of a second; Mandarin's dictionaries
    take longest: loadtest/README.md), once per process; TextError for an unsupported language."""
    code = resolve_language(lang_code)
    if code not in _loaded_languages:
        text_to_chunks(_WARM_TEXT.get(code, "Warming up, 1 2 3."), code)
        _loaded_languages.add(code)


def language_loaded(lang_code: str) -> bool:
    """Whether `load_language` has run for `lang_code`, so a short text in it plans in well under a
    millisecond (an unsupported code counts as loaded: planning refuses it at once)."""
    return language_problem(lang_code) is not None or resolve_language(lang_code) in _loaded_languages


def phonemes_to_chunks(phonemes: str, first_chunk_phonemes: int = 60, chunk_phonemes: int = 400) -> list[Chunk]:
    """Phonemes in Kokoro's alphabet (what `/dev/phonemize` returns), spoken as given: split into
    chunks by the same rules as text, with whitespace-separated phoneme words as the words and the
    vocabulary's punctuation as the boundaries. Raises TextError naming any symbol outside the
    vocabulary (text input drops those with a warning; phonemes sent on purpose deserve an answer)."""
    table = vocab()
    unknown = sorted({c for c in phonemes if c not in table and not c.isspace()})
    if unknown:
        listed = " ".join(f"{c!r} (U+{ord(c):04X})" for c in unknown[:10])
        raise TextError(f"phonemes contain {len(unknown)} symbol(s) outside Kokoro's vocabulary: {listed}; "
                        "POST /dev/phonemize shows the phonemes of a text", param="phonemes")
    tokens: list[Token] = []
    for written in re.finditer(r"\S+", phonemes):
        piece, at = written.group(0), written.start()
        core = piece.strip(_PHONEME_PUNCTUATION)
        lead = piece[:len(piece) - len(piece.lstrip(_PHONEME_PUNCTUATION))] if core else piece
        trail = piece[len(lead) + len(core):]
        tokens += [Token(mark, mark, kind="punct", source="punct", input_start=at + i, input_end=at + i + 1)
                   for i, mark in enumerate(lead)]
        at += len(lead)
        if core:
            tokens.append(Token(core, core, source="custom", input_start=at, input_end=at + len(core)))
        at += len(core)
        tokens += [Token(mark, mark, kind="punct", source="punct", input_start=at + i, input_end=at + i + 1)
                   for i, mark in enumerate(trail)]
        tokens[-1].space_after = True
    return split_tokens(tokens, first_chunk_phonemes, chunk_phonemes)


# The vocabulary's punctuation: a boundary inside a phoneme string, never part of a word.
_PHONEME_PUNCTUATION = ";:,.!?—…\"()“”"


# ---------------------------------------------------------------------------------------------


def _token_cost(tok: Token) -> int:
    """An upper bound of the ids this token adds: its symbols plus one separating space."""
    return len(tok.phonemes) + 1


# A number said in words is one unit: cut between its words ("The total was one | billion two
# hundred...") and the two chunks are synthesized apart, with a seam in its middle. English
# number words, and Japanese kanji numerals on both sides of misaki's word break (十二億三千|四百...).
_NUMBER_WORD = re.compile(
    r"(?:(?:zero|one|two|three|four|five|six|seven|eight|nine|ten|eleven|twelve|thirteen|fourteen|fifteen|"
    r"sixteen|seventeen|eighteen|nineteen|twenty|thirty|forty|fifty|sixty|seventy|eighty|ninety)"
    r"(?:-(?:one|two|three|four|five|six|seven|eight|nine|first|second|third|fourth|fifth|sixth|seventh|eighth|"
    r"ninth))?|hundred|thousand|million|billion|trillion|hundredth|thousandth|millionth|billionth|point)",
    re.IGNORECASE)
_KANJI_NUMERALS = "〇一二三四五六七八九十百千万億兆"


def _inside_a_number(tok: Token, nxt: Token) -> bool:
    if tok.kind != "word" or nxt.kind != "word" or not tok.text or not nxt.text:
        return False
    if _NUMBER_WORD.fullmatch(tok.text) and _NUMBER_WORD.fullmatch(nxt.text):
        return tok.text.lower() != "point" or nxt.text.lower() != "point"
    return tok.text[-1] in _KANJI_NUMERALS and nxt.text[0] in _KANJI_NUMERALS


def _strengths(tokens: list[Token]) -> list[int]:
    """The strength of the boundary after each token (a cut is only ever made after a token)."""
    out = []
    for i, tok in enumerate(tokens):
        nxt = tokens[i + 1] if i + 1 < len(tokens) else None
        if nxt is not None and not (tok.space_after or tok.break_after or tok.newline_after) \
                and nxt.kind != "pause" and tok.kind != "pause":
            out.append(-1)  # inside a whitespace-delimited word: cut here only when forced
            continue
        if nxt is not None and not tok.newline_after and _inside_a_number(tok, nxt):
            out.append(-1)  # inside a number said in words: the same
            continue
        marks = tok.phonemes if tok.kind == "punct" else ""
        if tok.newline_after or tok.kind == "pause":
            strength = SENTENCE
        elif any(c in SENTENCE_END for c in marks) or (marks and marks[0] in _CLOSERS and i > 0
                                                        and any(c in SENTENCE_END for c in tokens[i - 1].phonemes)):
            strength = SENTENCE
        elif any(c in CLAUSE_END for c in marks):
            strength = CLAUSE
        elif "," in marks:
            strength = COMMA
        else:
            strength = WORD
        out.append(strength)
    return out


def _split_long_tokens(tokens: list[Token], limit: int) -> list[Token]:
    """A single token whose phonemes exceed the limit is cut into pieces that fit (text on the first)."""
    out: list[Token] = []
    for tok in tokens:
        if _token_cost(tok) <= limit:
            out.append(tok)
            continue
        ps = tok.phonemes
        pieces = []
        while len(ps) > limit - 1:
            cut = ps.rfind(" ", 0, limit - 1)
            cut = cut if cut > 0 else limit - 1
            pieces.append(ps[:cut])
            ps = ps[cut:].lstrip(" ")
        if ps:
            pieces.append(ps)
        for j, piece in enumerate(pieces):
            last = j == len(pieces) - 1
            out.append(Token(tok.text if j == 0 else "", piece, space_after=tok.space_after if last else True,
                             kind=tok.kind, source=tok.source, newline_after=tok.newline_after if last else False,
                             break_after=tok.break_after if last else False, input_start=tok.input_start,
                             input_end=tok.input_end))
    return out


def _choose_end(costs: list[int], strengths: list[int], start: int, target: int, is_first: bool) -> int:
    """Where the chunk that starts at token `start` ends (exclusive)."""
    n = len(costs)
    hard: list[int] = []  # candidate ends within the hard limit: (end, length)
    total = 0
    lengths = []
    for j in range(start, n):
        total += costs[j]
        if total > MAX_PHONEMES:
            break
        hard.append(j + 1)
        lengths.append(total)
    if not hard:
        return start + 1  # cannot happen after _split_long_tokens; never loop forever
    if hard[-1] == n and lengths[-1] <= target:
        return n
    within = [(end, length) for end, length in zip(hard, lengths) if length <= target]
    minimum = target // 4 if is_first else target // 2

    def latest(candidates, strength, at_least=0):
        found = [end for end, length in candidates if strengths[end - 1] >= strength and length >= at_least]
        return found[-1] if found else None

    def earliest(candidates, strength):
        found = [end for end, _ in candidates if strengths[end - 1] >= strength]
        return found[0] if found else None

    everything = list(zip(hard, lengths))
    end = latest(within, SENTENCE)
    if end is None and not is_first:
        end = earliest(everything, SENTENCE)        # a whole sentence up to the hard limit
    if end is None:
        end = latest(within, CLAUSE, minimum) or latest(within, COMMA, minimum)
    if end is None and is_first:
        end = latest(within, WORD, minimum)         # no clause in reach: first audio matters more
    if end is None and is_first:
        end = latest(within, WORD, minimum // 2)    # a few words before a long number said in words
    if end is None:
        end = earliest(everything, COMMA)           # the first clause, however long (<= 510)
    if end is None:
        end = latest(within, WORD) or latest(everything, WORD)
    if end is None:
        end = hard[-1]                              # no word boundary fits: cut inside the word
    if end == n:
        return n
    return end


def split_tokens(tokens: list[Token], first_chunk_phonemes: int = 60, chunk_phonemes: int = 400) -> list[Chunk]:
    """Group phonemized tokens into chunks (see the module docstring for the rules)."""
    first_target = max(1, min(first_chunk_phonemes, MAX_PHONEMES))
    later_target = max(1, min(chunk_phonemes, MAX_PHONEMES))
    tokens = _split_long_tokens(tokens, MAX_PHONEMES)
    chunks: list[Chunk] = []
    start = 0
    while start < len(tokens):
        # A pause tag ends what comes before it; consecutive pauses add up.
        if tokens[start].kind == "pause":
            seconds = tokens[start].pause
            if chunks:
                chunks[-1].pause_after += seconds
            else:
                chunks.append(Chunk("", "", [], [], pause_after=seconds))
            start += 1
            continue
        stop = start
        while stop < len(tokens) and tokens[stop].kind != "pause":
            stop += 1
        segment = tokens[start:stop]
        costs = [_token_cost(t) for t in segment]
        strengths = _strengths(segment)
        pos = 0
        while pos < len(segment):
            voiced = sum(1 for c in chunks if c.ids)
            target = max(first_target, min(later_target, first_target << min(voiced, 16)))
            end = _choose_end(costs, strengths, pos, target, voiced == 0)
            chunks.append(_build_chunk(segment[pos:end]))
            pos = end
        start = stop
    return _merge_silent(chunks)


def _build_chunk(tokens: list[Token]) -> Chunk:
    space = vocab()[" "]
    ids: list[int] = []
    words: list[WordSpan] = []
    text_parts: list[str] = []
    pending_space = False
    for i, tok in enumerate(tokens):
        text_parts.append(tok.text + (" " if tok.space_after and i < len(tokens) - 1 else ""))
        tok_ids = to_ids(tok.phonemes)
        if tok_ids:
            is_word = tok.kind == "word"
            # One space between spoken tokens that whitespace separated, and always between words.
            prev_word = i > 0 and tokens[i - 1].kind == "word"
            if ids and (pending_space or (is_word and prev_word and tok_ids[0] != space)):
                if ids[-1] != space:
                    ids.append(space)
            start = len(ids)
            ids.extend(tok_ids)
            if is_word:
                words.append(WordSpan(tok.text, start, len(ids), tok.input_start, tok.input_end))
            pending_space = False
        if (tok.space_after or tok.break_after) and (tok_ids or ids):
            pending_space = True
    while ids and ids[-1] == space:
        ids.pop()
    for w in words:  # a trailing space popped above never belongs to a word, but keep spans honest
        w.end = min(w.end, len(ids))
    return Chunk("".join(text_parts).strip(), to_phonemes(ids), ids, [w for w in words if w.text])


def _merge_silent(chunks: list[Chunk]) -> list[Chunk]:
    """A chunk with nothing to say (only emoji, say) gives its text and pause to a neighbour."""
    out: list[Chunk] = []
    for chunk in chunks:
        if not chunk.ids and out:
            prev = out[-1]
            prev.text = (prev.text + " " + chunk.text).strip() if chunk.text else prev.text
            prev.pause_after += chunk.pause_after
            continue
        if out and not out[-1].ids and chunk.ids and out[-1].pause_after == 0:
            chunk.text = (out[-1].text + " " + chunk.text).strip()
            out.pop()
        out.append(chunk)
    return out
