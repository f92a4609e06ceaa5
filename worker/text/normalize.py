"""English text normalization: what users type -> words Kokoro can say.

Each rule is one regex with one small function, applied in a fixed order (the order matters: an
email must be read before its dots become "dot", a phone number before its digits become a range).
Anything no rule matches passes through unchanged, so normalization never deletes a word; the G2P
reads what is left (acronyms, unknown words via espeak-ng).

Options follow Kokoro-FastAPI's `normalization_options` field for field, so its clients work as is.
Markup that is not text (custom pronunciations `[word](/phonemes/)`, pause tags `[pause:0.5s]`) is
kept out of normalization by `normalize_text`; Markdown, HTML and SSML are read as rendered text
first (worker/text/markup.py), then the deployment's lexicon (worker/text/lexicon.py) marks its words.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass
from typing import Callable

from worker.text import localized
from worker.text import numbers as num
from worker.text.lexicon import Lexicon
from worker.text.markup import KOKORO_MARKUP, read_markup


@dataclass
class NormalizationOptions:
    """Per-request switches, the same fields and defaults as Kokoro-FastAPI's, plus
    `markup_normalization` (ours: Markdown, HTML and SSML read as rendered text, worker/text/markup.py)."""

    normalize: bool = True                              # master switch: False passes the text as is
    unit_normalization: bool = False                    # 10KB -> ten kilobytes, 5 km -> five kilometers
    url_normalization: bool = True                      # example.com/docs -> example dot com slash docs
    email_normalization: bool = True                    # a@b.org -> a at b dot org
    optional_pluralization_normalization: bool = True   # word(s) -> words
    phone_normalization: bool = True                    # 555-123-4567 read digit by digit in groups
    replace_remaining_symbols: bool = True              # & @ + = # % ... -> words
    markup_normalization: bool = True                   # **bold**, # Heading, [text](url), <b>, &amp; -> the words

    @property
    def reads_markup(self) -> bool:
        """Whether Markdown, HTML and SSML are read as rendered (code blocks dropped, <voice> obeyed)."""
        return self.normalize and self.markup_normalization

    @classmethod
    def from_dict(cls, data: dict | None) -> "NormalizationOptions":
        if not data:
            return cls()
        known = {k: bool(v) for k, v in data.items() if k in cls.__dataclass_fields__}
        return cls(**known)


def clean_text(text: str) -> str:
    """Always applied, even with normalization off: control characters become spaces, invisible
    format characters (zero-width joiners, soft hyphens, BOM) go, every script's decimal digits
    become ASCII ones (fullwidth ３, Devanagari ३), whitespace runs collapse. Newlines survive (they
    mark paragraph ends for the splitter)."""
    out = []
    for ch in text:
        cat = unicodedata.category(ch)
        if ch == "\n":
            out.append("\n")
        elif cat == "Cc" or cat in ("Zl", "Zp") or ch in "\u2028\u2029":
            out.append(" " if ch not in "\r\u2028\u2029" else "\n")
        elif cat in ("Cf", "Cs", "Co", "Cn") and not ch.isspace():
            continue
        elif cat == "Nd" and not ch.isascii():
            out.append(str(unicodedata.digit(ch)))  # "３", "٣", "३": misaki's Japanese numbers died on all but ASCII
        else:
            out.append(ch)
    cleaned = "".join(out)
    cleaned = re.sub(r"[^\S\n]+", " ", cleaned)
    cleaned = re.sub(r" *\n[\s]*", "\n", cleaned)
    return cleaned.strip()


_JAPANESE_RANGE = re.compile(r"[〜～](?=\d)")



def normalize_text(text: str, options: NormalizationOptions | None = None, lang_code: str = "a",
                   lexicon: Lexicon | None = None) -> str:
    """Normalize `text` for `lang_code` (English rules for `a` and `b`; in every other language,
    dates, clock times and the signs its reader would drop in words (worker/text/localized.py), then
    Mandarin's numbers read out by cn2an, as misaki does, so "10%" becomes 百分之十, and Japanese's
    wave dash before a number read "kara"; espeak-ng and misaki's Japanese reader read their
    numbers themselves). Markdown, HTML and SSML are first read as rendered text, in every
    language (`read_markup`); then the deployment's `lexicon` (KOKORO_LEXICON) marks its words as
    Kokoro's pronunciation links, which, like its pause tags, pass through untouched."""
    options = options or NormalizationOptions()
    text = clean_text(text)
    if options.normalize and options.markup_normalization:  # in any language: agents write Markdown in all
        text = read_markup(text)
    if lexicon:  # after the markup (a link's text is a word again), before any rule reads the words
        text = lexicon.mark(text, lang_code)
    if not options.normalize or lang_code not in ("a", "b", *localized.LANGUAGES):
        return text
    if lang_code == "z":
        from worker.text.mandarin import digit_strings, spoken_numbers

        def rules(piece: str) -> str:
            return spoken_numbers(localized.normalize(digit_strings(piece), lang_code))
    elif lang_code == "j":
        def rules(piece: str) -> str:  # "10〜20人": from ten to twenty, as misaki reads it
            return localized.normalize(_JAPANESE_RANGE.sub("から", piece), lang_code)  # before 20 is 二十
    elif lang_code in localized.LANGUAGES:
        def rules(piece: str) -> str:
            return localized.normalize(piece, lang_code)
    else:
        def rules(piece: str) -> str:
            return _normalize_english(piece, options, lang_code == "b")
    pieces, last = [], 0
    for m in KOKORO_MARKUP.finditer(text):
        pieces.append(rules(text[last:m.start()]))
        pieces.append(m.group(0))
        last = m.end()
    pieces.append(rules(text[last:]))
    joined = "".join(pieces)
    return re.sub(r"[^\S\n]+", " ", joined).strip()


# ---------------------------------------------------------------------------------------------
# The rules. Each returns replacement text; `british` selects "and" in numbers and date order.

_Rule = Callable[[re.Match, bool], str]

MONTHS = ("January", "February", "March", "April", "May", "June", "July", "August", "September",
          "October", "November", "December")
_MONTH_ABBR = {m[:3].lower(): m for m in MONTHS} | {"sept": "September"}
_DAYS = {"mon": "Monday", "tue": "Tuesday", "tues": "Tuesday", "wed": "Wednesday", "thu": "Thursday",
         "thur": "Thursday", "thurs": "Thursday", "fri": "Friday", "sat": "Saturday", "sun": "Sunday"}
_CURRENCIES = {  # symbol or code -> (singular, plural, cent singular, cent plural)
    "$": ("dollar", "dollars", "cent", "cents"), "US$": ("dollar", "dollars", "cent", "cents"),
    "£": ("pound", "pounds", "penny", "pence"), "€": ("euro", "euros", "cent", "cents"),
    "¥": ("yen", "yen", "", ""), "₹": ("rupee", "rupees", "paisa", "paise"),
    "₩": ("won", "won", "", ""), "₽": ("ruble", "rubles", "kopek", "kopeks"),
    "USD": ("dollar", "dollars", "cent", "cents"), "EUR": ("euro", "euros", "cent", "cents"),
    "GBP": ("pound", "pounds", "penny", "pence"), "JPY": ("yen", "yen", "", ""),
    "A$": ("Australian dollar", "Australian dollars", "cent", "cents"), "AU$": ("Australian dollar", "Australian dollars", "cent", "cents"),
    "AUD": ("Australian dollar", "Australian dollars", "cent", "cents"),
    "C$": ("Canadian dollar", "Canadian dollars", "cent", "cents"), "CA$": ("Canadian dollar", "Canadian dollars", "cent", "cents"),
    "CAD": ("Canadian dollar", "Canadian dollars", "cent", "cents"),
    "NZ$": ("New Zealand dollar", "New Zealand dollars", "cent", "cents"), "NZD": ("New Zealand dollar", "New Zealand dollars", "cent", "cents"),
    "HK$": ("Hong Kong dollar", "Hong Kong dollars", "cent", "cents"), "S$": ("Singapore dollar", "Singapore dollars", "cent", "cents"),
    "R$": ("real", "reais", "centavo", "centavos"), "CHF": ("Swiss franc", "Swiss francs", "centime", "centimes"),
    "INR": ("rupee", "rupees", "paisa", "paise"), "CNY": ("yuan", "yuan", "", ""), "₿": ("bitcoin", "bitcoin", "", ""),
}
_SCALES = {"k": "thousand", "K": "thousand", "m": "million", "M": "million", "mm": "million",
           "b": "billion", "B": "billion", "bn": "billion", "t": "trillion", "T": "trillion",
           "thousand": "thousand", "million": "million", "billion": "billion", "trillion": "trillion"}
