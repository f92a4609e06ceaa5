"""Numbers that are not money, time or a phone: plain, ordinal, decimal, fractions, versions, Roman numerals."""

from __future__ import annotations

import re

from worker.text import numbers as num
from worker.text.read_times import spoken_date

# A number starts where a run of digits starts: inside "1111..." a match tried at every digit would
# scan to the run's end each time, quadratic in the run's length.
WRITTEN_NUMBER = r"(?<!\d)(?:\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?|\.\d+)"

# How a scale after a number is said: "$2M", "2.3bn", "$48.2 million".
SCALE_WORDS = {"k": "thousand", "K": "thousand", "m": "million", "M": "million", "mm": "million",
               "b": "billion", "B": "billion", "bn": "billion", "t": "trillion", "T": "trillion",
               "thousand": "thousand", "million": "million", "billion": "billion", "trillion": "trillion"}

ORDINAL = re.compile(r"\b(?P<n>\d{1,3}(?:,\d{3})*|\d+)(?:st|nd|rd|th)\b")


def say_ordinal(m: re.Match, british: bool) -> str:
    return num.ordinal(int(m.group("n").replace(",", "")), british)


def _version(v: str | None, ver: str, british: bool) -> str:
    prefix = "version " if v else ""
    parts = ver.split(".")
    return prefix + " point ".join(num.number(p, british) if not (len(p) > 1 and p.startswith("0")) else num.digits(p)
                                   for p in parts)


RANGE = re.compile(r"(?<![\w.,-])(?P<a>" + WRITTEN_NUMBER + r")\s?[-–]\s?(?P<b>" + WRITTEN_NUMBER + r")(?![\w.,]\d|-)")


def say_range(m: re.Match, british: bool) -> str:
    return f"{_read_number(m.group('a'), british)} to {_read_number(m.group('b'), british)}"


FRACTION = re.compile(r"(?<![\d/.,])(?P<a>\d{1,2})/(?P<b>\d{1,2})(?![\d/])")


def say_fraction(m: re.Match, british: bool) -> str:
    """1/2 and 3/4 are fractions, but dates after "on", "until", "due"...; 7/10 and 4/5 are scores
    ("seven out of ten"); 12/25 is a date; 24/7 and 50/50 are read as two numbers."""
    a, b = int(m.group("a")), int(m.group("b"))
    if (a, b) == (9, 11):
        return "nine eleven"  # the day itself, as Americans name it
    names = {2: ("half", "halves"), 3: ("third", "thirds"), 4: ("quarter", "quarters")}
    if b in (5, 10) and 0 <= a == b:  # "10/10", "5/5": a perfect score, not October tenth
        return f"{num.cardinal(a)} out of {num.cardinal(b)}"
    if 0 < a < b <= 10 and not _BEFORE_DATE.search(m.string, 0, m.start()):
        if b in names:
            word = names[b][0] if a == 1 else names[b][1]
            return f"{num.cardinal(a)} {word}"
        return f"{num.cardinal(a)} {'out of' if b in (5, 10) else 'over'} {num.cardinal(b)}"
    month, day = (b, a) if british else (a, b)
    if 1 <= month <= 12 and 1 <= day <= 31:
        return spoken_date(None, month, day, british)
    return f"{num.cardinal(a)} {num.cardinal(b)}"


# "on 3/4", "due 1/2": a date, not three quarters or one half.
_BEFORE_DATE = re.compile(r"\b(?:[Oo]n|[Uu]ntil|[Ss]ince|[Dd]ue|[Tt]hrough|[Tt]hru)\s+$")

_UNICODE_FRACTIONS = {"½": "one half", "⅓": "one third", "⅔": "two thirds", "¼": "one quarter",
                      "¾": "three quarters", "⅛": "one eighth", "⅜": "three eighths", "⅝": "five eighths",
                      "⅞": "seven eighths", "⅕": "one fifth"}

NUMBER = re.compile(WRITTEN_NUMBER)


def say_number(m: re.Match, british: bool) -> str:
    return _read_number(m.group(0), british)


def _read_number(text: str, british: bool) -> str:
    """A number standing alone: four digits from 1100 to 2099 without a comma read as a year."""
    if re.fullmatch(r"\d{4}", text) and 1100 <= int(text) <= 2099:
        return num.year(int(text), british)
    return num.number(text, british)


_SUPERSCRIPTS = str.maketrans("⁰¹²³⁴⁵⁶⁷⁸⁹", "0123456789")

POWER = re.compile(r"(?<=[\w)])(?:(?P<sup>[⁰¹²³⁴⁵⁶⁷⁸⁹]+)|\^(?P<caret>-?\d{1,3})\b)")


