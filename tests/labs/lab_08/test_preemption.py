"""lab-08, part 3: preemption by recompute, and finishing."""

from __future__ import annotations

from grading.suite import graded
from mini_vllm.request import FinishReason, RequestStatus
from tests.labs.lab_08.helpers import DOC, Engine, batch, model_token


def two_full_requests(a_max_tokens: int = 8) -> Engine:
    """4 usable blocks, two 8-token prompts: after step 1 the pool is full."""
    engine = Engine(num_blocks=5, budget=16, max_model_len=32)
    engine.add("a", 8, max_tokens=a_max_tokens, base=0)
    engine.add("b", 8, base=50)
    out, _ = engine.step()
    assert dict(out.num_scheduled_tokens) == {"a": 8, "b": 8}, (
        f"set-up: both prompts fit in step 1, got {batch(out)}")
    assert engine.num_free() == 0
    return engine


@graded(4, "Preemption by recompute: when allocate_slots returns None, the LAST running request "
           "is preempted: blocks freed, num_computed_tokens 0, status PREEMPTED, "
           "num_preemptions + 1, outputs kept", f"{DOC}#preemption-by-recompute")
def test_preempts_the_last_running_request():
    """a's 9th token needs a third block; b, admitted last, makes room."""
    engine = two_full_requests()
    out, _ = engine.step()
    assert out.preempted_req_ids == {"b"}, (
        f"the last running request (b) must be preempted, got {sorted(out.preempted_req_ids)}")
    assert dict(out.num_scheduled_tokens) == {"a": 1}, f"got {batch(out)}"
    b = engine.info("b")
    assert b["status"] == RequestStatus.PREEMPTED, f"b's status is {b['status']}"
    assert b["num_computed_tokens"] == 0, (
        f"recompute: b's num_computed_tokens must go back to 0, is {b['num_computed_tokens']}")
    assert b["num_preemptions"] == 1, f"b.num_preemptions must be 1, is {b['num_preemptions']}"
    assert b["output_token_ids"] == [model_token("b", 8)], "b keeps the token it generated"
    assert "b" not in engine.state["tables"], (
        "a preempted request's blocks are freed (kv_cache_manager.free)")
    assert engine.running == ["a"] and engine.info("a")["status"] == RequestStatus.RUNNING


@graded(2, "Preemption by recompute: the preempted request goes to the FRONT of the waiting "
           "queue (it arrived before everyone still waiting)", f"{DOC}#preemption-by-recompute")
def test_preempted_request_goes_to_the_front():
    """c was waiting before b was preempted; b must still be readmitted first."""
    engine = two_full_requests()
    engine.add("c", 2, base=90)
    engine.step()
    assert engine.waiting[:1] == ["b"], (
        f"b was preempted: it must be first in the waiting queue, got {engine.waiting}")


@graded(2, "No admissions after a preemption: a step that preempted admits nobody, even if a "
           "waiting request would fit (memory is tight)", f"{DOC}#no-admissions-after-a-preemption")
def test_no_admission_in_a_step_that_preempted():
    """After b's preemption one block is free and c (2 tokens) would fit: it must still wait."""
    engine = two_full_requests()
    engine.add("c", 2, base=90)
    out, _ = engine.step()
    assert out.preempted_req_ids == {"b"}, f"b is preempted, got {sorted(out.preempted_req_ids)}"
    assert "c" not in out.num_scheduled_tokens and out.scheduled_new_reqs == [], (
        f"the step preempted b: nobody may be admitted, but the batch is {batch(out)}")
    assert engine.waiting == ["b", "c"], f"waiting is {engine.waiting}"


@graded(2, "No admissions after a preemption: not even the request just preempted, although its "
           "first chunk would fit the block that is left",
        f"{DOC}#no-admissions-after-a-preemption")