_UNITS = {  # written unit -> (singular, plural); used after a number only
    "km": ("kilometer", "kilometers"), "m": ("meter", "meters"), "cm": ("centimeter", "centimeters"),
    "mm": ("millimeter", "millimeters"), "mi": ("mile", "miles"), "ft": ("foot", "feet"),
    "in": ("inch", "inches"), "kg": ("kilogram", "kilograms"), "g": ("gram", "grams"),
    "mg": ("milligram", "milligrams"), "lb": ("pound", "pounds"), "lbs": ("pound", "pounds"),
    "oz": ("ounce", "ounces"), "l": ("liter", "liters"), "L": ("liter", "liters"),
    "ml": ("milliliter", "milliliters"), "mL": ("milliliter", "milliliters"),
    "km/h": ("kilometer per hour", "kilometers per hour"), "kph": ("kilometer per hour", "kilometers per hour"),
    "mph": ("mile per hour", "miles per hour"), "m/s": ("meter per second", "meters per second"),
    "B": ("byte", "bytes"), "KB": ("kilobyte", "kilobytes"), "MB": ("megabyte", "megabytes"),
    "GB": ("gigabyte", "gigabytes"), "TB": ("terabyte", "terabytes"), "kB": ("kilobyte", "kilobytes"),
    "Kb": ("kilobit", "kilobits"), "Mb": ("megabit", "megabits"), "Gb": ("gigabit", "gigabits"),
    "Mbps": ("megabit per second", "megabits per second"), "Gbps": ("gigabit per second", "gigabits per second"),
    "Hz": ("hertz", "hertz"), "kHz": ("kilohertz", "kilohertz"), "MHz": ("megahertz", "megahertz"),
    "GHz": ("gigahertz", "gigahertz"), "W": ("watt", "watts"), "kW": ("kilowatt", "kilowatts"),
    "kWh": ("kilowatt hour", "kilowatt hours"), "V": ("volt", "volts"), "mAh": ("milliamp hour", "milliamp hours"),
    "ms": ("millisecond", "milliseconds"), "s": ("second", "seconds"), "sec": ("second", "seconds"),
    "min": ("minute", "minutes"), "h": ("hour", "hours"), "hr": ("hour", "hours"), "hrs": ("hour", "hours"),
    "px": ("pixel", "pixels"),
}
# Abbreviations that are always the same word. Title-like ones (followed by a name) need no period.
ABBREVIATIONS = {
    "Mr.": "Mister", "Mrs.": "Missus", "Ms.": "Miz", "Prof.": "Professor", "Jr.": "Junior",
    "Sr.": "Senior", "Gov.": "Governor", "Sen.": "Senator", "Rep.": "Representative", "Gen.": "General",
    "Capt.": "Captain", "Lt.": "Lieutenant", "Sgt.": "Sergeant", "Rev.": "Reverend", "Hon.": "Honorable",
    "Ave.": "Avenue", "Blvd.": "Boulevard", "Rd.": "Road", "Ln.": "Lane", "Hwy.": "Highway",
    "Apt.": "Apartment", "Ste.": "Suite", "Mt.": "Mount", "Ft.": "Fort",
    "Inc.": "Incorporated", "Ltd.": "Limited", "Corp.": "Corporation", "Co.": "Company",
    "Dept.": "Department", "Univ.": "University", "Est.": "Established",
    "approx.": "approximately", "Approx.": "Approximately", "dept.": "department", "est.": "estimated", "min.": "minimum",
    "max.": "maximum", "misc.": "miscellaneous", "avg.": "average", "incl.": "including",
    "fig.": "figure", "Fig.": "Figure", "vol.": "volume", "Vol.": "Volume", "ch.": "chapter",
    "pp.": "pages", "p.": "page", "ext.": "extension", "tel.": "telephone", "Tel.": "Telephone",
    "e.g.": "for example", "i.e.": "that is", "etc.": "et cetera", "vs.": "versus", "vs": "versus",
    "a.k.a.": "also known as", "aka": "also known as", "w/": "with", "w/o": "without",
}


# Abbreviations that often close a sentence: before a capital their period is also the full stop.
# Others (titles, street types, "Mount") are followed by names, so a capital says nothing there.
_ENDS_SENTENCES = {"et cetera", "Incorporated", "Limited", "Corporation", "Company", "Junior", "Senior",
                   "Department", "Saturday", "Monday", "Tuesday", "Wednesday", "Thursday", "Friday"}


def _sentence_end_kept(m: re.Match, spoken: str) -> str:
    """An abbreviation's period can also end the sentence: keep one at the end of the text or line,
    or before a capital for the abbreviations that usually close sentences."""
    after = m.string[m.end():]
    if not m.group(0).endswith("."):
        return spoken
    if not after.strip(" ") or after.startswith("\n") or after.lstrip(" ").startswith("\n"):
        return spoken + "."
    if spoken in _ENDS_SENTENCES and re.match(r"\s+[\"“(]?[A-Z]", after):
        return spoken + "."
    return spoken


def _money(m: re.Match, british: bool) -> str:
    symbol = m.group("cur") or m.group("cur2")
    amount = m.group("amount").replace(",", "")
    scale = m.group("scale")
    names = _CURRENCIES.get(symbol, _CURRENCIES["$"])
    singular, plural, cent, cents = names
    if scale:
        scale_word = _SCALES.get(scale, _SCALES.get(scale.lower(), scale))
        return f"{num.number(amount, british)} {scale_word} {plural}"
    whole, _, fraction = amount.partition(".")
    whole_n = int(whole) if whole else 0
    parts = []
    if fraction and len(fraction) > 2:  # $0.125: not a cents amount, read as a decimal
        return f"{num.decimal(amount, british)} {plural}"
    cents_n = int(fraction.ljust(2, "0")) if fraction else 0
    if whole_n or not cents_n:
        parts.append(f"{num.cardinal(whole_n, british)} {singular if whole_n == 1 else plural}")
    if cents_n and cent:
        parts.append(f"{num.cardinal(cents_n, british)} {cent if cents_n == 1 else cents}")
    elif cents_n:
        return f"{num.decimal(amount, british)} {plural}"
    return " and ".join(parts)


def _time(m: re.Match, british: bool) -> str:
    hour, minute = int(m.group("h")), int(m.group("m"))
    ampm = m.group("ampm")
    if hour > 24 or minute > 59:
        return m.group(0)
    if minute == 0:
        spoken = f"{num.cardinal(hour)} o'clock" if not ampm else num.cardinal(hour)
        if hour in (0, 24) or hour > 12:
            spoken = f"{num.cardinal(hour)} hundred"
    elif minute < 10:
        spoken = f"{num.cardinal(hour)} oh {num.cardinal(minute)}"
    else:
        spoken = f"{num.cardinal(hour)} {num.cardinal(minute)}"
    if m.group("sec"):
        spoken += f" and {num.cardinal(int(m.group('sec')))} seconds"
    return spoken + _ampm(ampm, m)


def _ampm(ampm: str | None, m: re.Match) -> str:
    if not ampm:
        return ""
    letters = "AM" if ampm.lower().startswith("a") else "PM"
    # "9 p.m." at a sentence end: the period is also the full stop.
    if ampm.endswith(".") and re.match(r"\s*$|\s+[A-Z]", m.string[m.end():]):
        return f" {letters}."
    return f" {letters}"


def _hour_ampm(m: re.Match, british: bool) -> str:
    hour = int(m.group("h"))
    if hour > 12:
        return m.group(0)
    return num.cardinal(hour) + _ampm(m.group("ampm"), m)


def _iso_date(m: re.Match, british: bool) -> str:
    y, mo, d = int(m.group("y")), int(m.group("mo")), int(m.group("d"))
    if not (1 <= mo <= 12 and 1 <= d <= 31):
        return m.group(0)
    return _say_date(y, mo, d, british)


