"""KOKORO_REPLICAS below the workers: every worker is an HTTP front, only some hold a replica
(issue 39, item 1). `kokoro-fleet serve --workers 3 --engine sim` with KOKORO_REPLICAS=1: requests
reaching any of the three workers are served, and the replica table holds one replica."""

from __future__ import annotations

import concurrent.futures

import httpx
import pytest
import redis

from loadtest.dispatch import FleetProcess

pytestmark = pytest.mark.slow

SPEECH = {"model": "kokoro", "voice": "af_heart", "input": "Three fronts and one replica.", "response_format": "pcm"}


def test_workers_without_a_replica_serve_through_the_one_that_has_it(tmp_path):
    # room for the 6 clients at once (one replica's derived bound is 4: a batch of KOKORO_BATCH_MAX)
    env = {"KOKORO_SIM_CHUNK_MS": "20", "KOKORO_SIM_PHONEME_MS": "0.2", "KOKORO_REPLICAS": "1",
           "KOKORO_BATCH_MAX": "4", "KOKORO_QUEUE_MAX_REQUESTS": "8"}
    with FleetProcess(3, env=env, log_dir=tmp_path, name="fronts", engine="sim") as fleet:
        def speak(_: int) -> tuple[int, str, int]:
            r = httpx.post(fleet.url + "/v1/audio/speech", json=SPEECH, timeout=60, trust_env=False,
                           headers={"Connection": "close"})  # a fresh connection: any worker may take it
            worker = httpx.get(fleet.url + "/health", timeout=10, trust_env=False,
                               headers={"Connection": "close"}).json()["worker"]
            return r.status_code, worker, len(r.content)

        with concurrent.futures.ThreadPoolExecutor(6) as pool:
            results = list(pool.map(speak, range(30)))
        table = redis.Redis.from_url(fleet.redis_url()).zrange("{kf}:replicas", 0, -1)
        log = fleet.log_path.read_text(errors="replace")
    assert {status for status, _, _ in results} == {200}
    assert all(size > 24_000 for _, _, size in results)  # about a second of 16-bit audio each at least
    assert len({worker for _, worker, _ in results}) >= 2  # more than one front answered
    assert len(table) == 1, table
    assert "1 of the 3 workers hold a model replica" in log
    assert log.count("replica slot none: an HTTP front only") == 2 and log.count("replica slot 0 of 1") == 1
