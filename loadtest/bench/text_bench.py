"""How long the text frontend takes on the sample texts: `python -m loadtest.bench.text_bench [FILES...]`.

Prints the one-time start-up (loading the language's reader) apart from the per-request work, which is
measured with espeak-ng's cache emptied so out-of-lexicon words are paid for. With `--synthesize` it
also synthesizes the same texts on this machine's engine (KOKORO_WEIGHTS, default the offline
bundle) and prints the frontend's share of the whole: the text step must stay a small fraction
(under 5%) of the synthesis it feeds. With `--first-request --lang z` it times a fresh server
process's first request in a language, its reader loaded on demand and preloaded. With
`--worst-case` it normalizes inputs built to make regular expressions backtrack (a request's
4,096 characters of one repeated piece: "1", "a-", "2 1/"...) in every language and prints the
slowest: a pattern that is tried at every position of a long run and scans to its end each time
costs seconds of CPU per request. Then the same through the whole frontend, where a reader's own
quadratic step shows (misaki's Japanese grouping took minutes on 4,096 'の').
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

SAMPLE_TEXTS = Path(__file__).resolve().parents[2] / "tests" / "data" / "texts"


def sample_texts() -> list[Path]:
    return sorted(SAMPLE_TEXTS.glob("*.txt"))


def time_frontend(paths: list[Path] | None = None, lang_code: str = "a", repeats: int = 3) -> dict:
    """Seconds to turn every file into chunks (best of `repeats`, caches emptied each time)."""
    from worker.text import espeak, load_language, text_to_chunks

    texts = [p.read_text(encoding="utf-8") for p in (paths or sample_texts())]
    started = time.perf_counter()
    load_language(lang_code)  # what a server's warm-up does (KOKORO_PRELOAD_LANGUAGES)
    startup = time.perf_counter() - started
    best = float("inf")
    chunks = []
    for _ in range(repeats):
        espeak.raw_phonemes.cache_clear()
        espeak.english_word.cache_clear()
        started = time.perf_counter()
        chunks = [c for text in texts for c in text_to_chunks(text, lang_code)]
        best = min(best, time.perf_counter() - started)
    return {
        "files": len(texts),
        "words": sum(len(t.split()) for t in texts),
        "chunks": len(chunks),
        "phonemes": sum(len(c.ids) for c in chunks),
        "startup_s": startup,
        "frontend_s": best,
    }


def time_synthesis(paths: list[Path] | None = None, lang_code: str = "a", voice: str = "af_heart") -> dict:
    """Seconds the engine takes to synthesize every chunk of the files (after one warm-up)."""
    import sys

    from api.speech.build import build_local_service
    from api.settings import get_settings
    from worker.text import text_to_chunks

    service = build_local_service(get_settings())
    engine, bank = service.replica.engine, service.voices
    engine.warmup()
    pack = bank.resolve(voice)
    chunks = [c for p in (paths or sample_texts()) for c in text_to_chunks(p.read_text(encoding="utf-8"), lang_code)]
    chunks = [c for c in chunks if c.ids]
    audio_samples = 0
    started = time.perf_counter()
    for i, chunk in enumerate(chunks):
        audio_samples += len(engine.synthesize(chunk.ids, bank.style(pack, len(chunk.ids))).audio)
        print(f"\rsynthesizing chunk {i + 1}/{len(chunks)}", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    return {"synthesis_s": time.perf_counter() - started, "audio_s": audio_samples / engine.sample_rate}


# A first sentence per language for `--first-request` (files in tests/data/languages, else this).
FIRST_REQUEST_FILES = {"j": "japanese.txt", "z": "mandarin.txt"}
VOICE_OF = {"a": "af_heart", "b": "bf_emma", "e": "ef_dora", "f": "ff_siwis", "h": "hf_alpha", "i": "if_sara",
            "j": "jf_alpha", "p": "pf_dora", "z": "zf_xiaobei"}


def first_request(lang_code: str, preloaded: bool) -> dict:
    """In this process (a fresh one): a speech service as a server builds it (English preloaded,
    `lang_code` too if `preloaded`), then one short request in `lang_code` through its admission,
    while a 1 ms ticker watches the event loop. Returns the admission's ms and the longest stall."""
    import asyncio

    import torch

    from api.settings import Settings
    from api.speech.contract import SpeechRequest
    from api.speech.local import SpeechService
    from worker.voices import VoiceBank

    name = FIRST_REQUEST_FILES.get(lang_code)
    text = ((SAMPLE_TEXTS.parent / "languages" / name).read_text(encoding="utf-8").splitlines()[0] if name
            else "The first sentence in this language, read at once.")
    voice = VOICE_OF[lang_code]

    class NoModel:
        async def warmup(self) -> None:
            pass

    settings = Settings(preload_languages="a,b" + (f",{lang_code}" if preloaded else ""))
    service = SpeechService(NoModel(), VoiceBank({voice: torch.zeros(510, 256)}), settings)

    async def run() -> dict:
        await service.warmup()
        gaps: list[float] = []

        async def ticker() -> None:
            last = time.perf_counter()
            while True:
                await asyncio.sleep(0.001)
                now = time.perf_counter()
                gaps.append(now - last)
                last = now

        watching = asyncio.create_task(ticker())
        await asyncio.sleep(0.05)
        started = time.perf_counter()
        await service.admit(SpeechRequest(text, voice=voice))
        admitted = time.perf_counter() - started
        await asyncio.sleep(0.05)
        watching.cancel()
        return {"lang": lang_code, "preloaded": preloaded, "chars": len(text), "admit_ms": admitted * 1000,
                "longest_stall_ms": max(gaps) * 1000}

    return asyncio.run(run())


