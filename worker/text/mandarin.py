"""Mandarin Chinese (`z`): the runs of Chinese in a text -> their words, each with Kokoro's phonemes.

Kokoro v1.0 was trained on misaki's "legacy" Mandarin G2P (`misaki.zh.ZHG2P()` without a version):
numbers read out by cn2an, words cut by jieba, each word's pinyin (pypinyin) mapped to IPA with the
tone as an arrow. We keep exactly that per-word mapping, so a sentence comes out as misaki gives it,
but return the words one by one, so chunks can end between them and timestamps can name them.

Loaded on the first Mandarin request (jieba's dictionary and pypinyin's tables: 0.6 s and 116 MB
of a replica's memory; replicas that never see Chinese never pay it).
"""

from __future__ import annotations

import logging
import os
import threading
from functools import lru_cache

import regex

from worker.text.source_map import MappedText, plain_or_mapped

log = logging.getLogger(__name__)

_HAN_OR_NOT = regex.compile(r"(\p{Han}+)|(\P{Han}+)")
_lock = threading.Lock()
_segmenter_cache_dir: str | None = None


def use_segmenter_cache(cache_dir: str) -> None:
    """Keep jieba's parsed dictionary in `cache_dir` (KOKORO_CACHE_DIR) rather than the system's
    temporary directory; takes effect if called before the first Mandarin text is read."""
    global _segmenter_cache_dir
    _segmenter_cache_dir = cache_dir


@lru_cache(maxsize=1)
def _segmenter():
    """jieba's default tokenizer, its dictionary loaded (about 0.5 s; jieba caches the parsed
    dictionary in a file, in the directory `use_segmenter_cache` names)."""
    import jieba

    jieba.setLogLevel(logging.WARNING)  # it prints its loading progress at INFO otherwise
    if _segmenter_cache_dir is not None:
        try:
            os.makedirs(_segmenter_cache_dir, exist_ok=True)
            jieba.dt.tmp_dir = str(_segmenter_cache_dir)
        except OSError:  # a read-only home: jieba falls back to the system's temporary directory
            pass
    jieba.dt.initialize()
    return jieba.dt


# A run of 7 or more digits is a phone number, an ID or an order number, and one with a leading 0 an
# area code ("010"): read digit by digit, 1 as 幺 (yāo) as Chinese speakers say it in numbers, not
# as one amount ("13812345678" would be 一百三十八亿...).
_DIGIT_RUN = regex.compile(r"(?<![\d.,])(?:\d{7,}|0\d{2,})(?![\d.]|,\d)")  # not a part of 1,400,000
_DIGITS = str.maketrans("0123456789", "零幺二三四五六七八九")


@plain_or_mapped
def digit_strings(text: MappedText) -> MappedText:
    """Phone, order and area-code numbers as digits read one by one ("13812345678" ->
    "幺三八幺二三四五六七八"), before anything reads them as amounts."""
    return text.sub(_DIGIT_RUN, lambda m: m.group(0).translate(_DIGITS))


@plain_or_mapped
def spoken_numbers(text: MappedText) -> MappedText:
    """Arabic numerals -> Chinese numerals as read ("2024年" -> "二零二四年", "50%" -> "百分之五十");
    cn2an rewrites the whole text, so the result is mapped by what it kept."""
    import cn2an

    if not _HAS_DIGIT.search(text.text):
        return text  # nothing for cn2an to read (its transform is the identity on such text)
    try:
        return text.aligned(cn2an.transform(text.text, "an2cn"))
    except (ValueError, KeyError, IndexError) as exc:  # cn2an raises on shapes it cannot read
        log.debug("cn2an could not read numbers in %r: %s", text.text, exc)
        return text


_HAS_DIGIT = regex.compile(r"\d")


def _word_phonemes(word: str) -> str:
    from misaki.zh import ZHG2P

    try:
        ipa = ZHG2P.word2ipa(word)
    except ValueError:  # a Han character pypinyin has no reading for (々, Japanese's repeat mark)
        if len(word) == 1:
            log.debug("no Mandarin reading for %r", word)
            return ""
        return "".join(_word_phonemes(ch) for ch in word)  # the characters it can read, read
    # U+032F (combining inverted breve) marks non-syllabic vowels in misaki's IPA; Kokoro's
    # vocabulary has no such symbol, and misaki's legacy path drops it too.
    return ipa.replace("\u032f", "")


def mandarin_words(parts: list[str], read: list[bool]) -> list[list[tuple[str, str, int, int]]]:
    """The words, with phonemes, of each part to `read` (a run of Chinese text without spaces or
    punctuation), each with where it stands in its part ([start, end)). Characters that are
    neither Han nor read by cn2an (a stray symbol, kana) come back as words with no phonemes."""
    out: list[list[tuple[str, str, int, int]]] = []
    with _lock:  # jieba's tokenizer is shared; the text frontend runs in several threads
        for part, to_read in zip(parts, read):
            words: list[tuple[str, str, int, int]] = []
            # The normalizer has read the numbers already unless the request turned it off; misaki
            # reads them either way, and on text without digits this is a no-op.
            spoken = spoken_numbers(MappedText.of(part)) if to_read else MappedText.of("")
            for m in _HAN_OR_NOT.finditer(spoken.text):
                if m.group(1):
                    at = m.start()
                    for w in _segmenter().lcut(m.group(1), HMM=True):
                        words.append((w, _word_phonemes(w), *spoken.span(at, at + len(w))))
                        at += len(w)
                else:
                    words.append((m.group(2), "", *spoken.span(m.start(), m.end())))
            out.append(words)
    return out
