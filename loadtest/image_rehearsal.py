"""A prepared GPU call rehearsed on a replica of the GPU machine's image, on this CPU:

    python -m loadtest.image_rehearsal --replica /work/gpu-image-replica --out DIR [--call first]

What the device tool does, as far as a CPU machine can: the working tree is copied (tracked files,
untracked ones git does not ignore, and the carried `.fleet` bundle; nothing else: no venv, no
weights cache), the call's command line is read from docs/performance.md as written and run by bash
in that copy's root, with `python3` the replica's (loadtest/gpu_call_check.py `make-replica`: the image's
Python packages only, at its versions where known), $OUT an empty folder, no network (a network
namespace of its own with loopback only) and no package index. The harness sees GPU_CALL_REHEARSAL=cpu
and runs its CPU rehearsal (tiny weights, no CUDA graphs, no MPS, dynamo's eager backend) with the
command line's budget and bundle: the bundle is installed into the replica's run exactly as on the GPU
machine (its own check of what is there seeing the replica's answer).

DIR gets what came back in $OUT, `rehearsal.json` (the command, its exit, the replica, the machine and
its load) and `rehearsal.md` (each acceptance point: every step ok, smoke.json's phases, the fleet's
levels). Not the image: this machine's system programs and libraries (Debian, not Ubuntu 24.04), and
torch's CUDA build runs on the CPU.
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
import time
from pathlib import Path

from loadtest.bench.gpu_report import last_line
from loadtest.gpu_fleet import tree_files

REPO = Path(__file__).resolve().parents[1]
CARRY = (".fleet",)


def prepared_command(call: str, page: Path = REPO / "docs" / "performance.md") -> tuple[str, int, list[str]]:
    """The call's command line, timeout_s and carry, as docs/performance.md gives them."""
    text = page.read_text(encoding="utf-8")
    pattern = (r"- command: `(timeout [^`]*--call " + re.escape(call) + r"\b[^`]*)`\n- timeout_s: `(\d+)`\n"
               r"- carry: (.*)\n")
    match = re.search(pattern, text)
    if match is None:
        raise SystemExit(f"{page}: no prepared command for the {call} call")
    carry = re.findall(r'"([^"]+)"', match.group(3))
    return match.group(1), int(match.group(2)), carry


def copy_tree(source: Path, dest: Path, carry: list[str]) -> None:
    """What the device tool sends: tracked and untracked-not-ignored files, and the carried paths."""
    for name in tree_files(source):
        (dest / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source / name, dest / name)
    for name in carry:
        if (source / name).exists():
            shutil.copytree(source / name, dest / name)


def environment(replica: Path, out: Path, home: Path) -> dict[str, str]:
    """A bare machine's: the replica's python3 first on PATH, no PYTHONPATH, no venv, no caches."""
    return {"PATH": f"{replica / 'bin'}:/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin", "HOME": str(home),
            "OUT": str(out), "LANG": "C.UTF-8", "GPU_CALL_REHEARSAL": "cpu", "PIP_NO_INDEX": "1",
            "PIP_FIND_LINKS": "", "PIP_CONFIG_FILE": os.devnull, "TMPDIR": str(home / "tmp")}


def offline(command: str) -> list[str]:
    """`command` in a network namespace of its own: loopback up, nothing else reachable."""
    return ["unshare", "--net", "bash", "-c", f"ip link set lo up && {command}"]


def machine() -> dict:
    model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("model name")), None)
    return {"cpu": model, "cores": os.cpu_count(), "load_average": list(os.getloadavg())}


