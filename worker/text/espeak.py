"""espeak-ng through its C library (ctypes), mapped onto misaki's phoneme set.

Why the library and not the `espeak-ng` binary: one process call costs milliseconds, one library
call about 0.05 ms, and phonemizing a request must stay a rounding error next to synthesizing it.
Why not the `phonemizer` package: it is a thin wrapper over the same call and pulls more than we use.

espeak-ng keeps global state (the selected voice) and is not thread-safe, so every call holds one
process-wide lock; results are cached per (language, text), because the same words recur constantly.

The output of espeak-ng is IPA; Kokoro v1.0 was trained on misaki's symbols, which write the English
diphthongs as single capitals (`aɪ` -> `I`, `oʊ` -> `O`, ...). We ask espeak-ng to tie the letters
of multi-letter phonemes with `^` so a diphthong is told apart from two neighbouring vowels, then map.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import re
import threading
from functools import lru_cache

_AUDIO_OUTPUT_SYNCHRONOUS = 0x02
_INITIALIZE_DONT_EXIT = 0x8000
_CHARS_UTF8 = 1
_TIE = "^"
# espeak_TextToPhonemes phoneme mode: bit 1 = IPA output, bit 7 = use bits 8.. as the tie character.
_PHONEME_MODE = 0x02 | 0x80 | (ord(_TIE) << 8)


class EspeakUnavailable(RuntimeError):
    """libespeak-ng is missing: install the `espeak-ng` system package."""


# English (US and GB): espeak-ng IPA -> misaki. Longest patterns are replaced first.
_EN_COMMON = {
    "ʔˌn\u0329": "ʔn", "ʔn\u0329": "ʔn",
    "a^ɪ": "I", "a^ʊ": "W", "e^ɪ": "A", "ɔ^ɪ": "Y",
    "d^ʒ": "ʤ", "t^ʃ": "ʧ",
    "ə^l": "ᵊl",
    "ʲo": "jo", "ʲə": "jə", "ʲ": "",
    "ɚ": "əɹ", "r": "ɹ", "x": "k", "ç": "k", "ɐ": "ə", "ɬ": "l",
    "\u0303": "",  # nasalization marks: not in the English set
    "e": "A",      # a lone e (only in diphthong-less espeak spellings) is misaki's A
}
# Accent-specific: the diphthongs first (before the common table maps a lone `e`), then vowel length.
_EN_US_BEFORE = (("o^ʊ", "O"),)
_EN_US_AFTER = (("ɜːɹ", "ɜɹ"), ("ɜː", "ɜɹ"), ("ɪə", "iə"), ("ː", ""))
_EN_GB_BEFORE = (("e^ə", "ɛː"), ("ə^ʊ", "Q"))
_EN_GB_AFTER = (("iə", "ɪə"),)

# Other languages: only the affricates and diphthongs that misaki writes as one symbol.
_OTHER = {
    "a^ɪ": "I", "a^ʊ": "W", "d^z": "ʣ", "d^ʒ": "ʤ", "e^ɪ": "A", "o^ʊ": "O", "ə^ʊ": "Q",
    "s^s": "S", "t^s": "ʦ", "t^ʃ": "ʧ", "ɔ^ɪ": "Y",
}

_SYLLABIC = re.compile(r"(\S)\u0329")
_LANGUAGE_FLAG = re.compile(r"\([a-z^]{2,6}(?:-[a-z0-9^]+)*\)")  # "(en)" when espeak switches language


def _sorted_longest_first(table: dict[str, str]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted(table.items(), key=lambda kv: -len(kv[0])))


_EN_TABLE = _sorted_longest_first(_EN_COMMON)
_OTHER_TABLE = _sorted_longest_first(_OTHER)


class _VoiceSpec(ctypes.Structure):
    # espeak_VOICE from speak_lib.h; only `languages` is filled to select a voice by language.
    _fields_ = [
        ("name", ctypes.c_char_p), ("languages", ctypes.c_char_p), ("identifier", ctypes.c_char_p),
        ("gender", ctypes.c_ubyte), ("age", ctypes.c_ubyte), ("variant", ctypes.c_ubyte),
        ("xx1", ctypes.c_ubyte), ("score", ctypes.c_int), ("spare", ctypes.c_void_p),
    ]


class _Espeak:
    """The loaded library and the voice currently selected in it."""

    def __init__(self) -> None:
        path = ctypes.util.find_library("espeak-ng") or "libespeak-ng.so.1"
        try:
            lib = ctypes.cdll.LoadLibrary(path)
        except OSError as exc:
            raise EspeakUnavailable(
                "libespeak-ng not found: install the espeak-ng system package (apt-get install espeak-ng)"
            ) from exc
        if lib.espeak_Initialize(_AUDIO_OUTPUT_SYNCHRONOUS, 0, None, _INITIALIZE_DONT_EXIT) <= 0:
            raise EspeakUnavailable("espeak-ng failed to initialize (is espeak-ng-data installed?)")
        lib.espeak_SetVoiceByProperties.argtypes = [ctypes.POINTER(_VoiceSpec)]
        lib.espeak_SetVoiceByProperties.restype = ctypes.c_int
        lib.espeak_TextToPhonemes.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_int, ctypes.c_int]
        lib.espeak_TextToPhonemes.restype = ctypes.c_char_p
        self.lib = lib
        self.voice: str | None = None

    def phonemes(self, text: str, voice: str) -> str:
        """Raw espeak-ng IPA (with `^` ties) of `text`; clauses joined by spaces."""
        if voice != self.voice:
            spec = _VoiceSpec(languages=voice.encode())
            if self.lib.espeak_SetVoiceByProperties(ctypes.byref(spec)) != 0:
                raise ValueError(f"espeak-ng has no voice {voice!r}")
            self.voice = voice
        buffer = ctypes.create_string_buffer(text.encode("utf-8", "replace"))
        cursor = ctypes.c_void_p(ctypes.addressof(buffer))
        parts: list[str] = []
        # Each call consumes one clause and advances the cursor; it becomes NULL at the end.
        while cursor.value:
            out = self.lib.espeak_TextToPhonemes(ctypes.byref(cursor), _CHARS_UTF8, _PHONEME_MODE)
            if out:
                parts.append(out.decode("utf-8", "replace").strip())
        return " ".join(p for p in parts if p)


_lock = threading.Lock()
_engine: _Espeak | None = None


def _espeak() -> _Espeak:
    global _engine
    if _engine is None:
        _engine = _Espeak()
    return _engine


def available() -> bool:
    try:
        with _lock:
            _espeak()
        return True
    except EspeakUnavailable:
        return False


@lru_cache(maxsize=1 << 16)
def raw_phonemes(text: str, voice: str) -> str:
    """espeak-ng's IPA for `text` in `voice` (e.g. `en-us`, `fr-fr`), ties included. Cached."""
    with _lock:
        return _espeak().phonemes(text, voice)


