"""Units after a number: lengths, weights, bytes (with unit_normalization), percent, degrees,
heights in feet and inches, and what "/day" means after an amount."""

from __future__ import annotations

import re

from worker.text import numbers as num
from worker.text.read_numbers import WRITTEN_NUMBER

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

PERCENT = re.compile(r"(?P<n>[-\u2212]?(?:" + WRITTEN_NUMBER + r"))\s?%")


def say_percent(m: re.Match, british: bool) -> str:
    return f"{num.number(m.group('n'), british)} percent"


TEMPERATURE = re.compile(r"(?P<n>[-\u2212]?(?:" + WRITTEN_NUMBER + r"))\s?°\s?(?P<scale>[CFK](?![A-Za-z]))?")


def say_temperature(m: re.Match, british: bool) -> str:
    scale = {"c": " Celsius", "f": " Fahrenheit", "k": " Kelvin"}.get((m.group("scale") or "").lower(), "")
    n = m.group("n")
    unit = "degree" if n.lstrip("-\u2212") in ("1", "1.0") else "degrees"
    return f"{num.number(n, british)} {unit}{scale}"


UNIT = re.compile(r"(?P<n>" + WRITTEN_NUMBER + r")\s?(?P<unit>" + "|".join(sorted((re.escape(u) for u in _UNITS), key=len, reverse=True)) + r")(?![\w/])")


def say_unit(m: re.Match, british: bool) -> str:
    n, unit = m.group("n"), m.group("unit")
    singular, plural = _UNITS[unit]
    one = n.replace(",", "") in ("1", "1.0")
    return f"{num.number(n, british)} {singular if one else plural}"


# What "/day" and its kin mean after an amount: "$9.99/mo" is nine ninety-nine per month.
_PER_SAID = {"day": "day", "week": "week", "wk": "week", "month": "month", "mo": "month", "mth": "month",
             "year": "year", "yr": "year", "hour": "hour", "hr": "hour", "minute": "minute", "min": "minute",
             "second": "second", "sec": "second", "night": "night", "person": "person", "user": "user",
             "seat": "seat", "head": "head", "unit": "unit", "item": "item", "serving": "serving", "dose": "dose",
             "mile": "mile", "gallon": "gallon", "gal": "gallon", "license": "license"}

_PER_WORDS = "|".join(sorted(_PER_SAID, key=len, reverse=True))  # the longest first: "month" before "mo"

PER = re.compile(r"(?<=[\d%])\s?/\s?(?P<per>" + _PER_WORDS + r")\b", re.IGNORECASE)


def say_per(m: re.Match, british: bool) -> str:
    return f" per {_PER_SAID[m.group('per').lower()]}"


HEIGHT = re.compile(r"(?<![\w.'])(?P<ft>\d{1,2})\s?['’]\s?(?P<inch>\d{1,2}(?:\.\d+)?)\s?(?:\"|''|”)"
                    r"|(?<![\w.])(?P<ft2>\d{1,2})′\s?(?:(?P<inch2>\d{1,2}(?:\.\d+)?)″)?")


def say_height(m: re.Match, british: bool) -> str:
    """5'11" -> five feet eleven inches; 6' 0" -> six feet."""
    feet, inches = int(m.group("ft") or m.group("ft2")), m.group("inch") or m.group("inch2")
    spoken = f"{num.cardinal(feet, british)} {'foot' if feet == 1 else 'feet'}"
    if inches and float(inches):
        spoken += f" {num.number(inches, british)} {'inch' if inches == '1' else 'inches'}"
    return spoken


COUNTED_PER = re.compile(r"(?<![\w.])(?P<counted>\d+(?:\.\d+)?\s?[A-Za-z]{1,15})\s?/\s?(?P<per>"
                         + _PER_WORDS + r")\b", re.IGNORECASE)


def say_counted_per(m: re.Match, british: bool) -> str:
    return m.group("counted") + say_per(m, british)


MICRO_UNIT = re.compile(r"(?<![A-Za-z_\u0370-\u03ff])[μµ](?P<u>[mgsLl])\b")


def say_micro_unit(m: re.Match, british: bool) -> str:
    return {"m": "micrometers", "g": "micrograms", "s": "microseconds"}.get(m.group("u"), "microliters")
