"""The load generator is an instrument: these tests check it against servers whose timing we set.

Pure figures (underrun, percentiles, schedules) are checked on synthetic input with answers worked
out by hand; the client and the schedules are checked against `loadtest.stub`, which streams
pre-made audio on a known schedule and logs when it wrote each byte (same monotonic clock).
"""

from __future__ import annotations

import asyncio
import csv
import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loadtest import listener_metrics as metrics
from loadtest.client import RequestResult, RequestSpec, make_client, send_speech
from loadtest.runner import Runner, Step, Target, Workload, poisson_arrivals, speech_url, summarize
from loadtest.selftest import stub_process
from loadtest.stub import StubConfig, StubServer

# ------------------------------------------------------------------ underrun: pure function ---


def test_underrun_zero_when_data_keeps_ahead_of_playback():
    # 0.1 s of audio every 0.05 s: the buffer only grows
    arrivals = [(0.05 * i, 0.1) for i in range(20)]
    u = metrics.underrun(arrivals)
    assert (u.longest_s, u.total_s, u.stalls) == (0.0, 0.0, 0)


def test_underrun_one_known_gap():
    # 0.1 s chunks arriving exactly in real time from t=1.0 (no slack), then chunk 5 comes 0.25 s late.
    # The player has played chunks 0-4 by t=1.5, so it waits 1.75 - 1.5 = 0.25 s.
    arrivals = [(1.0 + 0.1 * i, 0.1) for i in range(5)] + [(1.75, 0.1), (1.85, 0.1)]
    u = metrics.underrun(arrivals)
    assert u.longest_s == pytest.approx(0.25)
    assert u.total_s == pytest.approx(0.25)
    assert u.stalls == 1


def test_underrun_player_resumes_after_a_stall_and_does_not_skip():
    # 1 s of audio at t=0, 2.0 and 3.2: runs dry at 1.0, waits 1.0 s; resumes at 2.0 and runs dry at
    # 3.0, waits 0.2 s. (A fixed-schedule player would count the last one 1.2 s late; ours shifted.)
    u = metrics.underrun([(0.0, 1.0), (2.0, 1.0), (3.2, 1.0)])
    assert u.longest_s == pytest.approx(1.0)
    assert u.total_s == pytest.approx(1.2)
    assert u.stalls == 2


def test_underrun_starts_at_first_audio_and_ignores_empty_reads():
    # empty reads before and between carry nothing; the player starts at the first audio (t=5)
    u = metrics.underrun([(0.0, 0.0), (5.0, 0.5), (5.2, 0.0), (5.4, 0.5), (6.3, 0.2)])
    # plays until 5.5, then +0.5 -> 6.0, next arrives at 6.3: one wait of 0.3 s
    assert u.longest_s == pytest.approx(0.3)
    assert u.stalls == 1
    assert metrics.underrun([]).longest_s == 0.0
    assert metrics.underrun([(3.0, 2.0)]).longest_s == 0.0


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 2), st.floats(0.001, 1)), min_size=1, max_size=30))
def test_underrun_bounds(gaps_and_sizes):
    # arrivals built from positive inter-arrival gaps; the player can never wait longer than the
    # largest gap between two arrivals, and waits nothing when every chunk comes before the audio
    # ahead of it could have been played out
    t, arrivals = 0.0, []
    for gap, size in gaps_and_sizes:
        t += gap
        arrivals.append((t, size))
    u = metrics.underrun(arrivals)
    largest_gap = max((b[0] - a[0] for a, b in zip(arrivals, arrivals[1:])), default=0.0)
    assert 0.0 <= u.longest_s <= largest_gap + 1e-9
    assert u.longest_s <= u.total_s + 1e-9
    t0, audio_before, on_time = arrivals[0][0], 0.0, True
    for at, size in arrivals:
        on_time &= at <= t0 + audio_before + 1e-12
        audio_before += size
    if on_time:
        assert u.longest_s == 0.0


