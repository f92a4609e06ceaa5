"""The one typed settings object, read from the environment.

Every knob of kokoro-fleet is a field here with its environment variable, default and meaning;
`kokoro-fleet settings` prints them as the Markdown table that docs/configuration.md carries, and a test
keeps the two in step. Add a field here rather than reading `os.environ` anywhere else.
"""

from __future__ import annotations

import dataclasses
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Literal, get_args, get_origin, get_type_hints

if TYPE_CHECKING:
    from worker.weights import WeightsSource


def setting(env: str, default: Any, doc: str, *, choices: tuple[str, ...] = (),
            also: tuple[str, Callable[[str], bool]] | None = None, minimum: float | None = None) -> Any:
    """A settings field: the environment variable that sets it, its default and what it means.
    An enumerated setting is typed `Literal[...]`, or takes `choices` plus `also`: (how the error
    message names the other accepted values, the test that accepts them). A number may have a
    `minimum`: a value below it is refused as the settings are read."""
    return field(default=default, metadata={"env": env, "doc": doc, "choices": choices, "also": also,
                                            "minimum": minimum})


class SettingsError(ValueError):
    """An environment variable holds a value of the wrong type or outside its choices; the message
    names the variable and what it accepts."""


def _is_cuda_index(value: str) -> bool:
    return re.fullmatch(r"cuda:\d+", value) is not None


# The one-letter language codes of Kokoro v1.0's voices (worker.text.g2p.SUPPORTED_CODES; a test
# keeps them equal), spelled out here so reading the settings imports no text frontend.
LANGUAGE_CODES = ("a", "b", "e", "f", "h", "i", "j", "p", "z")


def _is_language_list(value: str) -> bool:
    codes = [c.strip() for c in value.split(",")]
    return all(c in LANGUAGE_CODES for c in codes)


def _is_directory(value: str) -> bool:
    return Path(value).expanduser().is_dir()


