"""A CPU fleet stays responsive while its replicas compute: `kokoro-fleet serve --workers 2` on the
offline weights (real processes, its own embedded redis-server), default threads (cores / workers)
and inference priority, hit by bursts of 48 simultaneous streamed requests.

The fleet admits two requests per replica; everything beyond gets 503 from the event loop, which
must answer at once (within 100 ms) even though both replicas' inference threads keep the cores busy.
The 100 ms bound is asserted whenever the fleet and this test had the machine to themselves; CPU
that other processes took during the bursts (read from /proc/stat, hypervisor steal included) is
measured, and only when it exceeds a tenth of the cores is a missed bound reported as an expected
failure with its figures instead: the fleet cannot answer in time on cores it does not get.
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
REFUSAL_BOUND_MS = 100.0
# Other processes' CPU during the bursts, as a share of all cores, above which the machine counts
# as shared and a missed refusal bound is reported rather than failed.
SHARED_MACHINE_SHARE = 0.10


@pytest.fixture(scope="module")
def cpu_fleet(tmp_path_factory):
    env = {"KOKORO_DEVICE": "cpu", "KOKORO_THREADS": "", "KOKORO_INFERENCE_NICE": "10"}
    fleet = FleetProcess(WORKERS, weights="offline", env=env, log_dir=tmp_path_factory.mktemp("cpu-fleet"),
                         name="cpu-fleet")
    fleet.start(ready_timeout=600)
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
    # Every 503 within 100 ms (issue 14): the fleet reserves a slot before planning a request's text,
    # so a refusal costs one Redis round trip on the event loop, never other requests' text frontend,
    # and the inference threads run at raised niceness, so the loop gets a core when it wakes.
    slowest = max((r["answered_s"] * 1000 for r in first + second if r["status"] == 503), default=0.0)
    print(f"slowest 503 {slowest:.1f} ms; other processes took {foreign_share:.0%} of the cores "
          f"over the {elapsed:.1f} s of both bursts")
    assert slowest <= 1000.0, f"the slowest 503 took {slowest:.0f} ms: refusals wait behind other work"
    if slowest > REFUSAL_BOUND_MS and foreign_share > SHARED_MACHINE_SHARE:
        pytest.xfail(f"the slowest 503 took {slowest:.0f} ms, over {REFUSAL_BOUND_MS:.0f} ms, while other "
                     f"processes took {foreign_share:.0%} of the {os.cpu_count()} cores")
    assert slowest <= REFUSAL_BOUND_MS, (f"the slowest 503 took {slowest:.0f} ms (bound {REFUSAL_BOUND_MS:.0f} ms) "
                                         f"with other processes taking only {foreign_share:.0%} of the cores")
