"""Every request and response body of the HTTP API, in one place.

The speech request mirrors OpenAI's `POST /v1/audio/speech` (same fields, same bounds, unknown
fields rejected like the spec's `additionalProperties: false`) plus the Kokoro-FastAPI extensions
that existing clients send (`stream`, `lang_code`, `normalization_options`, `volume_multiplier`,
`return_download_link`, `download_format`; `return_timestamps` on the captioned endpoint), and for
telephony speaches' `sample_rate` and two raw G.711 formats, `mulaw` and `alaw`.
A speech request's or a live start's options make the speech service's `SpeechRequest`
(`SpeechOptions.speech_request`); serving code (api/serving.py) hands it on. Nothing here knows about HTTP.
"""

from __future__ import annotations

import dataclasses
import re
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Annotated, Any, Literal, get_type_hints

from pydantic import (AfterValidator, BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, create_model,
                      field_validator, model_validator)
from pydantic_core import InitErrorDetails, PydanticCustomError

from api.speech.contract import SpeechRequest

# The one model we serve, and the OpenAI model names accepted for it, so clients written for
# OpenAI work unchanged. Every alias means the same Kokoro-82M.
MODEL_ID = "kokoro"
MODEL_ALIASES = ("tts-1", "tts-1-hd", "gpt-4o-mini-tts", "gpt-4o-mini-tts-2025-12-15")
MODEL_IDS = (MODEL_ID, *MODEL_ALIASES)
DEFAULT_MAX_INPUT_CHARS = 4096
# A live session's writer has paused once no text came for this long: a model's tokens come tens
# of milliseconds apart (125 ms a word even at 8 words a second), a tool call takes seconds.
DEFAULT_LIVE_PAUSE_MS = 300

ResponseFormat = Literal["mp3", "opus", "aac", "flac", "wav", "pcm", "mulaw", "alaw"]
StreamFormat = Literal["audio", "sse"]
CaptionFormat = Literal["json", "srt", "vtt"]


def _normalization_model() -> type[BaseModel]:
    """A pydantic mirror of the text frontend's `NormalizationOptions` dataclass (same fields,
    same defaults), strict about unknown keys, so a typo answers 400 instead of being ignored."""
    try:
        from worker.text import NormalizationOptions
    except ImportError:  # the text frontend is not importable: accept the object as given
        return create_model("NormalizationOptions", __config__=ConfigDict(extra="allow"))
    hints = get_type_hints(NormalizationOptions)
    fields: dict[str, Any] = {}
    for f in dataclasses.fields(NormalizationOptions):
        if f.default is not dataclasses.MISSING:
            fields[f.name] = (hints[f.name], f.default)
        elif callable(f.default_factory):  # (MISSING is not)
            fields[f.name] = (hints[f.name], Field(default_factory=f.default_factory))
        else:
            fields[f.name] = (hints[f.name], ...)
    return create_model(
        "NormalizationOptions", __config__=ConfigDict(extra="forbid"),
        __doc__="Text normalization switches (Kokoro-FastAPI's `normalization_options`).", **fields)


if TYPE_CHECKING:  # built at import from the dataclass; a pydantic model to a type checker
    NormalizationOptionsModel = BaseModel
else:
    NormalizationOptionsModel = _normalization_model()


def _checked_text(value: str, info: ValidationInfo, name: str) -> str:
    """A body's text field (`input`, `text`, `phonemes`): not empty, within the request's character
    limit (validation context `max_input_chars`), and nothing the text frontend cannot take."""
    if not value.strip():
        raise ValueError(f"{name} is empty; give the {'phonemes' if name == 'phonemes' else 'text'} to speak")
    limit = (info.context or {}).get("max_input_chars", DEFAULT_MAX_INPUT_CHARS)
    if len(value) > limit:
        raise ValueError(f"{name} is {len(value)} characters; the limit is {limit}. Split it into several requests")
    nul = value.find("\x00")
    if nul >= 0:
        raise ValueError(f"{name} contains a NUL character (U+0000) at position {nul}; remove it")
    for i, ch in enumerate(value):
        if "\ud800" <= ch <= "\udfff":
            raise ValueError(f"{name} contains a lone UTF-16 surrogate (U+{ord(ch):04X}) at position {i}; "
                             "send valid Unicode text")
    return value


