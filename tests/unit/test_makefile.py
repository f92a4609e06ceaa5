"""`make serve` installs what serving needs, `make test` adds what only the tests need (issue 48):
read from `make -n`, what make would run, against pyproject.toml's dev extra and the Makefile's lists."""

from __future__ import annotations

import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
# A pip requirement or a Debian package name, with extras and a version: `.[offline,dev]`, `torch==2.13.0`.
REQUIREMENT = re.compile(r"([A-Za-z0-9][A-Za-z0-9._-]*|\.)(?:\[([^\]]*)\])?(?:[<>=!~].*)?")

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="GNU make is not installed")


def name(requirement: str) -> str:
    return re.sub(r"[-_.]+", "-", REQUIREMENT.fullmatch(requirement).group(1)).lower()


def make(*args: str, venv: Path) -> str:
    """make's output, with the venv in a fresh folder: nothing installed, so every install step shows."""
    return subprocess.run(["make", "--no-print-directory", f"VENV={venv}", *args], cwd=ROOT, check=True,
                          capture_output=True, text=True, timeout=60).stdout


def variable(variable_name: str, venv: Path) -> str:
    return make("-s", f"--eval=print-variable: ; @echo $({variable_name})", "print-variable", venv=venv).strip()


def named(dry_run: str) -> tuple[set[str], set[str]]:
    """The package names and the extras of `.[...]` that a dry run's commands name."""
    names, extras = set(), set()
    for token in re.split(r"[\s\"';|&]+", dry_run):
        match = REQUIREMENT.fullmatch(token)
        if match is None:
            continue
        if match.group(1) == ".":
            extras |= {e.strip() for e in (match.group(2) or "").split(",") if e.strip()}
        else:
            names.add(name(token))
    return names, extras


def test_make_serve_installs_no_test_only_package(tmp_path):
    venv = tmp_path / "venv"
    serving = {name(r) for r in PYPROJECT["project"]["dependencies"]}
    serving |= {name(r) for r in PYPROJECT["project"]["optional-dependencies"]["offline"]}
    test_only_pip = {name(r) for r in PYPROJECT["project"]["optional-dependencies"]["dev"]} - serving
    test_only_pip |= {name(r) for r in variable("REFERENCE_SPEC", venv).split()}
    test_only_apt = set(variable("TEST_APT_PACKAGES", venv).split())
    assert {"pytest", "onnxruntime", "playwright", "kokoro"} <= test_only_pip
    assert {"chromium", "shellcheck", "hey"} <= test_only_apt

    serve_names, serve_extras = named(make("-n", "serve", venv=venv))
    assert {"espeak-ng", "redis-server", "torch"} <= serve_names and "offline" in serve_extras, \
        "the dry run of `make serve` should install the serving packages (did its form change?)"
    assert not serve_names & (test_only_pip | test_only_apt), serve_names & (test_only_pip | test_only_apt)
    assert serve_extras == {"offline"}, serve_extras
    # voice fitting's speaker encoder, the voice-fit extra, without its dependencies (as the images do)
    for requirement in PYPROJECT["project"]["optional-dependencies"]["voice-fit"]:
        assert re.search(rf"pip install -q --no-deps {re.escape(requirement)}$", make("-n", "serve", venv=venv), re.M), \
            f"`make serve` does not install {requirement} with --no-deps"

    test_names, test_extras = named(make("-n", "test", venv=venv))
    assert "dev" in test_extras and {"kokoro", "loguru"} <= test_names, "`make test` installs the dev extra"
    assert test_only_apt <= test_names, test_only_apt - test_names


def test_the_bare_start_measurement_runs_the_serve_install_line_by_line(tmp_path):
    """loadtest/bare_start.py times `make install` (serve's install) as `make -n` prints it: every
    command once, continuation lines joined into one shell command, in order."""
    from loadtest.bare_start import recipe_lines

    venv = tmp_path / "venv"
    lines = recipe_lines(make("-n", "install", venv=venv))
    assert lines[0].startswith('missing=""; for p in espeak-ng redis-server;') and lines[0].rstrip().endswith("fi")
    assert lines[1] == f"test -x {venv}/bin/python || python3 -m venv {venv}"
    assert any(line.startswith(f"{venv}/bin/python -m pip install") and '".[offline]"' in line for line in lines)
    assert lines[-1] == f"touch {venv}/.installed"
    assert not any(line.endswith("\\") or line.startswith("make") for line in lines)
