"""The GPU machine's image, as data (loadtest/gpu_image.txt), and what follows from it for the device
calls (docs/performance.md, "The prepared GPU calls"):

    python -m loadtest.gpu_image resolve [--write]       # the serving dependencies: left to the image / carried

The static import check and the image replica read this module from loadtest/gpu_call_check.py (they
walk the harness's step commands, and the harness installs the bundle resolved here: one way round).

- **The bundle's wheels** (`bundle_wheels`): pyproject.toml's serving dependencies, resolved by pip for
  the image's Python (cp312, manylinux x86_64) with the image's known versions as constraints, less
  every distribution the image holds (the constraints make those the image's own versions) and less
  LEFT_OUT, written into loadtest/gpu_bundle.txt (`resolve --write`; the static check fails when it is
  older than pyproject.toml's dependencies or the image's list). No hand-kept list: loadtest/gpu_fleet.py's
  `--make-bundle` downloads exactly these.
- **The static import check and the image replica**: loadtest/gpu_call_check.py.

Only the standard library is imported here: the harness runs on the image before the bundle is installed.
"""

from __future__ import annotations

import argparse
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
FIRST_PARTY = ("api", "cli", "worker", "loadtest", "tests")

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


# --- the command ---------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtest.gpu_image", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    resolve_parser = sub.add_parser("resolve", help="the serving dependencies resolved for the image: left to it, "
                                    "carried")
    resolve_parser.add_argument("--write", action="store_true", help=f"into {BUNDLE_FILE.relative_to(REPO)}")
    args = parser.parse_args(argv)
    plan = bundle_plan()
    print(json.dumps({"on_image": plan.on_image, "carried": plan.carried, "left_out": LEFT_OUT}, indent=2))
    if args.write:
        write_plan(plan)
    return 0


if __name__ == "__main__":
    sys.exit(main())
