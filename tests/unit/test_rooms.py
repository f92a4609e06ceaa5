"""Rooms that say what they hold: one `free_port` for the tests too (api/ports.py's)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _python_files(*roots: str) -> list[Path]:
    return sorted(p for root in roots for p in (ROOT / root).rglob("*.py") if "__pycache__" not in p.parts)


def test_the_tests_use_the_one_free_port():
    own = [f"{p.relative_to(ROOT)}:{node.lineno}" for p in _python_files("tests")
           for node in ast.walk(ast.parse(p.read_text())) if isinstance(node, ast.FunctionDef)
           and node.name.lstrip("_") == "free_port"]
    assert not own, "define no free_port of your own; import api.ports.free_port:\n" + "\n".join(own)