def _checked_sample_rate(rate: int | None, info: ValidationInfo) -> int | None:
    """`sample_rate` against the formats it applies to: the response's, and the download file's."""
    if rate is None:
        return rate
    from api.encoders import check_sample_rate

    formats = [info.data.get("response_format"), info.data.get("download_format")]
    for fmt in dict.fromkeys(f for f in formats if f is not None):
        check_sample_rate(fmt, rate)
    return rate


SAMPLE_RATE_DESCRIPTION = (
    "Output sample rate in Hz, 8000 to 48000 (speaches' field): the audio is resampled from the model's 24000. "
    "By default 24000, and 8000 for `mulaw` and `alaw`. mp3, aac and opus take only their codecs' rates "
    "(opus: 8000, 12000, 16000, 24000 or 48000).")


def _checked_model(value: str) -> str:
    if value not in MODEL_IDS:
        raise ValueError(f"unknown model {value!r}; use one of {', '.join(MODEL_IDS)}")
    return value


def _checked_voice(value: str | VoiceId) -> str | VoiceId:
    spec = value.id if isinstance(value, VoiceId) else value
    if not spec.strip():
        raise ValueError("voice is empty; give a voice name such as af_heart (GET /v1/audio/voices lists them)")
    return value


def _frontend_options(options: BaseModel | None):
    """A body's `normalization_options` as the text frontend's `NormalizationOptions` (None: its defaults)."""
    if options is None:
        return None
    from worker.text import NormalizationOptions

    return NormalizationOptions(**options.model_dump())


class VoiceId(BaseModel):
    """OpenAI's custom-voice object form, `{"id": "..."}`; here the id is any voice spec."""

    model_config = ConfigDict(extra="forbid")
    id: str


# A voice field: a name, an alias or a mix, as a string or OpenAI's `{"id": ...}`; never blank.
VoiceSpec = Annotated[str | VoiceId, AfterValidator(_checked_voice)]


class VoiceAlias(BaseModel):
    """A voice alias with its own pace (Kokoro-FastAPI's `{"voice": ..., "rate": ...}` form)."""

    model_config = ConfigDict(extra="forbid")
    voice: str = Field(..., min_length=1, description="The voice it stands for: a name or a mix.")
    rate: float = Field(1.0, gt=0, le=4.0, description="Its pace, times the request's speed, wherever it speaks.")


_ALIAS_NAME = re.compile(r"^[A-Za-z0-9_\-]{1,40}$")


def _checked_aliases(value: dict | None) -> dict | None:
    for name in value or {}:
        if not _ALIAS_NAME.match(name):
            raise ValueError(f"voice alias {name!r}: a name of 1 to 40 letters, digits, '_' or '-'")
    return value


VoiceAliases = Annotated[dict[str, str | VoiceAlias] | None, AfterValidator(_checked_aliases)]
DEFAULT_TURN_PAUSE_S = 0.4
VOICE_TAGS_DESCRIPTION = (
    "Kokoro-FastAPI's inline speaker tags: `[voice:am_michael]` reads all that follows in that voice (a name, "
    "a mix, or a `voice_aliases` name) and language, `[rate:1.5]` scales the pace of the voice speaking until the "
    "next rate or voice tag (on top of `speed`, kept within 0.25 to 4). Off: the tags are text like any other.")
VOICE_ALIASES_DESCRIPTION = (
    "Short names for voices in this request, for `voice` and for `[voice:...]` tags (matched case-insensitively): "
    "a name maps to a voice (`\"narrator\": \"af_bella(2)+af_sky\"`) or to a voice and its own pace "
    "(`\"grandpa\": {\"voice\": \"am_michael\", \"rate\": 0.8}`), which applies wherever it speaks.")


