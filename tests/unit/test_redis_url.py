"""The Redis URL handling in one place (api/speech/redis_link.py, issue 57): what a log line or an
error shows of a URL (never its password), and the TLS arguments a `rediss://` URL gets from the
settings."""

from __future__ import annotations

import pytest

from api.speech.redis_link import redacted_url, tls_options


@pytest.mark.parametrize("url, shown", [
    ("rediss://fleet:pa55@10.0.0.5:6380/0", "rediss://fleet:***@10.0.0.5:6380/0"),
    ("redis://:pa55@redis:6379/0", "redis://:***@redis:6379/0"),
    ("redis://pa55@redis:6379", "redis://:***@redis:6379"),  # a lone userinfo: some clients read it as the password
    ("redis://redis:6379/0?password=pa55&db=1", "redis://redis:6379/0?password=***&db=1"),
    ("redis://127.0.0.1:6379/0", "redis://127.0.0.1:6379/0"),
    ("unix:///tmp/kokoro-redis-x/redis.sock?db=0", "unix:///tmp/kokoro-redis-x/redis.sock?db=0"),
])
def test_a_shown_url_keeps_everything_but_the_password(url, shown):
    assert redacted_url(url) == shown
    assert "pa55" not in redacted_url(url)


def test_tls_arguments_come_from_the_settings_for_rediss_only(monkeypatch, tmp_path):
    monkeypatch.setenv("KOKORO_REDIS_TLS_CA_FILE", str(tmp_path / "ca.crt"))
    monkeypatch.setenv("KOKORO_REDIS_TLS_CERT_FILE", str(tmp_path / "me.crt"))
    monkeypatch.setenv("KOKORO_REDIS_TLS_KEY_FILE", str(tmp_path / "me.key"))
    assert tls_options("redis://h:6379/0") == {}
    assert tls_options("rediss://u:p@h:6380/0") == {
        "ssl_cert_reqs": "required", "ssl_ca_certs": str(tmp_path / "ca.crt"),
        "ssl_certfile": str(tmp_path / "me.crt"), "ssl_keyfile": str(tmp_path / "me.key")}
    monkeypatch.delenv("KOKORO_REDIS_TLS_CERT_FILE")
    monkeypatch.delenv("KOKORO_REDIS_TLS_KEY_FILE")
    assert "ssl_certfile" not in tls_options("rediss://h:6380/0")
