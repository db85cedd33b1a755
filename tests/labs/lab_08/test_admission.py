"""lab-08, part 5: the admission gate, then the priority policy (the extension).

The gate is on by default (``scheduler_reserve_full_isl=True``, as upstream): a waiting request
is admitted only if its whole sequence fits. The priority policy (``policy="priority"``) orders
the waiting queue by ``(priority, arrival_time)`` and preempts the running request that sorts
last. Requests arrive at times 0, 1, 2, ... in the order the tests add them.
"""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from grading.suite import graded
from tests.labs.lab_08.helpers import (
    DOC,
    RANDOM_SETTINGS,
    Engine,
    batch,
    bounded_shrinking,
    x_and_y_fill_the_pool,
)


@graded(
    2,
    "The admission gate: a waiting request whose whole prompt does not fit is not "
    "admitted, although its first chunk would; nothing is preempted for it, and it keeps "
    "its place at the front of the waiting queue (FCFS: nobody behind it is admitted)",
    f"{DOC}#the-admission-gate",
)
def test_the_gate_waits_for_the_whole_prompt():
    """4 usable blocks: a takes 3; b's 8-token prompt needs 2, its 3-token chunk only 1; c
    (3 tokens, 1 block) waits behind b."""
    engine = Engine(num_blocks=5, budget=14, max_model_len=32)
    engine.add("a", 11, base=0, max_tokens=4)
    engine.add("b", 8, base=50, max_tokens=4)
    engine.add("c", 3, base=90, max_tokens=1)
    out, _ = engine.step()
    assert batch(out) == [("a", 11)], (
        "b's whole prompt needs 2 blocks and 1 is free: allocate_slots must be called with "
        "full_sequence_must_fit=self.scheduler_reserve_full_isl, which refuses b, and c must "
        f"not overtake b; got {batch(out)}"
    )
    assert engine.waiting == ["b", "c"], (
        f"b was refused: it stays at the front of the waiting queue (peek it, pop it only once "
        f"it is admitted), c behind it; waiting is {engine.waiting}"
    )
    preempted = []
    while engine.unfinished():
        out, _ = engine.step()
        preempted += sorted(out.preempted_req_ids)
    assert preempted == [], (
        f"with the gate, b starts once a has finished and nobody is preempted; preempted "
        f"{preempted}"
    )
    engine.check_drained()


@graded(
    2,
    "The admission gate is for the waiting pass only: a running request in the middle of "
    "its prompt gets its next chunk when the chunk fits, whether or not the rest of its "
    "prompt does (allocate_slots without full_sequence_must_fit in the running pass)",
    f"{DOC}#the-admission-gate",
)
def test_the_gate_is_for_the_waiting_pass_only():
    """4 usable blocks, chunks of 4: a and b (12-token prompts, 3 blocks each) are both
    admitted in step 1 (the gate reserves nothing); in step 2 each next chunk needs 1 block."""
    engine = Engine(num_blocks=5, budget=8, max_model_len=32, long_prefill_token_threshold=4)
    engine.add("a", 12, base=0, max_tokens=4)
    engine.add("b", 12, base=50, max_tokens=4)
    out, _ = engine.step()
    assert batch(out) == [("a", 4), ("b", 4)], f"set-up: step 1 admits a and b, got {batch(out)}"
    out, _ = engine.step()
    assert batch(out) == [("a", 4), ("b", 4)] and not out.preempted_req_ids, (
        "step 2: a and b are running, each mid-prompt, and each next 4-token chunk needs 1 "
        "block; 2 are free, so both are scheduled and nobody is preempted. The rest of b's "
        "prompt (2 more blocks) does not fit, but the gate is for admissions from the waiting "
        "queue: the running pass calls allocate_slots(request, n) without "
        f"full_sequence_must_fit; got batch {batch(out)}, preempted "
        f"{sorted(out.preempted_req_ids)}"
    )
    engine.run()
    engine.check_drained()