@settings(max_examples=100, deadline=None)
@given(st.lists(st.floats(0, 1e3), min_size=1, max_size=50), st.sampled_from([50, 95, 99]))
def test_percentile_matches_numpy(values, q):
    assert metrics.percentile(values, q) == pytest.approx(float(np.percentile(values, q)), rel=1e-9, abs=1e-9)


def test_pcm_seconds_and_urls():
    assert metrics.pcm_seconds(48000) == pytest.approx(1.0)  # 24 kHz x 2 bytes
    assert speech_url("http://h:8880") == "http://h:8880/v1/audio/speech"
    assert speech_url("http://h:8880/") == "http://h:8880/v1/audio/speech"
    assert speech_url("http://h:8880/custom/path") == "http://h:8880/custom/path"


def test_poisson_schedule_rate_and_reproducibility():
    arrivals = poisson_arrivals(20.0, 200.0, seed=1)
    assert arrivals == poisson_arrivals(20.0, 200.0, seed=1)  # compare sends both servers the same
    assert arrivals != poisson_arrivals(20.0, 200.0, seed=2)
    assert all(0 < a < 200 for a in arrivals) and arrivals == sorted(arrivals)
    assert len(arrivals) / 200.0 == pytest.approx(20.0, rel=0.05)  # 4000 +- 63 arrivals expected
    gaps = np.diff(arrivals)
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, abs=0.06)  # exponential: CV of 1


# ------------------------------------------------------------------ against the stub server ---


def _one(url: str, rid: str = "r", **spec) -> RequestResult:
    async def go():
        async with make_client(4) as client:
            return await send_speech(client, RequestSpec(url=url + "/v1/audio/speech", text="hi", **spec),
                                     RequestResult(request_id=rid), total_timeout=30)

    return asyncio.run(go())


def _in_turn(url: str, rids: list[str], **spec) -> list[RequestResult]:
    """Requests one after another from one event loop and client, as the generator sends them (a
    fresh loop and client per request times cold paths that a load test never runs)."""
    async def go():
        async with make_client(4) as client:
            return [await send_speech(client, RequestSpec(url=url + "/v1/audio/speech", text="hi", **spec),
                                      RequestResult(request_id=rid), total_timeout=30) for rid in rids]

    return asyncio.run(go())


def _median(values):
    return float(np.median(values))


class _StubProcess:
    """`python -m loadtest.stub` in its own process (its timers and the generator's event loop
    do not share a GIL), with its log fetched over HTTP."""

    def __init__(self, **cfg) -> None:
        args = []
        for k, v in cfg.items():
            args += ["--" + k.replace("_", "-"), str(v)]
        self._cm = stub_process(*args)

    def __enter__(self):
        self.url = self._cm.__enter__()
        return self

    def __exit__(self, *exc):
        return self._cm.__exit__(*exc)

    def produced(self, results: list[RequestResult]) -> list[tuple[float, float]]:
        """(headers, first audio) as the stub produced them: seconds after it had the request."""
        import httpx

        events = httpx.get(self.url + "/stub/log", trust_env=False).json()["events"]
        return [(events[r.request_id]["headers"] - events[r.request_id]["recv"],
                 events[r.request_id]["first_audio"] - events[r.request_id]["recv"]) for r in results]


# How these timing tests stay honest on 2 cores shared with other jobs: the stub logs when it
# really wrote each thing (its sleeps overshoot when the CPU is busy), so the generator's figures
# are checked against that, on the same clock. Scheduling noise only ever makes the generator
# later, never earlier, so the best of a few requests shows its accuracy and the median gets a
# looser bound. On a quiet machine (CI, or this one between jobs) the error is ~1-2 ms
# (`python -m loadtest selftest --concurrency 1`), so the best of six requests must land within the
# issue's 5 ms; with both cores busy with other jobs (load 4-5) each wake-up of the stub or the
# generator can cost a few ms more, which only the medians' looser bound absorbs. Every distinction
# these tests draw (headers vs first audio vs last byte) is 50 ms or more.
# Some machines add their own cost that no client avoids: on a Firecracker VM a process
# idle in epoll for 0.3 s woke to its socket 3-5 ms after the write (0.5 ms after 10 ms idle), with
# plain asyncio and no generator code. So each test also times the same requests with a bare
# asyncio client (`_bare_errors`) and bounds the generator's error by the bare client's plus 5 ms:
# what the generator itself adds.
ACCURATE_S = 0.005


