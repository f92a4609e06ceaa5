"""Text as language models and web pages write it -> the words a listener should hear.

An agent's reply comes as Markdown (`**bold**`, `# Heading`, `- item`, `[link](https://...)`,
tables, code spans), and text pulled from a page or written for another TTS engine carries HTML or
SSML tags and entities. Read literally they come out as "number Heading", "about about gone about
about" (`~~gone~~`), "less than b greater than". `read_markup` keeps what a person reading the
rendered text would say, and the punctuation that gives a heading, a list item or a table row its
own sentence:

    "## Steps\\n- **Mix** the [flour](https://x.org/flour)\\n- Bake<break time=\\"500ms\\"/> well"
    -> "Steps.\\nMix the flour.\\nBake[pause:500ms] well."

SSML's `<voice name="am_adam">` and `<prosody rate="slow">` change who reads what they enclose,
and how fast: the speech planner cuts the text there first (`split_speech`), and reads each part
with its own voice and speed. Kokoro-FastAPI's inline tags, `[voice:am_adam]` (the speaker of all
that follows) and `[rate:1.5]` (the pace until the next rate or voice tag), are the same thing
written another way: a request that allows them has them turned into those elements first
(`voice_tags_as_ssml`), with its `voice_aliases` (short names for voices, each with its own pace).

A fenced code block (``` or ~~~) is for the eye: read aloud it is symbols ("for i in range open
paren three close paren colon"), so a listener hears nothing of it. As in CommonMark, a fence
that is never closed runs to the end of the text. Inline `code` is read: it is usually a name.

Kept as they are: Kokoro's own pronunciation links `[word](/phonemes/)` and pause tags
`[pause:0.5s]`; SSML's `<break time="...">` becomes such a pause tag, `<sub alias="...">` its alias.
A link to a site path, `[the docs](/docs/)`, has the same shape as a pronunciation: its target is
taken for phonemes only when it reads as phonemes (`is_pronunciation`), else its text is read.
Constructs that are not plainly markup stay text: `5 * 3`, `a < b`, `snake_case_names`, `#hashtags`.
Only a known tag name (HTML's text and block tags, SSML's) is taken for a tag, and one with a
valueless attribute only when its closing tag follows: `a <b and c> d` is a comparison.
"""

from __future__ import annotations

import html
import re
from dataclasses import dataclass
from functools import lru_cache

from worker.text.source_map import MappedText, Reading, plain_or_mapped
from worker.text.vocab import vocab

# Kokoro's own markup, passed through every rule untouched: pronunciation links and pause tags.
KOKORO_MARKUP = re.compile(r"\[[^\[\]]+\]\(/[^()]*/\)|\[pause:\s*\d+(?:\.\d+)?\s*m?s\]", re.IGNORECASE)

# --- whole lines ------------------------------------------------------------------------------

_FENCE_LINE = re.compile(r"^ {0,3}(`{3,}|~{3,})(.*)$")  # groups: the fence, the rest of its line
_RULE_LINE = re.compile(r"^ {0,3}([-*_])(?: *\1){2,} *$", re.MULTILINE)
_TABLE_DIVIDER = re.compile(r"^ *\|? *:?-{2,}:? *(?:\| *:?-{2,}:? *)*\|? *$", re.MULTILINE)
_TABLE_ROW = re.compile(r"^ *\|(.*)\| *$", re.MULTILINE)
_HEADING = re.compile(r"^ {0,3}#{1,6} +(.+?)(?: +#+)? *$", re.MULTILINE)
_QUOTE = re.compile(r"^ {0,3}(?:> ?)+", re.MULTILINE)
_BULLET = re.compile(r"^ *[-*+•] +(?:\[[ xX]\] +)?(\S.*?) *$", re.MULTILINE)  # task lists' boxes go too
_NUMBERED = re.compile(r"^ *(\d{1,3}[.)]) +(\S.*?) *$", re.MULTILINE)
# A line that ends without sentence punctuation gets a full stop: it was its own unit on the page.
_ENDS_SENTENCE = ".!?:;…。！？"

# --- inline -------------------------------------------------------------------------------------

