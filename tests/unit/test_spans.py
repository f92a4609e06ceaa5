"""Word spans: every spoken word points at the characters of the request's input it was read from
(worker/text/source_map.py), through every reader of the text frontend.

The golden cases are written `word` where the word was read as written, `word='source'` where it was
read from other characters ("twelve='$12.99'")."""

from __future__ import annotations

import re

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from api.settings import Settings
from api.speech.contract import SpeechRequest
from api.speech.local import SpeechService
from worker.text import Lexicon, NormalizationOptions, phonemes_to_chunks, text_to_chunks
from worker.text.source_map import MappedText
from worker.voices import VoiceBank
from worker.weights import VOICE_NAMES

UNITS = NormalizationOptions(unit_normalization=True)
LEXICON = Lexicon({"*": {"Kokoro": "kˈOkəɹO", "New York": "nˈu jˈɔɹk"}})


def read(text: str, lang: str = "a", **kwargs) -> str:
    """Each spoken word of `text`, with the input it was read from where that is not the word."""
    words = [(w.text, text[w.input_start:w.input_end]) for c in text_to_chunks(text, lang, **kwargs) for w in c.words]
    return " ".join(word if word == source else f"{word}={source!r}" for word, source in words)


GOLDEN = [  # (reader, text, language, options, what is read from where)
    ("numbers", "It is 1,284 or 3.5, the 1990s, the 21st, 1/2 and Chapter IV.", "a", {},
     "It is one='1,284' thousand='1,284' two='1,284' hundred='1,284' eighty-four='1,284' or three='3.5' "
     "point='3.5' five='3.5' the nineteen='1990s' nineties='1990s' the twenty-first='21st' one='1/2' half='1/2' "
     "and Chapter four='IV'"),
    ("money", "It costs $12.99, €4,20 or $2M.", "a", {},
     "It costs twelve='$12.99' dollars='$12.99' and='$12.99' ninety-nine='$12.99' cents='$12.99' four='€4,20' "
     "euros='€4,20' and='€4,20' twenty='€4,20' cents='€4,20' or two='$2M' million='$2M' dollars='$2M'"),
    ("money range", "It costs $5-10.", "a", {},
     "It costs five='$5-10' to='$5-10' ten='$5-10' dollars='$5-10'"),
    ("dates", "Born 2024-03-15, due 3/4/2025, on Jan 5th.", "a", {},
     "Born March='2024-03-15' fifteenth='2024-03-15' twenty='2024-03-15' twenty-four='2024-03-15' due "
     "March='3/4/2025' fourth='3/4/2025' twenty='3/4/2025' twenty-five='3/4/2025' on January='Jan 5th' "
     "fifth='Jan 5th'"),
    ("times", "At 10:30am, Mon-Fri 9-5pm, 14:05.", "a", {},
     "At ten='10:30am' thirty='10:30am' AM='10:30am' Monday='Mon-Fri' to='Mon-Fri' Friday='Mon-Fri' "
     "nine='9-5pm' to='9-5pm' five='9-5pm' PM='9-5pm' fourteen='14:05' oh='14:05' five='14:05'"),
    ("units", "A 5 km run at 72°F, 50% done in 3 hrs.", "a", {"options": UNITS},
     "A five='5 km' kilometers='5 km' run at seventy-two='72°F' degrees='72°F' Fahrenheit='72°F' fifty='50%' "
     "percent='50%' done in three='3 hrs.' hours='3 hrs.'"),
    ("abbreviations", "Dr. Patel met Mr. Smith on Elm St. e.g. today.", "a", {},
     "Doctor='Dr.' Patel met Mister='Mr.' Smith on Elm Street='St.' for='e.g.' example='e.g.' today"),
    ("phone numbers", "Call 1-800-555-0199 or +44 20 7946 0958.", "a", {},
     "Call " + " ".join(f"{w}='1-800-555-0199'" for w in "one eight hundred five five five zero one nine nine".split())
     + " or " + " ".join(f"{w}='+44 20 7946 0958'"
                         for w in "plus four four two zero seven nine four six zero nine five eight".split())),
    ("URLs and emails", "Mail a.b@example.com or see https://example.com/docs.", "a", {},
     "Mail " + " ".join(f"{w}='a.b@example.com'" for w in "a dot b at example dot com".split()) + " or see "
     + " ".join(f"{w}='https://example.com/docs.'" for w in "example dot com slash docs".split())),
    ("the lexicon", "Kokoro loves New York, unlike kokoro-tts.", "a", {"lexicon": LEXICON},
     "Kokoro loves New York unlike kokoro-tts"),
    ("custom pronunciations", "Say [Kokoro](/kˈOkəɹO/) now.", "a", {}, "Say Kokoro now"),
    ("Markdown", "# Steps\n1. **Mix** the [flour](https://x.org/flour)\n- Bake `well`\n```\ncode here\n```\n"
                 "| a | 12 |\n|---|---|\nDone.", "a", {},
     "Steps one='1' Mix the flour Bake well a twelve='12' Done"),
    ("HTML", "<p>Hello <b>bold</b> &amp; <i>more</i>&nbsp;here</p>", "a", {}, "Hello bold and='&amp;' more here"),
    ("SSML", '<speak>Hi <say-as interpret-as="characters">XJ4</say-as>, <sub alias="World Wide Web">WWW</sub>'
             '<break time="500ms"/> <phoneme alphabet="ipa" ph="kəˈkɔɹoʊ">Kokoro</phoneme>.</speak>', "a", {},
     "Hi X='XJ4' J='XJ4' four='XJ4' World='WWW' Wide='WWW' Web='WWW' Kokoro"),
    ("pause tags", "One $1. [pause:0.5s] Two.", "a", {}, "One one='$1' dollar='$1' Two"),
    ("text clean-up", "hel\u00adlo \uff13 worlds", "a", {}, "hello=" + repr("hel\u00adlo") + " three='\uff13' worlds"),
    ("Mandarin", "我有3个苹果，50%的人。", "z", {}, "我 有 三个='3个' 苹果 百分之五十='50%' 的 人"),
    ("Japanese", "一人3000円で、ｶﾀｶﾅを書いた。", "j", {}, "一人 三千='3000' 円 で カタカナ='ｶﾀｶﾅ' を 書いた"),
    ("Spanish", "Cuesta 25,50 € (50%).", "e", {}, "Cuesta 25,50 euros='€' 50='50%' por='50%' ciento='50%'"),
    ("French", "Le 01/04/2025 à 14h30.", "f", {},
     "Le premier='01/04/2025' avril='01/04/2025' 2025='01/04/2025' à 14='14h30' heures='14h30' 30='14h30'"),
    ("Hindi", "नमस्ते 50% दुनिया", "h", {}, "नमस्ते 50='50%' प्रतिशत='50%' दुनिया"),
    ("Italian", "Costa 5 € al 50%.", "i", {}, "Costa 5 euro='€' al 50='50%' per='50%' cento='50%'"),
    ("Portuguese", "Custa R$ 20 às 14h.", "p", {}, "Custa 20='R$ 20' reais='R$ 20' às 14='14h' horas='14h'"),
    ("British English", "The colour is 12.5% off on 3/4.", "b", {},
     "The colour is twelve='12.5%' point='12.5%' five='12.5%' percent='12.5%' off on the='3/4' third='3/4' "
     "of='3/4' April='3/4'"),
]


