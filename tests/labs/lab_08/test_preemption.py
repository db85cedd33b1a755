"""lab-08, part 3: preemption by recompute, and finishing."""

from __future__ import annotations

from grading.remote import LearnerError
from grading.suite import graded
from mini_vllm.request import FinishReason, RequestStatus
from tests.labs.lab_08.helpers import DOC, Engine, batch, model_token, x_and_y_fill_the_pool

FINISHED = {
    FinishReason.STOP: RequestStatus.FINISHED_STOPPED,
    FinishReason.LENGTH: RequestStatus.FINISHED_LENGTH_CAPPED,
}


def two_full_requests(a_max_tokens: int = 8) -> Engine:
    """4 usable blocks, two 8-token prompts: after step 1 the pool is full."""
    engine = Engine(num_blocks=5, budget=16, max_model_len=32)
    engine.add("a", 8, max_tokens=a_max_tokens, base=0)
    engine.add("b", 8, base=50)
    out, _ = engine.step()
    assert dict(out.num_scheduled_tokens) == {"a": 8, "b": 8}, (
        f"set-up: both prompts fit in step 1, got {batch(out)}"
    )
    assert engine.num_free() == 0
    return engine


@graded(
    4,
    "Preemption by recompute: when allocate_slots returns None, the LAST running request "
    "is preempted: blocks freed, num_computed_tokens 0, status PREEMPTED, "
    "num_preemptions + 1, outputs kept",
    f"{DOC}#preemption-by-recompute",
)
def test_preempts_the_last_running_request():
    """a's 9th token needs a third block; b, admitted last, makes room."""
    engine = two_full_requests()
    out, _ = engine.step()
    assert out.preempted_req_ids == {"b"}, (
        f"the last running request (b) must be preempted, got {sorted(out.preempted_req_ids)}"
    )
    assert dict(out.num_scheduled_tokens) == {"a": 1}, f"got {batch(out)}"
    b = engine.info("b")
    assert b["status"] == RequestStatus.PREEMPTED, f"b's status is {b['status']}"
    assert b["num_computed_tokens"] == 0, (
        f"recompute: b's num_computed_tokens must go back to 0, is {b['num_computed_tokens']}"
    )
    assert b["num_preemptions"] == 1, f"b.num_preemptions must be 1, is {b['num_preemptions']}"
    assert b["output_token_ids"] == [model_token("b", 8)], "b keeps the token it generated"
    assert "b" not in engine.state["tables"], (
        "a preempted request's blocks are freed (kv_cache_manager.free)"
    )
    assert engine.running == ["a"] and engine.info("a")["status"] == RequestStatus.RUNNING

    # "Last" is the order of running, not the arrival time: x (arrival 9) reaches the scheduler
    # before y (arrival 0). In step 3 x needs a second block and none is free: y, admitted
    # last, is the victim, although x arrived later (older schedulers sorted running by arrival).
    engine = x_and_y_fill_the_pool(x_arrival=9.0)
    out, _ = engine.step()
    assert out.preempted_req_ids == {"y"} and batch(out) == [("x", 1)], (
        "step 3: x needs a block and none is free; under FCFS the victim is the last request of "
        "running (self.running.pop()), y, whatever the arrival times (x's is 9, y's 0): expected "
        f"batch [('x', 1)] with y preempted, got batch {batch(out)}, preempted "
        f"{sorted(out.preempted_req_ids)}"
    )
    engine.run()
    engine.check_drained()


