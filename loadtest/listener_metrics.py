"""The figures of a load test, as pure functions over what the client saw.

Nothing here touches the network or the clock: `client.py` records arrival times and byte counts,
and these functions turn them into the words we measure with (TTFA, E2E, RTF, underrun,
throughput, percentiles; loadtest/README.md defines them), so each can be tested on synthetic
input with known answers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Sequence

from worker.audio import SAMPLE_RATE

# A stream counts as continuous when its longest underrun stays under this.
CONTINUOUS_UNDERRUN_S = 0.100


@dataclass(frozen=True)
class Underrun:
    """A real-time player's stalls while it plays one stream from its first byte."""

    longest_s: float  # the longest single wait for data (the figure we report as "underrun")
    total_s: float  # all waits added up
    stalls: int  # how many times the player ran dry before the stream ended


def underrun(arrivals: Iterable[tuple[float, float]]) -> Underrun:
    """Stalls of a player that starts at the first audio and plays in real time.

    `arrivals` are (time the data arrived, seconds of audio it holds), in arrival order; times in
    any unit-consistent clock (seconds). The player starts playing at the first arrival. Whenever
    its buffer runs dry before the next data arrives it waits, then resumes at that arrival (it
    does not skip ahead), so a late chunk shifts everything after it, as for a real listener.
    """
    longest = total = 0.0
    stalls = 0
    plays_until: float | None = None  # the time the buffer runs dry if nothing more arrives
    for t, seconds in arrivals:
        if seconds <= 0:
            continue  # an empty read carries nothing to play; it neither starts nor feeds the player
        if plays_until is None:
            plays_until = t + seconds
            continue
        if t > plays_until:
            wait = t - plays_until
            longest = max(longest, wait)
            total += wait
            stalls += 1
            plays_until = t + seconds
        else:
            plays_until += seconds
    return Underrun(longest_s=longest, total_s=total, stalls=stalls)


def pcm_seconds(num_bytes: int, sample_rate: int = SAMPLE_RATE, sample_width: int = 2, channels: int = 1) -> float:
    """Seconds of audio in raw PCM bytes (16-bit mono 24 kHz by default, the API's `pcm`)."""
    return num_bytes / float(sample_rate * sample_width * channels)


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0..100) with linear interpolation between ranks; None when empty.

    Linear interpolation (numpy's default "linear" method) so p99 of 50 samples is not simply the
    maximum; NaN values are ignored.
    """
    xs = sorted(v for v in values if v is not None and not math.isnan(v))
    if not xs:
        return None
    if len(xs) == 1:
        return float(xs[0])
    rank = (len(xs) - 1) * q / 100.0
    lo = math.floor(rank)
    hi = min(lo + 1, len(xs) - 1)
    return float(xs[lo] + (xs[hi] - xs[lo]) * (rank - lo))


def distribution(values: Sequence[float]) -> dict[str, float | None]:
    """p50 / p95 / p99 / mean / max of a list of seconds (None where there is no sample)."""
    clean = [v for v in values if v is not None and not math.isnan(v)]
    return {
        "p50": percentile(clean, 50),
        "p95": percentile(clean, 95),
        "p99": percentile(clean, 99),
        "mean": (sum(clean) / len(clean)) if clean else None,
        "max": max(clean) if clean else None,
        "n": len(clean),
    }


def ratio(b: float | None, a: float | None) -> float | None:
    """b / a, or None when either is missing or a is zero (a ratio we cannot state honestly)."""
    if a is None or b is None or a == 0:
        return None
    return b / a