def _say_date(y: int | None, mo: int, d: int, british: bool) -> str:
    if british:
        spoken = f"the {num.ordinal(d)} of {MONTHS[mo - 1]}"
    else:
        spoken = f"{MONTHS[mo - 1]} {num.ordinal(d)}"
    if y is not None:
        spoken += f", {num.year(y, british)}" if not british else f" {num.year(y, british)}"
    return spoken


def _slash_date(m: re.Match, british: bool) -> str:
    a, b, y = int(m.group("a")), int(m.group("b")), m.group("y")
    mo, d = (b, a) if british else (a, b)
    if not (1 <= mo <= 12 and 1 <= d <= 31):
        mo, d = d, mo  # 15/03/2024 in a US request: only one reading is a date
        if not (1 <= mo <= 12 and 1 <= d <= 31):
            return m.group(0)
    year = int(y) if y else None
    if year is not None and len(y) == 2:
        year += 2000 if year < 50 else 1900
    return _say_date(year, mo, d, british)


def _month_day(m: re.Match, british: bool) -> str:
    month = _MONTH_ABBR[m.group("mon").lower()[:4].rstrip(".")] if m.group("mon").lower()[:4].rstrip(".") in _MONTH_ABBR \
        else _MONTH_ABBR[m.group("mon").lower()[:3]]
    d = int(m.group("d"))
    if not 1 <= d <= 31:
        return m.group(0)
    spoken = f"{month} {num.ordinal(d)}"
    if m.group("y"):
        spoken += f", {num.year(int(m.group('y')), british)}"
    return spoken


def _day_month(m: re.Match, british: bool) -> str:
    month = _MONTH_ABBR[m.group("mon").lower()[:3]]
    d = int(m.group("d"))
    if not 1 <= d <= 31:
        return m.group(0)
    spoken = f"{num.ordinal(d)} {month}" if british else f"the {num.ordinal(d)} of {month}"
    if british:
        spoken = f"the {num.ordinal(d)} of {month}"
    if m.group("y"):
        spoken += f" {num.year(int(m.group('y')), british)}"
    return spoken


def _email(m: re.Match, british: bool) -> str:
    user, domain = m.group("user"), m.group("domain")
    return f"{_spell_address(user)} at {_spell_address(domain)}"


def _spell_address(part: str) -> str:
    """Dots, dashes and underscores of an address said aloud; numbers inside read as digits."""
    out = part.replace(".", " dot ").replace("_", " underscore ").replace("-", " dash ")
    out = re.sub(r"\d+", lambda d: " " + (num.digits(d.group(0)) if len(d.group(0)) > 2 else num.cardinal(int(d.group(0)))) + " ", out)
    return " ".join(out.split())


def _url(m: re.Match, british: bool) -> str:
    url = m.group(0)
    trailing = ""
    while url and url[-1] in ".,;:!?)":
        trailing = url[-1] + trailing
        url = url[:-1]
    url = re.sub(r"^(?:https?|ftp)://", "", url, flags=re.IGNORECASE)
    host, sep, path = url.partition("/")
    spoken = _spell_address(re.sub(r"^www\.", "w w w.", host, flags=re.IGNORECASE))
    if sep:
        path_words = ["slash"]
        for piece in re.split(r"(/|\?|=|&|#)", path):
            if piece == "/":
                path_words.append("slash")
            elif piece in ("?", "=", "&", "#"):
                path_words.append({"?": "question mark", "=": "equals", "&": "and", "#": "hash"}[piece])
            elif piece:
                path_words.append(_spell_address(piece))
        if path_words and path_words[-1] == "slash":
            path_words.pop()
        spoken = " ".join([spoken, *path_words])
    # Keep a sentence-ending mark so the splitter still sees the sentence end.
    return spoken + trailing


def _phone(m: re.Match, british: bool) -> str:
    return _say_phone(m.group(0))


def _say_phone(number: str) -> str:
    """Each group of digits digit by digit, a comma between groups: "+1 555-0100" -> "plus one,
    five five five, zero one zero zero". An 800 or 900 area code is said as Americans say it:
    "1-800-555-0199" -> "one eight hundred, five five five, zero one nine nine"."""
    groups = [g for g in re.split(r"[^\d+]+", number) if g]
    spoken = []
    for i, g in enumerate(groups):
        plus = g.startswith("+")
        if g in ("800", "900") and (i == 0 or (i == 1 and groups[0].lstrip("+") == "1")) and len(groups) > i + 1:
            hundred = f"{num.cardinal(int(g[0]))} hundred"
            if i == 1:  # "one eight hundred", said as one
                spoken[-1] += f" {hundred}"
                continue
            spoken.append(hundred)
            continue
        spoken.append(("plus " if plus else "") + num.digits(g))
    return ", ".join(spoken)


def _percent(m: re.Match, british: bool) -> str:
    return f"{num.number(m.group('n'), british)} percent"


def _temperature(m: re.Match, british: bool) -> str:
    scale = {"c": " Celsius", "f": " Fahrenheit", "k": " Kelvin"}.get((m.group("scale") or "").lower(), "")
    n = m.group("n")
    unit = "degree" if n.lstrip("-\u2212") in ("1", "1.0") else "degrees"
    return f"{num.number(n, british)} {unit}{scale}"


def _ordinal(m: re.Match, british: bool) -> str:
    return num.ordinal(int(m.group("n").replace(",", "")), british)


def _version(m: re.Match, british: bool) -> str:
    prefix = "version " if m.group("v") else ""
    parts = m.group("ver").split(".")
    return prefix + " point ".join(num.number(p, british) if not (len(p) > 1 and p.startswith("0")) else num.digits(p)
                                   for p in parts)


def _range(m: re.Match, british: bool) -> str:
    return f"{_read_number(m.group('a'), british)} to {_read_number(m.group('b'), british)}"


def _quantity_range(m: re.Match, british: bool) -> str:
    """"50-60%", "20-25°C", "$5-10", "$5-$10" -> "50 to 60%", "20 to 25°C", "5 to $10": rewritten
    so the rules after this one read the unit or currency once, after the second number, as a
    person says it ("fifty to sixty percent", "five to ten dollars"), instead of reading the dash
    as "minus". A currency stays on both sides when the first amount has cents ("$5.50-$7" ->
    "$5.50 to $7"). A plain "3-5" is the range rule's."""
    a, b = m.group("a"), m.group("b")
    currency = m.group("c1") or m.group("c2")
    unit = m.group("u2") or m.group("u1") or ""
    if currency:
        return f"{currency}{a} to {currency}{b}{unit}" if "." in a else f"{a} to {currency}{b}{unit}"
    if unit:
        return f"{a} to {b}{unit}"
    return m.group(0)


def _unit(m: re.Match, british: bool) -> str:
    n, unit = m.group("n"), m.group("unit")
    singular, plural = _UNITS[unit]
    one = n.replace(",", "") in ("1", "1.0")
    return f"{num.number(n, british)} {singular if one else plural}"


def _fraction(m: re.Match, british: bool) -> str:
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
        return _say_date(None, month, day, british)
    return f"{num.cardinal(a)} {num.cardinal(b)}"


# "on 3/4", "due 1/2": a date, not three quarters or one half.
_BEFORE_DATE = re.compile(r"\b(?:[Oo]n|[Uu]ntil|[Ss]ince|[Dd]ue|[Tt]hrough|[Tt]hru)\s+$")

_UNICODE_FRACTIONS = {"½": "one half", "⅓": "one third", "⅔": "two thirds", "¼": "one quarter",
                      "¾": "three quarters", "⅛": "one eighth", "⅜": "three eighths", "⅝": "five eighths",
                      "⅞": "seven eighths", "⅕": "one fifth"}


def _plain_number(m: re.Match, british: bool) -> str:
    return _read_number(m.group(0), british)


def _read_number(text: str, british: bool) -> str:
    """A number standing alone: four digits from 1100 to 2099 without a comma read as a year."""
    if re.fullmatch(r"\d{4}", text) and 1100 <= int(text) <= 2099:
        return num.year(int(text), british)
    return num.number(text, british)


def _abbreviation(m: re.Match, british: bool) -> str:
    return _sentence_end_kept(m, ABBREVIATIONS[m.group(0)])


