"""The per-process admission bound: whether this server process takes one more speech request now.

Two bounds admit a request, each with its own name. `ProcessAdmission` (this module,
KOKORO_MAX_REQUESTS) counts the requests this process is streaming or holding, whatever service
makes their audio; the fleet's bound (`api.speech.admission_client.AdmissionBounds`, KOKORO_QUEUE_MAX_*) counts
the whole fleet's in Redis and is the speech service's own `admit` step. The HTTP layer takes a
`ProcessSlot` before planning and gives it back through one call, `slot.release(...)`, however the
response ends (refused, done, failed, client gone); releasing twice is harmless.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from api.speech.contract import KeyShareFull, Overloaded, key_bound


@dataclass
class ProcessSlot:
    """One admitted request's place in this process's bound."""

    admission: "ProcessAdmission"
    request_id: str
    key: str | None = None      # the API key's name (counted per key; bounded by KOKORO_KEY_MAX_SHARE)
    admitted_at: float = field(default_factory=time.monotonic)
    released: bool = False

    def release(self, service_seconds: float | None = None) -> None:
        """Free the slot; service_seconds (replica time the request used) feeds the retry estimate."""
        self.admission.release(self, service_seconds)


class ProcessAdmission:
    """At most `max_requests` admitted at once in this process (streaming or waiting for the replica).

    Retry-After is the expected time until one slot frees: with one replica serving requests one
    chunk at a time, requests leave at the replica's measured service rate, so the next departure
    is about one mean service time away (an exponentially weighted mean of the replica seconds
    completed requests used; 1 s until anything has been measured).
    """

    def __init__(self, max_requests: int, replicas: int = 1, initial_service_s: float = 1.0,
                 key_max_share: float = 1.0):
        if max_requests < 1:
            raise ValueError(f"max_requests must be at least 1, got {max_requests}")
        self.max_requests = max_requests
        self.key_max_requests = key_bound(key_max_share, max_requests)
        self._per_key: dict[str, int] = {}
        self.replicas = max(1, replicas)
        self.mean_service_s = initial_service_s
        self._slots: dict[int, ProcessSlot] = {}
        self.rejected = 0

    @property
    def admitted(self) -> int:
        return len(self._slots)

    def admitted_by_key(self) -> dict[str, int]:
        """Admitted requests per API key's name (only keys holding some)."""
        return dict(self._per_key)

    def retry_after_s(self) -> float:
        return min(60.0, max(0.05, self.mean_service_s / self.replicas))

    def admit(self, request_id: str, count_refusal: bool = True, key: str | None = None) -> ProcessSlot:
        """A slot, or Overloaded (503 with Retry-After) when the bound is reached, or
        KeyShareFull (429) when `key` (an API key's name) holds its share of it. count_refusal
        False: a caller that waits and asks again (a live session's piece), not a refused request."""
        if len(self._slots) >= self.max_requests:
            self.rejected += count_refusal
            wait = self.retry_after_s()
            raise Overloaded(wait, f"The server is at capacity ({self.max_requests} requests in progress); "
                                      f"retry in {wait:.2f} s.")
        counted = key or None
        if counted and self.key_max_requests and self._per_key.get(counted, 0) >= self.key_max_requests:
            wait = self.retry_after_s()
            raise KeyShareFull(wait, f"This API key holds its share of the server ({self.key_max_requests} "
                                      f"requests in progress, KOKORO_KEY_MAX_SHARE); retry in {wait:.2f} s.")
        slot = ProcessSlot(self, request_id, counted)
        self._slots[id(slot)] = slot
        if counted:
            self._per_key[counted] = self._per_key.get(counted, 0) + 1
        return slot

    def release(self, slot: ProcessSlot, service_seconds: float | None = None) -> None:
        if slot.released:
            return
        slot.released = True
        self._slots.pop(id(slot), None)
        if slot.key is not None:
            left = self._per_key.get(slot.key, 1) - 1
            if left > 0:
                self._per_key[slot.key] = left
            else:
                self._per_key.pop(slot.key, None)
        if service_seconds is not None and service_seconds > 0:
            self.mean_service_s = 0.8 * self.mean_service_s + 0.2 * service_seconds
