"""English G2P: misaki's lexicon first (what Kokoro v1.0 was trained on), espeak-ng for the rest.

misaki's own `en.G2P` runs spaCy (for part-of-speech tags) and downloads a spaCy model at start-up,
which cannot work offline. We read misaki's lexicon files (`us_gold.json`, `us_silver.json`,
`gb_*.json`, shipped in the `misaki` wheel) and apply the same word-level rules it applies:

- gold entries win over silver; a capitalized or ALL-CAPS word falls back to its lower-case entry;
  capitalization adds stress the way misaki does (0.5 for Capitalized, 2 for ALL CAPS);
- entries that depend on the part of speech use their DEFAULT reading (we have no tagger), except
  the `None` reading at the end of a clause, which misaki also picks from context alone;
- function words whose sound depends on the next word (`the`, `to`, `a`, `an`, `in`, `am`) look at
  whether the next word starts with a vowel, as misaki does;
- -s / -ed / -ing forms of known stems are built with misaki's suffix rules;
- acronyms (`FBI`) are spelled out from the letter entries;
- ɾ becomes T and ʔ becomes t: the symbols Kokoro v1.0's vocabulary uses for flap and glottal stop.

Words outside the lexicon go to espeak-ng (see `espeak.py`). `source` on each result says which.
"""

from __future__ import annotations

import importlib.resources
import json
import re
import unicodedata
from dataclasses import dataclass
from functools import lru_cache

from worker.text import espeak

PRIMARY, SECONDARY = "ˈ", "ˌ"
VOWELS = frozenset("AIOQWYaiuæɑɒɔəɛɜɪʊʌᵻ")
CONSONANTS = frozenset("bdfhjklmnpstvwzðŋɡɹɾʃʒʤʧθ")
CLAUSE_PUNCTUATION = frozenset(";:,.!?—…")  # ends a clause: the next word has no "future vowel"
DIPHTHONGS = frozenset("AIOQWYʤʧ")
US_FLAP_VOWELS = frozenset("AIOWYiuæɑəɛɪɹʊʌ")  # a t after these flaps to ɾ before -ed / -ing (US)
SYMBOL_WORDS = {"%": "percent", "&": "and", "+": "plus", "@": "at"}
_ASCII_WORD = re.compile(r"^[A-Za-z']+$")


@dataclass(frozen=True)
class Context:
    """What the word after this one looks like (misaki's TokenContext)."""

    next_vowel: bool | None = None  # True: starts with a vowel; False: a consonant; None: clause end
    next_is_to: bool = False


def apply_stress(ps: str, stress: float | None) -> str:
    """misaki's stress adjustment: <-1 strips, -1/-0.5 demotes, 0.5..2 adds where none is marked."""
    if stress is None or not ps:
        return ps
    if stress < -1:
        return ps.replace(PRIMARY, "").replace(SECONDARY, "")
    if stress == -1 or (stress in (0, -0.5) and PRIMARY in ps):
        return ps.replace(SECONDARY, "").replace(PRIMARY, SECONDARY)
    unstressed = PRIMARY not in ps and SECONDARY not in ps
    if stress in (0, 0.5, 1) and unstressed:
        return _place_stress(SECONDARY, ps)
    if stress >= 1 and PRIMARY not in ps and SECONDARY in ps:
        return ps.replace(SECONDARY, PRIMARY)
    if stress > 1 and unstressed:
        return _place_stress(PRIMARY, ps)
    return ps


def _place_stress(mark: str, ps: str) -> str:
    """Put a stress mark right before the first vowel (unchanged if there is no vowel)."""
    for i, ch in enumerate(ps):
        if ch in VOWELS:
            return ps[:i] + mark + ps[i:]
    return ps


def _stress_weight(ps: str) -> int:
    return sum(2 if c in DIPHTHONGS else 1 for c in ps)


@dataclass
class WordPhonemes:
    phonemes: str
    source: str  # "lexicon" | "espeak" | "number" | "silent"


