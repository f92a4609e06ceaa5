"""What voice fitting achieves: `python -m loadtest.bench.voice_fit [--minutes M] [--candidates N]`.

Leave-one-out over stock voices of both genders, American and British: each target voice speaks
about 20 s of a story (the "recording"), and a voice is fitted to it with the target removed from
the pool the fit may start from (so from every mix containing it too). Then the fitted voice, the
target and every remaining stock voice read held-out sentences (none of the recording's or the fit's
own), and the bench reports, per target:

- the speaker encoder's similarity to the target's held-out speech: the fitted voice's, the nearest
  remaining stock voice's, and the target's own recording's (its self-similarity: the ceiling);
- the second measure, pitch and spectral-envelope distances to the target, for the fitted voice and
  the nearest remaining stock voice on each; and the two as one distance, weighted as the fit's own
  score weighs them (a semitone costs what 2.7 envelope units do), against its nearest stock voice;
- the word error rate of the held-out speech through PocketSphinx's bundled US English model (an
  offline recognizer from PyPI): the fitted voice's against the stock voices' on the same sentences;
- the fit's wall time.

Each held-out figure is the mean over `--draws` draws of the decoder's noise; the table also gives
the target's pitch distance to itself between draws: below it, "closer" is within the measure's noise.

Results are appended per voice to `--out/results.jsonl` as they come; `summary.json` and the
Markdown table (`table.md`, for docs/voices.md) are written at the end.
"""

from __future__ import annotations

import argparse
import io
import json
import math
import os
import platform
import re
import subprocess
import time
import wave
from pathlib import Path

import numpy as np

TARGETS = ("af_heart", "af_sarah", "am_michael", "am_puck", "bf_emma", "bf_isabella", "bm_george", "bm_daniel")
RECORDING = ("Once upon a time, in a small village by the sea, there lived an old fisherman and his wife. "
             "Every morning he rowed out past the rocks to cast his nets. Some days he came home with nothing at "
             "all, and some days his boat was so full it nearly sank. His wife mended the nets by the fire and sang "
             "the old songs her mother had taught her, while the wind rattled the shutters.")
HELD_OUT = ("Please remember to bring your umbrella when you go out this afternoon.",
            "The train to the city leaves from platform four at half past nine.",
            "She bought fresh bread, a jar of honey and some green apples at the market.")
RESULTS = Path(__file__).resolve().parents[1] / "results"  # a run writes into <today>-voice-fit-cpu by default


def wav_bytes(audio: np.ndarray, rate: int) -> bytes:
    from worker.audio import to_pcm16

    buf = io.BytesIO()
    with wave.open(buf, "wb") as f:
        f.setnchannels(1)
        f.setsampwidth(2)
        f.setframerate(rate)
        f.writeframes(to_pcm16(audio).tobytes())
    return buf.getvalue()


def word_error_rate(reference: str, hypothesis: str) -> float:
    ref = re.findall(r"[a-z']+", reference.lower())
    hyp = re.findall(r"[a-z']+", hypothesis.lower())
    d = list(range(len(hyp) + 1))
    for i, r in enumerate(ref, 1):
        prev, d[0] = d[0], i
        for j, h in enumerate(hyp, 1):
            prev, d[j] = d[j], min(d[j] + 1, d[j - 1] + 1, prev + (r != h))
    return d[len(hyp)] / max(len(ref), 1)


