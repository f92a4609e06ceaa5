"""modal_app.py's container side, run here without Modal: `Server.serve` started in a process of
its own as Modal's container would run it (the real docker/entrypoint.sh, a fake `kokoro-fleet
serve` that answers /ready as a fleet of two replicas would and exits when told; or the real fleet
of two replicas, one held back), the cold-start deadline, readiness of the whole fleet, the
watchdog and its liveness check, the drain on stop (`@modal.exit`), the private default, and the
compile cache between a Volume's directory and the container's disk.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from fake_kokoro_fleet import install_fake_kokoro_fleet  # tests/fake_kokoro_fleet.py

from api.ports import free_port

pytest.importorskip("modal", reason="the `modal` package (dev extra) is needed to import modal_app.py")

ROOT = Path(__file__).resolve().parents[2]
# Deadlines for events that take a second or two: generous for a loaded machine; a test fails at
# one only when the event never comes.
EVENT_DEADLINE_S = 120

# `kokoro-fleet serve` as the entrypoint starts it, a fleet of two replicas: /ready answers 503
# until the file `ready` appears, then 200 with one of two replicas serving, both once the file
# `whole` appears (a worker's /ready answers 200 before its server is whole: api/routes/status_routes.py);
# logs one start-up line the way api/app.py does and each /ready it answers; exits with status 3
# once the file `die` appears (a fleet that fails after its start), with 0 on SIGTERM (a drain).
FAKE_SERVE = r"""
import http.server, json, os, signal, sys, threading, time
port = int(sys.argv[sys.argv.index("--port") + 1])
state = sys.argv[0].rsplit("/", 1)[0]

class Ready(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        ready, whole = os.path.exists(f"{state}/ready"), os.path.exists(f"{state}/whole")
        serving = 2 if whole else 1
        self.send_response(200 if ready else 503)
        self.end_headers()
        self.wfile.write(json.dumps({"status": "ready", "replicas_planned": 2, "replicas_ready": serving}
                                    if ready else {"error": "loading"}).encode())
        print(f"FAKE: /ready {200 if ready else 503}, {serving if ready else 0} of 2", flush=True)
    def log_message(self, *args):
        pass

def drained(signum, frame):
    print("FAKE: SIGTERM: drained", flush=True)
    os._exit(0)

signal.signal(signal.SIGTERM, drained)
server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Ready)
threading.Thread(target=server.serve_forever, daemon=True).start()
print("INFO kokoro_fleet.api: start-up: imports and process set-up 1.5 s", flush=True)
print("INFO kokoro_fleet.speech: start-up: weights and engine 4.2 s, warm-up 30.0 s (replica and text readers)", flush=True)
print("INFO kokoro_fleet.engine: captured 6 stage-1 and 24 stage-2 CUDA graphs in 12.5 s, 146 MiB allocated", flush=True)
while not os.path.exists(f"{state}/die"):
    time.sleep(0.05)
sys.exit(3)
"""

# The container: modal_app imported as Modal does, `Server.serve` called, then the process lives on
# (as Modal's input loop would) until something ends it; SIGTERM stands for Modal stopping the
# container: the class's @modal.exit methods run, then the process ends. argv[3], when given, is a
# directory standing in for the compile cache's Volume.
CONTAINER = r"""
import signal, sys, time
from pathlib import Path
sys.path.insert(0, sys.argv[1])
import modal_app
from modal._partial_function import _PartialFunctionFlags, _find_partial_methods_for_user_cls
from modal._utils.async_utils import synchronizer
modal_app.ENTRYPOINT = sys.argv[2]  # the checkout's, where the image has /app/docker/entrypoint.sh
if len(sys.argv) > 3:
    class Volume:
        def commit(self):
            print("TEST: the Volume committed", flush=True)
    volume = Path(sys.argv[3])
    modal_app.COMPILE_VOLUME_DIR, modal_app.LOCAL_COMPILE_DIR = str(volume), str(volume.parent / "local-compile")
    modal_app.APP_DIR = sys.argv[1]
    modal_app.compile_volume = Volume()
server = modal_app.Server()

def stop(signum, frame):
    instance = synchronizer._translate_in(server)._cached_user_cls_instance()
    for method in _find_partial_methods_for_user_cls(type(instance), _PartialFunctionFlags.EXIT).values():
        method._get_raw_f()(instance)
    print("TEST: exit methods done", flush=True)
    sys.exit(0)