@graded(
    1,
    "_preempt_request does the whole preemption itself (blocks freed, num_computed_tokens 0, "
    "status PREEMPTED, num_preemptions + 1, requeued at the FRONT of waiting); its caller only "
    "takes the request out of running, and a request that is not RUNNING raises "
    "RuntimeError, nothing changed. reset_prefix_cache(reset_running_requests=True) "
    "preempts every running request through it",
    f"{DOC}#preemption-by-recompute",
)
def test_reset_prefix_cache_preempts_every_running_request():
    """a, b and c are running (8-token prompts, one decode step) when the prefix cache is reset
    with ``reset_running_requests=True``: the given code pops each running request, last first,
    and hands it to your ``_preempt_request``."""
    engine = Engine(num_blocks=20, budget=32, max_model_len=32)
    for i, rid in enumerate("abc"):
        engine.add(rid, 8, base=20 * i)
    for _ in range(2):
        engine.step()
    assert engine.running == ["a", "b", "c"], f"set-up: a, b, c run, got {engine.running}"
    call = "reset_prefix_cache(reset_running_requests=True)"
    reset = engine.reset_prefix_cache(reset_running_requests=True)
    assert engine.running == [] and engine.waiting == ["a", "b", "c"], (
        f"after {call}, every running request waits again, in its old order (each is "
        f"prepended, last first): running {engine.running}, waiting {engine.waiting}. "
        "_preempt_request itself must requeue the request at the front of waiting"
    )
    for rid in "abc":
        info = engine.info(rid)
        assert (info["status"], info["num_computed_tokens"], info["num_preemptions"]) == (
            RequestStatus.PREEMPTED,
            0,
            1,
        ), (
            f"after {call}, {rid} must be PREEMPTED with num_computed_tokens 0 and "
            f"num_preemptions 1 (all set by _preempt_request), is {info['status'].name}, "
            f"{info['num_computed_tokens']}, {info['num_preemptions']}"
        )
    assert not engine.state["tables"] and engine.num_free() == 19 and reset is True, (
        f"after {call} every block is free (each preempted request's blocks are freed by "
        f"_preempt_request) and the reset succeeds: tables {engine.state['tables']}, "
        f"{engine.num_free()} of 19 blocks free, returned {reset!r}"
    )
    # Preempting a request twice would requeue it twice and count it twice: upstream asserts
    # RUNNING first, and the stub's docstring asks for a RuntimeError.
    call = "_preempt_request(a) while a is PREEMPTED"
    try:
        engine.sched._preempt_request(engine.handles["a"])
    except RuntimeError:
        pass
    except LearnerError as exc:
        raise AssertionError(
            f"{call} must raise RuntimeError (only a RUNNING request can be preempted; README "
            f"task 6), it raised {getattr(exc, 'display', exc)}"
        ) from None
    else:
        raise AssertionError(
            f"{call} must raise RuntimeError before changing anything: only a RUNNING request "
            "can be preempted (README task 6, the docstring of _preempt_request); a second "
            "preemption requeues and counts the request again"
        )
    engine.refresh()
    assert engine.waiting == ["a", "b", "c"] and engine.info("a")["num_preemptions"] == 1, (
        f"the refused {call} changed the scheduler: waiting {engine.waiting}, a's "
        f"num_preemptions {engine.info('a')['num_preemptions']} (want a, b, c and 1)"
    )
    engine.run()
    engine.check_drained()


@graded(
    2,
    "Preemption by recompute: after each preemption the allocation is retried, and if it "
    "still fails the next last running request is preempted, until the request fits (or "
    "preempts itself)",
    f"{DOC}#preemption-by-recompute",
)
def test_preempts_again_until_it_fits():
    """7 usable blocks, threshold 8, the admission gate off: a's third 8-token chunk needs 2
    blocks, and d and c, the last two running requests, hold one each."""
    engine = Engine(
        num_blocks=8,
        budget=32,
        max_model_len=32,
        long_prefill_token_threshold=8,
        scheduler_reserve_full_isl=False,
    )
    engine.add("a", 24, base=0, max_tokens=2)
    for i, rid in enumerate("bcd"):
        engine.add(rid, 2, base=40 + 10 * i)
    steps = [batch(engine.step()[0]) for _ in range(2)]
    assert steps == [
        [("a", 8), ("b", 2), ("c", 2), ("d", 2)],
        [("a", 8)] + [(r, 1) for r in "bcd"],
    ], f"set-up: steps 1 and 2 are {steps}"
    assert engine.num_free() == 0, "set-up: the 7 usable blocks are held"
    out, _ = engine.step()
    assert batch(out) == [("a", 8), ("b", 1)] and out.preempted_req_ids == {"c", "d"}, (
        "step 3: a needs 2 blocks and none is free; preempting d frees 1, not enough, so the "
        "allocation fails again and c is preempted too; then a fits, and b decodes. Retry "
        "allocate_slots in a loop (preempt, retry, preempt again), not once; got batch "
        f"{batch(out)}, preempted {sorted(out.preempted_req_ids)}"
    )
    engine.run()
    engine.check_drained()


