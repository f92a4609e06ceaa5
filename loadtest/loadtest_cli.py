"""`python -m loadtest run | compare | report`: the load generator's command line.

    # a 20-second smoke against a local `kokoro-fleet serve`, plots included, non-zero exit on errors
    python -m loadtest run --url http://127.0.0.1:8880 --concurrency 1,2 --duration 10 \\
        --texts short --out loadtest-results/smoke --wait 120 --report --fail-on-error
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from loadtest import listener_metrics as metrics
from loadtest.report import format_summary_table
from loadtest.results import machine, now_iso, write_results
from loadtest.runner import Runner, Step, Target, Workload, parse_steps, speech_url, summarize
from loadtest.texts import load_texts


def _add_workload_args(p: argparse.ArgumentParser) -> None:
    load = p.add_argument_group("load")
    load.add_argument("--concurrency", help="closed loop: comma-separated concurrency steps (default 1,4,16,64)")
    load.add_argument("--rate", help="open loop: comma-separated Poisson arrival rates, requests/s")
    load.add_argument("--duration", type=float, default=60.0, help="seconds each step holds its load (default 60)")
    load.add_argument("--warmup", type=int, default=2, help="requests sent first and left out of every figure (default 2)")
    load.add_argument("--max-outstanding", type=int, default=256,
                      help="open loop: arrivals beyond this many outstanding requests are dropped and counted (default 256)")
    load.add_argument("--seed", type=int, default=0, help="seed of the Poisson schedule (default 0)")
    load.add_argument("--honor-retry-after", action=argparse.BooleanOptionalAction, default=True,
                      help="closed loop: a user refused with 503 waits its Retry-After before its next request (default on)")
    req = p.add_argument_group("request")
    req.add_argument("--texts", default="short",
                     help="short | paragraphs | long | FILE (a text per line) | FILE:whole (default short)")
    req.add_argument("--format", default="pcm", dest="response_format",
                     help="response_format: pcm, mulaw, alaw (counted from bytes) or mp3, wav, flac, aac, opus "
                          "(decoded with PyAV)")
    req.add_argument("--sample-rate", type=int, default=None,
                     help="the body's `sample_rate` (8000 to 48000): audio at another rate than the model's 24 kHz")
    req.add_argument("--stream", action=argparse.BooleanOptionalAction, default=True,
                     help="ask for a streamed response (the body's `stream` field; default on)")
    req.add_argument("--sse", action="store_true", help="ask for SSE events (`stream_format: sse`); TTFA is the first audio delta")
    req.add_argument("--voice", default="af_heart")
    req.add_argument("--model", default="kokoro")
    req.add_argument("--speed", type=float, default=1.0)
    req.add_argument("--extra", default="", help="JSON object merged into every request body")
    req.add_argument("--api-key", default=os.environ.get("LOADTEST_API_KEY", ""),
                     help="sent as `Authorization: Bearer KEY` (default: $LOADTEST_API_KEY)")
    net = p.add_argument_group("timeouts")
    net.add_argument("--timeout", type=float, default=300.0, help="whole-request limit, seconds (default 300)")
    net.add_argument("--read-timeout", type=float, default=120.0, help="longest silence between reads (default 120)")
    net.add_argument("--connect-timeout", type=float, default=10.0)
    net.add_argument("--wait", type=float, default=0.0,
                     help="first wait up to this many seconds for the server to be ready (GET /ready, else /health)")
    out = p.add_argument_group("output")
    out.add_argument("--out", default="", help="result directory (default loadtest-results/<time>)")
    out.add_argument("--report", action="store_true", help="draw the plots into OUT/plots at the end")
    out.add_argument("--quiet", action="store_true", help="no progress bar")
    out.add_argument("--fail-on-error", action="store_true",
                     help="exit 1 when any request failed (503s excepted) or a step had no successful request")


def configure_run(p: argparse.ArgumentParser) -> None:
    p.add_argument("--url", required=True, help="server base URL (http://host:8880) or the full speech endpoint")
    p.add_argument("--label", default="", help="name of this server in outputs (default: host:port)")
    _add_workload_args(p)


def configure_compare(p: argparse.ArgumentParser) -> None:
    p.add_argument("--a", required=True, metavar="URL_A", help="first server (the reference of the ratios)")
    p.add_argument("--b", required=True, metavar="URL_B", help="second server")
    p.add_argument("--a-label", default="a")
    p.add_argument("--b-label", default="b")
    p.add_argument("--rounds", type=int, default=1,
                   help="split each step into this many A/B slice pairs, alternating order (default 1)")
    _add_workload_args(p)


def configure_report(p: argparse.ArgumentParser) -> None:
    p.add_argument("dir", help="a `run` or `compare` output directory")
    p.add_argument("--out", default="", help="where the PNGs go (default DIR/plots)")


def _workload(args: argparse.Namespace) -> Workload:
    extra = json.loads(args.extra) if args.extra else {}
    if not isinstance(extra, dict):
        raise ValueError("--extra must be a JSON object")
    if args.sample_rate:
        extra = {"sample_rate": args.sample_rate, **extra}
    return Workload(texts=load_texts(args.texts), voice=args.voice, model=args.model,
                    response_format=args.response_format, speed=args.speed, stream=args.stream, sse=args.sse,
                    extra=extra, timeout=args.timeout, read_timeout=args.read_timeout,
                    connect_timeout=args.connect_timeout, max_outstanding=args.max_outstanding, seed=args.seed,
                    honor_retry_after=args.honor_retry_after)


def _target(url: str, label: str, args: argparse.Namespace) -> Target:
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    return Target(url=speech_url(url), label=label or url.split("://", 1)[-1].split("/", 1)[0], headers=headers)


def _meta(args: argparse.Namespace, target: Target, steps: list[Step], command: str) -> dict[str, Any]:
    return {
        "command": command, "argv": sys.argv, "started": now_iso(), "machine": machine(),
        "label": target.label, "url": target.url,
        "texts": args.texts, "format": args.response_format, "stream": args.stream, "sse": args.sse,
        "voice": args.voice, "warmup": args.warmup, "max_outstanding": args.max_outstanding, "seed": args.seed,
        "steps": [{"kind": s.kind, "value": s.value, "duration_s": s.duration} for s in steps],
    }


def _out_dir(args: argparse.Namespace, command: str) -> Path:
    return Path(args.out or f"loadtest-results/{command}-{time.strftime('%Y%m%d-%H%M%S')}")


async def wait_ready(url: str, seconds: float) -> None:
    """Wait until the server is ready, or fail after `seconds`.

    Ready means GET /ready answers 200 (kokoro-fleet: weights loaded and warmed up); a server
    without /ready (404) counts as ready once GET /health answers at all. A /ready that answers
    anything but 503-with-Retry-After (still loading) fails at once with the server's message.
    """
    base = re.sub(r"/v1/audio/speech/?$", "", url)
    deadline = time.monotonic() + seconds
    last = "no answer"
    async with httpx.AsyncClient(timeout=5.0, trust_env=False) as client:
        while time.monotonic() < deadline:
            try:
                r = await client.get(base + "/ready")
                if r.status_code == 200:
                    return
                if r.status_code in (404, 405):
                    await client.get(base + "/health")
                    return
                last = f"/ready answered {r.status_code}: {r.text[:300]}"
                if r.status_code != 503 or "retry-after" not in r.headers:
                    # not "still loading, come back" (that 503 carries Retry-After): waiting won't help
                    raise SystemExit(f"loadtest: {base} is not ready: {last}")
            except httpx.HTTPError as exc:
                last = f"{type(exc).__name__}"
            await asyncio.sleep(0.5)
    raise SystemExit(f"loadtest: {base} was not ready within {seconds:g} s (--wait): {last}")


async def cache_warning(url: str) -> str | None:
    """A line to print when the server (all its workers: /metrics adds them up) has served chunks
    from its synthesis cache: a load test replays a few texts, so its figures then measure the cache."""
    base = re.sub(r"/v1/audio/speech/?$", "", url)
    try:
        async with httpx.AsyncClient(timeout=5.0, trust_env=False) as client:
            text = (await client.get(base + "/metrics")).text
    except httpx.HTTPError:
        return None
    m = re.search(r"^kokoro_replica_cache_hits_total (\S+)$", text, re.MULTILINE)
    hits = float(m.group(1)) if m else 0.0
    if hits <= 0:
        return None
    return (f"loadtest: warning: {base} has answered {hits:g} chunks from its synthesis cache: "
            "these figures include cached audio, not only synthesis; serve with KOKORO_SYNTHESIS_CACHE_MIB=0 to "
            "measure the engine")


def _failed(summaries: list[dict[str, Any]]) -> list[str]:
    return [f"{s['target']} {s['step']}: {s['errors']} errors, {s['ok']} ok {s['error_examples']}"
            for s in summaries if s["errors"] or not s["ok"]]


async def _run_async(args: argparse.Namespace) -> int:
    steps = parse_steps(args.concurrency, args.rate, args.duration)
    workload = _workload(args)
    target = _target(args.url, args.label, args)
    if args.wait:
        await wait_ready(target.url, args.wait)
    runner = Runner(workload, steps, progress=not args.quiet)
    summaries, rows = [], []
    try:
        rows += await runner.warmup(target, args.warmup, max(int(s.value) if s.kind == "closed" else 1 for s in steps))
        for step in steps:
            run = await runner.run_step(step, target)
            rows += run.rows
            s = summarize([run])
            if step.kind == "open":
                s["max_outstanding"] = workload.max_outstanding
            summaries.append(s)
    finally:
        await runner.aclose()
    out = write_results(_out_dir(args, "run"), rows, summaries, _meta(args, target, steps, "run"))
    print(format_summary_table(summaries))
    if (warning := await cache_warning(target.url)) is not None:
        print(warning, file=sys.stderr)
    print(f"results: {out}/requests.csv, {out}/summary.json")
    if args.report:
        from loadtest.report import make_plots

        print("plots: " + ", ".join(str(p) for p in make_plots(out)))
    failed = _failed(summaries)
    if args.fail_on_error and failed:
        print("loadtest: failures:\n  " + "\n  ".join(failed), file=sys.stderr)
        return 1
    return 0


def compare_ratios(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per step, B over A: throughput (audio s per wall s, requests/s), TTFA and E2E percentiles."""
    out = []
    for sa, sb in zip(a, b):
        out.append({
            "step": sa["step"],
            "audio_throughput_ratio": metrics.ratio(sb["audio_s_per_wall_s"], sa["audio_s_per_wall_s"]),
            "requests_per_s_ratio": metrics.ratio(sb["requests_per_s"], sa["requests_per_s"]),
            "ttfa_p50_ratio": metrics.ratio(sb["ttfa_s"]["p50"], sa["ttfa_s"]["p50"]),
            "ttfa_p95_ratio": metrics.ratio(sb["ttfa_s"]["p95"], sa["ttfa_s"]["p95"]),
            "e2e_p50_ratio": metrics.ratio(sb["e2e_s"]["p50"], sa["e2e_s"]["p50"]),
            "e2e_p95_ratio": metrics.ratio(sb["e2e_s"]["p95"], sa["e2e_s"]["p95"]),
            "rejection_rate_a": sa["rejection_rate"], "rejection_rate_b": sb["rejection_rate"],
        })
    return out


