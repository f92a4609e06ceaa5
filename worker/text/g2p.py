"""Text -> tokens with phonemes: the tokenizer and the per-language G2P.

A token is a word, a punctuation mark or a pause tag, with the phonemes it contributes and whether
whitespace followed it in the text. Words keep their exact text so chunks can report what they say
and timestamps can name the words.

English (`a`, `b`) goes word by word through `english.py` (misaki lexicon, espeak-ng fallback),
right to left, because `the`, `to`, `a` sound different before a vowel. The espeak-ng languages go a
clause at a time (so cross-word rules such as French liaison apply) and are matched back to words
when espeak-ng returns one phoneme word per input word, else word by word. Mandarin (`z`) and
Japanese (`j`) write no spaces: each run of their text is cut into words by the language's own
segmenter (`mandarin.py`, `japanese.py`), and Latin words inside go through the English G2P.
"""

from __future__ import annotations

import logging
import unicodedata
from dataclasses import dataclass

import regex

from worker.text import espeak
from worker.text.english import CLAUSE_PUNCTUATION, CONSONANTS, VOWELS, Context, english_g2p
from worker.text.text_errors import TextError
from worker.text.japanese import japanese_words
from worker.text.source_map import MappedText
from worker.text.mandarin import mandarin_words

log = logging.getLogger(__name__)

# lang_code -> espeak-ng language, for the languages Kokoro v1.0 has voices in.
ESPEAK_LANGUAGES = {"e": "es", "f": "fr-fr", "h": "hi", "i": "it", "p": "pt-br"}
ENGLISH = {"a": False, "b": True}  # lang_code -> british
# The languages written without spaces: lang_code -> (reader, the words' `source` as `kokoro-fleet
# phonemize` shows it). A reader takes a text's tokens in order and which of them to read (runs of
# the language's script) and gives each its [(word, phonemes)].
UNSPACED_LANGUAGES = {"j": (japanese_words, "mecab"), "z": (mandarin_words, "pinyin")}
LANGUAGE_ALIASES = {"en-us": "a", "en": "a", "en-gb": "b", "es": "e", "fr-fr": "f", "fr": "f", "hi": "h",
                    "it": "i", "pt-br": "p", "pt": "p", "ja": "j", "zh": "z", "zh-cn": "z", "cmn": "z"}
SUPPORTED_CODES = ("a", "b", "e", "f", "h", "i", "j", "p", "z")

# Punctuation -> the symbol the model's vocabulary has for it ("" = silent).
_PUNCT = {
    ".": ".", "!": "!", "?": "?", ",": ",", ";": ";", ":": ":", "…": "…",
    "—": "—", "–": "—", "―": "—", "-": "—", "(": "(", "[": "(", "{": "(", ")": ")", "]": ")", "}": ")",
    "“": "“", "”": "”", "«": "“", "»": "”", "„": "“", "‟": "“",
    "'": "", "‘": "", "’": "", "¡": "", "¿": "", "‚": "", "‹": "", "›": "", "、": ",", "。": ".",
    "，": ",", "！": "!", "？": "?", "：": ":", "；": ";", "．": ".", "（": "(", "）": ")",
    "「": "“", "」": "”", "『": "“", "』": "”", "《": "“", "》": "”", "【": "“", "】": "”", "〜": "—", "～": "—",
}
_OPENING = frozenset("“(")  # punctuation the next word follows without a space
_CLOSING = frozenset("”)")  # punctuation that follows the word before it without a space
SENTENCE_END = frozenset(".!?…")
CLAUSE_END = frozenset(";:—")
WORD_LIMIT_CHARS = 40  # longer "words" (hashes, keyboard mashing) are read in slices

_TOKEN = regex.compile(
    r"(?P<pause>\[pause:\s*(?P<secs>\d+(?:\.\d+)?)\s*(?P<unit>m?s)\])"
    r"|(?P<link>\[(?P<ltext>[^\[\]]+)\]\(/(?P<lps>[^()]*)/\))"
    # An initialism keeps its last period when the sentence goes on ("the U.S. economy").
    r"|(?P<initialism>(?:[A-Za-z]\.){2,}(?=\s+[a-z0-9]))"
    # A comma between digits is a number's ("1.000,50", "1,000"), not a pause.
    r"|(?P<word>[\p{L}\p{M}\p{N}_'’]+(?:(?:[-.'’/_+&@]|(?<=\p{N}),(?=\p{N}))[\p{L}\p{M}\p{N}_'’]+)*)"
    r"|(?P<dots>\.{2,})"
    r"|(?P<dash>-{2,})"
    r"|(?P<space>\s+)"
    r"|(?P<other>\X)",
    regex.IGNORECASE,
)


