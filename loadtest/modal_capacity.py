"""The Modal container at capacity: how fast the fleet's 503 reaches a client while Modal's input
limit for the container is not yet reached (issue 55).

    python -m loadtest.modal_capacity [--max-requests 8] [--probes 2000] [--workers 2]

modal_app.py's `Server.serve`, run here as Modal's container runs it (the real entrypoint, a real
`kokoro-fleet serve` on the simulated engine with a slow simulated chunk, so admitted requests stay
in flight): `max_requests` streams fill the fleet's admission bound, then `probes` more requests
are sent, never more at once than Modal's per-container limit leaves room for (`modal_max_inputs`
less the streams held), each timed from sending to its status line. Prints the probes' statuses,
whether each 503 carried Retry-After, and the latency p50/p95/p99/max, with the CPU model and load;
then the same probes again from `hey` where it is installed (`phases_hey`): a Go client on threads of
its own, where the Python client's event loop, sharing the cores with the server, adds a tail of its
own to every figure.
No Modal account: the container is emulated; Modal's own routing in front of it is not measured.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import httpx

from api.ports import free_port

REPO = Path(__file__).resolve().parents[1]
KEY = "bench-key"
# modal_app imported and served as a container does; the file argv[3] written once `serve` returned
# (not a line on stdout, which the fleet's own log lines, passed on by another thread, can split).
CONTAINER = r"""
import signal, sys, time
sys.path.insert(0, sys.argv[1])
import modal_app
modal_app.ENTRYPOINT = sys.argv[2]
from modal._partial_function import _PartialFunctionFlags, _find_partial_methods_for_user_cls
from modal._utils.async_utils import synchronizer
server = modal_app.Server()

def stop(signum, frame):  # Modal stopping the container: its @modal.exit methods drain the fleet
    instance = synchronizer._translate_in(server)._cached_user_cls_instance()
    for method in _find_partial_methods_for_user_cls(type(instance), _PartialFunctionFlags.EXIT).values():
        method._get_raw_f()(instance)
    sys.exit(0)

signal.signal(signal.SIGTERM, stop)
server.serve.local()
open(sys.argv[3], "w").write("serving")
while True:
    time.sleep(1)