def _doctor_or_drive(m: re.Match, british: bool) -> str:
    """Dr. / St. before a name is Doctor / Saint ("Dr. Patel", "St. Louis"); after one, or with no
    name following, Drive / Street ("Elm Dr.", "Main St. is closed")."""
    word = m.group(0)
    after = m.string[m.end():]
    if re.match(r"[ \t]+[A-Z]", after):  # a name on the next line is no longer this one's
        return "Doctor" if word.startswith("D") else "Saint"
    return _sentence_end_kept(m, "Drive" if word.startswith("D") else "Street")


def _day_range(m: re.Match, british: bool) -> str:
    return f"{_DAYS[m.group('a').lower()]} to {_DAYS[m.group('b').lower()]}"


def _day_abbr(m: re.Match, british: bool) -> str:
    return _sentence_end_kept(m, _DAYS[m.group("d").lower()])


_SUPERSCRIPTS = str.maketrans("⁰¹²³⁴⁵⁶⁷⁸⁹", "0123456789")


def _power(m: re.Match, british: bool) -> str:
    """x² and x^2 -> x squared, m³ -> m cubed, 10⁶ and 10^6 -> 10 to the sixth, 10^-3 to the minus third."""
    n = int(m.group("sup").translate(_SUPERSCRIPTS)) if m.group("sup") else int(m.group("caret"))
    if n < 0:
        return f" to the minus {num.ordinal(-n, british)}"
    return {2: " squared", 3: " cubed"}.get(n, f" to the {num.ordinal(n, british)}")


# A Greek letter on its own, in English text (math, physics, versions): its name.
_GREEK = {"α": "alpha", "β": "beta", "γ": "gamma", "δ": "delta", "Δ": "delta", "ε": "epsilon", "θ": "theta",
          "λ": "lambda", "μ": "mu", "π": "pi", "σ": "sigma", "Σ": "sigma", "τ": "tau", "φ": "phi", "χ": "chi",
          "ψ": "psi", "ω": "omega", "Ω": "omega"}


def _symbol_words(m: re.Match, british: bool) -> str:
    return {"&": " and ", "@": " at ", "+": " plus ", "=": " equals ", "%": " percent ", "×": " times ",
            "÷": " divided by ", "°": " degrees ", "§": " section ", "¶": " paragraph ", "~": " about ",
            "<": " less than ", ">": " greater than ", "≤": " at most ", "≥": " at least ", "≈": " about ",
            "±": " plus or minus ", "→": " to ", "←": " from ", "#": " number ", "™": " ", "®": " ",
            "©": " copyright ", "|": " ", "\\": " ", "^": " ", "*": " ", "_": " ", "`": " ", "{": " ",
            "}": " ", "•": ", ", "·": " "}[m.group(0)]


def _timestamp(m: re.Match, british: bool) -> str:
    """2024-11-25T14:05:00Z -> "November twenty-fifth, twenty twenty-four, fourteen oh five UTC":
    the date, then the time to the minute (seconds said only when not zero), then the zone."""
    y, mo, d = int(m.group("y")), int(m.group("mo")), int(m.group("d"))
    hour, minute, second = int(m.group("h")), int(m.group("mi")), int(m.group("s") or 0)
    if not (1 <= mo <= 12 and 1 <= d <= 31 and hour <= 23 and minute <= 59):
        return m.group(0)
    clock = f"{hour}:{minute:02d}" + (f":{second:02d}" if second else "")
    spoken = _time(re.match(_TIME, clock), british)
    zone = m.group("zone")
    if zone in ("Z", "+00:00", "+0000"):
        spoken += " UTC"
    elif zone:
        sign, hh, mm = zone[0], int(zone[1:3]), int(zone[-2:])
        offset = num.cardinal(hh) + (f" {num.cardinal(mm)}" if mm else "")
        spoken += f" UTC {'plus' if sign == '+' else 'minus'} {offset}"
    return f"{_say_date(y, mo, d, british)}, {spoken}"


def _dimensions(m: re.Match, british: bool) -> str:
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


def _roman_numeral(m: re.Match, british: bool) -> str:
    n = _roman(m.group("roman"))
    if m.group("ruler"):
        return f"{m.group('ruler')} the {num.ordinal(n, british).capitalize()}"
    return f"{m.group('word')} {num.cardinal(n, british)}"


def _height(m: re.Match, british: bool) -> str:
    """5'11" -> five feet eleven inches; 6' 0" -> six feet."""
    feet, inches = int(m.group("ft")), m.group("inch")
    spoken = f"{num.cardinal(feet, british)} {'foot' if feet == 1 else 'feet'}"
    if inches and float(inches):
        spoken += f" {num.number(inches, british)} {'inch' if inches == '1' else 'inches'}"
    return spoken


# What "/day" and its kin mean after an amount: "$9.99/mo" is nine ninety-nine per month.
_PER = {"day": "day", "week": "week", "wk": "week", "month": "month", "mo": "month", "mth": "month",
        "year": "year", "yr": "year", "hour": "hour", "hr": "hour", "minute": "minute", "min": "minute",
        "second": "second", "sec": "second", "night": "night", "person": "person", "user": "user",
        "seat": "seat", "head": "head", "unit": "unit", "item": "item", "serving": "serving", "dose": "dose",
        "mile": "mile", "gallon": "gallon", "gal": "gallon", "license": "license"}
_PER_WORDS = "|".join(sorted(_PER, key=len, reverse=True))  # the longest first: "month" before "mo"


def _per(m: re.Match, british: bool) -> str:
    return f" per {_PER[m.group('per').lower()]}"


# Durations written compactly ("1h 20m", "2m30s", "~30s"), read whole whatever unit_normalization
# says: "h", "m" and "s" alone read as letters, and "30s" as the thirties.
def _duration(m: re.Match, british: bool) -> str:
    if m.group("n"):
        unit = {"h": "hour", "hr": "hour", "hrs": "hour", "min": "minute", "mins": "minute", "ms": "millisecond"}.get(
            m.group("unit"), "second")
        return f"about {_count(m.group('n'), unit, british)}"
    amounts = [(m.group("h"), "hour"), (m.group("m") or m.group("m2"), "minute"),
               (m.group("s") or m.group("s2"), "second")]
    return " ".join(_count(n, unit, british) for n, unit in amounts if n)


def _count(n: str, unit: str, british: bool) -> str:
    return f"{num.number(n, british)} {unit}{'' if n == '1' else 's'}"


# Ratios people write with a colon: "a 16:9 screen", "mixed 3:1", "odds of 5:2". Elsewhere "3:16" is a
# time or a verse, so a colon pair reads as a ratio only among these or after a word that says so.
_ASPECT_RATIOS = {"16:9", "4:3", "21:9", "3:2", "32:9"}  # none of them a time
_RATIO_WORDS = re.compile(r"(?:ratio|aspect|odds|mix(?:ed)?|split|scale)\s+(?:of\s+)?$", re.IGNORECASE)


def _ratio(m: re.Match, british: bool) -> str:
    before = m.string[max(0, m.start() - 24):m.start()]
    if re.search(r"[\w:.]$", before) or (m.group(0) not in _ASPECT_RATIOS and not _RATIO_WORDS.search(before)):
        return m.group(0)  # left for the time rule
    return f"{num.cardinal(int(m.group('a')), british)} to {num.cardinal(int(m.group('b')), british)}"


def _vanity_number(m: re.Match, british: bool) -> str:
    """1-800-FLOWERS: the prefix as people say it, the word as a word (not spelled letter by letter)."""
    area = m.group("area")
    prefix = f"{num.cardinal(int(area[0]))} hundred" if area.endswith("00") else num.digits(area)
    return f"one {prefix} {m.group('word').capitalize()}"


# The two-letter postal codes of the US states, DC and the territories: a ZIP code follows them.
_US_STATES = ("AL AK AZ AR CA CO CT DE DC FL GA HI ID IL IN IA KS KY LA ME MD MA MI MN MS MO MT NE NV NH NJ NM "
              "NY NC ND OH OK OR PA RI SC SD TN TX UT VT VA WA WV WI WY PR GU VI AS MP").split()


def _zip_code(m: re.Match, british: bool) -> str:
    spoken = f"{m.group('state')} {num.digits(m.group('zip'))}"
    return spoken + (f" {num.digits(m.group('plus4'))}" if m.group("plus4") else "")


