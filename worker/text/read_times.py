"""Clock times, dates, days of the week and durations, as a speaker of US or British English says them."""

from __future__ import annotations

import re

from worker.text import numbers as num
from worker.text.read_abbreviations import sentence_end_kept

MONTHS = ("January", "February", "March", "April", "May", "June", "July", "August", "September",
          "October", "November", "December")

_MONTH_ABBR = {m[:3].lower(): m for m in MONTHS} | {"sept": "September"}

_DAYS = {"mon": "Monday", "tue": "Tuesday", "tues": "Tuesday", "wed": "Wednesday", "thu": "Thursday",
         "thur": "Thursday", "thurs": "Thursday", "fri": "Friday", "sat": "Saturday", "sun": "Sunday"}

TIME = re.compile(r"\b(?P<h>\d{1,2}):(?P<m>\d{2})(?::(?P<sec>\d{2}))?(?:\s?(?P<ampm>[AaPp]\.?[Mm]\.?(?![A-Za-z])))?")


def say_time(m: re.Match, british: bool) -> str:
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


HOUR_AM_PM = re.compile(r"\b(?P<h>\d{1,2})\s?(?P<ampm>[AaPp]\.[Mm]\.|[AaPp][Mm]\b)")


def say_hour_am_pm(m: re.Match, british: bool) -> str:
    hour = int(m.group("h"))
    if hour > 12:
        return m.group(0)
    return num.cardinal(hour) + _ampm(m.group("ampm"), m)


ISO_DATE = re.compile(r"\b(?P<y>\d{4})-(?P<mo>\d{1,2})-(?P<d>\d{1,2})\b")


def say_iso_date(m: re.Match, british: bool) -> str:
    y, mo, d = int(m.group("y")), int(m.group("mo")), int(m.group("d"))
    if not (1 <= mo <= 12 and 1 <= d <= 31):
        return m.group(0)
    return spoken_date(y, mo, d, british)


def spoken_date(y: int | None, mo: int, d: int, british: bool) -> str:
    if british:
        spoken = f"the {num.ordinal(d)} of {MONTHS[mo - 1]}"
    else:
        spoken = f"{MONTHS[mo - 1]} {num.ordinal(d)}"
    if y is not None:
        spoken += f", {num.year(y, british)}" if not british else f" {num.year(y, british)}"
    return spoken


SLASH_DATE = re.compile(r"\b(?P<a>\d{1,2})/(?P<b>\d{1,2})/(?P<y>\d{4}|\d{2})\b")


def say_slash_date(m: re.Match, british: bool) -> str:
    a, b, y = int(m.group("a")), int(m.group("b")), m.group("y")
    mo, d = (b, a) if british else (a, b)
    if not (1 <= mo <= 12 and 1 <= d <= 31):
        mo, d = d, mo  # 15/03/2024 in a US request: only one reading is a date
        if not (1 <= mo <= 12 and 1 <= d <= 31):
            return m.group(0)
    year = int(y) if y else None
    if year is not None and len(y) == 2:
        year += 2000 if year < 50 else 1900
    return spoken_date(year, mo, d, british)


MONTH_DAY = re.compile(r"\b(?P<mon>Jan(?:uary|\.)?|Feb(?:ruary|\.)?|Mar(?:ch|\.)?|Apr(?:il|\.)?|May|June?|July?|Aug(?:ust|\.)?|Sep(?:t|tember)?\.?|Oct(?:ober|\.)?|Nov(?:ember|\.)?|Dec(?:ember|\.)?)\s+(?P<d>\d{1,2})(?:st|nd|rd|th)?\b(?:,?\s+(?P<y>\d{4})\b)?")


def say_month_day(m: re.Match, british: bool) -> str:
    month = _MONTH_ABBR[m.group("mon").lower()[:4].rstrip(".")] if m.group("mon").lower()[:4].rstrip(".") in _MONTH_ABBR \
        else _MONTH_ABBR[m.group("mon").lower()[:3]]
    return _named_month_date(m, british, lambda d: f"{month} {num.ordinal(d)}", ", ")