def say_power(m: re.Match, british: bool) -> str:
    """x² and x^2 -> x squared, m³ -> m cubed, 10⁶ and 10^6 -> 10 to the sixth, 10^-3 to the minus third."""
    n = int(m.group("sup").translate(_SUPERSCRIPTS)) if m.group("sup") else int(m.group("caret"))
    if n < 0:
        return f" to the minus {num.ordinal(-n, british)}"
    return {2: " squared", 3: " cubed"}.get(n, f" to the {num.ordinal(n, british)}")


DIMENSIONS = re.compile(r"(?<![\w.])\d+(?:\.\d+)?x\d+(?:\.\d+)?(?:x\d+(?:\.\d+)?)?(?![\w.]\d|\w)")


def say_dimensions(m: re.Match, british: bool) -> str:
    """2x4, 1920x1080, 10x20x5: read "by"."""
    return " by ".join(_in_pairs(int(n)) if n.isdigit() and 1000 < int(n) < 10000 else _read_number(n, british)
                       for n in m.group(0).split("x"))


def _in_pairs(n: int) -> str:
    """1080 -> "ten eighty", 720 -> "seven twenty": how screen sizes and resolutions are said."""
    return num.year(n) if n >= 1000 else f"{num.cardinal(n // 100)} {num.cardinal(n % 100)}"


# Roman numerals after words that number things ("Chapter IV", "World War II") are cardinals;
# after a monarch's or pope's name ("King Henry VIII", "Pope John Paul II") ordinals with "the".
_ROMAN_VALUES = {"I": 1, "V": 5, "X": 10, "L": 50, "C": 100}


def _roman(text: str) -> int:
    values = [_ROMAN_VALUES[c] for c in text]
    return sum(-v if i + 1 < len(values) and v < values[i + 1] else v for i, v in enumerate(values))


ROMAN_NUMERAL = re.compile(r"\b(?:(?P<word>Chapter|Part|Volume|Vol\.|Book|Act|Scene|Article|Appendix|Phase|Stage|Season|"
                           r"Episode|World War|Super Bowl|Title)|(?P<ruler>(?:King|Queen|Pope|Emperor|Tsar|Czar|Prince|Princess|Duke)"
                           r"(?:\s[A-Z][a-z]+){1,2}))\s(?P<roman>[IVXLC]{1,7})\b(?![.'’]\w)")


def say_roman_numeral(m: re.Match, british: bool) -> str:
    n = _roman(m.group("roman"))
    if m.group("ruler"):
        return f"{m.group('ruler')} the {num.ordinal(n, british).capitalize()}"
    return f"{m.group('word')} {num.cardinal(n, british)}"


# Ratios people write with a colon: "a 16:9 screen", "mixed 3:1", "odds of 5:2". Elsewhere "3:16" is a
# time or a verse, so a colon pair reads as a ratio only among these or after a word that says so.
_ASPECT_RATIOS = {"16:9", "4:3", "21:9", "3:2", "32:9"}  # none of them a time

_RATIO_WORDS = re.compile(r"(?:ratio|aspect|odds|mix(?:ed)?|split|scale)\s+(?:of\s+)?$", re.IGNORECASE)

RATIO = re.compile(r"(?P<a>\d{1,2}):(?P<b>\d{1,2})(?![\d:])")


def say_ratio(m: re.Match, british: bool) -> str:
    before = m.string[max(0, m.start() - 24):m.start()]
    if re.search(r"[\w:.]$", before) or (m.group(0) not in _ASPECT_RATIOS and not _RATIO_WORDS.search(before)):
        return m.group(0)  # left for the time rule
    return f"{num.cardinal(int(m.group('a')), british)} to {num.cardinal(int(m.group('b')), british)}"


_FRACTION_WORDS = {(1, 2): "a half", (1, 3): "a third", (2, 3): "two thirds", (1, 4): "a quarter",
                   (3, 4): "three quarters", (1, 8): "an eighth", (3, 8): "three eighths", (5, 8): "five eighths",
                   (7, 8): "seven eighths"}

MIXED_FRACTION = re.compile(r"(?<![\w/.,])(?P<w>\d+)[ -](?P<a>\d)/(?P<b>\d)(?![\d/])")


def say_mixed_fraction(m: re.Match, british: bool) -> str:
    """2 1/2 -> two and a half; a pair that is no common fraction is left to the fraction rule."""
    part = _FRACTION_WORDS.get((int(m.group("a")), int(m.group("b"))))
    if part is None:
        return m.group(0)
    return f"{num.cardinal(int(m.group('w')), british)} and {part}"


