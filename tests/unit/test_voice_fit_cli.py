"""`kokoro-fleet voice fit` refuses every bad recording and name with one line saying what is wrong,
exit status 2, and writes nothing (tiny weights; the fit itself: tests/unit/test_voice_fit.py)."""

from __future__ import annotations

import numpy as np
import pytest

from cli.main import main
from voice_samples import speechlike, wav_file
from worker.voice_fit.recording import MAX_SAMPLE_BYTES

LOW = ((600, 1000, 2400), (300, 2000, 2800), (450, 800, 2300))
HIGH = ((900, 1500, 3000), (400, 2700, 3400), (700, 1200, 2900))


def test_bad_input_is_refused_and_nothing_is_written(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("KOKORO_WEIGHTS", "tiny")
    out = tmp_path / "voices"
    out.mkdir()
    rng = np.random.default_rng(0)
    good = wav_file(speechlike(10, 110, LOW, seed=1))
    cases = {
        "is silent": (wav_file(np.zeros(16000 * 12, np.float32)), "af_mine"),
        "sounds like noise": (wav_file(rng.normal(0, 0.1, 16000 * 12).astype(np.float32)), "af_mine"),
        "holds 4.0 s of speech": (wav_file(speechlike(4, 120, LOW)), "af_mine"),
        "more than one voice": (wav_file(np.concatenate([speechlike(10, 110, LOW, seed=1),
                                                         speechlike(10, 240, HIGH, seed=2)])), "af_mine"),
        "does not decode": (b"RIFF\x00\x00\x00\x00WAVEnot audio at all" * 10, "af_mine"),
        "send at most 25 MiB": (b"\x00" * (MAX_SAMPLE_BYTES + 1), "af_mine"),
        "starts with its language letter": (good, "mine"),
        "is a built-in voice's": (good, "af_heart"),
    }
    for i, (expected, (data, name)) in enumerate(cases.items()):
        sample = tmp_path / f"sample{i}.wav"
        sample.write_bytes(data)
        code = main(["voice", "fit", str(sample), "--name", name, "--output-dir", str(out)])
        err = capsys.readouterr().err
        assert code == 2 and "kokoro-fleet voice fit: error:" in err and expected in err, (expected, err)
    assert main(["voice", "fit", str(tmp_path / "missing.wav"), "--name", "af_mine", "--output-dir", str(out)]) == 2
    assert list(out.iterdir()) == []


@pytest.mark.parametrize("argv", [["voice"], ["voice", "fit"]])
def test_the_command_says_what_it_needs(argv, capsys):
    with pytest.raises(SystemExit) as stopped:
        main(argv)
    assert stopped.value.code == 2 and "usage: kokoro-fleet voice" in capsys.readouterr().err