def test_the_victim_is_not_readmitted_in_the_same_step():
    """Caching off, threshold 4: b's first chunk back would need 1 block, and 1 is free."""
    engine = Engine(num_blocks=5, budget=16, max_model_len=32, caching=False,
                    long_prefill_token_threshold=4)
    engine.add("a", 8, base=0)
    engine.add("b", 8, base=50)
    for _ in range(2):
        engine.step()
    assert engine.num_free() == 0, "set-up: a and b hold the 4 usable blocks"
    out, _ = engine.step()
    assert out.preempted_req_ids == {"b"}, f"b is preempted, got {sorted(out.preempted_req_ids)}"
    assert dict(out.num_scheduled_tokens) == {"a": 1}, (
        f"b was preempted in this step: it must not be readmitted before the next one, but the "
        f"batch is {batch(out)}")
    assert engine.waiting == ["b"] and engine.num_free() == 1
    out, _ = engine.step()
    assert dict(out.num_scheduled_tokens) == {"a": 1, "b": 4}, (
        f"next step b resumes with a 4-token chunk, got {batch(out)}")
    assert out.scheduled_cached_reqs.resumed_req_ids == {"b"}


@graded(2, "Preemption: a request that must preempt itself (it is the last running one) is not "
           "scheduled, and the running loop stops there", f"{DOC}#preemption-by-recompute")
def test_a_request_that_preempts_itself_stops_the_loop():
    """a takes 3 blocks, b's first chunk the last one; next step b cannot grow."""
    engine = Engine(num_blocks=5, budget=14, max_model_len=32)
    engine.add("a", 11, base=0)
    engine.add("b", 8, base=50)
    out, _ = engine.step()
    assert dict(out.num_scheduled_tokens) == {"a": 11, "b": 3}, f"got {batch(out)}"
    out, _ = engine.step()
    assert dict(out.num_scheduled_tokens) == {"a": 1}, (
        f"b needs a second block and none is free: b preempts itself and is not scheduled; "
        f"got {batch(out)}")
    assert out.preempted_req_ids == {"b"} and engine.info("b")["num_preemptions"] == 1


@graded(3, "Preemption by recompute: a resumed request is sent to the runner with all its tokens "
           "and a new block table, recomputes, and finishes with exactly the right tokens",
        f"{DOC}#preemption-by-recompute")
def test_resumed_request_finishes_with_the_right_tokens():
    """b is preempted, readmitted when a finishes, and generates what the model dictates."""
    engine = two_full_requests(a_max_tokens=4)
    engine.step()  # b is preempted
    while "a" in engine.state["requests"]:
        engine.step()
    out, _ = engine.step()
    cached = out.scheduled_cached_reqs
    assert cached.req_ids == ["b"] and cached.resumed_req_ids == {"b"}, (
        f"b must come back as a resumed request (scheduled_cached_reqs.resumed_req_ids), got "
        f"req_ids {cached.req_ids}, resumed {sorted(cached.resumed_req_ids)}")
    engine.run()
    assert engine.outputs["a"] == [model_token("a", 8 + i) for i in range(4)]
    assert engine.outputs["b"] == [model_token("b", 8 + i) for i in range(8)], (
        "b, preempted once, must still produce exactly the fake model's 8 tokens")
    assert engine.finished == {"a": FinishReason.LENGTH, "b": FinishReason.LENGTH}
    engine.check_drained()


@graded(3, "Finishing frees: a finished request's blocks are freed at once, it leaves running "
           "and requests, and its id reaches the runner in the next output, once",
        f"{DOC}#finishing-and-freeing")
def test_finished_requests_are_freed():
    """Everyone finishes: no block is left held, nothing is left running."""
    engine = Engine(num_blocks=12, budget=16, max_model_len=48)
    for i, rid in enumerate("abcd"):
        engine.add(rid, 6 + 3 * i, max_tokens=3 + i, base=100 * i)
    engine.run()
    engine.check_drained()
    last = list(engine.finished)[-1]
    out = engine.schedule()
    assert last in out.finished_req_ids, (
        f"{last} finished in the last step: the next output must list it in finished_req_ids, "
        f"got {sorted(out.finished_req_ids)}")
    engine.update({})
    assert engine.schedule().finished_req_ids == set(), "finished ids are reported once"
    engine.update({})
