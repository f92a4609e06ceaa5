"""Abbreviations read as their words: titles, street types, Latin shorthand, compass points. A
period that is also the sentence's full stop is kept for the splitter (`sentence_end_kept`)."""

from __future__ import annotations

import re

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


def sentence_end_kept(m: re.Match, spoken: str) -> str:
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


STREET_DIRECTION = re.compile(r"(?<=\d )(?P<d>NE|NW|SE|SW|N|S|E|W)\.?(?= [A-Z0-9])")
_DIRECTIONS = {"N": "North", "S": "South", "E": "East", "W": "West", "NE": "Northeast", "NW": "Northwest",
               "SE": "Southeast", "SW": "Southwest"}


def say_street_direction(m: re.Match, british: bool) -> str:
    return _DIRECTIONS[m.group("d")]


TITLE = re.compile(r"\b(?P<t>Ms|Mx)\b(?=\s+[A-Z])")


def say_title(m: re.Match, british: bool) -> str:
    return {"Ms": "Miz", "Mx": "Mix"}[m.group("t")]


DR_OR_ST = re.compile(r"\b(?:Dr|St)\.(?=[\s,;:]|$)|\b(?:Dr|St)\b(?=\s+[A-Z])")


def say_dr_or_st(m: re.Match, british: bool) -> str:
    """Dr. / St. before a name is Doctor / Saint ("Dr. Patel", "St. Louis"); after one, or with no
    name following, Drive / Street ("Elm Dr.", "Main St. is closed")."""
    word = m.group(0)
    after = m.string[m.end():]
    if re.match(r"[ \t]+[A-Z]", after):  # a name on the next line is no longer this one's
        return "Doctor" if word.startswith("D") else "Saint"
    return sentence_end_kept(m, "Drive" if word.startswith("D") else "Street")


ABBREVIATION = re.compile(r"(?<![\w.])(?:" + "|".join(sorted((re.escape(a) for a in ABBREVIATIONS), key=len, reverse=True))
                          + r")(?=[\s,;:!?)\"']|$)")


def say_abbreviation(m: re.Match, british: bool) -> str:
    return sentence_end_kept(m, ABBREVIATIONS[m.group(0)])
