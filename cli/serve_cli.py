"""`kokoro-fleet serve`: run the fleet (or one process) under Uvicorn.

    kokoro-fleet serve [--workers N] [--limit-concurrency M] [--port 8880] [--redis-url URL]
                       [--dispatch shared|local] [--baseline] [--engine torch|sim]

Each Uvicorn worker is an HTTP front and one model replica (api.app:app_factory builds both, see
api/speech/fleet.py). Several workers share their work through Redis: without `--redis-url` (or REDIS_URL)
this command starts and owns an embedded `redis-server` (loopback, a free port, no persistence; the
workers reach it through a Unix socket, cheaper per round trip than TCP),
stopped with the fleet, also on SIGTERM/SIGINT; with one it uses that Redis (passwords and
`rediss://` TLS URLs go straight to redis-py). One worker without a Redis URL serves alone, no
queue. On CPU it starts no more replicas than the available memory holds (cgroup limits included:
worker/machine.py); on a GPU it starts the CUDA MPS daemon unless one already runs, picks the replicas from
whether the GPU is shared through it (api/gpu_sharing.py), and checks that they fit in the free GPU memory
before starting any.
`--baseline` serves Kokoro-FastAPI's architecture with our engine instead: one process, one model,
no queue, four chunks at a time.

Flags override the matching settings and are passed on through the environment, so every Uvicorn
worker process sees the same configuration.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from api.embedded_redis import EmbeddedRedis
from api.gpu_sharing import Mps, plan_replicas
from api.settings import Settings
from api.speech.replica_slots import REPLICA_SLOTS_DIR

log = logging.getLogger("kokoro_fleet.serve")

# flag -> environment variable
_FLAGS = {
    "host": "KOKORO_HOST",
    "port": "KOKORO_PORT",
    "workers": "KOKORO_WORKERS",
    "limit_concurrency": "KOKORO_LIMIT_CONCURRENCY",
    "weights": "KOKORO_WEIGHTS",
    "device": "KOKORO_DEVICE",
    "redis_url": "REDIS_URL",
    "dispatch": "KOKORO_DISPATCH",
    "engine": "KOKORO_ENGINE",
}
# Uvicorn's supervisor pings each worker and kills one that does not answer within this many
# seconds (then starts a replacement). Its default, 5 s, is too short for a replica process whose
# CPU is saturated by inference: a busy worker is not a hung one.
WORKER_HEALTHCHECK_S = 30
# Connections per worker process before Uvicorn's own 503 (see `run`).
CONNECTION_BACKSTOP = 512


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", help="address to listen on (KOKORO_HOST, default 0.0.0.0)")
    parser.add_argument("--port", type=int, help="port to listen on (KOKORO_PORT, default 8880)")
    parser.add_argument("--workers", type=int,
                        help="Uvicorn worker processes, one model replica each (KOKORO_WORKERS; 0: 8 on a GPU, "
                             "the core count on CPU)")
    parser.add_argument("--limit-concurrency", type=int,
                        help="connections one worker process holds before Uvicorn answers 503 itself "
                             "(KOKORO_LIMIT_CONCURRENCY; the backstop behind admission)")
    parser.add_argument("--redis-url",
                        help="the fleet's Redis (REDIS_URL; default: an embedded redis-server when workers > 1)")
    parser.add_argument("--dispatch", choices=["shared", "local"],
                        help="shared: any free replica runs any request's chunks (default); local: each worker "
                             "runs only what it accepted (KOKORO_DISPATCH)")
    parser.add_argument("--baseline", action="store_true",
                        help="one process, one model, no queue, four chunks at a time (Kokoro-FastAPI's "
                             "architecture), to compare against with `python -m loadtest compare`")
    parser.add_argument("--engine", choices=["torch", "sim"],
                        help="torch: the model (default); sim: a SIMULATED engine, no model, synthetic audio after "
                             "an assumed GPU time per chunk, for load tests without a GPU (KOKORO_ENGINE)")
    parser.add_argument("--weights", help="offline | official | tiny | random-full (RANDOM full-size weights: "
                                          "not speech, for load tests) | a directory (KOKORO_WEIGHTS)")
    parser.add_argument("--device", help="auto | cpu | cuda | cuda:N (KOKORO_DEVICE)")
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])


def _on_gpu(settings: Settings) -> bool:
    if settings.device == "cpu" or settings.engine == "sim":  # the simulation uses no GPU
        return False
    import torch

    return settings.device.startswith("cuda") or torch.cuda.is_available()


def resolve_workers(settings: Settings) -> int:
    """KOKORO_WORKERS, or its default: 8 replicas on a GPU (or simulating one), one per usable core
    on CPU (cgroup CPU quota included; `fit_cpu_memory` may lower that)."""
    from worker.machine import usable_cores

    if settings.baseline:
        return 1
    if settings.workers > 0:
        return settings.workers
    if settings.engine == "sim" or _on_gpu(settings):
        return 8
    return usable_cores()


def resolve_replicas(settings: Settings, workers: int) -> int:
    """KOKORO_REPLICAS (0: every worker), checked against the workers: never more, and fewer only
    where the workers share one queue (a front-only worker's chunks run on the others' replicas)."""
    replicas = settings.replicas or workers
    if replicas > workers:
        raise SystemExit(f"kokoro-fleet serve: KOKORO_REPLICAS={settings.replicas} is more than the {workers} "
                         "worker(s): each replica lives in a worker; set KOKORO_WORKERS to at least as many")
    if replicas < workers and (settings.baseline or workers == 1 or settings.dispatch != "shared"):
        raise SystemExit(f"kokoro-fleet serve: KOKORO_REPLICAS={settings.replicas} below the {workers} worker(s) "
                         "needs the shared queue (several workers, KOKORO_DISPATCH=shared, not --baseline): a "
                         "worker without a replica runs its requests on the others'")
    return replicas


# --- memory on CPU ---------------------------------------------------------------------------------

def replica_cpu_mib(settings: Settings) -> int:
    """KOKORO_REPLICA_CPU_MIB, or the peak measured for the weights in use (see its setting), plus
    the synthesis cache it may fill (KOKORO_SYNTHESIS_CACHE_MIB)."""
    if settings.replica_cpu_mib > 0:
        return settings.replica_cpu_mib + settings.synthesis_cache_mib
    return (1280 if settings.weights == "tiny" else 2560) + settings.synthesis_cache_mib


def fit_cpu_memory(workers: int, per_replica_mib: int, available_mib: int | None,
                   chosen: bool) -> tuple[int, str, bool]:
    """How many of `workers` CPU replicas to start, a line for the log, and whether it warns.

    A default count (one per core) is lowered to what the available memory holds; a count the
    user chose (`chosen`) that does not fit stops the launch with what to do, before any replica
    loads, instead of letting the OOM killer take replicas mid-request. One replica always starts,
    with a warning when even it may not fit."""
    if available_mib is None:
        return workers, "memory: available memory unknown (no /proc/meminfo); not checked", False
    fits = available_mib // per_replica_mib
    if workers <= fits:
        return workers, (f"memory: {workers} replica(s) x {per_replica_mib} MiB (KOKORO_REPLICA_CPU_MIB) fit in "
                         f"{available_mib} MiB available"), False
    if chosen and workers > max(1, fits):
        raise SystemExit(
            f"kokoro-fleet serve: {workers} replicas may take about {workers * per_replica_mib} MiB of memory "
            f"({per_replica_mib} MiB each at their peak, KOKORO_REPLICA_CPU_MIB) but {available_mib} MiB are "
            f"available (cgroup limits included). Start at most {max(1, fits)} (--workers {max(1, fits)}), give "
            f"the machine or container more memory, or, if your texts are short, set KOKORO_REPLICA_CPU_MIB to "
            f"what one replica reaches under your load.")
    if fits >= 1:
        return fits, (f"memory: {fits} worker(s), not one per core ({workers}): each replica may take "
                      f"{per_replica_mib} MiB at its peak (KOKORO_REPLICA_CPU_MIB) and {available_mib} MiB are "
                      f"available (cgroup limits included)"), True
    return 1, (f"memory: only {available_mib} MiB available (cgroup limits included) and one replica may take "
               f"{per_replica_mib} MiB at its peak (KOKORO_REPLICA_CPU_MIB): long requests may run out of memory; "
               f"a smaller KOKORO_CHUNK_PHONEMES lowers the peak"), True


def gpu_index(settings: Settings) -> int:
    return int(settings.device.split(":", 1)[1]) if settings.device.startswith("cuda:") else 0


def free_gpu_mib(index: int) -> int | None:
    """Free memory of GPU `index` as nvidia-smi reports it (None when it cannot be asked). Asked
    through nvidia-smi rather than torch, so this process opens no CUDA context before MPS starts."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        out = subprocess.run([smi, "--query-gpu=memory.free", "--format=csv,noheader,nounits", "-i", str(index)],
                             capture_output=True, text=True, timeout=20, check=True).stdout
        return int(out.strip().splitlines()[0])
    except (subprocess.SubprocessError, ValueError, IndexError, OSError):
        return None