@graded(
    2,
    "Preemption by recompute: the preempted request goes to the FRONT of the waiting "
    "queue (it was admitted before everyone still waiting), whatever the arrival times",
    f"{DOC}#preemption-by-recompute",
)
def test_preempted_request_goes_to_the_front():
    """c was waiting before b was preempted; b must still be readmitted first. Then again with
    a c that reached the scheduler late (arrival 0.5, before b's 1)."""
    engine = two_full_requests()
    engine.add("c", 2, base=90)
    engine.step()
    assert engine.waiting[:1] == ["b"], (
        f"b was preempted: it must be first in the waiting queue, got {engine.waiting}"
    )
    engine = two_full_requests()
    engine.add("c", 2, base=90, arrival=0.5)
    engine.step()
    assert engine.waiting == ["b", "c"], (
        f"b was preempted: under FCFS it goes to the front (waiting.prepend_request), before c, "
        f"although c's arrival time (0.5) is earlier than b's (1): the queue is never sorted "
        f"by arrival time; got {engine.waiting}"
    )


@graded(
    2,
    "No admissions after a preemption: a step that preempted admits nobody, even if a "
    "waiting request would fit (memory is tight)",
    f"{DOC}#no-admissions-after-a-preemption",
)
def test_no_admission_in_a_step_that_preempted():
    """After b's preemption one block is free and c (2 tokens) would fit: it must still wait."""
    engine = two_full_requests()
    engine.add("c", 2, base=90)
    out, _ = engine.step()
    assert out.preempted_req_ids == {"b"}, f"b is preempted, got {sorted(out.preempted_req_ids)}"
    assert "c" not in out.num_scheduled_tokens and out.scheduled_new_reqs == [], (
        f"the step preempted b: nobody may be admitted, but the batch is {batch(out)}"
    )
    assert engine.waiting == ["b", "c"], f"waiting is {engine.waiting}"


@graded(
    2,
    "No admissions after a preemption: not even the request just preempted, although its "
    "first chunk would fit the block that is left",
    f"{DOC}#no-admissions-after-a-preemption",
)
def test_the_victim_is_not_readmitted_in_the_same_step():
    """Caching off, threshold 4, the admission gate off: b's first chunk back would need 1
    block, and 1 is free."""
    engine = Engine(
        num_blocks=5,
        budget=16,
        max_model_len=32,
        caching=False,
        long_prefill_token_threshold=4,
        scheduler_reserve_full_isl=False,
    )
    engine.add("a", 8, base=0)
    engine.add("b", 8, base=50)
    for _ in range(2):
        engine.step()
    assert engine.num_free() == 0, "set-up: a and b hold the 4 usable blocks"
    out, _ = engine.step()
    assert out.preempted_req_ids == {"b"}, f"b is preempted, got {sorted(out.preempted_req_ids)}"
    assert dict(out.num_scheduled_tokens) == {"a": 1}, (
        f"b was preempted in this step: it must not be readmitted before the next one, but the "
        f"batch is {batch(out)}"
    )
    assert engine.waiting == ["b"] and engine.num_free() == 1
    out, _ = engine.step()
    assert dict(out.num_scheduled_tokens) == {"a": 1, "b": 4}, (
        f"next step b resumes with a 4-token chunk, got {batch(out)}"
    )
    assert out.scheduled_cached_reqs.resumed_req_ids == {"b"}