@graded(
    2,
    "The admission gate applies to every request the waiting pass admits, a resumed "
    "(preempted) one too: it comes back only when its whole sequence, outputs included, "
    "fits, not on its first chunk",
    f"{DOC}#the-admission-gate",
)
def test_the_gate_holds_back_a_resumed_request():
    """Caching off, 4 usable blocks, chunks of 4: a and b (4-token prompts) decode until a
    needs a third block in step 6 and b, the last, is preempted with 9 tokens (3 blocks)."""
    engine = Engine(
        num_blocks=5,
        budget=16,
        max_model_len=32,
        caching=False,
        long_prefill_token_threshold=4,
    )
    engine.add("a", 4, base=0)
    engine.add("b", 4, base=50)
    for _ in range(5):
        engine.step()
    out, _ = engine.step()
    assert out.preempted_req_ids == {"b"} and engine.num_free() == 1, (
        f"set-up: step 6 preempts b and leaves 1 block free; preempted "
        f"{sorted(out.preempted_req_ids)}, {engine.num_free()} free"
    )
    out, _ = engine.step()
    assert batch(out) == [("a", 1)] and engine.waiting == ["b"], (
        "step 7: b (preempted, 4 prompt + 5 generated tokens = 9 tokens, 3 blocks) waits at "
        "the front; its first 4-token chunk would fit the 1 free block, but its whole "
        "sequence does not: the gate refuses it (full_sequence_must_fit=self."
        "scheduler_reserve_full_isl for every waiting request, new or resumed, as upstream), "
        f"so it is not readmitted only to be preempted again; got batch {batch(out)}, "
        f"waiting {engine.waiting}"
    )
    engine.run()
    engine.check_drained()


@graded(
    2,
    "Priority policy: waiting requests are admitted by (priority, arrival time), "
    "smallest first; under FCFS the priority is ignored",
    f"{DOC}#the-priority-policy",
)
def test_priority_orders_the_waiting_queue():
    """One request at a time (max_num_seqs 1); a:2, b:0, c:1, d:0 arrive in that order."""
    orders = {}
    for policy in ("priority", "fcfs"):
        engine = Engine(budget=16, max_num_seqs=1, policy=policy)
        for i, (rid, priority) in enumerate((("a", 2), ("b", 0), ("c", 1), ("d", 0))):
            engine.add(rid, 3, base=10 * i, max_tokens=2, priority=priority)
        engine.run()
        engine.check_drained()
        orders[policy] = engine.admission_order
    assert orders["priority"] == ["b", "d", "c", "a"], (
        f"under the priority policy the admission order is b, d (priority 0, by arrival), c, a; "
        f"got {orders['priority']}"
    )
    assert orders["fcfs"] == ["a", "b", "c", "d"], (
        f"under FCFS priorities are ignored: arrival order a, b, c, d; got {orders['fcfs']}"
    )


def _victim_scenario(policy: str) -> Engine:
    """a (priority 5) runs alone, then b (0) and c (1) join; the 4 usable blocks fill up."""
    engine = Engine(num_blocks=5, budget=32, policy=policy)
    engine.add("a", 3, base=0, priority=5)
    engine.step()
    engine.add("b", 3, base=50, priority=0)
    engine.add("c", 3, base=90, priority=1)
    engine.step()
    engine.step()
    return engine