class SpeechOptions(BaseModel):
    """The options a speech request and a live session's `start` share, declared once: what the
    speech path reads (`speech_request` makes the speech service's `SpeechRequest` of them; the
    encoders take `response_format`, `volume_multiplier` and `sample_rate`). A body re-declares one
    only where its default differs."""

    model: str = Field(MODEL_ID, description=f"`{MODEL_ID}`; OpenAI's {', '.join(MODEL_ALIASES)} are accepted as aliases.")
    voice: VoiceSpec = Field(
        "af_heart",
        description="A voice name (`af_heart`), an OpenAI voice alias (`alloy`), or a mix: `af_bella+af_sky` "
                    "(equal weights), `af_bella(2)+af_sky(1)` (weighted) or `af_bella(2)-af_sky(1)` (subtracted; "
                    "weights are divided by the sum of them all).")
    response_format: ResponseFormat = Field(
        "mp3", description="Audio container and codec; `mulaw` and `alaw` are raw G.711 (telephone audio), "
                           "one byte a sample, 8 kHz unless `sample_rate` says otherwise.")
    speed: float = Field(1.0, ge=0.25, le=4.0, description="Speaking rate, 0.25 to 4.0.")
    lang_code: str | None = Field(
        None, description="Language of the text (`a` American English, `b` British English, `e`, `f`, `h`, `i`, "
                          "`j`, `p`, `z`); by default the voice's own language.")
    normalization_options: NormalizationOptionsModel | None = Field(
        None, description="How numbers, units, URLs and the like are spelled out before phonemization.")
    volume_multiplier: float = Field(1.0, ge=0.0, le=10.0, description="Gain applied to the audio (clipped at full scale).")
    sample_rate: int | None = Field(None, ge=8000, le=48000, description=SAMPLE_RATE_DESCRIPTION)

    @field_validator("model")
    @classmethod
    def _known_model(cls, value: str) -> str:
        return _checked_model(value)

    @model_validator(mode="after")
    def _carried_sample_rate(self) -> "SpeechOptions":
        """`sample_rate` against every format the audio is encoded in (`audio_formats`): checked once
        all fields are read, so a body's later `download_format` counts too."""
        from api.encoders import check_sample_rate

        if self.sample_rate is not None:
            for fmt in dict.fromkeys(self.audio_formats()):
                try:
                    check_sample_rate(fmt, self.sample_rate)
                except ValueError as error:
                    raise ValidationError.from_exception_data(type(self).__name__, [InitErrorDetails(
                        type=PydanticCustomError("value_error", "Value error, {error}", {"error": str(error)}),
                        loc=("sample_rate",), input=self.sample_rate)]) from None
        return self

    def audio_formats(self) -> tuple[ResponseFormat, ...]:
        """The formats this request's audio is encoded in: the response's (and a body's download file's)."""
        return (self.response_format,)

    @property
    def voice_spec(self) -> str:
        return self.voice.id if isinstance(self.voice, VoiceId) else self.voice.strip()

    def normalization(self):
        """The text frontend's `NormalizationOptions` for this request, or None for its defaults."""
        return _frontend_options(self.normalization_options)

    def reads_voice_tags(self) -> bool:
        """Whether the text's `[voice:...]` tags are read: a speech request's `allow_voice_tags`."""
        return False

    def frontend_aliases(self) -> dict[str, tuple[str, float]]:
        """Short names for voices, as the speech planner takes them: a speech request's `voice_aliases`."""
        return {}

    def speech_request(self, text: str, phonemes: bool = False) -> SpeechRequest:
        """What the speech service gets: `text` spoken with these options."""
        return SpeechRequest(text=text, voice=self.voice_spec, speed=self.speed, lang_code=self.lang_code,
                             normalization=self.normalization(), phonemes=phonemes,
                             voice_tags=self.reads_voice_tags(), voice_aliases=self.frontend_aliases())


