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

A deployment adds its own voices (a mix saved from `/v1/audio/voices/combine`, a voice made with a
tool such as KVoiceWalk) as files in one directory, `KOKORO_VOICES_DIR`: `af_brand.pt` is served as
`af_brand`, an American English female voice, as Kokoro-FastAPI serves the files of its voices
folder. The directory is looked at again at most every `RECHECK_S`, and at once when a request names
a voice not loaded, so a file dropped in is usable by its next request in every worker, without a
restart. A file that does not read (a wrong shape, NaNs, a name without a language) is skipped,
logged once and shown by `VoiceBank.directory_status()` (in /health); a broken edit of a file that
read before keeps the voice as it was.
"""

from __future__ import annotations

import difflib
import io
import logging
import os
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from worker.request_errors import RequestFieldError
from worker.text.text_errors import TextError

log = logging.getLogger("kokoro_fleet.voices")

# lang_code (first letter of a voice name) -> language tag.
LANGUAGES = {"a": "en-us", "b": "en-gb", "e": "es", "f": "fr-fr", "h": "hi", "i": "it", "j": "ja",
             "p": "pt-br", "z": "zh"}
GENDERS = {"f": "female", "m": "male"}

# The OpenAI voice names, each mapped to the Kokoro voice closest in character. The one table:
# `openai_voice_table()` renders it for docs/voices.md.
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
# The deployment's voice files: the official `.pt` ([510, 1, 256] or [510, 256]), kokoro-js's raw
# float32 `.bin`, or a NumPy `.npy`; files larger than a float64 pack would be are refused unread.
VOICE_FILE_SUFFIXES = (".pt", ".bin", ".npy")
MAX_VOICE_FILE_BYTES = 4 << 20
# How often the voices directory is listed (a stat per file, microseconds) for changes.
RECHECK_S = 1.0
# A voice file's name says its language and gender, as Kokoro's own names do: af_brand.pt.
_VOICE_FILE_NAME = re.compile(r"^(?P<lang>[a-z])(?P<gender>[a-z])_[a-z0-9_]+$")
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


class VoiceError(RequestFieldError):
    """The request's voice cannot be used; the message says what is wrong and how to find valid names."""

    param: str = "voice"
    code: str | None = "invalid_voice"  # also where an endpoint names the field otherwise (`voices`)


# Makes the error a bad voice spec raises: VoiceError, or a VoiceInInputError quoting the markup.
Refusal = Callable[[str], RequestFieldError]


class VoiceInInputError(TextError):
    """A voice the input's markup names (`<voice name>`, `[voice:...]`) cannot be used: a fault of
    the input, whose message quotes the markup."""

    @classmethod
    def quoting(cls, written: str) -> Callable[[str], "VoiceInInputError"]:
        return lambda message: cls(f"{written} in the input: {message}")


@dataclass
class Voice:
    name: str            # a Kokoro name, or the normalized mix spec ("af_bella(0.667)+af_sky(0.333)")
    lang_code: str       # the language the voice speaks (the first voice's, for a mix)
    pack: torch.Tensor   # float32 [510, 256]
    # The spec that resolves to this very pack on any worker: the name, or for a mix each part's
    # name with its exact weight (`name` rounds them). What a chunk job carries to the replica.
    canonical: str = ""

    def __post_init__(self):
        self.canonical = self.canonical or self.name


@dataclass(frozen=True)
class VoiceInfo:
    name: str
    lang_code: str
    language: str
    gender: str


def openai_voice_table() -> str:
    """The OpenAI-name mapping as a Markdown table (docs/voices.md carries it; a test keeps them equal)."""
    rows = ["| OpenAI voice | Kokoro voice | Character |", "|---|---|---|"]
    rows += [f"| `{openai}` | `{kokoro}` | {why} |" for openai, (kokoro, why) in OPENAI_VOICES.items()]
    return "\n".join(rows)


def voice_file(voice: Voice) -> bytes:
    """The voice as a `.pt` file in the official layout, [510, 1, 256] float32: saved in the voices
    directory (KOKORO_VOICES_DIR) as NAME.pt, a mix is served by that name."""
    buffer = io.BytesIO()
    # clone: the pack may be a view into the memory-mapped weights, and torch.save writes a view's whole storage
    torch.save(voice.pack.reshape(voice.pack.shape[0], 1, -1).clone(), buffer)
    return buffer.getvalue()