def _bare_errors(stub: "_StubProcess", count: int, sse: bool = False) -> tuple[float, float]:
    """The best (headers, first body bytes) error of a bare asyncio client over `count` requests on
    fresh connections, against what the stub logged: this machine's own floor for those figures."""
    import time
    from urllib.parse import urlsplit

    url = urlsplit(stub.url)
    body = json.dumps({"model": "kokoro", "input": "hi", "voice": "af_heart", "response_format": "pcm",
                       **({"stream_format": "sse"} if sse else {})}).encode()

    async def exchange(rid: str) -> tuple[float, float, float]:
        t_wire = time.perf_counter()
        reader, writer = await asyncio.open_connection(url.hostname, url.port)
        writer.write(f"POST /v1/audio/speech HTTP/1.1\r\nHost: {url.netloc}\r\nX-Request-Id: {rid}\r\n"
                     f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)
        await reader.readuntil(b"\r\n\r\n")
        t_headers = time.perf_counter()
        await reader.read(1)
        t_first = time.perf_counter()
        writer.close()
        return t_wire, t_headers, t_first

    rids = [f"bare-{id(stub)}-{k}" for k in range(count)]
    times = [asyncio.run(exchange(rid)) for rid in rids]
    import httpx

    events = httpx.get(stub.url + "/stub/log", trust_env=False).json()["events"]
    headers = [(h - w) - (events[r]["headers"] - events[r]["recv"]) for r, (w, h, _) in zip(rids, times)]
    first = [(f - w) - (events[r]["first_audio"] - events[r]["recv"]) for r, (w, _, f) in zip(rids, times)]
    return min(headers), min(first)


def test_ttfa_is_the_first_audio_byte_not_the_headers():
    # headers at once, audio 300 ms later, then 4 more chunks 100 ms apart (last byte at ~700 ms):
    # a tool that timed the headers would report ~0, one that timed the body's end ~700 ms
    delay = 0.300
    with _StubProcess(audio_seconds=0.5, first_byte_delay=delay, chunk_seconds=0.1, chunk_gap=0.1) as stub:
        results = _in_turn(stub.url, [f"t{i}" for i in range(6)])
        produced = stub.produced(results)
        _, bare_first = _bare_errors(stub, 4)
    for r, (_, stub_first) in zip(results, produced):
        assert r.outcome == "ok", r.error
        assert r.headers_s < 0.5 * delay  # the headers, not the audio that came `delay` after them
        assert r.audio_s == pytest.approx(0.5)
        assert r.e2e_s > 0.69
        # The first chunk, not a later one: the stub wrote one every 100 ms after the first, the last
        # 400 ms after it. Half way to the third leaves a loaded machine's wake-ups room.
        assert delay <= r.ttfa_s < stub_first + 0.2
    vs_delay = np.array([r.ttfa_s - delay for r in results]) * 1000
    vs_stub = np.array([r.ttfa_s - p[1] for r, p in zip(results, produced)]) * 1000
    print(f"\nTTFA - configured delay (ms): {np.round(vs_delay, 2).tolist()}\n"
          f"TTFA - delay the stub applied (ms): {np.round(vs_stub, 2).tolist()}\n"
          f"a bare asyncio client's best error on this machine (ms): {1000 * bare_first:.2f}")
    assert 0.0 <= vs_stub.min() < (bare_first + ACCURATE_S) * 1000
    assert np.median(vs_stub) < 50.0  # half the 100 ms that tells the first chunk from the second
    # The stub never writes audio before its delay (its timer can only be late: by 18 ms once, with
    # both cores busy), so what it logged is what the generator's figures are checked against.
    assert all(p[1] >= delay - 1e-4 for p in produced), produced