@dataclass(frozen=True)
class Settings:
    # --- weights and model ---
    weights: str = setting(
        "KOKORO_WEIGHTS", "offline",
        "Weight source: `offline` (the embedded bundle, converted once and cached), `official` "
        "(hexgrad/Kokoro-82M files in KOKORO_WEIGHTS_DIR, or fetched from the hub by image builds), "
        "`tiny` (random weights of a small config, for tests), `random-full` (seeded RANDOM weights of the full "
        "Kokoro-82M config and random voices under every official name: real speed and memory, audio that is NOT "
        "speech, for load tests on machines the real weights cannot reach; the log and /health say so), or a "
        "directory holding the official files.",
        choices=("offline", "official", "tiny", "random-full"),
        also=("an existing directory holding the official files", _is_directory))
    weights_dir: str = setting(
        "KOKORO_WEIGHTS_DIR", "",
        "Directory with the official `config.json`, `kokoro-v1_0.pth` and `voices/*.pt` (used by `official`).")
    cache_dir: str = setting(
        "KOKORO_CACHE_DIR", str(Path.home() / ".cache" / "kokoro-fleet"),
        "Where the converted offline bundle and downloaded files are cached.")
    device: str = setting("KOKORO_DEVICE", "auto", "`auto` (CUDA when present), `cuda`, `cuda:N` or `cpu`.",
                          choices=("auto", "cuda", "cpu"), also=("cuda:N", _is_cuda_index))
    dtype: Literal["auto", "fp32", "bf16", "fp16", "int8"] = setting(
        "KOKORO_DTYPE", "auto",
        "Inference precision: `auto` (the fastest mode that passes the parity bound on this device: bf16 on "
        "CUDA and on CPUs with AVX512-BF16 or AMX, int8 on other CPUs with AVX2, else fp32), `fp32`, `bf16`, "
        "`fp16` or `int8` (CPU only: the generator's convolutions in int8, the rest float32).")
    cuda_graphs: bool = setting("KOKORO_CUDA_GRAPHS", True, "Capture CUDA graphs per shape bucket at start-up (CUDA only).")
    compile: bool = setting(
        "KOKORO_COMPILE", True,
        "CUDA: run stage 2's decoder through torch.compile, captured in the CUDA graphs, batches included "
        "(compiled once per host into KOKORO_COMPILE_CACHE_DIR; `false`: eager kernels).")
    compile_cache_dir: str = setting(
        "KOKORO_COMPILE_CACHE_DIR", "",
        "Directory of the compiled passes' cache, shared by every replica on the host: the first compiles, the "
        "others load (empty: KOKORO_CACHE_DIR/compile/<torch version>-<device name>).")
    stage2_arithmetic: Literal["exact", "exact-nondeterministic", "fast"] = setting(
        "KOKORO_STAGE2_ARITHMETIC", "exact",
        "CUDA: stage 2's arithmetic, `exact` (float32 without TF32, deterministic cuDNN: bit-identical audio run "
        "to run, but cuDNN refuses the dilated convolutions and a slower fallback runs them), "
        "`exact-nondeterministic` (no TF32, cuDNN's non-deterministic algorithms allowed: the dilated convolutions "
        "keep cuDNN) or `fast` (TF32 and cudnn.benchmark; compiles graphs of its own); stage 1, which decides the "
        "durations, is always exact. `exact` until a GPU measures the others within the parity bounds.")
    batch_graph_frames: int = setting(
        "KOKORO_BATCH_GRAPH_FRAMES", 16384,
        "CUDA: memory bound of the batch graphs, captured per (batch bucket, frame bucket) up to KOKORO_BATCH_MAX's "
        "bucket where batch x frames (25 ms each) is at most this; larger batches run compiled without graphs (0: no batch graphs).",
        minimum=0)
    seed: int = setting("KOKORO_SEED", 0, "Seed of the model's noise sources, so the same input gives the same audio.")
    threads: int = setting(
        "KOKORO_THREADS", 0,
        "torch intra-op threads per replica (0: the usable cores divided by the workers, at least 1; on a "
        "GPU these serve the host-side work, weights and per-request CPU tensors).")
    inference_nice: int = setting(
        "KOKORO_INFERENCE_NICE", 10,
        "Niceness added to each replica's inference thread and its OpenMP pool (Linux), so the event loop "
        "answers admissions and 503s at once while the replicas compute (0: same priority).")
    synthesis_cache_mib: int = setting(
        "KOKORO_SYNTHESIS_CACHE_MIB", 64,
        "Memory each replica keeps its most recently used chunks' audio in (16-bit, about 23 minutes in 64 MiB): "
        "a chunk it made before (same phonemes, voice, speed) comes back at once, bit for bit, without "
        "waiting for the replica: a phone bot's repeated prompts. Host memory, which `serve` counts on top of "
        "KOKORO_REPLICA_CPU_MIB (0: no cache).", minimum=0)

    engine: Literal["torch", "sim"] = setting(
        "KOKORO_ENGINE", "torch",
        "`torch`: the real model. `sim`: a SIMULATED engine for load tests on machines without a GPU "
        "(worker/sim_engine.py): no model or weights, each chunk waits (asyncio.sleep, no CPU) "
        "KOKORO_SIM_CHUNK_MS + KOKORO_SIM_PHONEME_MS x phonemes and returns synthetic audio of the real "
        "model's length; never chosen automatically, and a simulated server says so in its log, /health, "
        "/ready, /metrics, `kokoro-fleet status` and an `X-Kokoro-Engine: sim` header.")
    sim_chunk_ms: float = setting(
        "KOKORO_SIM_CHUNK_MS", 34.0,
        "Simulated engine: fixed cost of one chunk (one batched pass), ms. The default is a real replica's cost "
        "on a GPU shared by eight (worker/sim_engine.py; measured: loadtest/README.md), so 8 simulated replicas "
        "produce what 8 real ones did. KOKORO_SIM_CHUNK_MS=6.3 KOKORO_SIM_PHONEME_MS=0.174 simulates one "
        "replica alone on an idle GPU.")
    sim_phoneme_ms: float = setting(
        "KOKORO_SIM_PHONEME_MS", 0.93,
        "Simulated engine: cost per phoneme of a chunk, ms (a batch costs the fixed cost once plus this for "
        "every item padded to the longest). Measured like KOKORO_SIM_CHUNK_MS.")

    # --- HTTP API ---
    host: str = setting("KOKORO_HOST", "0.0.0.0", "Address the server listens on.")
    port: int = setting("KOKORO_PORT", 8880, "Port the server listens on.")
    workers: int = setting("KOKORO_WORKERS", 0, "Uvicorn workers, one model replica each (0: 8 on a GPU or with KOKORO_ENGINE=sim; on CPU one per "
        "usable core, a container's CPU quota included, and no more than the available memory holds: "
        "KOKORO_REPLICA_CPU_MIB).")
    replicas: int = setting(
        "KOKORO_REPLICAS", 0,
        "Model replicas among the Uvicorn workers (0: one in every worker). Fewer than KOKORO_WORKERS: every "
        "worker stays an HTTP front (text, admission, encoding) and only this many also hold a replica, each "
        "running batches (KOKORO_BATCH_MAX) for the whole fleet through the shared queue; `serve` refuses more "
        "than the workers, and fewer without a shared queue (one worker, `--baseline` or `local` dispatch).",
        minimum=0)
    limit_concurrency: int = setting("KOKORO_LIMIT_CONCURRENCY", 0, "Uvicorn's per-process connection backstop; it counts idle keep-alive connections too and answers beyond it with a bare 503 (no Retry-After) that closes the connection (0: 512, or twice KOKORO_MAX_REQUESTS plus 16 if more).")
    api_keys: str = setting(
        "KOKORO_API_KEYS", "",
        "Comma-separated API keys; when set, requests need `Authorization: Bearer KEY`. Name a key `NAME:KEY` "
        "(`support-bot:sk-123,reader:sk-456`) and the access log and /metrics (`kokoro_key_requests_total`, "
        "`kokoro_key_audio_seconds_total`) count usage by that name; an unnamed key is `key-` and 6 hex digits "
        "of its SHA-256. The key itself is never logged.")
    key_max_share: float = setting(
        "KOKORO_KEY_MAX_SHARE", 1.0,
        "With KOKORO_API_KEYS: the largest share of the request bounds (KOKORO_QUEUE_MAX_REQUESTS for the fleet, "
        "KOKORO_MAX_REQUESTS in each process) that one key's requests may hold at once, at least one request, "
        "and of the fleet's queued audio (KOKORO_QUEUE_MAX_AUDIO_SECONDS, with that share of the replicas' output "
        "credited to its later chunks); beyond either, that key gets 429 `rate_limit_exceeded` with Retry-After "
        "while other keys are still admitted, so one product's burst (a reader converting a book) cannot take the "
        "room another's callers need (0.5: any one key at most half; 1: no per-key bound).", minimum=0.01)
    cors_origins: str = setting(
        "KOKORO_CORS_ORIGINS", "*",
        "Comma-separated origins whose web pages may call the API from a browser (CORS), such as "
        "`https://app.example.com`; `*`: any origin, as Kokoro-FastAPI allows; empty: no CORS headers. "
        "Pages may read `Retry-After`, `X-Request-Id` and `X-Kokoro-Engine`.")
    playground: bool = setting(
        "KOKORO_PLAYGROUND", True,
        "Serve the playground page at `/` (type, pick or mix voices, hear it stream, see the fleet); "
        "false: `/` answers 404.")
    max_input_chars: int = setting("KOKORO_MAX_INPUT_CHARS", 4096, "Longest `input` accepted by /v1/audio/speech.")
    max_body_bytes: int = setting("KOKORO_MAX_BODY_BYTES", 1 << 20, "Largest request body accepted (413 above).")
    max_requests: int = setting(
        "KOKORO_MAX_REQUESTS", 32,
        "Speech requests admitted at once per server process (streaming or waiting for the replica); "
        "beyond it a request gets 503 with Retry-After.")
    max_request_audio_seconds: float = setting(
        "KOKORO_MAX_REQUEST_AUDIO_SECONDS", 0.0,
        "Longest audio one request may ask for, estimated from its phonemes before any synthesis; longer "
        "requests get a 400 saying to split the text (0: no limit). Modal sets it so a request ends within "
        "its 150 s cap even when the fleet paces streams at playback speed.")
    drain_seconds: float = setting(
        "KOKORO_DRAIN_SECONDS", 30.0,
        "Grace period after SIGTERM: in-flight requests finish, new ones get 503; then the server exits.")
    send_timeout_seconds: float = setting(
        "KOKORO_SEND_TIMEOUT_SECONDS", 60.0,
        "Longest a streamed response or a live session waits for its client to take the bytes already sent "
        "(its connection's buffers full: a client that stopped reading, or a phone that left the network without closing); "
        "beyond it the connection is closed and the request's place in the server freed, instead of held "
        "for as long as TCP takes to give up (15 minutes and more). Above the longest chunk's audio (38 s), "
        "so a client that reads only as fast as it plays is never cut (0: no limit).", minimum=0)
    download_dir: str = setting(
        "KOKORO_DOWNLOAD_DIR", "",
        "Where audio saved for `return_download_link` requests waits for `GET /v1/download/NAME` (Kokoro-FastAPI's "
        "download links); every worker of the machine must see the same directory (empty: `kokoro-fleet-downloads` "
        "in the system's temporary directory).")
    download_max_age_seconds: float = setting(
        "KOKORO_DOWNLOAD_MAX_AGE_SECONDS", 3600.0, "How long a download file is kept.", minimum=1)
    download_max_mib: int = setting(
        "KOKORO_DOWNLOAD_MAX_MIB", 1024,
        "Size bound of the download directory: when a new download starts, the oldest files go until the rest fit.",
        minimum=1)
    download_shared_max_mib: int = setting(
        "KOKORO_DOWNLOAD_SHARED_MAX_MIB", 16,
        "Where the fleet's Redis is another machine's (REDIS_URL not on loopback: a fleet of several machines, "
        "such as Modal's containers), download files up to this size are kept in it too, for "
        "KOKORO_DOWNLOAD_MAX_AGE_SECONDS, so any machine serves the link; larger ones only the machine that "
        "made them (0: none shared).", minimum=0)

    # --- text ---
    first_chunk_phonemes: int = setting(
        "KOKORO_FIRST_CHUNK_PHONEMES", 60,
        "Target size of a request's first chunk (about 4 s of speech), so its first audio arrives fast: "
        "it ends at a clause, or at a word boundary when no clause ends in reach.")
    chunk_phonemes: int = setting(
        "KOKORO_CHUNK_PHONEMES", 400,
        "Largest target size of later chunks (never above 510): each chunk after the first aims at twice the "
        "one before up to this, so a stream stays ahead of its listener. A replica runs a chunk to its end, so "
        "this also bounds how long another request's first chunk waits for a busy replica: on a slow CPU, 200 "
        "brings that first audio sooner for a little of the long stream's throughput (`python -m "
        "loadtest.chunk_wait`; figures in loadtest/README.md); on a GPU a chunk takes tens of milliseconds either way.")
    preload_languages: str = setting(
        "KOKORO_PRELOAD_LANGUAGES", "a,b",
        "Languages whose text readers every replica loads at start-up, comma-separated codes (`a,b,z,j`) or `all`; "
        "any other language loads on its first request, which then waits for it once (Mandarin about 0.6 s, "
        "Japanese 0.05 s on a 2-core CPU). Each costs every replica its memory (Mandarin about 116 MB, Japanese "
        "23 MB), beyond KOKORO_REPLICA_CPU_MIB.",
        choices=("all",), also=("comma-separated language codes among " + ", ".join(LANGUAGE_CODES), _is_language_list))

    lexicon: str = setting(
        "KOKORO_LEXICON", "",
        "A JSON file of the deployment's own pronunciations, words or phrases -> phonemes in Kokoro's alphabet "
        "(`{\"Kokoro\": \"kˈOkəɹO\"}`; sections per language code optional), applied to every request as if "
        "written `[Kokoro](/kˈOkəɹO/)`; `serve` refuses a malformed one. Edits take effect within a second, "
        "without a restart; a malformed edit is logged, shown in /health, and the entries before it stay "
        "(worker/text/lexicon.py).")
    voices_dir: str = setting(
        "KOKORO_VOICES_DIR", "",
        "A directory of the deployment's own voices, served beside the weights' (a file's voice wins on a shared "
        "name): `af_brand.pt` (the official [510, 1, 256] layout, as `/v1/audio/voices/combine` gives), "
        "`.bin` (kokoro-js's raw float32) or `.npy`, named like Kokoro's voices (language letter, gender `f`/`m`, "
        "`_`, a name); `serve` refuses a file that does not read. A file added or changed is served within a "
        "second (at once by a request naming it), without a restart; one that breaks is logged, shown in "
        "/health, and its voice stays as it was (worker/voices.py).")

    voice_fit_jobs: int = setting(
        "KOKORO_VOICE_FIT_JOBS", 1,
        "Voices fitted from recordings at once on this machine, or on all the machines that share its "
        "KOKORO_VOICES_DIR (`POST /v1/audio/voices`, needs KOKORO_VOICES_DIR); "
        "beyond it 503 with Retry-After. Each fit runs on one thread at the lowest priority, beside the replicas "
        "(0: fitting off; api/voice_fit_jobs.py).", minimum=0)
    voice_fit_minutes: float = setting(
        "KOKORO_VOICE_FIT_MINUTES", 10.0,
        "The longest a voice fit runs before it keeps the best voice found so far (docs/voices.md).", minimum=0.1)
    voice_fit_candidates: int = setting(
        "KOKORO_VOICE_FIT_CANDIDATES", 100,
        "Candidate voices a fit hears (each says two short sentences); the same recording, budget and seed give "
        "the same voice. More fits closer and takes longer (docs/voices.md has the times).", minimum=1)
    voice_manager_keys: str = setting(
        "KOKORO_VOICE_MANAGER_KEYS", "",
        "With KOKORO_API_KEYS: the names of the keys (comma-separated) that may fit voices and delete them "
        "(`POST /v1/audio/voices`, `DELETE /v1/audio/voices/...`); other keys get 403. Without keys anyone may.")

    metrics_dir: str = setting(
        "KOKORO_METRICS_DIR", "",
        "Where the workers of one server keep their figures (prometheus_client's multiprocess files), so that "
        "/metrics, whichever worker a scrape reaches, adds up the whole server's counters and histograms instead "
        "of showing one worker's (api/metrics.py); one directory per server, which `serve` clears as it starts and "
        "hands to the workers as PROMETHEUS_MULTIPROC_DIR (empty: `serve` makes one in the system's temporary "
        "directory for each run of several workers and removes it at exit).")

    # --- fleet and queue ---
    queue_url: str = setting(
        "REDIS_URL", "",
        "External Redis URL (`redis://`, `rediss://` for TLS, `redis://user:password@host:6379/0` for an ACL user); "
        "empty: the fleet starts and owns an embedded Redis server. `serve` refuses to start when that Redis "
        "refuses the password or the TLS certificate (the error names the URL without its password); one that "
        "is only unreachable is waited for, each worker serving its own requests meanwhile.")
    redis_tls_ca_file: str = setting(
        "KOKORO_REDIS_TLS_CA_FILE", "",
        "For a `rediss://` REDIS_URL: the certificate authority (PEM) that the Redis server's certificate must "
        "chain to, and whose certificate must name the URL's host (empty: the system's trusted authorities).")
    redis_tls_cert_file: str = setting(
        "KOKORO_REDIS_TLS_CERT_FILE", "",
        "For a `rediss://` REDIS_URL whose server asks clients for a certificate (`tls-auth-clients yes`): this "
        "fleet's certificate (PEM), with KOKORO_REDIS_TLS_KEY_FILE (empty: none offered).")
    redis_tls_key_file: str = setting(
        "KOKORO_REDIS_TLS_KEY_FILE", "", "The private key (PEM) of KOKORO_REDIS_TLS_CERT_FILE.")
    queue_max_requests: int = setting(
        "KOKORO_QUEUE_MAX_REQUESTS", 0,
        "Requests admitted at once across the whole fleet (shared queue); beyond it 503 with Retry-After "
        "(0: two per replica, a batch per replica (KOKORO_BATCH_MAX) or what KOKORO_FIRST_AUDIO_TARGET_MS "
        "allows at the measured service rate, whichever is most).")
    queue_max_audio_seconds: float = setting(
        "KOKORO_QUEUE_MAX_AUDIO_SECONDS", 0.0,
        "Estimated audio seconds of chunk jobs waiting for a replica in the shared queue beyond what the "
        "replicas produce before those jobs are due; beyond it 503 (0: 20 per replica). Chunks due now count "
        "in full; a long text's later chunks, due only as its listener reaches them, count only past the "
        "replicas' measured output by then (queue/PROTOCOL.md), so one long request does not refuse the "
        "short ones behind it.")
    first_audio_target_ms: float = setting(
        "KOKORO_FIRST_AUDIO_TARGET_MS", 250.0,
        "The first audio the fleet aims to give every admitted request within, ms: with 0 for "
        "KOKORO_QUEUE_MAX_REQUESTS, the fleet admits as many requests at once as its replicas make first "
        "chunks (KOKORO_FIRST_CHUNK_PHONEMES) in this time at their measured service rate, when that is more "
        "than two per replica or a full batch for each (0: the replica count alone).", minimum=0)
    lease_seconds: float = setting(
        "KOKORO_LEASE_SECONDS", 10.0,
        "A replica's lease on a chunk job, renewed by heartbeats; a replica silent this long loses the job, "
        "which is re-queued once and then fails its request.")
    dispatch: Literal["shared", "local"] = setting(
        "KOKORO_DISPATCH", "shared",
        "`shared`: every replica takes the fleet's earliest-deadline chunk job, wherever its request "
        "arrived; `local`: each worker runs only the requests it accepted (blind assignment, kept for "
        "comparison by `python -m loadtest.dispatch`).")
    own_job_slack_ms: int = setting(
        "KOKORO_OWN_JOB_SLACK_MS", 20,
        "A free replica takes a job of a request its own worker accepted instead of the fleet's earliest "
        "job when that job's deadline is at most this much later; such results stay in the process instead "
        "of crossing Redis (0: strict earliest-deadline order, own results still skip Redis).")
    batch_max: int = setting(
        "KOKORO_BATCH_MAX", 1,
        "Most chunk jobs a free replica leases at once and runs as one batch: the earliest-deadline job plus "
        "queued jobs due within a second of it (or already overdue) whose estimated audio is within 2x of the "
        "batch's others; it never waits for a batch to fill (1: one job at a time).", minimum=1)
    chunk_timeout_seconds: float = setting(
        "KOKORO_CHUNK_TIMEOUT_SECONDS", 120.0,
        "Longest a request waits for any one chunk from the shared queue before it fails with an error "
        "(0: no limit).")
    baseline: bool = setting(
        "KOKORO_BASELINE", False,
        "Serve as the comparison baseline: one process, one model, no queue, chunks of all requests run "
        "four at a time on it (Kokoro-FastAPI's architecture); `kokoro-fleet serve --baseline` sets it.")
    replica_cpu_mib: int = setting(
        "KOKORO_REPLICA_CPU_MIB", 0,
        "Memory one replica may reach on CPU (model, compiled kernels, a 510-phoneme chunk's activations, "
        "freed memory malloc keeps); `serve` starts no more default workers than the available memory "
        "holds (cgroup limits included) and refuses a --workers beyond it (0: the measured peak rounded up, "
        "2560 for full-size weights, 1280 for `tiny`; the measurements: loadtest/README.md).", minimum=0)
    replica_gpu_mib: int = setting(
        "KOKORO_REPLICA_GPU_MIB", 6144,
        "GPU memory one replica needs (CUDA context, weights, CUDA graphs, activations); `serve` refuses to start "
        "more replicas than the free GPU memory holds. The default is a bf16 replica's measured need with "
        "captured graphs, rounded up (loadtest/README.md).")

    # --- deployment ---
    mps: Literal["auto", "on", "off"] = setting(
        "KOKORO_MPS", "auto",
        "CUDA MPS daemon, which `serve` starts so the replicas' kernels share the GPU: `auto` (start it when a GPU "
        "and `nvidia-cuda-mps-control` are present), `on` (fail when it cannot start) or `off`. Under it a replica "
        "in every worker, each batching; without it the GPU time-slices, and `serve` runs fewer replicas, each "
        "batching, in place of one per worker (api/gpu_sharing.py; unless "
        "KOKORO_REPLICAS or KOKORO_BATCH_MAX is set); `kokoro-fleet gpu-check` shows what a machine allows.")

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None, only: tuple[str, ...] | None = None) -> "Settings":
        """Every setting from the environment; `only` names the fields to read (the others keep their
        defaults), for a tool that must not fail on a setting it never uses."""
        environ = os.environ if environ is None else environ
        hints = get_type_hints(cls)
        values: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            if only is not None and f.name not in only:
                continue
            raw = environ.get(f.metadata["env"])
            if raw is None or raw == "":
                continue
            values[f.name] = _parse(hints[f.name], raw, f.metadata["env"], f.metadata)
        return cls(**values)

    def preload_language_codes(self) -> tuple[str, ...]:
        """KOKORO_PRELOAD_LANGUAGES as codes, in order, once each."""
        if self.preload_languages.strip() == "all":
            return LANGUAGE_CODES
        return tuple(dict.fromkeys(c.strip() for c in self.preload_languages.split(",") if c.strip()))

    def replace(self, **changes: Any) -> "Settings":
        return dataclasses.replace(self, **changes)