@graded(
    2,
    "Preemption: a request that must preempt itself (it is the last running one) is not "
    "scheduled, and the running loop stops there",
    f"{DOC}#preemption-by-recompute",
)
def test_a_request_that_preempts_itself_stops_the_loop():
    """The admission gate off: a takes 3 blocks, b's first chunk the last one; next step b
    cannot grow."""
    engine = Engine(num_blocks=5, budget=14, max_model_len=32, scheduler_reserve_full_isl=False)
    engine.add("a", 11, base=0)
    engine.add("b", 8, base=50)
    out, _ = engine.step()
    assert dict(out.num_scheduled_tokens) == {"a": 11, "b": 3}, f"got {batch(out)}"
    out, _ = engine.step()
    assert dict(out.num_scheduled_tokens) == {"a": 1}, (
        f"b needs a second block and none is free: b preempts itself and is not scheduled; "
        f"got {batch(out)}"
    )
    assert out.preempted_req_ids == {"b"} and engine.info("b")["num_preemptions"] == 1


@graded(
    3,
    "Preemption by recompute: a resumed request is sent to the runner with all its tokens "
    "and a new block table, recomputes, and finishes with exactly the right tokens",
    f"{DOC}#preemption-by-recompute",
)
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
        f"req_ids {cached.req_ids}, resumed {sorted(cached.resumed_req_ids)}"
    )
    engine.run()
    assert engine.outputs["a"] == [model_token("a", 8 + i) for i in range(4)]
    assert engine.outputs["b"] == [model_token("b", 8 + i) for i in range(8)], (
        "b, preempted once, must still produce exactly the fake model's 8 tokens"
    )
    assert engine.finished == {"a": FinishReason.LENGTH, "b": FinishReason.LENGTH}
    engine.check_drained()


@graded(
    1,
    "Preemption by recompute: a resumed request recomputes its prompt and its outputs as one "
    "long prefill: long_prefill_token_threshold caps every step of it, output tokens as well "
    "as prompt tokens",
    f"{DOC}#the-long-prefill-threshold",
)
def test_resumed_recompute_is_capped_by_the_threshold():
    """Threshold 4, caching off, 4 usable blocks: a and b (1-token prompts) decode side by side
    until b is preempted with 8 outputs; it resumes with 9 tokens to recompute."""
    engine = Engine(
        num_blocks=5, budget=8, max_model_len=32, caching=False, long_prefill_token_threshold=4
    )
    engine.add("a", 1, base=0, max_tokens=9)
    engine.add("b", 1, base=50, max_tokens=12)
    for _ in range(9):
        out, _ = engine.step()
    b = engine.info("b")
    assert out.preempted_req_ids == {"b"} and len(b["output_token_ids"]) == 8, (
        f"set-up: b is preempted in step 9 with 8 outputs; preempted "
        f"{sorted(out.preempted_req_ids)}, b has {len(b['output_token_ids'])} outputs"
    )
    chunks = [engine.step()[0].num_scheduled_tokens.get("b") for _ in range(3)]
    assert chunks == [4, 4, 1], (
        "b resumes with 9 tokens to recompute (1 prompt token, 8 outputs): chunks of 4, 4, 1 "
        "under threshold 4. The cap applies to every running request with more than 4 "
        f"tokens to compute, not only to prompt tokens; b got {chunks}"
    )
    engine.run()
    engine.check_drained()


