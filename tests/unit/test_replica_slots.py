"""KOKORO_REPLICAS: fewer model replicas than Uvicorn workers (issue 39, item 1). `serve` checks the
setting against the workers; each worker takes a replica slot (a lock file held for its life) or,
all taken, serves as an HTTP front only."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from cli.serve_cli import resolve_replicas
from api.speech.replica_slots import claim_replica_slot
from api.settings import Settings, SettingsError

ROOT = Path(__file__).resolve().parents[2]


def settings(**env: str) -> Settings:
    return Settings.from_env({f"KOKORO_{k.upper()}": v for k, v in env.items()})


def test_replicas_default_to_every_worker_and_may_be_fewer_only_on_a_shared_queue():
    assert resolve_replicas(settings(), 8) == 8
    assert resolve_replicas(settings(replicas="2"), 8) == 2
    assert resolve_replicas(settings(replicas="8"), 8) == 8
    with pytest.raises(SystemExit, match="more than the 4 worker"):
        resolve_replicas(settings(replicas="5"), 4)
    with pytest.raises(SystemExit, match="needs the shared queue"):
        resolve_replicas(settings(replicas="2", dispatch="local"), 8)
    assert resolve_replicas(settings(replicas="1"), 1) == 1
    with pytest.raises(SystemExit, match="needs the shared queue"):
        resolve_replicas(settings(replicas="1", baseline="true"), 2)
    with pytest.raises(SettingsError, match="KOKORO_REPLICAS"):
        settings(replicas="-1")


def test_each_slot_goes_to_one_process_and_comes_back_when_it_exits(tmp_path):
    claim = [sys.executable, "-c", "import sys, time; from api.speech.replica_slots import claim_replica_slot; "
             f"print(claim_replica_slot({str(tmp_path)!r}, 2), flush=True); sys.stdin.read()"]
    holders = [subprocess.Popen(claim, cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
               for _ in range(2)]
    try:
        slots = sorted(int(p.stdout.readline()) for p in holders)
        assert slots == [0, 1]
        assert claim_replica_slot(tmp_path, 2) is None  # both held: an HTTP front only
        holders[0].stdin.close()
        holders[0].wait(30)
        assert claim_replica_slot(tmp_path, 2) in (0, 1)  # the slot of the worker that exited
    finally:
        for p in holders:
            p.kill()
            p.wait()