def voice_language(name: str) -> str:
    return name[:1].lower()


class VoiceFileError(ValueError):
    """A file of the voices directory cannot be served; the message names it and says why."""


def read_voice_file(path: str | Path, shape: tuple[int, int]) -> torch.Tensor:
    """The float32 pack of shape `shape` ([510, 256] for Kokoro-82M) in a `.pt`, `.bin` or `.npy`
    voice file; VoiceFileError saying what is wrong with it."""
    path = Path(path)
    rows, width = shape
    try:
        size = path.stat().st_size
        if size > MAX_VOICE_FILE_BYTES:
            raise VoiceFileError(f"{path}: {size} bytes, far more than a voice ([{rows}, 1, {width}] float32 "
                                 f"is {rows * width * 4} bytes); is it a voice file?")
        suffix = path.suffix.lower()
        if suffix == ".pt":
            pack = torch.load(path, map_location="cpu", weights_only=True)
        elif suffix == ".npy":
            pack = torch.from_numpy(np.load(path, allow_pickle=False))
        else:  # .bin: kokoro-js's layout, raw little-endian float32
            raw = path.read_bytes()
            if len(raw) != rows * width * 4:
                raise VoiceFileError(f"{path}: {len(raw)} bytes; a .bin voice is raw float32 [{rows}, {width}], "
                                     f"{rows * width * 4} bytes")
            pack = torch.from_numpy(np.frombuffer(raw, dtype="<f4").reshape(rows, width).copy())
    except VoiceFileError:
        raise
    except Exception as e:  # OSError, a pickle that is not a plain tensor, a malformed .npy
        raise VoiceFileError(f"{path}: cannot read it as a voice ({type(e).__name__}: {e})") from None
    if not isinstance(pack, torch.Tensor) or not pack.is_floating_point():
        raise VoiceFileError(f"{path}: holds {type(pack).__name__ if not isinstance(pack, torch.Tensor) else pack.dtype}"
                             f", not a float tensor of style vectors [{rows}, 1, {width}]")
    if pack.numel() != rows * width or pack.shape[0] != rows or pack.shape[-1] != width:
        raise VoiceFileError(f"{path}: shape {list(pack.shape)}, expected [{rows}, 1, {width}] or [{rows}, {width}] "
                             "(one style vector per phoneme count), as the official voices/*.pt files")
    pack = pack.reshape(rows, width).to(torch.float32).contiguous()
    if not torch.isfinite(pack).all():
        raise VoiceFileError(f"{path}: holds NaN or infinite values")
    return pack


def voice_file_name(path: str | Path) -> str:
    """The voice name a file is served as (its stem, lowercase); VoiceFileError when the name does
    not say a language and gender as Kokoro's names do."""
    path = Path(path)
    name = path.stem.lower()
    m = _VOICE_FILE_NAME.match(name)
    if not m or m.group("lang") not in LANGUAGES or m.group("gender") not in GENDERS:
        languages = ", ".join(f"{code} {tag}" for code, tag in LANGUAGES.items())
        raise VoiceFileError(
            f"{path}: a voice file's name gives the voice's language and gender, then '_' and a name of "
            f"letters, digits and '_', as Kokoro's own voices do: af_brand{path.suffix} is an American "
            f"English female voice, bm_narrator{path.suffix} a British English male one (languages: "
            f"{languages}; genders: f, m)")
    return name