class Recognizer:
    """PocketSphinx's bundled US English acoustic model and language model."""

    def __init__(self):
        from pocketsphinx import Decoder

        self.decoder = Decoder(samprate=16000, loglevel="FATAL")

    def wer(self, audios16k: list[np.ndarray], texts: tuple[str, ...]) -> float:
        from worker.audio import to_pcm16

        errors = words = 0
        for audio, text in zip(audios16k, texts):
            self.decoder.start_utt()
            self.decoder.process_raw(to_pcm16(audio * (0.5 / max(1e-6, np.abs(audio).max()))).tobytes(), full_utt=True)
            self.decoder.end_utt()
            hyp = self.decoder.hyp().hypstr if self.decoder.hyp() else ""
            n = len(re.findall(r"[a-z']+", text.lower()))
            errors += word_error_rate(text, hyp) * n
            words += n
        return errors / max(words, 1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtest.bench.voice_fit", description=__doc__.split("\n\n")[0])
    parser.add_argument("--voices", default=",".join(TARGETS), help="target stock voices, comma-separated")
    parser.add_argument("--minutes", type=float, default=3.0, help="deadline of each fit")
    parser.add_argument("--candidates", type=int, default=60, help="candidate budget of each fit")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--draws", type=int, default=3, help="noise draws each held-out figure is averaged over")
    parser.add_argument("--pool", default="", help="the stock voices a fit may start from, comma-separated "
                        "(default: every American and British voice); each target is always left out of it")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default); on a loaded "
                        "machine 1 runs faster than threads that wait on each other")
    parser.add_argument("--out", type=Path, default=RESULTS / f"{time.strftime('%Y-%m-%d')}-voice-fit-cpu")
    parser.add_argument("--keep-voices", type=Path, default=None,
                        help="also write each fitted voice there as <target>.pt (to score it again later)")
    parser.add_argument("--report-only", action="store_true",
                        help="write summary.json and table.md from --out's results.jsonl so far, fitting nothing")
    args = parser.parse_args(argv)
    if args.report_only:
        return report_only(args.out, args)

    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    from api.settings import get_settings, weights_source
    from worker.engine import Engine, EngineConfig
    from worker.text.chunks import text_to_chunks
    from worker.voice_fit import fit_pool, fit_recording
    from worker.voice_fit.fit import ENVELOPE_PENALTY, PITCH_PENALTY, CandidateEar
    from worker.voice_fit.measures import measure
    from worker.voice_fit.recording import resample
    from worker.voice_fit.speaker import speaker_encoder
    from worker.weights import load_weights

    settings = get_settings()
    weights = load_weights(weights_source(settings))
    engine = Engine(weights, EngineConfig(settings.device, settings.dtype, seed=settings.seed, cuda_graphs=False))
    encoder = speaker_encoder()
    args.out.mkdir(parents=True, exist_ok=True)
    english = fit_pool("af_x", weights.voices)
    if args.pool:
        english = {n: english[n] for n in {*args.pool.split(","), *args.voices.split(",")} if n in english}
    machine = {"cpu": _cpu_model(), "load_average_at_start": os.getloadavg(), "threads": torch.get_num_threads(),
               "dtype": engine.dtype,
               "pool": sorted(english), "python": platform.python_version(), "weights": weights.source}
    (args.out / "machine.json").write_text(json.dumps(machine, indent=1))
    print(json.dumps(machine), flush=True)

    # each held-out sentence whole, as one chunk (a request's first chunk would be a short piece of it)
    held_chunks = [text_to_chunks(t, "a", first_chunk_phonemes=400) for t in HELD_OUT]
    assert all(len(c) == 1 for c in held_chunks), "a held-out sentence must be one chunk"
    held_ids = [list(c[0].ids) for c in held_chunks]
    ear = CandidateEar(engine, encoder, held_ids)
    recognizer = Recognizer()

    def held_out(pack) -> dict:
        """The held-out figures, each the mean over `--draws` draws of the decoder's noise (one draw
        can move a voice's pitch median by a whole lag step of the tracker)."""
        pieces = [resample(engine.synthesize(ids, pack[min(len(ids), pack.shape[0]) - 1]).audio, engine.sample_rate)
                  for ids in held_ids]
        draws = []
        for draw in range(args.draws):
            engine.seed = settings.seed + draw
            audio = ear.speech(pack)
            draws.append((encoder.embed(audio), measure(audio)))
        engine.seed = settings.seed  # the fit's own draw
        embedding = np.mean([d[0] for d in draws], axis=0)
        return {"embedding": embedding / np.linalg.norm(embedding), "measures": mean_measures([d[1] for d in draws]),
                "draws": [d[1] for d in draws], "wer": recognizer.wer(pieces, HELD_OUT)}

    started = time.monotonic()
    stock = {}
    for name in sorted(english):
        stock[name] = held_out(english[name])
    print(f"held-out speech of {len(stock)} stock voices in {time.monotonic() - started:.0f} s", flush=True)
    stock_wer = float(np.mean([s["wer"] for s in stock.values()]))

    rows = []
    results = args.out / "results.jsonl"
    for target in [v.strip() for v in args.voices.split(",") if v.strip()]:
        pack = weights.voices[target]
        recording = np.concatenate([engine.synthesize(c.ids, pack[len(c.ids) - 1]).audio
                                    for c in text_to_chunks(RECORDING, target[0], first_chunk_phonemes=200)])
        sample_audio = resample(recording, engine.sample_rate)
        fit_started = time.monotonic()
        result = fit_recording(engine, english, wav_bytes(recording, engine.sample_rate), f"{target[:2]}_fit",
                               candidates=args.candidates, minutes=args.minutes, seed=args.seed,
                               cache_dir=Path(settings.cache_dir).expanduser(), exclude={target},
                               fingerprint=weights.fingerprint)
        fit_s = time.monotonic() - fit_started
        if args.keep_voices:
            args.keep_voices.mkdir(parents=True, exist_ok=True)
            torch.save(result.pack.reshape(result.pack.shape[0], 1, -1).clone(), args.keep_voices / f"{target}.pt")
        fitted = held_out(result.pack)
        truth = stock[target]
        others = {n: s for n, s in stock.items() if n != target}
        sim = {n: float(s["embedding"] @ truth["embedding"]) for n, s in others.items()}
        pitch = {n: s["measures"].pitch_distance(truth["measures"]) for n, s in others.items()}
        env = {n: s["measures"].envelope_distance(truth["measures"]) for n, s in others.items()}
        nearest = max(sim, key=sim.get)
        nearest_pitch = min(pitch, key=pitch.get)
        nearest_env = min(env, key=env.get)
        joint = {n: PITCH_PENALTY * pitch[n] + ENVELOPE_PENALTY * env[n] for n in others}
        nearest_joint = min(joint, key=joint.get)
        fitted_pitch = fitted["measures"].pitch_distance(truth["measures"])
        fitted_env = fitted["measures"].envelope_distance(truth["measures"])
        self_similarity = float(encoder.embed(sample_audio) @ truth["embedding"])
        # the measure's own floor: the target against itself, one noise draw against another
        floor = [(a.pitch_distance(b), a.envelope_distance(b)) for i, a in enumerate(truth["draws"])
                 for b in truth["draws"][i + 1:]]
        fitted_sim = float(fitted["embedding"] @ truth["embedding"])
        row = {
            "voice": target, "recording_s": round(len(recording) / engine.sample_rate, 1),
            "fitted_similarity": round(fitted_sim, 4), "nearest_stock": nearest, "nearest_similarity": round(sim[nearest], 4),
            "self_similarity": round(self_similarity, 4),
            "gap_closed": round((fitted_sim - sim[nearest]) / max(self_similarity - sim[nearest], 1e-6), 3),
            "fitted_pitch_distance": round(fitted_pitch, 2),
            "nearest_pitch_stock": nearest_pitch, "nearest_pitch_distance": round(pitch[nearest_pitch], 2),
            "fitted_envelope_distance": round(fitted_env, 3),
            "nearest_envelope_stock": nearest_env, "nearest_envelope_distance": round(env[nearest_env], 3),
            "fitted_joint_distance": round(PITCH_PENALTY * fitted_pitch + ENVELOPE_PENALTY * fitted_env, 4),
            "nearest_joint_stock": nearest_joint, "nearest_joint_distance": round(joint[nearest_joint], 4),
            "target_pitch_between_draws": round(float(np.mean([f[0] for f in floor])), 2) if floor else None,
            "target_envelope_between_draws": round(float(np.mean([f[1] for f in floor])), 3) if floor else None,
            "fitted_wer": round(fitted["wer"], 3), "target_wer": round(truth["wer"], 3), "stock_wer": round(stock_wer, 3),
            "fit_s": round(fit_s, 1), "candidates": result.report["candidates"],
            "stopped_at_deadline": result.report["stopped_at_deadline"], "mixture": result.report["mixture"],
            "refined": result.report["refined"], "fit_pitch": result.report["pitch"],
            "load_average": round(os.getloadavg()[0], 2),
        }
        row["closer_on_encoder"] = row["fitted_similarity"] > row["nearest_similarity"]
        row["closer_on_pitch"] = row["fitted_pitch_distance"] < row["nearest_pitch_distance"]
        row["closer_on_envelope"] = row["fitted_envelope_distance"] < row["nearest_envelope_distance"]
        row["closer_on_joint"] = row["fitted_joint_distance"] < row["nearest_joint_distance"]
        rows.append(row)
        with results.open("a") as f:
            f.write(json.dumps(row) + "\n")
        print(json.dumps(row), flush=True)

    summary = summarize(rows, machine, args, stock_wer, time.monotonic() - started)
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1))
    (args.out / "table.md").write_text(table(rows, summary))
    print(table(rows, summary))
    return 0