@dataclass
class Token:
    text: str                  # the word or mark as written (for a pause: the tag)
    phonemes: str = ""         # what it contributes to the phoneme string ("" = silent)
    space_after: bool = False  # whitespace followed it in the text
    kind: str = "word"         # "word" | "punct" | "pause"
    source: str = ""           # word: lexicon | espeak | number | custom | pinyin | mecab | silent; punct: punct
    pause: float = 0.0         # seconds of silence (pause tokens)
    newline_after: bool = False
    break_after: bool = False  # a word ends here though no space follows in the text (Chinese,
                               # Japanese): the model hears a space, the chunk's text keeps none
    input_start: int = 0       # [input_start, input_end): the characters of the request's input
    input_end: int = 0         # it was read from (worker/text/source_map.py)
    at: int = -1               # where its text starts in the normalized text (-1: not known)


def resolve_language(lang_code: str) -> str:
    """A request's lang_code (`a`, `en-us`, ...) -> our one-letter code; TextError if unsupported."""
    problem = language_problem(lang_code)
    if problem is not None:
        raise TextError(problem, param="lang_code")
    return _language_code(lang_code)


def language_problem(lang_code: str) -> str | None:
    """Why `lang_code` cannot be read (a message naming the supported codes), or None when it can."""
    if _language_code(lang_code) in SUPPORTED_CODES:
        return None
    return (f"unknown lang_code {lang_code!r}; supported: a (en-us), b (en-gb), e (es), f (fr-fr), h (hi), "
            "i (it), j (ja), p (pt-br), z (zh)")


def _language_code(lang_code: str) -> str:
    code = (lang_code or "a").strip().lower()
    return LANGUAGE_ALIASES.get(code, code)


def tokenize(text: str | MappedText) -> list[Token]:
    """Split normalized text into words, punctuation and pause tags (no phonemes yet), each with
    the span of the input it was read from (`text` itself, unless it is a MappedText)."""
    mapped = text if isinstance(text, MappedText) else MappedText.of(text)
    starts, ends = mapped.starts, mapped.ends
    tokens: list[Token] = []
    open_quote = True
    for m in _TOKEN.finditer(mapped.text):
        kind = m.lastgroup
        if kind in ("secs", "unit", "ltext", "lps"):
            kind = next(k for k in ("pause", "link") if m.group(k))
        if kind == "space":
            if tokens:
                tokens[-1].space_after = True
                if "\n" in m.group(0):
                    tokens[-1].newline_after = True
            continue
        if kind == "pause":
            seconds = float(m.group("secs")) / (1000.0 if m.group("unit").lower() == "ms" else 1.0)
            tokens.append(Token(m.group(0), kind="pause", pause=min(seconds, 60.0)))
        elif kind == "link":
            tokens.append(Token(m.group("ltext"), m.group("lps"), source="custom"))
        elif kind in ("word", "initialism"):
            tokens.append(Token(m.group(0)))
        elif kind == "dots":
            tokens.append(Token(m.group(0), "…", kind="punct", source="punct"))
        elif kind == "dash":
            tokens.append(Token(m.group(0), "—", kind="punct", source="punct"))
        else:
            mark = m.group(0)
            if mark == '"':
                symbol = "“" if open_quote else "”"
                open_quote = not open_quote
                tokens.append(Token(mark, symbol, kind="punct", source="punct"))
            elif mark in _PUNCT:
                tokens.append(Token(mark, _PUNCT[mark], kind="punct", source="punct"))
            else:
                tokens.append(Token(mark))  # a symbol or emoji: the G2P decides (often silent)
        # a pronunciation link stands for its word; anything else for all it matched (its text)
        tok = tokens[-1]
        start, end = m.span("ltext") if kind == "link" else m.span()
        tok.input_start, tok.input_end, tok.at = starts[start], ends[end - 1], start
    return tokens


def phonemize_tokens(tokens: list[Token], lang_code: str, text: MappedText | None = None) -> list[Token]:
    """Fill in the phonemes of every word token for `lang_code` (already resolved); `text`, the
    normalized text the tokens were cut from, maps the words a Chinese or Japanese token is cut
    into back to the input."""
    if lang_code in ENGLISH:
        _english(tokens, ENGLISH[lang_code])
    elif lang_code in UNSPACED_LANGUAGES:
        tokens = _unspaced_language(tokens, *UNSPACED_LANGUAGES[lang_code], text)
    else:
        _espeak_language(tokens, ESPEAK_LANGUAGES[lang_code])
    return tokens