"""
# A few chunks at KOKORO_SIM_CHUNK_MS each: in flight for the whole measurement.
LONG_TEXT = " ".join(["The fleet keeps this request in flight while its slow simulated chunks are made."] * 3)


def machine() -> str:
    model = next((line.split(":", 1)[1].strip() for line in subprocess.run(
        ["lscpu"], capture_output=True, text=True).stdout.splitlines() if line.startswith("Model name")), "unknown CPU")
    return f"{model}, load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}"


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * len(ordered)) - 1))]


def latency_ms(seconds: list[float]) -> dict:
    return {name: round(1000 * percentile(seconds, q), 2) for name, q in (("p50", 50), ("p95", 95), ("p99", 99), ("max", 100))}


async def measure(port: int, held: int, probes: int, room: int) -> dict:
    base = f"http://127.0.0.1:{port}"
    headers = {"Authorization": f"Bearer {KEY}"}
    limits = httpx.Limits(max_connections=held + room + 4)
    async with httpx.AsyncClient(base_url=base, headers=headers, timeout=120, limits=limits) as client:
        streams = []
        for _ in range(held):  # fill the admission bound with streams nobody reads
            request = client.build_request("POST", "/v1/audio/speech", json={
                "model": "kokoro", "voice": "af_heart", "input": LONG_TEXT, "response_format": "pcm", "stream": True})
            streams.append(await client.send(request, stream=True))
        held_statuses = [s.status_code for s in streams]
        phases = {}
        # Each at the most Modal's limit leaves in flight, then one at a time; /health beside each, the
        # same client and machine: the floor of any round trip here, to read the 503's figures against.
        for name, concurrency in ((f"{room} at once", room), ("one at a time", 1)):
            phases[name] = {"speech (503 at capacity)": await timed(client, "POST", probes, concurrency),
                            "/health (reference)": await timed(client, "GET", probes, concurrency)}
        # The same again from hey (Go, on its own threads): a Python client's event loop, with 8 in
        # flight on the cores it shares with the server, adds its own tail to every figure above.
        hey_phases = {}
        if shutil.which("hey"):
            for name, concurrency in ((f"{room} at once", room), ("one at a time", 1)):
                hey_phases[name] = {"speech (503 at capacity)": await timed_hey(base, "POST", probes, concurrency),
                                    "/health (reference)": await timed_hey(base, "GET", probes, concurrency)}
        for stream in streams:
            await stream.aclose()
    return {"held_statuses": held_statuses, "phases": phases, "phases_hey": hey_phases or None}


async def timed_hey(base: str, method: str, count: int, concurrency: int) -> dict:
    """`hey -o csv`'s per-request response time and status (hey shows no headers: the httpx phases
    check Retry-After)."""
    args = ["hey", "-n", str(count), "-c", str(concurrency), "-o", "csv", "-H", f"Authorization: Bearer {KEY}"]
    if method == "POST":
        args += ["-m", "POST", "-T", "application/json", "-d", json.dumps({
            "model": "kokoro", "voice": "af_heart", "input": "One more request at capacity.", "response_format": "pcm"}),
            f"{base}/v1/audio/speech"]
    else:
        args += [f"{base}/health"]
    proc = await asyncio.create_subprocess_exec(*args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError(f"hey exited with {proc.returncode}: {err.decode()[-500:]}")
    rows = [line.split(",") for line in out.decode().splitlines()[1:] if line.strip()]
    seconds = [float(r[0]) for r in rows]
    statuses = [r[6] for r in rows]
    return {"statuses": {s: statuses.count(s) for s in sorted(set(statuses))},
            "ms": latency_ms(seconds)}


async def timed(client: httpx.AsyncClient, method: str, count: int, concurrency: int) -> dict:
    gate = asyncio.Semaphore(concurrency)
    rows: list[tuple[int, float, bool]] = []

    async def one() -> None:
        async with gate:
            started = time.perf_counter()
            if method == "POST":
                response = await client.post("/v1/audio/speech", json={
                    "model": "kokoro", "voice": "af_heart", "input": "One more request at capacity.",
                    "response_format": "pcm"})
            else:
                response = await client.get("/health")
            rows.append((response.status_code, time.perf_counter() - started, "retry-after" in response.headers))

    await asyncio.gather(*(one() for _ in range(count)))
    seconds = [s for _, s, _ in rows]
    return {"statuses": {str(s): sum(1 for r in rows if r[0] == s) for s in sorted({r[0] for r in rows})},
            "503_with_retry_after": sum(1 for status, _, retry in rows if status == 503 and retry),
            "ms": latency_ms(seconds)}


def wait_whole(port: int, deadline: float) -> None:
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/ready", timeout=10) as response:
                body = json.loads(response.read())
                if body["replicas_ready"] >= body["replicas_planned"] > 0:
                    return
        except (OSError, ValueError, KeyError):
            pass
        time.sleep(1)
    raise SystemExit("the fleet was not whole within 600 s")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--max-requests", type=int, default=8, help="the fleet's admission bound (max_requests)")
    # p99 of 2000 is the 20th slowest: one hiccup of a shared machine is not the figure
    parser.add_argument("--probes", type=int, default=2000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--out", help="write the figures as JSON here too")
    args = parser.parse_args()
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KOKORO_", "REDIS_URL"))}
    env.update({"KOKORO_MODAL_PORT": str(port), "KOKORO_MODAL_WORKERS": str(args.workers),
                "KOKORO_MODAL_MAX_REQUESTS": str(args.max_requests), "KOKORO_MODAL_COMPILE_CACHE_VOLUME": "",
                "KOKORO_MODAL_DRAIN_SECONDS": "2", "KOKORO_API_KEYS": f"bench:{KEY}", "KOKORO_ENGINE": "sim",
                "KOKORO_DEVICE": "cpu", "KOKORO_WEIGHTS": "tiny", "KOKORO_SIM_CHUNK_MS": "20000",
                # the request count, not the queued audio, is the bound that fills
                "KOKORO_QUEUE_MAX_AUDIO_SECONDS": "3600",
                "PATH": f"{Path(sys.executable).parent}:{env['PATH']}",
                "PYTHONPATH": os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])})
    sys.path.insert(0, str(REPO))
    import modal_app

    cfg = modal_app.Deployment(max_requests=args.max_requests)
    room = cfg.modal_inputs - args.max_requests
    serving = Path(tempfile.mkdtemp(prefix="kokoro-modal-capacity-")) / "serving"
    container = subprocess.Popen([sys.executable, "-c", CONTAINER, str(REPO), str(REPO / "docker" / "entrypoint.sh"),
                                  str(serving)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    # The container's and the fleet's log, read from the start (or they block on a full pipe); the
    # last lines say why when the container does not start.
    log_tail: collections.deque[str] = collections.deque(maxlen=40)
    threading.Thread(target=lambda: [log_tail.append(line) for line in container.stdout], daemon=True).start()
    try:
        deadline = time.monotonic() + 600
        while not serving.exists():
            if container.poll() is not None:
                raise SystemExit(f"the emulated container exited with {container.returncode}:\n{''.join(log_tail)}")
            if time.monotonic() > deadline:
                raise SystemExit(f"the emulated container did not start within 600 s:\n{''.join(log_tail)}")
            time.sleep(0.2)
        wait_whole(port, deadline)  # `serve` may have returned at ready_wait_seconds on a slow machine
        figures = asyncio.run(measure(port, args.max_requests, args.probes, room))
    finally:
        container.send_signal(signal.SIGTERM)
        try:
            container.wait(60)
        except subprocess.TimeoutExpired:
            container.kill()
        shutil.rmtree(serving.parent, ignore_errors=True)
    figures.update({"max_requests": args.max_requests, "modal_max_inputs": cfg.modal_inputs,
                    "probes_in_flight_at_most": room, "workers": args.workers, "machine": machine()})
    print(json.dumps(figures, indent=2))
    if args.out:
        Path(args.out).write_text(json.dumps(figures, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
