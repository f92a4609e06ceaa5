"""The prepared GPU calls against the GPU machine's image (loadtest/gpu_image.py holds the image's list
and the bundle's resolution):

    python -m loadtest.gpu_call_check check                   # the static import check (tests/unit/test_gpu_image.py)
    python -m loadtest.gpu_call_check make-replica DIR [--python PY] [--find-links DIR]

- **The static import check** (`check_imports`): every third-party module that the call's entry points
  import, directly or through the project's own modules (functions' imports too), and every package
  their resource and metadata lookups name, belongs to a distribution on the image or in the bundle; a
  LEFT_OUT one only where it is imported inside a function (never at start). The entry points are read
  from the harness's own step commands.
- **The image replica** (`make_replica`): a virtual environment that holds only packages of the image,
  at its versions where known: the image's share of the serving resolution, and what the call's steps
  import from the image beyond it (pytest). The rehearsal installs the bundle into it as the GPU machine
  does (loadtest/image_rehearsal.py).
"""

from __future__ import annotations

import argparse
import ast
import functools
import json
import re
import subprocess
import sys
import tempfile
import tomllib
from dataclasses import dataclass
from pathlib import Path

from loadtest.bench import gpu_harness
from loadtest.gpu_image import (BUNDLE_FILE, FIRST_PARTY, IMPORT_NAMES, LEFT_OUT, REPO, Plan, bundle_plan, constraints,
                                image_packages, image_python, image_python_here, inputs_digest, norm, read_plan)


# --- the static import check --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Use:
    """A third-party name a module of ours needs: `name` (a top-level import, or a distribution a
    resource or metadata lookup names), where, and whether only inside a function (`lazy`)."""

    name: str
    where: str
    lazy: bool
    kind: str = "import"


def _module_path(module: str) -> Path | None:
    parts = module.split(".")
    base = REPO.joinpath(*parts)
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _guarded(node: ast.AST, parents: dict[ast.AST, ast.AST]) -> bool:
    """Inside a `try` that catches ImportError (an optional import: the code runs without it)."""
    while node in parents:
        child, node = node, parents[node]
        if isinstance(node, ast.Try) and child in node.body:
            for handler in node.handlers:
                names = [handler.type] if not isinstance(handler.type, ast.Tuple) else list(handler.type.elts)
                if any(isinstance(n, ast.Name) and n.id in ("ImportError", "ModuleNotFoundError") for n in names):
                    return True
    return False


def _lazy(node: ast.AST, parents: dict[ast.AST, ast.AST]) -> bool:
    while node in parents:
        node = parents[node]
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            return True
    return False


RESOURCE_CALLS = {"files", "version", "distribution", "metadata", "requires", "entry_points_of"}


def module_uses(module: str, path: Path) -> tuple[list[str], list[Use]]:
    """The first-party modules `module` imports and the third-party names it needs."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    ours, uses = [], []
    where = str(path.relative_to(REPO)) if REPO in path.parents else str(path)

    def note(name: str, node: ast.AST, kind: str = "import") -> None:
        top = name.split(".")[0]
        if top in FIRST_PARTY:
            ours.append(name)
        elif where.startswith("tests/") and (REPO / "tests" / f"{top}.py").is_file():  # tests/ is on sys.path
            ours.append(f"tests.{name}")
        elif top and top not in sys.stdlib_module_names and not _guarded(node, parents):
            uses.append(Use(top, f"{where}:{node.lineno}", _lazy(node, parents), kind))

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                note(alias.name, node)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            note(base, node)
            if base.split(".")[0] in FIRST_PARTY:
                ours.extend(f"{base}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant) \
                and isinstance(node.args[0].value, str):
            func = node.func
            called = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
            value = node.args[0].value
            if called == "import_module":
                note(value, node)
            elif called in RESOURCE_CALLS and re.fullmatch(r"[A-Za-z_][\w.-]*", value):
                top = value.split(".")[0]
                if top not in FIRST_PARTY and top not in sys.stdlib_module_names and called == "files":
                    uses.append(Use(top, f"{where}:{node.lineno}", _lazy(node, parents), "resource"))
                elif called != "files" and top not in FIRST_PARTY and isinstance(func, ast.Attribute) \
                        and _is_metadata(func):
                    uses.append(Use(value, f"{where}:{node.lineno}", _lazy(node, parents), "metadata"))
    return ours, uses


def _is_metadata(func: ast.Attribute) -> bool:
    """`metadata.version("x")` / `importlib.metadata.version("x")`: a distribution's name."""
    value = func.value
    return (isinstance(value, ast.Name) and value.id == "metadata") or \
        (isinstance(value, ast.Attribute) and value.attr == "metadata")