def _time_unit(m: re.Match, british: bool) -> str:
    """"5 min", "25 mins.", "3 hrs", "45 secs": time after a number, whatever unit_normalization
    says ("min." alone is "minimum"; "hrs" would be spelled out); "a 5 min walk" is a five-minute
    walk. A period that may end the sentence is kept for the splitter."""
    unit = {"min": "minute", "hr": "hour", "sec": "second"}[m.group("u").rstrip("s")]
    if _AFTER_ARTICLE.search(m.string, 0, m.start()):  # "a 5 min walk": a five-minute walk
        spoken = f"{num.number(m.group('n'), british)}-{unit}"
    else:
        spoken = _count(m.group("n"), unit, british)
    after = m.string[m.end():]
    if m.group("dot") and (not after.strip(" ") or re.match(r"\s*\n|\s+[\"“(]?[A-Z]", after)):
        spoken += "."
    return spoken


_FRACTION_WORDS = {(1, 2): "a half", (1, 3): "a third", (2, 3): "two thirds", (1, 4): "a quarter",
                   (3, 4): "three quarters", (1, 8): "an eighth", (3, 8): "three eighths", (5, 8): "five eighths",
                   (7, 8): "seven eighths"}


def _mixed_fraction(m: re.Match, british: bool) -> str:
    """2 1/2 -> two and a half; a pair that is no common fraction is left to the fraction rule."""
    part = _FRACTION_WORDS.get((int(m.group("a")), int(m.group("b"))))
    if part is None:
        return m.group(0)
    return f"{num.cardinal(int(m.group('w')), british)} and {part}"


_AFTER_ARTICLE = re.compile(r"\b[Aa]n?\s$")


def _years_old(m: re.Match, british: bool) -> str:
    """25 y/o: "years old", or "year-old" before a noun ("a 25 y/o man")."""
    n = m.group("n")
    if _AFTER_ARTICLE.search(m.string, 0, m.start()):
        return f"{num.number(n, british)}-year-old"
    return f"{num.number(n, british)} {'year' if n == '1' else 'years'} old"


def _flight_number(m: re.Match, british: bool) -> str:
    """Flight DL 2417 -> "DL twenty-four seventeen", UA 1000 "ten hundred": in pairs, as said."""
    n, lead = int(m.group("n")), m.group("lead")
    if n < 100:
        spoken = num.cardinal(n, british)
    else:
        high, low = divmod(n, 100)
        tail = "hundred" if low == 0 else f"oh {num.cardinal(low)}" if low < 10 else num.cardinal(low)
        spoken = f"{num.cardinal(high, british)} {tail}"
    return f"{lead}{'' if lead.endswith(' ') else ' '}{spoken}"


def _last_digits(m: re.Match, british: bool) -> str:
    """"ending in 4821": the last digits of a card or account, digit by digit."""
    return f"{m.group('lead')}{num.digits(m.group('n'))}"


def _national_phone(m: re.Match, british: bool) -> str:
    if not 10 <= sum(ch.isdigit() for ch in m.group(0)) <= 11:
        return m.group(0)
    return _say_phone(m.group(0))


def _fiscal_year(m: re.Match, british: bool) -> str:
    """2024/25: a fiscal or school year, "twenty twenty-four to twenty-five"."""
    first, second = int(m.group("y")), int(m.group("next"))
    if second != (first + 1) % 100:
        return m.group(0)
    return f"{num.year(first, british)} to {num.cardinal(second, british) if second >= 10 else 'oh ' + num.cardinal(second)}"


def _international_phone(m: re.Match, british: bool) -> str:
    """+44 20 7946 0958: a country code and groups, 8 to 15 digits in all (E.164's longest), read as
    a phone number; fewer digits are something else ("+5 10 20")."""
    if not 8 <= sum(ch.isdigit() for ch in m.group(0)) <= 15:
        return m.group(0)
    return _say_phone(m.group(0))


_KEY = re.compile(r"(?<![\w#*])(?:#|\*(?P<digits>\d+)?)(?![\w#*])")


def _keypad(m: re.Match, british: bool) -> str:
    """A phone's keys after "press", "dial", "enter"...: # is pound (hash in British English), * is
    star, and digits after a star are keys too ("dial *67": star six seven). "#1" stays "number
    one"; outside such a clause # is that or a hashtag, and a lone * is dropped as markup."""
    def key(k: re.Match) -> str:
        name = ("hash" if british else "pound") if k.group(0) == "#" else "star"
        return name + (" " + num.digits(k.group("digits")) if k.group("digits") else "")
    return _KEY.sub(key, m.group(0))


def _keypad_code(m: re.Match, british: bool) -> str:
    """A code dialled on a phone's keys, such as *#06#, #31# or *#*#4636#*#*: it starts with a star
    or a hash and ends with a hash (or a hash and a star), with digits between, so every character
    is a key ("star pound zero six pound"), whatever verb comes before. "*#1*" (Markdown's italic
    "#1" where markup is not read) is not one."""
    hash_key = "hash" if british else "pound"
    return " ".join({"*": "star", "#": hash_key}.get(c) or num.digits(c) for c in m.group(0))


def _number_plus_ers(m: re.Match, british: bool) -> str:
    """49ers, 76ers: the number said and "-ers" joined to its last word (forty-niners,
    seventy-sixers), not "forty-nine ers"."""
    words = num.number(m.group("n"), british)
    return words + ("rs" if words.endswith("e") else "ers")


def _local_phone(m: re.Match, british: bool) -> str:
    """555-0100, a number without its area code: one after "call" or "tel.", or whose second
    group starts with 0 (no range ends in "0100"); "200-1500" alone stays a range."""
    lead, number = m.group("lead") or "", m.group("n")
    if not lead and number[4] != "0":
        return m.group(0)
    return lead + _say_phone(number)


def _emergency_number(m: re.Match, british: bool) -> str:
    """911 is said digit by digit wherever it stands (the Porsche aside); 999, 112, 988 and 111
    after "call", "dial" or "ring"."""
    if m.group("n2"):
        return num.digits(m.group("n2"))
    return f"{m.group('verb')} {num.digits(m.group('n'))}"


# Codes a caller must write down (a verification code, a PIN, an order or tracking number) are
# read character by character: "482913" is "four eight two, nine one three", not "four hundred
# eighty-two thousand...". A code is the token after such a word; words that are also verbs or
# plain nouns ("order 100 units", "case 12") need a sign that a code follows ("#", ":", "is",
# "number", "ID") unless the token mixes letters and digits. An HTTP status or error code is a
# number ("error code 500": five hundred).
_CODE_NAMES = (r"(?:verification|confirmation|security|access|one-time|promo|coupon|discount|booking|tracking)\s+code"
               r"|code|PIN|OTP|passcode|ID|reference|ref|confirmation|tracking|serial|invoice|voucher|coupon")
_CODE_NOUNS = r"order|booking|ticket|account|policy|member|customer|case|claim|reservation"
_CODE_SIGN = r"\s*(?:#|:|\bis\b|\bwas\b|\b(?:number|no\.|num|ID|code)\b)"


def _code(m: re.Match, british: bool) -> str:
    code = m.group("code")
    mixed = re.search(r"[A-Z]", code) and re.search(r"\d", code)
    if len(code) < 3 or not (m.group("sign") or m.group("name") or mixed):
        return m.group(0)  # "order 100 units": a quantity, not a code
    lead = re.sub(r"#\s*", "number ", m.group("lead"))
    return lead + ", ".join(_spell_code(part) for part in code.split("-"))


# Letters a reader says as a word rather than spells: four or more, a vowel, no three consonants in a row.
_SAYABLE = re.compile(r"(?=[A-Z]*[AEIOUY])(?![A-Z]*[B-DF-HJ-NP-TV-XZ]{3})[A-Z]{4,}")


