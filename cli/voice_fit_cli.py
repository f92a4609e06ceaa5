"""`kokoro-fleet voice fit sample.wav --name af_mine`: a voice of your own from a recording.

Fits a Kokoro voice to 10-60 s of one speaker (worker/voice_fit), with a progress bar on stderr
(candidates heard, the best score so far, time left), and writes NAME.pt into the voices directory
(KOKORO_VOICES_DIR, or `--output-dir`), where a running server serves it within a second, with a
short report beside it (NAME.fit.json): similarity to the sample against the nearest stock voice,
pitch, the sentences it checked. Nothing is written unless the fit completes: the voice appears
under its name only whole.

`--json-progress` writes one JSON object per line on stdout instead (the server's fitting jobs
run this command at low priority and read them: api/voice_fit_jobs.py).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from api.settings import get_settings

BAR_WIDTH = 24


def configure(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="voice_command", metavar="SUBCOMMAND", required=True)
    fit = sub.add_parser("fit", help="fit a voice to a recording of one speaker (10 to 60 s)",
                         description="Fit a Kokoro voice to a recording of one speaker and save it as NAME.pt.")
    fit.add_argument("sample", help="the recording: wav, mp3, flac, ogg/opus or m4a, any sample rate")
    fit.add_argument("--name", required=True, help="the voice's name: language letter, f or m, '_', a name (af_mine)")
    fit.add_argument("--transcript", default=None,
                     help="what the recording says (optional): the fit then compares the same words")
    fit.add_argument("--minutes", type=float, default=None,
                     help="deadline: stop with the best voice so far after this long (default KOKORO_VOICE_FIT_MINUTES, 10)")
    fit.add_argument("--candidates", type=int, default=None,
                     help="candidate voices to hear (default KOKORO_VOICE_FIT_CANDIDATES, 100); more fits closer, slower")
    fit.add_argument("--seed", type=int, default=0, help="the search's seed: the same seed and budget give the same voice")
    fit.add_argument("--output-dir", default=None,
                     help="where NAME.pt goes (default: KOKORO_VOICES_DIR, else the current directory)")
    fit.add_argument("--overwrite", action="store_true", help="replace a fitted voice of the same name")
    fit.add_argument("--json-progress", action="store_true", help=argparse.SUPPRESS)
    fit.set_defaults(_run=run_fit)


def run(args: argparse.Namespace) -> int:
    return run_fit(args)


def _clock(seconds: float) -> str:
    seconds = max(0, int(round(seconds)))
    return f"{seconds // 60}:{seconds % 60:02d}"


def progress_bar(p) -> str:
    """`[#########...............]  42/127  best 0.812 (similarity 0.861)  1:10, about 2:05 left  mixture`."""
    filled = int(BAR_WIDTH * p.done / max(p.total, 1))
    best = "" if p.best_score == float("-inf") or p.best_score is None else f"  best {p.best_score:.3f} (similarity {p.best_similarity:.3f})"
    return (f"[{'#' * filled}{'.' * (BAR_WIDTH - filled)}] {p.done:3d}/{p.total}{best}  {_clock(p.elapsed_s)}, "
            f"about {_clock(p.eta_s)} left  {p.phase}")


def emit(event: dict) -> None:
    print(json.dumps(event), flush=True)


def as_background_job() -> None:
    """A server's fitting job: the lowest CPU priority, and killed with the worker that started it
    (Linux's parent-death signal), so a stopped server leaves no fit running behind it. Done here,
    in the child, because a forking server's threads make a pre-exec hook unsafe."""
    os.nice(19)
    try:
        import ctypes
        import signal

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def run_fit(args: argparse.Namespace) -> int:
    from worker.voice_fit import EncoderMissing, SampleError, check_fit_name, fit_recording
    from worker.voice_fit.recording import MAX_SAMPLE_BYTES
    from worker.weights import WeightsError, load_weights

    from api.settings import weights_source

    as_json = args.json_progress
    if as_json:
        as_background_job()
        emit({"event": "progress", "phase": "loading", "done": 0, "total": 0, "message": "loading the model"})

    def fail(code: str, message: str, status: int) -> int:
        if as_json:
            emit({"event": "error", "code": code, "message": message})
        else:
            print(f"kokoro-fleet voice fit: error: {message}", file=sys.stderr)
        return status

    settings = get_settings()
    minutes = settings.voice_fit_minutes if args.minutes is None else args.minutes
    candidates = settings.voice_fit_candidates if args.candidates is None else args.candidates
    out_dir = Path(args.output_dir or settings.voices_dir or ".")
    if not out_dir.is_dir():
        return fail("no_output_dir", f"{out_dir}: no such directory (give --output-dir or KOKORO_VOICES_DIR)", 2)
    if candidates < 1 or minutes <= 0:
        return fail("invalid_budget", "--candidates must be at least 1 and --minutes positive", 2)
    sample_path = Path(args.sample)
    try:
        if sample_path.stat().st_size > MAX_SAMPLE_BYTES:
            return fail("sample_too_large", f"{sample_path}: {sample_path.stat().st_size / 2**20:.1f} MiB; "
                        f"send at most {MAX_SAMPLE_BYTES >> 20} MiB (10 to 60 s of speech is enough)", 2)
        data = sample_path.read_bytes()
    except OSError as e:
        return fail("sample_unreadable", f"{sample_path}: {e.strerror or e}", 2)
    try:
        weights = load_weights(weights_source(settings))
        name = check_fit_name(args.name, weights.voices)
    except SampleError as e:
        return fail(e.code, str(e), 2)
    except WeightsError as e:
        return fail("weights", str(e), 1)
    final = out_dir / f"{name}.pt"
    if final.exists() and not args.overwrite:
        return fail("name_taken", f"{final} exists: a voice {name!r} is already there; choose another name "
                    "or give --overwrite", 2)

    from worker.engine import Engine, EngineConfig
    from worker.voice_fit.recording import read_sample
    from worker.voice_fit.speaker import speaker_encoder

    try:  # a bad recording is refused before the engine is built
        read_sample(data, speaker_encoder())
    except SampleError as e:
        return fail(e.code, str(e), 2)
    except EncoderMissing as e:
        return fail("encoder_missing", str(e), 1)

    # A plain engine: no graphs or compiled passes to capture for the few short sentences a candidate says.
    engine = Engine(weights, EngineConfig(settings.device, settings.dtype, seed=settings.seed, cuda_graphs=False))
    terminal = sys.stderr.isatty() and not as_json
    shown = [0.0]

    def progress(p) -> None:
        if as_json:
            emit({"event": "progress", **p.as_dict()})
            return
        now = time.monotonic()
        if terminal or p.phase == "done" or now - shown[0] >= 5.0:
            print(f"\r{progress_bar(p)}\033[K" if terminal else progress_bar(p), end="" if terminal else "\n",
                  file=sys.stderr, flush=True)
            shown[0] = now

    try:
        result = fit_recording(engine, weights.voices, data, name, transcript=args.transcript,
                               candidates=candidates, minutes=minutes, seed=args.seed,
                               cache_dir=Path(settings.cache_dir).expanduser(), fingerprint=weights.fingerprint,
                               progress=progress)
    except SampleError as e:
        return fail(e.code, str(e), 2)
    except EncoderMissing as e:
        return fail("encoder_missing", str(e), 1)
    if terminal:
        print(file=sys.stderr)
    write_voice(out_dir, name, result.pack, result.report)
    if as_json:
        emit({"event": "done", "path": str(final), "report": result.report})
    else:
        print(summary(final, result.report))
    return 0


def write_voice(out_dir: Path, name: str, pack, report: dict) -> Path:
    """NAME.pt and NAME.fit.json, each written beside its place and renamed into it: a reader (a
    server's voices directory) sees the whole file or none."""
    from worker.voices import Voice, voice_file

    final = out_dir / f"{name}.pt"
    for path, content in ((out_dir / f"{name}.fit.json", json.dumps(report, indent=1).encode()),
                          (final, voice_file(Voice(name, name[:1], pack)))):
        partial = path.with_name(f".{path.name}.{os.getpid()}.part")
        try:
            partial.write_bytes(content)
            os.replace(partial, path)
        finally:
            partial.unlink(missing_ok=True)
    return final


def summary(path: Path, report: dict) -> str:
    pitch = report["pitch"]
    lines = [f"wrote {path}: voice {report['name']}",
             f"  similarity to the sample {report['similarity']:.3f}; nearest stock voice "
             f"{report['nearest_stock_voice']} {report['nearest_stock_similarity']:.3f}",
             f"  pitch: sample {pitch['sample']['pitch_hz']} Hz, fitted {pitch['fitted']['pitch_hz']} Hz "
             f"(nearest stock {pitch['nearest_stock']['pitch_hz']} Hz)",
             f"  mixture: {', '.join(f'{n} {w:.2f}' for n, w in report['mixture'].items())}"
             + ("; refined beyond the mix" if report["refined"] else ""),
             f"  checked on: {' / '.join(report['text_checked'])}",
             f"  {report['candidates']} candidates in {_clock(report['elapsed_s'])}"
             + (" (stopped at the deadline)" if report["stopped_at_deadline"] else "")]
    return "\n".join(lines)
