"""Voices: names, OpenAI aliases, mixes, and the style row the model reads.

A voice is a pack of 510 style vectors [510, 256], one per phoneme count: the model reads row
`num_phonemes - 1` (first 128 dims: decoder style, last 128: prosody style). A request names a voice
as one of:

- a Kokoro voice name from the loaded set (`af_heart`); the first letter is its language, the
  second its gender (`f` / `m`);
- an OpenAI voice name (`alloy`, `nova`, ...), mapped by `OPENAI_VOICES` below;
- a mix, `af_bella+af_sky` (equal parts) or `af_bella(2)+af_sky(1)` (weights, normalized to sum 1);
  `-` subtracts a voice, as in Kokoro-FastAPI: `af_bella(2)-af_sky(1)` is 2/3 of af_bella minus
  1/3 of af_sky (every weight divided by the sum of them all).

Names are checked against the loaded voices only; a request string never becomes a path. A mix is
computed once and kept in a bounded in-memory LRU.
"""

from __future__ import annotations

import difflib

import io
import re
import threading
from collections import OrderedDict
from dataclasses import dataclass

import torch

# lang_code (first letter of a voice name) -> language tag.
LANGUAGES = {"a": "en-us", "b": "en-gb", "e": "es", "f": "fr-fr", "h": "hi", "i": "it", "j": "ja",
             "p": "pt-br", "z": "zh"}
GENDERS = {"f": "female", "m": "male"}

# The OpenAI voice names, each mapped to the Kokoro voice closest in character. The one table:
# `openai_voice_table()` renders it for the README.
OPENAI_VOICES: dict[str, tuple[str, str]] = {
    "alloy": ("af_alloy", "Kokoro's own Alloy: neutral, even American female"),
    "ash": ("am_michael", "clear, conversational American male"),
    "ballad": ("bm_george", "warm, expressive British male"),
    "coral": ("af_heart", "warm, friendly American female (Kokoro's best-rated voice)"),
    "echo": ("am_echo", "Kokoro's own Echo: smooth American male"),
    "fable": ("bm_fable", "Kokoro's own Fable: storytelling British male"),
    "onyx": ("am_onyx", "Kokoro's own Onyx: deep American male"),
    "nova": ("af_nova", "Kokoro's own Nova: bright American female"),
    "sage": ("af_sarah", "calm, measured American female"),
    "shimmer": ("af_bella", "bright, lively American female"),
    "verse": ("am_fenrir", "expressive, dynamic American male"),
    "marin": ("af_jessica", "natural, relaxed American female"),
    "cedar": ("am_liam", "natural, relaxed American male"),
}

MIX_CACHE_SIZE = 64
_PART = re.compile(r"^(?P<name>[A-Za-z][A-Za-z0-9_]*)\s*(?:\(\s*(?P<weight>[^()]*?)\s*\))?$")


def _split_signed(spec: str) -> list[tuple[str, str]]:
    """`a(2)-b+c` -> [('+', 'a(2)'), ('-', 'b'), ('+', 'c')]: split at '+' and '-' outside
    parentheses, so a weight such as `(-1)` stays whole and is refused as a weight."""
    parts: list[tuple[str, str]] = []
    sign, start, depth = "+", 0, 0
    for i, ch in enumerate(spec):
        depth += (ch == "(") - (ch == ")")
        if ch in "+-" and depth == 0:
            parts.append((sign, spec[start:i]))
            sign, start = ch, i + 1
    parts.append((sign, spec[start:]))
    if len(parts) > 1 and not parts[0][1].strip() and parts[1][0] == "-":
        return [("-", parts[1][1]), *parts[2:]]  # a leading '-': the first voice is subtracted
    return parts


class VoiceError(ValueError):
    """The request's voice cannot be used; the message says what is wrong and how to find valid names."""

    param: str = "voice"


@dataclass
class Voice:
    name: str            # a Kokoro name, or the normalized mix spec ("af_bella(0.667)+af_sky(0.333)")
    lang_code: str       # the language the voice speaks (the first voice's, for a mix)
    pack: torch.Tensor   # float32 [510, 256]


@dataclass(frozen=True)
class VoiceInfo:
    name: str
    lang_code: str
    language: str
    gender: str


def openai_voice_table() -> str:
    """The OpenAI-name mapping as a Markdown table (the README carries it; a test keeps them equal)."""
    rows = ["| OpenAI voice | Kokoro voice | Character |", "|---|---|---|"]
    rows += [f"| `{openai}` | `{kokoro}` | {why} |" for openai, (kokoro, why) in OPENAI_VOICES.items()]
    return "\n".join(rows)


def voice_file(voice: Voice) -> bytes:
    """The voice as a `.pt` file in the official layout, [510, 1, 256] float32: what a weights
    directory's `voices/NAME.pt` holds, so a mix saved there is served by that name."""
    buffer = io.BytesIO()
    # clone: the pack may be a view into the memory-mapped weights, and torch.save writes a view's whole storage
    torch.save(voice.pack.reshape(voice.pack.shape[0], 1, -1).clone(), buffer)
    return buffer.getvalue()


def voice_language(name: str) -> str:
    return name[:1].lower()


