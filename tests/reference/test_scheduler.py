"""Reference tests of ``Scheduler`` (v0.22.1 ``schedule()``/``update_from_output`` semantics).

Each test builds a tiny engine, drives it step by step with a stand-in model
(token = 100 + position, so outputs are predictable) and checks one rule of the
policy: running first, FCFS admission, chunked prefill, the long-prefill
threshold, preemption of the last running request, no admission in a step that
preempted, the stop conditions, and freeing.
"""

from __future__ import annotations

import pytest

from mini_vllm.core.kv_cache_manager import KVCacheManager
from mini_vllm.core.kv_cache_utils import get_request_block_hasher, sha256
from mini_vllm.core.sched.async_scheduler import AsyncScheduler
from mini_vllm.core.sched.output import SchedulerOutput
from mini_vllm.core.sched.request_queue import FCFSRequestQueue
from mini_vllm.core.sched.scheduler import Scheduler, check_stop
from mini_vllm.request import FinishReason, Request, RequestStatus
from mini_vllm.sampling_params import SamplingParams
from mini_vllm.teaching.invariants import check_block_pool

BS = 4
HASHER = get_request_block_hasher(BS, sha256)


def make_scheduler(
    num_blocks: int = 20,
    budget: int = 16,
    max_num_seqs: int = 4,
    max_model_len: int = 64,
    **kwargs,
) -> Scheduler:
    mgr = KVCacheManager(num_blocks, BS, max_model_len, enable_caching=kwargs.pop("caching", True))
    return Scheduler(mgr, budget, max_num_seqs, max_model_len, **kwargs)


def make_request(
    rid: str, num_prompt: int, max_tokens: int = 8, base: int = 0, **sp_kwargs
) -> Request:
    eos = sp_kwargs.pop("eos", None)
    return Request(
        rid,
        [base + i for i in range(num_prompt)],
        SamplingParams(temperature=0.0, max_tokens=max_tokens, **sp_kwargs),
        block_hasher=HASHER,
        eos_token_id=eos,
    )


def model_tokens(sched: Scheduler, out: SchedulerOutput) -> dict[str, list[int]]:
    """The stand-in model: one token (100 + position) per request that finished its prompt."""
    sampled = {}
    for rid in out.num_scheduled_tokens:
        req = sched.requests[rid]
        if not req.is_prefill_chunk:
            sampled[rid] = [100 + req.num_tokens]
    return sampled


def step(sched: Scheduler, sampler=model_tokens):
    out = sched.schedule()
    results = sched.update_from_output(out, sampler(sched, out))
    check_block_pool(sched.kv_cache_manager.block_pool)
    return out, results


# ------------------------------------------------------------------ construction


@pytest.mark.parametrize(
    "kwargs",
    [
        {"max_num_seqs": 0},
        {"budget": 2, "max_num_seqs": 4},
        {"budget": 16, "max_model_len": 64, "enable_chunked_prefill": False},
        {"long_prefill_token_threshold": -1},
    ],
)
def test_constructor_validates(kwargs: dict) -> None:
    with pytest.raises(ValueError):
        make_scheduler(**kwargs)


def test_add_request_validation_and_max_tokens_resolution() -> None:
    sched = make_scheduler(max_model_len=32)
    sched.add_request(make_request("a", 4))
    with pytest.raises(ValueError):
        sched.add_request(make_request("a", 4))  # duplicate id
    with pytest.raises(ValueError):
        sched.add_request(make_request("long", 32))  # no room for an output token
    req = Request("b", [1, 2, 3], SamplingParams(max_tokens=None))
    sched.add_request(req)
    assert req.max_tokens == 29
    assert sched.get_num_unfinished_requests() == 2 and sched.has_unfinished_requests()


# ------------------------------------------------------------------ budget and order