class SpeechRequestBody(SpeechOptions):
    """Body of `POST /v1/audio/speech` (and of the captioned variant); api.speech's `SpeechRequest`
    is what the speech service gets from it. Documented under OpenAI's name for it."""

    model_config = ConfigDict(extra="forbid", title="SpeechRequest")

    input: str = Field(..., description="The text to speak. At most KOKORO_MAX_INPUT_CHARS characters (4096 by default).")
    stream_format: StreamFormat = Field(
        "audio", description="`audio`: the encoded file as a chunked body. `sse`: Server-Sent Events carrying "
                             "base64 audio deltas, then a done event with usage.")
    instructions: str | None = Field(
        None, max_length=4096,
        description="Accepted for compatibility with gpt-4o-mini-tts clients and ignored: Kokoro has no "
                    "instruction-following voice control.")
    stream: bool = Field(True, description="Send audio as it is synthesized (chunked). False: one body with Content-Length.")
    return_download_link: bool = Field(
        False, description="Kokoro-FastAPI's download link: also save the audio on the server and name it in the "
                           "`X-Download-Path` header (`/download/NAME`); `GET /v1/download/NAME` serves it, once "
                           "the response has ended, for KOKORO_DOWNLOAD_MAX_AGE_SECONDS.")
    download_format: ResponseFormat | None = Field(
        None, description="Format of the saved download file, when it should differ from `response_format`.")
    allow_voice_tags: bool = Field(False, description=VOICE_TAGS_DESCRIPTION)
    voice_aliases: VoiceAliases = Field(None, description=VOICE_ALIASES_DESCRIPTION)
    ssml: bool = Field(False, description="Kokoro-FastAPI's switch for SSML input. Here SSML (`<speak>`, `<break>`, "
                                          "`<voice>`, `<prosody rate>`, `<say-as>`, `<phoneme>`, `<sub>`) is read "
                                          "whenever `markup_normalization` is on, as it is by default, so this "
                                          "flag changes nothing; it is accepted for the clients that send it.")

    def reads_voice_tags(self) -> bool:
        return self.allow_voice_tags

    def audio_formats(self) -> tuple[ResponseFormat, ...]:
        return (self.response_format,) + ((self.download_format,) if self.download_format is not None else ())

    def frontend_aliases(self) -> dict[str, tuple[str, float]]:
        """`voice_aliases` as the speech planner takes them: lowercase name -> (voice spec, pace)."""
        return {name.lower(): (a.strip(), 1.0) if isinstance(a, str) else (a.voice.strip(), a.rate)
                for name, a in (self.voice_aliases or {}).items()}

    def captions(self) -> tuple[bool, CaptionFormat]:
        """(word timestamps sent, caption file format): a captioned request's `return_timestamps` and
        `caption_format`; a plain one sends its words (SSE) and no caption file."""
        return True, "json"

    @field_validator("input")
    @classmethod
    def _speakable_input(cls, value: str, info: ValidationInfo) -> str:
        return _checked_text(value, info, "input")


class CaptionedSpeechRequest(SpeechRequestBody):
    """Body of `POST /v1/audio/speech/captioned`: a speech request that may turn the words off."""

    model_config = ConfigDict(extra="forbid", title="CaptionedSpeechRequest")

    return_timestamps: bool = Field(True, description="Kokoro-FastAPI's switch: false sends the audio with an "
                                                      "empty `timestamps` list.")
    caption_format: CaptionFormat = Field(
        "json", description="`json`: the words in `timestamps` only. `srt` or `vtt`: also `captions`, a subtitle "
                            "file of the input's own text in cues of at most two lines. Streamed, each line's "
                            "`captions` holds the cues that became final; joined they are the file.")

    def captions(self) -> tuple[bool, CaptionFormat]:
        return self.return_timestamps, self.caption_format


# --- phonemes (Kokoro-FastAPI's /dev endpoints) ----------------------------------------------

