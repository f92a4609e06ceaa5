"""The text frontend: raw request text -> normalized text -> phonemes -> chunks of model ids.

    text_to_chunks(text, lang_code="a", options=None, first_chunk_phonemes=60, chunk_phonemes=400,
                   lexicon=None)   # lexicon: load_lexicon(KOKORO_LEXICON), the deployment's pronunciations

is the one entry point the speech service calls; the pieces (normalize, g2p, chunks) are importable
for the CLI and tests.
"""

from worker.text.chunks import (MAX_PHONEMES, Chunk, WordSpan, language_loaded, load_language, phonemes_to_chunks,
                                split_tokens, text_to_chunks)
from worker.text.g2p import language_problem
from worker.text.text_errors import NothingToSay, TextError
from worker.text.lexicon import Lexicon, LexiconError, lexicon_status, load_lexicon
from worker.text.normalize import NormalizationOptions, normalize_text

__all__ = [
    "MAX_PHONEMES", "Chunk", "Lexicon", "LexiconError", "NormalizationOptions", "NothingToSay", "TextError", "WordSpan",
    "language_loaded", "language_problem", "lexicon_status", "load_language", "load_lexicon", "normalize_text", "phonemes_to_chunks", "split_tokens",
    "text_to_chunks",
]
