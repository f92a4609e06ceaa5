"""The 20-second smoke of the load generator against a real `make serve`-style server (issue 6)."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest

from loadtest.dispatch import FleetProcess

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def served(real_weights, tmp_path_factory):
    # What `make serve` runs: the offline weights, the default worker count on this CPU (2), the
    # embedded Redis owned by the launcher.
    fleet = FleetProcess(workers=2, weights="offline", log_dir=tmp_path_factory.mktemp("serve"), name="serve")
    fleet.start(ready_timeout=600)
    yield fleet
    fleet.stop()


def test_twenty_second_smoke_writes_results_and_plots_that_parse(served, tmp_path):
    out = tmp_path / "smoke"
    proc = subprocess.run(
        [sys.executable, "-m", "loadtest", "run", "--url", served.url, "--concurrency", "1,2", "--duration", "10",
         "--texts", "short", "--format", "pcm", "--wait", "120", "--report", "--fail-on-error", "--out", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:] + served.log()

    rows = list(csv.DictReader((out / "requests.csv").open()))
    measured = [r for r in rows if r.get("warmup", "").lower() not in ("1", "true")]
    ok = [r for r in measured if r["status"] == "200"]
    assert ok, rows[:3]
    assert all(float(r["ttfa_s"]) > 0 and float(r["e2e_s"]) >= float(r["ttfa_s"]) for r in ok)
    assert all(float(r["audio_s"]) > 0.5 for r in ok)

    summary = json.loads((out / "summary.json").read_text())
    steps = summary["steps"] if isinstance(summary, dict) else summary
    assert len(steps) == 2

    plots = sorted((out / "plots").glob("*.png"))
    assert plots, list(out.rglob("*"))
    for png in plots:
        data = png.read_bytes()
        assert data.startswith(PNG_MAGIC) and len(data) > 2000, png
    import matplotlib.image

    assert matplotlib.image.imread(plots[0]).ndim == 3
