"""`kokoro-fleet settings`: the configuration table (docs/configuration.md carries the same table)."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from api.settings import settings_table

BEGIN, END = "<!-- settings:begin -->", "<!-- settings:end -->"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--write-readme", metavar="README", help="replace the table between the settings markers of this file")


def readme_block(text: str) -> str:
    """The table a page (docs/configuration.md) currently carries between its settings markers."""
    match = re.search(re.escape(BEGIN) + r"\n(.*?)" + re.escape(END), text, re.S)
    if not match:
        raise ValueError(f"no {BEGIN} ... {END} markers")
    return match.group(1).strip()


def run(args: argparse.Namespace) -> int:
    table = settings_table()
    if not args.write_readme:
        print(table)
        return 0
    path = Path(args.write_readme)
    text = path.read_text(encoding="utf-8")
    readme_block(text)  # the markers must be there
    start, end = text.index(BEGIN) + len(BEGIN), text.index(END)
    path.write_text(text[:start] + "\n" + table + "\n" + text[end:], encoding="utf-8")
    print(f"updated the settings table in {path}")
    return 0