_IMAGE = re.compile(r"!\[([^\[\]]*)\]\([^()\s]*(?:\s+\"[^\"]*\")?\)")
# A link: Kokoro's `(/phonemes/)` (spaces allowed) or a URL (none), with an optional title.
_LINK = re.compile(r"\[([^\[\]]+)\]\((?:/(?P<slashed>[^()]*)/|[^()\s]*(?:\s+\"[^\"]*\")?)\)")
_PLAIN_WORD = re.compile(r"[a-z]+")
_AUTOLINK = re.compile(r"<((?:https?|ftp)://[^<>\s]+|mailto:[^<>\s]+|[^<>\s@]+@[^<>\s@]+\.[^<>\s@]+)>")
_CODE = re.compile(r"(`+)(?=[^`\n])(.+?)(?<=[^`\n])\1")
_STRONG = re.compile(r"(\*\*|__)(?=\S)(.+?)(?<=\S)\1")
_STAR = re.compile(r"(?<![*\w])\*(?=[^\s*])(.+?)(?<=[^\s*])\*(?![*\w])")
_UNDERSCORE = re.compile(r"(?<![_\w])_(?=[^\s_])(.+?)(?<=[^\s_])_(?![_\w])")
_STRIKE = re.compile(r"~~(?=\S)(.+?)(?<=\S)~~")

# --- tags -----------------------------------------------------------------------------------------

_SSML_TAGS = ("speak", "break", "prosody", "emphasis", "say-as", "sub", "phoneme", "voice", "lang", "mark",
              "audio", "s", "p", "w", "amazon:effect", "amazon:domain", "mstts:express-as")
_HTML_TAGS = ("a", "abbr", "b", "blockquote", "br", "cite", "code", "dd", "del", "div", "dl", "dt", "em", "h1",
              "h2", "h3", "h4", "h5", "h6", "hr", "i", "img", "ins", "kbd", "li", "mark", "ol", "p", "pre", "q", "s",
              "small", "span", "strong", "sub", "sup", "table", "tbody", "td", "th", "thead", "tr", "u", "ul")
# Tags that end a line of text on a page: a line break where they stand. `<s>` is a sentence in
# SSML (inside `<speak>`) but struck-through text, inline, in HTML.
_BLOCK_TAGS = ("blockquote", "br", "dd", "div", "dt", "h1", "h2", "h3", "h4", "h5", "h6", "hr", "li", "p", "pre",
               "tr", "speak")
_SSML_BLOCK_TAGS = ("s",)
_SPEAK = re.compile(r"<speak\b", re.IGNORECASE)
_TAG_NAMES = "|".join(sorted({re.escape(t) for t in (*_SSML_TAGS, *_HTML_TAGS)}, key=len, reverse=True))
_VALUE = r"(?:\"[^\"]*\"|'[^']*'|[^\s\"'<>=]+)"
_ATTRIBUTE = re.compile(rf"\s+([\w:.-]+)(\s*=\s*{_VALUE})?")  # groups: its name, its `=value`
_ATTRIBUTES = rf"(?:\s+[\w:.-]+(?:\s*=\s*{_VALUE})?)*"
_TAG = re.compile(rf"<(/?)({_TAG_NAMES})({_ATTRIBUTES})\s*/?>", re.IGNORECASE)
_BREAK = re.compile(rf"<break\b({_ATTRIBUTES})\s*/?>", re.IGNORECASE)
_TIME = re.compile(r"\btime\s*=\s*[\"']?\s*(\d+(?:\.\d+)?)\s*(m?s)\b", re.IGNORECASE)
_SUB = re.compile(rf"<sub\b({_ATTRIBUTES})\s*>(.*?)</sub\s*>", re.IGNORECASE | re.DOTALL)
# "A" alone reads as the article ("uh"): spelled, it is the letter's name, given as its phonemes.
_LETTER_A = "[A](/ˈA/)"
_PHONEME = re.compile(rf"<phoneme\b({_ATTRIBUTES})\s*>(.*?)</phoneme\s*>", re.IGNORECASE | re.DOTALL)
# IPA as dictionaries write English -> Kokoro's alphabet (misaki's): its diphthongs and affricates
# are one symbol each, its r is ɹ, its US flap T, its g the IPA one.
_IPA_TO_KOKORO = (("t͡ʃ", "ʧ"), ("d͡ʒ", "ʤ"), ("tʃ", "ʧ"), ("dʒ", "ʤ"), ("eɪ", "A"), ("aɪ", "I"), ("oʊ", "O"),
                  ("əʊ", "Q"), ("aʊ", "W"), ("ɔɪ", "Y"), ("ɝ", "ɜɹ"), ("ɚ", "əɹ"), ("r", "ɹ"), ("ɾ", "T"),
                  ("g", "ɡ"), ("͡", ""), (".", ""), ("'", "ˈ"), (",", "ˌ"))
