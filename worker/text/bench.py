"""How long the text frontend takes on the sample texts: `python -m worker.text.bench [FILES...]`.

Prints the one-time start-up (lexicon load, espeak-ng init) apart from the per-request work, which is
measured with espeak-ng's cache emptied so out-of-lexicon words are paid for. `kokoro-fleet bench`
compares the per-request figure with the synthesis time of the same texts.
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
    from worker.text import espeak, text_to_chunks
    from worker.text.g2p import preload

    texts = [p.read_text(encoding="utf-8") for p in (paths or sample_texts())]
    started = time.perf_counter()
    preload((lang_code,))
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="*", type=Path, help="text files (default: tests/data/texts/*.txt)")
    parser.add_argument("--lang", default="a")
    args = parser.parse_args(argv)
    r = time_frontend(args.files or None, args.lang)
    print(f"text frontend: {r['files']} files, {r['words']} words -> {r['chunks']} chunks, {r['phonemes']} phonemes")
    print(f"  start-up (lexicon load, espeak-ng init, once per process): {r['startup_s'] * 1000:.0f} ms")
    print(f"  normalize + G2P + split, all files:                         {r['frontend_s'] * 1000:.1f} ms "
          f"({r['frontend_s'] / max(r['words'], 1) * 1e6:.0f} µs/word)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
