"""Japanese (`j`): the runs of Japanese in a text -> their words, each with Kokoro's phonemes.

Kokoro v1.0's Japanese voices were trained on misaki's cutlet G2P (`misaki.ja.JAG2P()`): MeCab
(fugashi) cuts the text into words and reads each in kana, misaki's table maps the kana to IPA
(with `ん` and `っ` assimilated to their neighbours), numbers are read in kana. We run the same
code but keep the written surface of every word it makes, so chunks can end between words and
timestamps can name them; the phonemes of a sentence are misaki's.

The dictionary is unidic-lite (a PyPI package; the full `unidic` needs a download at install
time, which machines without a model hub cannot make). MeCab memory-maps it, so the replicas of a
machine share its pages.
"""

from __future__ import annotations

import bisect
import itertools
import threading
from functools import lru_cache

from worker.text.source_map import MappedText

_lock = threading.Lock()
_JOINS_FORWARD = "ʔ"  # misaki writes a geminate stop against the next mora, with no space
_SLICE = 16  # groups misaki makes tokens of at a time; its own grouping is cubic in this
_FULL_SIZE_KANA = str.maketrans("ぁぃぅぇぉゃゅょゎァィゥェォャュョヮ", "あいうえおやゆよわアイウエオヤユヨワ")


@lru_cache(maxsize=1)
def _reader():
    """misaki's Cutlet, recording the surface of each word it romanizes (in the order its tokens
    come out, one per word), which misaki itself drops."""
    import jaconv
    from misaki.cutlet import JA_WORDS, Cutlet, Word

    longest_word = max(map(len, JA_WORDS))

    class SurfaceKeepingCutlet(Cutlet):
        def __init__(self) -> None:
            super().__init__()
            self.surfaces: list[str] = []

        def _romaji_word(self, word):
            self.surfaces.append(word.surface)
            try:
                return super()._romaji_word(word)
            except (KeyError, IndexError, ValueError, AssertionError):
                # A small kana where misaki's table has no pair for it ("ンャ": ん then ゃ) raised
                # KeyError, and the whole request failed; read it as the full-size kana instead.
                full = Word(word.surface, word.hira.translate(_FULL_SIZE_KANA), word.char_type)
                try:
                    return super()._romaji_word(full)
                except (KeyError, IndexError, ValueError, AssertionError):
                    return ""

        def _romaji_tokens(self, words):
            """misaki's tokens, without its cubic cost: misaki groups a run of one character type
            into dictionary words by joining every stretch of the run from its far end, so 4,096
            'の' (or '.', or '1 ') took minutes. We group first, trying only stretches no longer
            than the longest dictionary word (a longer one cannot be in it), then let misaki make
            the tokens of `_SLICE` groups at a time (its grouping of groups changes nothing). Each
            slice after the first starts with the previous slice's last group again, because a
            token's spacing depends on the word after it."""
            groups = _dictionary_groups(words)
            tokens = []
            for start in range(0, len(groups), _SLICE):
                first = len(self.surfaces)
                sliced = super()._romaji_tokens(groups[max(start - 1, 0):start + _SLICE])
                if start:  # the overlap: keep its spacing as the next group set it, drop the rest
                    tokens[-1].space = sliced[0].space
                    sliced = sliced[1:]
                    del self.surfaces[first]
                tokens.extend(sliced)
            return tokens

        def words(self, text: str) -> list[tuple[str, str, bool]]:
            """[(surface, phonemes, space after)] of already `_normalize_text`ed text, as misaki's
            `__call__` builds its string from them."""
            nodes = [Word(w.surface, jaconv.kata2hira(w.feature.pron or w.feature.kana or w.surface),
                          6 if w.char_type == 7 or not w.is_unk else w.char_type)
                     for w in self.tagger(text)]
            self.surfaces = []
            tokens = self._romaji_tokens(nodes)
            assert len(tokens) == len(self.surfaces), (text, len(tokens), len(self.surfaces))
            return [(surface, tok.surface.strip(), tok.space) for surface, tok in zip(self.surfaces, tokens)]

    def _dictionary_groups(words: list) -> list:
        """misaki's grouping (from each word, the longest stretch of the same character type
        whose surfaces together are a dictionary word, else the word alone), in linear time."""
        run_end = [len(words)] * len(words)
        for i in range(len(words) - 2, -1, -1):
            same = words[i + 1].char_type == words[i].char_type
            run_end[i] = run_end[i + 1] if same else i + 1
        groups, i = [], 0
        while i < len(words):
            stretches, surface = [], ""
            for j in range(i + 1, run_end[i] + 1):
                surface += words[j - 1].surface
                if len(surface) > longest_word:
                    break
                stretches.append((j, surface))
            j = next((j for j, s in reversed(stretches) if s in JA_WORDS), i + 1)
            group = words[i:j]
            groups.append(group[0] if len(group) == 1 else Word(
                "".join(w.surface for w in group), "".join(w.hira for w in group), group[0].char_type))
            i = j
        return groups

    return SurfaceKeepingCutlet()


def japanese_words(parts: list[str], read: list[bool]) -> list[list[tuple[str, str, int, int]]]:
    """The words, with phonemes, of each part to `read`: `parts` are a text's tokens in order (runs
    of Japanese, punctuation, a space for anything else), read as one text, because MeCab's reading
    of a word depends on what follows it (`一人3000円で、` reads 一人 and 円 differently from `一人3000円で`
    alone). Words that misaki joins without a space (a geminate `ʔ` and the mora after it) come back
    as one word. Each word comes with where it stands in its part ([start, end) of the part as
    given: misaki's normalization, numbers read in kana, is mapped back)."""
    with _lock:  # one MeCab tagger per process, and it is not thread-safe
        reader = _reader()
        # misaki's normalization (NFKC, width, numbers read in kana) token by token, so each token's
        # stretch of the text is known; it is the same as normalizing the text whole.
        normalized = [MappedText.of(p).aligned(reader._normalize_text(p)) if r else MappedText.of(p)
                      for p, r in zip(parts, read)]
        starts = list(itertools.accumulate((len(p) for p in normalized), initial=0))
        text = "".join(p.text for p in normalized)
        pieces = reader.words(text)
    out: list[list[tuple[str, str, int, int]]] = [[] for _ in parts]
    glued = [False] * len(parts)  # the part's last word joins the next piece without a space
    cursor = 0
    for surface, phonemes, space in pieces:
        at = text.find(surface, cursor) if surface else -1
        if at < 0:
            continue
        cursor = at + len(surface)
        part = bisect.bisect_right(starts, at) - 1
        if not read[part] or not (surface.strip() or phonemes):
            continue
        words = out[part]
        first, last = normalized[part].span(at - starts[part], min(cursor - starts[part], len(normalized[part])))
        if words and (glued[part] or phonemes.startswith(_JOINS_FORWARD)):
            words[-1] = (words[-1][0] + surface, words[-1][1] + phonemes, words[-1][2], max(last, words[-1][3]))
        else:
            words.append((surface, phonemes, first, last))
        glued[part] = not space or phonemes.endswith(_JOINS_FORWARD)
    return out
