"""From a bare state to first audio: time to install, to `/ready`, to the first audio byte, and `say`.

    python3 loadtest/bare_start.py [--repo .] [--work DIR] [--workers 2] [--apt docker|skip] [--out FILE]

What a new user meets on a fresh machine, each step timed (issue 48):
1. a fresh clone of `--repo`'s HEAD;
2. `make install` (the install part of `make serve`), run line by line as `make -n install` prints
   it, so each part (venv, pip, torch, the project and its dependencies) has its own time; a fresh
   HOME, so pip's cache and ~/.cache/kokoro-fleet start empty (torch still comes from the machine's
   wheel on disk where PIP_FIND_LINKS names one, as on our machines);
3. `kokoro-fleet serve --workers N` on its embedded Redis, HOME still fresh (the offline bundle is
   converted, the kernels compiled): the first 200 from `/ready`, every worker ready (`/health`
   names each), and the first audio byte of a one-sentence request sent at the first 200;
4. `kokoro-fleet say` with another empty cache (a user whose first command is `say`), then again
   on the cache it filled.
System packages: the machine's own cannot be removed (others use them), so `make install` finds
them present. `--apt docker` installs the Makefile's lists (serve's, then the tests' on top) with
apt-get in a container of the local Debian base that docker/build-local.sh makes, and times that;
`--apt skip` leaves them out. Standard library only: it runs before anything is installed.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if __package__ in (None, ""):  # run as a script (python3 loadtest/bare_start.py): the repo's packages
    sys.path.insert(0, str(REPO))

from api.ports import free_port  # noqa: E402 - standard library only, as this script
SENTENCE = "Hello from kokoro fleet, on a machine that had nothing installed a few minutes ago."
# What a fresh shell would not have: every setting of ours and every cache place pointed elsewhere.
CLEARED = ("TORCHINDUCTOR_CACHE_DIR", "XDG_CACHE_HOME", "VIRTUAL_ENV", "PYTHONPATH", "REDIS_URL")
DEBIAN_BASE = "local/python:3.11-slim-bookworm"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repo", default=str(REPO), help="the repository to clone (its HEAD)")
    parser.add_argument("--work", default=None, help="an empty folder for the clone and the fresh HOMEs")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--apt", choices=["docker", "skip"], default="skip",
                        help="time the Makefile's apt-get lists in a Debian container (docker/build-local.sh bases)")
    parser.add_argument("--out", default=None, help="write the figures as JSON here")
    parser.add_argument("--keep", action="store_true", help="keep the work folder")
    parser.add_argument("--skip-install", action="store_true",
                        help="no clone, no install: this checkout's code on the running interpreter (its venv)")
    parser.add_argument("--weights-from", default=None, metavar="DIR",
                        help="copy the prepared weights (a KOKORO_CACHE_DIR's converted bundle and serving files) "
                             "into each fresh cache first, not counted: compiles and start-up only")
    args = parser.parse_args(argv)
    work = Path(args.work or tempfile.mkdtemp(prefix="kokoro-bare-start-"))
    work.mkdir(parents=True, exist_ok=True)
    figures: dict = {"machine": machine(), "started": time.strftime("%Y-%m-%d %H:%M:%S %Z")}
    try:
        if args.skip_install:
            clone, program = REPO, [sys.executable, "-m", "cli.main"]
        else:
            clone = work / "clone"
            figures["clone_s"] = timed(["git", "clone", "-q", "--no-local", args.repo, str(clone)])
            program = [str(clone / ".venv/bin/kokoro-fleet")]
        figures["commit"] = run_text(["git", "-C", str(clone), "log", "-1", "--format=%h %s"])[:100]
        env = fresh_env(work / "home-serve", clone if args.skip_install else None, args.weights_from)
        if not args.skip_install:
            figures["install"] = install(clone, env)
        if args.apt == "docker":
            figures["apt"] = apt_in_container(clone)
        figures["serve"] = serve(clone, env, args.workers, work / "serve.log", program)
        say_env = fresh_env(work / "home-say", clone if args.skip_install else None, args.weights_from)
        figures["say_cold"] = say(clone, say_env, work / "say-cold.wav", program)
        figures["say_warm"] = say(clone, say_env, work / "say-warm.wav", program)
    finally:
        figures["machine"]["load_after"] = load_average()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    report(figures)
    if args.out:
        Path(args.out).write_text(json.dumps(figures, indent=2) + "\n")
    return 0


# --- the steps ------------------------------------------------------------------------------------

def install(clone: Path, env: dict[str, str]) -> dict:
    """`make install`'s recipe lines in order (as `make -n` prints them), each timed."""
    dry = run_text(["make", "-n", "install"], cwd=clone, env=env)
    parts, total = [], 0.0
    for line in recipe_lines(dry):
        seconds = timed(["bash", "-c", line], cwd=clone, env=env)
        total += seconds
        parts.append({"command": line if len(line) < 160 else line[:157] + "...", "s": round(seconds, 1)})
    venv = clone / ".venv"
    size = run_text(["du", "-sm", str(venv)]).split()[0]
    return {"total_s": round(total, 1), "parts": parts, "venv_mib": int(size)}