def _spell_code(part: str) -> str:
    """A7X92Q -> "A seven X nine two Q"; digit runs over four long in groups of three, a comma
    between. A promo code with a word in it reads the word and its number: SAVE20 -> "Save twenty"."""
    runs = re.findall(r"\d+|[A-Z]+", part)
    has_word = any(_SAYABLE.fullmatch(run) for run in runs)
    words = []
    for run in runs:
        if run.isdigit() and has_word and len(run) <= 3:
            words.append(num.cardinal(int(run)))
        elif run.isdigit():
            groups = [run] if len(run) <= 4 else [run[i:i + 3] for i in range(0, len(run), 3)]
            if len(groups) > 1 and len(groups[-1]) == 1:
                groups[-2:] = [groups[-2] + groups[-1]]
            words.append(", ".join(num.digits(g) for g in groups))
        else:
            words.append(run.capitalize() if _SAYABLE.fullmatch(run) else " ".join(run))
    return " ".join(words)


# A number starts where a run of digits starts: inside "1111..." a match tried at every digit would
# scan to the run's end each time (4,096 digits took a second, a request's worth of CPU).
_NUM = r"(?<!\d)(?:\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?|\.\d+)"

# (name, pattern, function, option that enables it or None). Order matters.
RULES: list[tuple[str, re.Pattern, _Rule, str | None]] = []


def _rule(name: str, pattern: str, fn: _Rule, option: str | None = None, flags: int = 0) -> None:
    RULES.append((name, re.compile(pattern, flags), fn, option))


_rule("email", r"(?<![\w.@])(?P<user>[A-Za-z0-9._%+-]+)@(?P<domain>[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,})\b",
      _email, "email_normalization")
_rule("url", r"(?:(?:https?|ftp)://|www\.)[^\s<>\"]+|(?<![A-Za-z0-9-])[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.(?:com|org|net|io|dev|ai|edu|gov|co|uk|de|app|info)(?:/[^\s<>\"]*)?(?![\w@])",
      _url, "url_normalization")
_rule("vanity number", r"(?<![\w-])1-(?P<area>8[0-9]{2}|900)-(?P<word>[A-Z]{3,})(?![\w-])", _vanity_number,
      "phone_normalization")
_rule("emergency number", r"(?<![\w-])(?:(?P<verb>[Cc]all(?:ing|ed)?|[Dd]ial(?:ing|ed|led)?|[Tt]ext|[Rr]ing(?:ing)?)\s+"
      r"(?P<n>911|999|112|988|111)|(?P<n2>911))\b(?![\w-]|\s?(?:GT|Turbo|Carrera|Targa)\b)", _emergency_number)
_rule("zip code", r"\b(?P<state>" + "|".join(_US_STATES) + r")\s+(?P<zip>\d{5})(?:-(?P<plus4>\d{4}))?(?![\w-])",
      _zip_code)
# The whole number before a local number's rule, which would take "555-0132" of "(415) 555-0132".
_rule("phone", r"(?<![\w.-])(?:\+\d{1,3}[\s.-]?)?(?:\(\d{3}\)\s?|\d{3}[\s.-])\d{3}[\s.-]\d{4}(?![\w-])|(?<![\w.-])1-\d{3}-\d{3}-\d{4}(?![\w-])",
      _phone, "phone_normalization")
# A national number with its trunk 0, in groups (UK "020 7946 0958", "07700 900123", "0161 496 0000";
# most of Europe writes them so): 10 or 11 digits, read digit by digit, group by group.
_rule("national phone", r"(?<![\w.,+-])0\d{2,4}(?:[ -]\d{3,6}){1,2}(?![\w-]|[.,]\d)", _national_phone, "phone_normalization")
_rule("international phone", r"(?<![\w+])\+\d{1,3}(?:(?:[\s.-]?\(\d{1,4}\)[\s.-]?|[\s.-])\d{1,8}){2,6}(?![\w-]|[.,]\d)",
      _international_phone, "phone_normalization")
_rule("flight number", r"(?P<lead>\b[Ff]light\s+(?:[A-Z]{2}|[A-Z]\d|\d[A-Z])\s?)(?P<n>\d{1,4})\b", _flight_number)
_rule("last digits", r"(?P<lead>\b(?:ending|ends)\s+(?:in|with)\s+(?:\*+|x+|…|\.\.\.)?)(?P<n>\d{2,6})\b", _last_digits)
_rule("local phone", r"(?P<lead>\b(?:[Cc]all|[Tt]ext|[Dd]ial|[Pp]hone:?|[Tt]el[.:]|[Ff]ax:?)\s+)?(?<![\w.-])"
      r"(?P<n>[2-9]\d{2}-\d{4})(?![\w-])", _local_phone, "phone_normalization")
_rule("street direction", r"(?<=\d )(?P<d>NE|NW|SE|SW|N|S|E|W)\.?(?= [A-Z0-9])",
      lambda m, b: {"N": "North", "S": "South", "E": "East", "W": "West", "NE": "Northeast", "NW": "Northwest",
                    "SE": "Southeast", "SW": "Southwest"}[m.group("d")])
# "Order no. 12345", "Policy No. A-1234": the number sign, so the code rule after it reads the code.
_rule("number abbreviation", r"\b[Nn]o\.(?=\s?(?:[A-Z]{1,3}-?)?\d)",
      lambda m, b: "number" if m.string[:m.start()].rstrip()[-1:].isalnum() else "Number")
_rule("code", r"(?P<lead>(?<![Ss]tatus )(?<![Ee]rror )(?<![Ee]xit )(?<![Rr]esponse )(?<!HTTP )\b"
      r"(?:(?P<name>(?i:" + _CODE_NAMES + r"))|(?i:" + _CODE_NOUNS + r"))(?P<sign>" + _CODE_SIGN + r")*\s*)"
      r"(?P<code>(?=[A-Z0-9-]*\d)[A-Z0-9](?:[A-Z0-9-]*[A-Z0-9])?)(?![\w.,-]\w|[\w-])",
      _code)
_rule("plural", r"\b(?P<w>[A-Za-z]+)\(s\)", lambda m, b: m.group("w") + "s", "optional_pluralization_normalization")
_rule("height", r"(?<![\w.'])(?P<ft>\d{1,2})\s?['’]\s?(?P<inch>\d{1,2}(?:\.\d+)?)\s?(?:\"|''|”)"
      r"|(?<![\w.])(?P<ft2>\d{1,2})′\s?(?:(?P<inch2>\d{1,2}(?:\.\d+)?)″)?", lambda m, b: _height(
          _Groups(ft=m.group("ft") or m.group("ft2"), inch=m.group("inch") or m.group("inch2")), b))
_rule("duration", r"(?<![\w.])(?:(?P<h>\d+)\s?(?:hrs?|h)\s?(?P<m>\d+)\s?(?:mins?|m)(?:\s?(?P<s>\d+)\s?(?:secs?|s))?"
      r"|(?P<m2>\d+)\s?(?:mins?|m)\s?(?P<s2>\d+(?:\.\d+)?)\s?(?:secs?|s)"
      r"|~\s?(?P<n>\d+(?:\.\d+)?)\s?(?P<unit>hrs?|h|mins?|secs?|s|ms))\b", _duration)
# "/day" after a counted word: "30 mins/day", "3 times/week", "50 GB/month" (before the time unit
# rule, which leaves a unit with a slash after it alone)
_rule("counted per", r"(?<![\w.])(?P<counted>\d+(?:\.\d+)?\s?[A-Za-z]{1,15})\s?/\s?(?P<per>"
      + _PER_WORDS + r")\b", lambda m, b: m.group("counted") + _per(m, b),
      flags=re.IGNORECASE)
_rule("time unit", r"(?<![\w.])(?P<n>\d+(?:\.\d+)?)\s?(?P<u>mins?|hrs?|secs?)\b(?P<dot>\.)?(?!/)", _time_unit)
_rule("years old", r"(?<![\w.])(?P<n>\d{1,3})\s?y/?o\b", _years_old)
_rule("per", r"(?<=[\d%])\s?/\s?(?P<per>" + _PER_WORDS + r")\b", _per,
      flags=re.IGNORECASE)
# "10:00-11:30": two times, read "ten o'clock to eleven thirty" by the time rule after this one.
_rule("time range", r"\b(?P<a>\d{1,2}:\d{2}(?:\s?[AaPp]\.?[Mm]\.?)?)\s?[-–]\s?(?P<b>\d{1,2}:\d{2})(?![\d:])",
      lambda m, b: f"{m.group('a')} to {m.group('b')}")
