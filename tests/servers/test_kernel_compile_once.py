"""One compile of the fused CPU kernels per host (issue 48): two worker processes starting together
on an empty compile cache each warm up eagerly and compile in the background, as a server's worker
does (api/speech/local.py); the host's compile lock lets one compile while the other waits and then
loads what it wrote. Each says which it did in its log line."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
# A worker's start as `serve` makes it (api/app.py `_load_service`), on the tiny weights, then
# the background compile awaited: the process ends once its kernels are in service.
WORKER = """
import asyncio, logging, sys
logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="%(name)s %(message)s")
from api.settings import Settings
from api.speech.build import build_local_service
from worker.cpu_runtime import configure_process

settings = Settings.from_env()
configure_process(cache_dir=settings.cache_dir, threads=1, workers=2, device="cpu", inference_nice=0)
service = build_local_service(settings)

async def main():
    await service.warmup()
    health = service.health()
    style = service.voices.style(service.voices.resolve("af_heart"), 5)
    await service.replica.synthesize([50, 83, 54, 16, 56], style)  # served at once, eagerly or not
    print("health at ready:", health, flush=True)
    await service.kernel_compile
    print("health after:", service.health(), flush=True)

asyncio.run(main())
"""


@pytest.mark.slow
def test_two_workers_on_an_empty_cache_compile_the_kernels_once(tmp_path):
    env = {**os.environ, "KOKORO_CACHE_DIR": str(tmp_path / "cache"), "KOKORO_WEIGHTS": "tiny",
           "KOKORO_DTYPE": "fp32", "PYTHONPATH": str(REPO)}
    env.pop("TORCHINDUCTOR_CACHE_DIR", None)
    workers = [subprocess.Popen([sys.executable, "-c", WORKER], cwd=REPO, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True) for _ in range(2)]
    logs = [w.communicate(timeout=600)[0] for w in workers]
    assert [w.returncode for w in workers] == [0, 0], "\n----\n".join(logs)
    said = []
    for log in logs:
        assert "health at ready: {'kernels': 'eager', 'kernels_compiling': True}" in log, log
        assert "health after: {'kernels': 'compiled', 'kernels_compiling': False}" in log, log
        lines = re.findall(r"worker \S+: fused CPU kernels (compiled|loaded) in [\d.]+ s, serving with them", log)
        assert len(lines) == 1, log
        said.append(lines[0])
    assert sorted(said) == ["compiled", "loaded"], "\n----\n".join(logs)
