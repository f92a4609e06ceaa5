"""The whole fleet on a GPU box without network: `kokoro-fleet serve --workers 8` on full-size RANDOM
weights (KOKORO_WEIGHTS=random-full), under closed-loop load at a few concurrency levels.

    python3 -m loadtest.gpu_fleet --bundle .fleet --out DIR [--budget-s 540] [--levels 1,64,128,256]
                                  [--replicas N] [--batch-max K]

The box has torch (CUDA), transformers, numpy, httpx and a few more, but neither this project's other
packages nor redis-server nor espeak-ng, and no network. So they travel in a bundle folder that
`--make-bundle` builds here (a machine with PyPI and Debian's packages):

    python3 -m loadtest.gpu_fleet --make-bundle .fleet           # the box's wheels + Debian amd64 .debs

- `wheels/`: one wheel of each distribution the box lacks: pyproject.toml's serving dependencies
  resolved for the box's Python, less what its image holds (loadtest/gpu_image.py, reading the image's
  package list loadtest/gpu_image.txt; the Mandarin and Japanese readers are left out: the calls send
  English only). On the box, a wheel is installed (into `--site`, first on PYTHONPATH) only when its
  package is missing there or older than the wheel's, so the box's own packages are not shadowed
  without need (pydantic and pydantic-core go together). The GPU harness installs the bundle once, at
  the start of a call, for every step (`install_bundle`); run alone, this script installs it itself.
- `debs/`: redis-server (its binary is redis-tools') and espeak-ng's library (English words outside the
  lexicon, two of them in the sample texts), with the libraries they need beyond a stock Ubuntu 24.04;
  Debian bookworm amd64 builds (glibc 2.36, so they run on 24.04's 2.39). Each is unpacked with
  `dpkg -x` into `--root` (never into /); a library the box already has (`ldconfig -p`) is removed
  from there, so LD_LIBRARY_PATH only fills gaps. espeak-ng-data is repacked with the English
  dictionary alone (the other 100-odd languages' dictionaries are 10 MB unpacked; the fleet preloads
  and is sent English only).

Then it starts the fleet (`python3 -m cli.main serve`, its embedded redis-server from the unpacked
package) with KOKORO_SYNTHESIS_CACHE_MIB=0 (the texts repeat), waits until every worker is ready
(CUDA graph capture: progress printed), runs `python -m loadtest run` once per level (streamed,
closed loop; TTFA / E2E p50 p95 p99, audio-s/s, requests/s, 503s), samples nvidia-smi (GPU
utilisation, memory used) meanwhile, and writes DIR/gpu_fleet.json, DIR/gpu_fleet.md and
DIR/gpu_fleet.log, after each level, so a stop at any point leaves what was measured. It keeps
within --budget-s (level durations shrink to fit; what does not fit is skipped and said), and always
stops the fleet (SIGTERM, then SIGKILL of its process group, then any Redis it left).

The weights are RANDOM: the audio is not speech. Speed, memory and scheduling are the real model's
(same shapes, same CUDA graphs, speech-like durations per phoneme), so the figures are the fleet's.

Only the standard library is imported here: this runs before the bundle is installed.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import urllib.request
import zipfile
from pathlib import Path
from typing import Any

from api.ports import free_port  # standard library only, as this script
from loadtest import gpu_image  # the same: the image's list and the bundle's resolution

REPO = Path(__file__).resolve().parents[1]

TOGETHER = ({"pydantic", "pydantic-core"},)  # installed both or neither (pydantic pins its core exactly)

# Debian bookworm amd64 packages: redis-server, and espeak-ng's library with what it links beyond a
# stock Ubuntu 24.04 (libpcaudio links ALSA and PulseAudio, PulseAudio X11 and libsndfile's codecs).
DEBS: tuple[str, ...] = (
    "redis-server", "redis-tools", "liblzf1", "libjemalloc2", "libatomic1",
    "libespeak-ng1", "espeak-ng-data", "libpcaudio0", "libsonic0",
    "libasound2", "libpulse0", "libasyncns0", "libdbus-1-3", "libsndfile1", "libflac12", "libogg0", "libopus0",
    "libvorbis0a", "libvorbisenc2", "libmpg123-0", "libmp3lame0",
    "libx11-6", "libx11-xcb1", "libxcb1", "libxau6", "libxdmcp6", "libbsd0", "libmd0",
)
ESPEAK_DATA_KEEP_DICTS = ("en_dict",)

OUT_JSON, OUT_MD, OUT_LOG = "gpu_fleet.json", "gpu_fleet.md", "gpu_fleet.log"
TREE_LIMIT_MIB = 64        # the working tree a device call sends, carried bundle included
STOP_RESERVE_S = 25.0      # kept at the end of the budget: stopping the fleet and writing the results (default)
LEVEL_OVERHEAD_S = 8.0     # a level beyond its duration: the generator's start, warm-up, requests in flight


# --- logging ------------------------------------------------------------------------------------------

class Log:
    """Progress to stdout and to OUT/gpu_fleet.log (kept small: the serve log goes in as head and tail)."""

    def __init__(self, path: Path | None):
        self.path = path
        self.t0 = time.monotonic()

    def __call__(self, message: str) -> None:
        line = f"[gpu_fleet {time.monotonic() - self.t0:7.1f}s] {message}"
        print(line, flush=True)
        if self.path is not None:
            with open(self.path, "a", encoding="utf-8") as f:
                f.write(line + "\n")

    def block(self, title: str, text: str) -> None:
        if self.path is not None:
            with open(self.path, "a", encoding="utf-8") as f:
                f.write(f"----- {title} -----\n{text.rstrip()}\n----- end of {title} -----\n")


# --- building the bundle (here, with PyPI and Debian's packages) ------------------------------------------

def make_bundle(dest: Path, python: str | None = None) -> int:
    """wheels/ and debs/ in `dest`, from scratch: one wheel of each distribution of loadtest/gpu_bundle.txt
    (gpu_image.py's resolution: what the box lacks; downloaded, or built here from its source where PyPI
    has no wheel), the .debs of DEBS; `python`, the box's Python version here, builds those."""
    carried, digest = gpu_image.read_plan()
    if digest != gpu_image.inputs_digest():
        raise SystemExit("make-bundle: loadtest/gpu_bundle.txt is older than pyproject.toml's dependencies or the "
                         "image's list: python -m loadtest.gpu_image resolve --write")
    print("make-bundle: " + ", ".join(f"{n} {v}" for n, v in carried.items()))
    wheels, debs = dest / "wheels", dest / "debs"
    for d in (wheels, debs):
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir(parents=True)
    version = ".".join(gpu_image.image_python().split(".")[:2])
    platforms = [a for p in gpu_image.PLATFORMS for a in ("--platform", p)]
    for name, v in carried.items():
        got = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                              "--python-version", version, "--implementation", "cp", *platforms, "-d", str(wheels),
                              f"{name}=={v}"], capture_output=True, text=True)
        if got.returncode != 0:  # source only (num2words's docopt): a wheel built here
            subprocess.run([python or gpu_image.image_python_here(), "-m", "pip", "wheel", "-q", "--no-deps",
                            "-w", str(wheels), f"{name}=={v}"], check=True)
    found = {_dist_of(w) for w in wheels.glob("*.whl")}
    missing = set(carried) - found
    if missing or len(list(wheels.glob("*.whl"))) != len(carried):
        raise SystemExit(f"make-bundle: expected one wheel of each of {sorted(carried)}; missing {sorted(missing)}")
    subprocess.run(["apt-get", "download", *DEBS], cwd=debs, check=True)
    for deb in debs.glob("*.deb"):  # plain names: no `%3a` (an epoch's colon) nor `~`
        clean = re.sub(r"%3a|~", "-", deb.name)
        if clean != deb.name:
            deb.rename(deb.with_name(clean))
    _english_only_espeak_data(debs)
    tree = _tree_mib(REPO) + _mib(dest)
    print(f"bundle {dest}: {len(list(wheels.glob('*.whl')))} wheels ({_mib(wheels):.1f} MiB), "
          f"{len(list(debs.glob('*.deb')))} debs ({_mib(debs):.1f} MiB); the tree that travels with it "
          f"{tree:.1f} MiB of the device tool's {TREE_LIMIT_MIB}")
    if tree > TREE_LIMIT_MIB:
        raise SystemExit(f"make-bundle: the tree with the bundle is {tree:.1f} MiB, over {TREE_LIMIT_MIB} MiB")
    return 0