_VOWELS = frozenset("aeiouyæɑɒɔəɛɜɪʊʌɐAIOQWYᵊɨʉøœɤɯ")
_SAY_AS = re.compile(rf"<say-as\b({_ATTRIBUTES})\s*>(.*?)</say-as\s*>", re.IGNORECASE | re.DOTALL)
_ALIAS = re.compile(r"\balias\s*=\s*(?:\"([^\"]*)\"|'([^']*)')", re.IGNORECASE)
_ENTITY = re.compile(r"&(?:#\d+|#x[0-9a-fA-F]+|[A-Za-z][A-Za-z0-9]*);")
_SPEECH_TAG = re.compile(rf"<(?:voice|prosody)\b(?P<attributes>{_ATTRIBUTES})\s*>|</(?:voice|prosody)\s*>",
                         re.IGNORECASE)


@plain_or_mapped
def read_markup(text: MappedText) -> MappedText:
    """Markdown, HTML and SSML in `text` -> the text a listener should hear (see the module
    docstring). Lines keep their breaks, so the splitter still sees paragraphs. What is read maps
    back to where it stands in the markup (a heading's words to themselves, not to its `#`)."""
    text = _read_tags(drop_code_blocks(text))
    text = text.sub(_RULE_LINE, "")
    text = text.sub(_TABLE_DIVIDER, "")
    text = text.sub(_TABLE_ROW, lambda m: _own_sentence(", ".join(c.strip() for c in m.group(1).split("|")
                                                                  if c.strip())), by_words=True)
    text = text.sub(_HEADING, lambda m: _own_sentence(m.group(1)), by_words=True)
    text = text.sub(_QUOTE, "")
    text = text.sub(_BULLET, lambda m: _own_sentence(m.group(1)), by_words=True)
    text = text.sub(_NUMBERED, lambda m: f"{m.group(1)} {_own_sentence(m.group(2))}", by_words=True)
    text = text.sub(_IMAGE, r"\1", by_words=True)
    text = text.sub(_LINK, _link, by_words=True)
    text = text.sub(_AUTOLINK, r"\1", by_words=True)
    text = text.sub(_CODE, r"\2", by_words=True)
    for pattern in (_STRONG, _STRIKE):
        text = text.sub(pattern, lambda m: m.group(m.lastindex), by_words=True)
    text = text.sub(_STAR, r"\1", by_words=True)
    text = text.sub(_UNDERSCORE, r"\1", by_words=True)
    return text.sub(_LINE_END, "\n").strip()


_LINE_END = re.compile(r"[^\S\n]*\n\s*")


@dataclass(frozen=True)
class Delivery:
    """Who reads a part of the text and how fast, as SSML's `<voice>` and `<prosody rate>` set it."""

    voice: str | None = None  # a voice spec (None: the request's voice)
    rate: float = 1.0         # times the request's speed


# SSML's rate words, as speech engines read them (a word or a percentage; 100% = as requested).
_RATES = {"x-slow": 0.5, "slow": 0.75, "medium": 1.0, "default": 1.0, "fast": 1.25, "x-fast": 1.5}


