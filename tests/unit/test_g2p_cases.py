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
import sys
from pathlib import Path

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


# libespeak-ng 1.51 (Debian's) dies with SIGSEGV on some mixed strings, which would take a whole
# worker down with every request in it; misaki's Japanese and Mandarin readers raised on others (a
# 500 for the request). Each of these broke one of them before.
G2P_BREAKERS = ["_-的", "(-的)", "'-の", "!—'-人Ϝ", "_-ॊ不ऽ%ち", "dΑy_- ^Π-.$ …_-Όऽ-", "---लच्छेद", "a---लच्छेद",
                "९ बजे", "٣", "トンョ", "}ンャ*わ", "日々", "や い% 々ずセ"]
_CHILD = """
import sys
from worker.text import text_to_chunks
from worker.text.text_errors import TextError
for line in sys.stdin:
    try:
        text_to_chunks(line.rstrip("\\n"), sys.argv[1])
    except TextError:
        pass
    print("ok", flush=True)
"""


def _mixed_scripts(rng: random.Random) -> str:
    letters = ("abcdéñçãZ0123456789" + "".join(map(chr, range(0x0900, 0x097F))) + "".join(map(chr, range(0x0370, 0x03FF)))
               + "的是不人我中大日あのナちンャゃょっー々３٣한🙂\u0301\u200b")
    marks = ["_", "-", "'", ".", ",", "!", "?", "(", ")", "—", "…", "--", "---", "_-", "'-", "%", "$", "@"]
    return " ".join("".join(rng.choice(letters) if rng.random() < 0.6 else rng.choice(marks) for _ in range(rng.randint(1, 8)))
                    for _ in range(rng.randint(1, 6)))


@pytest.mark.parametrize("lang", ["h", "e", "f", "i", "p", "a", "j", "z"])
def test_mixed_scripts_never_break_the_g2p(lang):
    rng = random.Random(5)
    lines = G2P_BREAKERS + [_mixed_scripts(rng) for _ in range(3000)]
    child = subprocess.run([sys.executable, "-c", _CHILD, lang], input="\n".join(lines) + "\n", capture_output=True,
                           text=True, timeout=300, cwd=Path(__file__).resolve().parents[2])
    done = child.stdout.count("ok")
    assert child.returncode == 0, f"the G2P died (rc {child.returncode}) on {lines[done]!r}"
    assert done == len(lines)


def test_espeak_languages_skip_what_their_reader_cannot_read():
    from worker.text.g2p import espeak_readable, text_to_tokens

    tokens = text_to_tokens("di 你好 y नमस्ते ahora", "e")
    assert [t.source for t in tokens] == ["espeak", "silent", "espeak", "silent", "espeak"]  # not "chino símbolo"
    assert text_to_tokens("नमस्ते hello", "h")[0].phonemes  # Devanagari is Hindi's own
    assert espeak_readable("--l'homme--", "fr-fr") == "l'homme"
    assert espeak_readable("c'est-à-dire", "fr-fr") == "c'est-à-dire"


def test_japanese_words_group_as_misaki_groups_them():
    """Our linear grouping of MeCab's words into misaki's dictionary words (misaki's own is cubic in
    a run's length) gives misaki's tokens, spacing included, on random Japanese of every shape."""
    import jaconv
    from misaki.cutlet import Cutlet, Word

    from worker.text.japanese import _reader

    ours, misaki = _reader(), Cutlet()
    rng = random.Random(3)
    pool = ("東京大学の日本語を話す人がいます。今日は、とても暑いですね！「ありがとう」と言った。"
            "コンピューターでプログラムを書く。ちょっと待ってください… 1234 abc ーっッゃ々（）")
    checked = 0
    for _ in range(400):
        text = misaki._normalize_text("".join(rng.choice(pool) for _ in range(rng.randint(1, 120))))
        words = [Word(w.surface, jaconv.kata2hira(w.feature.pron or w.feature.kana or w.surface),
                      6 if w.char_type == 7 or not w.is_unk else w.char_type) for w in misaki.tagger(text)]
        try:
            expected = [(t.surface, t.space) for t in misaki._romaji_tokens(words)]
        except (KeyError, AssertionError):  # misaki's own failures, which ours reads around
            continue
        ours.surfaces = []
        assert [(t.surface, t.space) for t in ours._romaji_tokens(words)] == expected, text
        assert len(ours.surfaces) == len(expected)
        checked += 1
    assert checked > 300