def recipe_lines(dry_run: str) -> list[str]:
    """`make -n`'s output as shell commands: one per recipe line, continuation lines joined."""
    lines, pending = [], ""
    for raw in dry_run.splitlines():
        if raw.endswith("\\"):
            pending += raw[:-1] + "\n"
            continue
        command = (pending + raw).strip()
        pending = ""
        if command and not command.startswith("make"):
            lines.append(command)
    return lines


def serve(clone: Path, env: dict[str, str], workers: int, log_path: Path, program: list[str]) -> dict:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    arguments = ["serve", "--host", "127.0.0.1", "--port", str(port), "--workers", str(workers)]
    command = [*program, *arguments]
    out: dict = {"command": " ".join(["kokoro-fleet", *arguments]), "workers": workers}
    with open(log_path, "wb") as log:
        start = time.monotonic()
        proc = subprocess.Popen(command, cwd=clone, env=env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            while True:
                if proc.poll() is not None:
                    raise RuntimeError(f"serve exited with {proc.returncode}:\n{log_path.read_text()[-3000:]}")
                if status(url + "/ready") == 200:
                    out["ready_s"] = round(time.monotonic() - start, 1)
                    break
                if time.monotonic() - start > 1200:
                    raise RuntimeError(f"no /ready in 1200 s:\n{log_path.read_text()[-3000:]}")
                time.sleep(0.1)
            sent = time.monotonic()
            first_audio, audio_bytes, out["refused_first"] = first_audio_byte(url)
            out["first_audio_s"] = round(first_audio - start, 1)
            out["first_audio_after_request_s"] = round(first_audio - sent, 2)
            out["response_bytes"] = audio_bytes
            out["all_workers_ready_s"] = round(all_ready(url, workers, start) - start, 1)
        finally:
            os.killpg(proc.pid, signal.SIGINT)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    text = log_path.read_text(errors="replace")
    out["log"] = [line for line in text.splitlines()
                  if re.search(r"warm-up|warming|convert|compil|ready|weights|kernels", line, re.IGNORECASE)][:30]
    return out


def first_audio_byte(url: str) -> tuple[float, int, list[str]]:
    """POST a one-sentence streamed request, again after each 503 as the OpenAI client does (after
    its `retry-after-ms`); the time the first body byte came, the body's size and the 503s' messages."""
    body = json.dumps({"model": "kokoro", "voice": "af_heart", "input": SENTENCE, "response_format": "pcm",
                       "stream": True}).encode()
    refusals: list[str] = []
    while True:
        request = urllib.request.Request(url + "/v1/audio/speech", data=body,
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=1200) as response:
                first = response.read(1)
                at = time.monotonic()
                rest = response.read()
        except urllib.error.HTTPError as error:
            if error.code != 503 or len(refusals) >= 100:
                raise
            message = json.loads(error.read() or b"{}").get("error", {}).get("message", "")
            refusals.append(f"{time.strftime('%H:%M:%S')} 503: {message}")
            time.sleep(float(error.headers.get("retry-after-ms") or 500) / 1000)
            continue
        if not first:
            raise RuntimeError("the response had no audio")
        return at, len(first) + len(rest), refusals


def all_ready(url: str, workers: int, start: float) -> float:
    """When /health (on fresh connections: each answers from one worker) had named N ready workers."""
    ready: set[str] = set()
    while len(ready) < workers:
        try:
            with urllib.request.urlopen(url + "/health", timeout=5) as response:
                health = json.loads(response.read())
            if health.get("ready"):
                ready.add(health.get("worker", "single"))
        except (OSError, ValueError):
            pass
        if time.monotonic() - start > 1200:
            break
        time.sleep(0.05)
    return time.monotonic()


def say(clone: Path, env: dict[str, str], wav: Path, program: list[str]) -> dict:
    command = [*program, "say", SENTENCE, "-o", str(wav)]
    start = time.monotonic()
    done = subprocess.run(command, cwd=clone, env=env, capture_output=True, text=True, timeout=1800)
    seconds = time.monotonic() - start
    if done.returncode:
        raise RuntimeError(f"say failed ({done.returncode}):\n{done.stderr[-3000:]}")
    lines = [line for line in re.split(r"[\r\n]+", done.stderr) if line.strip()]
    return {"s": round(seconds, 1), "audio_bytes": wav.stat().st_size, "stderr_last": lines[-4:]}


def apt_in_container(clone: Path) -> dict:
    """apt-get update and install of the Makefile's serve list, then the tests' list on top, in a
    container of the local Debian base (nothing installed but Python): what a bare machine pays."""
    subprocess.run([str(clone / "docker/build-local.sh"), "bases"], check=True, timeout=3600)
    serve_list = make_variable(clone, "APT_PACKAGES")
    test_list = make_variable(clone, "TEST_APT_PACKAGES")
    script = ("set -e; s=$(date +%s.%N); apt-get update -qq; u=$(date +%s.%N); "
              f"DEBIAN_FRONTEND=noninteractive apt-get install -y -qq {serve_list} >/dev/null; a=$(date +%s.%N); "
              + (f"DEBIAN_FRONTEND=noninteractive apt-get install -y -qq {test_list} >/dev/null; " if test_list else "")
              + "b=$(date +%s.%N); echo \"$s $u $a $b\"")
    out = run_text(["docker", "run", "--rm", "--network", "host", DEBIAN_BASE, "bash", "-c", script]).split()
    s, u, a, b = (float(x) for x in out[-4:])
    return {"base": DEBIAN_BASE, "update_s": round(u - s, 1), "serve_packages": serve_list,
            "serve_install_s": round(a - u, 1), "test_packages": test_list, "test_install_s": round(b - a, 1)}


# --- helpers --------------------------------------------------------------------------------------

def fresh_env(home: Path, code: Path | None = None, weights_from: str | None = None) -> dict[str, str]:
    """A fresh HOME (so empty caches); code: the checkout whose packages win on the interpreter's
    path; weights_from: a cache directory whose prepared weights are copied in (not timed)."""
    home.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("KOKORO_") and k not in CLEARED}
    env.update(HOME=str(home), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", PYTHONUNBUFFERED="1")
    if code is not None:
        env["PYTHONPATH"] = str(code)
    if weights_from is not None:
        cache = home / ".cache" / "kokoro-fleet"
        for part in ("downloads", "offline-v1", "serving"):  # what `make weights` prepares; no compiles
            if (Path(weights_from) / part).is_dir():
                shutil.copytree(Path(weights_from) / part, cache / part)
    return env


def make_variable(clone: Path, name: str) -> str:
    return run_text(["make", "-s", "--no-print-directory", f"--eval=print-variable: ; @echo $({name})",
                     "print-variable"], cwd=clone).strip()


def machine() -> dict:
    model = next((line.split(":", 1)[1].strip() for line in run_text(["lscpu"]).splitlines()
                  if line.startswith("Model name")), "unknown")
    return {"cpu": model, "cores": os.cpu_count(), "load_before": load_average(),
            "python": sys.version.split()[0], "pip_find_links": os.environ.get("PIP_FIND_LINKS", "")}


def load_average() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code
    except OSError:
        return 0


def timed(command: list[str], **kwargs) -> float:
    start = time.monotonic()
    subprocess.run(command, check=True, **kwargs)
    return time.monotonic() - start


def run_text(command: list[str], **kwargs) -> str:
    return subprocess.run(command, check=True, capture_output=True, text=True, **kwargs).stdout


def report(figures: dict) -> None:
    m = figures["machine"]
    print(f"machine: {m['cpu']}, {m['cores']} cores, load {m['load_before']} -> {m['load_after']}")
    print(f"commit: {figures.get('commit')}")
    if "install" in figures:
        print(f"install: {figures['install']['total_s']} s, venv {figures['install']['venv_mib']} MiB")
        for part in figures["install"]["parts"]:
            print(f"  {part['s']:7.1f} s  {part['command']}")
    if "apt" in figures:
        a = figures["apt"]
        print(f"apt (in {a['base']}): update {a['update_s']} s, serve's {a['serve_install_s']} s, "
              f"the tests' {a['test_install_s']} s")
    if "serve" in figures:
        s = figures["serve"]
        print(f"serve --workers {s['workers']}: /ready {s['ready_s']} s, first audio {s['first_audio_s']} s "
              f"({s['first_audio_after_request_s']} s after the request), all workers ready "
              f"{s['all_workers_ready_s']} s; 503s before it: {len(s['refused_first'])}")
        for line in s["refused_first"][:3]:
            print("  503:", line[:200])
        for line in s["log"]:
            print("  |", line[:200])
    for key in ("say_cold", "say_warm"):
        if key in figures:
            print(f"{key}: {figures[key]['s']} s; {figures[key]['stderr_last']}")


if __name__ == "__main__":
    sys.exit(main())