def split_speech(text: str | MappedText) -> list[tuple[Delivery, str | MappedText]]:
    """`text` cut where SSML's `<voice name="...">` or `<prosody rate="...">` changes who reads it or
    how fast: (its delivery, the text), in order, without those tags and without blank parts.
    Elements nest; one never closed runs to the end, a stray closing tag is dropped, and a `<voice>`
    without a name or a `<prosody>` without a rate keeps the delivery around it.

        split_speech('Hi. <voice name="am_adam">Hello, <prosody rate="slow">friend.</prosody></voice>')
        -> [(Delivery(), "Hi. "), (Delivery("am_adam"), "Hello, "), (Delivery("am_adam", 0.75), "friend.")]

    Given a MappedText, the parts are pieces of it (mapped to the source as it is).
    """
    written = text if isinstance(text, str) else text.text
    if not _SPEECH_TAG.search(written):
        return [(Delivery(), text)]
    parts: list[tuple[Delivery, str | MappedText]] = []
    open_tags: list[str] = []
    start = 0
    for tag in _SPEECH_TAG.finditer(written):
        parts.append((delivery(open_tags), text[start:tag.start()]))
        start = tag.end()
        _follow(tag, open_tags)
    parts.append((delivery(open_tags), text[start:]))
    return [(how, part) for how, part in parts if part.strip()]


def follow_speech_tags(text: str, open_tags: list[str]) -> None:
    """Update `open_tags` (the `<voice>` and `<prosody>` tags open, outermost first) past those of
    `text`: a live session reopens them before its next piece of text, so it is read alike."""
    for tag in _SPEECH_TAG.finditer(text):
        _follow(tag, open_tags)


def delivery(open_tags: list[str]) -> Delivery:
    """The delivery inside `open_tags` (outermost first)."""
    voice, rate = None, 1.0
    for tag in open_tags:
        attributes = _SPEECH_TAG.match(tag).group("attributes") or ""
        if tag[1:].lower().startswith("voice"):
            voice = _attribute(attributes, "name") or voice
        else:
            rate *= _rate(_attribute(attributes, "rate"))
    return Delivery(voice, rate)


def _follow(tag: re.Match, open_tags: list[str]) -> None:
    if not tag.group(0).startswith("</"):
        open_tags.append(tag.group(0))
    elif open_tags:
        open_tags.pop()


def _attribute(attributes: str, name: str) -> str:
    m = re.search(rf"\b{name}\s*=\s*(?:\"([^\"]*)\"|'([^']*)'|([^\s\"'<>=]+))", attributes, re.IGNORECASE)
    return next((g for g in m.groups() if g is not None), "").strip() if m else ""


def _rate(value: str) -> float:
    """A prosody rate as a multiplier: a word (`slow`), a percentage (`80%`, `+20%`), or a number."""
    value = value.strip().lower()
    if value in _RATES:
        return _RATES[value]
    try:
        if value.endswith("%"):
            number = float(value[:-1])
            return max(0.0, 1 + number / 100) if value[0] in "+-" else number / 100
        return float(value)
    except ValueError:
        return 1.0  # not a rate we read: as requested


# Kokoro-FastAPI's inline speaker and pace tags.
_VOICE_TAG = re.compile(r"\[(voice|rate)\s*:\s*([^\[\]]*?)\s*\]", re.IGNORECASE)
_SPEC_CHARACTERS = re.compile(r"^[A-Za-z0-9_+\-().\s]+$")