def tree_files(repo: Path) -> list[str]:
    """What the device tool sends of the checkout: tracked files and untracked ones git does not ignore."""
    names = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=repo,
                           capture_output=True, check=True).stdout.decode().split("\0")
    return [n for n in names if n and (repo / n).is_file()]


def _tree_mib(repo: Path) -> float:
    return sum((repo / n).stat().st_size for n in tree_files(repo)) / 2**20


def _english_only_espeak_data(debs: Path) -> None:
    """Repack espeak-ng-data with only the English dictionary (phoneme tables, language and voice
    definitions stay whole)."""
    (deb,) = debs.glob("espeak-ng-data_*.deb")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "pkg"
        subprocess.run(["dpkg-deb", "-R", str(deb), str(root)], check=True)
        for dict_file in root.glob("usr/lib/*/espeak-ng-data/*_dict"):
            if dict_file.name not in ESPEAK_DATA_KEEP_DICTS:
                dict_file.unlink()
        (root / "DEBIAN" / "md5sums").unlink(missing_ok=True)
        control = root / "DEBIAN" / "control"
        text = control.read_text()
        text = re.sub(r"^Version: (.*)$", r"Version: \1+english-only", text, flags=re.M)
        text = re.sub(r"^Description: (.*)$", r"Description: \1 (English dictionary only, repacked for loadtest.gpu_fleet)",
                      text, flags=re.M)
        text = re.sub(r"^Installed-Size: .*\n", "", text, flags=re.M)
        control.write_text(text)
        out = debs / deb.name.replace("_amd64.deb", "+english-only_amd64.deb")
        subprocess.run(["dpkg-deb", "--root-owner-group", "-Zxz", "-b", str(root), str(out)], check=True,
                       stdout=subprocess.DEVNULL)
    deb.unlink()


def _mib(path: Path) -> float:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) / 2**20


_norm = gpu_image.norm  # a distribution's normalized name


def _dist_of(wheel: Path) -> str:
    return _norm(wheel.name.split("-", 1)[0])


def _wheel_version(wheel: Path) -> str:
    return wheel.name.split("-")[1]


# --- installing the bundle (on the box) -------------------------------------------------------------------

def _version_key(version: str) -> tuple:
    parts = []
    for piece in re.split(r"[.+-]", version):
        m = re.match(r"(\d+)(.*)", piece)
        parts.append((int(m.group(1)), m.group(2)) if m else (-1, piece))
    return tuple(parts)


