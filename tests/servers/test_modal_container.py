"""modal_app.py's container side, run here without Modal: `serve` started in a process of its own
as Modal's container would run it (the real docker/entrypoint.sh, a fake `kokoro-fleet serve`
that answers /ready and exits when told), the cold-start deadline, the watchdog, and the compile
cache between a Volume's directory and the container's disk.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from fake_kokoro_fleet import install_fake_kokoro_fleet  # tests/fake_kokoro_fleet.py

from api.ports import free_port

pytest.importorskip("modal", reason="the `modal` package (dev extra) is needed to import modal_app.py")

ROOT = Path(__file__).resolve().parents[2]
# Deadlines for events that take a second or two: generous for a loaded machine; a test fails at
# one only when the event never comes.
EVENT_DEADLINE_S = 120

# `kokoro-fleet serve` as the entrypoint starts it: answers /ready with 503 until the file `ready`
# appears, then 200; logs one start-up line the way api/app.py does; exits with status 3 once the
# file `die` appears (a fleet that fails after its start).
FAKE_SERVE = r"""
import http.server, os, sys, threading, time
port = int(sys.argv[sys.argv.index("--port") + 1])
state = sys.argv[0].rsplit("/", 1)[0]

class Ready(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        ready = os.path.exists(f"{state}/ready")
        self.send_response(200 if ready else 503)
        self.end_headers()
        self.wfile.write(b"ready" if ready else b"loading")
    def log_message(self, *args):
        pass

server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Ready)
threading.Thread(target=server.serve_forever, daemon=True).start()
print("INFO kokoro_fleet.api: start-up: imports and process set-up 1.5 s", flush=True)
print("INFO kokoro_fleet.speech: start-up: weights and engine 4.2 s, warm-up 30.0 s (replica and text readers)", flush=True)
print("INFO kokoro_fleet.engine: captured 6 stage-1 and 24 stage-2 CUDA graphs in 12.5 s, 146 MiB allocated", flush=True)
while not os.path.exists(f"{state}/die"):
    time.sleep(0.05)
sys.exit(3)
"""

# The container: modal_app imported as Modal does, `serve` called, then the process lives on (as
# Modal's input loop would) until something ends it.
CONTAINER = r"""
import sys, time
sys.path.insert(0, sys.argv[1])
import modal_app
modal_app.ENTRYPOINT = sys.argv[2]  # the checkout's, where the image has /app/docker/entrypoint.sh
started = time.monotonic()
modal_app.serve.local()
print(f"TEST: serve returned after {time.monotonic() - started:.1f} s", flush=True)
time.sleep(600)
"""


def fake_fleet_env(tmp_path: Path, **modal_fields: str) -> dict[str, str]:
    bin_dir = tmp_path / "bin"
    install_fake_kokoro_fleet(bin_dir, FAKE_SERVE)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KOKORO_", "REDIS_URL"))}
    env["PATH"] = f"{bin_dir}:{env['PATH']}"
    env.update({f"KOKORO_MODAL_{name.upper()}": value for name, value in modal_fields.items()})
    return env


class Container:
    def __init__(self, tmp_path: Path, **modal_fields: str):
        self.state = tmp_path / "bin"
        env = fake_fleet_env(tmp_path, compile_cache_volume="", port=str(free_port()), **modal_fields)
        self.process = subprocess.Popen([sys.executable, "-c", CONTAINER, str(ROOT), str(ROOT / "docker" / "entrypoint.sh")],
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
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(30)


@pytest.mark.parametrize("ready_in_time", [True, False], ids=["ready-in-time", "past-the-wait"])
def test_serve_lets_modal_route_by_the_deadline_and_the_container_ends_with_the_fleet(ready_in_time, tmp_path):
    """`serve` returns once /ready answers 200, or after ready_wait_seconds with the fleet still
    loading (its 503s answer what Modal then routes); either way the start-up split is logged once
    ready, and when the fleet exits later the container's process exits, non-zero, for Modal to
    replace it."""
    container = Container(tmp_path, ready_wait_seconds="2.0")
    try:
        if ready_in_time:
            container.touch("ready")
            container.wait_for("TEST: serve returned")
        else:
            container.wait_for("the fleet is not ready after 2 s: taking requests now, answered 503 with Retry-After")
            container.wait_for("TEST: serve returned")
            container.touch("ready")
        summary = container.wait_for("modal_app: start-up: ready")
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
    first.store()
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


def test_the_cache_key_names_the_card_torch_and_project_version(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").write_text('#!/usr/bin/env bash\necho "NVIDIA H100 80GB HBM3"\n')
    (bin_dir / "nvidia-smi").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    from importlib.metadata import version

    key = load_modal_app().compile_cache_key()
    assert key == f"NVIDIA-H100-80GB-HBM3-torch{version('torch')}-kokoro-fleet{version('kokoro-fleet')}".replace("+", "-")
