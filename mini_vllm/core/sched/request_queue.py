"""The scheduler's waiting queue.

Mirrors ``vllm/v1/core/sched/request_queue.py`` at v0.22.1: first come, first
served (``SchedulingPolicy.FCFS``, ``FCFSRequestQueue``: a deque) and priority
(``SchedulingPolicy.PRIORITY``, ``PriorityRequestQueue``: a binary heap ordered
by ``Request.__lt__``, i.e. ``(priority, arrival_time)``). Both expose the same
methods, so the scheduler's waiting loop is one piece of code for both.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Iterable, Iterator
from enum import Enum

from mini_vllm.request import Request


class SchedulingPolicy(Enum):
    """Order in which waiting requests are admitted."""

    FCFS = "fcfs"
    PRIORITY = "priority"


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


class PriorityRequestQueue:
    """Waiting requests as a binary heap: the smallest ``(priority, arrival_time)`` first.

    A preempted request simply goes back into the heap: under this policy its
    place is decided by its priority and arrival, never by the fact that it was
    running, so ``prepend_request`` is ``add_request``. Adding and popping are
    O(log n); removing an arbitrary request (an abort) is O(n) plus a re-heapify,
    which is acceptable because aborts are rare next to schedule steps.
    """

    def __init__(self) -> None:
        self._heap: list[Request] = []

    def add_request(self, request: Request) -> None:
        """Insert ``request`` at its place in the order."""
        heapq.heappush(self._heap, request)

    def pop_request(self) -> Request:
        """Remove and return the highest-priority (smallest) request."""
        if not self._heap:
            raise IndexError("pop from an empty request queue")
        return heapq.heappop(self._heap)

    def peek_request(self) -> Request:
        """The highest-priority request, left in place."""
        if not self._heap:
            raise IndexError("peek from an empty request queue")
        return self._heap[0]

    def prepend_request(self, request: Request) -> None:
        """A preempted request: the heap has no front, its priority places it."""
        self.add_request(request)

    def prepend_requests(self, requests: Iterable[Request]) -> None:
        """Several preempted requests, each placed by its priority."""
        for request in requests:
            self.add_request(request)

    def remove_request(self, request: Request) -> None:
        """Remove one request (e.g. aborted while waiting)."""
        self._heap.remove(request)
        heapq.heapify(self._heap)

    def remove_requests(self, requests: Iterable[Request]) -> None:
        """Remove several requests in one pass, then restore the heap."""
        to_remove = set(map(id, requests))
        self._heap = [req for req in self._heap if id(req) not in to_remove]
        heapq.heapify(self._heap)

    def __bool__(self) -> bool:
        return bool(self._heap)

    def __len__(self) -> int:
        return len(self._heap)

    def __iter__(self) -> Iterator[Request]:
        """The requests in admission order (a sorted copy; the heap is untouched)."""
        return iter(sorted(self._heap))


RequestQueue = FCFSRequestQueue | PriorityRequestQueue


def create_request_queue(policy: SchedulingPolicy) -> RequestQueue:
    """The queue implementing ``policy``."""
    if policy == SchedulingPolicy.FCFS:
        return FCFSRequestQueue()
    if policy == SchedulingPolicy.PRIORITY:
        return PriorityRequestQueue()
    raise ValueError(f"unknown scheduling policy: {policy}")
