"""Numbers as English words, on top of num2words.

num2words writes British-style cardinals ("one thousand, two hundred and eighty-four"); American
speech drops the "and" and nobody says the comma, so we post-process. `british=True` keeps the "and".
"""

from __future__ import annotations

from num2words import num2words

DIGIT_WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")


def _tidy(words: str, british: bool) -> str:
    words = words.replace(",", "")
    if not british:
        words = words.replace(" and ", " ")
    return " ".join(words.split())


def cardinal(n: int, british: bool = False) -> str:
    """173 -> "one hundred seventy-three" (GB: "one hundred and seventy-three")."""
    if n < 0:
        return "minus " + cardinal(-n, british)
    return _tidy(num2words(n), british)


def ordinal(n: int, british: bool = False) -> str:
    """22 -> "twenty-second"."""
    return _tidy(num2words(n, to="ordinal"), british)


def year(n: int, british: bool = False) -> str:
    """1987 -> "nineteen eighty-seven", 2005 -> "two thousand five", 1900 -> "nineteen hundred"."""
    if n % 1000 == 0 or not 1000 <= n <= 2099 or 2000 <= n <= 2009:
        return cardinal(n, british)
    if n % 100 == 0:
        return cardinal(n // 100) + " hundred"
    if n % 100 < 10:
        return cardinal(n // 100) + " oh " + DIGIT_WORDS[n % 10]  # 1905 -> nineteen oh five
    return cardinal(n // 100) + " " + cardinal(n % 100)


def digits(text: str) -> str:
    """"0199" -> "zero one nine nine" (any non-digit is skipped)."""
    return " ".join(DIGIT_WORDS[int(c)] for c in text if c.isdigit() and c.isascii())


def decimal(text: str, british: bool = False) -> str:
    """"12.5" -> "twelve point five", ".5" -> "point five", "1,284.50" -> "... point five zero"."""
    text = text.replace(",", "")
    negative = text.startswith(("-", "\u2212"))
    text = text.lstrip("-\u2212")
    whole, _, fraction = text.partition(".")
    words = []
    if whole:
        words.append(cardinal(int(whole), british))
    if fraction:
        words.append("point " + digits(fraction))
    spoken = " ".join(words)
    return ("minus " + spoken) if negative else spoken


def number(text: str, british: bool = False) -> str:
    """Any plain number as written: "1,284" / "-3" / "12.5" / "007"."""
    plain = text.replace(",", "")
    if "." in plain:
        return decimal(plain, british)
    negative = plain.startswith(("-", "\u2212"))
    plain = plain.lstrip("-\u2212")
    if len(plain) > 1 and plain.startswith("0"):
        spoken = digits(plain)  # 007, 0199: read digit by digit
    elif len(plain) > 15:
        spoken = digits(plain)  # card-number-like strings: nobody reads them as quadrillions
    else:
        spoken = cardinal(int(plain), british)
    return ("minus " + spoken) if negative else spoken