NUMBER_PLUS_ERS = re.compile(r"(?<![\w.,])(?P<n>[1-9]?[1-9])ers\b")


def say_number_plus_ers(m: re.Match, british: bool) -> str:
    """49ers, 76ers: the number said and "-ers" joined to its last word (forty-niners,
    seventy-sixers), not "forty-nine ers"."""
    words = num.number(m.group("n"), british)
    return words + ("rs" if words.endswith("e") else "ers")


DECADE = re.compile(r"(?<![\w'])'?(?P<n>\d{2}|1\d{3}|20\d{2})'?s\b")


def say_decade(m: re.Match, british: bool) -> str:
    """1990s -> nineteen nineties, '80s -> eighties, 1900s -> nineteen hundreds."""
    n = int(m.group("n"))
    if n % 10 != 0:
        return m.group(0)
    spoken = num.year(n, british) if n >= 100 else num.cardinal(n, british)
    head, _, last = spoken.rpartition(" ")
    plural = last[:-1] + "ies" if last.endswith("y") else last + "s"
    return f"{head} {plural}".strip()


VERSION_NUMBER = re.compile(r"(?:\b(?P<v>[vV])(?=\d)|(?<![\w.]))(?P<ver>\d+(?:\.\d+){2,})(?![\w.]\d)|\b(?P<v2>[vV])(?P<ver2>\d+\.\d+)\b")


def say_version_number(m: re.Match, british: bool) -> str:
    v, ver = (m.group("v2"), m.group("ver2")) if m.group("ver2") else (m.group("v"), m.group("ver"))
    if v and _AFTER_VERSION.search(m.string, 0, m.start()):  # "version v2.1": the word is said already
        v = None
    return _version(v, ver, british)


_AFTER_VERSION = re.compile(r"\bversion\s*$", re.IGNORECASE)

SCALE = re.compile(r"(?<![\w.,-])(?:(?P<n>" + WRITTEN_NUMBER + r")\s?(?P<scale>bn)|(?P<n2>\d+\.\d+)(?P<scale2>[kKMBT]))(?!\w|[.,]\d)")


def say_scale(m: re.Match, british: bool) -> str:
    return f"{num.number(m.group('n') or m.group('n2'), british)} {SCALE_WORDS[m.group('scale') or m.group('scale2')]}"


VIDEO_RESOLUTION = re.compile(r"\b(?P<n>480|576|720|1080|1440|2160)(?P<p>[pi])\b")


def say_video_resolution(m: re.Match, british: bool) -> str:
    return f"{_in_pairs(int(m.group('n')))} {m.group('p').upper()}"  # a capital: not "p." (page)


MULTIPLIER = re.compile(r"\b(?P<n>\d+(?:\.\d+)?)x\b")


def say_multiplier(m: re.Match, british: bool) -> str:
    return f"{num.number(m.group('n'), british)} times"


UNICODE_FRACTION = re.compile(r"(?:(?<!\d)(?P<w>\d+))?\s?(?P<f>[½⅓⅔¼¾⅛⅜⅝⅞⅕])")


def say_unicode_fraction(m: re.Match, british: bool) -> str:
    return (f"{num.cardinal(int(m.group('w')), british)} and " if m.group("w") else "") + _UNICODE_FRACTIONS[m.group("f")]


SCORE = re.compile(r"(?<![\w/.,])(?P<a>\d+\.\d+)\s?/\s?(?P<b>\d+(?:\.\d+)?)(?![\d/])")


def say_score(m: re.Match, british: bool) -> str:
    return f"{num.number(m.group('a'), british)} out of {num.number(m.group('b'), british)}"


BLOOD_PRESSURE = re.compile(r"(?P<lead>\b(?:BP|[Bb]lood pressure)\b[:\s]*(?:of\s+|is\s+|was\s+)?)(?P<a>\d{2,3})/(?P<b>\d{2,3})\b"
                            r"|(?P<a2>\d{2,3})/(?P<b2>\d{2,3})(?=\s?mm\s?Hg)")


def say_blood_pressure(m: re.Match, british: bool) -> str:
    return f"{m.group('lead') or ''}{m.group('a') or m.group('a2')} over {m.group('b') or m.group('b2')}"


NEGATIVE = re.compile(r"(?<![\w.,])[-\u2212](?P<n>" + WRITTEN_NUMBER + r")\b")


def say_negative(m: re.Match, british: bool) -> str:
    return "minus " + num.number(m.group("n"), british)
