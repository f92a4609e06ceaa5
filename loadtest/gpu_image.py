"""The GPU machine's image, as data (loadtest/gpu_image.txt), and what follows from it for the device
calls (docs/performance.md, "The prepared GPU calls"):

    python -m loadtest.gpu_image resolve [--write]       # the serving dependencies: left to the image / carried
    python -m loadtest.gpu_image check                   # the static import check (tests/unit/test_gpu_image.py)
    python -m loadtest.gpu_image make-replica DIR [--python PY] [--find-links DIR]

- **The bundle's wheels** (`bundle_wheels`): pyproject.toml's serving dependencies, resolved by pip for
  the image's Python (cp312, manylinux x86_64) with the image's known versions as constraints, less
  every distribution the image holds (the constraints make those the image's own versions) and less
  LEFT_OUT, written into loadtest/gpu_bundle.txt (`resolve --write`; the check below fails when it is
  older than pyproject.toml's dependencies or the image's list). No hand-kept list: loadtest/gpu_fleet.py's
  `--make-bundle` downloads exactly these.
- **The static import check** (`check_imports`): every third-party module that the call's entry points
  import, directly or through the project's own modules (functions' imports too), and every package
  their resource and metadata lookups name, belongs to a distribution on the image or in the bundle; a
  LEFT_OUT one only where it is imported inside a function (never at start). The entry points are read
  from the harness's own step commands.
- **The image replica** (`make_replica`): a virtual environment that holds only packages of the image,
  at its versions where known: the image's share of the serving resolution, and what the call's steps
  import from the image beyond it (pytest). The rehearsal installs the bundle into it as the GPU machine
  does (loadtest/image_rehearsal.py).

Only the standard library is imported here: the harness runs on the image before the bundle is installed.
"""

from __future__ import annotations

import argparse
import ast
import functools
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
IMAGE_FILE = REPO / "loadtest" / "gpu_image.txt"
BUNDLE_FILE = REPO / "loadtest" / "gpu_bundle.txt"   # the resolution, written by `resolve --write`
FIRST_PARTY = ("api", "worker", "loadtest", "tests")

# Serving dependencies the bundle does not carry, and why. Each is imported only inside a function
# (the check below holds that), on a first request in its language: the calls send English only.
LEFT_OUT: dict[str, str] = {
    "cn2an": "Mandarin reader (z voices): the calls send English only",
    "jieba": "Mandarin reader (z voices): the calls send English only",
    "pypinyin": "Mandarin reader (z voices): the calls send English only",
    "ordered-set": "Mandarin reader (z voices): the calls send English only",
    "fugashi": "Japanese reader (j voices): the calls send English only",
    "unidic-lite": "Japanese reader's dictionary (j voices, 47 MB, over the tree's limit): the calls send English only",
    "jaconv": "Japanese reader (j voices): the calls send English only",
    "mojimoji": "Japanese reader (j voices): the calls send English only",
    # not a serving dependency: the parity tests' and `bench`'s reference implementation (worker/reference.py)
    "kokoro": "the reference implementation: tests and `bench --reference` only, never run by the calls",
}
# What pip may take for the image (Ubuntu 24.04, glibc 2.39, x86_64).
PLATFORMS = ("manylinux1_x86_64", "manylinux2010_x86_64", "manylinux2014_x86_64",
             *(f"manylinux_2_{n}_x86_64" for n in range(5, 40)))
# Import names whose distribution's name differs, for names no installed distribution maps (the
# check runs in the development venv, where importlib.metadata maps the rest).
IMPORT_NAMES = {"yaml": "pyyaml", "google": "protobuf", "PIL": "pillow", "cv2": "opencv-python-headless",
                "sklearn": "scikit-learn", "skimage": "scikit-image", "pkg_resources": "setuptools",
                "_pytest": "pytest", "cpuinfo": "py-cpuinfo", "dateutil": "python-dateutil"}


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


# --- the image --------------------------------------------------------------------------------------------


def image_packages(path: Path = IMAGE_FILE) -> dict[str, str | None]:
    """distribution (normalized) -> version, None where no version was read; `python` is left out."""
    packages: dict[str, str | None] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        words = line.split("#", 1)[0].split()
        if not words or words[0] == "python":
            continue
        packages[norm(words[0])] = words[1] if len(words) > 1 else None
    return packages


def image_python(path: Path = IMAGE_FILE) -> str:
    for line in path.read_text(encoding="utf-8").splitlines():
        words = line.split("#", 1)[0].split()
        if words and words[0] == "python":
            return words[1]
    raise ValueError(f"{path}: no `python` line")


def constraints(image: dict[str, str | None], tested: bool = True) -> list[str]:
    """The image's known versions; with `tested`, also the versions this interpreter holds (the
    development venv, where the tests ran them together) of what the image does not hold."""
    pins = {name: version for name, version in image.items() if version}
    if tested:
        from importlib import metadata

        for dist in metadata.distributions():
            name = norm(dist.metadata["Name"] or "")
            if name and name not in image:
                pins.setdefault(name, dist.version)
    return [f"{name}=={version}" for name, version in sorted(pins.items())]


# --- the serving dependencies, resolved for the image ------------------------------------------------------