@pytest.mark.parametrize("reader, text, lang, options, expected", GOLDEN, ids=[case[0] for case in GOLDEN])
def test_every_reader_points_its_words_at_what_they_were_read_from(reader, text, lang, options, expected):
    assert read(text, lang, **options) == expected


def test_a_long_text_keeps_its_spans_across_its_chunks():
    sentences = [f"Sentence {k} ends here." for k in range(1, 41)]
    text = " ".join(sentences)
    chunks = text_to_chunks(text, first_chunk_phonemes=20, chunk_phonemes=60)
    assert len(chunks) > 10
    words = [w for c in chunks for w in c.words]
    at = 0
    for k, sentence in enumerate(sentences, start=1):
        start = text.index(sentence, at)
        said = [w for w in words if start <= w.input_start < start + len(sentence)]
        number = text.index(str(k), start)
        assert [text[w.input_start:w.input_end] for w in said if w.text not in ("Sentence", "ends", "here")] == \
            [str(k)] * (len(said) - 3)
        assert all(w.input_start == number for w in said[1:-2])  # the k-th number, not another sentence's
        at = start + len(sentence)


def test_phonemes_sent_as_input_point_at_their_words():
    phonemes = "hˈɛlO, wˈɜɹld!"
    words = [w for c in phonemes_to_chunks(phonemes) for w in c.words]
    assert [(w.text, phonemes[w.input_start:w.input_end]) for w in words] == [("hˈɛlO", "hˈɛlO"), ("wˈɜɹld", "wˈɜɹld")]


