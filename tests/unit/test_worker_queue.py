"""The worker's queue owner, driven without Redis or a server: each side's report changes the state
only through the owner's synchronous methods, and what one side reports the other reads back.

Also the rule that no other module holds or changes that state: an ast walk over api/speech/ finds
no assignment into the owner or its counters outside api/speech/worker_queue.py, and the two sides'
objects hold none of its fields.
"""

from __future__ import annotations

import ast
import asyncio
from pathlib import Path

import numpy as np
import pytest

from api.speech.worker_queue import ADMISSION, REPLICA, FleetCounters, WorkerQueueOwner

ROOT = Path(__file__).resolve().parents[2]


def test_an_own_chunk_handed_over_and_accepted_is_taken_once_with_its_durations():
    owner = WorkerQueueOwner("w1")
    owner.hand_over("r1#0", b"\x01\x00")
    assert owner.take_accepted("r1#0") is None, "not readable before Redis accepted its completion"
    owner.completion_accepted("r1#0", np.array([3, 4]), released=False)
    pcm, durations = owner.take_accepted("r1#0")
    assert pcm == b"\x01\x00" and durations.tolist() == [3, 4] and durations.dtype == np.int64
    assert owner.take_accepted("r1#0") is None and owner.take_made("r1#0") is None
    assert not owner.end_request("r1"), "the completion did not release the request"


def test_a_completion_that_released_the_request_makes_its_release_a_no_op_once():
    owner = WorkerQueueOwner("w1")
    owner.hand_over("r1#1", b"pcm")
    owner.completion_accepted("r1#1", np.array([1]), released=True)
    assert owner.take_accepted("r1#1")[0] == b"pcm"
    assert owner.end_request("r1") is True
    assert owner.end_request("r1") is False, "released is forgotten with the request"


def test_a_fetch_that_released_the_request_is_remembered_until_the_request_ends():
    owner = WorkerQueueOwner("w1")
    owner.released_by_redis("r2")
    assert owner.end_request("r2") and not owner.end_request("r2")


def test_a_refused_completion_drops_the_audio_and_a_chunk_made_here_is_read_through_fetch():
    owner = WorkerQueueOwner("w1")
    owner.hand_over("r1#0", b"a")
    owner.completion_refused("r1#0")
    assert owner.take_made("r1#0") is None and dict(owner.results_view()) == {}
    owner.hand_over("r1#1", b"b")
    owner.completion_accepted("r1#1", np.array([2]), released=False)
    assert owner.take_made("r1#1") == b"b", "fetch.lua answered 'local' before the owner read memory"
    assert owner.take_accepted("r1#1") is None and dict(owner.accepted_view()) == {}


def test_ending_a_request_drops_only_its_own_audio():
    owner = WorkerQueueOwner("w1")
    for job in ("r1#0", "r1#1", "r10#0"):
        owner.hand_over(job, b"x")
        owner.completion_accepted(job, np.array([1]), released=False)
    owner.end_request("r1")
    assert set(owner.results_view()) == {"r10#0"} and set(owner.accepted_view()) == {"r10#0"}
    with pytest.raises(TypeError):
        owner.results_view()["r1#0"] = b""  # type: ignore[index]


def test_the_replica_is_claimed_only_while_its_loop_waits_for_work():
    async def go():
        owner = WorkerQueueOwner("w1")
        assert not owner.claim(), "busy: its loop is not waiting for work"
        with owner.waiting_for_work():
            assert owner.idle
            assert not owner.claim(leases=False), "a worker without a replica is never claimed"
            assert owner.claim() and owner.claimed
            assert not owner.claim(), "already claimed"
            turn = asyncio.ensure_future(owner.lease_turn())
            await asyncio.sleep(0)
            assert not turn.done(), "the lease loop waits while the owner side holds the replica"
            ran = []

            async def jobs():
                ran.append("jobs")

            await owner.run_claimed(jobs(), name="claimed-test")
            await asyncio.wait_for(turn, 1.0)
            assert ran == ["jobs"] and not owner.claimed
            owner.stop_claims()
            assert not owner.claim(), "a stopping loop is not claimed"
        assert not owner.idle
        await owner.close()

    asyncio.run(go())