def format_ratios(ratios: list[dict[str, Any]], a_label: str, b_label: str) -> str:
    def f(x: float | None) -> str:
        return "-" if x is None else f"{x:.2f}"

    head = f"{'step':>9} {'audio/s':>8} {'req/s':>6} {'TTFA p50':>8} {'p95':>6} {'E2E p50':>7} {'p95':>6} {'503 a':>6} {'503 b':>6}"
    lines = [f"ratios {b_label} / {a_label} (throughput above 1: {b_label} serves more; latency below 1: {b_label} is faster)",
             head, "-" * len(head)]
    for r in ratios:
        lines.append(f"{r['step']:>9} {f(r['audio_throughput_ratio']):>8} {f(r['requests_per_s_ratio']):>6} "
                     f"{f(r['ttfa_p50_ratio']):>8} {f(r['ttfa_p95_ratio']):>6} {f(r['e2e_p50_ratio']):>7} "
                     f"{f(r['e2e_p95_ratio']):>6} {100 * r['rejection_rate_a']:>5.1f}% {100 * r['rejection_rate_b']:>5.1f}%")
    return "\n".join(lines)


async def _compare_async(args: argparse.Namespace) -> int:
    if args.a_label == args.b_label:
        raise ValueError("--a-label and --b-label must differ")
    steps = parse_steps(args.concurrency, args.rate, args.duration)
    workload = _workload(args)
    a, b = _target(args.a, args.a_label, args), _target(args.b, args.b_label, args)
    if args.wait:
        await asyncio.gather(wait_ready(a.url, args.wait), wait_ready(b.url, args.wait))
    runner = Runner(workload, steps, progress=not args.quiet)
    rows: dict[str, list] = {a.label: [], b.label: []}
    runs: dict[str, list] = {a.label: [], b.label: []}
    rounds = max(1, args.rounds)
    try:
        most = max(int(s.value) if s.kind == "closed" else 1 for s in steps)
        for t in (a, b):
            rows[t.label] += await runner.warmup(t, args.warmup, most)
        for si, step in enumerate(steps):
            per_target: dict[str, list] = {a.label: [], b.label: []}
            for r in range(rounds):
                # ABBA: alternate who goes first so drift over the run (thermal, other load) hits both alike
                order = (a, b) if (si + r) % 2 == 0 else (b, a)
                for t in order:
                    run = await runner.run_step(step, t, duration=step.duration / rounds, text_offset=r * 1000)
                    per_target[t.label].append(run)
                    rows[t.label] += run.rows
            for t in (a, b):
                s = summarize(per_target[t.label])
                if step.kind == "open":
                    s["max_outstanding"] = workload.max_outstanding
                runs[t.label].append(s)
    finally:
        await runner.aclose()
    out = _out_dir(args, "compare")
    for t in (a, b):
        write_results(out / _safe(t.label), rows[t.label], runs[t.label], _meta(args, t, steps, "compare"))
    ratios = compare_ratios(runs[a.label], runs[b.label])
    with open(out / "compare.json", "w", encoding="utf-8") as f:
        json.dump({"a": {"label": a.label, "url": a.url}, "b": {"label": b.label, "url": b.url},
                   "started": now_iso(), "machine": machine(), "rounds": rounds, "steps": ratios}, f, indent=2)
        f.write("\n")
    print(format_summary_table(runs[a.label] + runs[b.label]))
    for t in (a, b):
        if (warning := await cache_warning(t.url)) is not None:
            print(warning, file=sys.stderr)
    print()
    print(format_ratios(ratios, a.label, b.label))
    print(f"results: {out}/{_safe(a.label)}, {out}/{_safe(b.label)}, {out}/compare.json")
    if args.report:
        from loadtest.report import make_plots

        print("plots: " + ", ".join(str(p) for p in make_plots(out)))
    failed = _failed(runs[a.label] + runs[b.label])
    if args.fail_on_error and failed:
        print("loadtest: failures:\n  " + "\n  ".join(failed), file=sys.stderr)
        return 1
    return 0


