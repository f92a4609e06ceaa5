"""`kokoro-fleet say --captions FILE.srt|.vtt`: subtitles of the text beside the audio, read back by
real subtitle parsers. In process, with the simulated engine's service standing in for the model
(`say` itself refuses KOKORO_ENGINE=sim): the real text frontend and word timestamps, audio of the
real length, in a fraction of a second. The model's own run of `say` is in tests/unit/test_say.py."""

from __future__ import annotations

import argparse
import html
import subprocess
import sys
import wave

import pytest
import srt
import webvtt

from cli import say_cli
from api.settings import Settings
from api.speech import build

TEXT = "Your total is $12.99, due on 3/14.\n\nDr. Smith paid it at 9:30 a.m. and kept the receipt."


@pytest.fixture
def sim_service(monkeypatch):
    service = build.build_local_service(Settings.from_env({"KOKORO_ENGINE": "sim"}))
    monkeypatch.setattr(build, "build_local_service", lambda settings: service)
    return service


def say(*argv: str) -> int:
    parser = argparse.ArgumentParser()
    say_cli.configure(parser)
    return say_cli.run(parser.parse_args(list(argv)))


def cues_of(path) -> list[tuple[int, int, str]]:
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".srt":
        return [(round(c.start.total_seconds() * 1000), round(c.end.total_seconds() * 1000), c.content)
                for c in srt.parse(text)]
    return [(c.start_time.in_milliseconds(), c.end_time.in_milliseconds(), html.unescape(c.text))
            for c in webvtt.from_string(text)]


@pytest.mark.parametrize("name", ["talk.srt", "talk.VTT"])
def test_say_writes_captions_of_the_text_beside_the_audio(sim_service, tmp_path, capsys, name):
    audio, captions = tmp_path / "talk.wav", tmp_path / name
    assert say(TEXT, "-o", str(audio), "--captions", str(captions)) == 0
    with wave.open(str(audio)) as w:
        audio_ms = w.getnframes() / w.getframerate() * 1000
    cues = cues_of(captions)
    assert len(cues) >= 2
    for (s1, e1, _), (s2, _, _) in zip(cues, cues[1:]):
        assert s1 < e1 <= s2, cues
    assert cues[-1][1] <= audio_ms
    assert " ".join(c[2].replace("\n", " ") for c in cues) == " ".join(TEXT.split())
    assert f"wrote {captions} ({name[-3:].lower()}): {len(cues)} cue(s)" in capsys.readouterr().out
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["talk.wav", name])  # no .part left


def test_say_leaves_no_file_when_synthesis_fails_midway(sim_service, tmp_path, monkeypatch):
    real_stream = sim_service.stream

    async def failing(plan):
        async for piece in real_stream(plan):
            yield piece
            raise RuntimeError("the replica died")

    monkeypatch.setattr(sim_service, "stream", failing)
    with pytest.raises(RuntimeError, match="replica died"):
        say(TEXT + " " + TEXT, "-o", str(tmp_path / "talk.mp3"), "--captions", str(tmp_path / "talk.vtt"))
    assert list(tmp_path.iterdir()) == []


def test_say_names_the_caption_formats_for_another_suffix(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "cli.main", "say", "Hi.", "-o", str(tmp_path / "out.wav"),
                           "--captions", str(tmp_path / "out.txt")], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and ".srt or .vtt" in proc.stderr, proc.stderr
    assert list(tmp_path.iterdir()) == []
