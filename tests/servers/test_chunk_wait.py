"""`python -m loadtest.chunk_wait` end to end on the tiny weights: one server per chunk size, a
reader's stream and a bot's requests beside it, and the figures it prints taken from them."""

from __future__ import annotations

import pytest

from loadtest import chunk_wait

pytestmark = pytest.mark.slow


def test_a_run_measures_the_bots_waits_the_readers_audio_and_the_replica(capsys):
    result = chunk_wait.one_run(200, "tiny", requests=3, settle_s=1.0)
    assert result["chunk_phonemes"] == 200
    assert 0 < result["wait_p50_s"] <= result["wait_p90_s"] <= result["wait_max_s"] < 30
    assert result["reader_audio_s_per_s"] > 0  # the reader's stream kept arriving beside the bot
    assert 0 < result["replica_busy"] <= 1.5 and result["audio_per_busy_s"] > 0
    assert chunk_wait.main(["--sizes", "100", "--rounds", "1", "--weights", "tiny", "--requests", "2"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("cpu: ") and "chunk_phonemes=100: bot's first audio p50" in out