class VoiceBank:
    """The loaded voices, with spec parsing, mixing and a bounded cache of mixes."""

    def __init__(self, voices: dict[str, torch.Tensor]):
        if not voices:
            raise ValueError("VoiceBank needs at least one voice")
        self._packs: dict[str, torch.Tensor] = {}
        for name, pack in voices.items():
            pack = torch.as_tensor(pack, dtype=torch.float32)
            self._packs[name] = pack.reshape(pack.shape[0], -1)  # official .pt packs are [510, 1, 256]
        self._mixes: OrderedDict[str, Voice] = OrderedDict()
        self._lock = threading.Lock()

    @property
    def names(self) -> list[str]:
        return sorted(self._packs)

    def list(self) -> list[VoiceInfo]:
        return [VoiceInfo(n, voice_language(n), LANGUAGES.get(voice_language(n), "unknown"),
                          GENDERS.get(n[1:2].lower(), "unknown")) for n in self.names]

    def resolve(self, spec: str) -> Voice:
        """A voice name, OpenAI alias or mix spec -> Voice. Raises VoiceError with what to fix."""
        if not isinstance(spec, str) or not spec.strip():
            raise VoiceError(f"voice is empty; {self._how_to_list()}")
        if len(spec) > 512:
            raise VoiceError(f"voice spec is {len(spec)} characters long; {self._how_to_list()}")
        parts = self._parse(spec)
        key = "".join(f"{sign}{name}({weight:g})" for sign, name, weight in parts) if len(parts) > 1 else parts[0][1]
        with self._lock:
            cached = self._mixes.get(key)
            if cached is not None:
                self._mixes.move_to_end(key)
                return cached
        if len(parts) == 1:
            name = parts[0][1]
            return Voice(name, voice_language(name), self._packs[name])
        total = sum(w for _, _, w in parts)
        pack = sum(self._packs[name] * (weight / total if sign == "+" else -weight / total)
                   for sign, name, weight in parts)
        normalized = "".join(f"{sign}{name}({weight / total:.3g})" for sign, name, weight in parts)[1:]
        voice = Voice(normalized, voice_language(parts[0][1]), pack)
        with self._lock:
            self._mixes[key] = voice
            while len(self._mixes) > MIX_CACHE_SIZE:
                self._mixes.popitem(last=False)
        return voice

    def style(self, voice: Voice, num_phonemes: int) -> torch.Tensor:
        """The style vector [256] for a chunk of `num_phonemes` ids: row num_phonemes - 1, clamped."""
        row = min(max(int(num_phonemes) - 1, 0), voice.pack.shape[0] - 1)
        return voice.pack[row]

    # --- parsing ---------------------------------------------------------------------------------

    def _parse(self, spec: str) -> list[tuple[str, str, float]]:
        """(sign, canonical name, weight) for each part of a spec; the first part's sign is '+'."""
        parts: list[tuple[str, str, float]] = []
        for sign, raw in _split_signed(spec):
            raw = raw.strip()
            if not raw:
                raise VoiceError(
                    f"voice {spec!r} has an empty part: join voices with single '+' (or '-' to subtract one), "
                    f"e.g. af_bella+af_sky or af_bella(2)+af_sky(1); {self._how_to_list()}")
            if sign == "-" and not parts:
                raise VoiceError(f"voice {spec!r} starts with '-': a mix subtracts voices from a first one, "
                                 f"e.g. af_bella(2)-af_sky(1); {self._how_to_list()}")
            m = _PART.match(raw)
            if not m:
                raise VoiceError(
                    f"voice {spec!r}: cannot read {raw!r}; write a voice name, optionally with a weight in "
                    f"parentheses, e.g. af_bella(2)+af_sky(1); {self._how_to_list()}")
            name, weight_text = m.group("name").lower(), m.group("weight")
            weight = 1.0
            if weight_text is not None:
                try:
                    weight = float(weight_text)
                except ValueError:
                    raise VoiceError(f"voice {spec!r}: weight {weight_text!r} of {name} is not a number; "
                                     "weights are positive numbers, e.g. af_bella(2)+af_sky(1)") from None
                if not weight > 0 or weight != weight or weight == float("inf"):
                    raise VoiceError(f"voice {spec!r}: weight {weight_text!r} of {name} must be a positive "
                                     "number, e.g. af_bella(2)+af_sky(1)")
            parts.append((sign, self._canonical(name, spec), weight))
        return parts

    def _canonical(self, name: str, spec: str) -> str:
        if name in self._packs:
            return name
        if name in OPENAI_VOICES:
            target = OPENAI_VOICES[name][0]
            if target in self._packs:
                return target
            raise VoiceError(f"voice {name!r} maps to {target}, which the loaded weights lack; {self._how_to_list()}")
        close = difflib.get_close_matches(name.lower(), [*self._packs, *OPENAI_VOICES], n=1, cutoff=0.75)
        guess = f"did you mean {close[0]!r}? " if close else ""
        raise VoiceError(f"unknown voice {name!r} in {spec!r}; {guess}{self._how_to_list()}")

    def _how_to_list(self) -> str:
        examples = ", ".join(self.names[:4])
        return (f"GET /v1/audio/voices lists the {len(self._packs)} valid "
                f"names (e.g. {examples}), plus the OpenAI names {', '.join(OPENAI_VOICES)}")
