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

The file may change while the server runs (a new brand name, a fixed pronunciation): `load_lexicon`
looks at the file's size and modification time at most every `RECHECK_S` and reads it again when
they changed, so every worker process speaks the new entries within a second, without a restart
that would drain the streams in flight. A malformed edit (or a file half written) does not take:
the entries read last stay in force, the error is logged once, and `lexicon_status` (in /health)
shows it until the file is mended.
"""

from __future__ import annotations

import json
import logging
import os
import re
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from worker.text.markup import KOKORO_MARKUP
from worker.text.source_map import MappedText, plain_or_mapped

log = logging.getLogger("kokoro_fleet.text")

ALL_LANGUAGES = "*"
# How often a served lexicon file is looked at (a stat, microseconds) for changes.
RECHECK_S = 1.0
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

    def mark(self, text: str | MappedText, lang_code: str) -> str | MappedText:
        """`text` with every entry of `lang_code` turned into a pronunciation link (see the module
        docstring); existing links and pause tags are left as they are. A MappedText stays mapped:
        the link's word maps to the word as written."""
        pattern, words = self._matcher(lang_code)
        if pattern is None:
            return text
        return _marked(text, pattern, words)

    def _matcher(self, lang_code: str) -> tuple[re.Pattern | None, dict[str, str]]:
        if lang_code not in self._matchers:
            words = self.words(lang_code)
            self._matchers[lang_code] = (_pattern(words), words)
        return self._matchers[lang_code]


@plain_or_mapped
def _marked(text: MappedText, pattern: re.Pattern, words: dict[str, str]) -> MappedText:
    def link(m: re.Match) -> str:
        written = m.group(0)
        return f"[{written}](/{words.get(written) or words[written.lower()]}/)"

    out, last = [], 0
    for m in KOKORO_MARKUP.finditer(text.text):
        out += [text[last:m.start()].sub(pattern, link), text[m.start():m.end()]]
        last = m.end()
    out.append(text[last:].sub(pattern, link))
    return MappedText.join(out)


def _pattern(words: dict[str, str]) -> re.Pattern | None:
    """One pattern for all of `words`, longest first (a phrase wins over its first word); a lowercase
    entry ignores case, one with capitals does not."""
    if not words:
        return None
    alternatives = "|".join(re.escape(w) if w != w.lower() else f"(?i:{re.escape(w)})"
                            for w in sorted(words, key=len, reverse=True))
    # Whole words: not inside another word, an address (example.com, a@b.org) or a hyphenated name.
    return re.compile(rf"(?<![\w@/.\-])(?:{alternatives})(?![\w@\-])(?!\.\w)")


def load_lexicon(path: str | None) -> Lexicon:
    """The lexicon in the JSON file at `path` (None or empty: none), as the file now stands (see the
    module docstring). The first read raises LexiconError if the file cannot be read or an entry is
    malformed; a later change that fails keeps the lexicon read before."""
    if not path:
        return Lexicon()
    with _watched_lock:
        watched = _watched.setdefault(str(path), _WatchedFile(str(path)))
    return watched.current()


def lexicon_status(path: str | None) -> dict | None:
    """What this process serves from `path`: its entries, when it read them, and the error of a
    change that did not take (None: no lexicon, or not read yet)."""
    watched = _watched.get(str(path)) if path else None
    return watched.status() if watched is not None else None


class _WatchedFile:
    def __init__(self, path: str):
        self.path = path
        self.lexicon: Lexicon | None = None
        self.stamp: tuple | None = None   # the file as last read (or last failed to read)
        self.checked = -float("inf")      # time.monotonic() of the last look
        self.read_at = 0.0                # time.time() of the last good read
        self.error: str | None = None     # why the file as it stands now is not in force
        self.lock = threading.Lock()      # the text-frontend thread and the event loop both plan

    def current(self) -> Lexicon:
        with self.lock:
            now = time.monotonic()
            if self.lexicon is not None and now - self.checked < RECHECK_S:
                return self.lexicon
            self.checked = now
            stamp = _stamp(self.path)
            if self.lexicon is not None and stamp == self.stamp:
                return self.lexicon
            try:
                lexicon = read_lexicon(self.path)
            except LexiconError as e:
                if self.lexicon is None:
                    raise
                self.stamp, self.error = stamp, str(e)  # tried once per version of the file
                log.error("%s; the %d entries read before stay in force until the file is mended",
                          e, _count(self.lexicon))
                return self.lexicon
            if self.lexicon is not None:
                log.info("pronunciations from %s read again: %d entries", self.path, _count(lexicon))
            self.lexicon, self.stamp, self.error, self.read_at = lexicon, stamp, None, time.time()
            return lexicon

    def status(self) -> dict:
        with self.lock:
            return {"path": self.path, "entries": _count(self.lexicon) if self.lexicon is not None else 0,
                    "read_at": round(self.read_at, 3), "error": self.error}


_watched: dict[str, _WatchedFile] = {}
_watched_lock = threading.Lock()


def _stamp(path: str) -> tuple | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_ino, st.st_size, st.st_mtime_ns


def _count(lexicon: Lexicon) -> int:
    return sum(map(len, lexicon.entries.values()))


def read_lexicon(path: str) -> Lexicon:
    """The lexicon in the JSON file at `path`, read now; LexiconError if it cannot be read or an
    entry is malformed: a word that is empty or holds brackets, phonemes outside Kokoro's alphabet,
    a section that is not a language code."""
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
