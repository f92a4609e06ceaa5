"""What a reading rule is made of: a name, a pattern, a function that says each match, and the
NormalizationOptions field that turns it off. The table of rules, in order, is in normalize.py."""

from __future__ import annotations

import re
from typing import Callable, NamedTuple

# A match and whether British English is read -> the words said in its place.
Say = Callable[[re.Match, bool], str]


class Rule(NamedTuple):
    name: str
    pattern: re.Pattern
    say: Say
    option: str | None = None  # the NormalizationOptions switch that enables it; None: always on