def compare_first_requests(lang_code: str, repeats: int = 2) -> list[dict]:
    """`first_request` in fresh processes, on demand and preloaded, alternating."""
    import json
    import subprocess
    import sys

    results = []
    for _ in range(repeats):
        for preloaded in (False, True):
            out = subprocess.run([sys.executable, "-m", "loadtest.bench.text_bench", "--first-request-child", lang_code,
                                  *(["--preloaded"] if preloaded else [])], capture_output=True, text=True, check=True)
            results.append(json.loads(out.stdout.strip().splitlines()[-1]))
    return results


# Pieces that, repeated, make a long run that many patterns start on: digits, words, separators.
WORST_CASE_PIECES = ("a", "1", " ", ".", "-", "1.", "1 ", "a.", "a-", "1-", "1,", "1/", "1:", "$1", "a@", "a.b",
                     "<", "<a", "[", "](", "*", "_", "`", "#", "1 1", "a a", "A.", "Dr. ", "Mon ", "ending in ",
                     "Press ", "+1 ", "0 ", "10:00-", "2 1/", "x^", "€", "1 ½", "a1", "1a", "a-1", "@a.", "www.a",
                     "(1)", "1%", "1,000", "100 ", "1.000,5", "の", "。", "日本", "的", "ー", "っ", "१", "¿", "«", "—", "'", "a'")
WORST_CASE_LANGS = ("a", "b", "e", "f", "h", "i", "p", "j", "z")


def worst_cases(chars: int = 4096, top: int = 8, whole: bool = False) -> list[tuple[float, str, str]]:
    """(seconds, language, piece) of the slowest normalizations of `chars` characters of one piece
    repeated, units read too (the most rules on); with `whole`, of the whole frontend (normalize,
    G2P, split into chunks) on the language's loaded reader, as a warm replica pays it."""
    import sys

    from worker.text import load_language, text_to_chunks
    from worker.text.normalize import NormalizationOptions, normalize_text

    options = NormalizationOptions(unit_normalization=True)
    times = []
    for lang in WORST_CASE_LANGS:
        if whole:
            load_language(lang)
        for piece in WORST_CASE_PIECES:
            text = piece * (chars // len(piece))
            started = time.perf_counter()
            if whole:
                text_to_chunks(text, lang, options)
            else:
                normalize_text(text, options, lang_code=lang)
            times.append((time.perf_counter() - started, lang, piece))
        print(f"  {lang}: slowest so far {max(times)[0] * 1000:.0f} ms", file=sys.stderr, flush=True)
    return sorted(times, reverse=True)[:top]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="*", type=Path, help="text files (default: tests/data/texts/*.txt)")
    parser.add_argument("--lang", default="a")
    parser.add_argument("--synthesize", action="store_true", help="also time the synthesis of the same texts")
    parser.add_argument("--first-request", action="store_true",
                        help="a fresh server process's first request in --lang: its admission time and the longest "
                             "event-loop stall, the language loaded on demand vs preloaded (KOKORO_PRELOAD_LANGUAGES)")
    parser.add_argument("--worst-case", action="store_true",
                        help="the slowest normalizations, and whole frontends, of 4,096 characters built to make "
                             "patterns backtrack")
    parser.add_argument("--first-request-child", metavar="LANG", help=argparse.SUPPRESS)
    parser.add_argument("--preloaded", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.first_request_child:
        import json

        print(json.dumps(first_request(args.first_request_child, args.preloaded)))
        return 0
    if args.worst_case:
        for whole, stage in ((False, "normalization"), (True, "normalize + G2P + split")):
            print(f"{stage} of 4,096 characters of one piece repeated ({len(WORST_CASE_PIECES)} pieces x "
                  f"{len(WORST_CASE_LANGS)} languages), slowest:")
            for seconds, lang, piece in worst_cases(whole=whole):
                print(f"  {seconds * 1000:7.1f} ms  {lang}  {piece!r}")
        return 0
    if args.first_request:
        for r in compare_first_requests(args.lang):
            print(f"{r['lang']} {'preloaded' if r['preloaded'] else 'on demand'}: {r['chars']}-character request "
                  f"admitted in {r['admit_ms']:.0f} ms, longest event-loop stall {r['longest_stall_ms']:.0f} ms")
        return 0
    r = time_frontend(args.files or None, args.lang)
    print(f"text frontend: {r['files']} files, {r['words']} words -> {r['chunks']} chunks, {r['phonemes']} phonemes")
    print(f"  start-up (the language's reader, once per process):         {r['startup_s'] * 1000:.0f} ms")
    print(f"  normalize + G2P + split, all files:                         {r['frontend_s'] * 1000:.1f} ms "
          f"({r['frontend_s'] / max(r['words'], 1) * 1e6:.0f} µs/word)")
    if args.synthesize:
        s = time_synthesis(args.files or None, args.lang)
        print(f"  synthesis of the same chunks:                               {s['synthesis_s']:.1f} s "
              f"({s['audio_s']:.0f} s of audio, {s['audio_s'] / s['synthesis_s']:.1f} audio-s per s)")
        print(f"  frontend / synthesis:                                       "
              f"{100 * r['frontend_s'] / s['synthesis_s']:.3g}%")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