def test_running_first_then_waiting_under_one_budget() -> None:
    sched = make_scheduler(budget=16)
    for rid in "abc":
        sched.add_request(make_request(rid, 10, base=ord(rid) * 100))
    out, results = step(sched)
    # a gets 10, b the 6 left (a chunk), c nothing; only a samples.
    assert out.num_scheduled_tokens == {"a": 10, "b": 6}
    assert out.total_num_scheduled_tokens == 16
    assert [r.request_id for r in results] == ["a"]
    assert [r.request_id for r in sched.running] == ["a", "b"]
    assert [r.request_id for r in sched.waiting] == ["c"]
    # Next step: running first (a decodes, b finishes its prompt), then c gets the rest.
    out, _ = step(sched)
    assert out.num_scheduled_tokens == {"a": 1, "b": 4, "c": 10}
    assert [new.req_id for new in out.scheduled_new_reqs] == ["c"]
    assert out.scheduled_cached_reqs.req_ids == ["a", "b"]


def test_num_computed_tokens_advances_after_the_output_is_built() -> None:
    sched = make_scheduler(budget=8)
    req = make_request("a", 10)
    sched.add_request(req)
    out = sched.schedule()
    assert out.scheduled_new_reqs[0].num_computed_tokens == 0  # as the runner must start
    assert req.num_computed_tokens == 8 and req.is_prefill_chunk
    sched.update_from_output(out, {})
    out = sched.schedule()
    assert out.scheduled_cached_reqs.num_computed_tokens == [8]
    assert out.scheduled_cached_reqs.new_token_ids == [[8, 9]]
    assert req.num_computed_tokens == 10 and not req.is_prefill_chunk


def test_chunked_prefill_resumes_where_it_stopped() -> None:
    sched = make_scheduler(budget=6)
    req = make_request("a", 15, max_tokens=2)
    sched.add_request(req)
    chunks = []
    for _ in range(3):
        out, results = step(sched)
        chunks.append(out.num_scheduled_tokens["a"])
        assert results == [] or chunks == [6, 6, 3]
    assert chunks == [6, 6, 3]
    assert req.output_token_ids == [115]


def test_partial_prefill_must_not_be_sampled() -> None:
    sched = make_scheduler(budget=4)
    sched.add_request(make_request("a", 10))
    out = sched.schedule()
    with pytest.raises(ValueError, match="mid-prefill"):
        sched.update_from_output(out, {"a": [1]})


def test_no_chunked_prefill_stops_admission_at_a_prompt_that_does_not_fit() -> None:
    sched = make_scheduler(40, budget=64, max_model_len=64, enable_chunked_prefill=False)
    sched.add_request(make_request("a", 40, base=0))
    sched.add_request(make_request("b", 30, base=100))
    sched.add_request(make_request("c", 5, base=200))  # would fit, but must not overtake b
    out, _ = step(sched)
    assert out.num_scheduled_tokens == {"a": 40}
    out, _ = step(sched)
    assert out.num_scheduled_tokens == {"a": 1, "b": 30, "c": 5}


def test_long_prefill_token_threshold_caps_every_request() -> None:
    sched = make_scheduler(budget=16, long_prefill_token_threshold=4)
    sched.add_request(make_request("a", 10))
    sched.add_request(make_request("b", 3))
    out, _ = step(sched)
    assert out.num_scheduled_tokens == {"a": 4, "b": 3}
    out, _ = step(sched)
    assert out.num_scheduled_tokens == {"a": 4, "b": 1}
    out, _ = step(sched)
    assert out.num_scheduled_tokens == {"a": 2, "b": 1}


def test_max_num_seqs_limits_admission() -> None:
    sched = make_scheduler(budget=32, max_num_seqs=2)
    for rid in "abc":
        sched.add_request(make_request(rid, 2))
    out, _ = step(sched)
    assert set(out.num_scheduled_tokens) == {"a", "b"}
    assert len(sched.running) == 2


# ------------------------------------------------------------------ preemption


