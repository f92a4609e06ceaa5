"""The README and docs/ say what exists: their generated tables are current, their commands are
real, every docs/ page is reachable from the README and every relative link lands."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from cli.main import COMMANDS
from api.settings import settings_table
from cli.settings_cli import readme_block
from worker.voices import openai_voice_table

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text(encoding="utf-8")
DOCS = sorted((ROOT / "docs").glob("*.md"))
# The pages whose links, commands and paths are checked: the README and every docs/ page.
PAGES = [ROOT / "README.md", *DOCS]


def test_readme_opens_with_the_two_fresh_machine_commands():
    first_block = re.search(r"```bash\n(.*?)```", README, re.S).group(1)
    assert [line.split()[:2] for line in first_block.strip().splitlines()] == [["make", "serve"], ["make", "test"]]


def test_settings_table_is_current():
    configuration = (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8")
    assert readme_block(configuration) == settings_table(), \
        "run: kokoro-fleet settings --write-readme docs/configuration.md"


def test_openai_voice_table_is_current():
    voices = (ROOT / "docs" / "voices.md").read_text(encoding="utf-8")
    block = re.search(r"<!-- openai-voices:begin -->\n(.*?)<!-- openai-voices:end -->", voices, re.S).group(1)
    assert block.strip() == openai_voice_table().strip()


def test_every_kokoro_fleet_command_the_readme_types_exists():
    used = set(re.findall(r"kokoro-fleet (\w[\w-]*)", README))
    assert used, "the README shows commands"
    assert used <= set(COMMANDS), used - set(COMMANDS)


def test_every_make_target_the_readme_types_exists():
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    targets = set(re.findall(r"^([\w-]+):", makefile, re.M))
    used = set(re.findall(r"\bmake (\w+)", README))
    assert used and used <= targets, used - targets


def test_every_repo_path_the_readme_names_exists():
    for path in re.findall(r"`((?:api|worker|queue|docker|loadtest|tests)/[\w./-]*|modal_app\.py)`", README):
        assert (ROOT / path).exists(), path


def test_readme_stays_a_five_minute_read():
    assert len(README.splitlines()) <= 250


def test_every_docs_page_is_linked_from_the_readme():
    linked = {(ROOT / target).resolve() for target, _ in _relative_links(README)}
    assert DOCS, "docs/ has pages"
    assert {page.resolve() for page in DOCS} <= linked, [p.name for p in DOCS if p.resolve() not in linked]


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.relative_to(ROOT).as_posix())
def test_every_relative_link_lands_on_a_file_and_heading(page: Path):
    broken = []
    for target, anchor in _relative_links(page.read_text(encoding="utf-8")):
        path = (page.parent / target).resolve() if target else page
        if not path.exists():
            broken.append(f"{target}: no such file")
        elif anchor and path.exists() and path.suffix == ".md" and anchor not in _anchors(path.read_text(encoding="utf-8")):
            broken.append(f"{target}#{anchor}: no such heading")
    assert not broken, broken


@pytest.mark.parametrize("page", DOCS, ids=lambda page: page.name)
def test_every_command_and_repo_path_a_docs_page_names_exists(page: Path):
    text = page.read_text(encoding="utf-8")
    commands = set(re.findall(r"kokoro-fleet (\w[\w-]*)", text))
    assert commands <= set(COMMANDS), commands - set(COMMANDS)
    for path in re.findall(r"`((?:api|worker|queue|docker|loadtest|tests)/[\w./-]*|modal_app\.py)`", text):
        assert (ROOT / path).exists(), path


def test_the_link_checker_sees_a_broken_link_and_a_missing_heading():
    links = _relative_links("[a](docs/none.md) [b](#here) [c](https://example.com) ![d](x.png \"t\") `[e](f.md)`")
    assert links == [("docs/none.md", ""), ("", "here"), ("x.png", "")]
    assert _anchors("## Front-end cost, and the plan\n# API and fields") == {"front-end-cost-and-the-plan",
                                                                             "api-and-fields"}


def _relative_links(markdown: str) -> list[tuple[str, str]]:
    """(path, anchor) of every Markdown link or image that stays in the repository, code blocks aside."""
    prose = re.sub(r"`[^`\n]*`", "", re.sub(r"^```.*?^```", "", markdown, flags=re.S | re.M))
    links = []
    for target in re.findall(r"\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)", prose):
        if re.match(r"[a-z][a-z0-9+.-]*:", target) or target.startswith("/"):
            continue  # a URL, or a path on a running server
        path, _, anchor = target.partition("#")
        links.append((path, anchor))
    return links


def _anchors(markdown: str) -> set[str]:
    """The anchors GitHub gives a page's headings: lower case, punctuation dropped, spaces as hyphens."""
    prose = re.sub(r"^```.*?^```", "", markdown, flags=re.S | re.M)
    return {re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
            for heading in re.findall(r"^#{1,6} (.+)$", prose, re.M)}
