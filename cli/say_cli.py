"""`kokoro-fleet say TEXT -o out.mp3`: speech to a file without a server, a sentence or a whole book.

The file's format follows its suffix (`.wav`, `.mp3`, `.opus`/`.ogg`, `.aac`, `.flac`, `.pcm`,
`.ulaw`, `.alaw`) or `--format`, encoded as the server encodes its responses (api/encoders.py),
at the model's 24 kHz or `--sample-rate`. There is no input limit here: `@book.txt` reads a file.
Each piece is encoded and written as it is made, so memory stays flat however long the text, and
stderr shows the progress (chunk k of n, audio so far, speed against real time, time left). The
file appears under its name only once complete: until then it is written beside it, as `.NAME.part`.
`--captions FILE.srt` (or `.vtt`) writes subtitles of the text beside it (api/subtitles.py), cue by
cue as the audio is made, and the same way: under its name only once the audio is complete.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from pathlib import Path

from api.encoders import FORMATS, default_sample_rate, make_encoder, wav_header
from api.settings import get_settings
from api.subtitles import CaptionFile, caption_format_of

# A file name's suffix -> the format written.
FORMAT_OF_SUFFIX = {".wav": "wav", ".mp3": "mp3", ".opus": "opus", ".ogg": "opus", ".aac": "aac",
                    ".flac": "flac", ".pcm": "pcm", ".raw": "pcm", ".ulaw": "mulaw", ".mulaw": "mulaw",
                    ".alaw": "alaw"}
# How often progress is written when stderr is a log rather than a terminal.
PROGRESS_EVERY_S = 5.0
# The audio a text must make before `say` compiles the fused kernels it lacks, or loads them from
# the host's cache: about twice what pays the compile (or load) back on a 2-core CPU run alone, as
# the eager passes share the cores meanwhile (loadtest/bench/kernel_bench.py, docs/performance.md).
SAY_COMPILE_FROM_AUDIO_S = 300.0
SAY_LOAD_FROM_AUDIO_S = 60.0


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("text", help="text to speak; '-' reads standard input, '@FILE' reads a file")
    parser.add_argument("-o", "--output", default="out.wav",
                        help=f"file to write; its suffix picks the format ({', '.join(FORMAT_OF_SUFFIX)})")
    parser.add_argument("--format", choices=FORMATS, default=None, help="the format, whatever the file's suffix")
    parser.add_argument("--sample-rate", type=int, default=None,
                        help="output sample rate in Hz (8000 to 48000; default the format's, 24000 for most)")
    parser.add_argument("--voice", default="af_heart", help="voice name, OpenAI alias or mix such as 'af_bella(2)+af_sky(1)'")
    parser.add_argument("--speed", type=float, default=1.0, help="speaking rate, 0.25 to 4.0")
    parser.add_argument("--lang", default=None, help="language code (a, b, e, f, h, i, j, p, z); default: the voice's")
    parser.add_argument("--weights", default=None, help="weight source (offline, official, tiny or a directory); default: KOKORO_WEIGHTS")
    parser.add_argument("--captions", default=None, metavar="FILE",
                        help="also write subtitles of the text to FILE, SubRip (.srt) or WebVTT (.vtt) by its suffix")
    parser.add_argument("--phonemes", action="store_true",
                        help="TEXT is phonemes in Kokoro's alphabet (as `kokoro-fleet phonemize` prints), spoken as given")


def read_text(arg: str) -> str:
    if arg == "-":
        return sys.stdin.read()
    if arg.startswith("@"):
        return Path(arg[1:]).read_text(encoding="utf-8")
    return arg


def output_format(path: str, given: str | None) -> str:
    """The format to write `path` in: `given`, else its suffix's; ValueError naming the choices."""
    if given:
        return given
    suffix = Path(path).suffix.lower()
    if suffix not in FORMAT_OF_SUFFIX:
        raise ValueError(f"cannot tell the format of {path!r} from its suffix; name the file with one of "
                         f"{', '.join(FORMAT_OF_SUFFIX)}, or give --format ({', '.join(FORMATS)})")
    return FORMAT_OF_SUFFIX[suffix]


