"""`kokoro-fleet normalize TEXT` and `kokoro-fleet phonemize TEXT [--lang a]`.

`phonemize` prints each chunk with its phonemes and, per word, where its pronunciation came from
(misaki's lexicon, espeak-ng, a number, or a custom `[word](/phonemes/)`), so a user can tell why a
word sounds the way it does.
"""

from __future__ import annotations

import argparse
import json
import sys
import unicodedata

from api.settings import get_settings


def _read_text(args: argparse.Namespace) -> str:
    text = " ".join(args.text) if args.text else ""
    if not text or text == "-":
        text = sys.stdin.read()
    return text


def _options(args: argparse.Namespace):
    from worker.text.normalize import NormalizationOptions

    options = NormalizationOptions()
    if args.no_normalize:
        options.normalize = False
    if args.units:
        options.unit_normalization = True
    return options


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("text", nargs="*", help="the text (or - / nothing to read standard input)")
    parser.add_argument("--lang", default="a", help="language code: a (en-us), b (en-gb), e (es), f (fr-fr), "
                                                    "h (hi), i (it), j (ja), p (pt-br), z (zh)")
    parser.add_argument("--no-normalize", action="store_true", help="skip normalization (numbers stay digits)")
    parser.add_argument("--units", action="store_true", help="also expand units (10KB -> ten kilobytes)")
    parser.add_argument("--lexicon", default=get_settings().lexicon, metavar="FILE",
                        help="the deployment's pronunciations, a JSON file (default: KOKORO_LEXICON)")


def _normalized(args: argparse.Namespace, code: str) -> str:
    """The text to read, normalized with the lexicon as the server does."""
    from worker.text.lexicon import load_lexicon
    from worker.text.mandarin import use_segmenter_cache
    from worker.text.normalize import normalize_text

    use_segmenter_cache(get_settings().cache_dir)
    return normalize_text(_read_text(args), _options(args), code, load_lexicon(args.lexicon or None))


def configure_normalize(parser: argparse.ArgumentParser) -> None:
    _common(parser)


def run_normalize(args: argparse.Namespace) -> int:
    from worker.text import LexiconError, TextError
    from worker.text.g2p import resolve_language

    try:
        print(_normalized(args, resolve_language(args.lang)))
    except (TextError, LexiconError) as exc:
        print(f"kokoro-fleet normalize: {exc}", file=sys.stderr)
        return 2
    return 0


def configure_phonemize(parser: argparse.ArgumentParser) -> None:
    _common(parser)
    settings = get_settings()
    parser.add_argument("--first-chunk", type=int, default=settings.first_chunk_phonemes,
                        help="target phonemes of the first chunk (KOKORO_FIRST_CHUNK_PHONEMES)")
    parser.add_argument("--chunk", type=int, default=settings.chunk_phonemes,
                        help="target phonemes of later chunks (KOKORO_CHUNK_PHONEMES)")
    parser.add_argument("--ids", action="store_true", help="also print the model ids of each chunk")
    parser.add_argument("--json", action="store_true", help="print the chunks as JSON")


def run_phonemize(args: argparse.Namespace) -> int:
    from worker.text import LexiconError, TextError
    from worker.text.chunks import split_tokens
    from worker.text.g2p import resolve_language, text_to_tokens

    try:
        code = resolve_language(args.lang)
        normalized = _normalized(args, code)
        tokens = text_to_tokens(normalized, code)
    except (TextError, LexiconError) as exc:
        print(f"kokoro-fleet phonemize: {exc}", file=sys.stderr)
        return 2
    chunks = split_tokens(tokens, args.first_chunk, args.chunk)
    word_sources = [(t.text, t.phonemes, t.source) for t in tokens if t.kind == "word" and t.text]
    if args.json:
        print(json.dumps({
            "normalized": normalized,
            "chunks": [{"text": c.text, "phonemes": c.phonemes, "ids": c.ids, "pause_after": c.pause_after,
                        "words": [[w.text, w.start, w.end] for w in c.words]} for c in chunks],
            "words": [{"word": w, "phonemes": p, "source": s} for w, p, s in word_sources],
        }, ensure_ascii=False, indent=2))
        return 0
    for i, chunk in enumerate(chunks):
        pause = f", then {chunk.pause_after:g} s pause" if chunk.pause_after else ""
        print(f"chunk {i}: {len(chunk.ids)} phonemes{pause}")
        print(f"  text:     {chunk.text}")
        print(f"  phonemes: {chunk.phonemes}")
        if args.ids:
            print(f"  ids:      {chunk.ids}")
    print("words:")
    width = max((_columns(w) for w, _, _ in word_sources), default=0)
    for word, phonemes, source in word_sources:
        print(f"  {word}{' ' * (width - _columns(word))}  {phonemes or '-':<20}  {_describe(source)}")
    return 0


def _columns(text: str) -> int:
    """Terminal columns `text` takes: Chinese and Japanese characters are two wide."""
    return sum(2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in text)


def _describe(source: str) -> str:
    return {
        "lexicon": "misaki lexicon",
        "espeak": "espeak-ng (not in the lexicon)",
        "number": "number",
        "custom": "custom pronunciation",
        "pinyin": "jieba word, pypinyin reading (misaki's Mandarin)",
        "mecab": "MeCab word and reading, unidic-lite (misaki's Japanese)",
        "silent": "silent (nothing to pronounce)",
    }.get(source, source)
