"""The sample text sets a load test sends, shipped inside the package (`loadtest/texts/*.txt`)."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

# name -> how the file splits into request texts: one per line, or the whole file as one request.
BUILTIN = {"short": "line", "paragraphs": "line", "long": "file"}


def load_texts(spec: str) -> list[str]:
    """The texts of a set: `short` (one sentence a request), `paragraphs` (one paragraph a
    request), `long` (the whole passage, one request), or a file path: one text per non-empty
    line, or the whole file as one text when written `PATH:whole`."""
    if spec in BUILTIN:
        raw = resources.files("loadtest").joinpath("texts", f"{spec}.txt").read_text(encoding="utf-8")
        unit = BUILTIN[spec]
    else:
        path, unit = (spec[: -len(":whole")], "file") if spec.endswith(":whole") else (spec, "line")
        p = Path(path)
        if not p.is_file():
            raise ValueError(f"--texts {spec!r}: not one of {', '.join(BUILTIN)} and no such file")
        raw = p.read_text(encoding="utf-8")
    if unit == "file":
        texts = [raw.strip()]
    else:
        texts = [line.strip() for line in raw.splitlines() if line.strip()]
    if not texts or not any(texts):
        raise ValueError(f"--texts {spec!r} holds no text")
    return texts
