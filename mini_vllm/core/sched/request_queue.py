"""The scheduler's waiting queue.

Mirrors ``vllm/v1/core/sched/request_queue.py`` at v0.22.1 for the default
first-come-first-served policy (``SchedulingPolicy.FCFS``, ``FCFSRequestQueue``);
the priority policy (a heap) is not built.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from enum import Enum

from mini_vllm.request import Request


class SchedulingPolicy(Enum):
    """Order in which waiting requests are admitted."""

    FCFS = "fcfs"


class FCFSRequestQueue(deque[Request]):
    """Waiting requests in admission order: a deque with upstream's queue API.

    New arrivals go to the back. A preempted request goes to the *front*: it
    arrived before everything still waiting (it was already running), so FCFS
    means it must be readmitted first. Both ends are O(1), which is why this is
    a deque and not a list.
    """

    def add_request(self, request: Request) -> None:
        """Enqueue a new arrival at the back."""
        self.append(request)

    def pop_request(self) -> Request:
        """Remove and return the next request to admit."""
        return self.popleft()

    def peek_request(self) -> Request:
        """The next request to admit, left in place."""
        if not self:
            raise IndexError("peek from an empty request queue")
        return self[0]

    def prepend_request(self, request: Request) -> None:
        """Put ``request`` at the front (a preempted request)."""
        self.appendleft(request)

    def prepend_requests(self, requests: Iterable[Request]) -> None:
        """Put ``requests`` at the front; the last one given ends up first."""
        self.extendleft(requests)

    def remove_request(self, request: Request) -> None:
        """Remove one request (e.g. aborted while waiting)."""
        self.remove(request)

    def remove_requests(self, requests: Iterable[Request]) -> None:
        """Remove several requests in one O(n) pass, keeping the others' order."""
        to_remove = set(requests)
        kept = [req for req in self if req not in to_remove]
        self.clear()
        self.extend(kept)


def create_request_queue(policy: SchedulingPolicy) -> FCFSRequestQueue:
    """The queue implementing ``policy``."""
    if policy == SchedulingPolicy.FCFS:
        return FCFSRequestQueue()
    raise ValueError(f"unknown scheduling policy: {policy}")