def test_header_delay_and_first_audio_delay_are_told_apart():
    with _StubProcess(audio_seconds=0.3, header_delay=0.2, first_byte_delay=0.15) as stub:
        results = _in_turn(stub.url, [f"h{i}" for i in range(6)])
        produced = stub.produced(results)
        bare_headers, bare_first = _bare_errors(stub, 4)
    headers_err = [r.headers_s - p[0] for r, p in zip(results, produced)]
    ttfa_err = [r.ttfa_s - p[1] for r, p in zip(results, produced)]
    assert all(r.headers_s >= 0.2 and r.ttfa_s >= 0.35 for r in results)
    assert 0.0 <= min(headers_err) < bare_headers + ACCURATE_S and 0.0 <= min(ttfa_err) < bare_first + ACCURATE_S
    assert _median(headers_err) < 0.025 and _median(ttfa_err) < 0.025


def test_underrun_measured_end_to_end():
    # 0.4 s arrives at once (4 chunks), then the server stalls 0.6 s: the player waits ~0.2 s.
    # Scheduling on a busy machine only delays the chunk after the stall (224 ms once, with both
    # cores busy), so the bound above is looser than the one below.
    stub = StubServer(StubConfig(audio_seconds=1.0, chunk_seconds=0.1, stall_after_chunk=3, stall_s=0.6))
    with stub.running_in_thread() as url:
        r = _one(url)
    assert r.outcome == "ok"
    assert 0.18 <= r.underrun_s <= 0.25, r.underrun_s
    assert r.stalls == 1


def test_sse_ttfa_is_the_first_audio_delta():
    with _StubProcess(audio_seconds=0.6, first_byte_delay=0.2, chunk_seconds=0.2, chunk_gap=0.05) as stub:
        results = _in_turn(stub.url, [f"s{i}" for i in range(4)], sse=True)
        produced = stub.produced(results)
        _, bare_first = _bare_errors(stub, 4, sse=True)
    for r in results:
        assert r.outcome == "ok", r.error
        assert r.reads == 3
        assert r.audio_s == pytest.approx(0.6)
        assert r.headers_s < 0.5 * 0.2 and r.ttfa_s >= 0.2  # the headers at once, the first delta 0.2 s later
    # the first delta, not the headers (~0) nor the second delta (50 ms after the first)
    assert 0.0 <= min(r.ttfa_s - p[1] for r, p in zip(results, produced)) < bare_first + ACCURATE_S


@pytest.mark.parametrize("fmt", ["mp3", "wav", "flac"])
def test_compressed_formats_are_decoded_for_audio_seconds(fmt):
    stub = StubServer(StubConfig(audio_seconds=2.0, chunk_seconds=0.25))
    with stub.running_in_thread() as url:
        r = _one(url, response_format=fmt)
    assert r.outcome == "ok", r.error
    # mp3 pads up to a frame and adds encoder delay (< 0.1 s); wav and flac are exact
    assert r.audio_s == pytest.approx(2.0, abs=0.1 if fmt == "mp3" else 0.001)
    assert r.underrun_s == 0.0  # all sent without gaps


@pytest.mark.parametrize("fmt,rate,extra", [("mulaw", None, {}), ("alaw", 16000, {}),
                                            ("pcm", None, {"sample_rate": 8000})])