def _english(tokens: list[Token], british: bool) -> None:
    g2p = english_g2p(british)
    ctx = Context()
    for tok in reversed(tokens):
        if tok.kind == "pause":
            ctx = Context()
            continue
        if tok.kind == "word" and tok.source != "custom":
            if len(tok.text) > WORD_LIMIT_CHARS:
                pieces = [tok.text[i:i + WORD_LIMIT_CHARS] for i in range(0, len(tok.text), WORD_LIMIT_CHARS)]
                results = [g2p.word(p) for p in pieces]
                tok.phonemes = " ".join(r.phonemes for r in results if r.phonemes)
                tok.source = "espeak" if any(r.source == "espeak" for r in results) else results[0].source
            else:
                result = g2p.word(tok.text, ctx)
                tok.phonemes, tok.source = result.phonemes, result.source
        ctx = _context_before(tok, ctx)


def _context_before(tok: Token, after: Context) -> Context:
    """What the word before `tok` sees next: a vowel, a consonant, or the end of a clause."""
    for ch in tok.phonemes:
        if ch in VOWELS:
            return Context(True, _is_to(tok))
        if ch in CONSONANTS:
            return Context(False, _is_to(tok))
        if ch in CLAUSE_PUNCTUATION:
            return Context(None, False)
    return after if not tok.phonemes else Context(after.next_vowel, _is_to(tok))


def _is_to(tok: Token) -> bool:
    return tok.kind == "word" and tok.text in ("to", "To", "TO")


# What espeak-ng is given of a word: the letters of the scripts it reads in that language, digits,
# combining marks, and apostrophes and hyphens inside the word. Anything else it reads badly or
# fatally: a Chinese character or an emoji by its Unicode name ("chino símbolo"), and libespeak-ng
# 1.51 (Debian's) dies with SIGSEGV, taking the whole worker process with it, on some mixed
# strings, e.g. in Hindi a punctuation mark, a hyphen and a kana or Chinese character ("_-的"), and
# in every voice hyphens before a Devanagari word ("---लच्छेद"). tests/unit/test_g2p_cases.py
# feeds it such strings in a child process.
_ESPEAK_SCRIPTS = {"hi": r"\p{Latin}\p{Devanagari}"}


def _unreadable(scripts: str) -> regex.Pattern:
    """Runs of characters outside `scripts`, digits, the points and commas inside numbers,
    apostrophes and hyphens, each with the combining marks on it; a mark counts only on a kept character ("é" decomposed stays, a
    Devanagari vowel sign without its consonant goes: espeak-ng would say its name)."""
    kept = scripts + r"\p{N}'’\-"
    number_mark = r"(?<=\p{N})[.,](?=\p{N})"  # "1.000,50": espeak-ng reads the number whole
    return regex.compile(r"(?:(?:(?!" + number_mark + r")[^" + kept + r"\p{M}]|(?<![" + kept + r"\p{M}])\p{M})\p{M}*)+")


_ESPEAK_READABLE = {voice: _unreadable(_ESPEAK_SCRIPTS.get(voice, r"\p{Latin}")) for voice in ESPEAK_LANGUAGES.values()}
_ESPEAK_EDGES = "'’-"


def espeak_readable(word: str, voice: str) -> str:
    """`word` as espeak-ng may be given it in `voice`: unreadable characters become spaces, and the
    pieces lose the apostrophes and hyphens at their edges ("" when nothing readable is left)."""
    pieces = _ESPEAK_READABLE[voice].sub(" ", word).split()
    return " ".join(p for p in (piece.strip(_ESPEAK_EDGES) for piece in pieces) if p)


