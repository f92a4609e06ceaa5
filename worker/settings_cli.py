"""`kokoro-fleet settings`: the configuration table (the README carries the same table)."""

from __future__ import annotations

import argparse

from worker.settings import settings_table


def configure(parser: argparse.ArgumentParser) -> None:
    pass


def run(args: argparse.Namespace) -> int:
    print(settings_table())
    return 0