def _two_full_requests(a_max_tokens: int = 8) -> Scheduler:
    """4 usable blocks, two 8-token prompts: after prefill the pool is full."""
    sched = make_scheduler(num_blocks=5, budget=16, max_model_len=32)
    sched.add_request(make_request("a", 8, max_tokens=a_max_tokens, base=0))
    sched.add_request(make_request("b", 8, base=50))
    out, _ = step(sched)
    assert out.num_scheduled_tokens == {"a": 8, "b": 8}
    assert sched.kv_cache_manager.block_pool.get_num_free_blocks() == 0
    return sched


def test_preempts_the_last_running_request_and_requeues_it_first() -> None:
    sched = _two_full_requests()
    a, b = sched.requests["a"], sched.requests["b"]
    sched.add_request(make_request("c", 2, base=90))
    out, _ = step(sched)
    # a's 9th token needs a 3rd block: b (the last admitted) is preempted for it.
    assert out.preempted_req_ids == {"b"}
    assert out.num_scheduled_tokens == {"a": 1}
    assert (b.status, b.num_computed_tokens, b.num_preemptions) == (RequestStatus.PREEMPTED, 0, 1)
    assert b.output_token_ids == [108]  # generated tokens are kept for the recompute
    assert sched.kv_cache_manager.get_block_ids("b") == ([],)
    assert [r.request_id for r in sched.running] == ["a"]
    # Preempted requests go to the front, ahead of c, and nobody was admitted:
    # one block is free and c would fit, but the step preempted.
    assert [r.request_id for r in sched.waiting] == ["b", "c"]
    assert a.status == RequestStatus.RUNNING and a.num_preemptions == 0


def test_a_request_that_must_preempt_itself_stops_the_loop() -> None:
    # 4 usable blocks: a takes 3, b's first chunk the last one (the admission gate
    # off: with it, b would not be admitted at all; see the next test).
    sched = make_scheduler(
        num_blocks=5, budget=14, max_model_len=32, scheduler_reserve_full_isl=False
    )
    sched.add_request(make_request("a", 11, base=0))
    sched.add_request(make_request("b", 8, base=50))
    out, _ = step(sched)
    assert out.num_scheduled_tokens == {"a": 11, "b": 3}
    # a decodes into its 3rd block (12 slots); b needs a 2nd block: none left, so b,
    # the last running request, is preempted while being scheduled: the loop stops.
    out, _ = step(sched)
    assert out.num_scheduled_tokens == {"a": 1}
    assert out.preempted_req_ids == {"b"}
    assert sched.requests["b"].num_preemptions == 1


def test_admission_gate_waits_until_the_whole_prompt_fits() -> None:
    # The same two requests with the gate on (the default, as upstream): after a's 3
    # blocks one block is free, b's 8-token prompt needs 2, so b is not admitted and
    # nothing is preempted; it starts once a has finished and freed its blocks.
    sched = make_scheduler(num_blocks=5, budget=14, max_model_len=32)
    sched.add_request(make_request("a", 11, base=0, max_tokens=4))
    sched.add_request(make_request("b", 8, base=50, max_tokens=4))
    out, _ = step(sched)
    assert out.num_scheduled_tokens == {"a": 11}, (
        "the admission gate must refuse b: its whole prompt (2 blocks) does not fit the one "
        "free block, although its first chunk would"
    )
    preempted = 0
    while sched.has_unfinished_requests():
        out, _ = step(sched)
        preempted += len(out.preempted_req_ids)
    assert preempted == 0
    assert sched.requests == {}


def test_admission_gate_counts_prefix_hits_and_resumed_outputs() -> None:
    # A prefix hit on blocks that are still held costs no free block, so a request
    # whose tail fits is admitted although its whole prompt would not fit fresh.
    sched = make_scheduler(num_blocks=6, budget=32, max_model_len=32)
    sched.add_request(make_request("a", 12, base=0, max_tokens=8))
    step(sched)  # a holds 3 full, cached blocks; 2 free
    sched.add_request(make_request("b", 16, base=0))  # same first 12 tokens + 4 more
    out, _ = step(sched)
    assert "b" in out.num_scheduled_tokens and out.num_scheduled_tokens["b"] == 4
    # Without the shared prefix, the same 16 tokens need 4 free blocks: refused.
    sched.add_request(make_request("c", 5, base=500))
    out, _ = step(sched)
    assert "c" not in out.num_scheduled_tokens