class EnglishG2P:
    """Word-level English G2P over misaki's US (`british=False`) or GB lexicon."""

    def __init__(self, british: bool = False):
        self.british = british
        prefix = "gb" if british else "us"
        self.golds = _load_lexicon(f"{prefix}_gold.json")
        self.silvers = _load_lexicon(f"{prefix}_silver.json")

    # --- public -------------------------------------------------------------------------------

    def word(self, word: str, ctx: Context = Context()) -> WordPhonemes:
        """Phonemes of one word (no surrounding punctuation) given what follows it."""
        word = unicodedata.normalize("NFKC", word.replace("\u2018", "'").replace("\u2019", "'"))
        ps = self._lexicon_word(word, ctx)
        if ps is not None:
            return WordPhonemes(_finish(ps), "lexicon")
        if word.isdigit() and word.isascii():
            return WordPhonemes(_finish(self._number(word)), "number")
        parts = _split_compound(word)
        if len(parts) > 1:
            return self._compound(word, parts, ctx)
        if not _has_latin_letter(word):
            return WordPhonemes("", "silent")  # emoji, other scripts: nothing an English voice can say
        return WordPhonemes(espeak.english_word(word, self.british), "espeak")

    # --- lexicon rules (misaki's, rewritten) --------------------------------------------------

    def _lexicon_word(self, word: str, ctx: Context) -> str | None:
        stress = None if word == word.lower() else (2.0 if word == word.upper() else 0.5)
        ps = self._special(word, ctx)
        if ps is not None:
            return ps
        lower = word.lower()
        if (
            len(word) > 1 and word.replace("'", "").isalpha() and word != lower
            and word not in self.golds and word not in self.silvers
            and (word == word.upper() or word[1:] == word[1:].lower())
            and (lower in self.golds or lower in self.silvers
                 or any(f(lower, stress, ctx) is not None for f in (self._stem_s, self._stem_ed, self._stem_ing)))
        ):
            word = lower
        if self._is_known(word):
            return self._lookup(word, stress, ctx)
        if word.endswith("s'") and self._is_known(word[:-2] + "'s"):
            return self._lookup(word[:-2] + "'s", stress, ctx)
        if word.endswith("'") and self._is_known(word[:-1]):
            return self._lookup(word[:-1], stress, ctx)
        for stem_rule, rule_stress in ((self._stem_s, stress), (self._stem_ed, stress),
                                       (self._stem_ing, 0.5 if stress is None else stress)):
            ps = stem_rule(word, rule_stress, ctx)
            if ps is not None:
                return ps
        return None

    def _special(self, word: str, ctx: Context) -> str | None:
        if word in SYMBOL_WORDS:
            return self._lookup(SYMBOL_WORDS[word], None, ctx)
        if "." in word.strip(".") and word.replace(".", "").isalpha() and max(len(p) for p in word.split(".")) < 3:
            return self._letters(word)  # U.S., e.g., a.m.
        if word in ("a", "A"):
            # a determiner when a word follows ("a cat", "A man"); the letter otherwise ("plan A.")
            return "ɐ" if word == "a" or ctx.next_vowel is not None else "ˈA"
        if word in ("AM", "PM"):
            return self._letters(word)
        if word in ("am", "Am"):
            return "ɐm" if (word == "am" and ctx.next_vowel is not None) else self._gold_default("am")
        if word in ("an", "An", "AN"):
            return "ɐn"
        if word == "I":
            return SECONDARY + "I"
        if word in ("to", "To", "TO"):
            if ctx.next_vowel is None:
                return self._gold_default("to")
            return "tʊ" if ctx.next_vowel else "tə"
        if word in ("in", "In", "IN"):
            return (PRIMARY if ctx.next_vowel is None else "") + "ɪn"
        if word in ("the", "The", "THE"):
            return "ði" if ctx.next_vowel else "ðə"
        if re.fullmatch(r"(?i)vs\.?", word):
            return self._lookup("versus", None, ctx)
        if word in ("used", "Used", "USED"):
            entry = self.golds.get("used")
            if isinstance(entry, dict):
                return entry.get("VBD", entry["DEFAULT"]) if ctx.next_is_to else entry["DEFAULT"]
        return None

    def _gold_default(self, word: str) -> str:
        entry = self.golds[word]
        return entry["DEFAULT"] if isinstance(entry, dict) else entry

    def _is_known(self, word: str) -> bool:
        if word in self.golds or word in SYMBOL_WORDS or word in self.silvers:
            return True
        if not word.isalpha() or not _ASCII_WORD.match(word):
            return False
        if len(word) == 1:
            return True
        if word == word.upper() and word.lower() in self.golds:
            return True
        return word[1:] == word[1:].upper()  # an acronym: spelled out below

    def _lookup(self, word: str, stress: float | None, ctx: Context | None) -> str | None:
        if word == word.upper() and word not in self.golds:
            word = word.lower()
        entry = self.golds.get(word)
        if entry is None:
            entry = self.silvers.get(word)
        if isinstance(entry, dict):
            # Part-of-speech entries: no tagger here, so DEFAULT, or the clause-final reading.
            if ctx is not None and ctx.next_vowel is None and "None" in entry:
                entry = entry["None"]
            else:
                entry = entry["DEFAULT"]
        if entry is None:
            return self._letters(word)
        return apply_stress(entry, stress)

    def _letters(self, word: str) -> str | None:
        """Spell a word letter by letter (acronyms), stressing the last letter as misaki does."""
        letters = [self.golds.get(c.upper()) for c in word if c.isalpha()]
        if not letters or any(not isinstance(p, str) for p in letters):
            return None
        ps = apply_stress("".join(letters), 0)
        head, sep, tail = ps.rpartition(SECONDARY)
        return head + PRIMARY + tail if sep else ps

    # --- suffixes ------------------------------------------------------------------------------

    def _plural(self, stem: str | None) -> str | None:
        if not stem:
            return None
        if stem[-1] in "ptkfθ":
            return stem + "s"
        if stem[-1] in "szʃʒʧʤ":
            return stem + ("ɪ" if self.british else "ᵻ") + "z"
        return stem + "z"

    def _stem_s(self, word: str, stress: float | None, ctx: Context) -> str | None:
        if len(word) < 3 or not word.endswith("s"):
            return None
        if not word.endswith("ss") and self._is_known(word[:-1]):
            stem = word[:-1]
        elif (word.endswith("'s") or (len(word) > 4 and word.endswith("es") and not word.endswith("ies"))) \
                and self._is_known(word[:-2]):
            stem = word[:-2]
        elif len(word) > 4 and word.endswith("ies") and self._is_known(word[:-3] + "y"):
            stem = word[:-3] + "y"
        else:
            return None
        return self._plural(self._lookup(stem, stress, ctx))

    def _past(self, stem: str | None) -> str | None:
        if not stem:
            return None
        if stem[-1] in "pkfθʃsʧ":
            return stem + "t"
        if stem[-1] == "d":
            return stem + ("ɪ" if self.british else "ᵻ") + "d"
        if stem[-1] != "t":
            return stem + "d"
        if self.british or len(stem) < 2:
            return stem + "ɪd"
        if stem[-2] in US_FLAP_VOWELS:
            return stem[:-1] + "ɾᵻd"
        return stem + "ᵻd"

    def _stem_ed(self, word: str, stress: float | None, ctx: Context) -> str | None:
        if len(word) < 4 or not word.endswith("d"):
            return None
        if not word.endswith("dd") and self._is_known(word[:-1]):
            stem = word[:-1]
        elif len(word) > 4 and word.endswith("ed") and not word.endswith("eed") and self._is_known(word[:-2]):
            stem = word[:-2]
        else:
            return None
        return self._past(self._lookup(stem, stress, ctx))

    def _progressive(self, stem: str | None) -> str | None:
        if not stem:
            return None
        if self.british:
            if stem[-1] in "əː":
                return None
        elif len(stem) > 1 and stem[-1] == "t" and stem[-2] in US_FLAP_VOWELS:
            return stem[:-1] + "ɾɪŋ"
        return stem + "ɪŋ"

    def _stem_ing(self, word: str, stress: float | None, ctx: Context) -> str | None:
        if len(word) < 5 or not word.endswith("ing"):
            return None
        if len(word) > 5 and self._is_known(word[:-3]):
            stem = word[:-3]
        elif self._is_known(word[:-3] + "e"):
            stem = word[:-3] + "e"
        elif len(word) > 5 and re.search(r"([bcdgklmnprstvxz])\1ing$|cking$", word) and self._is_known(word[:-4]):
            stem = word[:-4]
        else:
            return None
        return self._progressive(self._lookup(stem, stress, ctx))

    # --- words the lexicon does not hold --------------------------------------------------------

    def _number(self, digits: str) -> str:
        """Digits the normalizer left alone (normalization off): read as a cardinal."""
        from worker.text.numbers import cardinal

        words = cardinal(int(digits)) if len(digits) <= 15 else " ".join(cardinal(int(d)) for d in digits)
        return " ".join(self.word(w).phonemes for w in re.split(r"[\s-]+", words) if w)

    def _compound(self, word: str, parts: list[str], ctx: Context) -> WordPhonemes:
        """A word the lexicon lacks whole: hyphenated, camelCase, letters+digits. Each part alone."""
        results: list[WordPhonemes] = []
        for i, part in enumerate(parts):
            if all(c in "-_'./" for c in part):
                continue
            results.append(self.word(part, ctx if i == len(parts) - 1 else Context(next_vowel=False)))
        spoken = [r for r in results if r.phonemes]
        if not spoken:
            return WordPhonemes("", "silent")
        # misaki writes letter-only compounds as one word with stress rebalanced; mixed ones spaced.
        only_letters = all(p.replace("'", "").isalpha() or all(c in "-_'./" for c in p) for p in parts)
        pieces = [r.phonemes for r in spoken]
        if only_letters and len(pieces) > 1:
            pieces = _rebalance_stress(pieces, parts)
        phonemes = ("" if only_letters else " ").join(pieces)
        sources = {r.source for r in spoken}
        source = "lexicon" if sources == {"lexicon"} else ("espeak" if "espeak" in sources else sources.pop())
        return WordPhonemes(phonemes, source)