def test_headerless_formats_are_counted_at_their_rate(fmt, rate, extra):
    """G.711 is one byte a sample at 8 kHz, and `sample_rate` (a spec field or --extra) sets the
    rate the bytes are counted at: 2 s of audio whatever the format, and no stall between chunks."""
    stub = StubServer(StubConfig(audio_seconds=2.0, chunk_seconds=0.25))
    body = {**extra, **({"sample_rate": rate} if rate else {})}
    with stub.running_in_thread() as url:
        r = _one(url, response_format=fmt, extra=body)
    assert r.outcome == "ok", r.error
    assert r.audio_bytes == round(2.0 * (rate or 8000) * (2 if fmt == "pcm" else 1))
    assert r.audio_s == pytest.approx(2.0, abs=0.001) and r.underrun_s == 0.0


def _run_steps(url: str, steps: list[Step], **workload) -> list:
    async def go():
        runner = Runner(Workload(texts=["a", "bb", "ccc"], **workload), steps, progress=False)
        try:
            return [await runner.run_step(step, Target(url + "/v1/audio/speech", "stub")) for step in steps]
        finally:
            await runner.aclose()

    return asyncio.run(go())


def test_503s_are_counted_apart_from_latency():
    # every 3rd request is refused at once; the others take 150 ms to first audio
    stub = StubServer(StubConfig(audio_seconds=0.2, first_byte_delay=0.15, reject_every=3, retry_after_s=1.5))
    with stub.running_in_thread() as url:
        (run,) = _run_steps(url, [Step("closed", 2, 2.0)])
    s = summarize([run])
    assert s["rejected_503"] == stub.requests_seen // 3
    assert s["rejected_503"] + s["ok"] == s["attempted"] == stub.requests_seen
    assert s["errors"] == 0
    # The share of the stub's refusals among what it saw: about a third, exactly so only when the
    # few requests of 2 s (each user waits 1.5 s after a 503) come in a multiple of three.
    assert s["rejection_rate"] == pytest.approx(s["rejected_503"] / stub.requests_seen)
    assert stub.requests_seen >= 3 and s["rejected_503"] >= 1
    assert s["ttfa_s"]["n"] == s["ok"]  # fast 503s never pull the latency figures down
    assert s["ttfa_s"]["p50"] >= 0.15 and s["e2e_s"]["p50"] >= 0.15
    assert s["rejected_latency_s"]["p50"] < 0.05
    assert s["retry_after_s"]["p50"] == pytest.approx(1.5)  # retry-after-ms preferred over the rounded header
    rejected = [r for r in run.rows if r.outcome == "rejected"]
    assert all(r.retry_after == "2" and r.retry_after_ms == "1500" for r in rejected)


def test_closed_loop_users_wait_the_retry_after_of_a_503():
    # capacity 2, 4 users: two are refused at once. Honouring Retry-After (0.5 s), a refused user
    # tries at most about duration / 0.5 times; without it, it spins on fast 503s.
    cfg = dict(audio_seconds=0.3, first_byte_delay=0.05, capacity=2, retry_after_s=0.5)
    with StubServer(StubConfig(**cfg)).running_in_thread() as url:
        (polite,) = _run_steps(url, [Step("closed", 4, 1.5)])
    with StubServer(StubConfig(**cfg)).running_in_thread() as url:
        (spinning,) = _run_steps(url, [Step("closed", 4, 1.5)], honor_retry_after=False)
    rejected = lambda run: sum(r.outcome == "rejected" for r in run.rows)  # noqa: E731
    print(f"\n503s in 1.5 s at c=4 against capacity 2: {rejected(polite)} waiting Retry-After, "
          f"{rejected(spinning)} not waiting")
    assert 1 <= rejected(polite) <= 4 * 4
    assert rejected(spinning) > 10 * rejected(polite)
    assert summarize([polite])["ok"] >= 2 * 3  # the two admitted users keep being served