def walk(entry_modules: list[str], entry_files: list[Path] = ()) -> list[Use]:
    """Every third-party use reachable from the entry points through our own modules."""
    seen: set[str] = set()
    uses: list[Use] = []
    queue = [(m, _module_path(m)) for m in entry_modules]
    queue += [(".".join(p.relative_to(REPO).with_suffix("").parts) if REPO in p.parents else p.stem, p)
              for p in entry_files]
    while queue:
        module, path = queue.pop()
        if path is None or module in seen:
            continue
        seen.add(module)
        ours, found = module_uses(module, path)
        uses.extend(found)
        for name in ours:
            parts = name.split(".")
            for k in range(1, len(parts) + 1):  # a package's __init__ runs before its modules
                queue.append((".".join(parts[:k]), _module_path(".".join(parts[:k]))))
    return uses


def entry_points() -> tuple[list[str], list[Path]]:
    """The modules and test files the prepared calls' steps run, read from the harness's own commands."""
    modules, files = ["loadtest.bench.gpu_harness"], []
    ctx = gpu_harness.Context(out=Path("/nonexistent"), work=Path("/nonexistent"), fleet_bundle=None)
    ctx.smoke = {"compile": {"wanted": True, "ok": True}, "graphs": {}}
    for call in gpu_harness.CALLS.values():
        for name in call:
            command = gpu_harness.step_command(name, ctx, 100)
            if "-m" in command:
                modules.append(command[command.index("-m") + 1])
            files += [REPO / a for a in command if a.startswith("tests/") and a.endswith(".py")]
    for test in list(files):  # pytest loads the conftest files above a test, up to the repository's root
        files += [d / "conftest.py" for d in test.parents if (d == REPO or REPO in d.parents)
                  and (d / "conftest.py").is_file()]
    modules += ["cli.serve_cli", "api.app", "loadtest.loadtest_cli"]  # what `serve` and `loadtest run` reach by name
    return sorted(set(modules) - {"pytest"}), sorted(set(files))


@functools.cache
def _packages_distributions() -> dict[str, list[str]]:
    from importlib import metadata

    return metadata.packages_distributions()


@functools.cache
def call_uses() -> tuple[Use, ...]:
    """The third-party uses of the prepared calls' entry points (read once a process)."""
    return tuple(walk(*entry_points()))


def distribution_of(name: str, kind: str) -> str:
    """The distribution a top-level import name belongs to (a metadata lookup names one already)."""
    if kind == "metadata":
        return norm(name)
    found = _packages_distributions().get(name)
    if found:
        return norm(found[0])
    return norm(IMPORT_NAMES.get(name, name))


def check_imports(carried: set[str], image: dict[str, str | None] | None = None,
                  uses: list[Use] | None = None) -> list[str]:
    """Problems: a use whose distribution is neither on the image nor carried (LEFT_OUT ones only
    lazily). Empty when the call can import everything it needs on the GPU machine."""
    image = image_packages() if image is None else image
    carried = {norm(c) for c in carried}
    problems = []
    uses = call_uses() if uses is None else uses
    for use in uses:
        dist = distribution_of(use.name, use.kind)
        if dist in image or dist in carried:
            continue
        if dist in LEFT_OUT and use.lazy:
            continue
        why = ("left out of the bundle (LEFT_OUT) but imported at start" if dist in LEFT_OUT
               else "neither on the image (loadtest/gpu_image.txt) nor in the bundle")
        problems.append(f"{use.where}: {use.kind} of {use.name!r} (distribution {dist}): {why}")
    return sorted(set(problems))


# --- the image replica ----------------------------------------------------------------------------------------


