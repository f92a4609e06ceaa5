"""Speech while a voice is fitted: `python -m loadtest.bench.voice_fit_speech [--requests N]`.

A real server (`kokoro-fleet serve`, the offline weights, `--workers` Uvicorn workers) answers
short streaming speech requests sent one at a time, each on its own connection as separate users'
would be, in phases of the same texts: before a fit; during a fit (`POST /v1/audio/voices` with
20 s of a stock voice's speech, at the server's own fitting settings), first while its child
process loads the model, then while it fits (hears the stock voices, mixes, refines); and after it
(the job cancelled). It reports the time to first audio (p50/p95) of each phase side by side, so
what the fit costs speech is read against the machine's own drift in the same run; the fit's
progress meanwhile; and how the fit really ran: the niceness of every thread of its child process,
read from /proc while it ran, against the replicas' inference niceness (KOKORO_INFERENCE_NICE).

Writes `--out/requests.csv` (one row per request), `summary.json` and `table.md`; the server's log
stays beside its voices directory in a temporary folder (printed).
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import json
import os
import tempfile
import time
from pathlib import Path

import httpx

from loadtest.bench.voice_fit import RECORDING, _cpu_model
from loadtest.client import RequestResult, RequestSpec, make_client, send_speech
from loadtest.dispatch import FleetProcess
from loadtest.listener_metrics import distribution
from loadtest.texts import load_texts

RESULTS = Path(__file__).resolve().parents[1] / "results"
PHASES = ("before", "loading", "during", "after")
FIT_NAME = "bf_benchfit"


def thread_niceness(pid: int) -> dict[str, int]:
    """thread id -> niceness of each thread of process `pid` now (field 19 of /proc/PID/task/TID/stat)."""
    nice = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            stat = (task / "stat").read_text()
        except OSError:
            continue
        nice[task.name] = int(stat[stat.rindex(")") + 2:].split()[16])  # fields after "(comm)", from the 3rd
    return nice


class FitWatch:
    """The fitting job as the voices directory holds it (read from its state file, so watching it
    sends the server nothing), and the niceness of its child's threads, sampled as it runs."""

    def __init__(self, voices_dir: Path, job_id: str):
        self.path = voices_dir / ".fit-jobs" / f"{job_id}.json"
        self.niceness: dict[str, int] = {}

    def state(self) -> dict:
        try:
            job = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {"status": "queued"}
        if job.get("pid") and job["status"] == "running":
            try:
                self.niceness.update(thread_niceness(job["pid"]))
            except OSError:
                pass
        return job


async def one_request(text: str, url: str, index: int, phase: str, fit: FitWatch | None) -> dict:
    async with make_client(1) as client:
        spec = RequestSpec(url=url + "/v1/audio/speech", text=text, voice="af_heart", response_format="pcm",
                           stream=True, headers={"Connection": "close"})
        job = fit.state() if fit else {}
        result = await send_speech(client, spec, RequestResult(target="server", step=phase, index=index,
                                                               request_id=f"{phase}-{index}"))
        after = fit.state() if fit else {}
    progress = after.get("progress") or {}
    return {"phase": phase, "index": index, "text": text, "status": result.status, "ttfa_s": result.ttfa_s,
            "e2e_s": result.e2e_s, "audio_s": round(result.audio_s, 3), "error": result.error[:200],
            "fit_status": job.get("status", ""), "fit_status_after": after.get("status", ""),
            "fit_phase": progress.get("phase", ""), "fit_done": progress.get("done", ""),
            "load_1m": os.getloadavg()[0]}


async def phase_requests(texts: list[str], url: str, phase: str, pause_s: float, fit: FitWatch | None = None,
                         until=None) -> list[dict]:
    """Each text once, one request at a time; with `until`, only while it says the phase lasts."""
    rows = []
    for index, text in enumerate(texts):
        if until is not None and not until():
            break
        rows.append(await one_request(text, url, index, phase, fit))
        await asyncio.sleep(pause_s)
    return rows


def speech_sample(url: str, voice: str) -> bytes:
    """About 20 s of a stock voice reading the benchmark's story, from the server itself (WAV)."""
    answer = httpx.post(url + "/v1/audio/speech", timeout=300, trust_env=False, json={
        "model": "kokoro", "voice": voice, "input": RECORDING, "response_format": "wav", "stream": False})
    answer.raise_for_status()
    return answer.content


def summarize(rows: list[dict], machine: dict, fit: dict) -> dict:
    phases = {}
    for phase in PHASES:
        mine = [r for r in rows if r["phase"] == phase]
        if phase in ("loading", "during"):  # only requests the fit ran through, from sending to their last byte
            mine = [r for r in mine if r["fit_status"] == "running" and r["fit_status_after"] == "running"]
        ok = [r for r in mine if r["status"] == 200]
        ttfa = distribution([r["ttfa_s"] for r in ok])
        phases[phase] = {"requests": len(mine), "ok": len(ok),
                         "ttfa_p50_s": ttfa["p50"], "ttfa_p95_s": ttfa["p95"], "ttfa_max_s": ttfa["max"],
                         "e2e_p50_s": distribution([r["e2e_s"] for r in ok])["p50"],
                         "load_1m_mean": round(sum(r["load_1m"] for r in mine) / max(len(mine), 1), 2)}
    ratios = {}
    for figure in ("ttfa_p50_s", "ttfa_p95_s"):  # while it fits, against the mean of before and after
        baseline = [phases[p][figure] for p in ("before", "after") if phases[p][figure] is not None]
        during = phases["during"][figure]
        ratios[f"{figure[:-2]}_during_over_without"] = (round(during / (sum(baseline) / len(baseline)), 3)
                                                        if baseline and during is not None else None)
    return {"machine": machine, "fit": fit, "phases": phases, **ratios}


