"""lab-08, part 3: preemption by recompute, and finishing."""

from __future__ import annotations

from grading.suite import graded
from mini_vllm.request import FinishReason, RequestStatus
from tests.labs.lab_08.helpers import (
    DOC,
    Engine,
    make_request,
    make_scheduler,
    model_token,
    num_free,
    running_ids,
    table,
    waiting_ids,
)


def two_full_requests(a_max_tokens: int = 8) -> Engine:
    """4 usable blocks, two 8-token prompts: after step 1 the pool is full."""
    engine = Engine(make_scheduler(num_blocks=5, budget=16, max_model_len=32))
    engine.add(make_request("a", 8, max_tokens=a_max_tokens, base=0),
               make_request("b", 8, base=50))
    out, _ = engine.step()
    assert dict(out.num_scheduled_tokens) == {"a": 8, "b": 8}, (
        f"set-up: both prompts fit in step 1, got {dict(out.num_scheduled_tokens)}")
    assert num_free(engine.sched) == 0
    return engine


@graded(4, "Preemption by recompute: when allocate_slots returns None, the LAST running request "
           "is preempted: blocks freed, num_computed_tokens 0, status PREEMPTED, "
           "num_preemptions + 1, outputs kept", f"{DOC}#preemption-by-recompute")
def test_preempts_the_last_running_request():
    """a's 9th token needs a third block; b, admitted last, makes room."""
    engine = two_full_requests()
    sched = engine.sched
    a, b = sched.requests["a"], sched.requests["b"]
    out, _ = engine.step()
    assert out.preempted_req_ids == {"b"}, (
        f"the last running request (b) must be preempted, got {out.preempted_req_ids}")
    assert dict(out.num_scheduled_tokens) == {"a": 1}, f"got {dict(out.num_scheduled_tokens)}"
    assert b.status == RequestStatus.PREEMPTED, f"b's status is {b.status}"
    assert b.num_computed_tokens == 0, (
        f"recompute: b's num_computed_tokens must go back to 0, is {b.num_computed_tokens}")
    assert b.num_preemptions == 1, f"b.num_preemptions must be 1, is {b.num_preemptions}"
    assert list(b.output_token_ids) == [model_token("b", 8)], "b keeps the token it generated"
    assert table(sched, "b") == [] and "b" not in sched.kv_cache_manager.req_to_blocks, (
        "a preempted request's blocks are freed (kv_cache_manager.free)")
    assert running_ids(sched) == ["a"] and a.status == RequestStatus.RUNNING


@graded(2, "Preemption by recompute: the preempted request goes to the FRONT of the waiting "
           "queue (it arrived before everyone still waiting)", f"{DOC}#preemption-by-recompute")
def test_preempted_request_goes_to_the_front():
    """c was waiting before b was preempted; b must still be readmitted first."""
    engine = two_full_requests()
    engine.add(make_request("c", 2, base=90))
    engine.step()
    assert waiting_ids(engine.sched)[0] == "b", (
        f"b was preempted: it must be first in the waiting queue, got {waiting_ids(engine.sched)}")


@graded(2, "No admissions after a preemption: a step that preempted admits nobody, even if a "
           "waiting request would fit (memory is tight)", f"{DOC}#no-admissions-after-a-preemption")
def test_no_admission_in_a_step_that_preempted():
    """After b's preemption one block is free and c (2 tokens) would fit: it must still wait."""
    engine = two_full_requests()
    engine.add(make_request("c", 2, base=90))
    out, _ = engine.step()
    assert out.preempted_req_ids == {"b"}
    assert "c" not in out.num_scheduled_tokens and out.scheduled_new_reqs == [], (
        f"the step preempted b: nobody may be admitted, but the batch is "
        f"{dict(out.num_scheduled_tokens)}")
    assert waiting_ids(engine.sched) == ["b", "c"], f"waiting is {waiting_ids(engine.sched)}"


@graded(2, "No admissions after a preemption: not even the request just preempted, although its "
           "first chunk would fit the block that is left",
        f"{DOC}#no-admissions-after-a-preemption")
def test_the_victim_is_not_readmitted_in_the_same_step():
    """Caching off, threshold 4: b's first chunk back would need 1 block, and 1 is free."""
    engine = Engine(make_scheduler(num_blocks=5, budget=16, max_model_len=32, caching=False,
                                   long_prefill_token_threshold=4))
    engine.add(make_request("a", 8, base=0), make_request("b", 8, base=50))
    for _ in range(2):
        engine.step()
    assert num_free(engine.sched) == 0, "set-up: a and b hold the 4 usable blocks"
    out, _ = engine.step()
    assert out.preempted_req_ids == {"b"}
    assert dict(out.num_scheduled_tokens) == {"a": 1}, (
        f"b was preempted in this step: it must not be readmitted before the next one, but the "
        f"batch is {dict(out.num_scheduled_tokens)}")
    assert waiting_ids(engine.sched) == ["b"] and num_free(engine.sched) == 1
    out, _ = engine.step()
    assert dict(out.num_scheduled_tokens) == {"a": 1, "b": 4}, (
        f"next step b resumes with a 4-token chunk, got {dict(out.num_scheduled_tokens)}")
    assert out.scheduled_cached_reqs.resumed_req_ids == {"b"}