signal.signal(signal.SIGTERM, stop)
started = time.monotonic()
server.serve.local()
print(f"TEST: serve returned after {time.monotonic() - started:.1f} s", flush=True)
while True:
    time.sleep(1)
"""


def fake_fleet_env(tmp_path: Path, fake: bool = True, **modal_fields: str) -> dict[str, str]:
    """The container's environment: the fake `kokoro-fleet` first on PATH (or, `fake=False`, this
    venv's real one), no KOKORO_* of this shell, the deployment's fields as KOKORO_MODAL_*."""
    bin_dir = tmp_path / "bin"
    if fake:
        install_fake_kokoro_fleet(bin_dir, FAKE_SERVE)
    else:
        bin_dir.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KOKORO_", "REDIS_URL"))}
    env["PATH"] = f"{bin_dir}:{Path(sys.executable).parent}:{env['PATH']}"
    env.update({f"KOKORO_MODAL_{name.upper()}": value for name, value in modal_fields.items()})
    return env


class Container:
    """`api_keys`: what the deployment's API key secret gives the container (KOKORO_API_KEYS)."""

    def __init__(self, tmp_path: Path, api_keys: str = "test:secret-key", env: dict[str, str] | None = None,
                 volume: Path | None = None, fake: bool = True, **modal_fields: str):
        self.state = tmp_path / "bin"
        self.port = free_port()
        env = {**fake_fleet_env(tmp_path, fake, compile_cache_volume="", port=str(self.port), **modal_fields),
               **({"KOKORO_API_KEYS": api_keys} if api_keys else {}), **(env or {})}
        self.process = subprocess.Popen([sys.executable, "-c", CONTAINER, str(ROOT), str(ROOT / "docker" / "entrypoint.sh"),
                                         *([str(volume)] if volume else [])],
                                        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.lines: list[str] = []
        threading.Thread(target=lambda: self.lines.extend(self.process.stdout), daemon=True).start()

    def wait_for(self, text: str) -> str:
        """The first line of the container's log holding `text`, waiting for it to be written."""
        deadline = time.monotonic() + EVENT_DEADLINE_S
        while time.monotonic() < deadline:
            for line in list(self.lines):
                if text in line:
                    return line
            if self.process.poll() is not None and not any(text in line for line in list(self.lines)):
                time.sleep(0.5)  # the reader may still hold the last lines
                if not any(text in line for line in list(self.lines)):
                    break
            time.sleep(0.05)
        raise AssertionError(f"never logged {text!r}:\n{''.join(self.lines[-40:])}")

    def touch(self, name: str) -> None:
        (self.state / name).touch()

    def kill(self) -> None:
        """End the container as Modal would (SIGTERM: its exit methods drain the fleet), killing it
        only if that does not end it."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(EVENT_DEADLINE_S)
            except subprocess.TimeoutExpired:
                self.process.kill()
        self.process.wait(30)


@pytest.mark.parametrize("ready_in_time", [True, False], ids=["ready-in-time", "past-the-wait"])
def test_serve_lets_modal_route_by_the_deadline_and_the_container_ends_with_the_fleet(ready_in_time, tmp_path):
    """`serve` returns once the fleet is whole, or after ready_wait_seconds with the fleet still
    loading (its 503s answer what Modal then routes); either way the start-up split is logged once
    whole, and when the fleet exits later the container's process exits, with the fleet's status,
    for Modal to replace it."""
    container = Container(tmp_path, ready_wait_seconds="2.0")
    try:
        if ready_in_time:
            container.touch("ready")
            container.touch("whole")
            container.wait_for("TEST: serve returned")
        else:
            container.wait_for("the fleet is not whole after 2 s (/ready answers 503): taking requests now, "
                               "answered 503 with Retry-After")
            container.wait_for("TEST: serve returned")
            container.touch("ready")
            container.touch("whole")
        summary = container.wait_for("modal_app: start-up: every replica ready")
        assert "imports 1.5 s" in summary and "weights and engine 4.2 s" in summary, summary
        assert "capture 12.5 s" in summary and "warm-up 30.0 s" in summary, summary
        assert container.process.poll() is None, "the container ended while its fleet serves"
        container.touch("die")
        container.wait_for("the fleet exited with status 3: this container exits so Modal replaces it")
        assert container.process.wait(EVENT_DEADLINE_S) == 3
    finally:
        container.kill()


def test_serve_fails_the_container_start_when_the_fleet_dies_while_starting(tmp_path):
    container = Container(tmp_path, ready_wait_seconds="60.0")
    try:
        container.wait_for("start-up: imports")
        container.touch("die")
        container.wait_for("kokoro-fleet exited with status 3 while starting")
        assert container.process.wait(EVENT_DEADLINE_S) != 0
    finally:
        container.kill()


# --- the compile cache between the Volume and the container ------------------------------------------

class FakeVolume:
    def __init__(self):
        self.commits = 0

    def commit(self) -> None:
        self.commits += 1


def load_modal_app():
    sys.path.insert(0, str(ROOT))
    try:
        import modal_app
    finally:
        sys.path.remove(str(ROOT))
    return modal_app


def test_the_first_container_fills_the_volume_once_ready_and_the_next_loads_it(tmp_path):
    app = load_modal_app()
    volume_dir, volume = tmp_path / "volume", FakeVolume()
    volume_dir.mkdir()
    key = "NVIDIA-H100-80GB-HBM3-torch2.13.0-kokoro-fleet0.1.0"

    first = app.CompileCacheSync(volume_dir, tmp_path / "first" / "compile", key, volume)
    first.fetch()
    assert first.filling and "this container compiles and stores it" in first.describe()
    # what the fleet leaves in its compile directory (worker/compile_cache.py): inductor's caches,
    # a marker per compiled configuration, and the lock the replicas shared
    compiled = first.local_dir
    (compiled / "fxgraph" / "ab").mkdir(parents=True)
    (compiled / "fxgraph" / "ab" / "entry").write_bytes(b"x" * 1000)
    (compiled / "triton" / "k1").mkdir(parents=True)
    (compiled / "triton" / "k1" / "kernel.cubin").write_bytes(b"y" * 500)
    (compiled / "bf16-decoder.done").touch()
    (compiled / "compile.lock").touch()
    first.store(app.FleetReadiness(200, planned=2, ready=2))
    assert volume.commits == 1 and not first.filling
    marker = json.loads((volume_dir / key / app.CompileCacheSync.MARKER).read_text())
    assert marker["key"] == key and marker["files"] == 3 and marker["bytes"] == 1500
    assert not (volume_dir / key / "compile.lock").exists()

    later = app.CompileCacheSync(volume_dir, tmp_path / "later" / "compile", key, volume)
    later.fetch()
    assert not later.filling and "loaded from the Volume" in later.describe()
    assert (later.local_dir / "fxgraph" / "ab" / "entry").read_bytes() == b"x" * 1000
    assert (later.local_dir / "bf16-decoder.done").exists(), "the replicas would not know it is compiled"
    assert volume.commits == 1  # loading commits nothing

    other_card = app.CompileCacheSync(volume_dir, tmp_path / "h200" / "compile", key.replace("H100-80GB-HBM3", "H200"),
                                      volume)
    other_card.fetch()
    assert other_card.filling, "a cache compiled on another card must not be loaded"


def test_a_half_stored_cache_is_not_loaded(tmp_path):
    """Files without the COMPLETE marker (a container that died while storing) count as none."""
    app = load_modal_app()
    (tmp_path / "volume" / "key" / "fxgraph").mkdir(parents=True)
    (tmp_path / "volume" / "key" / "fxgraph" / "entry").write_bytes(b"partial")
    sync = app.CompileCacheSync(tmp_path / "volume", tmp_path / "local", "key", FakeVolume())
    sync.fetch()
    assert sync.filling and not (tmp_path / "local").exists()


def fake_nvidia_smi(tmp_path: Path, monkeypatch) -> None:
    bin_dir = tmp_path / "smi-bin"
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").write_text('#!/usr/bin/env bash\necho "NVIDIA H100 80GB HBM3"\n')
    (bin_dir / "nvidia-smi").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")


def test_the_cache_key_follows_the_card_torch_and_the_graph_sources(tmp_path, monkeypatch):
    """An edit of the model code makes a new key (a cache compiled from the old code is never
    loaded for it); an edit of the text frontend, which shapes no graph, keeps the key."""
    fake_nvidia_smi(tmp_path, monkeypatch)
    from importlib.metadata import version

    app = load_modal_app()
    sources = tmp_path / "app"
    shutil.copytree(ROOT / "worker", sources / "worker", ignore=shutil.ignore_patterns("__pycache__"))
    key = app.compile_cache_key(sources)
    assert key.startswith(f"NVIDIA-H100-80GB-HBM3-torch{version('torch')}-src".replace("+", "-")), key
    assert key == app.compile_cache_key(sources), "the same sources must give the same key"

    model_file = next((sources / "worker" / "model").glob("*.py"))
    model_file.write_text(model_file.read_text() + "\n# an edit of the model code\n")
    edited = app.compile_cache_key(sources)
    assert edited != key
    text_file = next((sources / "worker" / "text").rglob("*.py"))
    text_file.write_text(text_file.read_text() + "\n# an edit of the text frontend\n")
    assert app.compile_cache_key(sources) == edited
    (sources / "worker" / "__pycache__").mkdir()
    (sources / "worker" / "__pycache__" / "engine.cpython-311.pyc").write_bytes(b"bytecode")
    assert app.compile_cache_key(sources) == edited, "caches are not sources"


@pytest.mark.parametrize("readiness", [(503, 0, 0), (200, 2, 1), (0, 0, 0)], ids=["loading", "one-of-two", "down"])
def test_a_cache_from_a_fleet_that_is_not_whole_is_never_stored(readiness, tmp_path):
    app = load_modal_app()
    volume = FakeVolume()
    sync = app.CompileCacheSync(tmp_path / "volume", tmp_path / "local", "key", volume)
    (tmp_path / "local" / "fxgraph").mkdir(parents=True)
    (tmp_path / "local" / "fxgraph" / "entry").write_bytes(b"half-written by the replica still compiling")
    with pytest.raises(app.PartialFleet, match="not whole"):
        sync.store(app.FleetReadiness(*readiness))
    assert not (tmp_path / "volume").exists() and volume.commits == 0 and sync.filling


def test_fill_compile_cache_stores_only_once_every_replica_is_ready(tmp_path, monkeypatch, capsys):
    """fill_compile_cache's body with the fake fleet of two replicas: one worker ready (200, one of
    two replicas) is not enough; the cache is stored once both are, then the fleet is stopped."""
    app = load_modal_app()
    for key, value in fake_fleet_env(tmp_path).items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(app, "ENTRYPOINT", str(ROOT / "docker" / "entrypoint.sh"))
    cfg = app.Deployment(port=free_port(), compile_cache_volume="", startup_timeout=EVENT_DEADLINE_S)
    volume = FakeVolume()
    sync = app.CompileCacheSync(tmp_path / "volume", tmp_path / "local", "key", volume)
    (tmp_path / "local").mkdir()
    (tmp_path / "local" / "bf16-decoder.done").touch()
    filler = threading.Thread(target=app.fill_cache, args=(cfg, sync))
    state = tmp_path / "bin"
    filler.start()
    try:
        (state / "ready").touch()
        seen = ""
        deadline = time.monotonic() + EVENT_DEADLINE_S
        while seen.count("FAKE: /ready 200, 1 of 2") < 3 and time.monotonic() < deadline:  # polls saw one of two
            seen += capsys.readouterr().out
            time.sleep(0.1)
        assert seen.count("FAKE: /ready 200, 1 of 2") >= 3, seen
        assert filler.is_alive() and volume.commits == 0 and not (tmp_path / "volume" / "key").exists()
        (state / "whole").touch()
        filler.join(EVENT_DEADLINE_S)
        assert not filler.is_alive()
        assert volume.commits == 1 and (tmp_path / "volume" / "key" / app.CompileCacheSync.MARKER).is_file()
        assert json.loads((tmp_path / "volume" / "key" / app.CompileCacheSync.MARKER).read_text())["replicas"] == 2
    finally:
        (state / "die").touch()
        filler.join(EVENT_DEADLINE_S)


def test_serve_waits_for_every_replica_not_the_first_ready_worker(tmp_path):
    """A worker answering /ready 200 while one of the two replicas still loads does not end the
    start: `serve` returns, and the start-up line is logged, only once both serve."""
    container = Container(tmp_path, ready_wait_seconds="60.0")
    try:
        container.touch("ready")
        for _ in range(3):  # polls that saw one of two replicas serving
            container.wait_for("FAKE: /ready 200, 1 of 2")
            container.lines[:] = [line for line in container.lines if "FAKE: /ready 200, 1 of 2" not in line]
        assert not any("TEST: serve returned" in line or "modal_app: start-up:" in line for line in container.lines)
        container.touch("whole")
        container.wait_for("TEST: serve returned")
        container.wait_for("modal_app: start-up: every replica ready")
    finally:
        container.kill()


def test_a_container_whose_replicas_stay_unavailable_exits_for_a_replacement(tmp_path):
    """After the start the watchdog reads the fleet's readiness too: replicas that stay unavailable
    (a process alive but not serving) end the container, non-zero, with the fleet stopped first."""
    container = Container(tmp_path, ready_wait_seconds="30.0", unavailable_exit_seconds="2.0")
    try:
        container.touch("ready")
        container.touch("whole")
        container.wait_for("modal_app: start-up: every replica ready")
        (container.state / "whole").unlink()  # one replica stops serving
        container.wait_for("the fleet is not whole (1 of 2 replicas serving); this container exits if it stays so")
        container.wait_for("the fleet's replicas stayed unavailable for 2 s (1 of 2 replicas serving): this container "
                           "exits so Modal replaces it")
        assert container.process.wait(EVENT_DEADLINE_S) == 1
        assert any("FAKE: SIGTERM: drained" in line for line in container.lines), "the fleet must be stopped first"
    finally:
        container.kill()


def test_modal_stopping_the_container_drains_the_fleet_and_ends_cleanly(tmp_path):
    """Modal stops a container (scale-down, a new deploy) through the class's @modal.exit: the fleet
    gets SIGTERM and drains, and its exit is not taken for a failure (no replacement asked for)."""
    container = Container(tmp_path, ready_wait_seconds="30.0")
    try:
        container.touch("ready")
        container.touch("whole")
        container.wait_for("modal_app: start-up: every replica ready")
        container.process.send_signal(signal.SIGTERM)
        container.wait_for("the container is stopping: draining the fleet for up to 25 s")
        container.wait_for("FAKE: SIGTERM: drained")
        container.wait_for("TEST: exit methods done")
        assert container.process.wait(EVENT_DEADLINE_S) == 0
        assert not any("Modal replaces it" in line for line in container.lines), "".join(container.lines[-20:])
    finally:
        container.kill()


def test_a_private_deployment_without_keys_does_not_start(tmp_path):
    """The default deployment is private: a container whose secret gives no KOKORO_API_KEYS refuses
    to start the fleet (it would serve anyone) and says how to make the secret."""
    container = Container(tmp_path, api_keys="", ready_wait_seconds="30.0")
    try:
        container.wait_for("this deployment is private but its secret 'kokoro-api-keys' gives no KOKORO_API_KEYS")
        assert container.process.wait(EVENT_DEADLINE_S) != 0
        assert not any("FAKE:" in line or "entrypoint: starting" in line for line in container.lines)
    finally:
        container.kill()


# --- the real fleet: two replicas, one held back --------------------------------------------------

# Put on PYTHONPATH, this holds back the first worker process to build its speech service until
# the file `release` appears in KOKORO_TEST_HOLD_DIR: a replica whose start (a compile) takes long.
# The test's own hook, outside the server's code and settings.
HOLD_HOOK = r'''
import os, sys

HOLD = os.environ.get("KOKORO_TEST_HOLD_DIR")
if HOLD:
    import importlib.abc, importlib.machinery

    class HoldOneReplica(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name != "api.speech.build":
                return None
            sys.meta_path.remove(self)
            spec = importlib.machinery.PathFinder.find_spec(name, path)
            load = spec.loader.exec_module

            def exec_module(module):
                load(module)
                build = module.build_service

                async def held(*args, **kwargs):
                    import asyncio
                    try:
                        os.close(os.open(os.path.join(HOLD, "held"), os.O_CREAT | os.O_EXCL))
                    except FileExistsError:
                        return await build(*args, **kwargs)
                    print(f"TEST HOOK: holding back the replica of worker {os.getpid()}", flush=True)
                    while not os.path.exists(os.path.join(HOLD, "release")):
                        await asyncio.sleep(0.1)
                    return await build(*args, **kwargs)
                module.build_service = held
            spec.loader.exec_module = exec_module
            return spec

    sys.meta_path.insert(0, HoldOneReplica())
'''


def ready_now(port: int) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/ready", timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as refused:
        return refused.code, {}
    except (urllib.error.URLError, OSError):
        return 0, {}


def call(port: int, path: str, key: str | None = None, body: dict | None = None) -> tuple[int, bytes]:
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})}
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", headers=headers,
                                     data=None if body is None else json.dumps(body).encode())
    try:
        with urllib.request.urlopen(request, timeout=EVENT_DEADLINE_S) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as refused:
        return refused.code, refused.read()


@pytest.mark.slow
def test_a_real_fleet_of_two_replicas_is_ready_cached_and_private_only_as_a_whole(tmp_path):
    """The emulated container, deployed with no override, on the real entrypoint and a real
    `kokoro-fleet serve` of two workers with a replica each (tiny weights on the CPU), one replica
    held back: while it is, a worker answers /ready 200 (one of two replicas serving) but `serve`
    does not return and no compile cache is stored; once it serves, both happen. The fleet refuses
    a speech request and /metrics without the key, and serves both with it; on stop it drains."""
    hook, hold, volume = tmp_path / "hook", tmp_path / "hold", tmp_path / "volume"
    for directory in (hook, hold, volume, tmp_path / "local-compile"):
        directory.mkdir()
    (hook / "sitecustomize.py").write_text(HOLD_HOOK)
    (tmp_path / "local-compile" / "bf16-decoder.done").touch()  # what a GPU fleet would have compiled
    env = {"KOKORO_DEVICE": "cpu", "KOKORO_WEIGHTS": "tiny", "KOKORO_THREADS": "1", "KOKORO_TEST_HOLD_DIR": str(hold),
           "KOKORO_CACHE_DIR": os.environ.get("KOKORO_CACHE_DIR", str(Path.home() / ".cache" / "kokoro-fleet")),
           "PYTHONPATH": os.pathsep.join([str(hook), str(ROOT)])}
    container = Container(tmp_path, env=env, volume=volume, fake=False, workers="2", ready_wait_seconds="140.0",
                          drain_seconds="5.0")
    try:
        container.wait_for("TEST HOOK: holding back the replica of worker")
        deadline = time.monotonic() + 600  # two replicas loading on a busy 2-core machine
        partial = 0
        while partial < 5 and time.monotonic() < deadline:  # today's `serve` returned at the first of these
            status, body = ready_now(container.port)
            if status == 200:
                assert (body["replicas_planned"], body["replicas_ready"]) == (2, 1), body
                partial += 1
            time.sleep(0.3)
        assert partial == 5, "the replica not held back never became ready"
        assert not any("TEST: serve returned" in line for line in container.lines), "serve returned on one replica"
        assert not any(volume.iterdir()), "a compile cache was stored from one of two replicas"

        (hold / "release").touch()
        container.wait_for("TEST: serve returned")
        summary = container.wait_for("modal_app: start-up: every replica ready")
        assert "weights and engine" in summary, summary
        container.wait_for("compile cache stored in the Volume")
        marker = json.loads(next(volume.glob(f"*/{load_modal_app().CompileCacheSync.MARKER}")).read_text())
        assert marker["replicas"] == 2

        speech = {"model": "kokoro", "input": "Hello there.", "voice": "af_heart", "response_format": "wav"}
        assert call(container.port, "/v1/audio/speech", body=speech)[0] == 401
        assert call(container.port, "/metrics")[0] == 401
        assert json.loads(call(container.port, "/health")[1]) == {"status": "ok"}
        status, audio = call(container.port, "/v1/audio/speech", key="secret-key", body=speech)
        assert status == 200 and audio[:4] == b"RIFF" and len(audio) > 1000
        status, metrics = call(container.port, "/metrics", key="secret-key")
        assert status == 200 and b"kokoro_replicas_ready 2" in metrics

        container.process.send_signal(signal.SIGTERM)
        container.wait_for("TEST: exit methods done")
        assert container.process.wait(EVENT_DEADLINE_S) == 0
    finally:
        container.kill()
