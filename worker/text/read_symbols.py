"""Signs left for the last rules, once every other rule has read its text: "word(s)", hashtags,
slashes between words, Greek letters and symbols, read as words."""

from __future__ import annotations

import re

PLURAL = re.compile(r"\b(?P<w>[A-Za-z]+)\(s\)")


def say_plural(m: re.Match, british: bool) -> str:
    return m.group("w") + "s"


HASHTAG = re.compile(r"(?<![\w#])#(?=[A-Za-z])")


def say_hashtag(m: re.Match, british: bool) -> str:
    return "hashtag "


SLASH_BETWEEN_WORDS = re.compile(r"(?<=[A-Za-z])/(?=[A-Za-z])")


def say_slash_between_words(m: re.Match, british: bool) -> str:
    return " "


# A Greek letter on its own, in English text (math, physics, versions): its name.
_GREEK = {"α": "alpha", "β": "beta", "γ": "gamma", "δ": "delta", "Δ": "delta", "ε": "epsilon", "θ": "theta",
          "λ": "lambda", "μ": "mu", "π": "pi", "σ": "sigma", "Σ": "sigma", "τ": "tau", "φ": "phi", "χ": "chi",
          "ψ": "psi", "ω": "omega", "Ω": "omega"}
GREEK_LETTER = re.compile(r"(?<![\u0370-\u03ff\u1f00-\u1fff])[" + "".join(_GREEK) + r"](?![\u0370-\u03ff\u1f00-\u1fff])")


def say_greek_letter(m: re.Match, british: bool) -> str:
    return f" {_GREEK[m.group(0)]} "


SYMBOLS = re.compile(r"[&@+=%×÷°§¶~<>≤≥≈±→←#™®©|\\^*_`{}•·]")


def say_symbols(m: re.Match, british: bool) -> str:
    return {"&": " and ", "@": " at ", "+": " plus ", "=": " equals ", "%": " percent ", "×": " times ",
            "÷": " divided by ", "°": " degrees ", "§": " section ", "¶": " paragraph ", "~": " about ",
            "<": " less than ", ">": " greater than ", "≤": " at most ", "≥": " at least ", "≈": " about ",
            "±": " plus or minus ", "→": " to ", "←": " from ", "#": " number ", "™": " ", "®": " ",
            "©": " copyright ", "|": " ", "\\": " ", "^": " ", "*": " ", "_": " ", "`": " ", "{": " ",
            "}": " ", "•": ", ", "·": " "}[m.group(0)]
