"""Amounts of money in the currencies people write ("$1,284.50", "€4,20", "20 CAD", "$2M"), and
ranges of amounts, percents and degrees, rewritten so the unit is read once, after the second number."""

from __future__ import annotations

import re

from worker.text import numbers as num
from worker.text.read_numbers import SCALE_WORDS, WRITTEN_NUMBER

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


def _money(symbol: str, amount: str, scale: str | None, british: bool) -> str:
    amount = amount.replace(",", "")
    names = _CURRENCIES.get(symbol, _CURRENCIES["$"])
    singular, plural, cent, cents = names
    if scale:
        scale_word = SCALE_WORDS.get(scale, SCALE_WORDS.get(scale.lower(), scale))
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


_CURRENCY_SIGN = r"(?<![A-Za-z])(?:US|AU|CA|NZ|HK|[ACSR])\$|[$£€¥₹₩₽₿]"

_PER_UNIT = r"\s?(?:%|°\s?[CFK]?(?![A-Za-z]))"

QUANTITY_RANGE = re.compile(r"(?<![\w.,-])(?P<c1>" + _CURRENCY_SIGN + r")?(?P<a>" + WRITTEN_NUMBER + r")(?P<u1>" + _PER_UNIT
                            + r")?\s?[-–]\s?(?P<c2>" + _CURRENCY_SIGN + r")?(?P<b>" + WRITTEN_NUMBER + r")(?P<u2>" + _PER_UNIT + r")?(?![\w.,]\d)")


def say_quantity_range(m: re.Match, british: bool) -> str:
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


_CURRENCY_CODE = r"USD|EUR|GBP|JPY|AUD|CAD|NZD|CHF|INR|CNY"

MONEY = re.compile(r"(?P<cur>" + _CURRENCY_SIGN + r")\s?(?P<amount>" + WRITTEN_NUMBER + r")(?:\s?(?P<scale>thousand|million|billion|trillion|bn|mm|[kKmMbBtT])\b)?"
                   r"|\b(?P<cur2>" + _CURRENCY_CODE + r")\s?(?P<amount2>" + WRITTEN_NUMBER + r")")


def say_money(m: re.Match, british: bool) -> str:
    if m.group("cur2"):
        return _money(m.group("cur2"), m.group("amount2"), None, british)
    return _money(m.group("cur"), m.group("amount"), m.group("scale"), british)


MONEY_AFTER = re.compile(r"\b(?P<amount>" + WRITTEN_NUMBER + r")\s?(?P<cur>" + _CURRENCY_CODE + r"|€|£)(?![\w])")


def say_money_after(m: re.Match, british: bool) -> str:
    return _money(m.group("cur"), m.group("amount"), None, british)


EURO_DECIMAL_COMMA = re.compile(r"(?P<pre>€\s?)(?P<a>\d+),(?P<c>\d{2})(?![\d,])|(?<![\d,.])(?P<a2>\d+),(?P<c2>\d{2})\s?€")


def say_euro_decimal_comma(m: re.Match, british: bool) -> str:
    return f"€{m.group('a') or m.group('a2')}.{m.group('c') or m.group('c2')}"


CENTS = re.compile(r"\b(?P<n>\d+)\s?¢")


def say_cents(m: re.Match, british: bool) -> str:
    return f"{num.cardinal(int(m.group('n')), british)} {'cent' if m.group('n') == '1' else 'cents'}"