@graded(
    3,
    "Priority policy: the request preempted for memory is the running one with the "
    "largest (priority, arrival time), even if it was already scheduled this step: its "
    "tokens leave the batch and return to the budget, and the requests after it are "
    "still served",
    f"{DOC}#the-priority-policy",
)
def test_priority_preempts_the_lowest_priority():
    """Step 3: a fits its block, then b needs one and none is free. Then, on budgets of 4 and 5,
    the victim's own tokens must come back to the budget."""
    fcfs = _victim_scenario("fcfs")
    out, _ = fcfs.step()
    assert out.preempted_req_ids == {"c"}, (
        "set-up: under FCFS c, the last admitted, is preempted; got "
        f"{sorted(out.preempted_req_ids)}"
    )
    engine = _victim_scenario("priority")
    out, _ = engine.step()
    assert out.preempted_req_ids == {"a"}, (
        "b needs a block: the victim is a (priority 5, the largest), not c (the last admitted, "
        f"priority 1); preempted {sorted(out.preempted_req_ids)}"
    )
    assert batch(out) == [("b", 1), ("c", 1)], (
        "a was scheduled before b asked for a block: preempting it removes it from this step's "
        "batch (its tokens back to the budget, its new blocks forgotten), and c, after b, must "
        f"still be scheduled (mind the index once a leaves running); got {batch(out)}"
    )
    assert engine.running == ["b", "c"] and engine.waiting == ["a"], (
        f"running {engine.running}, waiting {engine.waiting}"
    )
    engine.run()
    engine.check_drained()

    # Budget 4: a (priority 5) decodes, b (0) decodes, c (1) is mid-prefill. In step 4 a is
    # scheduled, b needs a block and a is its victim: a's token goes back to the budget.
    engine = Engine(num_blocks=5, budget=4, max_num_seqs=3, policy="priority")
    engine.add("a", 2, base=0, priority=5)
    engine.step()
    engine.add("b", 3, base=40, priority=0)
    engine.add("c", 5, base=80, priority=1)
    steps = [batch(engine.step()[0]) for _ in range(2)]
    assert steps == [[("a", 1), ("b", 3)], [("a", 1), ("b", 1), ("c", 2)]], (
        f"set-up: steps 2 and 3 are {steps}"
    )
    out, _ = engine.step()
    assert out.preempted_req_ids == {"a"} and batch(out) == [("b", 1), ("c", 3)], (
        "step 4: a (priority 5) is scheduled first, then b needs a block and none is free: a "
        "is preempted, and its token goes back to the budget (token_budget += its count), so "
        "c gets 4 - 1 = 3 tokens, the rest of its prompt; got batch "
        f"{batch(out)}, preempted {sorted(out.preempted_req_ids)}"
    )
    engine.run()
    engine.check_drained()

    # Budget 5, threshold 3: in step 3 a (priority 5) is scheduled with 1 token, then b (0)
    # needs a block for its 3-token chunk and a is its victim: the budget gets a's 1 token back.
    engine = Engine(
        num_blocks=5, budget=5, max_num_seqs=3, policy="priority", long_prefill_token_threshold=3
    )
    engine.add("a", 3, base=0, priority=5)
    engine.step()
    engine.add("b", 6, base=40, priority=0)
    engine.add("c", 4, base=80, priority=1)
    out, _ = engine.step()
    assert batch(out) == [("a", 1), ("b", 3), ("c", 1)], f"set-up: step 2 is {batch(out)}"
    out, _ = engine.step()
    assert out.preempted_req_ids == {"a"} and batch(out) == [("b", 3), ("c", 2)], (
        "step 3: a (1 token) is scheduled first, then b needs a block for its 3-token chunk and "
        "a is preempted: the budget gets back a's own 1 token (num_scheduled_tokens.pop(the "
        "victim's id)), not b's 3, so c gets 5 - 3 = 2; got batch "
        f"{batch(out)}, preempted {sorted(out.preempted_req_ids)}"
    )
    engine.run()
    engine.check_drained()

    # Equal priorities, admitted against their arrival order: x (arrival 9) reaches the
    # scheduler before y (arrival 0). In step 3 x needs a second block and none is free: the
    # largest (priority, arrival time) is x's own, so x preempts itself; y, the last admitted,
    # is not the victim.
    engine = x_and_y_fill_the_pool(x_arrival=9.0, policy="priority")
    out, _ = engine.step()
    assert out.preempted_req_ids == {"x"} and batch(out) == [], (
        "step 3: x needs a block and none is free; x and y have the same priority, and x "
        "arrived later (time 9 against 0), so x is the victim, itself: the key is (priority, "
        "arrival_time), not the order of running; got batch "
        f"{batch(out)}, preempted {sorted(out.preempted_req_ids)}"
    )
    engine.run()
    engine.check_drained()

    # A full tie (same priority, same arrival time: a caller may give a batch one time): max
    # returns the first of the largest keys, so the victim is x, the tied request admitted
    # first, itself; sorted(...)[-1] would take y.
    engine = x_and_y_fill_the_pool(x_arrival=0.0, policy="priority")
    out, _ = engine.step()
    assert out.preempted_req_ids == {"x"} and batch(out) == [], (
        "step 3: x needs a block and none is free; x and y tie on (priority, arrival_time) = "
        "(0, 0.0), and the victim is the first of them in running, x, as "
        "max(self.running, key=...) returns the first largest key (not the last, as "
        f"sorted(...)[-1] would); got batch {batch(out)}, preempted "
        f"{sorted(out.preempted_req_ids)}"
    )
    engine.run()
    engine.check_drained()