def check_gpu_memory(workers: int, per_replica_mib: int, free_mib: int | None, index: int = 0) -> str:
    """A line for the log when `workers` replicas fit; SystemExit with what to do when they do not."""
    if free_mib is None:
        return f"GPU {index}: free memory unknown (no nvidia-smi); not checked"
    need = workers * per_replica_mib
    if need > free_mib:
        fits = free_mib // per_replica_mib if per_replica_mib > 0 else 0
        raise SystemExit(
            f"kokoro-fleet serve: {workers} replicas need about {need} MiB of GPU memory ({per_replica_mib} MiB "
            f"each, KOKORO_REPLICA_GPU_MIB) but GPU {index} has {free_mib} MiB free. Start at most {fits} "
            f"(--workers {max(1, fits)}), free the GPU, or use a larger one.")
    return f"GPU {index}: {workers} replicas x {per_replica_mib} MiB fit in {free_mib} MiB free"


def share_gpu(settings: Settings, workers: int, mps: bool) -> int:
    """The replicas for how the GPU is shared (api/gpu_sharing.py), logged and handed to the workers."""
    plan = plan_replicas(workers, settings.replicas, settings.batch_max, mps,
                         shared_queue=settings.dispatch == "shared" and not settings.baseline, environ=os.environ)
    log.info(plan.reason)
    os.environ.update(plan.environment())
    return plan.replicas