@graded(
    3,
    "Finishing frees: a finished request's blocks are freed at once (update_from_output frees "
    "each request as it stops, in the step's order), it leaves running and requests, and its "
    "id reaches the runner in the next output, once",
    f"{DOC}#finishing-and-freeing",
)
def test_finished_requests_are_freed():
    """Everyone finishes: no block is left held, nothing is left running. Then a and b stop in
    the same step: the order they are freed in is the free queue's, which decides whose cached
    blocks a later allocation evicts."""
    engine = Engine(num_blocks=12, budget=16, max_model_len=48)
    for i, rid in enumerate("abcd"):
        engine.add(rid, 6 + 3 * i, max_tokens=3 + i, base=100 * i)
    engine.run()
    engine.check_drained()
    last = list(engine.finished)[-1]
    out = engine.schedule()
    assert last in out.finished_req_ids, (
        f"{last} finished in the last step: the next output must list it in finished_req_ids, "
        f"got {sorted(out.finished_req_ids)}"
    )
    engine.update({})
    assert engine.schedule().finished_req_ids == set(), "finished ids are reported once"
    engine.update({})

    # 4 usable blocks: a and b (8-token prompts, 2 blocks each) stop in step 1, a first.
    engine = Engine(num_blocks=5, budget=16, max_model_len=32)
    engine.add("a", 8, base=0, max_tokens=1)
    engine.add("b", 8, base=100, max_tokens=1)
    engine.step()
    assert set(engine.finished) == {"a", "b"} and engine.num_free() == 4, (
        f"set-up: a and b stop in step 1 and free their 4 blocks; finished "
        f"{sorted(engine.finished)}, {engine.num_free()} blocks free"
    )
    engine.add("c", 4, base=200, max_tokens=1)
    engine.add("d", prompt=[*range(8), 300], max_tokens=1)  # a's prompt, and one more token
    out, _ = engine.step()
    assert batch(out) == [("c", 4), ("d", 5)], (
        "a and b stopped in step 1, a first in the batch: update_from_output frees each "
        "request as it stops (_free_request inside the loop over the step's requests), so a's "
        "blocks join the free queue (tail first) before b's. c's new block is then the least "
        "recently freed one, a's second block, whose cached prefix is lost, and d, which "
        "repeats a's prompt, hits a's first block only (4 tokens) and computes 5: expected "
        f"[c 4, d 5], got {batch(out)} (d 1 means b's blocks were freed before a's)"
    )
    engine.run()
    engine.check_drained()


