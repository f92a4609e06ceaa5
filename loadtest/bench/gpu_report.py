"""The GPU harness's report (loadtest/bench/gpu_harness.py): the steps' figures gathered from what
each wrote, as DIR/gpu_results.json and DIR/gpu_results.md, and what the steps after the smoke
fall back to. Every table says how its figures ran: compiled or eager, graphs captured and
replayed or not, the card and the torch version (the engines' `run_report()`).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
from pathlib import Path

from loadtest.bench.compile_artifacts import FILE_LIMIT

ARTIFACTS = "compile-artifacts-{step}.bin"
# gpu_smoke.py's phases before its engine is ready: a smoke that stopped in one compiled and captured nothing
PHASES_BEFORE_READY = ("started", "weights", "warmup")  # the steps that compile: the smoke (single chunks), batch
FILES_BACK = 8              # files that come back from a device call
# The steps' own files worth keeping beside the report (their figures are in gpu_results.json too):
# the fleet's log holds the serve log's head, tail and start-up lines, the only record of where a
# slow start or a failure went.
KEPT = {"fleet/gpu_fleet.log": "fleet.log"}
STEP_FILES = {"batch": "batch.json", "arithmetic": "arithmetic.json", "startup": "startup.json",
              "check": "check.json", "bench": "check.json.bench.json", "replicas": "replicas.json",
              "fleet": "fleet/gpu_fleet.json"}
OUT_FILES = {"smoke": "smoke.json", "faults": "faults.json"}


def read_json(path: Path):
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def write_json(path: Path, value) -> None:
    """Whole or not at all: a reader (the harness, every few seconds) never sees half a file."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(value, indent=2, default=str), encoding="utf-8")
    os.replace(tmp, path)


def last_line(error) -> str:
    """An exception's, or a traceback's, last line: what a report says of a failure."""
    text = error if isinstance(error, str) else f"{type(error).__name__}: {error}"
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1][:300] if lines else ""


def fallback(smoke: dict | None, cpu: bool, compile_off: bool = False) -> dict:
    """What the steps after the smoke run, from what it found: compiled passes only if it compiled
    them, CUDA graphs (single chunks, batches) only if it captured them, on the compile cache it
    used. `why` names a fallback ('' when there is none) with the smoke's phase where it failed and
    the exception's last line."""
    if smoke is None:
        return {"compiled": False, "graphs": False, "batch_graphs": False, "compile_dir": None,
                "why": "no smoke figures (smoke.json never written): eager passes, no graphs"}
    compile_ = smoke.get("compile") or {}
    graphs = smoke.get("graphs") or {}
    compiled = compile_.get("ok") is True and not compile_off
    single = (graphs.get("single") or {}).get("ok") is True
    batch = (graphs.get("batch") or {}).get("ok") is True
    why = []
    phase = smoke.get("failed_phase") or smoke.get("phase")
    stopped = phase if phase in PHASES_BEFORE_READY else None
    if stopped:  # before the engine was ready: nothing compiled or captured
        cause = last_line(smoke["error"]) if smoke.get("error") else "no exception: stopped at its limit"
        why.append(f"the smoke failed in its {stopped} phase ({cause}): eager passes, no graphs")
    else:
        if compile_.get("wanted") and not compiled and not compile_off:
            cause = last_line(compile_.get("error") or smoke.get("error") or "") or "no exception: stopped at its limit"
            why.append("the smoke's compile " + ("failed" if compile_.get("ok") is False else "did not finish")
                       + f" in its warmup phase ({cause}): eager batches and the uncompiled tests")
        if not cpu and (graphs.get("single") or {}).get("wanted") and not single:
            cause = last_line(graphs["single"].get("error") or "") or "no exception"
            why.append(f"the smoke's capture of single-chunk graphs failed ({cause}): no CUDA graphs")
        elif not cpu and compiled and (graphs.get("batch") or {}).get("wanted") and not batch:
            cause = last_line(graphs["batch"].get("error") or "") or "no exception"
            why.append(f"the smoke's capture of batch graphs failed ({cause}): compiled batches without graphs")
    # batch graphs: where the smoke's serving engine did not want them (serve's default batch bound is
    # 1), the batch step tries them once the single-chunk graphs captured
    batch_tried = (graphs.get("batch") or {}).get("wanted")
    return {"compiled": compiled, "graphs": single, "batch_graphs": single and compiled and (batch or not batch_tried),
            "compile_dir": (smoke.get("configuration") or {}).get("compile_cache_dir"), "why": "; ".join(why)}