def _rebalance_stress(pieces: list[str], parts: list[str]) -> list[str]:
    """Joined parts keep at most about half their primary stresses (the heaviest), as misaki does."""
    ranked = [(PRIMARY in p, _stress_weight(p), i) for i, p in enumerate(pieces)]
    letter_parts = [p for p in parts if not all(c in "-_'./" for c in p)]
    if len(pieces) == 2 and len(letter_parts[0]) == 1:
        return [pieces[0], apply_stress(pieces[1], -0.5)]
    if sum(has for has, _, _ in ranked) <= (len(ranked) + 1) // 2:
        return pieces
    out = list(pieces)
    for _, _, i in sorted(ranked)[: len(ranked) // 2]:
        out[i] = apply_stress(out[i], -0.5)
    return out


_COMPOUND_PART = re.compile(
    r"[A-Z](?=[A-Z][a-z])"          # the last capital of an acronym before a word: "HTTPServer"
    r"|\d+(?:[.,]\d+)*"             # a number
    r"|[-_]+"                       # joiners
    r"|[A-Za-z]*?(?:'[A-Za-z])*?[a-z](?=[A-Z])"  # a lower-case run before a capital: "camel|Case"
    r"|[^\W\d_]+(?:'[^\W\d_]+)*"    # letters, with inner apostrophes
    r"|[^\w\s]"                     # any other single symbol
    r"|\S"
)


def _split_compound(word: str) -> list[str]:
    return _COMPOUND_PART.findall(word) or [word]


def _has_latin_letter(word: str) -> bool:
    decomposed = unicodedata.normalize("NFKD", word)
    return any("a" <= c <= "z" or "A" <= c <= "Z" for c in decomposed)


def _finish(ps: str) -> str:
    return ps.replace("ɾ", "T").replace("ʔ", "t")


@lru_cache(maxsize=None)
def _load_lexicon(filename: str) -> dict:
    """One misaki lexicon file, plus the capitalized / lower-case variants misaki derives."""
    with importlib.resources.files("misaki.data").joinpath(filename).open("r", encoding="utf-8") as f:
        entries = json.load(f)
    grown = {}
    for key, value in entries.items():
        if len(key) < 2:
            continue
        if key == key.lower():
            if key != key.capitalize():
                grown[key.capitalize()] = value
        elif key == key.lower().capitalize():
            grown[key.lower()] = value
    grown.update(entries)
    return grown


@lru_cache(maxsize=2)
def english_g2p(british: bool = False) -> EnglishG2P:
    """The process-wide G2P per accent (the lexicons take a moment to load, then stay)."""
    return EnglishG2P(british)