@graded(2, "Preemption: a request that must preempt itself (it is the last running one) is not "
           "scheduled, and the running loop stops there", f"{DOC}#preemption-by-recompute")
def test_a_request_that_preempts_itself_stops_the_loop():
    """a takes 3 blocks, b's first chunk the last one; next step b cannot grow."""
    engine = Engine(make_scheduler(num_blocks=5, budget=14, max_model_len=32))
    engine.add(make_request("a", 11, base=0), make_request("b", 8, base=50))
    out, _ = engine.step()
    assert dict(out.num_scheduled_tokens) == {"a": 11, "b": 3}
    out, _ = engine.step()
    assert dict(out.num_scheduled_tokens) == {"a": 1}, (
        f"b needs a second block and none is free: b preempts itself and is not scheduled; "
        f"got {dict(out.num_scheduled_tokens)}")
    assert out.preempted_req_ids == {"b"} and engine.sched.requests["b"].num_preemptions == 1


@graded(3, "Preemption by recompute: a resumed request is sent to the runner with all its tokens "
           "and a new block table, recomputes, and finishes with exactly the right tokens",
        f"{DOC}#preemption-by-recompute")
def test_resumed_request_finishes_with_the_right_tokens():
    """b is preempted, readmitted when a finishes, and generates what the model dictates."""
    engine = two_full_requests(a_max_tokens=4)
    engine.step()  # b is preempted
    while "a" in engine.sched.requests:
        engine.step()
    out, _ = engine.step()
    cached = out.scheduled_cached_reqs
    assert cached.req_ids == ["b"] and cached.resumed_req_ids == {"b"}, (
        f"b must come back as a resumed request (scheduled_cached_reqs.resumed_req_ids), got "
        f"req_ids {cached.req_ids}, resumed {cached.resumed_req_ids}")
    engine.run()
    assert engine.outputs["a"] == [model_token("a", 8 + i) for i in range(4)]
    assert engine.outputs["b"] == [model_token("b", 8 + i) for i in range(8)], (
        "b, preempted once, must still produce exactly the fake model's 8 tokens")
    assert engine.finished == {"a": FinishReason.LENGTH, "b": FinishReason.LENGTH}


@graded(3, "Finishing frees: a finished request's blocks are freed at once, it leaves running "
           "and requests, and its id reaches the runner in the next output, once",
        f"{DOC}#finishing-and-freeing")
def test_finished_requests_are_freed():
    """Everyone finishes: no block is left held, nothing is left running."""
    engine = Engine(make_scheduler(num_blocks=12, budget=16, max_model_len=48))
    engine.add(*(make_request(rid, 6 + 3 * i, max_tokens=3 + i, base=100 * i)
                 for i, rid in enumerate("abcd")))
    engine.run()
    sched = engine.sched
    assert sched.running == [] and len(sched.waiting) == 0 and sched.requests == {}, (
        f"after every request finished: running {running_ids(sched)}, waiting "
        f"{[r.request_id for r in sched.waiting]}, requests {sorted(sched.requests)}")
    assert sched.kv_cache_manager.req_to_blocks == {}, (
        f"finished requests still hold blocks: {sorted(sched.kv_cache_manager.req_to_blocks)}")
    assert num_free(sched) == 11, f"all 11 usable blocks must be free, {num_free(sched)} are"
    out = sched.schedule()
    last = list(engine.finished)[-1]
    assert last in out.finished_req_ids, (
        f"{last} finished in the last step: the next output must list it in finished_req_ids")
    assert sched.schedule().finished_req_ids == set(), "finished ids are reported once"


@graded(2, "finish_requests (abort) finishes running and waiting requests from outside, frees "
           "their blocks, ignores unknown or finished ids and returns those it finished",
        f"{DOC}#finishing-and-freeing")
def test_finish_requests_aborts():
    """Abort one running and one waiting request, then everyone."""
    engine = Engine(make_scheduler(budget=8, max_num_seqs=2))
    engine.add(*(make_request(rid, 4, base=10 * i) for i, rid in enumerate("abc")))
    engine.step()
    sched = engine.sched
    done = sched.finish_requests(["a", "c", "zzz"], RequestStatus.FINISHED_ABORTED)
    assert sorted(done) == ["a", "c"], f"a (running) and c (waiting) are finished, got {done}"
    assert running_ids(sched) == ["b"] and waiting_ids(sched) == []
    assert "a" not in sched.kv_cache_manager.req_to_blocks, "an aborted request's blocks are freed"
    assert sched.finish_requests("a", RequestStatus.FINISHED_ABORTED) == []
    out, _ = engine.step()
    assert out.finished_req_ids == {"a", "c"}
    sched.finish_requests(None, RequestStatus.FINISHED_ABORTED)
    assert not sched.has_unfinished_requests() and num_free(sched) == 19