def collect(work: Path, summary: dict, out: Path | None = None) -> dict:
    figures = dict(summary)
    for name, file in OUT_FILES.items():
        value = read_json((out or work) / file)
        if value is not None:
            figures[name] = value
    for name, file in STEP_FILES.items():
        value = read_json(work / file)
        if value is not None:
            figures[name] = value
    with contextlib.suppress(OSError):
        figures["fleet_markdown"] = (work / "fleet" / "gpu_fleet.md").read_text(encoding="utf-8")
    tests = pytest_results(work / "tests.xml", work / "tests.log")
    if tests:
        figures["tests"] = tests
    return figures


def pytest_results(xml: Path, log: Path) -> dict | None:
    """Counts and failures from the junit XML, or from `pytest -v`'s lines when the step was stopped
    before pytest wrote the XML (every test's result is in the log as it finishes)."""
    if xml.exists():
        import xml.etree.ElementTree as ET

        with contextlib.suppress(ET.ParseError):
            suite = ET.parse(xml).getroot()
            suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
            failed = []
            for case in suite.iter("testcase"):
                problem = case.find("failure") if case.find("failure") is not None else case.find("error")
                if problem is not None:
                    failed.append(f"{case.get('name')}: {problem.get('message', '')[:300]}")
            return {**{k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")},
                    "failed": failed, "source": "junit xml"}
    try:
        text = log.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    results = re.findall(r"^(\S+::\S+) (PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)", text, flags=re.M)
    if not results:
        return None
    by = [outcome for _, outcome in results]
    return {"tests": len(results), "failures": by.count("FAILED"), "errors": by.count("ERROR"),
            "skipped": by.count("SKIPPED"), "failed": [name for name, o in results if o in ("FAILED", "ERROR")],
            "source": "pytest -v lines (no XML: stopped before the end)"}


def write(out: Path, work: Path, summary: dict) -> str:
    """gpu_results.json and gpu_results.md in `out`, and the kept logs beside them; returns the markdown."""
    for source, name in KEPT.items():
        if (work / source).is_file():
            with contextlib.suppress(OSError):
                shutil.copyfile(work / source, out / name)
    figures = collect(work, summary, out)
    write_json(out / "gpu_results.json", figures)
    text = markdown(figures)
    (out / "gpu_results.md").write_text(text, encoding="utf-8")
    return text


def out_problems(out: Path) -> list[str]:
    """What would not come back from a device call: more than FILES_BACK files, or one over 16 MiB."""
    files = [p for p in out.rglob("*") if p.is_file() and not p.name.startswith(".")]
    problems = [f"{p.name} is {p.stat().st_size / 2**20:.1f} MiB (over 16 MiB: it will not come back)"
                for p in files if p.stat().st_size >= FILE_LIMIT]
    if len(files) > FILES_BACK:
        problems.append(f"{len(files)} files in {out} (at most {FILES_BACK} come back)")
    return problems


# --- markdown --------------------------------------------------------------------------------------------


def _f(value, spec: str = ".0f", none: str = "-") -> str:
    return none if value is None else format(value, spec)


def how_it_ran(report: dict | None) -> str:
    """One engine's `run_report()` in words: compiled or eager, graphs captured and replayed."""
    if not report:
        return "how it ran: not reported"
    graphs = report.get("graphs") or {}
    parts = [f"{report.get('dtype')} on {report.get('card') or report.get('device')}, torch {report.get('torch')}",
             "compiled" if report.get("compiled") else "eager (not compiled)",
             f"stage 2 {report.get('stage2')}"]
    for kind in ("single", "batch"):
        g = graphs.get(kind) or {}
        if not g.get("wanted"):
            parts.append(f"{kind}-chunk graphs not wanted" if kind == "single" else "no batch graphs")
        elif g.get("error"):
            parts.append(f"{kind} graphs FAILED ({str(g['error'])[:120]})")
        else:
            parts.append(f"{g.get('captured')} {kind} graphs captured, {g.get('replays', 0)} replays")
    compile_ = report.get("compile")
    if compile_:
        parts.append(f"compile: {'loaded' if compile_.get('loaded') else 'compiled'} in {_f(compile_.get('seconds'), '.1f')} s, "
                     f"{compile_.get('graphs_compiled')} graphs compiled, {compile_.get('graphs_loaded')} loaded, "
                     f"dynamo compiles {compile_.get('dynamo_compiles', '-')}, recompiles {_count(compile_.get('recompiles'))}")
    return "; ".join(parts)


def _count(value) -> str:
    return str(len(value)) if isinstance(value, list) else str(value if value is not None else "-")


def markdown(figures: dict) -> str:
    env = figures.get("environment") or {}
    title = env.get("gpu") or ("CPU rehearsal" if figures.get("rehearsal") else "no GPU")
    lines = [f"# GPU harness: {title}", ""]
    if figures.get("rehearsal"):
        lines += [f"**Rehearsal on the CPU ({figures['rehearsal']})**: {env.get('host_cpu')}, {env.get('cores')} cores; "
                  "tiny weights, no CUDA graphs, no MPS, torch.compile through dynamo's eager backend. The figures "
                  "check the plumbing, not the speed.", ""]
    fallbacks = [f"{name}: {s['fallback']}" for name, s in figures.get("steps", {}).items() if s.get("fallback")]
    if fallbacks:
        lines += ["**Fallbacks:** " + "; ".join(fallbacks), ""]
    bundle = figures.get("bundle")
    if bundle:
        lines += [f"Bundle: {bundle.get('status')}" + (f" in {bundle['seconds']} s" if bundle.get("seconds") else "")
                  + (f" ({bundle['error']})" if bundle.get("error") else "") + ".", ""]
    lines += [f"torch {env.get('torch')}, python {env.get('python')}; {env.get('nvidia_smi', 'no nvidia-smi')}; "
              f"host {env.get('host_cpu')}, {env.get('cores')} cores", "",
              "| step | status | seconds | limit s | fallback or why |", "|---|---|---|---|---|"]
    for name, s in figures.get("steps", {}).items():
        lines.append(f"| {name} | {s['status']} | {s.get('seconds', '-')} | {s.get('limit_s', '-')} | "
                     f"{s.get('fallback') or s.get('why') or ''} |")
    if figures.get("stopped"):
        lines += ["", f"**The harness was stopped ({figures['stopped']})**: the figures are those measured before."]
    for key, section in (("smoke", smoke_markdown), ("batch", batch_markdown), ("arithmetic", arithmetic_markdown),
                         ("tests", tests_markdown), ("startup", startup_markdown)):
        if figures.get(key):
            lines += section(figures[key])
    if figures.get("fleet_markdown"):
        lines += ["", "## The whole fleet (kokoro-fleet serve, its GPU defaults)", "", figures["fleet_markdown"]]
    if figures.get("faults"):
        from loadtest.bench.gpu_faults import markdown as faults_markdown

        lines += ["", "## Faults: out of memory in a pass, a replica SIGKILLed under MPS", "",
                  faults_markdown(figures["faults"])]
    lines += check_markdown(figures)
    return "\n".join(lines) + "\n"


def smoke_markdown(smoke: dict) -> list[str]:
    c, g, conf = smoke.get("compile") or {}, smoke.get("graphs") or {}, smoke.get("configuration") or {}
    lines = ["", f"## Smoke: one engine in the serving configuration (phase reached: {smoke.get('phase')})", "",
             f"{conf.get('dtype')} on {conf.get('device')}, compile {conf.get('compile')}, CUDA graphs "
             f"{conf.get('cuda_graphs')}, batches up to {conf.get('batch_max')}, stage 2 {conf.get('stage2')}; "
             f"compile cache {conf.get('compile_cache_dir')}", "",
             "| what | result |", "|---|---|"]
    if c.get("wanted"):
        reasons = c.get("recompile_reasons") or []
        lines.append(f"| compile | {'ok' if c.get('ok') else 'FAILED' if c.get('ok') is False else 'unfinished'}: "
                     f"{'loaded' if c.get('loaded') else 'compiled'} in {_f(c.get('seconds'), '.1f')} s "
                     f"({c.get('graphs_compiled')} graphs compiled, {c.get('graphs_loaded')} loaded; dynamo compiles "
                     f"{c.get('dynamo_compiles', '-')}, recompiles {_count(c.get('recompiles'))})"
                     + (f"; {c['error']}" if c.get("error") else "") + " |")
        for reason in reasons[:5]:
            lines.append(f"| recompile reason | `{str(reason)[:200]}` |")
    else:
        lines.append("| compile | off |")
    for kind in ("single", "batch"):
        k = g.get(kind) or {}
        lines.append(f"| {kind}-chunk graphs | " + ("not wanted" if not k.get("wanted") else
                     f"{'ok' if k.get('ok') else 'FAILED'}: {k.get('captured')} captured"
                     + (f"; {k['error']}" if k.get("error") else "")) + " |")
    for check in (smoke.get("checks") or {}).get("rows", []):
        lines.append(f"| {check['what']} | {'ok' if check['ok'] else 'FAILED'}: {check['detail']} |")
    art = smoke.get("artifacts") or {}
    if art:
        lines.append(f"| compile cache artifacts | {art.get('saved') or art.get('why')}"
                     + (f" ({art['bytes'] / 2**20:.1f} MiB)" if art.get("bytes") else "")
                     + (f"; loaded {art['loaded_from']}" if art.get("loaded_from") else "") + " |")
    memory = smoke.get("memory") or {}
    lines.append(f"| ready after | {_f(smoke.get('ready_s'), '.1f')} s (weights {_f(smoke.get('weights_s'), '.1f')} s), "
                 + (f"{_f(memory.get('reserved_mib'))} MiB reserved by torch |" if "reserved_mib" in memory else
                    f"{_f(memory.get('max_rss_mib'))} MiB resident at most |"))
    if smoke.get("error"):
        lines += ["", f"**Smoke error:** {smoke['error']}"]
    return lines


def batch_markdown(batch: dict) -> list[str]:
    meta = batch.get("meta") or {}
    lines = ["", f"## Batched forward pass ({meta.get('dtype')}, chunks of about {meta.get('batch_phonemes')} phonemes, "
                 f"{meta.get('gpu') or meta.get('cpu')}, torch {meta.get('torch')}, stage 2 {meta.get('stage2')})", "",
             "| batch | audio-s/s eager batch | audio-s/s served batch | served p50 ms | audio-s/s one by one | "
             "speed-up |", "|---|---|---|---|---|---|"]
    for size, r in (batch.get("batch") or {}).items():
        served = r.get("served") or r.get("compiled") or {}
        lines.append(f"| {size} | {_f(r['batched']['audio_s_per_s'])} | {_f(served.get('audio_s_per_s'))} | "
                     f"{_f(1000 * served['latency_p50_s'] if 'latency_p50_s' in served else None, '.1f')} | "
                     f"{_f(r['one_by_one']['audio_s_per_s'])} | {r['speedup']:.2f}x |")
    graphs = (meta.get("compiled") or {}).get("batch_graphs")
    if graphs:
        lines += ["", f"Batch graphs: {graphs['count']} (batch buckets {graphs.get('batch_buckets')}) captured in "
                      f"{_f(graphs.get('capture_s'), '.1f')} s, {_f(graphs.get('mib'))} MiB allocated, "
                      f"{_f(graphs.get('reserved_mib'))} MiB reserved by torch in all"]
    lone = batch.get("lone")
    if lone:
        lines += ["", f"A lone {lone['phonemes']}-phoneme chunk ({lone['audio_s']:.2f} s of audio), {lone['runs']} runs on "
                      f"the served engine: p50 **{1000 * lone['p50_s']:.1f} ms**, p95 {1000 * lone['p95_s']:.1f} ms"]
    engines = meta.get("engines") or {}
    if engines:
        lines += [""] + [f"- {name}: {how_it_ran(report)}" for name, report in engines.items()]
    return lines


def arithmetic_markdown(result: dict) -> list[str]:
    meta = result.get("meta") or {}
    lines = ["", f"## Stage-2 arithmetic, eager batches ({meta.get('dtype')}, {meta.get('gpu') or meta.get('cpu')})", "",
             "| batch | arithmetic | audio-s/s | p50 ms | against exact one by one: log-spectral distance dB | "
             "durations equal |", "|---|---|---|---|---|---|"]
    for size, r in (result.get("batch") or {}).items():
        for mode, m in (r.get("arithmetic") or {}).items():
            lines.append(f"| {size} | {mode} | {_f(m.get('audio_s_per_s'))} | {_f(1000 * m['latency_p50_s'], '.1f')} | "
                         f"{_f(m.get('lsd_db'), '.3f')} | {m.get('durations_equal')} |")
    return lines


def tests_markdown(t: dict) -> list[str]:
    lines = ["", f"tests/unit/test_engine_gpu.py: {t['tests']} tests, {t['failures']} failed, {t['errors']} errors, "
                 f"{t['skipped']} skipped ({t.get('source')})"]
    lines += [f"- FAILED {name}" for name in t.get("failed", [])[:20]]
    return lines


def startup_markdown(startup: dict) -> list[str]:
    lines = ["", f"## Start-up: {startup.get('workers')} serving engines together on the warm cache", "",
             "| engine | compiled or loaded | compile s | waited s | ready s | reserved MiB | how it ran |",
             "|---|---|---|---|---|---|---|"]
    rows = [(f"together #{k}", r) for k, r in enumerate(startup.get("together") or [])]
    if startup.get("alone_warm") is not None:
        rows.append(("alone, warm", startup["alone_warm"]))
    for name, r in rows:
        if r is None or r.get("error"):
            lines.append(f"| {name} | FAILED {'' if r is None else r['error'][:120]} | - | - | - | - | - |")
            continue
        lines.append(f"| {name} | {'loaded' if r.get('loaded') else 'compiled'} | {_f(r.get('compile_s'), '.1f')} | "
                     f"{_f(r.get('waited_s'), '.1f')} | {_f(r.get('ready_s'), '.1f')} | {_f(r.get('reserved_mib'))} | "
                     f"{'-' if 'engine' not in r else how_it_ran(r['engine'])} |")
    if startup.get("all_ready_s") is not None:
        lines += ["", f"Every engine ready or failed after {startup['all_ready_s']:.1f} s"]
    return lines


def check_markdown(figures: dict) -> list[str]:
    """The steps outside the prepared calls (`--steps check,replicas`)."""
    lines = []
    check = figures.get("check")
    if check:
        from loadtest.bench.gpu_parity import PADDING_BOUND_DB, PRECISION_BOUND_DB

        lines += ["", "## Parity (full-size random weights)", "", "| check | tokens | result |", "|---|---|---|"]
        for row in check.get("parity", []):
            lines.append(f"| graphed vs eager fp32 | {row['tokens']} | replays the padded eager run exactly "
                         f"{row['replays_padded_eager_exactly']}; against the unpadded run durations equal "
                         f"{row['durations_equal']}, log-spectral distance {row['lsd_db']:.3f} dB (bound "
                         f"{PADDING_BOUND_DB}), SNR {row['snr_db']:.1f} dB |")
        for row in check.get("precision", []):
            lines.append(f"| {row['dtype']} graphed vs fp32 eager | {row['tokens']} | durations within 1 frame "
                         f"{row['durations_within_1']:.1%}, log-spectral distance {row['lsd_db']:.2f} dB (bound "
                         f"{PRECISION_BOUND_DB}) |")
        if "noise_reproducible" in check:
            lines.append(f"| noise on, same input twice | 40 | identical {check['noise_reproducible']} |")
        lines += ["", "| dtype | capture s | graphs MiB | stage-1 / stage-2 graphs |", "|---|---|---|---|"]
        for dtype, c in check.get("capture", {}).items():
            lines.append(f"| {dtype} | " + ("FAILED | - | - |" if c is None else
                                            f"{c['seconds']:.1f} | {c['mib']:.0f} | {c['stage1_graphs']} / {c['stage2_graphs']} |"))
        if check.get("failures"):
            lines += ["", "FAILED: " + "; ".join(check["failures"])]
    bench = figures.get("bench")
    if bench:
        lines += ["", "## Engine: one chunk at a time (python -m loadtest.bench --device cuda)", "",
                  "| phonemes | audio s | contender | p50 ms | p95 ms | audio-s/s (x real time) |", "|---|---|---|---|---|---|"]
        for size, by_name in bench["results"].items():
            for name, r in by_name.items():
                lines.append(f"| {size} | {r['audio_s']:.2f} | {name} | {1000 * r['p50_s']:.1f} | {1000 * r['p95_s']:.1f} | "
                             f"{r['audio_s_per_s']:.0f} |")
        peak = bench["meta"].get("peak_memory_bytes", {})
        if peak:
            lines += ["", "Peak GPU memory per engine (torch allocator; the CUDA context adds ~500 MiB): "
                      + ", ".join(f"{n} {b / 2**20:.0f} MiB" for n, b in peak.items())]
    replicas = figures.get("replicas")
    if replicas:
        from loadtest.bench.replica_sweep import markdown as replica_table

        lines += ["", "## Replicas: N engine processes on one GPU (bf16, CUDA graphs, chunk mix "
                      f"{replicas[0].get('chunk_mix')} phonemes)", "", replica_table(replicas)]
    return lines