DAY_MONTH = re.compile(r"\b(?P<d>\d{1,2})(?:st|nd|rd|th)?\s+(?:of\s+)?(?P<mon>January|February|March|April|May|June|July|August|September|October|November|December|Jan|Feb|Mar|Apr|Jun|Jul|Aug|Sep|Sept|Oct|Nov|Dec)\b\.?(?:,?\s+(?P<y>\d{4})\b)?")


def say_day_month(m: re.Match, british: bool) -> str:
    month = _MONTH_ABBR[m.group("mon").lower()[:3]]
    return _named_month_date(m, british, lambda d: f"the {num.ordinal(d)} of {month}", " ")


def _named_month_date(m: re.Match, british: bool, day_and_month, year_joint: str) -> str:
    """A date with its month in words: the day (1-31, else the text stays as written) said as
    `day_and_month` says it, then the year, if any, after `year_joint`."""
    d = int(m.group("d"))
    if not 1 <= d <= 31:
        return m.group(0)
    spoken = day_and_month(d)
    if m.group("y"):
        spoken += f"{year_joint}{num.year(int(m.group('y')), british)}"
    return spoken


DAY_RANGE = re.compile(r"\b(?P<a>Mon|Tue|Tues|Wed|Thu|Thur|Thurs|Fri|Sat|Sun)\s?[-–]\s?(?P<b>Mon|Tue|Tues|Wed|Thu|Thur|Thurs|Fri|Sat|Sun)\b")


def say_day_range(m: re.Match, british: bool) -> str:
    return f"{_DAYS[m.group('a').lower()]} to {_DAYS[m.group('b').lower()]}"


DAY_ABBREVIATION = re.compile(r"\b(?P<d>Mon|Tue|Tues|Wed|Thu|Thur|Thurs|Fri|Sat)\.")


def say_day_abbreviation(m: re.Match, british: bool) -> str:
    return sentence_end_kept(m, _DAYS[m.group("d").lower()])


TIMESTAMP = re.compile(r"\b(?P<y>\d{4})-(?P<mo>\d{2})-(?P<d>\d{2})[T ](?P<h>\d{2}):(?P<mi>\d{2})"
                       r"(?::(?P<s>\d{2})(?:\.\d+)?)?(?P<zone>Z|[+-]\d{2}:?\d{2})?(?![\w:])")


def say_timestamp(m: re.Match, british: bool) -> str:
    """An ISO 8601 timestamp (a log's date, T, time and zone): the date, then the time to the
    minute (seconds said only when not zero), then the zone, "... fourteen oh five UTC"."""
    y, mo, d = int(m.group("y")), int(m.group("mo")), int(m.group("d"))
    hour, minute, second = int(m.group("h")), int(m.group("mi")), int(m.group("s") or 0)
    if not (1 <= mo <= 12 and 1 <= d <= 31 and hour <= 23 and minute <= 59):
        return m.group(0)
    clock = f"{hour}:{minute:02d}" + (f":{second:02d}" if second else "")
    spoken = say_time(TIME.match(clock), british)
    zone = m.group("zone")
    if zone in ("Z", "+00:00", "+0000"):
        spoken += " UTC"
    elif zone:
        sign, hh, mm = zone[0], int(zone[1:3]), int(zone[-2:])
        offset = num.cardinal(hh) + (f" {num.cardinal(mm)}" if mm else "")
        spoken += f" UTC {'plus' if sign == '+' else 'minus'} {offset}"
    return f"{spoken_date(y, mo, d, british)}, {spoken}"


# Durations written compactly ("1h 20m", "2m30s", "~30s"), read whole whatever unit_normalization
# says: "h", "m" and "s" alone read as letters, and "30s" as the thirties.
DURATION = re.compile(r"(?<![\w.])(?:(?P<h>\d+)\s?(?:hrs?|h)\s?(?P<m>\d+)\s?(?:mins?|m)(?:\s?(?P<s>\d+)\s?(?:secs?|s))?"
                      r"|(?P<m2>\d+)\s?(?:mins?|m)\s?(?P<s2>\d+(?:\.\d+)?)\s?(?:secs?|s)"
                      r"|~\s?(?P<n>\d+(?:\.\d+)?)\s?(?P<unit>hrs?|h|mins?|secs?|s|ms))\b")