# --- the command ------------------------------------------------------------------------------------

def run(args: argparse.Namespace) -> int:
    import uvicorn

    for name, env in _FLAGS.items():
        value = getattr(args, name, None)
        if value is not None:
            os.environ[env] = str(value)
    if getattr(args, "baseline", False):
        os.environ["KOKORO_BASELINE"] = "true"
    logging.basicConfig(level=getattr(logging, args.log_level.upper()),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    settings = Settings.from_env()
    if settings.lexicon:  # a typo in the deployment's pronunciations stops the start, not every request
        from worker.text import LexiconError, load_lexicon

        try:
            lexicon = load_lexicon(settings.lexicon)
        except LexiconError as e:
            raise SystemExit(f"kokoro-fleet serve: {e}") from None
        log.info("pronunciations from %s: %d entries", settings.lexicon, sum(map(len, lexicon.entries.values())))
    if settings.voices_dir:  # a voice file that does not read stops the start, not the requests naming it
        from worker.voices import VoiceFileError, check_voice_dir

        try:
            check_voice_dir(settings.voices_dir)  # logs the voices it found
        except VoiceFileError as e:
            raise SystemExit(f"kokoro-fleet serve: {e}") from None
    if settings.engine == "sim":
        if settings.baseline:
            raise SystemExit("kokoro-fleet serve: KOKORO_ENGINE=sim does not simulate the baseline; "
                             "serve the baseline with KOKORO_ENGINE=torch")
        from api.speech.build import sim_cost
        from worker.sim_engine import describe

        log.warning(describe(sim_cost(settings)))
    elif settings.weights == "random-full":
        from worker.weights.random_full import NOTICE

        log.warning(NOTICE)
    workers = resolve_workers(settings)
    on_gpu = _on_gpu(settings)
    if settings.mps == "on" and not on_gpu and settings.engine == "torch":
        raise SystemExit("kokoro-fleet serve: KOKORO_MPS=on but no GPU is visible (KOKORO_DEVICE=cpu, or neither "
                         "torch nor nvidia-smi -L finds one)")
    if not on_gpu and settings.engine == "torch":
        from worker.machine import available_memory_bytes

        log.info("no GPU in use (KOKORO_DEVICE=%s, torch %s): the replicas run on the CPU", settings.device,
                 "finds none" if settings.device == "auto" else "not asked")

        available = available_memory_bytes()
        workers, line, warn = fit_cpu_memory(workers, replica_cpu_mib(settings),
                                             None if available is None else available >> 20,
                                             chosen=settings.workers > 0 and not settings.baseline)
        (log.warning if warn else log.info)(line)
    if settings.baseline and (settings.workers > 1 or getattr(args, "workers", None)):
        log.warning("--baseline runs one process: ignoring --workers/KOKORO_WORKERS=%d", settings.workers)
    os.environ["KOKORO_WORKERS"] = str(workers)
    replicas = resolve_replicas(settings, workers)
    if replicas < workers:
        log.info("%d of the %d workers hold a model replica; the others are HTTP fronts (KOKORO_REPLICAS)",
                 replicas, workers)
    mps = Mps(settings.mps)
    redis: EmbeddedRedis | None = None
    metrics_dir = None
    if workers > 1 and not settings.metrics_dir:  # one /metrics for all the workers (api/metrics.py)
        metrics_dir = tempfile.mkdtemp(prefix="kokoro-metrics-")
        os.environ["KOKORO_METRICS_DIR"] = metrics_dir
    if metrics_dir or settings.metrics_dir:
        from api.metrics import share_with_workers

        share_with_workers(metrics_dir or settings.metrics_dir)
    if settings.metrics_dir:  # a run starts from zero: a previous run's workers held no slot of this one's
        shutil.rmtree(Path(settings.metrics_dir) / REPLICA_SLOTS_DIR, ignore_errors=True)
    try:
        if on_gpu:
            if workers > 1:
                log.info(mps.ensure())
            replicas = share_gpu(settings, workers, mps.active)
            index = gpu_index(settings)
            log.info(check_gpu_memory(replicas, settings.replica_gpu_mib, free_gpu_mib(index), index))
        if settings.baseline:
            os.environ.pop("REDIS_URL", None)
            log.info("baseline: one process, one model, no queue, chunks four at a time")
        elif settings.queue_url:
            from api.speech.redis_link import check_at_start

            # A wrong password or certificate stops here, naming the URL without its secret.
            if warning := check_at_start(settings.queue_url):
                log.warning(warning)
            log.info("fleet of %d workers on the Redis at REDIS_URL (%s dispatch)", workers, settings.dispatch)
        elif workers > 1:
            redis = EmbeddedRedis().start()
            os.environ["REDIS_URL"] = redis.worker_url
            log.info("fleet of %d workers on an embedded redis-server at %s (%s dispatch; the workers connect "
                     "through %s)", workers, redis.url, settings.dispatch, redis.worker_url)
        else:
            log.info("one worker, no queue")
        # Uvicorn counts open connections, idle keep-alive ones included, against this backstop,
        # and answers beyond it with a bare 503 (no Retry-After) and a closed connection: a client
        # pool holding 100 idle connections to one worker must not meet it, only a flood should.
        limit = settings.limit_concurrency or max(CONNECTION_BACKSTOP, 2 * settings.max_requests + 16)
        uvicorn.run(
            "api.app:app_factory", factory=True,
            host=settings.host, port=settings.port, workers=workers,
            log_level=args.log_level,
            access_log=False,  # api.app writes one structured line per request instead
            # The per-process backstop behind admission: connections beyond it get 503 from Uvicorn.
            limit_concurrency=limit,
            timeout_graceful_shutdown=max(1, round(settings.drain_seconds)),
            timeout_worker_healthcheck=WORKER_HEALTHCHECK_S,
        )
    finally:
        if redis is not None:
            redis.stop()
        mps.stop()
        if metrics_dir is not None:
            shutil.rmtree(metrics_dir, ignore_errors=True)
    return 0
