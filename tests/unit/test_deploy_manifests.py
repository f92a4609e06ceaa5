"""The several-machines deployment files (issue 57) are valid as their tools read them: the Helm chart
lints and renders (Helm's own Go code, through helm-python-sdk) with each shape of its values, every
rendered manifest and the plain Kubernetes example validate against Kubernetes' schemas
(kubernetes-validate), and HAProxy accepts deploy/haproxy/haproxy.cfg (`haproxy -c`)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "kokoro-fleet"
KUBE_VERSION = "1.30.0"

helm = pytest.importorskip("helm_python", reason="helm-python-sdk (the dev extra) renders the chart")
kubernetes_validate = pytest.importorskip("kubernetes_validate", reason="kubernetes-validate (the dev extra)")

SHAPES = {
    "independent fleets (defaults)": {},
    "one shared Redis by URL": {"redis": {"url": "redis://redis.tts:6379/0"}},
    "a TLS Redis from a Secret": {"redis": {"existingSecret": "tts-redis", "tls": {"caSecret": "tts-redis-ca"}},
                                  "replicaCount": 4, "nodeSelector": {"gpu": "h100"}},
}


def documents(text: str) -> list[dict]:
    return [d for d in yaml.safe_load_all(text) if d]


def test_the_chart_lints_without_errors():
    report = helm.lint(str(CHART), strict=True, kube_version=f"v{KUBE_VERSION}")
    problems = [m for m in report["messages"] if m["severity"] >= 2] + report["errors"]
    assert report["total_charts_linted"] == 1 and problems == [], problems


@pytest.mark.parametrize("shape", SHAPES)
def test_the_chart_renders_valid_manifests(shape):
    with helm.Chart.load(str(CHART)) as chart:
        rendered = chart.render(SHAPES[shape], name="tts", namespace="speech")
    objects = [d for path, text in rendered.items() if path.endswith(".yaml") for d in documents(text)]
    kinds = {o["kind"]: o for o in objects}
    assert set(kinds) == {"Deployment", "Service"}
    for o in objects:
        kubernetes_validate.validate(o, KUBE_VERSION, strict=True)
    pod = kinds["Deployment"]["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert container["readinessProbe"]["httpGet"]["path"] == "/ready"
    env = {e["name"]: e for e in container["env"]}
    redis = SHAPES[shape].get("redis", {})
    if redis.get("existingSecret"):
        assert env["REDIS_URL"]["valueFrom"]["secretKeyRef"]["name"] == "tts-redis"
        assert env["KOKORO_REDIS_TLS_CA_FILE"]["value"].startswith("/etc/kokoro-fleet/redis-ca/")
    elif redis.get("url"):
        assert env["REDIS_URL"]["value"] == redis["url"]
    else:
        assert "REDIS_URL" not in env  # each pod its own embedded Redis
    assert kinds["Service"]["spec"]["selector"] == kinds["Deployment"]["spec"]["selector"]["matchLabels"]


def test_the_plain_kubernetes_example_is_valid():
    objects = documents((ROOT / "deploy" / "kubernetes" / "kokoro-fleet.yaml").read_text())
    assert [o["kind"] for o in objects] == ["Deployment", "Service"]
    for o in objects:
        kubernetes_validate.validate(o, KUBE_VERSION, strict=True)


@pytest.mark.skipif(shutil.which("haproxy") is None, reason="haproxy is not installed (make install-test)")
def test_haproxy_accepts_the_balancer_config():
    env = {**os.environ, "KOKORO_BALANCER_BIND": "127.0.0.1:18880",
           **{f"KOKORO_FLEET_{i}": f"127.0.0.1:{18880 + i}" for i in (1, 2, 3)}}
    done = subprocess.run(["haproxy", "-c", "-f", str(ROOT / "deploy" / "haproxy" / "haproxy.cfg")], env=env,
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stdout + done.stderr
