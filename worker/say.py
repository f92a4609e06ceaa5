"""`kokoro-fleet say TEXT -o out.wav`: a quick listen without a server."""

from __future__ import annotations

import argparse
import sys
import time
import wave
from pathlib import Path

import numpy as np

from worker.audio import SAMPLE_RATE, to_pcm16
from worker.settings import get_settings


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("text", help="text to speak; '-' reads standard input, '@FILE' reads a file")
    parser.add_argument("-o", "--output", default="out.wav", help="WAV file to write (24 kHz mono 16-bit)")
    parser.add_argument("--voice", default="af_heart", help="voice name, OpenAI alias or mix such as 'af_bella(2)+af_sky(1)'")
    parser.add_argument("--speed", type=float, default=1.0, help="speaking rate, 0.25 to 4.0")
    parser.add_argument("--lang", default=None, help="language code (a, b, e, f, h, i, j, p, z); default: the voice's")
    parser.add_argument("--weights", default=None, help="weight source (offline, official, tiny or a directory); default: KOKORO_WEIGHTS")
    parser.add_argument("--phonemes", action="store_true",
                        help="TEXT is phonemes in Kokoro's alphabet (as `kokoro-fleet phonemize` prints), spoken as given")


def read_text(arg: str) -> str:
    if arg == "-":
        return sys.stdin.read()
    if arg.startswith("@"):
        return Path(arg[1:]).read_text(encoding="utf-8")
    return arg


def write_wav(path: str | Path, audio: np.ndarray, sample_rate: int = SAMPLE_RATE) -> None:
    pcm16 = to_pcm16(audio)  # the levels the server's wav and pcm responses carry
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(sample_rate)
        w.writeframes(pcm16.tobytes())


def run(args: argparse.Namespace) -> int:
    from worker.speech import SpeechRequest, SpeechService
    from worker.text import TextError
    from worker.voices import VoiceError
    from worker.weights import WeightsError

    settings = get_settings()
    if settings.engine == "sim":
        # `say` is for listening to the model; the simulated engine's audio is a synthetic stand-in.
        print("error: KOKORO_ENGINE=sim is set, and the simulated engine has no model (its audio is synthetic); "
              "`say` speaks with the model: unset KOKORO_ENGINE or set it to torch", file=sys.stderr)
        return 2
    if args.weights:
        settings = settings.replace(weights=args.weights)
    if not 0.25 <= args.speed <= 4.0:
        print(f"error: --speed {args.speed} is outside 0.25 to 4.0", file=sys.stderr)
        return 2
    try:
        service = SpeechService.from_settings(settings)
        plan = service.plan(SpeechRequest(read_text(args.text), args.voice, args.speed, args.lang,
                                          phonemes=args.phonemes))
    except (TextError, VoiceError, WeightsError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1

    import asyncio

    async def synthesize() -> list[np.ndarray]:
        pieces = []
        started = time.perf_counter()
        async for piece in service.stream(plan):
            pieces.append(piece.pcm)
            if len(plan.chunks) > 1:  # progress on long work
                print(f"\rchunk {piece.index + 1}/{len(plan.chunks)}", end="", file=sys.stderr, flush=True)
        if len(plan.chunks) > 1:
            print(f" ({time.perf_counter() - started:.1f} s)", file=sys.stderr)
        return pieces

    audio = np.concatenate(asyncio.run(synthesize()))
    write_wav(args.output, audio, SAMPLE_RATE)
    print(f"wrote {args.output}: {len(audio) / SAMPLE_RATE:.2f} s of audio, voice {plan.voice.name}, "
          f"{len(plan.chunks)} chunk(s), {plan.phoneme_count} phonemes")
    return 0