class PhonemizeRequest(BaseModel):
    """Body of `POST /dev/phonemize`: the phonemes the server would speak for a text, no synthesis."""

    model_config = ConfigDict(extra="forbid")

    text: str = Field(..., description="The text to phonemize, as `input` of a speech request.")
    language: str = Field("a", description="Language code, as `lang_code` of a speech request.")
    normalization_options: NormalizationOptionsModel | None = Field(
        None, description="As in a speech request.")

    @field_validator("text")
    @classmethod
    def _text(cls, value: str, info: ValidationInfo) -> str:
        return _checked_text(value, info, "text")

    def normalization(self):
        return _frontend_options(self.normalization_options)


class PhonemizeChunk(BaseModel):
    """One piece the model speaks at once."""

    text: str = Field(..., description="The words as they are read: numbers, codes, symbols and markup "
                                       "spelled out.")
    phonemes: str = Field(..., description="Its phonemes, in Kokoro's alphabet.")


class PhonemizeResponse(BaseModel):
    phonemes: str       # Kokoro's alphabet, chunks joined by a space: fit for /dev/generate_from_phonemes
    tokens: list[int]   # the model's input ids, in order, without the boundary pads
    chunks: list[PhonemizeChunk] = Field(  # ours; Kokoro-FastAPI's clients read the two fields above
        default_factory=list, description="The pieces the text is cut into, each as read and as phonemes.")


class PhonemeSpeechRequest(BaseModel):
    """Body of `POST /dev/generate_from_phonemes`: speak phonemes as given (no normalization, no
    G2P), for pronunciations a text cannot spell. Answers WAV unless another format is asked."""

    model_config = ConfigDict(extra="forbid")

    phonemes: str = Field(..., description="Phonemes in Kokoro's alphabet, words separated by spaces "
                                           "(what /dev/phonemize returns).")
    voice: VoiceSpec = Field("af_heart", description="As in a speech request.")
    response_format: ResponseFormat = Field("wav", description="Audio container and codec.")
    speed: float = Field(1.0, ge=0.25, le=4.0, description="Speaking rate, 0.25 to 4.0.")
    stream: bool = Field(True, description="As in a speech request.")
    volume_multiplier: float = Field(1.0, ge=0.0, le=10.0, description="As in a speech request.")
    sample_rate: int | None = Field(None, ge=8000, le=48000, description=SAMPLE_RATE_DESCRIPTION)

    @field_validator("phonemes")
    @classmethod
    def _phonemes(cls, value: str, info: ValidationInfo) -> str:
        return _checked_text(value, info, "phonemes")

    @field_validator("sample_rate")
    @classmethod
    def _carried_sample_rate(cls, value: int | None, info: ValidationInfo) -> int | None:
        return _checked_sample_rate(value, info)

    def as_speech_request(self) -> SpeechRequestBody:
        """The same request in the speech endpoint's terms (already validated), `input` holding the phonemes."""
        return SpeechRequestBody.model_construct(
            input=self.phonemes, voice=self.voice, response_format=self.response_format, speed=self.speed,
            stream=self.stream, volume_multiplier=self.volume_multiplier, model=MODEL_ID, stream_format="audio",
            instructions=None, lang_code=None, normalization_options=None, return_download_link=False,
            download_format=None, sample_rate=self.sample_rate)


# --- dialogue (Kokoro-FastAPI's /dev/dialogue) -------------------------------------------------

class DialogueTurn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    voice: VoiceSpec = Field(..., description="Who speaks this turn: a voice name, a mix, or a `voice_aliases` name.")
    text: str = Field(..., min_length=1, description="What they say.")


