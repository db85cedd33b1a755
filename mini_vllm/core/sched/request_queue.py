"""The scheduler's waiting queue, as ``vllm/v1/core/sched/request_queue.py`` (v0.22.1): a deque
for first come, first served, a heap for priority; one API (an empty queue's pop or peek raises
IndexError), so one waiting loop serves both."""

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
    """Waiting requests in admission order, with upstream's queue API. A preempted request goes
    to the *front*: it arrived before everything still waiting."""

    def add_request(self, request: Request) -> None:
        self.append(request)

    def pop_request(self) -> Request:
        return self.popleft()

    def peek_request(self) -> Request:
        return self[0]

    def prepend_request(self, request: Request) -> None:
        self.appendleft(request)

    def prepend_requests(self, requests: Iterable[Request]) -> None:
        """Put ``requests`` at the front; the last one given ends up first."""
        self.extendleft(requests)

    def remove_request(self, request: Request) -> None:
        self.remove(request)

    def remove_requests(self, requests: Iterable[Request]) -> None:
        """Remove several requests in one O(n) pass, keeping the others' order."""
        to_remove = set(requests)
        kept = [req for req in self if req not in to_remove]
        self.clear()
        self.extend(kept)


class PriorityRequestQueue:
    """Waiting requests as a binary heap: the smallest ``(priority, arrival_time)`` first. A
    preempted request's place is its priority's, so ``prepend_request`` is ``add_request``."""

    def __init__(self) -> None:
        self._heap: list[Request] = []

    def add_request(self, request: Request) -> None:
        heapq.heappush(self._heap, request)

    def pop_request(self) -> Request:
        return heapq.heappop(self._heap)

    def peek_request(self) -> Request:
        return self._heap[0]

    def prepend_request(self, request: Request) -> None:
        self.add_request(request)

    def prepend_requests(self, requests: Iterable[Request]) -> None:
        for request in requests:
            self.add_request(request)

    def remove_request(self, request: Request) -> None:
        """O(n) plus a re-heapify: aborts are rare."""
        self._heap.remove(request)
        heapq.heapify(self._heap)

    def remove_requests(self, requests: Iterable[Request]) -> None:
        to_remove = set(map(id, requests))
        self._heap = [req for req in self._heap if id(req) not in to_remove]
        heapq.heapify(self._heap)

    def __bool__(self) -> bool:
        return bool(self._heap)

    def __len__(self) -> int:
        return len(self._heap)

    def __iter__(self) -> Iterator[Request]:
        """In admission order (a sorted copy; the heap is untouched)."""
        return iter(sorted(self._heap))


RequestQueue = FCFSRequestQueue | PriorityRequestQueue


def create_request_queue(policy: SchedulingPolicy) -> RequestQueue:
    if policy == SchedulingPolicy.FCFS:
        return FCFSRequestQueue()
    if policy == SchedulingPolicy.PRIORITY:
        return PriorityRequestQueue()
    raise ValueError(f"unknown scheduling policy: {policy}")
