"""A crowd refused by a full fleet comes back about as fast as places free (issue 39, item 4).

`kokoro-fleet serve --workers 2 --engine sim` with a bound of 4 requests and 24 closed-loop
clients that each wait what their 503 asks (retry-after-ms) before trying again. Told only when
the first place frees (about 0.1 s), the 20 clients refused at any moment would come back about
200 times a second while the fleet serves a few tens of requests a second; spread over the times
places free, they are refused about as often as requests are served."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from loadtest.dispatch import FleetProcess

pytestmark = pytest.mark.slow

CLIENTS = 24
RUN_S = 6.0
BODY = {"model": "kokoro", "voice": "af_heart", "input": "A short reply from a crowded fleet.",
        "response_format": "pcm"}


async def closed_loop(url: str) -> tuple[int, int, list[float]]:
    """(served, refused, each 503's retry-after-ms in s) of CLIENTS closed-loop clients over RUN_S."""
    served = refused = 0
    hints: list[float] = []
    stop = time.monotonic() + RUN_S

    async def client(http: httpx.AsyncClient) -> None:
        nonlocal served, refused
        while time.monotonic() < stop:
            r = await http.post(url + "/v1/audio/speech", json=BODY)
            if r.status_code == 200:
                served += 1
                continue
            assert r.status_code == 503, r.text
            refused += 1
            wait = int(r.headers["retry-after-ms"]) / 1000
            hints.append(wait)
            await asyncio.sleep(min(wait, max(0.0, stop - time.monotonic())))

    limits = httpx.Limits(max_connections=CLIENTS, max_keepalive_connections=CLIENTS)
    async with httpx.AsyncClient(timeout=60, limits=limits, trust_env=False) as http:
        await asyncio.gather(*(client(http) for _ in range(CLIENTS)))
    return served, refused, hints


def test_a_refused_crowd_comes_back_about_as_fast_as_places_free(tmp_path):
    env = {"KOKORO_SIM_CHUNK_MS": "60", "KOKORO_SIM_PHONEME_MS": "0.5", "KOKORO_QUEUE_MAX_REQUESTS": "4"}
    with FleetProcess(2, env=env, log_dir=tmp_path, name="crowd", engine="sim") as fleet:
        asyncio.run(closed_loop(fleet.url))  # the replicas measure their rate first
        served, refused, hints = asyncio.run(closed_loop(fleet.url))
    served_per_s, refused_per_s = served / RUN_S, refused / RUN_S
    print(f"\n{CLIENTS} clients, 4 places, 2 sim replicas: {served_per_s:.1f} served/s, "
          f"{refused_per_s:.1f} refused/s, retry-after-ms up to {max(hints, default=0):.2f} s")
    assert served > 0 and refused > 0
    # the refused clients waited for places, not the first place's time each (which would make
    # them come back (CLIENTS - 4) / 0.1 s = 200 times a second whatever the fleet serves)
    assert refused_per_s <= 3 * served_per_s
    assert max(hints) > 0.5  # the crowd's last client is told to wait behind the others