def _safe(label: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", label) or "target"


def run_run(args: argparse.Namespace) -> int:
    return asyncio.run(_run_async(args))


def run_compare(args: argparse.Namespace) -> int:
    return asyncio.run(_compare_async(args))


def run_report(args: argparse.Namespace) -> int:
    from loadtest.report import make_plots

    for path in make_plots(args.dir, args.out or None):
        print(path)
    return 0


def _configure_selftest(p: argparse.ArgumentParser) -> None:
    from loadtest import selftest

    selftest.configure(p)


def _run_selftest(args: argparse.Namespace) -> int:
    from loadtest import selftest

    return selftest.run(args)


def _configure_live(p: argparse.ArgumentParser) -> None:
    from loadtest import live_load as live

    live.configure(p)


def _run_live(args: argparse.Namespace) -> int:
    from loadtest import live_load as live

    return live.run(args)


def _configure_soak(p: argparse.ArgumentParser) -> None:
    from loadtest import soak

    soak.configure(p)


def _run_soak(args: argparse.Namespace) -> int:
    from loadtest import soak

    return soak.run(args)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtest",
                                     description="Load tests that measure what a listener feels (TTFA, E2E, underrun).")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, conf, runner, help_text in (
        ("run", configure_run, run_run, "one server: a concurrency sweep or Poisson arrival rates"),
        ("compare", configure_compare, run_compare, "two servers, the same schedule interleaved, with ratios"),
        ("report", configure_report, run_report, "draw PNG plots of a run or compare directory"),
        ("selftest", _configure_selftest, _run_selftest, "measure the generator's own TTFA error against a stub server"),
        ("live", _configure_live, _run_live, "live speech sessions fed as a model writes: latency, stalls"),
        ("soak", _configure_soak, _run_soak, "mixed load for a set time on fleets it starts: memory, descriptors, Redis keys"),
    ):
        p = sub.add_parser(name, help=help_text, description=help_text,
                           formatter_class=argparse.ArgumentDefaultsHelpFormatter if name == "report" else argparse.HelpFormatter)
        conf(p)
        p.set_defaults(_run=runner)
    args = parser.parse_args(argv)
    try:
        return int(args._run(args) or 0)
    except ValueError as exc:
        parser.error(str(exc))
        return 2
