"""A deployment's own pronunciations (KOKORO_LEXICON): brand and product names, people, places,
said the same way in every request without marking up each text.

The file is JSON: words (or phrases) -> phonemes in Kokoro's alphabet, for every language, and
optionally sections per language code whose entries win in that language:

    {"Kokoro": "kˈOkəɹO", "nginx": "ˈɛnʤɪnˌɛks", "z": {"Kokoro": "kʰo→kʰo→lwo→"}}

(`kokoro-fleet phonemize TEXT` shows the phonemes the server would use, to start from.) Each match
in a text becomes Kokoro's own pronunciation link, `[Kokoro](/kˈOkəɹO/)`, once Markdown is read and
before any number or symbol rule (normalize_text), so the text keeps its spelling (captions show
the word as written) and nothing reads it another way.
An entry written in lowercase also matches its capitalized and uppercase forms ("nginx", "Nginx",
"NGINX"); one with a capital matches as written ("US" leaves "us" alone). Whole words only, and
not inside a web or mail address, another word (`-`, `_`) or an existing link.

    lexicon = load_lexicon("lexicon.json")   # LexiconError (ValueError) naming the bad entry
    lexicon.mark("Kokoro is fast.", "a")     # "[Kokoro](/kˈOkəɹO/) is fast."
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

ALL_LANGUAGES = "*"
_MAX_WORD_CHARS = 100


class LexiconError(ValueError):
    """The lexicon file cannot be read, or an entry is malformed; the message says which and why."""


@dataclass(frozen=True)
class Lexicon:
    """Entries per language code (`*`: every language), and one matcher per language built from them."""

    entries: dict[str, dict[str, str]] = field(default_factory=dict)
    source: str = ""
    _matchers: dict[str, tuple[re.Pattern | None, dict[str, str]]] = field(default_factory=dict, repr=False,
                                                                           compare=False)

    def __bool__(self) -> bool:
        return any(self.entries.values())

    def words(self, lang_code: str) -> dict[str, str]:
        """The entries in force for `lang_code`: every language's, then the language's own over them."""
        return {**self.entries.get(ALL_LANGUAGES, {}), **self.entries.get(lang_code, {})}

    def mark(self, text: str, lang_code: str) -> str:
        """`text` with every entry of `lang_code` turned into a pronunciation link (see the module
        docstring); existing links and pause tags are left as they are."""
        pattern, words = self._matcher(lang_code)
        if pattern is None:
            return text
        from worker.text.normalize import MARKUP

        def link(m: re.Match) -> str:
            written = m.group(0)
            return f"[{written}](/{words.get(written) or words[written.lower()]}/)"

        out, last = [], 0
        for m in MARKUP.finditer(text):
            out += [pattern.sub(link, text[last:m.start()]), m.group(0)]
            last = m.end()
        out.append(pattern.sub(link, text[last:]))
        return "".join(out)

    def _matcher(self, lang_code: str) -> tuple[re.Pattern | None, dict[str, str]]:
        if lang_code not in self._matchers:
            words = self.words(lang_code)
            self._matchers[lang_code] = (_pattern(words), words)
        return self._matchers[lang_code]


def _pattern(words: dict[str, str]) -> re.Pattern | None:
    """One pattern for all of `words`, longest first (a phrase wins over its first word); a lowercase
    entry ignores case, one with capitals does not."""
    if not words:
        return None
    alternatives = "|".join(re.escape(w) if w != w.lower() else f"(?i:{re.escape(w)})"
                            for w in sorted(words, key=len, reverse=True))
    # Whole words: not inside another word, an address (example.com, a@b.org) or a hyphenated name.
    return re.compile(rf"(?<![\w@/.\-])(?:{alternatives})(?![\w@\-])(?!\.\w)")


@functools.lru_cache(maxsize=8)
def load_lexicon(path: str | None) -> Lexicon:
    """The lexicon in the JSON file at `path` (None or empty: none), read once per process;
    LexiconError if it cannot be read or an entry is malformed: a word that is empty or holds
    brackets, phonemes outside Kokoro's alphabet, a section that is not a language code."""
    if not path:
        return Lexicon()
    where = f"KOKORO_LEXICON {path}"
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as e:
        raise LexiconError(f"{where}: cannot read it ({e.strerror or e})") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise LexiconError(f"{where}: not JSON ({e})") from None
    if not isinstance(data, dict):
        raise LexiconError(f'{where}: expected a JSON object of words and their phonemes, such as '
                           f'{{"Kokoro": "kˈOkəɹO"}}')
    from worker.text.g2p import SUPPORTED_CODES, resolve_language
    from worker.text.vocab import vocab

    alphabet = (set(vocab()) | {" "}) - set("()[]/")  # brackets and slashes would end the link
    entries: dict[str, dict[str, str]] = {}
    for key, value in data.items():
        if isinstance(value, dict):
            try:
                code = resolve_language(key)
            except ValueError:
                raise LexiconError(f"{where}: section {key!r} is not a language code; use one of "
                                   f"{', '.join(SUPPORTED_CODES)}") from None
            section = entries.setdefault(code, {})
            for word, phonemes in value.items():
                section[_checked_word(word, where)] = _checked_phonemes(word, phonemes, alphabet, where)
        else:
            entries.setdefault(ALL_LANGUAGES, {})[_checked_word(key, where)] = _checked_phonemes(
                key, value, alphabet, where)
    return Lexicon(entries, str(path))


def _checked_word(word: str, where: str) -> str:
    written = word.strip()
    if not written or len(written) > _MAX_WORD_CHARS or any(c in written for c in "[]()\n"):
        raise LexiconError(f"{where}: {word!r} cannot be an entry: give a word or phrase of 1 to "
                           f"{_MAX_WORD_CHARS} characters without brackets or line breaks")
    return written


def _checked_phonemes(word: str, phonemes, alphabet: set[str], where: str) -> str:
    if not isinstance(phonemes, str) or not phonemes.strip():
        raise LexiconError(f"{where}: {word!r} needs its phonemes as a non-empty string, such as \"kˈOkəɹO\"")
    unknown = sorted({c for c in phonemes.strip() if c not in alphabet})
    if unknown:
        raise LexiconError(f"{where}: the phonemes of {word!r}, {phonemes!r}, hold symbols outside Kokoro's "
                           f"alphabet: {' '.join(unknown)} (`kokoro-fleet phonemize WORD` shows a word's phonemes)")
    return phonemes.strip()