@pytest.fixture(scope="module")
def speech() -> SpeechService:
    gen = torch.Generator().manual_seed(0)
    voices = VoiceBank({name: torch.randn(510, 256, generator=gen) for name in VOICE_NAMES})
    return SpeechService(None, voices, Settings(first_chunk_phonemes=20, chunk_phonemes=60))


@pytest.mark.parametrize("text, voice_tags, expected", [
    ('<speak>Hi there. <voice name="ff_siwis">Bonjour à 14h30.</voice> <prosody rate="slow">Slow $5.</prosody></speak>',
     False, [("Hi", "Hi", None), ("there", "there", None), ("Bonjour", "Bonjour", "ff_siwis"), ("à", "à", "ff_siwis"),
             ("14", "14h30", "ff_siwis"), ("heures", "14h30", "ff_siwis"), ("30", "14h30", "ff_siwis"),
             ("Slow", "Slow", None), ("five", "$5", None), ("dollars", "$5", None)]),
    ("First voice. [voice:am_adam] Second $3. [rate:1.5] Fast [pause:0.3s] end.", True,
     [("First", "First", None), ("voice", "voice", None), ("Second", "Second", "am_adam"), ("three", "$3", "am_adam"),
      ("dollars", "$3", "am_adam"), ("Fast", "Fast", "am_adam"), ("end", "end", "am_adam")]),
    ("¡Hola! [voice:zf_xiaobei] 我有3个苹果。", True,
     [("Hola", "Hola", None), ("我", "我", "zf_xiaobei"), ("有", "有", "zf_xiaobei"), ("三个", "3个", "zf_xiaobei"),
      ("苹果", "苹果", "zf_xiaobei")]),
], ids=["SSML voice and prosody", "voice, rate and pause tags", "a voice tag into another language"])
def test_voice_parts_point_into_the_whole_request(speech, text, voice_tags, expected):
    """The speech service cuts a request at its voices (SSML or tags) and reads each part apart;
    every word still points into the request's input, tags and all."""
    plan = speech.plan(SpeechRequest(text=text, voice="af_heart", voice_tags=voice_tags))
    assert [(w.text, text[w.input_start:w.input_end], c.voice) for c in plan.chunks for w in c.words] == expected


def test_a_rewrite_that_cannot_be_aligned_maps_to_the_smallest_range_known(monkeypatch):
    """cn2an rewrites a Mandarin text whole without saying where; when its output shares nothing
    with its input, each word of it maps to the whole stretch it rewrote (the smallest range known
    to hold it), and the request is still read."""
    import cn2an

    monkeypatch.setattr(cn2an, "transform", lambda text, method: "你们晚安" if text else text)
    text = "第1次，好"
    words = [w for c in text_to_chunks(text, "z") for w in c.words]
    assert "".join(w.text for w in words) == "你们晚安"
    assert all((w.input_start, w.input_end) == (0, len(text)) for w in words)


def test_a_reader_that_loses_track_of_a_word_maps_it_to_its_whole_token(monkeypatch):
    """Mandarin's reader gives each word its place in its token; a word it cannot place (its text
    changed under it) maps to the token it came from, never outside it, never an error."""
    import worker.text.g2p as g2p

    reader, source = g2p.UNSPACED_LANGUAGES["z"]

    def lost(parts, read):  # every word's place unknown: the whole part
        return [[(w, ps, 0, len(part)) for w, ps, _, _ in words] for part, words in zip(parts, reader(parts, read))]

    monkeypatch.setitem(g2p.UNSPACED_LANGUAGES, "z", (lost, source))
    text = "你好，世界很大。"
    assert read(text, "z") == "你好 世界='世界很大' 很大='世界很大'"


