"""The CPU image for real: docker/build-local.sh builds docker/Dockerfile's `cpu` target (WEIGHTS=offline)
with a Docker engine it starts when none answers and local stand-in base images (no image registry
is reachable here), then these tests run it with `docker run` and `docker-compose`.

Select them with `-m docker`, leave them out with `-m "not docker"`. The build is cached between
runs on one machine (Docker's layer cache, the Debian base under ~/.cache/kokoro-fleet-docker); the
figures (build time, image size, `docker run` to /ready, first request) are printed at the end.
"""

from __future__ import annotations

import io
import os
import re
import secrets
import shutil
import subprocess
import time
from pathlib import Path

import httpx
import pytest
from inflight_stream import InFlightStream  # tests/inflight_stream.py
from api.ports import free_port

ROOT = Path(__file__).resolve().parents[2]
BUILD_LOCAL = ROOT / "docker" / "build-local.sh"
COMPOSE = ROOT / "docker" / "compose.yaml"
IMAGE = "kokoro-fleet:cpu"
REDIS_STAND_IN = "local/redis:bookworm"  # made by docker/build-local.sh for compose's redis:7-alpine
# A cold build on a busy 2-core machine; the script bounds each of its own steps as well.
BUILD_TIMEOUT_S = 3600
READY_TIMEOUT_S = 600

pytestmark = [pytest.mark.docker, pytest.mark.slow]

FIGURES: dict[str, str] = {}


def docker(*args: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess:
    result = subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout)
    if check and result.returncode != 0:
        raise AssertionError(f"docker {' '.join(args)} exited {result.returncode}:\n{result.stdout}{result.stderr}")
    return result


def engine_answers() -> bool:
    if shutil.which("docker") is None:
        return False
    try:
        return docker("info", timeout=20, check=False).returncode == 0
    except subprocess.TimeoutExpired:
        return False


def tail(text: str, lines: int = 60) -> str:
    return "\n".join(text.splitlines()[-lines:])


