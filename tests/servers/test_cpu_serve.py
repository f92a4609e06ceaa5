"""A CPU fleet stays responsive while its replicas compute: `kokoro-fleet serve --workers 2` on the
offline weights (real processes, its own embedded redis-server), default threads (cores / workers)
and inference priority, hit by bursts of 48 simultaneous streamed requests.

The fleet admits two requests per replica; everything beyond gets 503 from the event loop, which
must answer at once even though both replicas' inference threads keep the cores busy. "At once" is
measured against the machine's speed in the same run: the slowest 503 must take a small share of
what an admitted request's synthesis took beside it, so the bound scales with a slower or busier
machine, while a refusal that waited behind other requests' text frontend or behind inference
would take a large share of it. The absolute figures (goal: every 503 within 100 ms on a quiet
machine) are printed with the CPU other processes took, for the README's table.
"""

from __future__ import annotations

import asyncio
import json
import os
import resource
import time
from pathlib import Path

import pytest

from loadtest.dispatch import FleetProcess
from loadtest.texts import load_texts

pytestmark = pytest.mark.slow

BURST = 48
WORKERS = 2
SHORT = load_texts("short")
# The slowest 503, as a share of the median admitted request's time to its last byte: a few percent
# when refusals cost one Redis round trip; a refusal queued behind the 48 requests' text frontend or
# a chunk's inference costs a large part of a request's own time.
REFUSAL_SHARE_OF_SYNTHESIS = 0.25


@pytest.fixture(scope="module")
def cpu_fleet(tmp_path_factory):
    env = {"KOKORO_DEVICE": "cpu", "KOKORO_THREADS": "", "KOKORO_INFERENCE_NICE": "10"}
    fleet = FleetProcess(WORKERS, weights="offline", env=env, log_dir=tmp_path_factory.mktemp("cpu-fleet"),
                         name="cpu-fleet")
    # A worker compiling a kernel at a chunk size it meets first answers slowly meanwhile (503s of
    # up to a second seen on an empty compile cache): paid here, not in the bursts.
    fleet.start(ready_timeout=600, warm_up=SHORT[:4])
    print(f"\ncpu-fleet warmed up in {fleet.warmed_up_s:.1f} s")
    yield fleet
    fleet.stop()


async def _one(port: int, text: str) -> dict:
    """One streamed request over a bare asyncio connection (a full HTTP client's own Python work,
    48 times over in one process, would be a large part of what is measured): the time until the
    status line arrives, and the whole response read to its end."""
    body = json.dumps({"model": "kokoro", "voice": "af_heart", "input": text, "response_format": "pcm",
                       "stream": True}).encode()
    head = (f"POST /v1/audio/speech HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode()
    start = time.perf_counter()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(head + body)
    status_line = await reader.readline()
    answered = time.perf_counter() - start
    rest = await reader.read()  # headers and the (chunked) body, until the server closes
    writer.close()
    headers, _, payload = rest.partition(b"\r\n\r\n")
    return {"status": int(status_line.split()[1]), "answered_s": answered, "bytes": len(payload),
            "retry_after": b"retry-after:" in headers.lower(), "done_s": time.perf_counter() - start}


async def _bursts(port: int, second_after_s: float) -> tuple[list[dict], list[dict]]:
    """A burst of BURST requests, and a second one `second_after_s` later, while the first burst's
    admitted requests are being synthesized."""
    texts = [SHORT[i % len(SHORT)] for i in range(BURST)]
    first = [asyncio.create_task(_one(port, t)) for t in texts]
    await asyncio.sleep(second_after_s)
    second = await asyncio.gather(*(_one(port, t) for t in texts))
    return list(await asyncio.gather(*first)), list(second)


def _machine_cpu_seconds() -> float:
    """CPU seconds every process on this machine has used since boot, plus the time the hypervisor
    ran other guests on our cores (steal): /proc/stat's first line."""
    user, nice, system, _idle, _iowait, irq, softirq, steal = map(int, Path("/proc/stat").read_text().split()[1:9])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def _own_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _worker_threads_at(pid: int, niceness: int) -> int:
    count = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/stat", encoding="ascii") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        count += int(fields[16]) == niceness
    return count


def test_a_burst_gets_fast_503s_while_the_replicas_compute(cpu_fleet):
    machine, fleet, own, start = _machine_cpu_seconds(), cpu_fleet.cpu_seconds(), _own_cpu_seconds(), time.monotonic()
    first, second = asyncio.run(_bursts(cpu_fleet.port, second_after_s=1.0))
    elapsed = time.monotonic() - start
    foreign = (_machine_cpu_seconds() - machine) - (cpu_fleet.cpu_seconds() - fleet) - (_own_cpu_seconds() - own)
    foreign_share = max(0.0, foreign) / (elapsed * (os.cpu_count() or 1))
    for name, burst in (("first", first), ("second", second)):
        refused = sorted(r["answered_s"] * 1000 for r in burst if r["status"] == 503)
        served = [r for r in burst if r["status"] == 200]
        print(f"{name} burst of {BURST}: {len(served)} served (done in "
              f"{max((r['done_s'] for r in served), default=0):.1f} s), {len(refused)} refused: 503 after "
              f"p50 {refused[len(refused) // 2] if refused else 0:.1f} ms, max {refused[-1] if refused else 0:.1f} ms")
        assert {r["status"] for r in burst} <= {200, 503}, burst
        assert all(r["retry_after"] for r in burst if r["status"] == 503)
        assert all(r["bytes"] > 24000 for r in served), "an admitted request came back without its audio"
    assert any(r["status"] == 200 for r in first) and any(r["status"] == 503 for r in first)
    # each worker's inference thread runs at raised niceness; its event loop (main thread) does not
    for pid in cpu_fleet.worker_pids():
        base = os.getpriority(os.PRIO_PROCESS, pid)
        assert _worker_threads_at(pid, base + 10) >= 1, f"worker {pid} has no inference thread at niceness +10"
    # Refusals answered at once (issue 14): the fleet reserves a slot before planning a request's text,
    # so a refusal costs one Redis round trip on the event loop, never other requests' text frontend,
    # and the inference threads run at raised niceness, so the loop gets a core when it wakes.
    slowest = max((r["answered_s"] for r in first + second if r["status"] == 503), default=0.0)
    served_s = sorted(r["done_s"] for r in first + second if r["status"] == 200)
    synthesis_s = served_s[len(served_s) // 2]
    print(f"slowest 503 {slowest * 1000:.1f} ms ({slowest / synthesis_s:.1%} of an admitted request's "
          f"{synthesis_s:.2f} s); other processes took {foreign_share:.0%} of the cores over the "
          f"{elapsed:.1f} s of both bursts")
    assert slowest <= REFUSAL_SHARE_OF_SYNTHESIS * synthesis_s, (
        f"the slowest 503 took {slowest * 1000:.0f} ms, {slowest / synthesis_s:.0%} of the {synthesis_s:.2f} s "
        f"an admitted request took: refusals wait behind other work")