def replica_requirements(plan: Plan, image: dict[str, str | None]) -> list[str]:
    """The image's share of the serving resolution, and the image distributions the call's steps
    import beyond it (pytest for the tests step, ...), at the image's versions where known."""
    names = set(plan.on_image)
    # the tests step runs pytest with the repository's configuration: the dev extra's plugins the image has
    dev = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]["optional-dependencies"]["dev"]
    names |= {norm(re.split(r"[\s\[<>=!~;]", r, maxsplit=1)[0]) for r in dev} & set(image)
    for use in call_uses():
        dist = distribution_of(use.name, use.kind)
        if dist in image:
            names.add(dist)
    return sorted(f"{n}=={image[n]}" if image.get(n) else (f"{n}=={plan.resolved[n]}" if n in plan.resolved else n)
                  for n in names)


def make_replica(dest: Path, python: str, find_links: list[str]) -> int:
    """A venv at `dest` with only image packages; fails when pip brought anything the image lacks."""
    image = image_packages()
    plan = bundle_plan(python)
    wanted = replica_requirements(plan, image)
    if not (dest / "bin" / "python").exists():
        subprocess.run([python, "-m", "venv", str(dest)], check=True)
    py = str(dest / "bin" / "python")
    with tempfile.TemporaryDirectory() as tmp:
        pins = Path(tmp) / "image-constraints.txt"
        pins.write_text("\n".join(constraints(image, tested=False)) + "\n")
        subprocess.run([py, "-m", "pip", "install", "--disable-pip-version-check", "-q", "--only-binary=:all:",
                        *(a for d in find_links for a in ("--find-links", d)), "-c", str(pins), *wanted], check=True)
    def listed() -> list[dict]:
        return json.loads(subprocess.run([py, "-m", "pip", "list", "--format", "json"], check=True,
                                         capture_output=True, text=True).stdout)

    # Newer releases of image packages whose version the list lacks may need what the image lacks (typer
    # pydantic, python-dateutil tzdata): the image's own releases do not, so those go again.
    extra = sorted(norm(p["name"]) for p in listed() if norm(p["name"]) not in image)
    if extra:
        subprocess.run([py, "-m", "pip", "uninstall", "-y", "-q", *extra], check=True)
    packages = listed()
    left = sorted(norm(p["name"]) for p in packages if norm(p["name"]) not in image)
    off = sorted(f"{norm(p['name'])} {p['version']} (image {image[norm(p['name'])]})" for p in packages
                 if image.get(norm(p["name"])) and p["version"].split("+")[0] != image[norm(p["name"])])
    (dest / "replica.json").write_text(json.dumps({
        "python": subprocess.run([py, "-c", "import platform; print(platform.python_version())"], capture_output=True,
                                 text=True).stdout.strip(), "image_python": image_python(), "requested": wanted,
        "installed": {norm(p["name"]): p["version"] for p in packages}, "removed_not_on_image": extra,
        "not_on_image": left, "version_differs": off}, indent=2) + "\n")
    print(f"replica {dest}: {len(packages)} packages; removed as not on the image: {extra or 'none'}; "
          f"versions off the image's: {off or 'none'}")
    return 1 if left or off else 0


# --- the command ---------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtest.gpu_call_check", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("check", help="the static import check against the image and the bundle")
    replica = sub.add_parser("make-replica", help="a venv holding only the image's packages")
    replica.add_argument("dest")
    replica.add_argument("--python", default="", help="the Python nearest the image's (default: python3.12 here)")
    replica.add_argument("--find-links", action="append", default=[],
                         help="a folder of wheels already downloaded (torch's CUDA build and its libraries)")
    args = parser.parse_args(argv)
    if args.command == "make-replica":
        return make_replica(Path(args.dest).resolve(), args.python or image_python_here(), args.find_links)
    carried, digest = read_plan()
    if digest != inputs_digest():
        print(f"{BUNDLE_FILE.relative_to(REPO)} is stale (pyproject.toml's dependencies or the image's list changed): "
              "python -m loadtest.gpu_image resolve --write")
        return 1
    problems = check_imports(set(carried))
    for problem in problems:
        print(problem)
    print(f"{len(problems)} problems" if problems else "every import of the call is on the image or in the bundle")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
