"""The GPU call against the GPU machine's image (loadtest/gpu_image.py): every third-party import of
the call's entry points is on the image's list or in the bundle, the bundle's list is the current
resolution of pyproject.toml's serving dependencies, and the check fails on a planted missing import
(as it would have on main before num2words and fastapi-offline were carried)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from loadtest import gpu_call_check, gpu_image

REPO = Path(__file__).resolve().parents[2]


def test_every_import_of_the_call_is_on_the_image_or_in_the_bundle():
    carried, _ = gpu_image.read_plan()
    assert gpu_call_check.check_imports(set(carried)) == []


def test_the_bundles_list_is_the_resolution_of_the_current_dependencies_and_image():
    """loadtest/gpu_bundle.txt was written from today's pyproject.toml and image list (else: `python -m
    loadtest.gpu_image resolve --write`), and it names no distribution of the image."""
    carried, digest = gpu_image.read_plan()
    assert digest == gpu_image.inputs_digest()
    image = gpu_image.image_packages()
    assert carried and not set(carried) & set(image)
    assert not set(carried) & set(gpu_image.LEFT_OUT)
    # each serving requirement is carried, on the image or left out with its reason
    names = {gpu_image.norm(re.split(r"[\s\[<>=!~;]", r, maxsplit=1)[0])
             for r in tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]}
    assert names <= set(carried) | set(image) | set(gpu_image.LEFT_OUT)


def _planted(tmp_path: Path, source: str) -> list[gpu_call_check.Use]:
    module = tmp_path / "planted.py"
    module.write_text(source)
    return gpu_call_check.walk([], [module])


def test_a_planted_import_missing_from_the_image_and_the_bundle_fails_the_check(tmp_path):
    uses = _planted(tmp_path, "import numpy\nimport not_on_the_image_at_all\n\n"
                              "def later():\n    import also_missing\n")
    problems = gpu_call_check.check_imports(set(), uses=uses)
    assert len(problems) == 2, problems
    assert "planted.py:2: import of 'not_on_the_image_at_all'" in problems[0]
    assert "planted.py:5: import of 'also_missing'" in problems[1]
    # guarded as optional: the code runs without it
    assert gpu_call_check.check_imports(set(), uses=_planted(tmp_path, "try:\n    import optional_thing\n"
                                                                  "except ImportError:\n    pass\n")) == []


def test_resource_and_metadata_lookups_name_packages_too(tmp_path):
    uses = _planted(tmp_path, "from importlib.resources import files\nfrom importlib import metadata\n"
                              "ASSETS = files('some_assets_pkg') / 'static'\nV = metadata.version('some-dist')\n")
    problems = gpu_call_check.check_imports(set(), uses=uses)
    assert [p.split(": ", 1)[1].split(" (")[0] for p in problems] == ["resource of 'some_assets_pkg'",
                                                                     "metadata of 'some-dist'"]
    assert gpu_call_check.check_imports({"some-assets-pkg", "some-dist"}, uses=uses) == []


def test_the_check_names_what_main_lacked_before_num2words_and_fastapi_offline_were_carried():
    carried, _ = gpu_image.read_plan()
    problems = gpu_call_check.check_imports(set(carried) - {"num2words", "fastapi-offline"})
    assert any(p.startswith("worker/text/numbers.py:") and "'num2words'" in p for p in problems), problems
    assert any(p.startswith("api/swagger/__init__.py:") and "resource of 'fastapi_offline'" in p
               for p in problems), problems


def test_a_left_out_reader_may_be_imported_lazily_but_not_at_start(tmp_path):
    assert gpu_call_check.check_imports(set(), uses=_planted(tmp_path, "def read():\n    import jieba\n")) == []
    problems = gpu_call_check.check_imports(set(), uses=_planted(tmp_path, "import jieba\n"))
    assert len(problems) == 1 and "left out of the bundle" in problems[0]


def test_the_image_list_says_where_it_comes_from_and_holds_the_versions_read():
    text = gpu_image.IMAGE_FILE.read_text()
    assert "KINDS.md" in text and "2026-11-27-h200" in text
    image = gpu_image.image_packages()
    assert gpu_image.image_python() == "3.12.3"
    assert image["torch"] == "2.11.0" and image["transformers"] == "5.17.0" and image["numpy"] == "2.5.2"
    assert "num2words" not in image and "fastapi-offline" not in image and image["httpx"] is None


def test_the_image_rehearsal_runs_the_command_lines_the_performance_page_gives(tmp_path):
    import json

    from loadtest import image_rehearsal
    from loadtest.bench import gpu_harness

    for call in gpu_harness.CALLS:
        command, timeout_s, carry = image_rehearsal.prepared_command(call)
        assert command.startswith("timeout ") and f"--call {call} --budget-s {gpu_harness.BUDGETS[call]:.0f}" in command
        assert carry == [".fleet"] and timeout_s <= 600
    # its verdict: every step ok, the smoke done with its compile, c = 1, 128 and 256 measured
    level = {"ttfa_s": {}, "ok": 3, "rejected_503": 0, "errors": 0}
    report = {"steps": {"smoke": {"status": "ok"}, "batch": {"status": "ok"}, "fleet": {"status": "ok"}},
              "fleet": {"levels": [{**level, "concurrency": c} for c in (1, 128, 256)], "startup": {"startup_s": 9}}}
    (tmp_path / "gpu_results.json").write_text(json.dumps(report))
    (tmp_path / "smoke.json").write_text(json.dumps({"phase": "done", "compile": {"ok": True}}))
    assert image_rehearsal.verdict(tmp_path, "first")["passed"] is True
    report["fleet"]["levels"].pop()
    (tmp_path / "gpu_results.json").write_text(json.dumps(report))
    assert image_rehearsal.verdict(tmp_path, "first")["passed"] is False