@graded(
    3,
    "A request can stop while PREEMPTED: when schedule() runs again before the last "
    "step's update_from_output (async scheduling), a request whose token is still in "
    "flight may be preempted, and that token may end it (EOS, max_tokens). "
    "update_from_output frees it and removes it from the WAITING queue (it is not in "
    "running): stopped_preempted_reqs, as upstream",
    f"{DOC}#stopping-while-preempted",
)
def test_a_request_that_stops_while_preempted_leaves_the_waiting_queue():
    """2 usable blocks, threshold 4: step 1 runs a's first chunk and b's whole prompt; step 2,
    planned before step 1's token for b is in, needs b's block for a's second chunk and
    preempts b; then b's token arrives, and it is b's last (EOS, then max_tokens=1)."""
    for reason in (FinishReason.STOP, FinishReason.LENGTH):
        engine = Engine(
            num_blocks=3,
            budget=16,
            max_model_len=32,
            long_prefill_token_threshold=4,
            reference=True,
        )
        engine.add("a", 8, max_tokens=1, base=0)
        token = model_token("b", 4)
        if reason == FinishReason.STOP:
            engine.add("b", 4, max_tokens=8, base=50, eos=token)
        else:
            engine.add("b", 4, max_tokens=1, base=50)
        out1 = engine.schedule()
        assert batch(out1) == [("a", 4), ("b", 4)], f"set-up: step 1 is {batch(out1)}"
        sampled1 = engine.execute(out1)
        assert sampled1 == {"b": [token]}, f"set-up: the runner sampled {sampled1}"
        out2 = engine.schedule(ahead=True)  # step 1 is still running
        assert batch(out2) == [("a", 4)] and out2.preempted_req_ids == {"b"}, (
            f"set-up: step 2 (planned while step 1 runs) gives a its second chunk and preempts "
            f"b; got batch {batch(out2)}, preempted {sorted(out2.preempted_req_ids)}"
        )

        results = engine.update(sampled1)  # step 1's token for b: its last
        got = [(r.request_id, r.new_token_ids, r.finish_reason) for r in results]
        assert got == [("b", [token], reason)], (
            f"b's token from step 1 ends it ({reason}) although b was preempted meanwhile: "
            f"the output must be [('b', [{token}], {reason})], got {got}"
        )
        b = engine.info("b")
        assert b["status"] is FINISHED[reason], (
            f"b stopped ({reason}): its status must be {FINISHED[reason].name}, is "
            f"{b['status'].name}"
        )
        assert engine.waiting == [] and engine.running == ["a"], (
            f"b stopped while preempted, so it was in the waiting queue: it must leave it "
            f"(running must stay ['a']); waiting is {engine.waiting}, running {engine.running}"
        )
        assert "b" not in engine.state["requests"] and not engine.table("b"), (
            "b is finished: it leaves the scheduler's requests and holds no block"
        )
        counts = engine.unfinished_counts()
        assert counts == (1, True), (
            f"only a is unfinished: get_num_unfinished_requests() and has_unfinished_requests() "
            f"must say (1, True), say {counts} (they count the queues)"
        )

        engine.update(engine.execute(out2))  # a's last chunk: its one token
        assert engine.finished == {"a": FinishReason.LENGTH, "b": reason}, engine.finished
        assert engine.unfinished_counts() == (0, False), (
            f"a and b are finished: get_num_unfinished_requests() and has_unfinished_requests() "
            f"must say (0, False), say {engine.unfinished_counts()}"
        )
        # The next steps: both ids reach the runner once, and a newcomer gets the whole pool.
        engine.add("c", 6, max_tokens=2, base=90)
        out, _ = engine.step()
        assert out.finished_req_ids == {"a", "b"}, (
            f"a and b finished since step 2 was built: step 3's output must list both in "
            f"finished_req_ids, got {sorted(out.finished_req_ids)}"
        )
        assert batch(out) == [("c", 4)], f"c is admitted with a 4-token chunk, got {batch(out)}"
        engine.run()
        engine.check_drained()
    # The same in-flight token when it does not end b: it is still b's, applied although b
    # now waits (update_from_output walks the step's requests, not running); b keeps it when
    # it is readmitted and recomputes it with its prompt.
    engine = Engine(
        num_blocks=3, budget=16, max_model_len=32, long_prefill_token_threshold=4, reference=True
    )
    engine.add("a", 8, max_tokens=1, base=0)
    engine.add("b", 4, max_tokens=3, base=50)  # 7 tokens at most: the 2 blocks hold them
    out1 = engine.schedule()
    sampled1 = engine.execute(out1)
    out2 = engine.schedule(ahead=True)
    assert out2.preempted_req_ids == {"b"}, (
        f"set-up: step 2 preempts b, got {sorted(out2.preempted_req_ids)}"
    )
    results = engine.update(sampled1)
    got = [(r.request_id, r.new_token_ids, r.finish_reason) for r in results]
    token = model_token("b", 4)
    assert got == [("b", [token], None)], (
        f"step 1's token for b arrives after step 2 preempted b: it is b's first output all the "
        f"same (walk the step's num_scheduled_tokens, not running, which b has left); expected "
        f"[('b', [{token}], None)], got {got}"
    )
    assert engine.info("b")["output_token_ids"] == [token] and engine.waiting == ["b"], (
        f"b keeps its token and waits: outputs {engine.info('b')['output_token_ids']}, "
        f"waiting {engine.waiting}"
    )
    engine.update(engine.execute(out2))
    engine.run()
    engine.check_drained()
