"""Which Uvicorn workers of one server hold a model replica when KOKORO_REPLICAS is below the
workers: the first that many to start, each holding a lock file for its life."""

from __future__ import annotations

from pathlib import Path

REPLICA_SLOTS_DIR = "replica-slots"  # under KOKORO_METRICS_DIR, which the workers of one server share
_held_slots: list = []  # the open lock file of this worker's replica slot, held for the process's life


def claim_replica_slot(directory: str | Path, slots: int) -> int | None:
    """One of `slots` replica slots for this worker process (a lock file of `directory` held until
    it exits, so a worker that dies gives its slot to the one Uvicorn starts in its place), or None
    when all are held: this worker is then an HTTP front only."""
    import fcntl

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    for slot in range(slots):
        f = open(directory / f"replica-{slot}.lock", "a+")
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            f.close()
            continue
        _held_slots.append(f)
        return slot
    return None