def to_misaki_english(ipa: str, british: bool) -> str:
    """Map espeak-ng English IPA onto misaki's US or GB symbols (as Kokoro v1.0 was trained on)."""
    ps = ipa
    for old, new in (_EN_GB_BEFORE if british else _EN_US_BEFORE):
        ps = ps.replace(old, new)
    for old, new in _EN_TABLE:
        ps = ps.replace(old, new)
    ps = _SYLLABIC.sub(r"ᵊ\1", ps).replace("\u0329", "")
    for old, new in (_EN_GB_AFTER if british else _EN_US_AFTER):
        ps = ps.replace(old, new)
    ps = ps.replace("o", "ɔ")  # older espeak-ng spells the THOUGHT vowel as o
    ps = ps.replace("ɾ", "T").replace("ʔ", "t")  # Kokoro v1.0's flap and glottal stop symbols
    return ps.replace(_TIE, "")


def to_misaki_other(ipa: str) -> str:
    """Map espeak-ng IPA of a non-English language onto misaki's symbols."""
    ps = _LANGUAGE_FLAG.sub("", ipa)
    for old, new in _OTHER_TABLE:
        ps = ps.replace(old, new)
    return ps.replace(_TIE, "").replace("-", "")


@lru_cache(maxsize=1 << 16)
def english_word(word: str, british: bool) -> str:
    """Phonemes of one English word that is not in the lexicon, in misaki's symbols."""
    return to_misaki_english(raw_phonemes(word, "en-gb" if british else "en-us"), british)


def other_language(text: str, voice: str) -> str:
    """Phonemes of text in an espeak-ng language (`es`, `fr-fr`, `hi`, `it`, `pt-br`)."""
    return to_misaki_other(raw_phonemes(text, voice))