def serving_requirements(pyproject: Path = REPO / "pyproject.toml") -> list[str]:
    """pyproject.toml's [project] dependencies, less LEFT_OUT."""
    requirements = tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]["dependencies"]
    return [r for r in requirements if norm(re.split(r"[\s\[<>=!~;]", r, maxsplit=1)[0]) not in LEFT_OUT]


def resolve(requirements: list[str], image: dict[str, str | None], python: str) -> dict[str, str]:
    """distribution (normalized) -> version: pip's resolution of `requirements` by `python` (the image's
    Python version, on this x86_64 Linux), the image's known versions as constraints. Binary wheels
    where they exist; a distribution published only as source (num2words's docopt) is resolved too, and
    `--make-bundle` builds its wheel. Nothing is downloaded but metadata."""
    with tempfile.TemporaryDirectory() as tmp:
        pins = Path(tmp) / "image-constraints.txt"
        pins.write_text("\n".join(constraints(image)) + "\n")
        report = Path(tmp) / "report.json"
        done = subprocess.run([python, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
                               "--disable-pip-version-check", "--report", str(report), "--prefer-binary",
                               "-c", str(pins), *requirements], capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"pip could not resolve {requirements} for the image:\n{done.stderr.strip()[-3000:]}")
        installs = json.loads(report.read_text())["install"]
    return {norm(i["metadata"]["name"]): i["metadata"]["version"] for i in installs}


def image_python_here() -> str:
    """This machine's interpreter of the image's Python version (python3.12, or pyenv's)."""
    version = ".".join(image_python().split(".")[:2])
    found = next((str(p) for p in sorted(Path(os.path.expanduser("~/.pyenv/versions")).glob(f"{version}.*/bin/python3"))),
                 None) or shutil.which(f"python{version}")  # pyenv's own first: its shim may not run
    if found is None:
        raise SystemExit(f"no Python {version} here (the image's): install one (pyenv install {version}) to resolve for it")
    return found


@dataclass
class Plan:
    """The serving resolution split: what the image holds, what the bundle carries."""

    resolved: dict[str, str]
    on_image: dict[str, str] = field(default_factory=dict)
    carried: dict[str, str] = field(default_factory=dict)

    @classmethod
    def of(cls, resolved: dict[str, str], image: dict[str, str | None]) -> "Plan":
        plan = cls(resolved)
        for name, version in sorted(resolved.items()):
            (plan.on_image if name in image else plan.carried)[name] = version
        return plan


def bundle_plan(python: str | None = None) -> Plan:
    """The resolution now (pip, PyPI's metadata): about a minute."""
    image = image_packages()
    return Plan.of(resolve(serving_requirements(), image, python or image_python_here()), image)


def inputs_digest() -> str:
    """What the resolution depends on: the serving requirements, LEFT_OUT and the image's list."""
    import hashlib

    text = json.dumps([serving_requirements(), sorted(LEFT_OUT), sorted(image_packages().items(), key=str),
                       image_python()])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def write_plan(plan: Plan, path: Path = BUNDLE_FILE) -> None:
    lines = ["# The bundle's wheels: pyproject.toml's serving dependencies resolved for the GPU image",
             "# (loadtest/gpu_image.txt), less what it holds. Written by `python -m loadtest.gpu_image resolve",
             "# --write`, never by hand; `--make-bundle` downloads exactly these.",
             f"# inputs {inputs_digest()}", ""]
    lines += [f"{name}=={version}" for name, version in plan.carried.items()]
    lines += ["", "# left to the image (its versions):"]
    lines += [f"# {name}=={version}" for name, version in plan.on_image.items()]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def read_plan(path: Path = BUNDLE_FILE) -> tuple[dict[str, str], str | None]:
    """The written resolution: carried distribution -> version, and the inputs' digest it was made from."""
    carried, digest = {}, None
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("# inputs "):
            digest = line.split()[2]
        elif line.strip() and not line.startswith("#"):
            name, _, version = line.strip().partition("==")
            carried[norm(name)] = version
    return carried, digest


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
    from loadtest.bench import gpu_harness

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
    parser = argparse.ArgumentParser(prog="python -m loadtest.gpu_image", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    resolve_parser = sub.add_parser("resolve", help="the serving dependencies resolved for the image: left to it, "
                                    "carried")
    resolve_parser.add_argument("--write", action="store_true", help=f"into {BUNDLE_FILE.relative_to(REPO)}")
    sub.add_parser("check", help="the static import check against the image and the bundle")
    replica = sub.add_parser("make-replica", help="a venv holding only the image's packages")
    replica.add_argument("dest")
    replica.add_argument("--python", default="", help="the Python nearest the image's (default: python3.12 here)")
    replica.add_argument("--find-links", action="append", default=[],
                         help="a folder of wheels already downloaded (torch's CUDA build and its libraries)")
    args = parser.parse_args(argv)
    if args.command == "make-replica":
        return make_replica(Path(args.dest).resolve(), args.python or image_python_here(), args.find_links)
    if args.command == "resolve":
        plan = bundle_plan()
        print(json.dumps({"on_image": plan.on_image, "carried": plan.carried, "left_out": LEFT_OUT}, indent=2))
        if args.write:
            write_plan(plan)
        return 0
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