def say_duration(m: re.Match, british: bool) -> str:
    if m.group("n"):
        unit = {"h": "hour", "hr": "hour", "hrs": "hour", "min": "minute", "mins": "minute", "ms": "millisecond"}.get(
            m.group("unit"), "second")
        return f"about {_count(m.group('n'), unit, british)}"
    amounts = [(m.group("h"), "hour"), (m.group("m") or m.group("m2"), "minute"),
               (m.group("s") or m.group("s2"), "second")]
    return " ".join(_count(n, unit, british) for n, unit in amounts if n)


def _count(n: str, unit: str, british: bool) -> str:
    return f"{num.number(n, british)} {unit}{'' if n == '1' else 's'}"


TIME_UNIT = re.compile(r"(?<![\w.])(?P<n>\d+(?:\.\d+)?)\s?(?P<u>mins?|hrs?|secs?)\b(?P<dot>\.)?(?!/)")


def say_time_unit(m: re.Match, british: bool) -> str:
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


_AFTER_ARTICLE = re.compile(r"\b[Aa]n?\s$")

YEARS_OLD = re.compile(r"(?<![\w.])(?P<n>\d{1,3})\s?y/?o\b")


def say_years_old(m: re.Match, british: bool) -> str:
    """25 y/o: "years old", or "year-old" before a noun ("a 25 y/o man")."""
    n = m.group("n")
    if _AFTER_ARTICLE.search(m.string, 0, m.start()):
        return f"{num.number(n, british)}-year-old"
    return f"{num.number(n, british)} {'year' if n == '1' else 'years'} old"


FISCAL_YEAR = re.compile(r"\b(?P<y>(?:19|20)\d{2})/(?P<next>\d{2})\b(?!/)")


def say_fiscal_year(m: re.Match, british: bool) -> str:
    """2024/25: a fiscal or school year, "twenty twenty-four to twenty-five"."""
    first, second = int(m.group("y")), int(m.group("next"))
    if second != (first + 1) % 100:
        return m.group(0)
    return f"{num.year(first, british)} to {num.cardinal(second, british) if second >= 10 else 'oh ' + num.cardinal(second)}"


TIME_RANGE = re.compile(r"\b(?P<a>\d{1,2}:\d{2}(?:\s?[AaPp]\.?[Mm]\.?)?)\s?[-–]\s?(?P<b>\d{1,2}:\d{2})(?![\d:])")


def say_time_range(m: re.Match, british: bool) -> str:
    return f"{m.group('a')} to {m.group('b')}"


DOTTED_TIME = re.compile(r"\b(?P<h>\d{1,2})\.(?P<m>[0-5]\d)(?=\s?(?:[AaPp]\.?[Mm]\.?)(?![A-Za-z]))")


def say_dotted_time(m: re.Match, british: bool) -> str:
    return f"{m.group('h')}:{m.group('m')}"  # "9.30am", as British English writes it


HOUR_RANGE_AM_PM = re.compile(r"\b(?P<a>\d{1,2})\s?[-–]\s?(?P<b>\d{1,2}\s?(?:[AaPp]\.[Mm]\.|[AaPp][Mm]\b))")


def say_hour_range_am_pm(m: re.Match, british: bool) -> str:
    return f"{m.group('a')} to {m.group('b')}"  # "2-4 PM": two to four PM


DAY_BEFORE_DATE = re.compile(r"\b(?P<d>Mon|Tue|Tues|Wed|Thu|Thur|Thurs|Fri|Sat|Sun),?(?=\s+(?:January|February|March|April|May|"
                             r"June|July|August|September|October|November|December|the\s+\w+\s+of)\b)")


def say_day_before_date(m: re.Match, british: bool) -> str:
    return _DAYS[m.group("d").lower()] + ","