_rule("ratio", r"(?P<a>\d{1,2}):(?P<b>\d{1,2})(?![\d:])", _ratio)
_TIME = r"\b(?P<h>\d{1,2}):(?P<m>\d{2})(?::(?P<sec>\d{2}))?(?:\s?(?P<ampm>[AaPp]\.?[Mm]\.?(?![A-Za-z])))?"
_rule("timestamp", r"\b(?P<y>\d{4})-(?P<mo>\d{2})-(?P<d>\d{2})[T ](?P<h>\d{2}):(?P<mi>\d{2})"
      r"(?::(?P<s>\d{2})(?:\.\d+)?)?(?P<zone>Z|[+-]\d{2}:?\d{2})?(?![\w:])", _timestamp)
_rule("iso date", r"\b(?P<y>\d{4})-(?P<mo>\d{1,2})-(?P<d>\d{1,2})\b", _iso_date)
_rule("slash date", r"\b(?P<a>\d{1,2})/(?P<b>\d{1,2})/(?P<y>\d{4}|\d{2})\b", _slash_date)
_rule("month day", r"\b(?P<mon>Jan(?:uary|\.)?|Feb(?:ruary|\.)?|Mar(?:ch|\.)?|Apr(?:il|\.)?|May|June?|July?|Aug(?:ust|\.)?|Sep(?:t|tember)?\.?|Oct(?:ober|\.)?|Nov(?:ember|\.)?|Dec(?:ember|\.)?)\s+(?P<d>\d{1,2})(?:st|nd|rd|th)?\b(?:,?\s+(?P<y>\d{4})\b)?",
      _month_day)
_rule("day month", r"\b(?P<d>\d{1,2})(?:st|nd|rd|th)?\s+(?:of\s+)?(?P<mon>January|February|March|April|May|June|July|August|September|October|November|December|Jan|Feb|Mar|Apr|Jun|Jul|Aug|Sep|Sept|Oct|Nov|Dec)\b\.?(?:,?\s+(?P<y>\d{4})\b)?",
      _day_month)
_rule("dotted time", r"\b(?P<h>\d{1,2})\.(?P<m>[0-5]\d)(?=\s?(?:[AaPp]\.?[Mm]\.?)(?![A-Za-z]))",
      lambda m, b: f"{m.group('h')}:{m.group('m')}")  # "9.30am", as British English writes it
_rule("fiscal year", r"\b(?P<y>(?:19|20)\d{2})/(?P<next>\d{2})\b(?!/)", _fiscal_year)
_rule("time", _TIME, _time)
_rule("hour range am/pm", r"\b(?P<a>\d{1,2})\s?[-–]\s?(?P<b>\d{1,2}\s?(?:[AaPp]\.[Mm]\.|[AaPp][Mm]\b))",
      lambda m, b: f"{m.group('a')} to {m.group('b')}")  # "2-4 PM": two to four PM
_rule("hour am/pm", r"\b(?P<h>\d{1,2})\s?(?P<ampm>[AaPp]\.[Mm]\.|[AaPp][Mm]\b)", _hour_ampm)
_CURRENCY_SIGN = r"(?<![A-Za-z])(?:US|AU|CA|NZ|HK|[ACSR])\$|[$£€¥₹₩₽₿]"
_CURRENCY_CODE = r"USD|EUR|GBP|JPY|AUD|CAD|NZD|CHF|INR|CNY"
_PER_UNIT = r"\s?(?:%|°\s?[CFK]?(?![A-Za-z]))"
_rule("quantity range", r"(?<![\w.,-])(?P<c1>" + _CURRENCY_SIGN + r")?(?P<a>" + _NUM + r")(?P<u1>" + _PER_UNIT
      + r")?\s?[-–]\s?(?P<c2>" + _CURRENCY_SIGN + r")?(?P<b>" + _NUM + r")(?P<u2>" + _PER_UNIT + r")?(?![\w.,]\d)",
      _quantity_range)
# "€4,20", "4,20 €": a euro amount with a decimal comma, as much of Europe writes it.
_rule("euro decimal comma", r"(?P<pre>€\s?)(?P<a>\d+),(?P<c>\d{2})(?![\d,])|(?<![\d,.])(?P<a2>\d+),(?P<c2>\d{2})\s?€",
      lambda m, b: f"€{m.group('a') or m.group('a2')}.{m.group('c') or m.group('c2')}")
_rule("money", r"(?P<cur>" + _CURRENCY_SIGN + r")\s?(?P<amount>" + _NUM + r")(?:\s?(?P<scale>thousand|million|billion|trillion|bn|mm|[kKmMbBtT])\b)?"
      r"|\b(?P<cur2>" + _CURRENCY_CODE + r")\s?(?P<amount2>" + _NUM + r")", lambda m, b: _money_any(m, b))
_rule("money after", r"\b(?P<amount>" + _NUM + r")\s?(?P<cur>" + _CURRENCY_CODE + r"|€|£)(?![\w])", lambda m, b: _money_after(m, b))
_rule("cents", r"\b(?P<n>\d+)\s?¢", lambda m, b: f"{num.cardinal(int(m.group('n')), b)} {'cent' if m.group('n') == '1' else 'cents'}")
_rule("percent", r"(?P<n>[-\u2212]?(?:" + _NUM + r"))\s?%", _percent)
_rule("temperature", r"(?P<n>[-\u2212]?(?:" + _NUM + r"))\s?°\s?(?P<scale>[CFK](?![A-Za-z]))?", _temperature)
_rule("version", r"(?:\b(?P<v>[vV])(?=\d)|(?<![\w.]))(?P<ver>\d+(?:\.\d+){2,})(?![\w.]\d)|\b(?P<v2>[vV])(?P<ver2>\d+\.\d+)\b",
      lambda m, b: _version_any(m, b))
_rule("decade", r"(?<![\w'])'?(?P<n>\d{2}|1\d{3}|20\d{2})'?s\b", lambda m, b: _decade(m, b))
# "1.5M views", "2.3bn", "1.2k users": a decimal before k, M, B or T is a count. A whole number keeps its letter:
# "Room 3B", "3M" (the company), "a 7B model" (said "seven B"); so does a name's "-82M" and "5MB".
_rule("scale", r"(?<![\w.,-])(?:(?P<n>" + _NUM + r")\s?(?P<scale>bn)|(?P<n2>\d+\.\d+)(?P<scale2>[kKMBT]))(?!\w|[.,]\d)",
      lambda m, b: f"{num.number(m.group('n') or m.group('n2'), b)} {_SCALES[m.group('scale') or m.group('scale2')]}")
_rule("dimensions", r"(?<![\w.])\d+(?:\.\d+)?x\d+(?:\.\d+)?(?:x\d+(?:\.\d+)?)?(?![\w.]\d|\w)", _dimensions)
_rule("video resolution", r"\b(?P<n>480|576|720|1080|1440|2160)(?P<p>[pi])\b",
      lambda m, b: f"{_in_pairs(int(m.group('n')))} {m.group('p').upper()}")  # a capital: not "p." (page)
_rule("roman numeral", r"\b(?:(?P<word>Chapter|Part|Volume|Vol\.|Book|Act|Scene|Article|Appendix|Phase|Stage|Season|"
      r"Episode|World War|Super Bowl|Title)|(?P<ruler>(?:King|Queen|Pope|Emperor|Tsar|Czar|Prince|Princess|Duke)"
      r"(?:\s[A-Z][a-z]+){1,2}))\s(?P<roman>[IVXLC]{1,7})\b(?![.'’]\w)", _roman_numeral)
_rule("multiplier", r"\b(?P<n>\d+(?:\.\d+)?)x\b", lambda m, b: f"{num.number(m.group('n'), b)} times")
_rule("ordinal", r"\b(?P<n>\d{1,3}(?:,\d{3})*|\d+)(?:st|nd|rd|th)\b", _ordinal)
_rule("unicode fraction", r"(?:(?<!\d)(?P<w>\d+))?\s?(?P<f>[½⅓⅔¼¾⅛⅜⅝⅞⅕])",
      lambda m, b: (f"{num.cardinal(int(m.group('w')), b)} and " if m.group("w") else "") + _UNICODE_FRACTIONS[m.group("f")])