class DialogueRequest(BaseModel):
    """Body of `POST /dev/dialogue`: a conversation as turns, each read in its speaker's voice and
    language, with a pause between speakers; one audio response, as from `/v1/audio/speech`."""

    model_config = ConfigDict(extra="forbid")

    model: str = Field(MODEL_ID, description="As in a speech request.")
    turns: list[DialogueTurn] = Field(..., min_length=1, description="The turns in order; consecutive turns of "
                                                                      "one voice are read as one.")
    pause_between_turns: float = Field(DEFAULT_TURN_PAUSE_S, ge=0.0, le=10.0,
                                       description="Seconds of silence where the speaker changes.")
    voice_aliases: VoiceAliases = Field(None, description=VOICE_ALIASES_DESCRIPTION)
    response_format: ResponseFormat = Field("mp3", description="As in a speech request.")
    speed: float = Field(1.0, ge=0.25, le=4.0, description="As in a speech request.")
    stream: bool = Field(True, description="As in a speech request.")
    lang_code: str | None = Field(None, description="As in a speech request (by default each speaker's language).")
    normalization_options: NormalizationOptionsModel | None = Field(
        None, description="As in a speech request.")
    volume_multiplier: float = Field(1.0, ge=0.0, le=10.0, description="As in a speech request.")
    sample_rate: int | None = Field(None, ge=8000, le=48000, description=SAMPLE_RATE_DESCRIPTION)

    @field_validator("model")
    @classmethod
    def _known_model(cls, value: str) -> str:
        return _checked_model(value)

    def speech_input(self) -> tuple[str, str]:
        """(the request's voice, its input): the first speaker's voice, and the turns joined with
        a `[voice:...]` tag and a pause wherever the speaker changes."""
        spec = lambda turn: turn.voice.id if isinstance(turn.voice, VoiceId) else turn.voice.strip()  # noqa: E731
        first = spec(self.turns[0])
        parts, speaking = [self.turns[0].text.strip()], first
        for turn in self.turns[1:]:
            if spec(turn) != speaking:
                speaking = spec(turn)
                pause = f"[pause:{self.pause_between_turns:g}s] " if self.pause_between_turns > 0 else ""
                parts.append(f"{pause}[voice:{speaking}]")
            parts.append(turn.text.strip())
        return first, " ".join(parts)

    def as_speech_request(self, context: dict) -> SpeechRequestBody:
        """The same conversation as a speech request with voice tags, checked as one (its
        `input` within the character limit)."""
        voice, text = self.speech_input()
        fields = self.model_dump(exclude={"turns", "pause_between_turns"}, exclude_none=True)
        return SpeechRequestBody.model_validate({**fields, "voice": voice, "input": text, "allow_voice_tags": True},
                                            context=context)


# --- errors ----------------------------------------------------------------------------------

class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    """OpenAI's error body: `{"error": {"message", "type", "param", "code"}}`."""

    error: ErrorDetail


# --- streaming events ------------------------------------------------------------------------

class SpeechUsage(BaseModel):
    """Token accounting as OpenAI reports it; here input tokens are phonemes, output tokens are
    25 ms audio frames (the model's duration unit)."""

    input_tokens: int
    output_tokens: int
    total_tokens: int


class SpeechAudioDelta(BaseModel):
    type: Literal["speech.audio.delta"] = "speech.audio.delta"
    audio: str  # base64 of the next bytes of the encoded file


class SpeechAudioDone(BaseModel):
    type: Literal["speech.audio.done"] = "speech.audio.done"
    usage: SpeechUsage


class StreamError(BaseModel):
    """Sent instead of the done event when synthesis fails after the response has started."""

    type: Literal["error"] = "error"
    error: ErrorDetail


# --- captioned speech ------------------------------------------------------------------------

class WordTimestampModel(BaseModel):
    word: str
    start_time: float  # seconds from the start of the audio
    end_time: float
    # [input_start, input_end): the characters (code points, Python string offsets) of the request's
    # `input` the word was read from, so `input[input_start:input_end]` is what to highlight while it
    # is spoken: "$12.99" for each of "twelve dollars and ninety-nine cents". On the live socket,
    # offsets into all the text of the session's `text` messages.
    input_start: int
    input_end: int
    # The voice that spoke it, with `allow_voice_tags` (Kokoro-FastAPI's multi-speaker captions); absent otherwise.
    voice: str | None = Field(None, exclude_if=lambda v: v is None)


