"""A fleet on a remote Redis that takes only TLS and an ACL user's password (issue 57, item 3):
`kokoro-fleet serve --redis-url rediss://fleet:PASSWORD@...` with the test's own certificate
authority serves through it; a wrong password, a certificate from another authority or a missing
CA file stop the start with an error that names the URL without the password; the password is
never printed (start-up output, the server's log, /health)."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from api.speech.redis_link import RedisMisconfigured, check_at_start, connect, read_replicas
from loadtest.dispatch import FleetProcess
from tls_redis import TestAuthority, TlsRedis

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(shutil.which("openssl") is None or shutil.which("redis-server") is None,
                                 reason="needs openssl and redis-server")]

ROOT = Path(__file__).resolve().parents[2]
PASSWORD = "Tls-Acl-Pw-5f2c9e"
SIM = {"KOKORO_ENGINE": "sim", "KOKORO_SIM_CHUNK_MS": "5", "KOKORO_SIM_PHONEME_MS": "0.1",
       "KOKORO_PLAYGROUND": "false"}


@pytest.fixture(scope="module")
def tls_redis(tmp_path_factory):
    authority = TestAuthority(tmp_path_factory.mktemp("ca"), "127.0.0.1")
    with TlsRedis(authority, PASSWORD) as server:
        yield server


def serve_start_error(url: str, ca: str) -> subprocess.CompletedProcess:
    """`kokoro-fleet serve` against `url`, which must stop before any worker starts."""
    env = {**os.environ, **SIM, "KOKORO_REDIS_TLS_CA_FILE": ca, "REDIS_URL": url}
    return subprocess.run([sys.executable, "-m", "cli.main", "serve", "--workers", "2", "--port", "1"], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=120)


async def replicas(url: str, ca: str):
    """The replica table of the Redis at `url`, read over TLS as the fleet reads it."""
    os.environ["KOKORO_REDIS_TLS_CA_FILE"] = ca
    client = connect(url)
    try:
        return await read_replicas(client)
    finally:
        await client.aclose()
        del os.environ["KOKORO_REDIS_TLS_CA_FILE"]


def test_a_fleet_serves_through_a_tls_redis_with_an_acl_user(tls_redis, tmp_path):
    ca = str(tls_redis.authority.ca)
    env = {**SIM, "KOKORO_REDIS_TLS_CA_FILE": ca}
    with FleetProcess(2, redis_url=tls_redis.url, env=env, log_dir=tmp_path, name="tls") as fleet:
        body = {"model": "kokoro", "voice": "af_heart", "input": "Over TLS to the queue.", "response_format": "pcm"}
        answers = [httpx.post(fleet.url + "/v1/audio/speech", json=body, timeout=60) for _ in range(4)]
        health_page = httpx.get(fleet.url + "/health", timeout=10)
        health = health_page.text
        rows = asyncio.run(replicas(tls_redis.url, ca))
        log = fleet.log(tail=10**6)
    print(f"\n{len(answers)} requests through rediss:// with an ACL user: statuses "
          f"{[a.status_code for a in answers]}; {sum(r.jobs_done for r in rows)} chunk jobs in the TLS Redis's table")
    assert [a.status_code for a in answers] == [200] * 4 and all(len(a.content) > 0 for a in answers)
    assert len(rows) == 2 and sum(r.jobs_done for r in rows) >= 4  # the jobs went through that Redis
    assert health_page.json()["mode"] == "fleet"  # on the TLS Redis, not serving alone (degraded)
    assert PASSWORD not in log and PASSWORD not in health


def bad(tls_redis, case: str) -> tuple[str, str]:
    """(URL, CA file) that the TLS Redis must refuse for `case`."""
    url, ca = tls_redis.url, str(tls_redis.authority.ca)
    if case == "wrong password":
        url = url.replace(PASSWORD, PASSWORD[::-1])
    elif case == "another authority":
        ca = str(tls_redis.authority.other_ca)
    else:
        ca = str(tls_redis.authority.dir / "absent.crt")
    return url, ca


EXPECTED = {"wrong password": "refused this fleet", "another authority": "TLS handshake",
            "missing CA file": "does not exist"}


@pytest.mark.parametrize("case", list(EXPECTED))
def test_a_wrong_password_or_certificate_is_refused_naming_the_url_without_its_secret(tls_redis, case, monkeypatch):
    url, ca = bad(tls_redis, case)
    monkeypatch.setenv("KOKORO_REDIS_TLS_CA_FILE", ca)
    with pytest.raises(RedisMisconfigured) as refused:
        check_at_start(url)
    message = str(refused.value)
    print(f"\n{case}: {message}")
    assert f"rediss://fleet:***@127.0.0.1:{tls_redis.port}/0" in message and EXPECTED[case] in message
    assert PASSWORD not in message and PASSWORD[::-1] not in message


def test_serve_stops_at_start_on_a_wrong_password_and_never_prints_it(tls_redis):
    url, ca = bad(tls_redis, "wrong password")
    done = serve_start_error(url, ca)
    output = done.stdout + done.stderr
    print(f"\nexit {done.returncode}: {output.strip().splitlines()[-1]}")
    assert done.returncode != 0
    assert f"rediss://fleet:***@127.0.0.1:{tls_redis.port}/0" in output and "refused this fleet" in output
    assert PASSWORD not in output and PASSWORD[::-1] not in output
    assert "Uvicorn running" not in output and "Started server process" not in output