_rule("score", r"(?<![\w/.,])(?P<a>\d+\.\d+)\s?/\s?(?P<b>\d+(?:\.\d+)?)(?![\d/])",  # 4.5/5: a rating
      lambda m, b: f"{num.number(m.group('a'), b)} out of {num.number(m.group('b'), b)}")
_rule("mixed fraction", r"(?<![\w/.,])(?P<w>\d+)[ -](?P<a>\d)/(?P<b>\d)(?![\d/])", _mixed_fraction)
_rule("blood pressure", r"(?P<lead>\b(?:BP|[Bb]lood pressure)\b[:\s]*(?:of\s+|is\s+|was\s+)?)(?P<a>\d{2,3})/(?P<b>\d{2,3})\b"
      r"|(?P<a2>\d{2,3})/(?P<b2>\d{2,3})(?=\s?mm\s?Hg)",
      lambda m, b: f"{m.group('lead') or ''}{m.group('a') or m.group('a2')} over {m.group('b') or m.group('b2')}")
_rule("fraction", r"(?<![\d/.,])(?P<a>\d{1,2})/(?P<b>\d{1,2})(?![\d/])", _fraction)
_rule("power", r"(?<=[\w)])(?:(?P<sup>[⁰¹²³⁴⁵⁶⁷⁸⁹]+)|\^(?P<caret>-?\d{1,3})\b)", _power)
_rule("micro unit", r"(?<![A-Za-z_\u0370-\u03ff])[μµ](?P<u>[mgsLl])\b",
      lambda m, b: {"m": "micrometers", "g": "micrograms", "s": "microseconds"}.get(m.group("u"), "microliters"))
_rule("unit", r"(?P<n>" + _NUM + r")\s?(?P<unit>" + "|".join(sorted((re.escape(u) for u in _UNITS), key=len, reverse=True)) + r")(?![\w/])",
      _unit, "unit_normalization")
_rule("range", r"(?<![\w.,-])(?P<a>" + _NUM + r")\s?[-–]\s?(?P<b>" + _NUM + r")(?![\w.,]\d|-)", _range)
_rule("negative", r"(?<![\w.,])[-\u2212](?P<n>" + _NUM + r")\b", lambda m, b: "minus " + num.number(m.group("n"), b))
_rule("day range", r"\b(?P<a>Mon|Tue|Tues|Wed|Thu|Thur|Thurs|Fri|Sat|Sun)\s?[-–]\s?(?P<b>Mon|Tue|Tues|Wed|Thu|Thur|Thurs|Fri|Sat|Sun)\b",
      _day_range)
_rule("day abbreviation", r"\b(?P<d>Mon|Tue|Tues|Wed|Thu|Thur|Thurs|Fri|Sat)\.", _day_abbr)
# "Mon, December first": before a date a day's short name is the day ("Mon" alone may be a name).
_rule("day before date", r"\b(?P<d>Mon|Tue|Tues|Wed|Thu|Thur|Thurs|Fri|Sat|Sun),?(?=\s+(?:January|February|March|April|May|"
      r"June|July|August|September|October|November|December|the\s+\w+\s+of)\b)", lambda m, b: _DAYS[m.group("d").lower()] + ",")
_rule("title", r"\b(?P<t>Ms|Mx)\b(?=\s+[A-Z])", lambda m, b: {"Ms": "Miz", "Mx": "Mix"}[m.group("t")])
_rule("doctor / saint", r"\b(?:Dr|St)\.(?=[\s,;:]|$)|\b(?:Dr|St)\b(?=\s+[A-Z])", _doctor_or_drive)
_rule("abbreviation", r"(?<![\w.])(?:" + "|".join(sorted((re.escape(a) for a in ABBREVIATIONS), key=len, reverse=True))
      + r")(?=[\s,;:!?)\"']|$)", _abbreviation)
_rule("keypad code", r"(?<![\w#*])[*#][*#\d]*\d[*#\d]*#\*?(?![\w#*])", _keypad_code)
_rule("keypad", r"\b(?:[Pp]ress(?:ing)?|[Dd]ial(?:ing)?|[Hh]it(?:ting)?|[Ee]nter(?:ing)?|[Tt]ap(?:ping)?|[Pp]ush(?:ing)?)\b"
      r"[^.!?;\n]*?[#*][^.!?;\n]*", _keypad)
_rule("number sign", r"#\s?(?=\d)", lambda m, b: "number ")
_rule("hashtag", r"(?<![\w#])#(?=[A-Za-z])", lambda m, b: "hashtag ", "replace_remaining_symbols")
_rule("dotted name", r"(?<![\w-])[A-Za-z][\w-]*(?:\.[A-Za-z][\w-]*)+\b",
      lambda m, b: _dotted_name(m.group(0)), "url_normalization")
_rule("number plus ers", r"(?<![\w.,])(?P<n>[1-9]?[1-9])ers\b", _number_plus_ers)
_rule("number", _NUM, _plain_number)
_rule("slash between words", r"(?<=[A-Za-z])/(?=[A-Za-z])", lambda m, b: " ")
_rule("greek letter", r"(?<![\u0370-\u03ff\u1f00-\u1fff])[" + "".join(_GREEK) + r"](?![\u0370-\u03ff\u1f00-\u1fff])",
      lambda m, b: f" {_GREEK[m.group(0)]} ", "replace_remaining_symbols")
_rule("symbols", r"[&@+=%×÷°§¶~<>≤≥≈±→←#™®©|\\^*_`{}•·]", _symbol_words, "replace_remaining_symbols")


def _dotted_name(name: str) -> str:
    """node.js / config.yaml -> "node dot js"; initials (U.S) and a missed space ("end.The") stay."""
    parts = name.split(".")
    if all(len(p) == 1 for p in parts) or any(p[:1].isupper() for p in parts[1:]):
        return name
    return name.replace(".", " dot ")


def _decade(m: re.Match, british: bool) -> str:
    """1990s -> nineteen nineties, '80s -> eighties, 1900s -> nineteen hundreds."""
    n = int(m.group("n"))
    if n % 10 != 0:
        return m.group(0)
    spoken = num.year(n, british) if n >= 100 else num.cardinal(n, british)
    head, _, last = spoken.rpartition(" ")
    plural = last[:-1] + "ies" if last.endswith("y") else last + "s"
    return f"{head} {plural}".strip()


def _money_any(m: re.Match, british: bool) -> str:
    if m.group("cur2"):
        return _money(_Groups(cur=None, cur2=m.group("cur2"), amount=m.group("amount2"), scale=None), british)
    return _money(m, british)


def _money_after(m: re.Match, british: bool) -> str:
    return _money(_Groups(cur=m.group("cur"), cur2=None, amount=m.group("amount"), scale=None), british)


def _version_any(m: re.Match, british: bool) -> str:
    v, ver = (m.group("v2"), m.group("ver2")) if m.group("ver2") else (m.group("v"), m.group("ver"))
    if v and _AFTER_VERSION.search(m.string, 0, m.start()):  # "version v2.1": the word is said already
        v = None
    return _version(_Groups(v=v, ver=ver), british)


_AFTER_VERSION = re.compile(r"\bversion\s*$", re.IGNORECASE)


class _Groups:
    """A stand-in for re.Match when a rule reuses another rule's function with other groups."""

    def __init__(self, **groups):
        self._groups = groups

    def group(self, name):
        return self._groups[name]


def _spaced(m: re.Match, spoken: str) -> str:
    """Keep a replacement from gluing onto a neighbouring word: "B12" -> "B twelve", not "Btwelve"."""
    if spoken == m.group(0) or not spoken:
        return spoken
    source = m.string
    if m.start() > 0 and source[m.start() - 1].isalnum() and spoken[0].isalnum():
        spoken = " " + spoken
    if m.end() < len(source) and source[m.end()].isalnum() and spoken[-1].isalnum():
        spoken = spoken + " "
    return spoken


def _normalize_english(text: str, options: NormalizationOptions, british: bool) -> str:
    if not text.strip():
        return text
    for name, pattern, fn, option in RULES:
        if option is not None and not getattr(options, option):
            continue
        text = pattern.sub(lambda m, fn=fn: _spaced(m, fn(m, british)), text)
    text = re.sub(r"\b(AM|PM)\s?[-–]\s?(?=[a-z])", r"\1 to ", text)  # 9am-5pm
    text = text.replace("...", "…")
    return text
