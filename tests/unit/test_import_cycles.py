"""No import cycle among the project's own modules (api/, worker/, loadtest/, modal_app.py).

Every import counts, at module level or inside a function: a lazy import only hides a cycle from
the interpreter, the two modules still depend on each other. Importing `a.b.c` counts as a
dependency on `a.b.c` alone, not on the packages above it (whose __init__ Python runs too), so a
package that re-exports its submodules is no cycle with them; `from a.b import name` depends on
the submodule `a.b.name` when there is one, else on the package `a.b`.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("api", "cli", "worker", "loadtest")
SCRIPTS = ("modal_app.py",)


def project_modules(root: Path = ROOT) -> dict[str, Path]:
    """Dotted module name -> file, for every Python file of the project's packages and scripts."""
    modules = {}
    files = [p for package in PACKAGES for p in (root / package).rglob("*.py")]
    files += [root / script for script in SCRIPTS if (root / script).exists()]
    for path in files:
        parts = path.relative_to(root).with_suffix("").parts
        if "__pycache__" in parts:
            continue
        if parts[-1] == "__init__":
            parts = parts[:-1]
        modules[".".join(parts)] = path
    return modules


def _imported(node: ast.Import | ast.ImportFrom, module: str, is_package: bool) -> list[str]:
    """The dotted names one import statement asks for, relative imports made absolute."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = node.module or ""
    if node.level:
        anchor = module.split(".") if is_package else module.split(".")[:-1]
        anchor = anchor[:len(anchor) - (node.level - 1)]
        base = ".".join([*anchor, base] if base else anchor)
    return [f"{base}.{alias.name}" for alias in node.names] + [base]


def import_graph(modules: dict[str, Path]) -> dict[str, dict[str, int]]:
    """module -> {project module it imports: line of the first such import}."""
    graph: dict[str, dict[str, int]] = {}
    for module, path in modules.items():
        edges: dict[str, int] = {}
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in ast.walk(tree):
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            names = _imported(node, module, path.name == "__init__.py")
            if isinstance(node, ast.ImportFrom):
                # "from pkg import sub" names the submodule; "from pkg import func" the package itself
                wanted = [n for n in names[:-1] if n in modules] or [names[-1]]
            else:
                wanted = names
            for name in wanted:
                if name in modules and name != module:
                    edges.setdefault(name, node.lineno)
        graph[module] = edges
    return graph


def import_cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """One cycle (first module repeated at the end) per strongly connected group of modules."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def connect(v: str) -> None:  # Tarjan's algorithm; the graph is a few hundred nodes deep at most
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return [_cycle_within(set(group), graph) for group in sorted(groups)]


def _cycle_within(group: set[str], graph: dict[str, dict[str, int]]) -> list[str]:
    """The shortest path from the group's first module back to itself, inside the group."""
    start = min(group)
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        following = []
        for v in frontier:
            for w in sorted(graph[v]):
                if w == start:
                    return paths[v] + [start]
                if w in group and w not in paths:
                    paths[w] = paths[v] + [w]
                    following.append(w)
        frontier = following
    raise AssertionError(f"no cycle through {start} in {sorted(group)}")


def describe(cycle: list[str], graph: dict[str, dict[str, int]], modules: dict[str, Path]) -> str:
    hops = [f"{a} imports {b} ({modules[a].relative_to(ROOT)}:{graph[a][b]})" for a, b in zip(cycle, cycle[1:])]
    return " -> ".join(cycle) + "\n    " + "\n    ".join(hops)


def test_the_project_has_no_import_cycle():
    modules = project_modules()
    graph = import_graph(modules)
    cycles = import_cycles(graph)
    assert not cycles, "import cycles among the project's modules:\n" + "\n".join(
        describe(c, graph, modules) for c in cycles)


def test_the_replica_library_imports_nothing_from_the_server():
    """worker/ is the replica as a library: the server (api/) builds its parameters from the settings,
    never the other way round."""
    graph = import_graph(project_modules())
    upward = {f"{module} imports {target} (line {line})"
              for module, edges in graph.items() if module == "worker" or module.startswith("worker.")
              for target, line in edges.items() if target == "api" or target.startswith("api.")}
    assert not upward, "\n".join(sorted(upward))


def _write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


@pytest.mark.parametrize("files, cycle", [
    ({"worker/__init__.py": "", "worker/a.py": "from worker.b import f\n",
      "worker/b.py": "def f():\n    from worker import a\n"}, ["worker.a", "worker.b", "worker.a"]),
    ({"api/__init__.py": "", "api/x.py": "from . import y\n", "api/y.py": "import api.z\n",
      "api/z.py": "from .x import g\n"}, ["api.x", "api.y", "api.z", "api.x"]),
    ({"worker/__init__.py": "", "loadtest/__init__.py": "", "worker/m.py": "import loadtest.n\n",
      "loadtest/n.py": "from worker.m import h\n"}, ["loadtest.n", "worker.m", "loadtest.n"]),
])
def test_a_cycle_is_found_and_named(tmp_path, files, cycle):
    """Module-level, function-level and relative imports all make edges; the cycle is named in order."""
    _write(tmp_path, files)
    modules = project_modules(tmp_path)
    assert import_cycles(import_graph(modules)) == [cycle]


def test_a_package_reexporting_its_submodules_is_no_cycle(tmp_path):
    _write(tmp_path, {"worker/__init__.py": "", "worker/text/__init__.py": "from worker.text.chunks import f\n",
                      "worker/text/chunks.py": "from worker.text.g2p import g\ndef f(): pass\n",
                      "worker/text/g2p.py": "def g(): pass\n",
                      "worker/text/cli.py": "from worker.text import f\n"})
    graph = import_graph(project_modules(tmp_path))
    assert graph["worker.text.cli"] == {"worker.text": 1}
    assert import_cycles(graph) == []