def test_admission_gate_off_admits_on_the_first_chunk() -> None:
    gated = make_scheduler(num_blocks=5, budget=14, max_model_len=32)
    ungated = make_scheduler(
        num_blocks=5, budget=14, max_model_len=32, scheduler_reserve_full_isl=False
    )
    for sched in (gated, ungated):
        sched.add_request(make_request("a", 11, base=0))
        sched.add_request(make_request("b", 9, base=50))
    assert gated.schedule().num_scheduled_tokens == {"a": 11}
    assert ungated.schedule().num_scheduled_tokens == {"a": 11, "b": 3}


def test_resumed_request_is_sent_with_its_tokens_and_full_block_table() -> None:
    # a stops within 3 blocks, so b's first block (freed last, cached) is never evicted.
    sched = _two_full_requests(a_max_tokens=4)
    step(sched)  # b preempted
    while "a" in sched.requests:
        step(sched)
    out = sched.schedule()
    cached = out.scheduled_cached_reqs
    assert cached.req_ids == ["b"] and cached.resumed_req_ids == {"b"}
    b = sched.requests["b"]
    assert cached.all_token_ids["b"] == list(b.all_token_ids)
    assert cached.new_block_ids[0] == sched.kv_cache_manager.get_block_ids("b")
    # Its first (full, cached, unevicted) prompt block was a prefix hit.
    assert cached.num_computed_tokens == [4]


def test_preempted_request_finishes_with_the_right_tokens() -> None:
    sched = _two_full_requests()
    a, b = sched.requests["a"], sched.requests["b"]
    for _ in range(100):
        if not sched.has_unfinished_requests():
            break
        step(sched)
    assert a.output_token_ids == b.output_token_ids == list(range(108, 116))
    assert b.num_preemptions >= 1 and a.num_preemptions == 0
    assert sched.kv_cache_manager.block_pool.get_num_free_blocks() == 4


# ------------------------------------------------------------------ stopping


def _finish_one(req: Request, sampler, max_model_len: int = 64) -> Scheduler:
    sched = make_scheduler(max_model_len=max_model_len)
    sched.add_request(req)
    for _ in range(100):
        if not sched.has_unfinished_requests():
            return sched
        step(sched, sampler)
    raise AssertionError("request did not finish")


def _constant(token: int):
    return lambda sched, out: {rid: [token] for rid in out.num_scheduled_tokens}


def test_stops_on_eos() -> None:
    req = make_request("a", 4, max_tokens=10, eos=7)
    _finish_one(req, _constant(7))
    assert req.status == RequestStatus.FINISHED_STOPPED
    assert req.get_finished_reason() == FinishReason.STOP
    assert req.output_token_ids == [7] and req.stop_reason is None


def test_ignore_eos_runs_to_max_tokens() -> None:
    req = make_request("a", 4, max_tokens=5, eos=7, ignore_eos=True)
    _finish_one(req, _constant(7))
    assert req.status == RequestStatus.FINISHED_LENGTH_CAPPED
    assert req.num_output_tokens == 5


def test_min_tokens_defers_eos_and_stop_tokens() -> None:
    req = make_request("a", 4, max_tokens=10, eos=7, min_tokens=3, stop_token_ids=[7])
    _finish_one(req, _constant(7))
    assert req.num_output_tokens == 3 and req.status == RequestStatus.FINISHED_STOPPED


def test_stops_on_stop_token_and_records_it() -> None:
    req = make_request("a", 4, max_tokens=10, stop_token_ids=[9])
    _finish_one(req, _constant(9))
    assert req.status == RequestStatus.FINISHED_STOPPED and req.stop_reason == 9


def test_stops_at_max_tokens() -> None:
    req = make_request("a", 4, max_tokens=3)
    sched = _finish_one(req, model_tokens)
    assert req.output_token_ids == [104, 105, 106]
    assert req.status == RequestStatus.FINISHED_LENGTH_CAPPED
    assert sched.kv_cache_manager.block_pool.get_num_free_blocks() == 19