@pytest.fixture(scope="module")
def docker_image(request, tmp_path_factory) -> str:
    """The CPU image, built (or found up to date in the cache) by docker/build-local.sh. Module
    scope: an engine started here stops when these tests end, not idling through the rest."""
    engine_was_up = engine_answers()
    log = tmp_path_factory.mktemp("docker") / "build.log"
    started = time.monotonic()
    with log.open("w") as out:
        try:
            result = subprocess.run([str(BUILD_LOCAL), "image", IMAGE], stdout=out, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, timeout=BUILD_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            pytest.fail(f"docker/build-local.sh took over {BUILD_TIMEOUT_S} s:\n{tail(log.read_text())}")
    if not engine_was_up:
        # The engine started here stops with these tests; its images and layer cache stay on disk.
        request.addfinalizer(lambda: subprocess.run([str(BUILD_LOCAL), "stop-engine"], timeout=120, check=False))
    if result.returncode != 0:
        pytest.fail(f"docker/build-local.sh failed ({result.returncode}), log {log}:\n{tail(log.read_text())}")
    FIGURES["docker/build-local.sh (engine, bases, image)"] = f"{time.monotonic() - started:.0f} s"
    size = int(docker("image", "inspect", "-f", "{{.Size}}", IMAGE).stdout)
    FIGURES["image size"] = f"{size / 1e6:.0f} MB"
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    if reporter is not None and capture is not None:
        def print_figures() -> None:
            with capture.global_and_fixture_disabled():  # shown without -s too
                reporter.write_line("docker figures: " + "; ".join(f"{k}: {v}" for k, v in FIGURES.items()))
        request.addfinalizer(print_figures)
    return IMAGE


class Container:
    """A `docker run -d --network host` of the image, serving on a free port of this host."""

    def __init__(self, image: str, docker_args: tuple[str, ...] = (), **env: str):
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.name = f"kokoro-fleet-test-{secrets.token_hex(4)}"
        env = {"KOKORO_HOST": "127.0.0.1", "KOKORO_PORT": str(self.port), "KOKORO_WORKERS": "1", **env}
        args = ["run", "-d", "--name", self.name, "--network", "host", *docker_args]
        for key, value in env.items():
            args += ["-e", f"{key}={value}"]
        self.started = time.monotonic()
        docker(*args, image, timeout=60)

    def logs(self) -> str:
        result = docker("logs", "--tail", "200", self.name, check=False, timeout=30)
        return result.stdout + result.stderr

    def state(self, field: str) -> str:
        return docker("inspect", "-f", "{{" + field + "}}", self.name, timeout=30).stdout.strip()

    def wait_ready(self) -> float:
        """Seconds from `docker run` to /ready answering 200."""
        while True:
            assert self.state(".State.Running") == "true", f"the container stopped:\n{self.logs()}"
            try:
                ready = httpx.get(f"{self.base}/ready", timeout=2)
                if ready.status_code == 200:
                    return time.monotonic() - self.started
                # a load that failed stays failed: say so now, not after READY_TIMEOUT_S
                assert "failed to load" not in ready.text, f"{ready.text}\n{self.logs()}"
            except httpx.TransportError:
                pass
            assert time.monotonic() - self.started < READY_TIMEOUT_S, f"not ready after {READY_TIMEOUT_S} s:\n{self.logs()}"
            time.sleep(1)

    def remove(self) -> None:
        docker("rm", "-f", self.name, check=False, timeout=120)


@pytest.fixture(scope="module")
def container(docker_image):
    """One serving container for the tests below; the drain test stops it last."""
    served = Container(docker_image, KOKORO_DRAIN_SECONDS="60")
    try:
        FIGURES["docker run to /ready"] = f"{served.wait_ready():.1f} s"
        yield served
    finally:
        served.remove()


def decoded_seconds(encoded: bytes) -> float:
    import av

    with av.open(io.BytesIO(encoded)) as media:
        samples = sum(frame.samples for frame in media.decode(audio=0))
        return samples / media.streams.audio[0].rate


def test_the_official_openai_client_gets_mp3_and_pcm(container):
    import numpy as np
    import openai

    client = openai.OpenAI(base_url=container.base + "/v1", api_key="not-needed", timeout=120)
    started = time.monotonic()
    first_audio = None
    mp3 = bytearray()
    with client.audio.speech.with_streaming_response.create(
            model="kokoro", voice="af_heart", input="Hello from the container.", response_format="mp3") as response:
        for chunk in response.iter_bytes():
            if first_audio is None and chunk:
                first_audio = time.monotonic() - started
            mp3 += chunk
    FIGURES["first request (mp3): first audio / whole"] = f"{first_audio:.2f} s / {time.monotonic() - started:.2f} s"
    assert mp3[:3] == b"ID3" or (mp3[0] == 0xFF and mp3[1] & 0xE0 == 0xE0), mp3[:16]
    assert decoded_seconds(bytes(mp3)) > 0.8

    started = time.monotonic()
    pcm = client.audio.speech.create(model="kokoro", voice="alloy", input="And now in raw samples.",
                                     response_format="pcm").content
    FIGURES["second request (pcm, whole)"] = f"{time.monotonic() - started:.2f} s"
    assert len(pcm) % 2 == 0 and len(pcm) > 24000 * 2 * 0.8, len(pcm)
    samples = np.frombuffer(pcm, dtype="<i2").astype(np.float32)
    assert np.sqrt(np.mean(samples**2)) > 100, "the PCM is silence"


def test_mandarin_and_japanese_voices_speak_in_the_image(container):
    """Their readers' dictionaries (jieba's, unidic-lite's) are in the image, and jieba can cache its
    parsed dictionary as the non-root user."""
    import numpy as np

    for voice, text in (("zf_xiaobei", "你好，世界。"), ("jf_alpha", "こんにちは、世界。")):
        resp = httpx.post(container.base + "/v1/audio/speech", timeout=120, json={
            "model": "kokoro", "voice": voice, "input": text, "response_format": "pcm", "stream": False})
        assert resp.status_code == 200, resp.text
        samples = np.frombuffer(resp.content, dtype="<i2").astype(np.float32)
        assert len(samples) > 24000 * 0.8 and np.sqrt(np.mean(samples**2)) > 100, (voice, len(samples))
    cached = docker("exec", container.name, "sh", "-c", 'ls "$KOKORO_CACHE_DIR"').stdout.split()
    assert "jieba.cache" in cached, cached


def test_the_healthcheck_reports_healthy(container):
    deadline = time.monotonic() + 120  # the first check runs one interval (15 s) after the start
    while (status := container.state(".State.Health.Status")) != "healthy":
        assert status in ("starting", "healthy"), f"health {status}:\n{container.state('json .State.Health')}"
        assert time.monotonic() < deadline, f"still {status}:\n{container.state('json .State.Health')}"
        time.sleep(2)


def test_every_process_runs_as_the_non_root_user(container):
    uids = docker("exec", container.name, "sh", "-c", "cat /proc/[0-9]*/status | awk '/^Uid:/ { print $2 }'").stdout.split()
    assert len(uids) >= 3, uids  # the entrypoint, the server, its worker (and this shell)
    assert set(uids) == {"10001"}, uids
    assert docker("exec", container.name, "id", "-un").stdout.strip() == "kokoro"


def test_the_image_is_small_and_holds_no_build_tools_caches_or_tests(docker_image):
    report = docker("run", "--rm", "--network", "none", "--entrypoint", "bash", docker_image, "-c", r"""
        for tool in gcc cc g++ c++ make node npm git; do command -v "$tool"; done
        ls -d /root/.cache /home/kokoro/.cache /root/.npm /app/tests /app/.git 2>/dev/null
        find /app /opt /root /home /tmp \( -name '*.whl' -o -name '*.tgz' -o -path '/app/*/test_*.py' \) -print 2>/dev/null
        find /var/lib/apt/lists /var/cache/apt/archives -type f -name '*_*' 2>/dev/null
        true""", timeout=120).stdout.split()
    assert report == [], f"the final stage carries build leftovers: {report}"
    size_mb = int(docker("image", "inspect", "-f", "{{.Size}}", docker_image).stdout) / 1e6
    print(f"image {docker_image}: {size_mb:.0f} MB")
    # Measured 2140 MB on the stand-in base: torch's CPU build 750 MB, the other dependencies 570 MB,
    # the prepared weights 340 MB, the base with espeak-ng and redis 470 MB; 2192 MB since the
    # Mandarin and Japanese dictionaries (unidic-lite 249 MB, jieba 42 MB). A second copy of the
    # venv or of torch would exceed this bound.
    assert size_mb < 2600, f"{size_mb:.0f} MB"


def test_a_container_without_weights_fails_fast_and_says_how_to_provide_them(docker_image):
    started = time.monotonic()
    # An empty tmpfs over /opt/kokoro-fleet hides the weights baked into the image.
    result = docker("run", "--rm", "--network", "none", "--tmpfs", "/opt/kokoro-fleet", docker_image,
                    check=False, timeout=120)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "the model weights are not ready" in result.stderr
    assert "WEIGHTS=official|offline" in result.stderr and "kokoro-fleet weights --prepare" in result.stderr
    assert "starting: kokoro-fleet serve" not in result.stderr
    assert time.monotonic() - started < 60


def test_the_fleet_sizes_itself_to_the_containers_cpu_quota_and_memory_limit(docker_image):
    """`--cpus` and `--memory` are cgroup limits the container's /proc does not show: the host's
    cores and memory are what os.cpu_count() and MemAvailable say inside."""
    # a worker count the memory limit cannot hold: refused before any replica loads, saying what fits
    refused = docker("run", "--rm", "--network", "none", "--memory", "3g", "-e", "KOKORO_WORKERS=2", docker_image,
                     check=False, timeout=120)
    assert refused.returncode != 0, refused.stdout + refused.stderr
    assert "Start at most 1 (--workers 1)" in refused.stderr, refused.stderr
    # the default count: one worker per core of the quota (not one per host core), in the memory limit
    served = Container(docker_image, docker_args=("--cpus", "1", "--memory", "4g"), KOKORO_WORKERS="0")
    try:
        served.wait_ready()
        logs = served.logs()
        assert "one worker, no queue" in logs, logs
        assert "1 inference thread(s) (KOKORO_THREADS=0, 1 worker(s) on 1 usable core(s))" in logs, logs
        available = re.search(r"fit in (\d+) MiB available", logs)
        assert available and int(available[1]) <= 4096, logs
        assert httpx.post(f"{served.base}/v1/audio/speech", json={"model": "kokoro", "voice": "af_heart",
                          "input": "Sized to its container.", "response_format": "pcm"}, timeout=120).status_code == 200
    finally:
        served.remove()


def test_docker_stop_drains_an_in_flight_stream_and_exits_0(container):
    """Runs last on the shared container: `docker stop` sends SIGTERM, the entrypoint forwards it."""
    stream = InFlightStream(container.base, timeout=300)
    assert stream.wait_for_audio(180), "no audio within 180 s"
    signalled_at = len(stream.received)
    stop = docker("stop", "-t", "90", container.name, timeout=150, check=False)
    stream.join(60)
    logs = container.logs()
    assert stop.returncode == 0, stop.stderr
    assert stream.outcome.get("status") == 200 and stream.outcome.get("complete"), (stream.outcome, logs)
    assert len(stream.received) > signalled_at, "nothing arrived after SIGTERM: the stream was not drained"
    assert stream.audio_seconds > 6, f"only {stream.audio_seconds:.1f} s of audio for three long sentences"
    assert container.state(".State.ExitCode") == "0", logs
    assert "SIGTERM: draining" in logs and "server stopped after draining (status 0)" in logs, logs


# --- compose ----------------------------------------------------------------------------------

def test_compose_serves_through_the_fleet_and_recovers_when_redis_restarts(docker_image, tmp_path):
    """docker/compose.yaml's cpu profile with Debian's docker-compose (v1): it has no top-level
    `name`, so that key becomes `-p`, and the Redis service runs the local stand-in image."""
    import yaml

    if shutil.which("docker-compose") is None:
        pytest.fail("docker-compose is missing: docker/build-local.sh installs it (Debian package docker-compose)")
    spec = yaml.safe_load(COMPOSE.read_text())
    project = f"{spec.pop('name')}-test-{secrets.token_hex(3)}"
    spec["services"]["redis"]["image"] = REDIS_STAND_IN
    compose_file = tmp_path / "compose.yaml"
    compose_file.write_text(yaml.safe_dump(spec))
    port = free_port()
    # The file's own defaults, but for the port, one replica and a short drain.
    env = {k: v for k, v in os.environ.items() if not k.startswith("KOKORO_") and k != "REDIS_URL"}
    env.update(KOKORO_PORT=str(port), KOKORO_WORKERS="1", KOKORO_DRAIN_SECONDS="5")
    base = f"http://127.0.0.1:{port}"

    def compose(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
        return subprocess.run(["docker-compose", "-f", str(compose_file), "--project-directory", str(COMPOSE.parent),
                               "-p", project, "--profile", "cpu", *args],
                              capture_output=True, text=True, env=env, timeout=timeout, stdin=subprocess.DEVNULL)

    def logs() -> str:
        result = compose("logs", "--tail", "40", "--no-color", timeout=60)
        return tail(result.stdout + result.stderr, 80)

    def speech_status() -> int:
        try:
            return httpx.post(f"{base}/v1/audio/speech", timeout=120, json={
                "model": "kokoro", "voice": "af_heart", "input": "Served through compose.",
                "response_format": "wav", "stream": False}).status_code
        except httpx.TransportError:
            return 0

    try:
        up = compose("up", "-d", "--no-build")
        assert up.returncode == 0, up.stdout + up.stderr
        started = time.monotonic()
        while True:
            try:
                if httpx.get(f"{base}/ready", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() - started < READY_TIMEOUT_S, f"not ready:\n{logs()}"
            time.sleep(1)
        FIGURES["compose up to /ready"] = f"{time.monotonic() - started:.1f} s"
        assert speech_status() == 200, logs()

        restart = compose("restart", "-t", "10", "redis", timeout=120)
        assert restart.returncode == 0, restart.stdout + restart.stderr
        deadline = time.monotonic() + 120
        while (status := speech_status()) != 200:
            assert time.monotonic() < deadline, f"no 200 within 120 s of Redis restarting (last {status}):\n{logs()}"
            time.sleep(2)
        assert httpx.get(f"{base}/ready", timeout=10).status_code == 200
    finally:
        compose("down", "-v", "-t", "30", timeout=180)


# --- the GPU image: built by `make image-gpu` (docker/build-local.sh gpu), not in CI ------------------

GPU_IMAGE = "kokoro-fleet:gpu"


@pytest.fixture(scope="module")
def gpu_image() -> str:
    """The GPU image where this machine has built it; these tests never build it (2.7 GB of CUDA
    wheels: CI keeps the CPU image)."""
    if not engine_answers() or docker("image", "inspect", GPU_IMAGE, check=False, timeout=60).returncode != 0:
        pytest.skip(f"{GPU_IMAGE} is not built here: `make image-gpu` builds it")
    return GPU_IMAGE


def test_the_gpu_image_has_the_cpu_images_python_and_torchs_cuda_13_build(gpu_image):
    python = re.search(r"^ARG PYTHON_IMAGE=python:(\d+\.\d+)-", (ROOT / "docker" / "Dockerfile").read_text(), re.M)[1]
    found = docker("run", "--rm", "--network", "none", "--entrypoint", "python", gpu_image, "-c",
                   "import sys, torch; print('%d.%d' % sys.version_info[:2], torch.__version__, torch.version.cuda)",
                   timeout=120).stdout.split()
    assert found[0] == python, found
    assert found[1].endswith("+cu130") and found[2] == "13.0", found
    check = docker("run", "--rm", "--network", "none", "--entrypoint", "kokoro-fleet", gpu_image, "gpu-check",
                   check=False, timeout=120)
    assert check.returncode == 1 and "GPU: none" in check.stdout, check.stdout + check.stderr


def test_the_gpu_image_builds_tritons_kernel_launcher(gpu_image):
    """torch.compile's first kernel on a GPU has Triton build its launcher, a C extension, with the
    C compiler against Python.h: Triton's own build function compiles and loads a trivial one in
    the image (docker/triton_build_check.py, fed on stdin; no GPU needed), as the non-root user."""
    check = subprocess.run(["docker", "run", "--rm", "-i", "--network", "none", "--entrypoint", "python", gpu_image, "-"],
                           input=(ROOT / "docker" / "triton_build_check.py").read_text(), capture_output=True,
                           text=True, timeout=300)
    print(check.stdout.strip())
    assert check.returncode == 0 and "triton build check: ok" in check.stdout, check.stdout + check.stderr


def test_the_gpu_image_starts_on_a_cpu_says_it_has_no_gpu_and_serves(gpu_image):
    served = Container(gpu_image, docker_args=("--shm-size", "1g"))
    try:
        to_ready = served.wait_ready()
        logs = served.logs()
        assert "no GPU in use (KOKORO_DEVICE=auto, torch finds none): the replicas run on the CPU" in logs, logs
        started = time.monotonic()
        speech = httpx.post(f"{served.base}/v1/audio/speech", timeout=180, json={
            "model": "kokoro", "voice": "af_heart", "input": "The GPU image, serving on a CPU.",
            "response_format": "wav", "stream": False})
        assert speech.status_code == 200 and speech.content[:4] == b"RIFF", speech.text[:300]
        assert decoded_seconds(speech.content) > 1.0
        size = int(docker("image", "inspect", "-f", "{{.Size}}", gpu_image).stdout) / 1e6
        print(f"{gpu_image}: {size:.0f} MB; docker run to /ready {to_ready:.1f} s; "
              f"first request (wav) {time.monotonic() - started:.2f} s")
    finally:
        served.remove()