def _a_b_c_fill_the_pool(c_prompt: int = 4, **options: Any) -> Engine:
    """Priority policy, 4 usable blocks: a (priority 5, admitted first), b (0) and c (1, a prompt
    of ``c_prompt`` tokens) hold them all after 4 steps, and a's next token needs a fifth block.
    ``options`` go to the scheduler."""
    engine = Engine(num_blocks=5, budget=4, max_num_seqs=3, policy="priority", **options)
    engine.add("a", 1, base=0, priority=5)
    engine.step()
    engine.add("b", 1, base=40, priority=0)
    engine.add("c", c_prompt, base=80, priority=1)
    for _ in range(3):
        engine.step()
    assert engine.running == ["a", "b", "c"] and engine.num_free() == 0, (
        f"set-up: a, b, c run and hold the 4 usable blocks; running {engine.running}, "
        f"{engine.num_free()} free"
    )
    return engine


@graded(
    1,
    "Priority policy: a request whose victim is itself (it has the largest (priority, "
    "arrival time) of the running requests) is not scheduled, and the running pass stops "
    "there, as under FCFS, although the requests after it might fit",
    f"{DOC}#the-priority-policy",
)
def test_priority_a_request_that_preempts_itself_stops_the_loop():
    """4 usable blocks: a (priority 5, admitted first), b (0) and c (1) fill them; in step 5 a
    needs a fifth block."""
    engine = _a_b_c_fill_the_pool()
    out, _ = engine.step()
    assert out.preempted_req_ids == {"a"} and batch(out) == [], (
        "step 5: a needs a block and none is free; its victim is a itself (priority 5): it is "
        "preempted, and the running pass stops there (break, not continue): b and c are not "
        f"scheduled this step; got batch {batch(out)}, preempted {sorted(out.preempted_req_ids)}"
    )
    engine.run()
    engine.check_drained()


@graded(
    1,
    "Advancing the computed-token count touches only the requests this step scheduled: a "
    "running request the pass left out keeps num_computed_tokens and is_prefill_chunk, so a "
    "token the runner hands back for it is ignored if it is decoding, and still a runner "
    "error (ValueError) if it is mid-prefill",
    f"{DOC}#advancing-the-computed-token-count",
)
def test_requests_left_out_of_the_step_keep_their_progress():
    """The scenario above: in step 5 a preempts itself, and b and c (decoding) are left out."""
    engine = _a_b_c_fill_the_pool()
    before = {rid: engine.info(rid)["num_computed_tokens"] for rid in "bc"}
    out = engine.schedule()
    assert out.preempted_req_ids == {"a"} and batch(out) == [], (
        f"set-up: in step 5 a preempts itself and nobody is scheduled; got batch {batch(out)}, "
        f"preempted {sorted(out.preempted_req_ids)}"
    )
    for rid in "bc":
        info = engine.info(rid)
        assert (info["num_computed_tokens"], info["is_prefill_chunk"]) == (before[rid], False), (
            f"{rid} decodes and was not scheduled in step 5, so _update_after_schedule must not "
            f"touch it: num_computed_tokens {before[rid]} and is_prefill_chunk False; got "
            f"{info['num_computed_tokens']} and {info['is_prefill_chunk']!r} (walk the "
            f"step's num_scheduled_tokens, not self.running)"
        )
    results = engine.update({"b": [7]})
    assert results == [], (
        f"b was not scheduled in step 5: the runner's token for it is ignored; got {results}"
    )
    out = engine.schedule()
    cached = out.scheduled_cached_reqs
    assert {"b", "c"} <= set(cached.req_ids), f"set-up: step 6 runs b and c, got {batch(out)}"
    stale = sorted(rid for rid in cached.req_ids if rid not in cached.all_token_ids)
    assert not stale, (
        f"step 5 scheduled nobody, so in step 6 the runner's token lists of {stale} are stale: "
        f"scheduled_cached_reqs.all_token_ids must carry their whole lists "
        f"(prev_step_scheduled_req_ids is the ids step 5 scheduled, set after building the "
        f"cached requests' data); it carries {sorted(cached.all_token_ids)}"
    )
    engine.update(engine.execute(out))
    engine.run()
    engine.check_drained()
    # The same, with c still in the middle of its prompt when step 5 leaves it out.
    engine = _a_b_c_fill_the_pool(14, scheduler_reserve_full_isl=False)
    out = engine.schedule()
    assert batch(out) == [] and engine.info("c")["is_prefill_chunk"] is True, (
        f"set-up: in step 5 a preempts itself and c, mid-prefill, is left out; got batch "
        f"{batch(out)}, c's is_prefill_chunk {engine.info('c')['is_prefill_chunk']!r}"
    )
    engine.update({"c": [7]}, raises=ValueError)
    assert engine.info("c")["output_token_ids"] == [], (
        "c is in the middle of its prompt: a token the runner hands back for it is a runner "
        "bug (ValueError) even in a step that did not schedule it, and nothing is applied"
    )
    # Nor does the refusal leave a change for later: the step's real update, a step, and the
    # abort of everyone, each state compared with the reference scheduler's (without the gate,
    # this pool cannot finish a and c both: stop here).
    engine.update(engine.execute(out))
    engine.step()
    engine.abort(None)
    engine.check_drained()