def test_open_loop_arrivals_are_not_delayed_by_slow_responses():
    # every response takes 2 s; at 20 arrivals/s a closed loop would send ~1 request per user,
    # an open loop keeps sending on the Poisson schedule regardless
    stub = StubServer(StubConfig(audio_seconds=0.1, first_byte_delay=2.0))
    with stub.running_in_thread() as url:
        (run,) = _run_steps(url, [Step("open", 20, 2.0)], max_outstanding=500)
    expected = poisson_arrivals(20, 2.0, seed=0)
    assert [r.scheduled_at for r in run.rows] == expected
    lags = [r.sched_lag_s for r in run.rows]
    print(f"\nopen loop: {len(expected)} arrivals, send lag p50 {np.median(lags) * 1000:.2f} ms, "
          f"max {max(lags) * 1000:.2f} ms, {run.max_in_flight} in flight at most")
    assert all(r.outcome == "ok" for r in run.rows)
    # A loop that waited for responses would send seconds late (each takes 2 s); scheduling on a
    # loaded machine makes a send a few ms late, tens at worst.
    assert max(lags) < 0.25 * 2.0 and np.median(lags) < 0.05
    # every arrival was in flight before the first response came back
    assert run.max_in_flight == len(expected) == stub.max_in_flight
    assert run.wall_s == pytest.approx(expected[-1] + 2.0, abs=0.3)


def test_open_loop_cap_drops_are_reported_not_hidden():
    stub = StubServer(StubConfig(audio_seconds=0.1, first_byte_delay=1.0))
    with stub.running_in_thread() as url:
        (run,) = _run_steps(url, [Step("open", 20, 1.5)], max_outstanding=5)
    s = summarize([run])
    n = len(poisson_arrivals(20, 1.5, seed=0))
    assert s["requests"] == n
    # the first 5 arrivals fill the cap for a second; arrivals after they finish are sent again
    assert s["ok"] > 5 and s["errors"] == 0
    assert s["dropped"] == n - s["ok"] - s["errors"] - s["rejected_503"]
    assert s["dropped"] > 0 and s["drop_rate"] == pytest.approx(s["dropped"] / n)
    assert stub.max_in_flight <= 5 and run.max_in_flight == 5
    assert all("max-outstanding" in r.error for r in run.rows if r.outcome == "dropped")


def test_open_loop_cap_holds_when_arrivals_come_due_together():
    # ~1000 arrivals within 50 ms against 1 s responses: many come due before any of their tasks
    # has run (as on a busy event loop); the cap must count them at once, or more than the cap go out
    stub = StubServer(StubConfig(audio_seconds=0.1, first_byte_delay=1.0))
    with stub.running_in_thread() as url:
        (run,) = _run_steps(url, [Step("open", 20000, 0.05)], max_outstanding=7)
    assert run.max_in_flight == 7 == stub.max_in_flight
    assert sum(r.outcome == "ok" for r in run.rows) == 7
    assert sum(r.outcome == "dropped" for r in run.rows) == len(run.rows) - 7


def test_closed_loop_holds_its_concurrency():
    # requests of ~0.25 s; between two, a user spends a little time of its own (bookkeeping, httpx
    # building the next request), which is not "in flight"
    stub = StubServer(StubConfig(audio_seconds=0.3, first_byte_delay=0.2, chunk_gap=0.01))
    with stub.running_in_thread() as url:
        (run,) = _run_steps(url, [Step("closed", 8, 1.5)])
    s = summarize([run])
    assert run.max_in_flight == 8 == stub.max_in_flight
    # A loaded machine stretches the users' own time between requests; a user that paused 0.1 s
    # between its ~0.25 s requests would keep under 0.75 of 8 in flight.
    assert 0.75 * 8 < s["mean_in_flight"] <= 8.0
    assert s["errors"] == 0 and s["ok"] >= 8 * 4
    assert s["audio_s"] == pytest.approx(0.3 * s["ok"])


# ------------------------------------------------------------------ the generator's overhead ---


