"""loadtest/bench/voice_fit_speech.py's own reading of what it measures: the niceness of another
process's threads from /proc, and which requests count as sent during the fit (only those the fit
ran through, from sending to the last byte)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from loadtest.bench.voice_fit_speech import summarize, thread_niceness


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_thread_niceness_reads_each_thread_of_another_process():
    child = subprocess.Popen([sys.executable, "-c", "import os, sys, threading; os.nice(7); "
                              "threading.Thread(target=sys.stdin.read).start(); print('ready', flush=True); "
                              "sys.stdin.read()"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "ready"
        seen = thread_niceness(child.pid)
    finally:
        child.stdin.close()
        child.wait(10)
    assert str(child.pid) in seen and len(seen) == 2
    assert set(seen.values()) == {min(19, os.nice(0) + 7)}  # the thread started after os.nice inherits it


def _row(phase: str, ttfa: float, before: str = "", after: str = "") -> dict:
    return {"phase": phase, "status": 200, "ttfa_s": ttfa, "e2e_s": ttfa + 0.1, "load_1m": 1.0,
            "fit_status": before, "fit_status_after": after}


def test_only_requests_the_fit_ran_through_count_as_during_it():
    rows = [_row("before", 1.0), _row("after", 3.0),
            _row("during", 4.0, "running", "running"), _row("during", 4.0, "running", "running"),
            _row("during", 9.0, "running", "cancelled"),  # the fit ended before its last byte
            _row("loading", 5.0, "running", "running")]
    summary = summarize(rows, {}, {})
    assert summary["phases"]["during"]["requests"] == 2 and summary["phases"]["during"]["ttfa_p50_s"] == 4.0
    assert summary["phases"]["loading"]["requests"] == 1
    assert summary["ttfa_p50_during_over_without"] == 2.0  # against the mean of before and after