def test_stops_at_max_model_len() -> None:
    req = make_request("a", 10, max_tokens=50)
    _finish_one(req, model_tokens, max_model_len=16)
    assert req.num_tokens == 16 and req.status == RequestStatus.FINISHED_LENGTH_CAPPED


def test_tokens_after_a_stop_are_trimmed() -> None:
    sched = make_scheduler()
    req = make_request("a", 4, max_tokens=10, stop_token_ids=[5])
    sched.add_request(req)
    out = sched.schedule()
    results = sched.update_from_output(out, {"a": [3, 5, 6]})
    assert results[0].new_token_ids == [3, 5]
    assert results[0].finish_reason == FinishReason.STOP and results[0].stop_reason == 5
    assert results[0].finished and req.output_token_ids == [3, 5]


def test_check_stop_order() -> None:
    req = make_request("a", 3, max_tokens=1, eos=7, stop_token_ids=[7])
    req.max_tokens = 1
    req.append_output_token_ids(7)
    assert check_stop(req, max_model_len=64)
    assert req.status == RequestStatus.FINISHED_STOPPED and req.stop_reason is None


# ------------------------------------------------------------------ finishing


def test_finished_request_is_freed_and_reported_once() -> None:
    sched = make_scheduler()
    sched.add_request(make_request("a", 4, max_tokens=1))
    _, results = step(sched)
    assert results[0].finish_reason == FinishReason.LENGTH
    assert "a" not in sched.requests and not sched.running
    assert sched.kv_cache_manager.usage == 0.0
    out = sched.schedule()
    assert out.finished_req_ids == {"a"}
    assert sched.schedule().finished_req_ids == set()


def test_finish_requests_aborts_running_and_waiting() -> None:
    sched = make_scheduler(budget=8, max_num_seqs=2)
    for rid in "abc":
        sched.add_request(make_request(rid, 4))
    step(sched)
    assert sorted(sched.finish_requests(["a", "c", "zzz"], RequestStatus.FINISHED_ABORTED)) == [
        "a",
        "c",
    ]
    assert [r.request_id for r in sched.running] == ["b"]
    assert not sched.waiting
    assert sched.finish_requests("a", RequestStatus.FINISHED_ABORTED) == []
    with pytest.raises(ValueError):
        sched.finish_requests("b", RequestStatus.RUNNING)
    out, _ = step(sched)
    assert out.finished_req_ids == {"a", "c"}
    sched.finish_requests(None, RequestStatus.FINISHED_ABORTED)
    assert not sched.has_unfinished_requests()
    assert sched.kv_cache_manager.block_pool.get_num_free_blocks() == 19


def test_abort_during_a_step_is_ignored_by_update() -> None:
    sched = make_scheduler()
    req = make_request("a", 4)
    sched.add_request(req)
    out = sched.schedule()
    sched.finish_requests("a", RequestStatus.FINISHED_ABORTED)
    assert sched.update_from_output(out, {"a": [1]}) == []
    assert req.status == RequestStatus.FINISHED_ABORTED and req.num_output_tokens == 0


# ------------------------------------------------------------------ outputs


def test_scheduler_output_describes_new_and_cached_requests() -> None:
    sched = make_scheduler(budget=32)
    sched.add_request(make_request("a", 9))
    out, _ = step(sched)
    new = out.scheduled_new_reqs[0]
    assert (new.req_id, new.prompt_token_ids, new.block_ids) == ("a", list(range(9)), ([1, 2, 3],))
    sched.add_request(make_request("b", 10))  # shares a's first 8 tokens
    out, _ = step(sched)
    new_b = out.scheduled_new_reqs[0]
    assert new_b.num_computed_tokens == 8 and new_b.block_ids[0][:2] == [1, 2]
    assert out.num_scheduled_tokens == {"a": 1, "b": 2}
    assert out.scheduled_cached_reqs.new_block_ids == [None]  # a's 10th slot fits block 3
    assert sched.kv_cache_manager.get_num_common_prefix_blocks("a") == [2]
    assert out.scheduled_cached_reqs.resumed_req_ids == set()