def _clock(seconds: float) -> str:
    seconds = max(0, round(seconds))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}" if seconds >= 3600 else \
        f"{seconds // 60}:{seconds % 60:02d}"


def progress_line(done: int, total: int, audio_s: float, elapsed_s: float, expected_audio_s: float,
                  first_piece: tuple[float, float] | None = None, kernels: str | None = None) -> str:
    """`chunk 3/40  0:42 of audio  5.1x real time  about 2:10 left`: the time left assumes the rest
    speaks at the pace measured so far, and lasts as long as the plan's estimate says. first_piece:
    the audio and seconds at the first piece, whose time holds the engine's start-up (first passes,
    the kernels chosen): the pace is measured after it, and not guessed before a second piece.
    kernels: which kernels the passes run (eager, fused, or fused ones still compiling)."""
    speed = audio_s / elapsed_s if elapsed_s > 0 else 0.0
    line = f"chunk {done}/{total}  {_clock(audio_s)} of audio  {speed:.1f}x real time"
    pace_audio, pace_s = audio_s, elapsed_s
    if first_piece is not None:
        pace_audio, pace_s = audio_s - first_piece[0], elapsed_s - first_piece[1]
    if done < total and pace_audio > 0 and pace_s > 0:
        line += f"  about {_clock(max(0.0, expected_audio_s - audio_s) * pace_s / pace_audio)} left"
    elif done < total:
        line += "  time left: measured from the next chunk on"
    if kernels:
        line += f"  ({kernels})"
    return line


def start_fused_kernels(replica, chunks: int, audio_s: float):
    """`say` speaks at once with the eager kernels. The fused ones are compiled (or loaded from the
    host's cache) in the background, then switched to between two chunks, only for a text long
    enough to win that back: a one-shot command that ended first would wait for them. The task,
    or None."""
    import asyncio

    if chunks < 2 or not replica.kernels_pending:
        return None
    if audio_s < (SAY_LOAD_FROM_AUDIO_S if replica.engine.kernels_cached else SAY_COMPILE_FROM_AUDIO_S):
        return None
    return asyncio.create_task(replica.compile_kernels_in_background())


def kernels_in_use(replica) -> str:
    """Which kernels the chunks run now, as the progress line says it."""
    kernels = replica.engine.kernels
    if kernels == "compiled":
        return "fused kernels"
    if kernels == "eager":
        return "eager kernels, fused ones compiling" if replica.kernels_compiling else "eager kernels"
    return kernels  # a simulated engine says so


def run(args: argparse.Namespace) -> int:
    from api.speech.build import build_local_service
    from api.speech.contract import SpeechRequest
    from worker.cpu_runtime import use_compile_cache
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
        fmt = output_format(args.output, args.format)
        caption_format = caption_format_of(args.captions) if args.captions else None
        encoder = make_encoder(fmt, streamed=True, sample_rate=args.sample_rate)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        use_compile_cache(settings.cache_dir)  # the fused kernels a server's workers compiled, if any
        service = build_local_service(settings)
        text = read_text(args.text)
        plan = service.plan(SpeechRequest(text, args.voice, args.speed, args.lang, phonemes=args.phonemes))
    except (TextError, VoiceError, WeightsError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1

    import asyncio

    final = Path(args.output)
    partial = final.with_name(f".{final.name}.part")
    captions = CaptionFile(caption_format, text) if caption_format else None
    captions_final = Path(args.captions) if captions else None
    captions_partial = captions_final.with_name(f".{captions_final.name}.part") if captions_final else None
    total = len(plan.chunks)

    terminal = sys.stderr.isatty()

    async def synthesize(out, cues) -> float:
        """Write every piece as it comes (its audio to `out`, its final cues to `cues`); the audio's
        length in seconds."""
        audio_s, started, shown = 0.0, time.perf_counter(), -PROGRESS_EVERY_S
        first_piece = None
        kernels = start_fused_kernels(service.replica, total, plan.estimated_seconds)
        async for piece in service.stream(plan):
            out.write(encoder.encode(piece.pcm))
            if cues is not None:
                cues.write(captions.add(piece.words, piece.seconds))
            audio_s += piece.seconds
            now = time.perf_counter()
            if first_piece is None:  # its time holds the start-up: the pace is measured after it
                first_piece = (audio_s, now - started)
            if total > 1 and (terminal or piece.is_last or now - shown >= PROGRESS_EVERY_S):  # long work
                line = progress_line(piece.index + 1, total, audio_s, now - started, plan.estimated_seconds,
                                     first_piece, kernels_in_use(service.replica))
                # on a terminal one line redrawn in place; in a log a line every PROGRESS_EVERY_S
                print(f"\r{line}\033[K" if terminal else line, end="" if terminal else "\n", file=sys.stderr,
                      flush=True)
                shown = now
        out.write(encoder.finish())
        if cues is not None:
            cues.write(captions.finish())
        if total > 1 and terminal:
            print(file=sys.stderr)
        if kernels is not None and not kernels.done():  # it fills the host's cache for the next run
            print("finishing the fused kernels' compile for the next run", file=sys.stderr, flush=True)
            await kernels
        return audio_s

    try:
        with open(partial, "wb") as out, \
                (open(captions_partial, "w", encoding="utf-8") if captions else contextlib.nullcontext()) as cues:
            audio_s = asyncio.run(synthesize(out, cues))
            if fmt == "wav":  # streamed with an open size; a file can say it exactly
                size = out.tell()
                out.seek(0)
                out.write(wav_header(size - 44, args.sample_rate or default_sample_rate(fmt)))
        os.replace(partial, final)
        if captions:
            os.replace(captions_partial, captions_final)
    except BaseException:
        partial.unlink(missing_ok=True)
        if captions:
            captions_partial.unlink(missing_ok=True)
        raise
    finally:
        encoder.close()
    print(f"wrote {final} ({fmt}): {audio_s:.2f} s of audio, voice {plan.voice.name}, "
          f"{total} chunk(s), {plan.phoneme_count} phonemes")
    if captions:
        print(f"wrote {captions_final} ({caption_format}): {captions.count} cue(s)")
    return 0
