"""Reference tests of the priority policy: the waiting heap and the scheduler's victim choice.

Upstream's own priority tests (``tests/v1/core/test_scheduler.py::test_priority_scheduling_*``)
run through ``tests/upstream``; these add a stateful check of the heap against a sorted list,
the refund of a victim already scheduled in the step, and the request-level refusals.
"""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from mini_vllm.core.kv_cache_manager import KVCacheManager
from mini_vllm.core.sched.request_queue import (
    PriorityRequestQueue,
    SchedulingPolicy,
    create_request_queue,
)
from mini_vllm.core.sched.scheduler import Scheduler
from mini_vllm.request import Request
from mini_vllm.sampling_params import SamplingParams

BS = 4


def make_request(
    rid: str,
    num_prompt: int = 3,
    priority: int = 0,
    arrival: float = 0.0,
    max_tokens: int = 8,
    **sp_kwargs,
) -> Request:
    return Request(
        rid,
        [hash(rid) % 50 + i for i in range(num_prompt)],
        SamplingParams(temperature=0.0, max_tokens=max_tokens, **sp_kwargs),
        arrival_time=arrival,
        priority=priority,
    )


def step(sched: Scheduler):
    """schedule() and a stand-in model that samples token 7 for every finished prompt."""
    out = sched.schedule()
    sampled = {}
    for rid in out.num_scheduled_tokens:
        req = sched.requests[rid]
        if req.num_computed_tokens >= req.num_tokens:
            sampled[rid] = [7]
    sched.update_from_output(out, sampled)
    return out


class PriorityQueueMachine(RuleBasedStateMachine):
    """The heap against the obvious model: a list kept sorted by (priority, arrival, id)."""

    def __init__(self) -> None:
        super().__init__()
        self.queue = PriorityRequestQueue()
        self.model: list[Request] = []
        self.counter = 0

    def _key(self, req: Request) -> tuple:
        return (req.priority, req.arrival_time, req.request_id)

    @rule(priority=st.integers(-3, 3), arrival=st.integers(0, 4))
    def add(self, priority: int, arrival: int) -> None:
        req = make_request(f"r{self.counter}", priority=priority, arrival=float(arrival))
        self.counter += 1
        self.queue.add_request(req)
        self.model.append(req)

    @rule(priority=st.integers(-3, 3))
    def prepend(self, priority: int) -> None:
        # A preempted request: placed by its priority, exactly like a new one.
        req = make_request(f"r{self.counter}", priority=priority, arrival=-1.0)
        self.counter += 1
        self.queue.prepend_request(req)
        self.model.append(req)

    @precondition(lambda self: self.model)
    @rule()
    def pop(self) -> None:
        expected = min(self.model, key=self._key)
        assert self.queue.peek_request() is expected
        assert self.queue.pop_request() is expected
        self.model.remove(expected)

    @precondition(lambda self: self.model)
    @rule(index=st.integers(0, 50), several=st.booleans())
    def remove(self, index: int, several: bool) -> None:
        victims = self.model[index % len(self.model) :][: 2 if several else 1]
        if several:
            self.queue.remove_requests(victims)
        else:
            self.queue.remove_request(victims[0])
        for req in victims:
            self.model.remove(req)

    @invariant()
    def same_order(self) -> None:
        assert list(self.queue) == sorted(self.model, key=self._key)
        assert len(self.queue) == len(self.model) and bool(self.queue) == bool(self.model)


TestPriorityQueue = PriorityQueueMachine.TestCase
TestPriorityQueue.settings = settings(max_examples=60, stateful_step_count=30, deadline=None)


def test_empty_priority_queue_raises_index_error() -> None:
    q = create_request_queue(SchedulingPolicy.PRIORITY)
    assert isinstance(q, PriorityRequestQueue)
    with pytest.raises(IndexError):
        q.peek_request()
    with pytest.raises(IndexError):
        q.pop_request()


def test_unknown_policy_is_refused() -> None:
    mgr = KVCacheManager(10, BS, 32)
    with pytest.raises(ValueError, match="lottery"):
        Scheduler(mgr, 16, 4, 32, policy="lottery")


def test_priority_must_be_an_int() -> None:
    with pytest.raises(TypeError, match="priority"):
        make_request("a", priority=1.5)  # type: ignore[arg-type]


def test_requests_order_by_priority_then_arrival_then_id() -> None:
    a = make_request("a", priority=1, arrival=0.0)
    b = make_request("b", priority=0, arrival=5.0)
    c = make_request("c", priority=0, arrival=5.0)
    assert b < a and not a < b  # lower priority value first, whatever the arrival
    assert b < c and not c < b  # equal priority and arrival: the id decides


def test_victim_already_scheduled_gives_its_tokens_back() -> None:
    # a (priority 5) runs alone; b (0) and c (1) join; when b needs a block the victim is a,
    # which was scheduled earlier in the same step: it leaves the batch and c is still served.
    sched = Scheduler(KVCacheManager(5, BS, 64), 32, 4, 64, policy="priority")
    sched.add_request(make_request("a", priority=5, arrival=0.0))
    step(sched)
    sched.add_request(make_request("b", priority=0, arrival=1.0))
    sched.add_request(make_request("c", priority=1, arrival=2.0))
    step(sched)
    step(sched)
    out = step(sched)
    assert out.preempted_req_ids == {"a"}
    assert out.num_scheduled_tokens == {"b": 1, "c": 1}
    assert out.total_num_scheduled_tokens == 2
    assert out.scheduled_cached_reqs.req_ids == ["b", "c"]
    assert [r.request_id for r in sched.running] == ["b", "c"]
    assert sched.kv_cache_manager.get_block_ids("a") == ([],)
    while sched.has_unfinished_requests():
        step(sched)
    assert sched.kv_cache_manager.block_pool.get_num_free_blocks() == 4


def test_fcfs_ignores_priorities() -> None:
    sched = Scheduler(KVCacheManager(20, BS, 64), 16, 1, 64)
    for i, (rid, prio) in enumerate((("a", 3), ("b", -1), ("c", 0))):
        sched.add_request(make_request(rid, priority=prio, arrival=float(i), max_tokens=1))
    admitted = []
    while sched.has_unfinished_requests():
        admitted += [new.req_id for new in step(sched).scheduled_new_reqs]
    assert admitted == ["a", "b", "c"]


def test_min_tokens_beyond_max_model_len_is_refused() -> None:
    # Upstream accepts it and, after a preemption, schedules a negative number of tokens.
    sched = Scheduler(KVCacheManager(20, BS, 16), 16, 4, 16)
    with pytest.raises(ValueError, match="min_tokens=14 cannot be reached"):
        sched.add_request(make_request("a", num_prompt=4, min_tokens=14, max_tokens=20))
    assert not sched.has_unfinished_requests()
    sched.add_request(make_request("b", num_prompt=4, min_tokens=12, max_tokens=20))