def mean_measures(draws: list) -> "VoiceMeasures":
    from worker.voice_fit.measures import VoiceMeasures

    return VoiceMeasures(float(np.mean([d.pitch_median for d in draws])), float(np.mean([d.pitch_spread for d in draws])),
                         float(np.mean([d.voiced_share for d in draws])), np.mean([d.envelope for d in draws], axis=0))


def summarize(rows: list[dict], machine: dict, args, stock_wer: float, total_s: float | None) -> dict:
    return {
        "machine": machine, "load_average_at_end": os.getloadavg(), "minutes_per_fit": args.minutes,
        "candidates_per_fit": args.candidates, "seed": args.seed, "voices": len(rows),
        "closer_on_both_every_voice": all(r["closer_on_encoder"] and r["closer_on_pitch"] and r["closer_on_envelope"]
                                          for r in rows),
        "closer_on_encoder_and_joint_every_voice": all(r["closer_on_encoder"] and r.get("closer_on_joint", False)
                                                       for r in rows),
        "closer_count": {m: sum(bool(r[f"closer_on_{m}"]) for r in rows) if all(f"closer_on_{m}" in r for r in rows)
                         else None for m in ("encoder", "pitch", "envelope", "joint")},  # None: rows of an older run
        "mean_gap_closed": round(float(np.mean([r["gap_closed"] for r in rows])), 3) if rows else None,
        "fitted_wer_mean": round(float(np.mean([r["fitted_wer"] for r in rows])), 3) if rows else None,
        "stock_wer_mean": round(stock_wer, 3),
        "mean_fit_s": round(float(np.mean([r["fit_s"] for r in rows])), 1) if rows else None,
        "total_s": None if total_s is None else round(total_s, 1),
    }


