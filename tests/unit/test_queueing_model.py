"""loadtest.queueing's event model: FIFO by deadline on one replica, a later request's first chunk
overtaking an earlier request's later chunk (earliest deadline first), pooled replicas, and that
with one worker `shared` and `local` are the same system."""

from __future__ import annotations

import pytest

from loadtest.queueing import Shape, first_audio_times, model


def test_one_replica_serves_in_deadline_order_without_preemption():
    one = Shape((1.0,), (0.0,))
    assert first_audio_times([(0.0, one), (0.1, one)], 1) == pytest.approx([1.0, 1.9])
    # A's second chunk is due at 5 s; B arrives at 0.5 s (first chunk due at once): B goes first.
    two = Shape((1.0, 1.0), (0.0, 5.0))
    assert first_audio_times([(0.0, two), (0.5, one)], 1) == pytest.approx([1.0, 1.5])


def test_two_replicas_take_two_requests_at_once():
    one = Shape((1.0,), (0.0,))
    assert first_audio_times([(0.0, one), (0.1, one), (0.2, one)], 2) == pytest.approx([1.0, 1.0, 1.8])


def test_with_one_worker_shared_and_local_are_the_same_system():
    shapes = [Shape((0.02,), (0.0,)), Shape((0.01, 0.03), (0.0, 0.5))]
    result = model(shapes, workers=1, load=0.8, requests=2000)
    assert result["shared"] == result["local"]