@graded(
    1,
    "Priority policy: a preempted request goes back into the heap by its priority, not "
    "to the front of the queue",
    f"{DOC}#the-priority-policy",
)
def test_priority_requeues_by_priority():
    """After a's preemption, d (priority 9) and e (priority 0) arrive."""
    engine = _victim_scenario("priority")
    engine.step()
    engine.add("d", 3, base=120, priority=9)
    engine.add("e", 3, base=150, priority=0)
    engine.refresh()
    assert engine.waiting == ["e", "a", "d"], (
        f"the waiting heap in order is e (0), a (5), d (9); iterated, it gives {engine.waiting}"
    )


@st.composite
def priority_workloads(draw):
    specs = [
        (
            draw(st.integers(0, 3)),
            draw(st.integers(1, 14)),
            draw(st.integers(1, 8)),
            draw(st.integers(-2, 3)),
        )
        for _ in range(draw(st.integers(2, 7)))
    ]
    return (
        draw(st.integers(7, 10)),
        draw(st.integers(4, 16)),
        draw(st.booleans()),
        draw(st.booleans()),
        sorted(specs, key=lambda s: s[0]),
    )


@RANDOM_SETTINGS
@given(priority_workloads())
def _random_priority_workloads(case) -> None:
    num_blocks, budget, caching, gate, specs = case
    engine = Engine(
        num_blocks=num_blocks,
        budget=budget,
        max_num_seqs=3,
        max_model_len=24,
        caching=caching,
        reference=True,
        policy="priority",
        scheduler_reserve_full_isl=gate,
    )
    step = 0
    for i, (arrival, prompt_len, max_tokens, priority) in enumerate(specs):
        while step < arrival and engine.unfinished():
            engine.step()
            step += 1
        # Ids sort against their arrival order (r9 arrives first): ties go by arrival time.
        engine.add(f"r{9 - i}", prompt_len, base=3 * i, max_tokens=max_tokens, priority=priority)
    engine.run()
    engine.check_drained()


@graded(
    3,
    "Priority policy on random workloads (arrivals, priorities, tiny pools, the gate on "
    "or off): every step's batch, preemptions, queues and block tables equal the "
    "reference's, and every request finishes with the model's tokens",
    f"{DOC}#the-priority-policy",
    timeout=30,
)
def test_priority_random_workloads():
    """Hypothesis prints the smallest failing workload: (blocks, budget, caching, gate,
    [(arrival step, prompt length, max_tokens, priority), ...])."""
    with bounded_shrinking():
        _random_priority_workloads()