def _installed_version(dist: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def choose_wheels(wheels: list[Path]) -> tuple[list[Path], dict[str, str]]:
    """The wheels to install: a package missing here, or older than the wheel (and its TOGETHER
    partners). Returns them and, per package, what was decided."""
    chosen, why = set(), {}
    for wheel in wheels:
        dist, version = _dist_of(wheel), _wheel_version(wheel)
        have = _installed_version(dist)
        if have is None or _version_key(have) < _version_key(version):
            chosen.add(dist)
            why[dist] = f"install {version}" + (f" (have {have})" if have else " (missing)")
        else:
            why[dist] = f"keep the box's {have} (bundle has {version})"
    for group in TOGETHER:
        if chosen & group:
            for dist in group - chosen:
                chosen.add(dist)
                why[dist] = f"install (with {', '.join(sorted(chosen & group - {dist}))})"
    return [w for w in wheels if _dist_of(w) in chosen], why


def install_wheels(wheels: list[Path], site: Path, log: Log) -> None:
    shutil.rmtree(site, ignore_errors=True)
    site.mkdir(parents=True)
    if not wheels:
        return
    pip = subprocess.run([sys.executable, "-m", "pip", "install", "--no-index", "--no-deps", "--no-compile",
                          "--disable-pip-version-check", "--target", str(site), *map(str, wheels)],
                         capture_output=True, text=True)
    if pip.returncode == 0:
        return
    log(f"pip install --target failed ({pip.returncode}): {pip.stderr.strip()[-400:]}; unpacking the wheels instead")
    shutil.rmtree(site, ignore_errors=True)
    site.mkdir(parents=True)
    for wheel in wheels:  # a wheel is a zip of its install tree; *.data/{purelib,platlib} go to the root
        with zipfile.ZipFile(wheel) as z:
            for member in z.infolist():
                name = member.filename
                m = re.match(r"[^/]+\.data/(purelib|platlib)/(.*)", name)
                if m:
                    name = m.group(2)
                elif re.match(r"[^/]+\.data/", name):
                    continue
                if not name or name.endswith("/"):
                    continue
                target = site / name
                target.parent.mkdir(parents=True, exist_ok=True)
                with z.open(member) as src, open(target, "wb") as dst:
                    shutil.copyfileobj(src, dst)


def _system_sonames() -> set[str]:
    names: set[str] = set()
    ldconfig = shutil.which("ldconfig") or ("/sbin/ldconfig" if os.path.exists("/sbin/ldconfig") else None)
    if ldconfig:
        try:
            out = subprocess.run([ldconfig, "-p"], capture_output=True, text=True, timeout=20).stdout
            names |= {line.split()[0] for line in out.splitlines()[1:] if line.strip()}
        except (OSError, subprocess.SubprocessError):
            pass
    for d in ("/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/lib64", "/usr/lib64", "/usr/lib", "/lib"):
        if Path(d).is_dir():
            names |= {p.name for p in Path(d).glob("lib*.so.*")}
    return names


def install_debs(debs: list[Path], root: Path, keep_libs: bool, log: Log) -> dict[str, Any]:
    """dpkg -x each .deb into `root`; libraries the system already has are removed from it (unless
    keep_libs) so that LD_LIBRARY_PATH only adds what is missing. Returns what was kept."""
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    dpkg = shutil.which("dpkg-deb") or shutil.which("dpkg")
    if dpkg is None:
        raise RuntimeError("neither dpkg-deb nor dpkg here: cannot unpack the .debs")
    for deb in debs:
        subprocess.run([dpkg, "-x", str(deb), str(root)], check=True, capture_output=True)
    kept, dropped = [], []
    system = set() if keep_libs else _system_sonames()
    for lib in sorted(root.glob("**/lib*.so*")):
        if not re.search(r"\.so(\.\d+)*$", lib.name) or "espeak-ng-data" in lib.parts:
            continue
        if lib.name in system:  # the soname (a link) or the file: the system's is newer, use it
            lib.unlink()
            dropped.append(lib.name)
        elif re.search(r"\.so\.\d+$", lib.name):  # a soname: what the loader looks for
            kept.append(lib.name)
    if "libpulse.so.0" in dropped:  # the system's libpulse finds its own libpulsecommon (its RUNPATH); ours,
        for d in root.glob("**/pulseaudio"):  # first on LD_LIBRARY_PATH, would be taken instead
            shutil.rmtree(d, ignore_errors=True)
    if dropped:
        log(f"system libraries used instead of the bundle's: {', '.join(sorted(set(dropped)))}")
    log(f"bundle libraries in use: {', '.join(sorted(set(kept))) or 'none'}")
    return {"kept": sorted(set(kept)), "system": sorted(set(dropped))}


def install_bundle(bundle: Path, site: Path, root: Path, keep_libs: bool, log: Log) -> tuple[dict[str, str], dict]:
    """The bundle's wheels that this machine lacks (or holds older) into `site`, its .debs into `root`:
    the environment that finds them (child_env), and what was decided and kept."""
    bundle = bundle.resolve()
    wheels = sorted((bundle / "wheels").glob("*.whl"))
    debs = sorted((bundle / "debs").glob("*.deb"))
    if not wheels and not debs:
        raise RuntimeError(f"no wheels or debs in {bundle} (build it with --make-bundle)")
    chosen, why = choose_wheels(wheels)
    log("wheels: " + "; ".join(f"{k}: {v}" for k, v in sorted(why.items())))
    install_wheels(chosen, site, log)
    libs = install_debs(debs, root, keep_libs, log)
    return child_env(site, root), {"wheels": why, "libraries": libs}


def child_env(site: Path, root: Path, base: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ if base is None else base)
    libdirs = [root / "usr/lib/x86_64-linux-gnu", root / "lib/x86_64-linux-gnu",
               root / "usr/lib/x86_64-linux-gnu/pulseaudio"]
    libdirs = [str(d) for d in libdirs if d.is_dir()]
    env["PATH"] = os.pathsep.join([str(root / "usr/bin"), str(root / "usr/sbin"), env.get("PATH", "")])
    env["LD_LIBRARY_PATH"] = os.pathsep.join(libdirs + ([env["LD_LIBRARY_PATH"]] if env.get("LD_LIBRARY_PATH") else []))
    env["PYTHONPATH"] = os.pathsep.join([str(site), str(REPO)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    data = next(iter(sorted(root.glob("usr/lib/*/espeak-ng-data"))), None)
    if data is not None:
        env["ESPEAK_DATA_PATH"] = str(data)
    env.update({"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONUNBUFFERED": "1",
                "PYTHONDONTWRITEBYTECODE": "1"})
    return env


def check_imports(env: dict[str, str], engine: str) -> str:
    """Import what `serve` and the load generator import, and find redis-server and espeak-ng, in a
    child with the fleet's environment: a missing piece is named here, not in a worker's traceback."""
    code = ("import api.app, cli.serve_cli, api.speech.fleet, api.encoders, uvicorn, redis, av, fastapi, "
            "loadtest.loadtest_cli, loadtest.runner, worker.text; "
            "import uvicorn.protocols.http.httptools_impl, websockets; "
            "import shutil, subprocess; assert shutil.which('redis-server'), 'no redis-server on PATH'; "
            "v = subprocess.run(['redis-server', '--version'], capture_output=True, text=True); "
            "assert v.returncode == 0, 'redis-server does not run: ' + v.stderr; print(v.stdout.strip()); "
            "from worker.text import espeak\n"
            "try: print('espeak:', espeak.english_word('Patel', False))\n"
            "except Exception as e: print('espeak: UNAVAILABLE (texts with words outside the lexicon will fail):', e)\n"
            + ("import worker.engine, worker.model.random_init; " if engine == "torch" else "")
            + "import fastapi, pydantic, starlette, av, torch; print('fastapi', fastapi.__version__, 'pydantic', "
              "pydantic.__version__, 'starlette', starlette.__version__, 'av', av.__version__); "
              "print('torch', torch.__version__, 'cuda', torch.version.cuda, 'available', torch.cuda.is_available())")
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=240)
    if r.returncode != 0:
        raise RuntimeError(f"the fleet's imports fail with the bundle installed:\n{r.stderr.strip()[-3000:]}")
    return r.stdout.strip()


# --- time: the start-up and the levels ------------------------------------------------------------------


def levels_need_s(levels: list[int], full: set[int], duration: float, min_duration: float) -> float:
    """Seconds the levels need after the start-up: each full level its whole window, the others
    their least; the fleet must be ready by the budget's end less this (and the stop's reserve)."""
    return sum((duration if c in full else min(min_duration, duration)) + LEVEL_OVERHEAD_S for c in levels)


def level_window(level: int, later: list[int], full: set[int], left: float, duration: float,
                 min_duration: float) -> float | None:
    """Seconds of load for `level` with `left` seconds to go, the full levels after it kept whole;
    None: skipped (a full level that cannot have its window, another under --min-duration)."""
    reserved = sum(duration + LEVEL_OVERHEAD_S for c in later if c in full)
    if level in full:
        return duration if left - reserved >= duration + LEVEL_OVERHEAD_S else None
    window = min(duration, left - reserved - LEVEL_OVERHEAD_S)
    return window if window >= min(min_duration, duration) else None


# --- the fleet ------------------------------------------------------------------------------------------

def http_json(url: str, timeout: float = 5.0) -> tuple[int, Any]:
    request = urllib.request.Request(url, headers={"Connection": "close"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as r:
            return r.status, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as e:
        try:
            return e.code, json.loads(e.read() or b"null")
        except ValueError:
            return e.code, None
    except (OSError, ValueError):
        return 0, None


class Fleet:
    def __init__(self, args: argparse.Namespace, env: dict[str, str], log: Log, scratch: Path):
        self.args, self.log = args, log
        self.port = args.port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = scratch / "serve.log"
        self.env = {**env, "KOKORO_SYNTHESIS_CACHE_MIB": "0", "KOKORO_DRAIN_SECONDS": "5",
                    "KOKORO_CACHE_DIR": str(scratch / "cache"), "KOKORO_MPS": args.mps}
        if args.dtype:
            self.env["KOKORO_DTYPE"] = args.dtype
        if not args.cuda_graphs:
            self.env["KOKORO_CUDA_GRAPHS"] = "false"
        if not args.compile:
            self.env["KOKORO_COMPILE"] = "false"
        if args.compile_cache_dir:
            self.env["KOKORO_COMPILE_CACHE_DIR"] = args.compile_cache_dir
        if args.replicas:
            self.env["KOKORO_REPLICAS"] = str(args.replicas)
        if args.batch_max:
            self.env["KOKORO_BATCH_MAX"] = str(args.batch_max)
        self.env.pop("REDIS_URL", None)
        self.cmd = [sys.executable, "-m", "cli.main", "serve", "--host", "127.0.0.1", "--port", str(self.port),
                    "--workers", str(args.workers), "--device", args.device, "--engine", args.engine,
                    "--weights", args.weights]
        self.proc: subprocess.Popen | None = None
        self._log_file = None

    def start(self) -> None:
        self.log("starting: " + " ".join(self.cmd))
        self._log_file = open(self.log_path, "wb")
        self.proc = subprocess.Popen(self.cmd, cwd=REPO, env=self.env, stdout=self._log_file,
                                     stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=_die_with_parent)

    def text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def wait_ready(self, deadline: float) -> dict[str, Any]:
        """Until every worker answers ready in /health (each names itself), the server exits, a
        worker fails to load, or the deadline. Progress: workers whose model is ready, per the log."""
        started = time.monotonic()
        ready: set[str] = set()
        last_note = 0.0
        health: Any = None
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"serve exited with {self.proc.returncode} while starting")
            status, body = http_json(self.url + "/health")
            if status == 200 and isinstance(body, dict):
                if body.get("error"):
                    raise RuntimeError(f"a worker failed to load: {body['error']}")
                if body.get("ready"):
                    ready.add(str(body.get("worker", "single")))
                    health = body
            if len(ready) >= self.args.workers:
                waited = time.monotonic() - started
                self.log(f"all {len(ready)} workers ready after {waited:.1f} s")
                return {"ready_workers": len(ready), "startup_s": round(waited, 1), "health": health}
            now = time.monotonic()
            if now - last_note >= 10:
                text = self.text()
                loaded = len(re.findall(r"model ready in|ready in [\d.]+ s: SIMULATED", text))
                captured = len(re.findall(r"[Cc]aptur", text))
                self.log(f"waiting for the fleet: {loaded}/{self.args.workers} models ready per the log, "
                         f"{len(ready)} answered ready, {captured} capture lines, {now - started:.0f} s")
                last_note = now
            if now > deadline:
                return {"ready_workers": len(ready), "startup_s": round(now - started, 1), "health": health,
                        "timed_out": True}
            time.sleep(0.5)

    def redis_port(self) -> int | None:
        """The embedded redis-server's port, from serve's log."""
        m = re.search(r"embedded redis-server at redis://127\.0\.0\.1:(\d+)", self.text())
        return int(m.group(1)) if m else None

    def stop(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.proc is None:
            return out
        redis_port = self.redis_port()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                out["killed"] = True
        try:  # whatever of its process group is left (workers that did not drain)
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            pass
        out["returncode"] = self.proc.returncode
        if redis_port:  # its own session, so not in the group: it dies with the launcher, else here
            for pid in _pids_matching(rf"redis.*--port\x00{redis_port}\x00"):
                _kill(pid)
                out["redis_killed"] = pid
        if "MPS: daemon started" in self.text():
            control = shutil.which("nvidia-cuda-mps-control")
            pipe = Path(self.env.get("CUDA_MPS_PIPE_DIRECTORY", "/tmp/kokoro-fleet-mps/pipe"))
            if control and (pipe / "control").exists():
                subprocess.run([control], input=b"quit\n", capture_output=True, timeout=20)
                out["mps_quit"] = True
        if self._log_file:
            self._log_file.close()
        return out


def _die_with_parent() -> None:  # pragma: no cover (runs in the child between fork and exec)
    """Linux: the child gets SIGTERM (serve: drain, stop its Redis and MPS) if this script is killed."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except Exception:  # noqa: BLE001
        pass


def _pids_matching(pattern: str) -> list[int]:
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if re.search(pattern, cmdline):
            pids.append(int(proc.name))
    return pids


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


# --- GPU sampling ----------------------------------------------------------------------------------------

class GpuSampler:
    """nvidia-smi's utilization.gpu and memory.used, once a second, while a level runs."""

    def __init__(self, index: int = 0):
        self.smi = shutil.which("nvidia-smi")
        self.index = index
        self.samples: list[tuple[float, float]] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> "GpuSampler":
        if self.smi:
            self._thread = threading.Thread(target=self._run, daemon=True)
            self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                out = subprocess.run([self.smi, "--query-gpu=utilization.gpu,memory.used",
                                      "--format=csv,noheader,nounits", "-i", str(self.index)],
                                     capture_output=True, text=True, timeout=10).stdout
                util, mem = (float(x) for x in out.strip().splitlines()[0].split(","))
                self.samples.append((util, mem))
            except (OSError, subprocess.SubprocessError, ValueError, IndexError):
                pass
            self._stop.wait(1.0)

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join(15)

    def summary(self) -> dict[str, Any] | None:
        if not self.samples:
            return None
        util = [s[0] for s in self.samples]
        mem = [s[1] for s in self.samples]
        return {"util_pct_mean": round(statistics.fmean(util), 1), "util_pct_max": max(util),
                "mem_used_mib_max": max(mem), "mem_used_mib_mean": round(statistics.fmean(mem)), "samples": len(util)}


def gpu_facts() -> dict[str, Any] | None:
    smi = shutil.which("nvidia-smi")
    if not smi:
        return None
    try:
        out = subprocess.run([smi, "--query-gpu=name,memory.total,memory.used,driver_version",
                              "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=20).stdout
        name, total, used, driver = [x.strip() for x in out.strip().splitlines()[0].split(",")]
        return {"name": name, "memory_total_mib": float(total), "memory_used_mib_idle": float(used), "driver": driver}
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return None


def mps_state(serve_log: str) -> dict[str, Any]:
    """Whether the fleet runs under MPS, two ways: what `serve` logged ("MPS: ...") and whether
    nvidia-smi's compute processes include an MPS server (under MPS the workers' contexts live in
    nvidia-cuda-mps-server, so it is listed where they would be). The log alone can be wrong: CUDA
    runs without MPS, silently, when the daemon the launcher found has died."""
    said = re.findall(r"MPS: [^\n]*", serve_log)
    state: dict[str, Any] = {"serve_log": said[-1] if said else None, "mps_server_listed": None}
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            out = subprocess.run([smi, "--query-compute-apps=process_name", "--format=csv,noheader"],
                                 capture_output=True, text=True, timeout=20).stdout
            names = [line.strip() for line in out.splitlines() if line.strip()]
            state["compute_processes"] = len(names)
            state["mps_server_listed"] = any("mps-server" in name for name in names)
        except (OSError, subprocess.SubprocessError):
            pass
    return state


def engines_in_log(serve_log: str) -> dict[str, Any]:
    """How the replicas' engines started, from serve's log: compiled passes compiled, loaded or
    failed (worker/compile_cache.py logs one line per engine), captures that failed, recompiles."""
    records = re.findall(r"compiled passes (compiled|loaded from the host's cache|reused from this process|failed)"
                         r"[^\n]*", serve_log)
    kinds = [m.split()[0] for m in records]
    plan = re.findall(r"replicas: (\d+) of (\d+) workers?[^\n]*?batches of up to (\d+) chunk", serve_log)
    return {**({"replicas": int(plan[-1][0]), "batch_max": int(plan[-1][2])} if plan else {}),
            "compiled": kinds.count("compiled"), "loaded": kinds.count("loaded") + kinds.count("reused"),
            "compile_failed": kinds.count("failed"),
            "capture_failed": len(re.findall(r"CUDA graph capture (?:of batches )?failed", serve_log)),
            "recompile_lines": len(re.findall(r"recompile\(s\)", serve_log))}


def replica_memory(gpu: dict[str, Any] | None, replicas: int) -> dict[str, Any] | None:
    """The device's used memory once every worker is ready, over the replicas (CUDA contexts
    included; under MPS the contexts live in its server), against the idle reading at the start."""
    now = gpu_facts()
    if not gpu or not now or replicas <= 0:
        return None
    used = now["memory_used_mib_idle"]
    return {"used_mib_ready": used, "used_mib_idle": gpu["memory_used_mib_idle"],
            "mib_per_replica": round((used - gpu["memory_used_mib_idle"]) / replicas)}


# --- Redis: its CPU and bytes over a level ----------------------------------------------------------------

REDIS_FIGURES = ("used_cpu_sys", "used_cpu_user", "total_net_input_bytes", "total_net_output_bytes")


def redis_info(port: int, host: str = "127.0.0.1", timeout: float = 5.0) -> dict[str, float]:
    """REDIS_FIGURES from `INFO` of the fleet's Redis (RESP by hand: nothing but the standard library
    is imported here); {} when it does not answer."""
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            sock.sendall(b"*1\r\n$4\r\nINFO\r\n")
            data = b""
            while b"\r\n" not in data:
                chunk = sock.recv(65536)
                if not chunk:
                    return {}
                data += chunk
            header, _, body = data.partition(b"\r\n")
            if not header.startswith(b"$"):
                return {}
            size = int(header[1:])
            while len(body) < size:
                chunk = sock.recv(65536)
                if not chunk:
                    break
                body += chunk
    except (OSError, ValueError):
        return {}
    return parse_redis_info(body[:size].decode(errors="replace"))


def parse_redis_info(text: str) -> dict[str, float]:
    figures = {}
    for line in text.splitlines():
        name, _, value = line.partition(":")
        if name in REDIS_FIGURES:
            try:
                figures[name] = float(value)
            except ValueError:
                pass
    return figures


def redis_load(before: dict[str, float], after: dict[str, float], wall_s: float) -> dict[str, float] | None:
    """Redis's share of one core (sys + user CPU seconds per wall second) and its bytes per second in
    and out between two INFO readings; None without both."""
    if wall_s <= 0 or any(k not in before or k not in after for k in REDIS_FIGURES):
        return None
    cpu_s = (after["used_cpu_sys"] - before["used_cpu_sys"]) + (after["used_cpu_user"] - before["used_cpu_user"])
    return {"cpu_core_fraction": round(cpu_s / wall_s, 3),
            "net_in_bytes_per_s": round((after["total_net_input_bytes"] - before["total_net_input_bytes"]) / wall_s),
            "net_out_bytes_per_s": round((after["total_net_output_bytes"] - before["total_net_output_bytes"]) / wall_s)}


# --- one level of load ------------------------------------------------------------------------------------

STEP_FIELDS = ("ok", "rejected_503", "errors", "attempted", "requests_per_s", "audio_s_per_wall_s",
               "mean_in_flight", "max_in_flight", "continuous_fraction", "rejection_rate", "error_rate")


def run_level(args: argparse.Namespace, fleet: Fleet, env: dict[str, str], concurrency: int, duration: float,
              timeout: float, scratch: Path, log: Log) -> dict[str, Any]:
    out = scratch / f"c{concurrency}"
    cmd = [sys.executable, "-m", "loadtest", "run", "--url", fleet.url, "--concurrency", str(concurrency),
           "--duration", f"{duration:.1f}", "--texts", args.texts, "--format", args.format, "--stream",
           "--warmup", str(args.warmup), "--wait", "30", "--quiet", "--timeout", "120",
           "--read-timeout", "60", "--out", str(out)]
    level: dict[str, Any] = {"concurrency": concurrency, "duration_s": round(duration, 1)}
    redis_port = fleet.redis_port()
    redis_before = redis_info(redis_port) if redis_port else {}
    started = time.monotonic()
    with GpuSampler() as gpu:
        try:
            r = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout,
                               preexec_fn=_die_with_parent)
            level["returncode"] = r.returncode
            log.block(f"loadtest c={concurrency}", (r.stdout[-3000:] + "\n" + r.stderr[-2000:]).strip())
        except subprocess.TimeoutExpired as e:
            level["returncode"] = None
            level["error"] = f"the load generator ran past {timeout:.0f} s and was stopped"
            log.block(f"loadtest c={concurrency} (stopped)", str(e.stdout or "")[-2000:])
    wall_s = time.monotonic() - started
    level["wall_s"] = round(wall_s, 1)
    level["gpu"] = gpu.summary()
    # over the generator's whole run (warm-up and the tail included): an upper bound of the level's share
    level["redis"] = redis_load(redis_before, redis_info(redis_port) if redis_port else {}, wall_s)
    summary_path = out / "summary.json"
    if summary_path.is_file():
        step = json.loads(summary_path.read_text())["steps"][0]
        for key in STEP_FIELDS:
            level[key] = step.get(key)
        for key in ("ttfa_s", "e2e_s", "rtf", "underrun_s", "headers_s", "retry_after_s", "rejected_latency_s"):
            level[key] = {p: step.get(key, {}).get(p) for p in ("p50", "p95", "p99", "mean", "max", "n")}
        level["error_examples"] = step.get("error_examples")
        level["refused_per_s"] = round((level["rejected_503"] or 0) / duration, 1)
    elif "error" not in level:
        level["error"] = f"no summary.json (exit {level.get('returncode')})"
    return level


# --- results ------------------------------------------------------------------------------------------------

def _ms(x: Any) -> str:
    return "-" if x is None else f"{1000 * x:.0f}"


def markdown(result: dict[str, Any]) -> str:
    meta = result.get("meta", {})
    gpu = meta.get("gpu") or {}
    lines = [
        f"# Fleet load test: {meta.get('workers')} workers ({meta.get('replicas', meta.get('workers'))} replicas, "
        f"batch max {meta.get('batch_max', 'default')}), {meta.get('engine')} engine, "
        f"weights {meta.get('weights')} on {meta.get('device')} ({gpu.get('name', 'no GPU')})",
        "",
        ("**RANDOM weights: the audio is not speech.** Full-size Kokoro-82M shapes, CUDA graphs and speech-like "
         "durations, so speed, memory and scheduling are the real model's." if meta.get("random_weights") else
         "**SIMULATED engine: no model**; each chunk waits an assumed GPU time (worker/sim_engine.py)."
         if meta.get("engine") == "sim" else f"Weights `{meta.get('weights')}`."),
        "",
        f"Texts `{meta.get('texts')}`, format `{meta.get('format')}`, streamed, closed loop; synthesis cache off. "
        f"Start-up to all workers ready: {result.get('startup', {}).get('startup_s', '-')} s. "
        f"Times in ms over successful requests; 503s counted apart.",
        "",
        _mps_sentence(result.get("mps")),
        "",
        _engines_sentence(result),
        "",
        "| c | ok | 503 | err | req/s | audio-s/s | TTFA p50 | p95 | p99 | E2E p50 | p95 | p99 | RTF p50 | "
        "in flight | GPU util mean/max % | GPU mem max MiB | 503 p99 ms | 503/s | Retry-After p50/p95 ms | "
        "Redis CPU % of a core | Redis in/out MB/s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for lv in result.get("levels", []):
        if "ttfa_s" not in lv:
            lines.append(f"| {lv['concurrency']} | {lv.get('error', 'no result')} |" + " |" * 19)
            continue
        g = lv.get("gpu") or {}
        rtf = lv["rtf"]["p50"]
        lines.append(
            f"| {lv['concurrency']} | {lv['ok']} | {lv['rejected_503']} | {lv['errors']} | {lv['requests_per_s']:.2f} | "
            f"{lv['audio_s_per_wall_s']:.1f} | {_ms(lv['ttfa_s']['p50'])} | {_ms(lv['ttfa_s']['p95'])} | "
            f"{_ms(lv['ttfa_s']['p99'])} | {_ms(lv['e2e_s']['p50'])} | {_ms(lv['e2e_s']['p95'])} | "
            f"{_ms(lv['e2e_s']['p99'])} | {'-' if rtf is None else f'{rtf:.3f}'} | {lv['mean_in_flight']:.1f} | "
            f"{g.get('util_pct_mean', '-')}/{g.get('util_pct_max', '-')} | {g.get('mem_used_mib_max', '-')} | "
            f"{_ms((lv.get('rejected_latency_s') or {}).get('p99'))} | {_refusals_and_redis(lv)} |")
    for note in result.get("notes", []):
        lines.append(f"\n- {note}")
    if result.get("error"):
        lines.append(f"\n**Stopped early:** {result['error'].splitlines()[0]}")
    return "\n".join(lines) + "\n"


def _refusals_and_redis(lv: dict[str, Any]) -> str:
    """The 503/s, Retry-After and Redis cells of a level's row."""
    retry = lv.get("retry_after_s") or {}
    redis = lv.get("redis") or {}
    cpu = redis.get("cpu_core_fraction")
    net = (f"{redis['net_in_bytes_per_s'] / 1e6:.1f}/{redis['net_out_bytes_per_s'] / 1e6:.1f}"
           if "net_in_bytes_per_s" in redis else "-")
    return " | ".join((f"{lv['refused_per_s']:.1f}" if lv.get("refused_per_s") is not None else "-",
                       f"{_ms(retry.get('p50'))}/{_ms(retry.get('p95'))}",
                       "-" if cpu is None else f"{100 * cpu:.0f}", net))


def _engines_sentence(result: dict[str, Any]) -> str:
    """How the replicas ran (serve's log) and their GPU memory once ready."""
    meta, engines, memory = result.get("meta", {}), result.get("engines"), result.get("memory")
    said = (f"compiled passes {'on' if meta.get('compile', True) else 'off'} (cache {meta.get('compile_cache_dir')}), "
            f"CUDA graphs {'on' if meta.get('cuda_graphs', True) else 'off'}")
    if engines and engines.get("replicas"):
        said += f"; serve's plan: {engines['replicas']} replicas, batches of up to {engines['batch_max']} chunks"
    if engines:
        said += (f"; per serve's log {engines['compiled']} engines compiled, {engines['loaded']} loaded, "
                 f"{engines['compile_failed']} failed to compile, {engines['capture_failed']} captures failed")
    if memory:
        said += (f"; GPU memory per replica once ready {memory['mib_per_replica']} MiB (device "
                 f"{memory['used_mib_idle']:.0f} -> {memory['used_mib_ready']:.0f} MiB)")
    return "Engines: " + said + "."


def _mps_sentence(mps: dict[str, Any] | None) -> str:
    if not mps:
        return "MPS: not checked (the fleet did not start)."
    listed = {True: "an MPS server is among nvidia-smi's compute processes",
              False: "no MPS server among nvidia-smi's compute processes: the replicas time-slice the GPU",
              None: "nvidia-smi not asked"}[mps.get("mps_server_listed")]
    return f"MPS: serve said \"{mps.get('serve_log') or 'nothing'}\"; {listed}."


def write_results(out: Path, result: dict[str, Any]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / f".{OUT_JSON}.tmp"
    tmp.write_text(json.dumps(result, indent=2, default=str) + "\n")
    os.replace(tmp, out / OUT_JSON)
    (out / OUT_MD).write_text(markdown(result))


# --- the command ---------------------------------------------------------------------------------------------

def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python3 -m loadtest.gpu_fleet", description=__doc__.split("\n\n")[0])
    p.add_argument("--make-bundle", metavar="DIR", help="build the bundle in DIR (here, with PyPI and apt) and exit")
    p.add_argument("--python", default="", help="--make-bundle: an interpreter of the box's Python version, which "
                   "resolves for it (default: python3.12 here, pyenv's too)")
    p.add_argument("--bundle", default=".fleet",
                   help="the bundle folder (wheels/, debs/), default .fleet; `none`: this machine's packages as they are")
    p.add_argument("--out", help="where gpu_fleet.json, gpu_fleet.md and gpu_fleet.log go")
    p.add_argument("--budget-s", type=float, default=540.0,
                   help="the whole run's limit, install to stop (default 540: under the device's 10-minute call)")
    p.add_argument("--stop-reserve-s", type=float, default=STOP_RESERVE_S,
                   help="seconds of the budget kept for stopping the fleet and writing (default 25)")
    p.add_argument("--workers", type=int, default=8)
    p.add_argument("--replicas", type=int, default=0,
                   help="KOKORO_REPLICAS: workers holding a model replica (default 0: every worker)")
    p.add_argument("--batch-max", type=int, default=0,
                   help="KOKORO_BATCH_MAX: jobs a replica runs as one pass (default 0: the server's default)")
    p.add_argument("--device", default="cuda", help="cuda (default), cuda:N or cpu")
    p.add_argument("--engine", default="torch", choices=["torch", "sim"],
                   help="torch (default) or sim: the simulated engine (no model), for a quick check of the rest")
    p.add_argument("--weights", default="random-full", help="KOKORO_WEIGHTS (default random-full)")
    p.add_argument("--dtype", default="", help="KOKORO_DTYPE (default: the server's auto, bf16 on CUDA)")
    p.add_argument("--cuda-graphs", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--compile", action=argparse.BooleanOptionalAction, default=True,
                   help="KOKORO_COMPILE: the compiled passes (default on)")
    p.add_argument("--compile-cache-dir", default="",
                   help="KOKORO_COMPILE_CACHE_DIR: a warm compile cache (the GPU harness passes the one its engine "
                        "steps left; default: a fresh one in the scratch folder, so every start compiles)")
    p.add_argument("--mps", default="auto", choices=["auto", "on", "off"], help="KOKORO_MPS (default auto)")
    p.add_argument("--levels", default="1,64,128,256", help="closed-loop concurrency levels (default 1,64,128,256)")
    p.add_argument("--duration", type=float, default=30.0,
                   help="seconds each level holds its load at most; less when the budget is short (default 30)")
    p.add_argument("--min-duration", type=float, default=5.0, help="a level shorter than this is skipped (default 5)")
    p.add_argument("--full-levels", default="",
                   help="levels that get their whole --duration or are skipped (default: every level but the "
                        "first, which takes what the others leave, down to --min-duration)")
    p.add_argument("--texts", default="paragraphs", help="loadtest text set: short, paragraphs, long (default paragraphs)")
    p.add_argument("--format", default="pcm", help="response_format (default pcm)")
    p.add_argument("--warmup", type=int, default=2, help="warm-up requests before each level (default 2)")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--site", default="/tmp/fleet-site", help="where the wheels are installed")
    p.add_argument("--root", default="/tmp/fleet-root", help="where the .debs are unpacked")
    p.add_argument("--keep-libs", action="store_true",
                   help="keep every unpacked library, even those the system has (a local check of the bundle's own)")
    args = p.parse_args(argv)
    if not args.make_bundle and not args.out:
        p.error("--out is required")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.make_bundle:
        return make_bundle(Path(args.make_bundle).resolve(), args.python or None)
    t0 = time.monotonic()
    deadline = t0 + args.budget_s
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    (out / OUT_LOG).unlink(missing_ok=True)
    log = Log(out / OUT_LOG)
    levels = [int(x) for x in args.levels.split(",") if x.strip()]
    full = {int(x) for x in args.full_levels.split(",") if x.strip()} if args.full_levels else set(levels[1:])
    result: dict[str, Any] = {
        "meta": {"started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "argv": sys.argv, "workers": args.workers,
                 "replicas": args.replicas or args.workers, "batch_max": args.batch_max or "default",
                 "device": args.device, "engine": args.engine, "weights": args.weights, "dtype": args.dtype or "auto",
                 "cuda_graphs": args.cuda_graphs, "compile": args.compile,
                 "compile_cache_dir": args.compile_cache_dir or "fresh (scratch)", "levels": levels, "texts": args.texts, "format": args.format,
                 "budget_s": args.budget_s, "python": platform.python_version(), "machine": platform.machine(),
                 "cpus": os.cpu_count(), "gpu": gpu_facts(),
                 "random_weights": args.weights == "random-full" and args.engine == "torch"},
        "levels": [], "notes": []}
    if result["meta"]["random_weights"]:
        result["notes"].append("RANDOM weights (KOKORO_WEIGHTS=random-full): the audio is not speech")

    def on_term(signum, frame):  # a `timeout` around this: stop the fleet and write, as at the end
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # once: a second must not cut the stop short
        raise SystemExit(f"signal {signum}")

    signal.signal(signal.SIGTERM, on_term)
    fleet: Fleet | None = None
    scratch = Path(tempfile.mkdtemp(prefix="gpu-fleet-"))
    try:
        if args.bundle == "none":  # installed already (the GPU harness's start), or a machine that has it all
            why, libs = {"bundle": "none: this machine's packages as they are"}, {}
            log("no bundle: the fleet runs on this machine's packages (and what PYTHONPATH adds)")
            env = child_env(scratch / "no-site", scratch / "no-root")
        else:
            env, installed = install_bundle(Path(args.bundle), Path(args.site), Path(args.root), args.keep_libs, log)
            why, libs = installed["wheels"], installed["libraries"]
        facts = check_imports(env, args.engine)
        result["install"] = {"wheels": why, "libraries": libs, "imports": facts,
                             "install_s": round(time.monotonic() - t0, 1)}
        log("imports ok: " + facts.replace("\n", "; ") + f"; installed in {time.monotonic() - t0:.1f} s")
        write_results(out, result)

        fleet = Fleet(args, env, log, scratch)
        fleet.start()
        startup_deadline = deadline - args.stop_reserve_s - levels_need_s(levels, full, args.duration, args.min_duration)
        startup = fleet.wait_ready(startup_deadline)
        result["startup"] = {k: v for k, v in startup.items() if k != "health"}
        result["health"] = startup.get("health")
        result["mps"] = mps_state(fleet.text())
        result["engines"] = engines_in_log(fleet.text())
        # serve's own plan (api/gpu_sharing.py: without MPS one batching replica) when it logged one
        result["memory"] = replica_memory(result["meta"]["gpu"],
                                          result["engines"].get("replicas") or args.replicas or args.workers)
        log(f"engines: {result['engines']}; GPU memory: {result['memory']}")
        log(f"MPS: {result['mps']}")
        write_results(out, result)
        if startup.get("timed_out"):
            raise RuntimeError(f"only {startup['ready_workers']} of {args.workers} workers were ready within the "
                               f"budget ({startup['startup_s']} s of start-up)")

        for i, c in enumerate(levels):
            left = deadline - args.stop_reserve_s - time.monotonic()
            duration = level_window(c, levels[i + 1:], full, left, args.duration, args.min_duration)
            if duration is None:
                result["notes"].append(f"c={c} skipped: {max(0.0, left):.0f} s of budget left")
                log(f"c={c}: skipped ({max(0.0, left):.0f} s of budget left)")
                continue
            log(f"c={c}: {duration:.1f} s of load")
            level = run_level(args, fleet, env, c, duration, max(10.0, left - 2), scratch, log)
            result["levels"].append(level)
            if "ttfa_s" in level:
                log(f"c={c}: ok {level['ok']}, 503 {level['rejected_503']} ({level['refused_per_s']}/s), "
                    f"errors {level['errors']}, redis {level.get('redis')}, "
                    f"{level['audio_s_per_wall_s']:.1f} audio-s/s, {level['requests_per_s']:.2f} req/s, TTFA p50/p95/p99 "
                    f"{_ms(level['ttfa_s']['p50'])}/{_ms(level['ttfa_s']['p95'])}/{_ms(level['ttfa_s']['p99'])} ms, "
                    f"gpu {level.get('gpu')}")
            else:
                log(f"c={c}: {level.get('error')}")
            write_results(out, result)
            if fleet.proc.poll() is not None:
                raise RuntimeError(f"serve exited with {fleet.proc.returncode} during the load")
    except BaseException as exc:  # noqa: BLE001 (SystemExit from SIGTERM, KeyboardInterrupt too: write first)
        result["error"] = f"{type(exc).__name__}: {exc}"
        log(f"stopped: {result['error']}")
        log.block("traceback", traceback.format_exc())
    finally:
        if fleet is not None:
            try:
                text = fleet.text()
                result["serve_log"] = {"lines": text.count("\n"), "errors": len(re.findall(r" ERROR |Traceback", text)),
                                       "warnings": len(re.findall(r" WARNING ", text))}
                result["stop"] = fleet.stop()
                text = fleet.text()
                lines = text.splitlines()
                important = [ln for ln in lines if re.search(r"ERROR|Traceback|Error:|WARNING|ready in|start-up:|fleet of|GPU|MPS|"
                                                             r"memory", ln)]
                log.block("serve log: first 60 lines", "\n".join(lines[:60]))
                log.block("serve log: errors, warnings and start-up lines (last 80)", "\n".join(important[-80:]))
                log.block("serve log: last 60 lines", "\n".join(lines[-60:]))
            except BaseException as exc:  # noqa: BLE001
                log(f"stopping the fleet: {type(exc).__name__}: {exc}")
        result["total_s"] = round(time.monotonic() - t0, 1)
        write_results(out, result)
        log(f"results: {out / OUT_JSON}, {out / OUT_MD}; {result['total_s']} s in all")
        shutil.rmtree(scratch, ignore_errors=True)
    return 1 if result.get("error") or not result["levels"] else 0


if __name__ == "__main__":
    sys.exit(main())
