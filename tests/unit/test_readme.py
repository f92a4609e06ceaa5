"""The README says what exists: its generated tables are current and its commands are real."""

from __future__ import annotations

import re
from pathlib import Path

from api.cli import COMMANDS
from worker.settings import settings_table
from worker.settings_cli import readme_block
from worker.voices import openai_voice_table

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text(encoding="utf-8")


def test_readme_opens_with_the_two_fresh_machine_commands():
    first_block = re.search(r"```bash\n(.*?)```", README, re.S).group(1)
    assert [line.split()[:2] for line in first_block.strip().splitlines()] == [["make", "serve"], ["make", "test"]]


def test_settings_table_is_current():
    assert readme_block(README) == settings_table(), "run: kokoro-fleet settings --write-readme README.md"


def test_openai_voice_table_is_current():
    block = re.search(r"<!-- openai-voices:begin -->\n(.*?)<!-- openai-voices:end -->", README, re.S).group(1)
    assert block.strip() == openai_voice_table().strip()


def test_every_kokoro_fleet_command_the_readme_types_exists():
    used = set(re.findall(r"kokoro-fleet (\w+)", README))
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