def test_map_composition_through_two_rewrites():
    """A rewrite of a rewrite maps to the input, not to the text between: "Dr." read "Doctor",
    then its "c" read "k", still points at "Dr."."""
    text = MappedText.of("see Dr. Who")
    once = text.sub(r"Dr\.", lambda m: "Doctor")
    twice = once.sub("c", lambda m: "k")
    assert twice.text == "see Doktor Who"
    assert twice.span(4, 10) == (4, 7) and twice.span(11, 14) == (8, 11)


# --- generated mixes of readers -------------------------------------------------------------------
# A text is built from items, each a list of (piece, visible): what a reader shows of the text is
# visible; markup (Markdown's signs, tags, a link's target, a pause tag) is not.

def _shown(text: str) -> list[tuple[str, bool]]:
    return [(text, True)]


_n = st.integers(0, 9999)
_ENGLISH_READINGS = st.one_of(
    st.sampled_from(["hello world", "the quick brown fox", "Kokoro", "New York", "it's fine", "U.S. economy"]),
    st.builds("{}".format, st.integers(0, 10**7)),
    st.builds("{:,}".format, st.integers(1000, 10**7)),
    st.builds("{}.{}".format, _n, st.integers(0, 99)),
    st.builds(lambda n: f"{n}{'th' if 10 <= n % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(n % 10, 'th')}", _n),
    st.sampled_from(["1/2", "3/4", "the 1990s", "Chapter IV", "King Henry VIII", "2 1/2"]),
    st.builds("${}.{:02d}".format, _n, st.integers(0, 99)),
    st.builds("€{}".format, _n), st.builds("{} USD".format, _n), st.builds("${}M".format, st.integers(1, 99)),
    st.builds("${}-{}".format, st.integers(1, 50), st.integers(51, 99)),
    st.builds("{}-{:02d}-{:02d}".format, st.integers(1900, 2099), st.integers(1, 12), st.integers(1, 28)),
    st.builds("{}/{}/{}".format, st.integers(1, 12), st.integers(1, 28), st.integers(1900, 2099)),
    st.builds("Jan {}".format, st.integers(1, 28)),
    st.builds("{}:{:02d}".format, st.integers(0, 23), st.integers(0, 59)),
    st.builds("{}:{:02d}pm".format, st.integers(1, 12), st.integers(0, 59)),
    st.builds("{}am".format, st.integers(1, 12)), st.just("Mon-Fri"),
    st.builds("{} km".format, _n), st.builds("{}%".format, _n), st.builds("{}°F".format, _n),
    st.builds("{} hrs".format, st.integers(1, 99)), st.builds("{} mins/day".format, st.integers(1, 99)),
    st.sampled_from(["Dr. Smith", "Elm St.", "e.g. this", "Mr. Jones", "approx. ten", "Main St. is", "etc."]),
    st.sampled_from(["call 555-0100", "(415) 555-0132", "+44 20 7946 0958", "1-800-555-0199"]),
    st.sampled_from(["a.b@example.com", "https://example.com/a?b=1", "example.org", "www.test.io/x"]),
).map(_shown)

_MARKUP_ITEMS = st.sampled_from([
    [("[", False), ("Kokoro", True), ("](/kˈOkəɹO/)", False)],
    [("[pause:0.2s]", False)],
    [("&amp;", False)],
    [('<say-as interpret-as="characters">', False), ("ab1", True), ("</say-as>", False)],
    [('<sub alias="World Wide Web">', False), ("WWW", True), ("</sub>", False)],
    [('<phoneme alphabet="ipa" ph="kəˈkɔɹoʊ">', False), ("Kokoro", True), ("</phoneme>", False)],
])
_WRAPPERS = [("", ""), ("**", "**"), ("*", "*"), ("<b>", "</b>"), ("[", "](https://e.org/p)"), ("`", "`")]


@st.composite
def _english_items(draw) -> list[tuple[str, bool]]:
    if draw(st.integers(0, 5)) == 0:
        return draw(_MARKUP_ITEMS)
    opening, closing = draw(st.sampled_from(_WRAPPERS))
    return [(opening, False), *draw(_ENGLISH_READINGS), (closing, False)]