def test_empty_schedule() -> None:
    out = make_scheduler().schedule()
    assert out.total_num_scheduled_tokens == 0 and out.num_scheduled_tokens == {}
    assert SchedulerOutput.make_empty().scheduled_cached_reqs.num_reqs == 0


# ------------------------------------------------------------------ request queue


def test_fcfs_queue() -> None:
    q = FCFSRequestQueue()
    a, b, c = (make_request(rid, 1) for rid in "abc")
    with pytest.raises(IndexError):
        q.peek_request()
    q.add_request(a)
    q.add_request(b)
    q.prepend_request(c)
    assert [r.request_id for r in q] == ["c", "a", "b"]
    assert q.peek_request() is c and q.pop_request() is c
    q.remove_requests([a])
    assert list(q) == [b] and len(q) == 1 and bool(q)
    q.prepend_requests([a, c])
    assert [r.request_id for r in q] == ["c", "a", "b"]
    q.remove_request(a)
    assert [r.request_id for r in q] == ["c", "b"]


# ------------------------------------------------------------------ async scheduling


def make_async_scheduler(**kwargs) -> AsyncScheduler:
    mgr = KVCacheManager(20, BS, 64, enable_caching=True)
    return AsyncScheduler(mgr, 16, 4, 64, **kwargs)


def test_async_plans_the_next_decode_before_the_token_exists() -> None:
    sched = make_async_scheduler()
    sched.add_request(make_request("a", 5, max_tokens=3))
    first = sched.schedule()  # the whole prompt; its last step samples a token
    assert first.num_scheduled_tokens == {"a": 5}
    req = sched.requests["a"]
    assert req.num_output_placeholders == 1
    second = sched.schedule()  # planned while the first is "on the GPU"
    assert second.num_scheduled_tokens == {"a": 1}
    assert req.num_output_placeholders == 2 and req.num_computed_tokens == 6
    sched.update_from_output(first, {"a": [100]})
    assert req.num_output_placeholders == 1 and req.output_token_ids == [100]
    # max_tokens=3: the token of `second` is the 2nd; a third step may be planned...
    third = sched.schedule()
    assert third.num_scheduled_tokens == {"a": 1}
    sched.update_from_output(second, {"a": [101]})
    # ...but not a fourth: the placeholders already reach max_tokens.
    fourth = sched.schedule()
    assert fourth.num_scheduled_tokens == {}
    outputs = sched.update_from_output(third, {"a": [102]})
    assert outputs[0].finished and req.output_token_ids == [100, 101, 102]
    assert req.num_output_placeholders == 0
    check_block_pool(sched.kv_cache_manager.block_pool)


def test_async_stop_token_retires_every_placeholder_and_frees_blocks() -> None:
    sched = make_async_scheduler()
    sched.add_request(make_request("a", 5, max_tokens=10, stop_token_ids=[7]))
    first = sched.schedule()
    second = sched.schedule()
    assert second.num_scheduled_tokens == {"a": 1}
    outputs = sched.update_from_output(first, {"a": [7]})  # stops on the token in flight
    assert outputs[0].finished and outputs[0].finish_reason is not None
    assert sched.requests.get("a") is None or sched.requests["a"].num_output_placeholders == 0
    assert sched.kv_cache_manager.block_pool.get_num_free_blocks() == 19
    # The planned step comes back (the engine drops it before launch); nothing is appended.
    assert sched.update_from_output(second, {}) == []


def test_sync_scheduler_never_counts_placeholders() -> None:
    sched = make_scheduler()
    sched.add_request(make_request("a", 5))
    sched.schedule()
    assert sched.requests["a"].num_output_placeholders == 0
    assert sched.schedule().num_scheduled_tokens == {}  # its token is not known yet


