"""G2P, table-driven: text (normalized first, as a request is) -> the phonemes Kokoro reads.

Expected strings are written by hand in misaki's symbols (A = eɪ, I = aɪ, O = oʊ, W = aʊ, Y = ɔɪ,
Q = GB əʊ, ᵊ = reduced vowel, T = the US flap, ɹ = r), from misaki's conventions for stress,
suffixes, and the words whose sound depends on the next one. Then: every lexicon word comes out as
its lexicon entry (read here straight from misaki's JSON, not through our code), and an invented
word comes out as espeak-ng's own reading (read here from the espeak-ng binary).
"""

from __future__ import annotations

import importlib.resources
import json
import random
import shutil
import subprocess

import pytest

from worker.text import text_to_chunks
from worker.text.english import english_g2p
from worker.text.espeak import to_misaki_english

G2P_CASES = [
    # (text, lang_code, expected phonemes)
    ("cat", "a", "kˈæt"),
    ("The cat.", "a", "ðə kˈæt."),
    ("the apple", "a", "ði ˈæpᵊl"),
    ("Hello, world!", "a", "həlˈO, wˈɜɹld!"),
    ("water", "a", "wˈɔTəɹ"),
    ("butter", "a", "bˈʌTəɹ"),
    ("city", "a", "sˈɪTi"),
    ("meeting", "a", "mˈiTɪŋ"),
    ("dogs", "a", "dˈɔɡz"),
    ("cups", "a", "kˈʌps"),
    ("boxes", "a", "bˈɑksᵻz"),
    ("wanted", "a", "wˈɑntᵻd"),
    ("delivered", "a", "dəlˈɪvəɹd"),
    ("played", "a", "plˈAd"),
    ("sitting", "a", "sˈɪTɪŋ"),
    ("I want to eat", "a", "ˌI wˈɑnt tʊ ˈit"),
    ("go to bed", "a", "ɡˌO tə bˈɛd"),
    ("an hour", "a", "ɐn ˈWəɹ"),
    ("a dog", "a", "ɐ dˈɔɡ"),
    ("Plan A.", "a", "plˈæn ˈA."),
    ("FBI", "a", "ˌɛfbˌiˈI"),
    ("The U.S. economy", "a", "ðə jˌuˈɛs ikˈɑnəmi"),
    ("HELLO", "a", "həlˈO"),
    ("NASA", "a", "nˈæsə"),
    ("don't", "a", "dˈOnt"),
    ("Say [Kokoro](/kˈOkəɹO/) now", "a", "sˈA kˈOkəɹO nˈW"),
    ('"Hi," she said.', "a", "“hˈI,” ʃi sˈɛd."),
    ("Yes — no", "a", "jˈɛs — nˈO"),
    ("Wait... what?", "a", "wˈAt… wˌʌt?"),
    ("(aside)", "a", "(əsˈId)"),
    ("hi 😀", "a", "hˈI"),
    ("hi 中文", "a", "hˈI"),
    ("$5", "a", "fˈIv dˈɑləɹz"),
    ("3 cats", "a", "θɹˈi kˈæts"),
    ("in 1987", "a", "ɪn nˌIntˈin ˌATisˈɛvən"),
    ("at noon", "a", "æt nˈun"),
    ("print the error", "a", "pɹˈɪnt ði ˈɛɹəɹ"),
    # British English: misaki's GB lexicon
    ("hello", "b", "həlˈQ"),
    ("water", "b", "wˈɔːtə"),
    ("the news", "b", "ðə njˈuːz"),
    ("tomorrow", "b", "tʊmˈɒɹQ"),
    # espeak-ng languages
    ("hola", "e", "ˈola"),
    ("casa", "e", "kˈasa"),
    ("bonjour", "f", "bɔ̃ʒˈuʁ"),
    ("ciao", "i", "ʧˈao"),
]


def _spoken(text: str, lang: str) -> str:
    return " ".join(c.phonemes for c in text_to_chunks(text, lang) if c.phonemes)


@pytest.mark.parametrize("text, lang, expected", G2P_CASES, ids=[f"{c[1]}:{c[0][:30]}" for c in G2P_CASES])
def test_g2p(text, lang, expected):
    assert _spoken(text, lang) == expected


def _lexicon(name: str) -> dict:
    with importlib.resources.files("misaki.data").joinpath(name).open(encoding="utf-8") as f:
        return json.load(f)


# Function words whose sound depends on the next word (misaki special-cases them too).
_CONTEXTUAL = {"a", "an", "am", "the", "to", "in", "i", "by", "used", "vs"}


@pytest.mark.parametrize("accent, files", [("a", ("us_gold.json", "us_silver.json")),
                                           ("b", ("gb_gold.json", "gb_silver.json"))])
def test_lexicon_words_give_the_lexicon_phonemes(accent, files):
    gold, silver = (_lexicon(f) for f in files)
    g2p = english_g2p(accent == "b")
    rng = random.Random(7)
    plain = [w for w, v in gold.items() if isinstance(v, str) and w.isalpha() and w.islower()
             and w not in _CONTEXTUAL]
    silver_only = [w for w, v in silver.items() if isinstance(v, str) and w.isalpha() and w.islower()
                   and w not in gold and w not in _CONTEXTUAL]
    for word in rng.sample(plain, 300) + rng.sample(silver_only, 100):
        entry = gold.get(word, silver.get(word))
        expected = entry.replace("ɾ", "T").replace("ʔ", "t")
        result = g2p.word(word)
        assert (result.phonemes, result.source) == (expected, "lexicon"), word


def _espeak_binary(word: str, voice: str) -> str:
    out = subprocess.run(["espeak-ng", "-q", "--ipa", "--tie=^", "-v", voice, word], capture_output=True,
                         text=True, check=True).stdout
    return " ".join(out.split())


@pytest.mark.skipif(shutil.which("espeak-ng") is None, reason="espeak-ng binary not installed")
@pytest.mark.parametrize("word", ["blorfington", "zandrapelix", "quornishly", "Kokoro"])
def test_invented_words_give_espeak_phonemes(word):
    result = english_g2p(False).word(word)
    assert result.source == "espeak"
    assert result.phonemes == to_misaki_english(_espeak_binary(word, "en-us"), british=False)
    assert result.phonemes  # espeak-ng read something