@pytest.mark.slow
def test_generator_overhead_at_c64():
    from loadtest.selftest import format_overhead, measure_overhead

    m = measure_overhead(concurrency=64, duration=6.0)
    print("\n" + format_overhead(m))
    assert m["errors"] == 0 and m["streams"] > 64 * 5
    assert m["max_in_flight"] == 64 == m["stub_max_in_flight"]
    assert m["mean_in_flight"] > 0.9 * 64  # the load asked for is the load sent (less each user's own gaps)
    assert m["stub_connections"] <= 64 + 1  # connections kept alive (+1: the log request)
    # The acceptance figure (median error under 2 ms at c=64) is measured on a quiet machine with
    # `python -m loadtest selftest` and quoted in loadtest/README.md. Here the 2 cores are shared
    # with other jobs that can keep both busy, so the bound is generous; it still fails a
    # generator that queues requests on its own side (httpcore's shared pool did: a median
    # ~900 ms before the request was written) or blocks its event loop while streams arrive.
    assert m["ttfa_error_ms"]["min"] >= 0.0  # causality on one clock: nothing is seen before it is sent
    assert m["ttfa_error_ms"]["p50"] < 100.0


# ------------------------------------------------------------------ the command line and files ---


def test_run_writes_csv_json_and_plots(tmp_path, capsys):
    from matplotlib.image import imread

    from loadtest.loadtest_cli import main

    stub = StubServer(StubConfig(audio_seconds=0.3, first_byte_delay=0.03, chunk_gap=0.01, reject_every=7))
    out = tmp_path / "run"
    with stub.running_in_thread() as url:
        code = main(["run", "--url", url, "--concurrency", "1,3", "--duration", "1", "--warmup", "2",
                     "--texts", "paragraphs", "--out", str(out), "--report", "--quiet"])
    assert code == 0
    printed = capsys.readouterr().out
    assert "c=3" in printed and "TTFA p50" in printed
    summary = json.loads((out / "summary.json").read_text())
    assert [s["step"] for s in summary["steps"]] == ["c=1", "c=3"]
    assert summary["meta"]["texts"] == "paragraphs" and summary["meta"]["machine"]["cpus"]
    with open(out / "requests.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    warm = [r for r in rows if r["phase"] == "warmup"]
    assert len(warm) == 2  # present in the CSV, absent from every summary
    assert len(rows) - len(warm) == sum(s["requests"] for s in summary["steps"])
    ok = [r for r in rows if r["outcome"] == "ok" and r["phase"] == "measure"]
    assert len(ok) == sum(s["ok"] for s in summary["steps"])
    assert all(float(r["ttfa_s"]) >= 0.03 for r in ok)
    assert any(r["outcome"] == "rejected" for r in rows)
    for name in ("latency", "throughput", "rejections", "ttfa_cdf", "underrun"):
        img = imread(out / "plots" / f"{name}.png")
        assert img.shape[0] > 300 and img.shape[1] > 500


def test_compare_interleaves_and_reports_ratios(tmp_path, capsys):
    from loadtest.loadtest_cli import main

    fast = StubServer(StubConfig(audio_seconds=0.2, first_byte_delay=0.05))
    slow = StubServer(StubConfig(audio_seconds=0.2, first_byte_delay=0.10))
    out = tmp_path / "cmp"
    with fast.running_in_thread() as a, slow.running_in_thread() as b:
        code = main(["compare", "--a", a, "--b", b, "--a-label", "fast", "--b-label", "slow",
                     "--concurrency", "1,2", "--duration", "1", "--rounds", "2", "--warmup", "1",
                     "--out", str(out), "--quiet", "--report"])
    assert code == 0
    assert "ratios slow / fast" in capsys.readouterr().out
    ratios = json.loads((out / "compare.json").read_text())["steps"]
    summaries = {label: json.loads((out / label / "summary.json").read_text())["steps"] for label in ("fast", "slow")}
    for step, r in enumerate(ratios):
        # slow over fast (100 ms against 50 ms: 2.0 at best; the same scheduling delay added to both
        # brings it nearer 1 on a loaded machine), from the two sides' own figures
        fast_p50, slow_p50 = (summaries[label][step]["ttfa_s"]["p50"] for label in ("fast", "slow"))
        assert fast_p50 >= 0.05 and slow_p50 >= 0.10
        assert r["ttfa_p50_ratio"] == pytest.approx(slow_p50 / fast_p50) and r["ttfa_p50_ratio"] > 1.2
        assert r["requests_per_s_ratio"] < 1.0
    for steps in summaries.values():
        assert [s["duration_s"] for s in steps] == [1.0, 1.0]  # two half-second slices each
    assert (out / "plots" / "latency.png").is_file()


def test_fail_on_error_exit_code(tmp_path):
    from loadtest.loadtest_cli import main

    # nothing listens on this port: every request is a connection error
    code = main(["run", "--url", "http://127.0.0.1:9", "--concurrency", "1", "--duration", "0.3",
                 "--warmup", "0", "--out", str(tmp_path / "x"), "--quiet", "--fail-on-error",
                 "--connect-timeout", "1"])
    assert code == 1
    rows = list(csv.DictReader(open(tmp_path / "x" / "requests.csv")))
    assert rows and all(r["outcome"] == "error" and r["status"] == "0" for r in rows)
    assert len(rows) <= 0.3 / 0.1 + 1  # a refused user pauses 100 ms instead of spinning


def test_texts_ship_with_the_package():
    from loadtest.texts import load_texts

    short, paragraphs, long = load_texts("short"), load_texts("paragraphs"), load_texts("long")
    assert len(short) > 10 and len(paragraphs) >= 5 and len(long) == 1
    assert len(long[0]) > max(map(len, paragraphs))
    with pytest.raises(ValueError):
        load_texts("no-such-set")


def test_hey_bodies_match_the_text_sets_and_script_is_clean():
    import shutil
    import subprocess

    from loadtest.texts import load_texts

    here = Path(__file__).resolve().parents[2] / "loadtest"
    for name in ("short", "paragraphs", "long"):
        body = json.loads((here / "bodies" / f"{name}.json").read_text())
        assert body["input"] in load_texts(name)
        assert body["response_format"] == "pcm" and body["voice"] == "af_heart"
    if shutil.which("shellcheck") is None:
        pytest.skip("shellcheck not installed")
    proc = subprocess.run(["shellcheck", str(here / "hey.sh")], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout


def test_dispatch_report_and_plot_show_both_sides_and_the_ratio(tmp_path):
    from loadtest import dispatch
    from loadtest.runner import StepRun

    rng = np.random.default_rng(0)
    step = Step("open", 3.0, 60.0)
    runs = {}
    for label, scale in (("shared", 0.1), ("local", 0.4)):
        rows = [RequestResult(target=label, step=step.label, phase="measure", outcome="ok", status=200,
                              ttfa_s=float(t), e2e_s=float(t) + 0.5, audio_s=5.0)
                for t in rng.exponential(scale, 200)]
        runs[label] = [StepRun(step, Target("http://x/v1/audio/speech", label), rows, 60.0, 61.0, 100.0, 4)]
    result = {**dispatch.side_by_side(runs), "replica_jobs": {"shared": {"a": 100, "b": 100}, "local": {"a": 150, "b": 50}},
              "load": 0.8, "capacity_requests_per_s": 4.0, "workers": 2, "connections": "close"}
    p95 = result["p95_ttfa_s"]
    assert p95["shared"] == pytest.approx(np.percentile(result["ttfa_s"]["shared"], 95), rel=0.05)
    assert 2.5 < result["ratio_local_over_shared"] < 6   # exponential tails 4x apart, sampled
    text = dispatch.report(result)
    assert f"p95 TTFA local / shared = {result['ratio_local_over_shared']:.2f}x" in text
    assert "jobs per replica [150, 50]" in text
    png = dispatch.plot(result, tmp_path / "ttfa.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