def table(summary: dict) -> str:
    lines = ["| phase | requests (200) | first audio p50 | first audio p95 | first audio max | whole answer p50 | load (1 min) |",
             "|---|---|---|---|---|---|---|"]
    for phase, p in summary["phases"].items():
        cells = [f"{p[k] * 1000:.0f} ms" if p[k] is not None else "-" for k in
                 ("ttfa_p50_s", "ttfa_p95_s", "ttfa_max_s", "e2e_p50_s")]
        label = {"before": "before the fit", "loading": "during the fit: its child loading the model",
                 "during": "during the fit: fitting (after loading)", "after": "after it (cancelled)"}[phase]
        lines.append(f"| {label} | {p['requests']} ({p['ok']}) | {' | '.join(cells)} | {p['load_1m_mean']} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtest.bench.voice_fit_speech",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=20, help="short requests per phase")
    parser.add_argument("--workers", type=int, default=2, help="the server's Uvicorn workers (replicas)")
    parser.add_argument("--weights", default="offline")
    parser.add_argument("--sample-voice", default="bf_emma", help="the stock voice whose speech is the recording")
    parser.add_argument("--pause", type=float, default=0.3, help="seconds between two requests")
    parser.add_argument("--out", type=Path, default=RESULTS / f"{time.strftime('%Y-%m-%d')}-voice-fit-speech")
    args = parser.parse_args(argv)

    texts = (load_texts("short") * args.requests)[:args.requests]
    voices_dir = Path(tempfile.mkdtemp(prefix="kokoro-voice-fit-speech-"))
    args.out.mkdir(parents=True, exist_ok=True)
    server = FleetProcess(args.workers, weights=args.weights, env={"KOKORO_VOICES_DIR": str(voices_dir)},
                          log_dir=voices_dir, name="server")
    machine = {"cpu": _cpu_model(), "cores": os.cpu_count(), "load_average_at_start": os.getloadavg(),
               "workers": args.workers, "weights": args.weights}
    try:
        server.start(ready_timeout=600, warm_up=texts[:2 * args.workers])
        sample = speech_sample(server.url, args.sample_voice)
        rows = asyncio.run(phase_requests(texts, server.url, "before", args.pause))

        started = httpx.post(server.url + "/v1/audio/voices", timeout=120, trust_env=False,
                             files={"file": ("sample.wav", sample, "audio/wav")}, data={"name": FIT_NAME})
        started.raise_for_status()
        job_id = started.json()["id"]
        watch = FitWatch(voices_dir, job_id)
        deadline = time.monotonic() + 120
        while watch.state()["status"] == "queued" and time.monotonic() < deadline:
            time.sleep(0.1)
        fit_started = time.monotonic()

        def fit_phase() -> str:
            job = watch.state()
            return "" if job["status"] != "running" else (job.get("progress") or {}).get("phase", "loading")

        # while the child loads the model (and the stock voices' measures), then while it searches
        rows += asyncio.run(phase_requests(texts, server.url, "loading", args.pause, watch,
                                           until=lambda: fit_phase() == "loading"))
        while fit_phase() == "loading":
            time.sleep(0.2)
        rows += asyncio.run(phase_requests(texts, server.url, "during", args.pause, watch,
                                           until=lambda: fit_phase() not in ("", "loading")))
        job = watch.state()
        fit = {"job": job_id, "status_at_end_of_phase": job["status"], "progress": job.get("progress"),
               "seconds_watched": round(time.monotonic() - fit_started, 1),
               "child_thread_niceness": sorted(set(watch.niceness.values())),
               "child_threads_seen": len(watch.niceness)}
        if job["status"] == "running":
            httpx.delete(server.url + f"/v1/audio/voices/jobs/{job_id}", timeout=30, trust_env=False)
            deadline = time.monotonic() + 60
            while watch.state()["status"] == "running" and time.monotonic() < deadline:
                time.sleep(0.2)
        rows += asyncio.run(phase_requests(texts, server.url, "after", args.pause))
        log = server.log_path.read_text(errors="replace")
        machine["replica_niceness"] = next((line.split("niceness ")[1].strip() for line in log.splitlines()
                                            if "inference thread(s)" in line and "niceness" in line), "")
    finally:
        server.stop()
    machine["load_average_at_end"] = os.getloadavg()
    with open(args.out / "requests.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    summary = summarize(rows, machine, fit)
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1))
    (args.out / "table.md").write_text(table(summary))
    print(f"server log: {server.log_path}")
    print(json.dumps({k: v for k, v in summary.items() if k != "phases"}, indent=1))
    print(table(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
