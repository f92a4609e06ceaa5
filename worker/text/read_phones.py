"""Phone numbers, ZIP codes, flight numbers, and codes a caller writes down, read digit by digit."""

from __future__ import annotations

import re

from worker.text import numbers as num

PHONE = re.compile(r"(?<![\w.-])(?:\+\d{1,3}[\s.-]?)?(?:\(\d{3}\)\s?|\d{3}[\s.-])\d{3}[\s.-]\d{4}(?![\w-])|(?<![\w.-])1-\d{3}-\d{3}-\d{4}(?![\w-])")


def say_phone(m: re.Match, british: bool) -> str:
    return _spoken_phone(m.group(0))


def _spoken_phone(number: str) -> str:
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


VANITY_NUMBER = re.compile(r"(?<![\w-])1-(?P<area>8[0-9]{2}|900)-(?P<word>[A-Z]{3,})(?![\w-])")


def say_vanity_number(m: re.Match, british: bool) -> str:
    """1-800-FLOWERS: the prefix as people say it, the word as a word (not spelled letter by letter)."""
    area = m.group("area")
    prefix = f"{num.cardinal(int(area[0]))} hundred" if area.endswith("00") else num.digits(area)
    return f"one {prefix} {m.group('word').capitalize()}"


# The two-letter postal codes of the US states, DC and the territories: a ZIP code follows them.
_US_STATES = ("AL AK AZ AR CA CO CT DE DC FL GA HI ID IL IN IA KS KY LA ME MD MA MI MN MS MO MT NE NV NH NJ NM "
              "NY NC ND OH OK OR PA RI SC SD TN TX UT VT VA WA WV WI WY PR GU VI AS MP").split()

ZIP_CODE = re.compile(r"\b(?P<state>" + "|".join(_US_STATES) + r")\s+(?P<zip>\d{5})(?:-(?P<plus4>\d{4}))?(?![\w-])")


def say_zip_code(m: re.Match, british: bool) -> str:
    spoken = f"{m.group('state')} {num.digits(m.group('zip'))}"
    return spoken + (f" {num.digits(m.group('plus4'))}" if m.group("plus4") else "")


FLIGHT_NUMBER = re.compile(r"(?P<lead>\b[Ff]light\s+(?:[A-Z]{2}|[A-Z]\d|\d[A-Z])\s?)(?P<n>\d{1,4})\b")


def say_flight_number(m: re.Match, british: bool) -> str:
    """Flight DL 2417 -> "DL twenty-four seventeen", UA 1000 "ten hundred": in pairs, as said."""
    n, lead = int(m.group("n")), m.group("lead")
    if n < 100:
        spoken = num.cardinal(n, british)
    else:
        high, low = divmod(n, 100)
        tail = "hundred" if low == 0 else f"oh {num.cardinal(low)}" if low < 10 else num.cardinal(low)
        spoken = f"{num.cardinal(high, british)} {tail}"
    return f"{lead}{'' if lead.endswith(' ') else ' '}{spoken}"


LAST_DIGITS = re.compile(r"(?P<lead>\b(?:ending|ends)\s+(?:in|with)\s+(?:\*+|x+|…|\.\.\.)?)(?P<n>\d{2,6})\b")


def say_last_digits(m: re.Match, british: bool) -> str:
    """"ending in 4821": the last digits of a card or account, digit by digit."""
    return f"{m.group('lead')}{num.digits(m.group('n'))}"


NATIONAL_PHONE = re.compile(r"(?<![\w.,+-])0\d{2,4}(?:[ -]\d{3,6}){1,2}(?![\w-]|[.,]\d)")


def say_national_phone(m: re.Match, british: bool) -> str:
    if not 10 <= sum(ch.isdigit() for ch in m.group(0)) <= 11:
        return m.group(0)
    return _spoken_phone(m.group(0))


INTERNATIONAL_PHONE = re.compile(r"(?<![\w+])\+\d{1,3}(?:(?:[\s.-]?\(\d{1,4}\)[\s.-]?|[\s.-])\d{1,8}){2,6}(?![\w-]|[.,]\d)")


def say_international_phone(m: re.Match, british: bool) -> str:
    """+44 20 7946 0958: a country code and groups, 8 to 15 digits in all (E.164's longest), read as
    a phone number; fewer digits are something else ("+5 10 20")."""
    if not 8 <= sum(ch.isdigit() for ch in m.group(0)) <= 15:
        return m.group(0)
    return _spoken_phone(m.group(0))