@plain_or_mapped
def voice_tags_as_ssml(text: MappedText, aliases: dict[str, tuple[str, float]] | None = None,
                       base_rate: float = 1.0) -> MappedText:
    """`text` with Kokoro-FastAPI's `[voice:SPEC]` and `[rate:X]` tags as SSML elements for
    `split_speech`. A voice tag reads everything after it in SPEC (a voice spec, or a name of
    `aliases`: lowercase name -> (spec, its own pace)) at that voice's pace; a rate tag scales the
    pace of the voice speaking, until the next rate or voice tag. Paces are relative to the
    request's speed, which already holds `base_rate` (the pace of an alias given as the request's
    voice). TextError (param `input`) for a tag it cannot read.

        voice_tags_as_ssml("Hi. [voice:am_adam] Hello. [rate:1.5] Bye.")
        -> 'Hi. <voice name="am_adam"> Hello. <prosody rate="1.5"> Bye.</prosody></voice>'
    """
    from worker.text.text_errors import TextError

    aliases = aliases or {}
    edits: list[tuple[int, int, str]] = []  # each tag and the elements it becomes
    voice_open = rate_open = False
    voice_rate = base_rate  # the pace of the voice speaking now
    for tag in _VOICE_TAG.finditer(text.text):
        out: list[str] = []
        kind, value = tag.group(1).lower(), tag.group(2)
        if rate_open:
            out.append("</prosody>")
            rate_open = False
        if kind == "voice":
            spec, voice_rate = aliases.get(value.lower(), (value, 1.0))
            if not spec.strip() or not _SPEC_CHARACTERS.match(spec):
                raise TextError(f"{tag.group(0)} in the input: name a voice, a mix such as af_bella(2)+af_sky(1), "
                                "or one of the request's voice_aliases")
            if voice_open:
                out.append("</voice>")
            out.append(f'<voice name="{spec.strip()}">')
            voice_open = True
            factor = voice_rate / base_rate
        else:
            try:
                factor = float(value)
            except ValueError:
                factor = -1.0
            if not 0 < factor < float("inf"):
                raise TextError(f"{tag.group(0)} in the input: a rate is a positive number, such as [rate:1.5] "
                                "(1.5 times as fast) or [rate:0.8]")
            factor *= voice_rate / base_rate
        if factor != 1.0:
            out.append(f'<prosody rate="{factor:.6g}">')
            rate_open = True
        edits.append((tag.start(), tag.end(), "".join(out)))
    closing = "</prosody>" * rate_open + "</voice>" * voice_open
    if closing:
        edits.append((len(text), len(text), closing))
    return text.edited(edits) if edits else text


def code_fence(line: str) -> str | None:
    """The fence (three or more ` or ~) with which `line` opens a fenced code block, or None."""
    m = _FENCE_LINE.match(line)
    if m is None or (m.group(1)[0] == "`" and "`" in m.group(2)):  # "```x```" on one line is inline code
        return None
    return m.group(1)


def closes_code(fence: str, line: str) -> bool:
    """Whether `line` closes the code block that `fence` opened: the same character, at least as
    many, and nothing else on the line."""
    m = _FENCE_LINE.match(line)
    return m is not None and m.group(1)[0] == fence[0] and len(m.group(1)) >= len(fence) and not m.group(2).strip()


@plain_or_mapped
def drop_code_blocks(text: MappedText) -> MappedText:
    """`text` without its fenced code blocks (fences included); a line break stands for each."""
    if "```" not in text.text and "~~~" not in text.text:
        return text
    dropped: list[tuple[int, int, str]] = []
    fence: str | None = None
    start = 0  # of the line
    for line in text.text.split("\n"):
        end = start + len(line)
        if fence is None:
            fence = code_fence(line)
            if fence is not None:
                dropped.append((start, end, ""))  # the opening fence's line; its line break stays
        else:
            dropped.append((start - 1, end, ""))  # a line of code, with the line break before it
            if closes_code(fence, line):
                fence = None
        start = end + 1
    return text.edited([d for d in dropped if d[1] > d[0]])


def is_pronunciation(target: str) -> bool:
    """Whether a link's `/target/` is phonemes (`[Kokoro](/kˈOkəɹO/)`) rather than a site path
    (`[the docs](/docs/)`, `(/v1/models/)`, `(/Docs/)`). Phonemes written by hand or copied from
    `kokoro-fleet phonemize` carry a stress mark or an IPA symbol, or at least one of the
    alphabet's capital diphthongs (`kOkOrO`); a path is plain lowercase letters, or has characters
    (digits, `.`, `_`, `-`, `/`, other capitals) that no phoneme string has. A target with
    non-ASCII symbols outside the alphabet (`ɪtΩ`) is still phonemes: the tokenizer drops those
    symbols and logs them."""
    if not target.strip():
        return False
    if not target.isascii():
        return True
    alphabet = _alphabet()
    return all(c in alphabet for c in target) and not _PLAIN_WORD.fullmatch(target.replace(" ", ""))


@lru_cache(maxsize=1)
def _alphabet() -> frozenset[str]:
    return frozenset(vocab()) | {" "}


def _link(m: re.Match) -> str:
    slashed = m.group("slashed")
    return m.group(0) if slashed is not None and is_pronunciation(slashed) else m.group(1)


def _own_sentence(line: str) -> str:
    line = line.strip()
    return line if not line or line[-1] in _ENDS_SENTENCE else line + "."