def verdict(out: Path, call: str) -> dict:
    """The acceptance points read off what came back."""
    def read(name: str):
        try:
            return json.loads((out / name).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None

    report = read("gpu_results.json") or {}
    steps = {name: s.get("status") for name, s in (report.get("steps") or {}).items()}
    points = {"every step ok": bool(steps) and all(v == "ok" for v in steps.values()), "steps": steps,
              "bundle": (report.get("bundle") or {}).get("status"),
              "fallbacks": {n: s["fallback"] for n, s in (report.get("steps") or {}).items() if s.get("fallback")}}
    if call == "first":
        smoke = read("smoke.json") or {}
        points["smoke"] = {"phase": smoke.get("phase"), "failed_phase": smoke.get("failed_phase"),
                           "error": smoke.get("error"), "compile": (smoke.get("compile") or {}).get("ok"),
                           "warmup_reached": smoke.get("phase") in ("ready", "checks", "done")}
        fleet = report.get("fleet") or {}
        levels = {str(lv["concurrency"]): {k: lv.get(k) for k in ("ok", "rejected_503", "errors", "duration_s",
                                                                  "audio_s_per_wall_s")}
                  for lv in fleet.get("levels", []) if "ttfa_s" in lv}
        points["fleet"] = {"startup_s": (fleet.get("startup") or {}).get("startup_s"), "levels": levels,
                           "error": fleet.get("error"), "notes": fleet.get("notes")}
        points["fleet levels measured"] = sorted(levels, key=int)
        points["passed"] = (points["every step ok"] and points["smoke"]["phase"] == "done"
                            and points["smoke"]["compile"] is True
                            and all(str(c) in levels for c in (1, 128, 256)))
    else:
        points["passed"] = points["every step ok"]
    return points


def markdown(record: dict) -> str:
    v = record["verdict"]
    lines = [f"# The {record['call']} GPU call rehearsed on the image replica: "
             + ("PASSED" if v["passed"] else "FAILED"), "",
             f"Command, as docs/performance.md gives it, run by bash in a copy of the tree (carry {record['carry']}), "
             f"without network, `python3` the replica's ({record['replica']['python']}, "
             f"{len(record['replica']['installed'])} packages of the image's list, torch "
             f"{record['replica']['installed'].get('torch')}), GPU_CALL_REHEARSAL=cpu:", "",
             f"    {record['command']}", "",
             f"Exit {record['returncode']} after {record['wall_s']} s; {record['machine']['cpu']}, "
             f"{record['machine']['cores']} cores, load average before {record['machine']['load_average']}, "
             f"after {record['load_after']}; tree {record['tree']}.", "",
             "| point | result |", "|---|---|",
             f"| every step ok | {v['every step ok']}: {v['steps']} |",
             f"| bundle | {v['bundle']} |",
             f"| fallbacks | {v['fallbacks'] or 'none'} |"]
    if "smoke" in v:
        lines += [f"| smoke.json | phase {v['smoke']['phase']}, compile ok {v['smoke']['compile']}, warm-up reached "
                  f"{v['smoke']['warmup_reached']}" + (f", failed in {v['smoke']['failed_phase']}: {v['smoke']['error']}"
                                                       if v['smoke']['failed_phase'] else "") + " |",
                  f"| fleet | start-up {v['fleet']['startup_s']} s; levels measured {v['fleet levels measured']}: "
                  f"{v['fleet']['levels']}" + (f"; error: {last_line(v['fleet']['error'])}" if v['fleet']['error'] else "")
                  + " |"]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtest.image_rehearsal", description=__doc__.splitlines()[0])
    parser.add_argument("--replica", required=True, help="the image replica (python -m loadtest.gpu_call_check make-replica)")
    parser.add_argument("--out", required=True, help="where what came back and the verdict go")
    parser.add_argument("--call", default="first", choices=["first", "second"])
    parser.add_argument("--tree", default=str(REPO), help="the checkout to send (default: this one)")
    parser.add_argument("--append", default="", help="words added to the command line (a tree whose harness "
                        "does not read GPU_CALL_REHEARSAL: --rehearse-cpu)")
    args = parser.parse_args(argv)
    tree, replica, dest = Path(args.tree).resolve(), Path(args.replica).resolve(), Path(args.out).resolve()
    command, timeout_s, carry = prepared_command(args.call, tree / "docs" / "performance.md")
    if args.append:
        command = re.sub(r"(--budget-s \d+)", rf"\1 {args.append}", command)
    facts = json.loads((replica / "replica.json").read_text())
    dest.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="image-rehearsal-") as tmp:
        root, out, home = Path(tmp) / "repo", Path(tmp) / "out", Path(tmp) / "home"
        for d in (root, out, home / "tmp"):
            d.mkdir(parents=True)
        copy_tree(tree, root, carry)
        size = sum(p.stat().st_size for p in root.rglob("*") if p.is_file()) / 2**20
        record = {"call": args.call, "command": command, "timeout_s": timeout_s, "carry": carry,
                  "tree": f"{tree} ({size:.1f} MiB sent)", "replica": facts, "machine": machine()}
        print(f"image rehearsal: {command} (timeout_s {timeout_s}, tree {size:.1f} MiB, replica {replica})", flush=True)
        started = time.monotonic()
        try:
            done = subprocess.run(offline(command), cwd=root, env=environment(replica, out, home), timeout=timeout_s)
            record["returncode"] = done.returncode
        except subprocess.TimeoutExpired:
            record["returncode"] = f"killed at the tool's timeout_s ({timeout_s} s)"
        record["wall_s"] = round(time.monotonic() - started, 1)
        record["load_after"] = list(os.getloadavg())
        for path in out.iterdir():
            if path.is_file():
                shutil.copy2(path, dest / path.name)
        record["verdict"] = verdict(out, args.call)
    (dest / "rehearsal.json").write_text(json.dumps(record, indent=2, default=str) + "\n")
    (dest / "rehearsal.md").write_text(markdown(record))
    print(markdown(record))
    return 0 if record["verdict"]["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