class CaptionedSpeechResponse(BaseModel):
    """Body of `POST /v1/audio/speech/captioned` (non-streamed), and of each NDJSON line when
    streamed (then `audio` holds that piece's bytes of the one encoded file)."""

    audio: str  # base64
    audio_format: ResponseFormat
    timestamps: list[WordTimestampModel]
    # With `caption_format` srt or vtt: the subtitle file (streamed: its next part); absent otherwise.
    captions: str | None = Field(None, exclude_if=lambda v: v is None)


# --- live speech: WS /v1/audio/speech/live (api/live.py) -------------------------------------

class LiveStart(SpeechOptions):
    """The first message of a live session: its voice and audio, once (a speech request without
    `input`; the text comes in `text` messages)."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["start"]
    response_format: ResponseFormat = Field(
        "pcm", description="Format of the one audio stream the session sends as binary frames; `pcm` (24 kHz "
                           "s16le) or `mulaw` for a phone line play as they arrive.")
    timestamps: bool = Field(True, description="Send a `words` message with each piece's word timings.")
    pause_ms: int | None = Field(
        DEFAULT_LIVE_PAUSE_MS, ge=0, le=60_000,
        description="When no text comes for this long, speak the sentences already ended without waiting for the "
                    "text after them (a model pausing for a tool call after \"Let me check.\"). `null`: only "
                    "more text, `flush` or `end` completes them.")



class LiveText(BaseModel):
    """More text to speak: any cut of it, even mid-word; pieces are spoken as they complete."""

    model_config = ConfigDict(extra="forbid")
    type: Literal["text"]
    text: str = Field(..., description="The next characters of the text, at most KOKORO_MAX_INPUT_CHARS.")

    @field_validator("text")
    @classmethod
    def _text(cls, value: str, info: ValidationInfo) -> str:
        return _checked_text(value, info, "text") if value.strip() else value  # spaces alone are text too


class LiveFlush(BaseModel):
    """Speak what is buffered now, even mid-sentence (a turn's end); `flushed` follows its audio."""

    model_config = ConfigDict(extra="forbid")
    type: Literal["flush"]


class LiveClear(BaseModel):
    """Drop the text not spoken yet and stop the audio being made (the listener interrupted)."""

    model_config = ConfigDict(extra="forbid")
    type: Literal["clear"]


class LiveEnd(BaseModel):
    """Speak the rest, then `done`, and close the session."""

    model_config = ConfigDict(extra="forbid")
    type: Literal["end"]


class LiveStarted(BaseModel):
    type: Literal["started"] = "started"
    session_id: str
    response_format: ResponseFormat
    sample_rate: int  # of the audio in the binary frames


class LiveWords(BaseModel):
    """The words of the audio just sent, in seconds from the session's first audio sample."""

    type: Literal["words"] = "words"
    words: list[WordTimestampModel]
    # On a piece's first words only: seconds from the piece's text being complete (the server cut
    # it) to its first audio sent; the wait behind the pieces before it included.
    piece_latency: float | None = None


class LiveFlushed(BaseModel):
    """Every byte of audio for the text sent before the flush has been sent."""

    type: Literal["flushed"] = "flushed"


class LiveCleared(BaseModel):
    type: Literal["cleared"] = "cleared"


class LiveDone(BaseModel):
    type: Literal["done"] = "done"
    usage: SpeechUsage


# --- listings --------------------------------------------------------------------------------

class VoiceEntry(BaseModel):
    id: str          # what to pass as `voice` (Open WebUI reads id and name)
    name: str
    language: str
    lang_code: str | None = None
    gender: str


class VoiceList(BaseModel):
    voices: list[VoiceEntry]


class LegacyVoiceList(BaseModel):
    """`GET /v1/audio/voices?legacy=true`: the names alone, as Kokoro-FastAPI listed them before 0.3."""

    voices: list[str]


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "kokoro-fleet"


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


# Kokoro-82M v1.0's release day, as the `created` of every model card.
_CREATED = int(datetime(2025, 1, 27, tzinfo=timezone.utc).timestamp())


def model_cards() -> list[ModelCard]:
    return [ModelCard(id=name, created=_CREATED) for name in MODEL_IDS]