@pytest.mark.parametrize(
    ("b_max_tokens", "b_token", "reason", "status"),
    [
        (4, 2, FinishReason.STOP, RequestStatus.FINISHED_STOPPED),  # EOS (the repro)
        # B's token in flight is its last: not scheduled in step 1, but still preemptible.
        (1, 60, FinishReason.LENGTH, RequestStatus.FINISHED_LENGTH_CAPPED),
    ],
)
def test_async_request_stopped_while_preempted_leaves_the_waiting_queue(
    b_max_tokens: int, b_token: int, reason: FinishReason, status: RequestStatus
) -> None:
    """Issue #21: step 1 is planned before step 0's tokens are in; it preempts B so that A gets
    its second block. Then step 0's token for B ends it (EOS, or its last by max_tokens): B
    stops while preempted, and must leave the waiting queue (upstream:
    ``stopped_preempted_reqs``), not stay there finished until a later ``schedule()`` pops it."""
    mgr = KVCacheManager(3, BS, 64, enable_caching=True)  # the null block + 2
    sched = AsyncScheduler(mgr, 16, 4, 64)
    a = make_request("A", 4, max_tokens=4, eos=2)
    b = make_request("B", 4, max_tokens=b_max_tokens, base=10, eos=2)
    sched.add_request(a)
    sched.add_request(b)
    step0 = sched.schedule()
    assert step0.num_scheduled_tokens == {"A": 4, "B": 4}
    step1 = sched.schedule()  # A's 5th token needs a second block: B is preempted
    assert step1.num_scheduled_tokens == {"A": 1} and step1.preempted_req_ids == {"B"}
    assert list(sched.waiting) == [b] and b.status == RequestStatus.PREEMPTED

    outputs = sched.update_from_output(step0, {"A": [50], "B": [b_token]})
    assert [(o.request_id, o.finish_reason) for o in outputs] == [("A", None), ("B", reason)]
    assert b.status == status and b.output_token_ids == [b_token]
    assert not sched.waiting and sched.running == [a]
    assert sched.get_num_unfinished_requests() == 1 and "B" not in sched.requests
    check_block_pool(mgr.block_pool)

    # A runs to max_tokens; with its blocks free, nothing is left to schedule (before the fix,
    # this schedule() met the finished B at the front of the waiting queue and raised).
    step2 = sched.schedule()
    sched.update_from_output(step1, {"A": [51]})
    step3 = sched.schedule()
    sched.update_from_output(step2, {"A": [52]})
    assert sched.schedule().num_scheduled_tokens == {}  # A's placeholders reach max_tokens
    outputs = sched.update_from_output(step3, {"A": [53]})
    assert outputs[0].finish_reason == FinishReason.LENGTH
    assert a.output_token_ids == [50, 51, 52, 53]
    assert not sched.has_unfinished_requests()
    assert sched.schedule().num_scheduled_tokens == {}
    assert mgr.block_pool.get_num_free_blocks() == 2
    check_block_pool(mgr.block_pool)


def test_async_abort_of_a_preempted_request_in_flight() -> None:
    """The other way out of the same state: B, preempted while step 0 samples for it, is
    aborted. ``finish_requests`` takes it out of the waiting queue; its token is then ignored."""
    mgr = KVCacheManager(3, BS, 64, enable_caching=True)
    sched = AsyncScheduler(mgr, 16, 4, 64)
    a, b = make_request("A", 4, max_tokens=4), make_request("B", 4, max_tokens=4, base=10)
    sched.add_request(a)
    sched.add_request(b)
    step0 = sched.schedule()
    assert sched.schedule().preempted_req_ids == {"B"}
    assert sched.finish_requests("B", RequestStatus.FINISHED_ABORTED) == ["B"]
    assert not sched.waiting and sched.running == [a]
    outputs = sched.update_from_output(step0, {"A": [50], "B": [60]})
    assert [o.request_id for o in outputs] == ["A"] and b.output_token_ids == []
    assert sched.get_num_unfinished_requests() == 1
    check_block_pool(mgr.block_pool)
