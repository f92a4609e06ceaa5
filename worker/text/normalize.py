"""English text normalization: what users type -> words Kokoro can say.

Each rule is one regex with one small function, applied in the fixed order of the table `RULES`
below; the patterns and functions live by domain in worker/text/read_*.py (numbers, money, times
and dates, phones and codes, units, abbreviations, addresses, symbols). Anything no rule matches
passes through unchanged, so normalization never deletes a word; the G2P reads what is left
(acronyms, unknown words via espeak-ng).

Options follow Kokoro-FastAPI's `normalization_options` field for field, so its clients work as is.
Markup that is not text (custom pronunciations `[word](/phonemes/)`, pause tags `[pause:0.5s]`) is
kept out of normalization by `normalize_text`; Markdown, HTML and SSML are read as rendered text
first (worker/text/markup.py), then the deployment's lexicon (worker/text/lexicon.py) marks its words.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass

from worker.text import (localized, read_abbreviations, read_addresses, read_money, read_numbers, read_phones,
                         read_symbols, read_times, read_units)
from worker.text.lexicon import Lexicon
from worker.text.markup import KOKORO_MARKUP, read_markup
from worker.text.read_rule import Rule
from worker.text.source_map import MappedText, plain_or_mapped


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


@plain_or_mapped
def clean_text(text: MappedText) -> MappedText:
    """Always applied, even with normalization off: control characters become spaces, invisible
    format characters (zero-width joiners, soft hyphens, BOM) go, every script's decimal digits
    become ASCII ones (fullwidth ３, Devanagari ३), whitespace runs collapse. Newlines survive (they
    mark paragraph ends for the splitter)."""
    edits = []
    for i, ch in enumerate(text.text):
        if " " <= ch <= "~" or ch == "\n":
            continue  # printable ASCII: nothing to clean (most of most texts)
        cat = unicodedata.category(ch)
        if cat == "Cc" or cat in ("Zl", "Zp") or ch in "\u2028\u2029":
            edits.append((i, i + 1, " " if ch not in "\r\u2028\u2029" else "\n"))
        elif cat in ("Cf", "Cs", "Co", "Cn") and not ch.isspace():
            edits.append((i, i + 1, ""))
        elif cat == "Nd" and not ch.isascii():
            edits.append((i, i + 1, str(unicodedata.digit(ch))))  # "３", "٣", "३": misaki's Japanese numbers died on all but ASCII
    if edits:
        text = text.edited([(a, b, r) for a, b, r in edits if r != text.text[a:b]])
    text = text.sub(_SPACE_RUN, " ")
    text = text.sub(_LINE_BREAK, "\n")
    return text.strip()


# Whitespace to collapse to one space (a single space is left alone: matching it would cost a call each).
_SPACE_RUN = re.compile(r"[^\S\n]{2,}|[^\S \n]")
_LINE_BREAK = re.compile(r" *\n\s*")

_JAPANESE_RANGE = re.compile(r"[〜～](?=\d)")



@plain_or_mapped
def normalize_text(text: MappedText, options: NormalizationOptions | None = None, lang_code: str = "a",
                   lexicon: Lexicon | None = None) -> MappedText:
    """Normalize `text` for `lang_code` (English rules for `a` and `b`; in every other language,
    dates, clock times and the signs its reader would drop in words (worker/text/localized.py), then
    Mandarin's numbers read out by cn2an, as misaki does, so "10%" becomes 百分之十, and Japanese's
    wave dash before a number read "kara"; espeak-ng and misaki's Japanese reader read their
    numbers themselves). Markdown, HTML and SSML are first read as rendered text, in every
    language (`read_markup`); then the deployment's `lexicon` (KOKORO_LEXICON) marks its words as
    Kokoro's pronunciation links, which, like its pause tags, pass through untouched. Given a
    MappedText, the result maps back to it (a plain string gives a plain string)."""
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

        def rules(piece: MappedText) -> MappedText:
            return spoken_numbers(localized.normalize(digit_strings(piece), lang_code))
    elif lang_code == "j":
        def rules(piece: MappedText) -> MappedText:  # "10〜20人": from ten to twenty, as misaki reads it
            return localized.normalize(piece.sub(_JAPANESE_RANGE, "から"), lang_code)  # before 20 is 二十
    elif lang_code in localized.LANGUAGES:
        def rules(piece: MappedText) -> MappedText:
            return localized.normalize(piece, lang_code)
    else:
        def rules(piece: MappedText) -> MappedText:
            return _normalize_english(piece, options, lang_code == "b")
    pieces, last = [], 0
    for m in KOKORO_MARKUP.finditer(text.text):
        pieces.append(rules(text[last:m.start()]))
        pieces.append(text[m.start():m.end()])
        last = m.end()
    pieces.append(rules(text[last:]))
    return MappedText.join(pieces).sub(_SPACE_RUN, " ").strip()


# Every English rule in the order it is applied: the order matters (an email is read before its dots
# become "dot", a phone number before its digits become a range). Each rule's pattern and function
# live in the read_*.py module of its domain; `british` selects "and" in numbers and the date order.
RULES: tuple[Rule, ...] = (
    Rule("email", read_addresses.EMAIL, read_addresses.say_email, "email_normalization"),
    Rule("url", read_addresses.URL, read_addresses.say_url, "url_normalization"),
    Rule("vanity number", read_phones.VANITY_NUMBER, read_phones.say_vanity_number, "phone_normalization"),
    Rule("emergency number", read_phones.EMERGENCY_NUMBER, read_phones.say_emergency_number),
    Rule("zip code", read_phones.ZIP_CODE, read_phones.say_zip_code),
    # The whole number before a local number's rule, which would take "555-0132" of "(415) 555-0132".
    Rule("phone", read_phones.PHONE, read_phones.say_phone, "phone_normalization"),
    # A national number with its trunk 0, in groups (UK "020 7946 0958", "07700 900123", "0161 496 0000";
    # most of Europe writes them so): 10 or 11 digits, read digit by digit, group by group.
    Rule("national phone", read_phones.NATIONAL_PHONE, read_phones.say_national_phone, "phone_normalization"),
    Rule("international phone", read_phones.INTERNATIONAL_PHONE, read_phones.say_international_phone, "phone_normalization"),
    Rule("flight number", read_phones.FLIGHT_NUMBER, read_phones.say_flight_number),
    Rule("last digits", read_phones.LAST_DIGITS, read_phones.say_last_digits),
    Rule("local phone", read_phones.LOCAL_PHONE, read_phones.say_local_phone, "phone_normalization"),
    Rule("street direction", read_abbreviations.STREET_DIRECTION, read_abbreviations.say_street_direction),
    # "Order no. 12345", "Policy No. A-1234": the number sign, so the code rule after it reads the code.
    Rule("number abbreviation", read_phones.NUMBER_ABBREVIATION, read_phones.say_number_abbreviation),
    Rule("code", read_phones.CODE, read_phones.say_code),
    Rule("plural", read_symbols.PLURAL, read_symbols.say_plural, "optional_pluralization_normalization"),
    Rule("height", read_units.HEIGHT, read_units.say_height),
    Rule("duration", read_times.DURATION, read_times.say_duration),
    # "/day" after a counted word: "30 mins/day", "3 times/week", "50 GB/month" (before the time unit
    # rule, which leaves a unit with a slash after it alone)
    Rule("counted per", read_units.COUNTED_PER, read_units.say_counted_per),
    Rule("time unit", read_times.TIME_UNIT, read_times.say_time_unit),
    Rule("years old", read_times.YEARS_OLD, read_times.say_years_old),
    Rule("per", read_units.PER, read_units.say_per),
    # "10:00-11:30": two times, read "ten o'clock to eleven thirty" by the time rule after this one.
    Rule("time range", read_times.TIME_RANGE, read_times.say_time_range),
    Rule("ratio", read_numbers.RATIO, read_numbers.say_ratio),
    Rule("timestamp", read_times.TIMESTAMP, read_times.say_timestamp),
    Rule("iso date", read_times.ISO_DATE, read_times.say_iso_date),
    Rule("slash date", read_times.SLASH_DATE, read_times.say_slash_date),
    Rule("month day", read_times.MONTH_DAY, read_times.say_month_day),
    Rule("day month", read_times.DAY_MONTH, read_times.say_day_month),
    Rule("dotted time", read_times.DOTTED_TIME, read_times.say_dotted_time),
    Rule("fiscal year", read_times.FISCAL_YEAR, read_times.say_fiscal_year),
    Rule("time", read_times.TIME, read_times.say_time),
    Rule("hour range am/pm", read_times.HOUR_RANGE_AM_PM, read_times.say_hour_range_am_pm),
    Rule("hour am/pm", read_times.HOUR_AM_PM, read_times.say_hour_am_pm),
    Rule("quantity range", read_money.QUANTITY_RANGE, read_money.say_quantity_range),
    # "€4,20", "4,20 €": a euro amount with a decimal comma, as much of Europe writes it.
    Rule("euro decimal comma", read_money.EURO_DECIMAL_COMMA, read_money.say_euro_decimal_comma),
    Rule("money", read_money.MONEY, read_money.say_money),
    Rule("money after", read_money.MONEY_AFTER, read_money.say_money_after),
    Rule("cents", read_money.CENTS, read_money.say_cents),
    Rule("percent", read_units.PERCENT, read_units.say_percent),
    Rule("temperature", read_units.TEMPERATURE, read_units.say_temperature),
    Rule("version", read_numbers.VERSION_NUMBER, read_numbers.say_version_number),
    Rule("decade", read_numbers.DECADE, read_numbers.say_decade),
    # "1.5M views", "2.3bn", "1.2k users": a decimal before k, M, B or T is a count. A whole number keeps its letter:
    # "Room 3B", "3M" (the company), "a 7B model" (said "seven B"); so does a name's "-82M" and "5MB".
    Rule("scale", read_numbers.SCALE, read_numbers.say_scale),
    Rule("dimensions", read_numbers.DIMENSIONS, read_numbers.say_dimensions),
    Rule("video resolution", read_numbers.VIDEO_RESOLUTION, read_numbers.say_video_resolution),
    Rule("roman numeral", read_numbers.ROMAN_NUMERAL, read_numbers.say_roman_numeral),
    Rule("multiplier", read_numbers.MULTIPLIER, read_numbers.say_multiplier),
    Rule("ordinal", read_numbers.ORDINAL, read_numbers.say_ordinal),
    Rule("unicode fraction", read_numbers.UNICODE_FRACTION, read_numbers.say_unicode_fraction),
    Rule("score", read_numbers.SCORE, read_numbers.say_score),
    Rule("mixed fraction", read_numbers.MIXED_FRACTION, read_numbers.say_mixed_fraction),
    Rule("blood pressure", read_numbers.BLOOD_PRESSURE, read_numbers.say_blood_pressure),
    Rule("fraction", read_numbers.FRACTION, read_numbers.say_fraction),
    Rule("power", read_numbers.POWER, read_numbers.say_power),
    Rule("micro unit", read_units.MICRO_UNIT, read_units.say_micro_unit),
    Rule("unit", read_units.UNIT, read_units.say_unit, "unit_normalization"),
    Rule("range", read_numbers.RANGE, read_numbers.say_range),
    Rule("negative", read_numbers.NEGATIVE, read_numbers.say_negative),
    Rule("day range", read_times.DAY_RANGE, read_times.say_day_range),
    Rule("day abbreviation", read_times.DAY_ABBREVIATION, read_times.say_day_abbreviation),
    # "Mon, December first": before a date a day's short name is the day ("Mon" alone may be a name).
    Rule("day before date", read_times.DAY_BEFORE_DATE, read_times.say_day_before_date),
    Rule("title", read_abbreviations.TITLE, read_abbreviations.say_title),
    Rule("doctor / saint", read_abbreviations.DR_OR_ST, read_abbreviations.say_dr_or_st),
    Rule("abbreviation", read_abbreviations.ABBREVIATION, read_abbreviations.say_abbreviation),
    Rule("keypad code", read_phones.KEYPAD_CODE, read_phones.say_keypad_code),
    Rule("keypad", read_phones.KEYPAD, read_phones.say_keypad),
    Rule("number sign", read_phones.NUMBER_SIGN, read_phones.say_number_sign),
    Rule("hashtag", read_symbols.HASHTAG, read_symbols.say_hashtag, "replace_remaining_symbols"),
    Rule("dotted name", read_addresses.DOTTED_NAME, read_addresses.say_dotted_name, "url_normalization"),
    Rule("number plus ers", read_numbers.NUMBER_PLUS_ERS, read_numbers.say_number_plus_ers),
    Rule("number", read_numbers.NUMBER, read_numbers.say_number),
    Rule("slash between words", read_symbols.SLASH_BETWEEN_WORDS, read_symbols.say_slash_between_words),
    Rule("greek letter", read_symbols.GREEK_LETTER, read_symbols.say_greek_letter, "replace_remaining_symbols"),
    Rule("symbols", read_symbols.SYMBOLS, read_symbols.say_symbols, "replace_remaining_symbols"),
)


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


def _normalize_english(text: MappedText, options: NormalizationOptions, british: bool) -> MappedText:
    if not text.text.strip():
        return text
    for rule in RULES:
        if rule.option is not None and not getattr(options, rule.option):
            continue
        text = text.sub(rule.pattern, lambda m, say=rule.say: _spaced(m, say(m, british)))
    text = text.sub(_AM_PM_BEFORE_WORD, r"\1 to ")  # 9am-5pm
    return text.replace("...", "…")


_AM_PM_BEFORE_WORD = re.compile(r"\b(AM|PM)\s?[-–]\s?(?=[a-z])")