_KEY = re.compile(r"(?<![\w#*])(?:#|\*(?P<digits>\d+)?)(?![\w#*])")

KEYPAD = re.compile(r"\b(?:[Pp]ress(?:ing)?|[Dd]ial(?:ing)?|[Hh]it(?:ting)?|[Ee]nter(?:ing)?|[Tt]ap(?:ping)?|[Pp]ush(?:ing)?)\b"
                    r"[^.!?;\n]*?[#*][^.!?;\n]*")


def say_keypad(m: re.Match, british: bool) -> str:
    """A phone's keys after "press", "dial", "enter"...: # is pound (hash in British English), * is
    star, and digits after a star are keys too ("dial *67": star six seven). "#1" stays "number
    one"; outside such a clause # is that or a hashtag, and a lone * is dropped as markup."""
    def key(k: re.Match) -> str:
        name = ("hash" if british else "pound") if k.group(0) == "#" else "star"
        return name + (" " + num.digits(k.group("digits")) if k.group("digits") else "")
    return _KEY.sub(key, m.group(0))


KEYPAD_CODE = re.compile(r"(?<![\w#*])[*#][*#\d]*\d[*#\d]*#\*?(?![\w#*])")


def say_keypad_code(m: re.Match, british: bool) -> str:
    """A code dialled on a phone's keys, such as *#06#, #31# or *#*#4636#*#*: it starts with a star
    or a hash and ends with a hash (or a hash and a star), with digits between, so every character
    is a key ("star pound zero six pound"), whatever verb comes before. "*#1*" (Markdown's italic
    "#1" where markup is not read) is not one."""
    hash_key = "hash" if british else "pound"
    return " ".join({"*": "star", "#": hash_key}.get(c) or num.digits(c) for c in m.group(0))


LOCAL_PHONE = re.compile(r"(?P<lead>\b(?:[Cc]all|[Tt]ext|[Dd]ial|[Pp]hone:?|[Tt]el[.:]|[Ff]ax:?)\s+)?(?<![\w.-])"
                         r"(?P<n>[2-9]\d{2}-\d{4})(?![\w-])")


def say_local_phone(m: re.Match, british: bool) -> str:
    """555-0100, a number without its area code: one after "call" or "tel.", or whose second
    group starts with 0 (no range ends in "0100"); "200-1500" alone stays a range."""
    lead, number = m.group("lead") or "", m.group("n")
    if not lead and number[4] != "0":
        return m.group(0)
    return lead + _spoken_phone(number)


EMERGENCY_NUMBER = re.compile(r"(?<![\w-])(?:(?P<verb>[Cc]all(?:ing|ed)?|[Dd]ial(?:ing|ed|led)?|[Tt]ext|[Rr]ing(?:ing)?)\s+"
                              r"(?P<n>911|999|112|988|111)|(?P<n2>911))\b(?![\w-]|\s?(?:GT|Turbo|Carrera|Targa)\b)")


def say_emergency_number(m: re.Match, british: bool) -> str:
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

CODE = re.compile(r"(?P<lead>(?<![Ss]tatus )(?<![Ee]rror )(?<![Ee]xit )(?<![Rr]esponse )(?<!HTTP )\b"
                  r"(?:(?P<name>(?i:" + _CODE_NAMES + r"))|(?i:" + _CODE_NOUNS + r"))(?P<sign>" + _CODE_SIGN + r")*\s*)"
                  r"(?P<code>(?=[A-Z0-9-]*\d)[A-Z0-9](?:[A-Z0-9-]*[A-Z0-9])?)(?![\w.,-]\w|[\w-])")


def say_code(m: re.Match, british: bool) -> str:
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


NUMBER_ABBREVIATION = re.compile(r"\b[Nn]o\.(?=\s?(?:[A-Z]{1,3}-?)?\d)")


def say_number_abbreviation(m: re.Match, british: bool) -> str:
    return "number" if m.string[:m.start()].rstrip()[-1:].isalnum() else "Number"


NUMBER_SIGN = re.compile(r"#\s?(?=\d)")


def say_number_sign(m: re.Match, british: bool) -> str:
    return "number "