def _espeak_language(tokens: list[Token], voice: str) -> None:
    """Phonemize each run of words between punctuation as one clause, matched back to its words."""
    run: list[tuple[Token, str]] = []  # (token, what espeak-ng reads of it)

    def flush() -> None:
        if not run:
            return
        clause = espeak.other_language(" ".join(text for _, text in run), voice).split()
        if len(clause) == len(run):
            for (tok, _), ps in zip(run, clause):
                tok.phonemes, tok.source = ps, "espeak"
        else:  # numbers, merges or a word in pieces changed the word count: word by word keeps the alignment
            for tok, text in run:
                tok.phonemes, tok.source = espeak.other_language(text, voice).replace(" ", ""), "espeak"
                if not tok.phonemes:
                    tok.source = "silent"
        run.clear()

    for tok in tokens:
        if tok.kind != "word" or tok.source == "custom":
            flush()
            continue
        text = espeak_readable(tok.text, voice)
        if not text:
            tok.source = "silent"  # emoji, symbols, another script's characters
            continue
        if len(text) <= WORD_LIMIT_CHARS:
            run.append((tok, text))
        else:
            flush()
            pieces = [text[i:i + WORD_LIMIT_CHARS] for i in range(0, len(text), WORD_LIMIT_CHARS)]
            tok.phonemes = " ".join(espeak.other_language(p, voice) for p in pieces).strip()
            tok.source = "espeak" if tok.phonemes else "silent"
    flush()


_LATIN_OR_NOT = regex.compile(r"(\p{Latin}[\p{Latin}\p{M}'’.\-]*)|(\P{Latin}+)")


def _unspaced_language(tokens: list[Token], words_of, source: str, text: MappedText | None = None) -> list[Token]:
    """Cut each word token (to the tokenizer, a whole run of Chinese or Japanese between spaces
    and punctuation) into the language's words; Latin words inside ("用Kokoro说") are English."""
    split: list[Token] = []
    for tok in tokens:
        if tok.kind == "punct":  # "你好，世界" is read "ni↓xau↓, ʂɨ↘ʨje↘", as misaki writes it
            if tok.phonemes in _OPENING and split:
                split[-1].break_after = True  # "小说（清代）" -> "ɕjau↓ʂwo→ (ʨʰi→ŋtai↘)"
            elif tok.phonemes in _CLOSING and split:
                split[-1].break_after = False  # "吗？”她" -> "ma?” tʰa→"
            if tok.phonemes not in _OPENING:
                tok.break_after = True
        if tok.kind != "word" or tok.source == "custom":
            split.append(tok)
            continue
        if not regex.search(r"[\p{L}\p{N}]", tok.text):
            tok.source = "silent"  # a symbol or emoji between words
            split.append(tok)
            continue
        pieces = []
        for m in _LATIN_OR_NOT.finditer(tok.text):
            piece = Token(m.group(0), **_part_of(tok, m.start(), m.end(), text))  # source "": not read yet
            if m.group(1):
                result = english_g2p(False).word(unicodedata.normalize("NFKC", m.group(1)))
                piece.phonemes, piece.source = result.phonemes, result.source
            pieces.append(piece)
        for piece in pieces[:-1]:
            piece.break_after = True
        pieces[-1].space_after, pieces[-1].newline_after = tok.space_after, tok.newline_after
        split += pieces

    to_read = [t.kind == "word" and not t.source for t in split]
    texts = [t.text if read or t.kind == "punct" else " " for t, read in zip(split, to_read)]
    readings = words_of(texts, to_read)
    out: list[Token] = []
    for tok, read, words in zip(split, to_read, readings):
        if not read:
            out.append(tok)
        elif not words:
            tok.source = "silent"
            out.append(tok)
        else:
            spoken = [Token(word, ps, source=source if ps else "silent", break_after=True,
                            **_part_of(tok, start, end, text)) for word, ps, start, end in words]
            last = spoken[-1]
            last.space_after, last.newline_after, last.break_after = tok.space_after, tok.newline_after, tok.break_after
            out += spoken
    return out


def _part_of(tok: Token, start: int, end: int, text: MappedText | None) -> dict[str, int]:
    """Where characters [start, end) of `tok`'s text stand (`at`) and come from in the input,
    through the normalized `text` it was cut from; all the token came from when that is not known."""
    if text is None or tok.at < 0 or end <= start:
        return {"input_start": tok.input_start, "input_end": tok.input_end}
    first, last = text.span(tok.at + start, tok.at + end)
    return {"input_start": first, "input_end": last, "at": tok.at + start}


def text_to_tokens(text: str | MappedText, lang_code: str) -> list[Token]:
    """Tokenize and phonemize already-normalized text (a MappedText: its tokens carry the spans of
    the input they were read from)."""
    mapped = text if isinstance(text, MappedText) else MappedText.of(text)
    return phonemize_tokens(tokenize(mapped), resolve_language(lang_code), mapped)