class VoiceDirectory:
    """The voice files of one directory (KOKORO_VOICES_DIR), as it now stands: `current()` lists it
    again once RECHECK_S has passed (or when forced) and reads only the files that changed."""

    def __init__(self, path: str | Path, shape: tuple[int, int]):
        self.path = Path(path)
        self.shape = shape
        self.voices: dict[str, torch.Tensor] = {}
        self.version = 0                  # bumped whenever `voices` changes
        self.errors: dict[str, str] = {}  # file name -> why it is not served as it stands
        self.read_at = 0.0                # time.time() of the last change taken
        # file name -> (stamp, voice name, pack to serve or None, why not as it stands)
        self._files: dict[str, tuple[tuple, str, torch.Tensor | None, str | None]] = {}
        self._checked = -float("inf")
        self._lock = threading.Lock()

    def current(self, force: bool = False) -> tuple[dict[str, torch.Tensor], int]:
        """(name -> pack, version) of the directory's voices."""
        with self._lock:
            now = time.monotonic()
            if force or now - self._checked >= RECHECK_S:
                self._checked = now
                self._rescan()
            return self.voices, self.version

    def status(self) -> dict:
        with self._lock:
            return {"path": str(self.path), "voices": sorted(self.voices), "read_at": round(self.read_at, 3),
                    "errors": dict(self.errors)}

    def refuses(self, name: str) -> bool:
        """Whether a file of the directory would give `name` but does not read."""
        with self._lock:
            return any(known[1] == name and known[2] is None for known in self._files.values())

    def _rescan(self) -> None:
        try:
            entries = [e for e in os.scandir(self.path) if e.is_file() and not e.name.startswith(".")
                       and os.path.splitext(e.name)[1].lower() in VOICE_FILE_SUFFIXES]
        except OSError as e:  # gone or unmounted: the voices read before stay until it is back
            message = f"{self.path}: cannot list it ({e.strerror or e}); the voices read before stay"
            if self.errors.get("") != message:
                log.error("%s", message)
            self.errors = {"": message}
            return
        files, voices, errors = {}, {}, {}
        for entry in sorted(entries, key=lambda e: e.name):
            try:
                st = entry.stat()
            except OSError:  # removed since the listing
                continue
            stamp = (st.st_ino, st.st_size, st.st_mtime_ns)
            known = self._files.get(entry.name)
            if known is None or known[0] != stamp:  # new or changed: read it (once per version)
                known = (stamp, *self._read(Path(entry.path), known))
            files[entry.name] = known
            _, name, pack, error = known
            if pack is not None and name in voices:
                pack, error = None, f"{entry.path}: {name} is also given by another file here; remove one"
            if pack is not None:
                voices[name] = pack
            if error:
                errors[entry.name] = error
        changed = voices.keys() != self.voices.keys() or any(voices[n] is not self.voices[n] for n in voices)
        self._files, self.errors = files, errors
        if changed or not self.read_at:  # the first look says what it found, even nothing
            log.info("voices from %s: %s", self.path, ", ".join(sorted(voices)) or "none yet")
            self.voices, self.version, self.read_at = voices, self.version + 1, time.time()

    def _read(self, path: Path, known: tuple | None) -> tuple[str, torch.Tensor | None, str | None]:
        """(name, pack to serve, error) of a new or changed file: a broken edit of a file that read
        before keeps its last good pack, as a lexicon keeps its entries."""
        try:
            name = voice_file_name(path)
            return name, read_voice_file(path, self.shape), None
        except VoiceFileError as e:
            kept = known[2] if known is not None and known[1] == path.stem.lower() else None
            message = f"{e}; {'the voice as read before stays' if kept is not None else 'not served'}"
            log.error("%s", message)
            return path.stem.lower(), kept, message


def check_voice_dir(path: str | Path, shape: tuple[int, int] = (510, 256)) -> dict[str, torch.Tensor]:
    """Every voice in the directory, read now; VoiceFileError listing each file that does not read
    (or the directory itself): `serve` refuses to start on one, as on a malformed lexicon."""
    if not Path(path).is_dir():
        raise VoiceFileError(f"KOKORO_VOICES_DIR {path}: no such directory")
    directory = VoiceDirectory(path, shape)
    voices, _ = directory.current(force=True)
    if directory.errors:
        raise VoiceFileError("KOKORO_VOICES_DIR: " + "; ".join(directory.errors.values()))
    return voices