def _read_tags(text: MappedText) -> MappedText:
    if "<" not in text.text and "&" not in text.text:
        return text
    text = text.sub(_BREAK, _pause_tag)
    text = text.sub(_SUB, _alias)
    text = text.sub(_SAY_AS, _say_as)
    text = text.sub(_PHONEME, _phoneme, by_words=True)
    ssml = bool(_SPEAK.search(text.text))
    text = text.sub(_TAG, lambda m: _tag(m, m.string, ssml))
    if _ENTITY.search(text.text):
        text = text.sub(_ENTITY, lambda m: html.unescape(m.group(0)))
    return text


def _tag(m: re.Match, text: str, ssml: bool) -> str:
    """A tag's replacement: a line break for a block tag, nothing for an inline one. An opening tag
    with a bare attribute is a tag only if its closing tag follows (`<td nowrap>x</td>`); else it is
    text (`a <b and c> d`: a comparison)."""
    closing, name, attributes = m.group(1), m.group(2).lower(), m.group(3)
    valueless = any(a.group(2) is None for a in _ATTRIBUTE.finditer(attributes))
    if not closing and valueless and not re.search(rf"</{re.escape(name)}\s*>", text[m.end():], re.IGNORECASE):
        return m.group(0)
    return "\n" if name in _BLOCK_TAGS or (ssml and name in _SSML_BLOCK_TAGS) else ""


def _pause_tag(m: re.Match) -> str:
    time = _TIME.search(m.group(1))
    return f"[pause:{time.group(1)}{time.group(2).lower()}]" if time else " "


def _say_as(m: re.Match) -> str | Reading:
    """SSML's `<say-as interpret-as="...">`: `characters` (or `spell-out`, `letters`, `verbatim`)
    spells its text letter by letter and digit by digit ("XJ4-b2" -> "X J 4, B 2"), `digits` reads
    digit by digit, `ordinal` a number as a rank ("3" -> "3rd"), `telephone` digit by digit in its
    groups; any other kind (cardinal, date, time, ...) is the text as the normalizer reads it."""
    kind = _attribute(m.group(1), "interpret-as").lower()
    content = m.group(2)
    if kind in ("characters", "spell-out", "letters", "verbatim"):
        return Reading(", ".join(" ".join(_LETTER_A if ch in "aA" else ch.upper() for ch in group)
                                 for group in re.findall(r"[^\W_]+", content)), 2)
    if kind in ("digits", "telephone"):
        return Reading(", ".join(" ".join(group) for group in re.findall(r"\d+", content)) or content, 2)
    if kind == "ordinal" and re.fullmatch(r"\s*\d+\s*", content):
        n = int(content)
        suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
        return Reading(f"{n}{suffix}", 2)
    return content


def _phoneme(m: re.Match) -> str:
    """SSML's `<phoneme alphabet="ipa" ph="...">word</phoneme>` -> Kokoro's pronunciation link
    `[word](/phonemes/)`: the IPA turned into Kokoro's alphabet, each stress mark moved from the
    syllable's start to its vowel, where Kokoro's phonemes carry it. Another alphabet (x-sampa),
    or none that reads as phonemes, leaves the word to the reader."""
    alphabet = _attribute(m.group(1), "alphabet").lower() or "ipa"
    ipa, word = _attribute(m.group(1), "ph"), m.group(2).strip()
    if alphabet != "ipa" or not ipa or not word:
        return m.group(2)
    phonemes = ipa.strip().strip("/[]")
    for written, kokoro in _IPA_TO_KOKORO:
        phonemes = phonemes.replace(written, kokoro)
    moved, stress = [], ""
    for ch in phonemes:
        if ch in "ˈˌ":
            stress = ch
        elif ch in _VOWELS:
            moved += [stress, ch]
            stress = ""
        else:
            moved.append(ch)
    phonemes = "".join(moved) + stress
    return f"[{word}](/{phonemes}/)" if is_pronunciation(phonemes) else m.group(2)


def _alias(m: re.Match) -> str | Reading:
    alias = _ALIAS.search(m.group(1))
    return Reading(next(g for g in alias.groups() if g is not None), 2) if alias else m.group(2)