@st.composite
def _english_text(draw) -> list[list[tuple[str, bool]]]:
    """Lines of items (each line maybe a heading, a list item or a quote), items apart by "; ",
    each line ending its sentence (else a rule may read on into the next line: "0 USD\\n1." is
    "zero one dollar")."""
    items: list[list[tuple[str, bool]]] = []
    for line in range(draw(st.integers(1, 3))):
        prefix = draw(st.sampled_from(["", "# ", "- ", "1. ", "> "]))
        items.append([(".\n" if line else "", False), (prefix, prefix == "1. ")])
        for k in range(draw(st.integers(1, 4))):
            if k:
                items.append([("; ", False)])
            items.append(draw(_english_items()))
    return items


def _check_spans(items: list[list[tuple[str, bool]]], lang: str, **kwargs) -> None:
    text = "".join(piece for item in items for piece, _ in item)
    words = [w for c in text_to_chunks(text, lang, **kwargs) for w in c.words]
    spans = [(w.input_start, w.input_end) for w in words]
    # within the input, each spoken word's span holding something, in order
    assert all(0 <= start < end <= len(text) for start, end in spans), (text, spans)
    assert spans == sorted(spans) and [e for _, e in spans] == sorted(e for _, e in spans), (text, spans)
    at = 0
    extents = []  # each item's [start, end) in the text
    for item in items:
        length = sum(len(piece) for piece, _ in item)
        extents.append((at, at + length))
        for piece, visible in item:
            if visible:  # every word a reader sees is inside some word's span
                for seen in (re.finditer(r"\w", piece) if lang in ("z", "j") else re.finditer(r"\w+", piece)):
                    first, last = at + seen.start(), at + seen.end()
                    assert any(s <= first and last <= e for s, e in spans), (text, piece, seen.group(0), spans)
            at += len(piece)
    for start, end in spans:  # no span reaches past the item it was read from (and the sign after it)
        assert any(s <= start and end <= e + 1 for s, e in extents), (text, text[start:end])


@settings(max_examples=120, deadline=None)
@given(_english_text())
def test_property_english_readers_mixed(items):
    _check_spans(items, "a", lexicon=LEXICON, options=UNITS)


_OTHER_READINGS = {
    "z": st.one_of(st.sampled_from(["你好", "苹果", "世界很大", "我们"]), st.builds("{}个".format, _n),
                   st.builds("{}%".format, _n), st.builds("{}年".format, st.integers(1900, 2099)),
                   st.builds("{}".format, st.integers(10**6, 10**9))),
    "j": st.one_of(st.sampled_from(["こんにちは", "東京", "ｶﾀｶﾅ", "ありがとう"]), st.builds("{}円".format, _n),
                   st.builds("{}人".format, st.integers(1, 99)), st.builds("{}時".format, st.integers(1, 12))),
    "e": st.one_of(st.sampled_from(["hola mundo", "gracias"]), st.builds("{} €".format, _n),
                   st.builds("{}%".format, _n), st.builds("{}:{:02d}".format, st.integers(0, 23), st.integers(0, 59))),
    "f": st.one_of(st.sampled_from(["bonjour", "le monde"]), st.builds("{}h{:02d}".format, st.integers(0, 23),
                                                                       st.integers(0, 59)),
                   st.builds("{:02d}/{:02d}/{}".format, st.integers(1, 28), st.integers(1, 12), st.integers(1900, 2099))),
}


@settings(max_examples=40, deadline=None)
@given(st.sampled_from(sorted(_OTHER_READINGS)).flatmap(
    lambda lang: st.tuples(st.just(lang), st.lists(_OTHER_READINGS[lang], min_size=1, max_size=5))))
def test_property_other_languages_readers_mixed(case):
    lang, readings = case
    separator = "，" if lang == "z" else "、" if lang == "j" else ", "
    items: list[list[tuple[str, bool]]] = []
    for k, reading in enumerate(readings):
        if k:
            items.append([(separator, False)])
        items.append(_shown(reading))
    _check_spans(items, lang)


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(["a", "z", "j", "f"]),
       st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1, max_size=80))
def test_property_any_text_maps_inside_the_input_in_order(lang, text):
    """Whatever the text (any script, signs, markup fragments), its words map inside it, in order."""
    spans = [(w.input_start, w.input_end) for c in text_to_chunks(text, lang) for w in c.words]
    assert all(0 <= start < end <= len(text) for start, end in spans), (text, spans)
    assert spans == sorted(spans) and [e for _, e in spans] == sorted(e for _, e in spans), (text, spans)
