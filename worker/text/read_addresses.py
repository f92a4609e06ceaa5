"""Mail and web addresses, and dotted file or package names, read aloud: "a.b@c.org" is "a dot b at
c dot org", "node.js" is "node dot js"."""

from __future__ import annotations

import re

from worker.text import numbers as num


EMAIL = re.compile(r"(?<![\w.@])(?P<user>[A-Za-z0-9._%+-]+)@(?P<domain>[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,})\b")


def say_email(m: re.Match, british: bool) -> str:
    user, domain = m.group("user"), m.group("domain")
    return f"{_spell_address(user)} at {_spell_address(domain)}"


def _spell_address(part: str) -> str:
    """Dots, dashes and underscores of an address said aloud; numbers inside read as digits."""
    out = part.replace(".", " dot ").replace("_", " underscore ").replace("-", " dash ")
    out = re.sub(r"\d+", lambda d: " " + (num.digits(d.group(0)) if len(d.group(0)) > 2 else num.cardinal(int(d.group(0)))) + " ", out)
    return " ".join(out.split())


URL = re.compile(r"(?:(?:https?|ftp)://|www\.)[^\s<>\"]+|(?<![A-Za-z0-9-])[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*"
                 r"\.(?:com|org|net|io|dev|ai|edu|gov|co|uk|de|app|info)(?:/[^\s<>\"]*)?(?![\w@])")


def say_url(m: re.Match, british: bool) -> str:
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


DOTTED_NAME = re.compile(r"(?<![\w-])[A-Za-z][\w-]*(?:\.[A-Za-z][\w-]*)+\b")


def say_dotted_name(m: re.Match, british: bool) -> str:
    """node.js / config.yaml -> "node dot js"; initials (U.S) and a missed space ("end.The") stay."""
    name = m.group(0)
    parts = name.split(".")
    if all(len(p) == 1 for p in parts) or any(p[:1].isupper() for p in parts[1:]):
        return name
    return name.replace(".", " dot ")
