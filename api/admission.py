"""Admission: whether a request may start now, and when to come back if not.

The HTTP layer asks `admission.admit(...)` before any synthesis and releases the ticket when the
response ends, however it ends (done, error, client gone). This process's `LocalAdmission` is a
bounded counter over its own replica; the fleet's shared queue (api/fleet/owner.py) can take
its place behind the same small protocol, so the HTTP code does not change when the queue arrives.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Protocol

from api.errors import CapacityError


@dataclass
class Ticket:
    request_id: str
    cost: float                 # estimated work, in input characters
    admitted_at: float = field(default_factory=time.monotonic)
    released: bool = False


class Admission(Protocol):
    def admit(self, request_id: str, cost: float) -> Ticket:
        """A ticket, or CapacityError (503 with Retry-After) when the bound is reached."""

    def release(self, ticket: Ticket, service_seconds: float | None = None) -> None:
        """Frees the slot; service_seconds (replica time the request used) feeds the retry estimate."""

    @property
    def admitted(self) -> int: ...

    def healthy(self) -> bool: ...


class LocalAdmission:
    """At most `max_requests` admitted at once in this process (streaming or waiting for the replica).

    Retry-After is the expected time until one slot frees: with one replica serving requests one
    chunk at a time, requests leave at the replica's measured service rate, so the next departure
    is about one mean service time away (an exponentially weighted mean of the replica seconds
    completed requests used; 1 s until anything has been measured).
    """

    def __init__(self, max_requests: int, replicas: int = 1, initial_service_s: float = 1.0):
        if max_requests < 1:
            raise ValueError(f"max_requests must be at least 1, got {max_requests}")
        self.max_requests = max_requests
        self.replicas = max(1, replicas)
        self.mean_service_s = initial_service_s
        self._tickets: dict[int, Ticket] = {}
        self.rejected = 0

    @property
    def admitted(self) -> int:
        return len(self._tickets)

    def healthy(self) -> bool:
        return True

    def retry_after_s(self) -> float:
        return min(60.0, max(0.05, self.mean_service_s / self.replicas))

    def admit(self, request_id: str, cost: float) -> Ticket:
        if len(self._tickets) >= self.max_requests:
            self.rejected += 1
            wait = self.retry_after_s()
            raise CapacityError(wait, f"The server is at capacity ({self.max_requests} requests in progress); "
                                      f"retry in {wait:.2f} s.")
        ticket = Ticket(request_id, cost)
        self._tickets[id(ticket)] = ticket
        return ticket

    def release(self, ticket: Ticket, service_seconds: float | None = None) -> None:
        if ticket.released:
            return
        ticket.released = True
        self._tickets.pop(id(ticket), None)
        if service_seconds is not None and service_seconds > 0:
            self.mean_service_s = 0.8 * self.mean_service_s + 0.2 * service_seconds