class VoiceBank:
    """The loaded voices (the weights' own, then the voices directory's, which win on a shared
    name), with spec parsing, mixing and a bounded cache of mixes."""

    def __init__(self, voices: dict[str, torch.Tensor], directory: str | Path | None = None):
        if not voices:
            raise ValueError("VoiceBank needs at least one voice")
        self._builtin: dict[str, torch.Tensor] = {}
        for name, pack in voices.items():
            pack = torch.as_tensor(pack, dtype=torch.float32)
            self._builtin[name] = pack.reshape(pack.shape[0], -1)  # official .pt packs are [510, 1, 256]
        self._packs = self._builtin
        self._mixes: OrderedDict[str, Voice] = OrderedDict()
        self._lock = threading.Lock()
        shape = tuple(next(iter(self._builtin.values())).shape)
        self._directory = VoiceDirectory(directory, shape) if directory else None
        self._directory_version = 0
        self._refresh()

    @property
    def names(self) -> list[str]:
        self._refresh()
        return sorted(self._packs)

    @property
    def builtin_names(self) -> list[str]:
        """The weights' own voices (a fitted voice may not take their names)."""
        return sorted(self._builtin)

    def list(self) -> list[VoiceInfo]:
        return [VoiceInfo(n, voice_language(n), LANGUAGES.get(voice_language(n), "unknown"),
                          GENDERS.get(n[1:2].lower(), "unknown")) for n in self.names]

    def rescan(self) -> None:
        """Look at the voices directory now (a voice this process just removed or added), rather
        than within RECHECK_S."""
        self._refresh(force=True)

    def directory_status(self) -> dict | None:
        """The voices directory as this process serves it (None: no directory): its voices, when
        they last changed, and each file not served as it stands, with why."""
        self._refresh()
        return self._directory.status() if self._directory is not None else None

    def _refresh(self, force: bool = False) -> None:
        if self._directory is None:
            return
        custom, version = self._directory.current(force)
        if version == self._directory_version:
            return
        with self._lock:
            self._packs = {**self._builtin, **custom}
            self._mixes.clear()  # a mix of a voice whose file changed is stale
            self._directory_version = version
        overridden = sorted(set(custom) & set(self._builtin))
        if overridden:
            log.info("voices from %s replace the weights' own %s", self._directory.path, ", ".join(overridden))

    def resolve(self, spec: str, written_in_input: str | None = None) -> Voice:
        """A voice name, OpenAI alias or mix spec -> Voice. Raises VoiceError with what to fix; for
        a voice the input's markup names (`written_in_input`, as it was written there), a
        VoiceInInputError, a fault of the input that quotes the markup."""
        refuse = VoiceError if written_in_input is None else VoiceInInputError.quoting(written_in_input)
        voice = self._resolution(spec, refuse)
        if not isinstance(voice, Voice):
            raise voice
        return voice

    def find(self, spec: str) -> Voice | None:
        """The voice `spec` names, or None where `resolve` would refuse it (and say why)."""
        voice = self.resolution(spec)
        return voice if isinstance(voice, Voice) else None

    def resolution(self, spec: str) -> Voice | RequestFieldError:
        """The voice `spec` names, or the VoiceError `resolve` would raise (returned, not raised)."""
        return self._resolution(spec, VoiceError)

    def _resolution(self, spec: str, refuse: Refusal) -> Voice | RequestFieldError:
        """The voice `spec` names, or the error that says what to fix (returned, not raised)."""
        self._refresh()
        if not isinstance(spec, str) or not spec.strip():
            return refuse(f"voice is empty; {self._how_to_list()}")
        if len(spec) > 512:
            return refuse(f"voice spec is {len(spec)} characters long; {self._how_to_list()}")
        parts = self._parse(spec, refuse)
        if not isinstance(parts, list):
            return parts
        # exact weights (repr): the key is also the mix's canonical spec, which must make the same pack
        key = "".join(f"{sign}{name}({weight!r})" for sign, name, weight in parts)[1:] if len(parts) > 1 else parts[0][1]
        with self._lock:
            cached = self._mixes.get(key)
            if cached is not None:
                self._mixes.move_to_end(key)
                return cached
        # One view of the voices for the whole mix: the directory may change while it is computed.
        packs, version = self._packs, self._directory_version
        gone = [name for _, name, _ in parts if name not in packs]
        if gone:  # its file was removed between the name's check and now
            return refuse(f"voice {gone[0]!r} was just removed; {self._how_to_list()}")
        if len(parts) == 1:
            name = parts[0][1]
            return Voice(name, voice_language(name), packs[name])
        total = sum(w for _, _, w in parts)
        pack = sum(packs[name] * (weight / total if sign == "+" else -weight / total)
                   for sign, name, weight in parts)
        normalized = "".join(f"{sign}{name}({weight / total:.3g})" for sign, name, weight in parts)[1:]
        voice = Voice(normalized, voice_language(parts[0][1]), pack, canonical=key)
        with self._lock:
            if version != self._directory_version:
                return voice  # made from voices since replaced: used once, not kept
            self._mixes[key] = voice
            while len(self._mixes) > MIX_CACHE_SIZE:
                self._mixes.popitem(last=False)
        return voice

    def style(self, voice: Voice, num_phonemes: int) -> torch.Tensor:
        """The style vector [256] for a chunk of `num_phonemes` ids: row num_phonemes - 1, clamped."""
        row = min(max(int(num_phonemes) - 1, 0), voice.pack.shape[0] - 1)
        return voice.pack[row]

    # --- parsing ---------------------------------------------------------------------------------

    def _parse(self, spec: str, refuse: Refusal) -> list[tuple[str, str, float]] | RequestFieldError:
        """(sign, canonical name, weight) for each part of a spec (the first part's sign is '+'), or
        the error that says what to fix."""
        parts: list[tuple[str, str, float]] = []
        for sign, raw in _split_signed(spec):
            raw = raw.strip()
            if not raw:
                return refuse(
                    f"voice {spec!r} has an empty part: join voices with single '+' (or '-' to subtract one), "
                    f"e.g. af_bella+af_sky or af_bella(2)+af_sky(1); {self._how_to_list()}")
            if sign == "-" and not parts:
                return refuse(f"voice {spec!r} starts with '-': a mix subtracts voices from a first one, "
                              f"e.g. af_bella(2)-af_sky(1); {self._how_to_list()}")
            m = _PART.match(raw)
            if not m:
                return refuse(
                    f"voice {spec!r}: cannot read {raw!r}; write a voice name, optionally with a weight in "
                    f"parentheses, e.g. af_bella(2)+af_sky(1); {self._how_to_list()}")
            name, weight_text = m.group("name").lower(), m.group("weight")
            weight = 1.0
            if weight_text is not None:
                try:
                    weight = float(weight_text)
                except ValueError:  # float()'s own: the weight is not a number
                    return refuse(f"voice {spec!r}: weight {weight_text!r} of {name} is not a number; "
                                  "weights are positive numbers, e.g. af_bella(2)+af_sky(1)")
                if not weight > 0 or weight != weight or weight == float("inf"):
                    return refuse(f"voice {spec!r}: weight {weight_text!r} of {name} must be a positive "
                                  "number, e.g. af_bella(2)+af_sky(1)")
            canonical = self._canonical(name, spec, refuse)
            if not isinstance(canonical, str):
                return canonical
            parts.append((sign, canonical, weight))
        return parts

    def _canonical(self, name: str, spec: str, refuse: Refusal) -> str | RequestFieldError:
        if name in self._packs:
            return name
        if self._directory is not None and name not in OPENAI_VOICES:
            self._refresh(force=True)  # a file just dropped in, or one another worker already serves
            if name in self._packs:
                return name
            if self._directory.refuses(name):
                return refuse(f"voice {name!r}: its file in the server's voices directory does not read as a "
                              "voice, so it is not served; /health shows why (under voices_dir)")
        if name in OPENAI_VOICES:
            target = OPENAI_VOICES[name][0]
            if target in self._packs:
                return target
            return refuse(f"voice {name!r} maps to {target}, which the loaded weights lack; {self._how_to_list()}")
        close = difflib.get_close_matches(name.lower(), [*self._packs, *OPENAI_VOICES], n=1, cutoff=0.75)
        guess = f"did you mean {close[0]!r}? " if close else ""
        return refuse(f"unknown voice {name!r} in {spec!r}; {guess}{self._how_to_list()}")

    def _how_to_list(self) -> str:
        examples = ", ".join(self.names[:4])
        return (f"GET /v1/audio/voices lists the {len(self._packs)} valid "
                f"names (e.g. {examples}), plus the OpenAI names {', '.join(OPENAI_VOICES)}")
