"""The request options the speech path reads are declared once, on `SpeechOptions`, and typed: a
speech request and a live session's start hold the same fields (only a default differs), and make
the speech service's `SpeechRequest` the same way."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from pydantic import ValidationError

from api.protocol import (CaptionedSpeechRequest, LiveStart, PhonemeSpeechRequest, SpeechOptions,
                          SpeechRequestBody)

ROOT = Path(__file__).resolve().parents[2]
READ_BY_THE_SPEECH_PATH = {"model", "voice", "response_format", "speed", "lang_code", "normalization_options",
                           "volume_multiplier", "sample_rate"}


def test_the_options_the_speech_path_reads_are_fields_of_speech_options_itself():
    assert set(SpeechOptions.model_fields) == READ_BY_THE_SPEECH_PATH
    for body in (SpeechRequestBody, CaptionedSpeechRequest, LiveStart):
        assert READ_BY_THE_SPEECH_PATH <= set(body.model_fields)
    assert SpeechRequestBody.model_fields["response_format"].default == "mp3"
    assert LiveStart.model_fields["response_format"].default == "pcm"


def test_a_speech_request_and_a_live_start_make_the_same_speech_request():
    options = {"voice": " af_bella ", "speed": 1.5, "lang_code": "b",
               "normalization_options": {"url_normalization": False}}
    body = SpeechRequestBody.model_validate({"input": "Hi.", **options})
    start = LiveStart.model_validate({"type": "start", **options})
    assert body.speech_request("Hi.") == start.speech_request("Hi.")
    made = body.speech_request("Hi.")
    assert made.voice == "af_bella" and made.speed == 1.5 and not made.normalization.url_normalization


def test_only_a_speech_request_reads_voice_tags_and_aliases_and_a_captioned_one_its_caption_options():
    body = SpeechRequestBody.model_validate({"input": "Hi.", "allow_voice_tags": True,
                                             "voice_aliases": {"Grandpa": {"voice": "am_michael", "rate": 0.8},
                                                               "n": "af_bella"}})
    made = body.speech_request("Hi.")
    assert made.voice_tags and made.voice_aliases == {"grandpa": ("am_michael", 0.8), "n": ("af_bella", 1.0)}
    assert body.captions() == (True, "json")
    captioned = CaptionedSpeechRequest.model_validate({"input": "Hi.", "return_timestamps": False,
                                                       "caption_format": "srt"})
    assert captioned.captions() == (False, "srt")
    with pytest.raises(ValidationError):
        LiveStart.model_validate({"type": "start", "voice_aliases": {"n": "af_bella"}})


def test_a_phoneme_request_becomes_a_speech_request_with_every_option_set():
    req = PhonemeSpeechRequest.model_validate({"phonemes": "hɛlˈO", "speed": 2.0}).as_speech_request()
    assert req.speech_request(req.input, phonemes=True).speed == 2.0 and req.captions() == (True, "json")
    assert req.frontend_aliases() == {} and not req.reads_voice_tags()


def test_the_speech_path_needs_no_type_ignore_and_reads_no_request_field_by_getattr():
    files = [*sorted((ROOT / "api" / "speech").glob("*.py")), ROOT / "api" / "protocol.py", ROOT / "api" / "serving.py"]
    found = [f"{path.relative_to(ROOT)}:{n}: {line.strip()}" for path in files
             for n, line in enumerate(path.read_text().splitlines(), 1)
             if "type: ignore" in line or re.search(r"getattr\((req|job\.req|start|body|options|self\.start)\b", line)]
    assert not found, "\n".join(found)