def _parse(kind: Any, raw: str, env: str, metadata: Any = None) -> Any:
    choices: tuple[str, ...] = get_args(kind) if get_origin(kind) is Literal else (metadata or {}).get("choices", ())
    if choices:
        value = raw.strip()
        also = (metadata or {}).get("also")
        if value in choices or (also is not None and also[1](value)):
            return value
        expected = ", ".join(choices) + (f" or {also[0]}" if also else "")
        raise SettingsError(f"{env}={raw!r}: expected {'one of ' if len(choices) > 1 else ''}{expected}")
    if kind is bool:
        lowered = raw.strip().lower()
        if lowered in ("1", "true", "yes", "on"):
            return True
        if lowered in ("0", "false", "no", "off"):
            return False
        raise SettingsError(f"{env}={raw!r}: expected true or false")
    if kind in (int, float):
        what = "an integer" if kind is int else "a number"
        minimum = (metadata or {}).get("minimum")
        if minimum is not None:
            what += f" of at least {minimum:g}"
        try:
            value = kind(raw)
        except ValueError:
            raise SettingsError(f"{env}={raw!r}: expected {what}") from None
        if minimum is not None and value < minimum:
            raise SettingsError(f"{env}={raw!r}: expected {what}")
        return value
    return raw


def weights_source(settings: Settings) -> "WeightsSource":
    """The weights the settings name, as the weight loader takes them (the server's builder and
    `kokoro-fleet weights`; worker.weights imports no torch, so that command stays instant)."""
    from worker.weights import WeightsSource

    return WeightsSource(settings.weights, settings.cache_dir, directory=settings.weights_dir, seed=settings.seed)


def settings_table() -> str:
    """The Markdown table of every setting, as docs/configuration.md shows it."""
    rows = ["| Variable | Default | Meaning |", "|---|---|---|"]
    for f in dataclasses.fields(Settings):
        default = f.default
        if f.name == "cache_dir":
            default = "~/.cache/kokoro-fleet"
        shown = "(empty)" if default == "" else str(default).lower() if isinstance(default, bool) else str(default)
        rows.append(f"| `{f.metadata['env']}` | `{shown}` | {f.metadata['doc']} |")
    return "\n".join(rows)


_current: Settings | None = None


def get_settings() -> Settings:
    """The process's settings, read from the environment once."""
    global _current
    if _current is None:
        _current = Settings.from_env()
    return _current
