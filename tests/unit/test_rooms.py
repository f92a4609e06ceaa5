"""Rooms that say what they hold: one `free_port` for the tests too (api/ports.py's); nothing in the
product imports `loadtest/`; no import cycle between the parts of `worker/`, lazy imports counted."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from test_import_cycles import import_cycles, import_graph, project_modules

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("api", "cli", "worker")  # what a deployment runs; loadtest/ and tests/ measure and check it
PRODUCT_SCRIPTS = ("modal_app.py",)


def _python_files(*roots: str) -> list[Path]:
    files = [p for root in roots for p in (ROOT / root).rglob("*.py") if "__pycache__" not in p.parts]
    return sorted(files + [ROOT / s for s in PRODUCT_SCRIPTS if (ROOT / s).exists() and s.endswith(".py")
                           and any(r in PRODUCT for r in roots)])


def test_the_tests_use_the_one_free_port():
    own = [f"{p.relative_to(ROOT)}:{node.lineno}" for p in _python_files("tests")
           for node in ast.walk(ast.parse(p.read_text())) if isinstance(node, ast.FunctionDef)
           and node.name.lstrip("_") == "free_port"]
    assert not own, "define no free_port of your own; import api.ports.free_port:\n" + "\n".join(own)


def _loadtest_imports(tree: ast.AST) -> list[int]:
    """Lines importing loadtest: import statements, and any string that names one of its modules
    (what importlib, a command table or `python -m` would import)."""
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            names = [node.module or ""]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and re.fullmatch(r"\w+(\.\w+)+", node.value):
            names = [node.value]  # a dotted module name (a bare "loadtest" may be a directory's)
        else:
            continue
        if any(n == "loadtest" or n.startswith("loadtest.") for n in names):
            lines.append(node.lineno)
    return sorted(lines)


def test_nothing_in_the_product_imports_the_load_tests():
    found = [f"{p.relative_to(ROOT)}:{line}" for p in _python_files(*PRODUCT)
             for line in _loadtest_imports(ast.parse(p.read_text()))]
    assert not found, "\n".join(found)


def test_a_string_import_of_the_load_tests_is_found():
    tree = ast.parse("import importlib\nCOMMANDS = {'bench': ('loadtest.bench.engine_bench', 'benchmark')}\n"
                     "mod = importlib.import_module(COMMANDS['bench'][0])\nfrom loadtest import texts\n")
    assert _loadtest_imports(tree) == [2, 4]


def test_the_parts_of_the_replica_library_import_each_other_one_way():
    """worker.model, worker.weights, worker.text, ... as parts: no two import each other, however
    deep the modules and wherever the import (a lazy import inside a function counts too)."""
    graph = import_graph(project_modules())
    part = lambda module: ".".join(module.split(".")[:2])  # noqa: E731  worker.model.kokoro -> worker.model
    parts: dict[str, dict[str, int]] = {}
    for module, edges in graph.items():
        if module.startswith("worker."):
            targets = parts.setdefault(part(module), {})
            for target, line in edges.items():
                if target.startswith("worker.") and part(target) != part(module):
                    targets.setdefault(part(target), line)
    assert import_cycles(parts) == []