def report_only(out: Path, args) -> int:
    """summary.json and table.md from the rows results.jsonl holds so far (a run cut short)."""
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines() if line.strip()]
    machine = json.loads((out / "machine.json").read_text())
    summary = summarize(rows, machine, args, rows[0]["stock_wer"] if rows else float("nan"), None)
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    (out / "table.md").write_text(table(rows, summary))
    print(table(rows, summary))
    return 0


def table(rows: list[dict], summary: dict) -> str:
    lines = ["| voice | fitted sim. | nearest stock (sim.) | self-sim. | gap closed | pitch dist. fitted / nearest (st) "
             "| pitch, target between draws (st) | pitch on the fit's sentences, fitted - sample (st) "
             "| envelope dist. fitted / nearest | pitch and envelope as one, fitted / nearest "
             "| WER fitted / target / stock mean | fit time |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| `{r['voice']}` | {r['fitted_similarity']:.3f} | `{r['nearest_stock']}` ({r['nearest_similarity']:.3f}) "
                     f"| {r['self_similarity']:.3f} | {r['gap_closed']:.2f} | {r['fitted_pitch_distance']:.2f} / "
                     f"{r['nearest_pitch_distance']:.2f} | {_figure(r.get('target_pitch_between_draws'))} "
                     f"| {_figure(_fit_pitch_miss(r), '+.2f')} | {r['fitted_envelope_distance']:.2f} / "
                     f"{r['nearest_envelope_distance']:.2f} | {_figure(r.get('fitted_joint_distance'), '.3f')} / "
                     f"{_figure(r.get('nearest_joint_distance'), '.3f')} | {r['fitted_wer']:.2f} / {r['target_wer']:.2f} / "
                     f"{r['stock_wer']:.2f} | {r['fit_s'] / 60:.1f} min |")
    lines.append("")
    counts = summary.get("closer_count", {})
    lines.append(f"Mean gap closed {summary['mean_gap_closed']}; closer than the nearest stock voice on every measure "
                 f"for every voice: {summary['closer_on_both_every_voice']} (voices closer on the encoder "
                 f"{counts.get('encoder')}, on pitch {counts.get('pitch')}, on the envelope {counts.get('envelope')}, "
                 f"on pitch and envelope as one {counts.get('joint')}, of {len(rows)}); WER fitted {summary['fitted_wer_mean']} "
                 f"vs stock {summary['stock_wer_mean']}; mean fit {summary['mean_fit_s']} s.")
    return "\n".join(lines) + "\n"


def _figure(value, spec: str = ".2f") -> str:
    return "-" if value is None else format(value, spec)


def _fit_pitch_miss(row: dict) -> float | None:
    """Semitones between the fitted voice's pitch and the sample's, as the fit heard them (its own sentences)."""
    pitch = row.get("fit_pitch")
    if not pitch or not pitch["sample"]["pitch_hz"] or not pitch["fitted"]["pitch_hz"]:
        return None
    return 12 * math.log2(pitch["fitted"]["pitch_hz"] / pitch["sample"]["pitch_hz"])


def _cpu_model() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
        return next((line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Model name")), "")
    except OSError:
        return platform.processor()


if __name__ == "__main__":
    raise SystemExit(main())
