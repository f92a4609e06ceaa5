"""Result files: `requests.csv` (one row a request, warm-up rows included and marked) and
`summary.json` (the run's metadata and one summary a step). `report` and the tests read them back
with `load_results`."""

from __future__ import annotations

import csv
import datetime as dt
import json
import os
import platform
from pathlib import Path
from typing import Any, Iterable

from loadtest.client import RequestResult

REQUESTS_CSV = "requests.csv"
SUMMARY_JSON = "summary.json"


def machine() -> dict[str, Any]:
    """Where the numbers were measured (the README's results table quotes it)."""
    cpu = platform.processor() or ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return {"host": platform.node(), "platform": platform.platform(), "cpu": cpu, "cpus": os.cpu_count(),
            "python": platform.python_version()}


def now_iso() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


def write_results(out_dir: str | Path, rows: Iterable[RequestResult], steps: list[dict[str, Any]],
                  meta: dict[str, Any]) -> Path:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / REQUESTS_CSV, "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=RequestResult.columns())
        writer.writeheader()
        for r in rows:
            writer.writerow({k: ("" if v is None else v) for k, v in r.row().items()})
    with open(out / SUMMARY_JSON, "w", encoding="utf-8") as f:
        json.dump({"meta": meta, "steps": steps}, f, indent=2)
        f.write("\n")
    return out


def read_rows(path: str | Path) -> list[dict[str, Any]]:
    """requests.csv back as dicts, numbers as floats (empty cells as None)."""
    numeric = {"index", "text_id", "text_chars", "status", "audio_bytes", "reads", "stalls"}
    rows = []
    with open(path, newline="", encoding="utf-8") as f:
        for raw in csv.DictReader(f):
            row: dict[str, Any] = {}
            for k, v in raw.items():
                if v == "":
                    row[k] = None if k not in ("error", "retry_after", "retry_after_ms", "outcome") else ""
                elif k in numeric:
                    row[k] = int(float(v))
                else:
                    try:
                        row[k] = float(v)
                    except ValueError:
                        row[k] = v
            rows.append(row)
    return rows


def load_results(result_dir: str | Path) -> dict[str, Any]:
    """{'meta', 'steps', 'rows', 'dir'} of one result directory."""
    d = Path(result_dir)
    with open(d / SUMMARY_JSON, encoding="utf-8") as f:
        data = json.load(f)
    data["rows"] = read_rows(d / REQUESTS_CSV)
    data["dir"] = str(d)
    return data


def result_sets(path: str | Path) -> list[dict[str, Any]]:
    """The result sets under a directory: itself (a `run`) or its subdirectories (a `compare`)."""
    d = Path(path)
    if (d / SUMMARY_JSON).is_file():
        return [load_results(d)]
    subs = [sub for sub in sorted(d.iterdir()) if (sub / SUMMARY_JSON).is_file()]
    if (d / "compare.json").is_file():  # draw A then B, as compare ran them
        with open(d / "compare.json", encoding="utf-8") as f:
            compared = json.load(f)
        order = [compared[k]["label"] for k in ("a", "b")]
        subs.sort(key=lambda sub: order.index(sub.name) if sub.name in order else len(order))
    sets = [load_results(sub) for sub in subs]
    if not sets:
        raise FileNotFoundError(f"{d}: no {SUMMARY_JSON} here or in its subdirectories")
    return sets