def test_close_waits_for_claimed_runs_and_abandoned_clean_ups():
    async def go():
        owner = WorkerQueueOwner("w1")
        done = []

        async def work(name):
            await asyncio.sleep(0.01)
            done.append(name)

        with owner.waiting_for_work():
            assert owner.claim()
        owner.run_claimed(work("run"), name="claimed")
        owner.clean_up_later(work("clean-up"))
        await owner.close()
        return sorted(done), owner.claimed

    assert asyncio.run(go()) == (["clean-up", "run"], False)


def test_admitted_requests_not_streaming_are_taken_once_when_stale():
    owner = WorkerQueueOwner("w1")
    owner.admitted("a", "plan a")
    owner.admitted("b", "plan b")
    owner.stream_started("a")
    assert owner.take_unstarted(3600.0) == [], "not stale yet"
    assert owner.take_unstarted(None) == ["plan b"] and owner.take_unstarted(None) == []
    assert owner.counters.admitted == 2


def test_each_side_reports_whether_redis_answered_and_the_mode_is_followed_as_it_changes():
    owner = WorkerQueueOwner("w1")
    assert not owner.degraded and owner.counters.degraded_since is None
    owner.redis_answered(ADMISSION, False)
    assert owner.degraded and owner.unreachable(ADMISSION) and not owner.unreachable(REPLICA)
    since = owner.counters.degraded_since
    assert since is not None
    owner.redis_answered(REPLICA, False)
    owner.redis_answered(ADMISSION, True)
    assert owner.degraded and owner.counters.degraded_since == since, "the replica side still fails"
    owner.redis_answered(REPLICA, True)
    assert not owner.degraded and owner.counters.degraded_since is None
    assert owner.counters.degraded_seconds > 0 and owner.seconds_degraded() == owner.counters.degraded_seconds


def test_the_counters_the_admissions_and_streams_keep():
    owner = WorkerQueueOwner("w1")
    owner.refused()
    owner.served_here(from_cache=True)
    owner.served_here(from_cache=False)
    owner.finished_here()
    owner.request_failed()
    owner.request_cancelled()
    assert owner.counters == FleetCounters(refused=1, from_cache=1, served_locally=1, finished_locally=1, failed=1,
                                           cancelled=1)


# --- nobody else holds or changes the owner's state ------------------------------------------------

OWNER_FIELDS = {"_made", "_accepted", "_released", "_idle", "_loop_may_lease", "_claimed_runs", "_unstarted",
                "_abandoned", "_unreachable", "counters", "degraded"}


def _assigned_chains(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, dotted target) of every assignment to an attribute, augmented or not."""
    found = []
    for node in ast.walk(tree):
        targets = node.targets if isinstance(node, ast.Assign) else \
            [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else []
        for target in targets:
            if isinstance(target, ast.Attribute):
                found.append((node.lineno, ast.unparse(target)))
    return found


def test_no_module_but_the_owner_changes_the_owners_state():
    """Outside api/speech/worker_queue.py nothing assigns into the owner, its counters, or a field
    the owner holds; the owner's module itself is the only place they change."""
    offenders = []
    for path in sorted((ROOT / "api" / "speech").glob("*.py")):
        if path.name == "worker_queue.py":
            continue
        for line, target in _assigned_chains(ast.parse(path.read_text())):
            parts = target.split(".")
            if "worker_queue" in parts[:-1] or "counters" in parts[:-1] or parts[-1] in OWNER_FIELDS - {"counters"}:
                offenders.append(f"{path.relative_to(ROOT)}:{line}: {target}")
    assert not offenders, "\n".join(offenders)


def test_the_two_sides_hold_none_of_the_owners_fields():
    """The admission client and the dispatcher hold the owner, not copies of its state: their
    `degraded` reads it back."""
    from api.speech.admission_client import AdmissionBounds, AdmissionClient
    from api.speech.dispatcher import Dispatcher

    class NoRedis:
        def register_script(self, source):
            return None

    owner = WorkerQueueOwner("w1")
    admission = AdmissionClient(NoRedis(), "w1", AdmissionBounds(0, 0), worker_queue=owner, ms_per_phoneme=80.0)
    dispatcher = Dispatcher(NoRedis(), "w1", lambda job: None, worker_queue=owner)
    for side in (admission, dispatcher):
        held = set(vars(side))
        assert not held & OWNER_FIELDS, held & OWNER_FIELDS
        assert side.worker_queue is owner
    owner.redis_answered(REPLICA, False)
    assert dispatcher.degraded and not admission.degraded and owner.degraded
