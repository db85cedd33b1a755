"""lab-08, part 2: one step's batch — order, budget, max_num_seqs, chunks, threshold, hits."""

from __future__ import annotations

from grading.suite import graded, learner_module
from tests.labs.common import (
    assert_cost_does_not_grow,
    best_time,
    same_data,
    timed_call,
)
from tests.labs.lab_08.helpers import BS, DOC, Engine, batch, model_token


@graded(
    3,
    "Running first, then waiting FCFS: running requests are served before any waiting "
    "request is admitted, all from the same budget; waiting ones in the order add_request "
    "was called, whatever their arrival_time",
    f"{DOC}#running-first-then-waiting",
)
def test_running_first_then_waiting():
    """Three 10-token prompts, budget 16."""
    engine = Engine(budget=16)
    for i, rid in enumerate("abc"):
        engine.add(rid, 10, base=100 * i)
    out, _ = engine.step()
    assert batch(out) == [("a", 10), ("b", 6)], (
        f"step 1: a's whole prompt (10), then a 6-token chunk of b, c waits; got {batch(out)}"
    )
    assert engine.running == ["a", "b"] and engine.waiting == ["c"], (
        f"running {engine.running}, waiting {engine.waiting}"
    )
    out, _ = engine.step()
    assert batch(out) == [("a", 1), ("b", 4), ("c", 10)], (
        f"step 2: running first (a decodes 1, b finishes its prompt with 4), then c is admitted "
        f"with the 11 tokens left (needs 10); got {batch(out)}"
    )
    assert [new.req_id for new in out.scheduled_new_reqs] == ["c"]
    assert out.scheduled_cached_reqs.req_ids == ["a", "b"]
    # Again with arrival times against the order of add_request (a caller may pass its own):
    # FCFS is the queue's order; only the priority policy reads arrival_time.
    engine = Engine(budget=16)
    for i, rid in enumerate("abc"):
        engine.add(rid, 10, base=100 * i, arrival=float(2 - i))
    out, _ = engine.step()
    assert batch(out) == [("a", 10), ("b", 6)] and engine.waiting == ["c"], (
        f"a, b, c added in that order with arrival times 2, 1, 0: under FCFS the waiting queue "
        f"keeps the order of add_request (peek_request, pop_request), it is never sorted by "
        f"arrival_time; expected batch [('a', 10), ('b', 6)] and c waiting, got {batch(out)}, "
        f"waiting {engine.waiting}"
    )


@graded(
    3,
    "One token budget: every token scheduled, for running and waiting requests alike, "
    "is taken from the same max_num_batched_tokens",
    f"{DOC}#one-token-budget-no-phases",
)
def test_one_budget_for_everyone():
    """Budget 8: a decode and a prompt chunk share it."""
    engine = Engine(budget=8)
    engine.add("a", 6, base=0)
    engine.add("b", 20, base=100)
    engine.add("c", 3, base=200)
    out, _ = engine.step()
    assert batch(out) == [("a", 6), ("b", 2)], f"step 1: a 6, b a 2-token chunk; got {batch(out)}"
    out, _ = engine.step()
    assert batch(out) == [("a", 1), ("b", 7)], (
        f"step 2: a decodes (1), b gets the 7 tokens left of the budget, c gets nothing; got "
        f"{batch(out)}"
    )
    for _ in range(6):
        engine.step()  # the engine checks the budget every step


@graded(
    2,
    "max_num_seqs: no more than max_num_seqs requests run at once; the rest wait",
    f"{DOC}#running-first-then-waiting",
)
def test_max_num_seqs():
    """Room for 3 short prompts, but max_num_seqs is 2."""
    engine = Engine(budget=32, max_num_seqs=2)
    for i, rid in enumerate("abc"):
        engine.add(rid, 2, base=10 * i)
    out, _ = engine.step()
    assert batch(out) == [("a", 2), ("b", 2)], f"only 2 may run: got {batch(out)}"
    assert engine.running == ["a", "b"] and engine.waiting == ["c"]
    out, _ = engine.step()
    assert "c" not in out.num_scheduled_tokens, f"c must wait: got {batch(out)}"
    # A preempted request counts like any other: under the priority policy n and m (priority
    # 0) pass preempted a and b (priority 5) in the queue and fill both places.
    engine = Engine(budget=32, max_num_seqs=2, policy="priority")
    engine.add("a", 2, base=0, priority=5)
    engine.add("b", 2, base=10, priority=5)
    engine.step()
    engine.reset_prefix_cache(reset_running_requests=True)
    engine.add("n", 2, base=20)
    engine.add("m", 2, base=30)
    out, _ = engine.step()
    assert batch(out) == [("n", 2), ("m", 2)] and engine.running == ["n", "m"], (
        "n and m (priority 0) are admitted first, and then 2 requests run: preempted a and b "
        "wait too, whatever their status (the waiting pass stops at len(running) == "
        f"max_num_seqs); got batch {batch(out)}, running {engine.running}"
    )
    engine.run()
    engine.check_drained()
    _max_num_seqs_is_checked_before_allocating()


def _max_num_seqs_is_checked_before_allocating() -> None:
    """The waiting pass stops at ``len(running) == max_num_seqs`` before it asks the KV cache
    manager for anything. A scheduler that allocates for the request at the front and only then
    finds no place for it (freeing the blocks again) publishes blocks whose KV was never
    computed, and takes fresh blocks from the front of the free queue every step, evicting the
    cached prefix of a finished request. Here a (8 tokens) finishes, b runs alone
    (max_num_seqs 1) while c (16 tokens) waits, then d repeats a's prompt: c must compute its
    whole prompt, and d must find a's two blocks still cached."""
    why = (
        "While c waited for a place (max_num_seqs 1), did your waiting pass give it blocks and "
        "free them again? That publishes c's blocks as computed (a later hit reads KV nobody "
        "wrote) and evicts other requests' cached blocks. Check len(running) < max_num_seqs "
        "before get_computed_blocks and allocate_slots, as the README's shape of schedule() "
        "does (the while condition)"
    )
    engine = Engine(num_blocks=10, budget=32, max_num_seqs=1)
    engine.add("a", 8, base=100, max_tokens=1)
    engine.add("b", 4, base=200, max_tokens=2)
    engine.add("c", 16, base=300, max_tokens=1)
    engine.add("d", prompt=[100 + i for i in range(8)] + [7], max_tokens=1)
    try:
        for _ in range(4):  # a, b (two steps), then c; each waits behind max_num_seqs
            out, _ = engine.step()
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{why}") from None
    assert batch(out) == [("c", 16)], (
        f"c has no cached prefix: all 16 tokens; got {batch(out)}.\n{why}"
    )
    out, _ = engine.step()
    assert batch(out) == [("d", 1)], (
        "d repeats a's 8-token prompt and must find both of a's blocks still cached (a 1-token "
        f"step); got {batch(out)}.\n{why}"
    )
    engine.run()
    engine.check_drained()


@graded(
    3,
    "Chunked prefill: a prompt larger than the budget is split into chunks, each step "
    "resuming where the last chunk ended; a token is sampled only after the last chunk",
    f"{DOC}#chunked-prefill",
)
def test_chunked_prefill_resumes():
    """Budget 6, a 15-token prompt: chunks of 6, 6, 3."""
    engine = Engine(budget=6)
    engine.add("a", 15, max_tokens=2)
    chunks = [engine.step()[0].num_scheduled_tokens.get("a") for _ in range(3)]
    assert chunks == [6, 6, 3], f"expected chunks [6, 6, 3], got {chunks}"
    assert engine.info("a")["output_token_ids"] == [model_token("a", 15)], (
        "exactly one token, sampled after the last chunk"
    )
    engine.run()
    assert engine.outputs["a"] == [model_token("a", 15), model_token("a", 16)]


@graded(
    2,
    "Advancing the computed-token count: the output carries num_computed_tokens as it was "
    "when scheduled; schedule() then advances it, so the next step continues at once",
    f"{DOC}#advancing-the-computed-token-count",
)
def test_num_computed_tokens_advances_after_the_output_is_built():
    """The runner must start at position 0; the request is already at 8 when schedule() returns."""
    engine = Engine(budget=8)
    engine.add("a", 10)
    out = engine.schedule()
    assert out.scheduled_new_reqs[0].num_computed_tokens == 0, (
        "NewRequestData must carry the count before this step (the runner starts there)"
    )
    info = engine.info("a")
    assert info["num_computed_tokens"] == 8 and info["is_prefill_chunk"] is True, (
        f"after schedule() a's 8 scheduled tokens count as computed and it is mid-prefill "
        f"(is_prefill_chunk); got num_computed_tokens={info['num_computed_tokens']}, "
        f"is_prefill_chunk={info['is_prefill_chunk']!r}"
    )
    engine.update({})
    out = engine.schedule()
    assert out.scheduled_cached_reqs.num_computed_tokens == [8]
    assert out.num_scheduled_tokens == {"a": 2}, f"got {batch(out)}"
    info = engine.info("a")
    assert info["num_computed_tokens"] == 10 and info["is_prefill_chunk"] is False, info


@graded(
    1,
    "The output resends a request's whole token list (scheduled_cached_reqs.all_token_ids) "
    "only where the runner's copy may be stale: a resumed request, or one the previous step "
    "did not schedule; schedule() records the ids it scheduled (prev_step_scheduled_req_ids)",
    f"{DOC}#running-first-then-waiting",
)
def test_whole_token_lists_only_where_the_runner_may_be_stale():
    """4 usable blocks: a and b (8 tokens each) fill them, b is preempted in step 2 and
    resumed once a finishes; before that, a runs on step after step."""
    engine = Engine(num_blocks=5, budget=16, max_model_len=32)
    engine.add("a", 8, base=0, max_tokens=3)
    engine.add("b", 8, base=50, max_tokens=3)
    engine.step()
    resumed_at = None
    for step in range(2, 12):
        out = engine.schedule()
        cached = out.scheduled_cached_reqs
        sent = sorted(cached.all_token_ids)
        expected = sorted(cached.resumed_req_ids)
        assert sent == expected, (
            f"step {step}: all_token_ids is sent for {sent}; expected {expected} (resumed "
            f"requests; every other cached request ran in step {step - 1}, so the runner's "
            f"token list is current): record the ids each step schedules in "
            f"self.prev_step_scheduled_req_ids"
        )
        if "b" in cached.resumed_req_ids:
            resumed_at = step
            want = engine.info("b")["num_tokens"]
            assert len(cached.all_token_ids["b"]) == want, (
                f"step {step}: resumed b is sent {len(cached.all_token_ids['b'])} tokens, not "
                f"all {want} of its tokens"
            )
        engine.update(engine.execute(out))
        if not engine.unfinished():
            break
    assert resumed_at is not None, "set-up: b is preempted in step 2 and resumed later"
    engine.check_drained()


@graded(
    2,
    "Running pass: a running request with nothing to compute (num_tokens - "
    "num_computed_tokens is 0: its last token is still being sampled, when schedule() runs "
    "again before update_from_output) is skipped, and the running requests after it are "
    "still served; it is still running, so it still counts toward max_num_seqs",
    f"{DOC}#stopping-while-preempted",
)
def test_a_request_with_nothing_to_compute_is_skipped():
    """Threshold 4: a decodes, b runs a 12-token prompt in chunks; step 3 is planned while
    step 2 runs, so a's token from step 2 is not in yet. Then, with max_num_seqs 1, a step
    planned while a's token is in flight admits nobody."""
    engine = Engine(budget=16, long_prefill_token_threshold=4)
    engine.add("a", 2, base=0)
    engine.add("b", 12, base=50)
    out, _ = engine.step()
    assert batch(out) == [("a", 2), ("b", 4)], f"set-up: step 1 is {batch(out)}"
    out2 = engine.schedule()
    assert batch(out2) == [("a", 1), ("b", 4)], f"set-up: step 2 is {batch(out2)}"
    sampled2 = engine.execute(out2)
    out3 = engine.schedule(ahead=True)  # step 2 is still running
    assert batch(out3) == [("b", 4)], (
        "step 3 is planned before step 2's token for a is in: a has nothing to compute (skip "
        "it, do not stop the running pass there) and b gets its next 4-token chunk; got "
        f"{batch(out3)}"
    )
    engine.update(sampled2)
    engine.update(engine.execute(out3))
    engine.run()
    engine.check_drained()

    engine = Engine(budget=16, max_num_seqs=1)
    engine.add("a", 2, base=0, max_tokens=3)
    engine.add("b", 2, base=50, max_tokens=2)
    out1 = engine.schedule()
    assert batch(out1) == [("a", 2)], f"set-up: max_num_seqs 1, step 1 is {batch(out1)}"
    sampled1 = engine.execute(out1)
    out2 = engine.schedule(ahead=True)  # step 1 is still running
    assert batch(out2) == [] and engine.running == ["a"] and engine.waiting == ["b"], (
        "max_num_seqs 1: a is running, although not in this step's batch (its token from step 1 "
        "is still in flight), so b may not be admitted: max_num_seqs counts the running "
        f"requests (len(self.running)), not the batch; got batch {batch(out2)}, running "
        f"{engine.running}, waiting {engine.waiting}"
    )
    engine.update(sampled1)
    engine.update(engine.execute(out2))
    engine.run()
    engine.check_drained()


@graded(
    2,
    "Chunked prefill disabled: a prompt that does not fit the budget left waits whole, "
    "and (FCFS) nobody behind it is admitted; the rule is the waiting pass's: a running "
    "request is still given what is left of the budget",
    f"{DOC}#chunked-prefill",
)
def test_without_chunked_prefill():
    """Budget 64: a 40 then b 30 (does not fit the 24 left), c 5 must not overtake b; next
    step d's 28 tokens fill exactly the 28 left. Then, with a threshold, a step planned while
    the last one runs admits a prompt that the step after cannot give its whole share."""
    engine = Engine(40, budget=64, max_model_len=64, enable_chunked_prefill=False)
    engine.add("a", 40, base=0)
    engine.add("b", 30, base=100)
    engine.add("c", 5, base=200)
    engine.add("d", 28, base=300)
    out, _ = engine.step()
    assert batch(out) == [("a", 40)], (
        f"b does not fit whole and c must not overtake it: {batch(out)}"
    )
    out, _ = engine.step()
    assert batch(out) == [("a", 1), ("b", 30), ("c", 5), ("d", 28)], (
        f"step 2: a decodes (1), b (30) and c (5) fit, and d's 28 tokens fit the 28 left "
        f"exactly (a prompt that fits the budget left whole is admitted); got {batch(out)}"
    )
    # With a threshold too: n is capped first, and only the capped n must fit the budget.
    engine = Engine(
        budget=16, max_model_len=16, enable_chunked_prefill=False, long_prefill_token_threshold=5
    )
    engine.add("a", 12, base=0)
    engine.add("b", 12, base=20)
    engine.add("c", 3, base=40)
    out, _ = engine.step()
    assert batch(out) == [("a", 5), ("b", 5), ("c", 3)], (
        f"chunked prefill off, threshold 5, budget 16: a's and b's 12 tokens are capped to 5 "
        f"first (n = num_tokens - num_hit, capped by the threshold), and 5 fits the budget "
        f"left, then c's 3: expected [a 5, b 5, c 3], got {batch(out)} (check n against the "
        f"budget after the threshold cap, not before)"
    )
    # Threshold 3, budget 15: step 1 runs a (1 token), b..e (3 each); f's 3 do not fit the 2 left.
    engine = Engine(
        30,
        budget=15,
        max_num_seqs=6,
        max_model_len=15,
        caching=False,
        enable_chunked_prefill=False,
        long_prefill_token_threshold=3,
    )
    engine.add("a", 1, base=0, max_tokens=10)
    for i, rid in enumerate("bcdef"):
        engine.add(rid, 14, base=20 * (i + 1), max_tokens=2)
    engine.step()
    out2 = engine.schedule()
    sampled2 = engine.execute(out2)
    out3 = engine.schedule(ahead=True)  # step 2 is still running: a has nothing to compute
    assert batch(out3) == [(r, 3) for r in "bcdef"], (
        f"set-up: step 3, planned while step 2 runs, skips a and admits f; got {batch(out3)}"
    )
    engine.update(sampled2)
    engine.update(engine.execute(out3))
    out, _ = engine.step()
    assert batch(out) == [("a", 1)] + [(r, 3) for r in "bcde"] + [("f", 2)], (
        "step 4: a decodes again (1), b..e take 3 each, and f, admitted in step 3 (where a took "
        "nothing), gets the 2 tokens left: with chunked prefill off, only a WAITING request "
        "must fit whole (the check belongs to the waiting pass); a running request is capped "
        f"by the budget left like any other, not skipped; got {batch(out)}"
    )
    engine.run()
    engine.check_drained()
    # A resumed request must fit whole too, its outputs with its prompt: b (3 + 4 tokens) and
    # a (6 + 4) are preempted after four steps; b takes 7 of the 16, and a's 10 do not fit the
    # 9 left, although its 6-token prompt would.
    engine = Engine(budget=16, max_model_len=16, enable_chunked_prefill=False)
    engine.add("b", 3, base=0, max_tokens=8)
    engine.add("a", 6, base=20, max_tokens=9)
    for _ in range(4):
        engine.step()
    engine.reset_prefix_cache(reset_running_requests=True)
    assert engine.waiting == ["b", "a"], f"set-up: b and a wait again, got {engine.waiting}"
    out, _ = engine.step()
    assert batch(out) == [("b", 7)], (
        "chunked prefill off: resumed b recomputes its 7 tokens, and a's 10 (6 of prompt, 4 "
        "outputs: n = num_tokens - num_hit) do not fit the 9 left, so a waits whole, although "
        f"its prompt alone would fit; got {batch(out)}"
    )
    engine.run()
    engine.check_drained()


@graded(
    3,
    "long_prefill_token_threshold caps the tokens any one request gets in a step, for "
    "running and waiting requests alike",
    f"{DOC}#the-long-prefill-threshold",
)
def test_long_prefill_token_threshold():
    """Threshold 4: a 10-token prompt goes 4, 4, 2 while b decodes beside it. Threshold 1:
    a 3-token prompt goes 1, 1, 1 (only 0 turns the cap off)."""
    engine = Engine(budget=16, long_prefill_token_threshold=4)
    engine.add("a", 10)
    engine.add("b", 3, base=50)
    steps = [batch(engine.step()[0]) for _ in range(3)]
    assert steps == [[("a", 4), ("b", 3)], [("a", 4), ("b", 1)], [("a", 2), ("b", 1)]], (
        f"expected a: 4, 4, 2 (threshold 4) and b: 3 then decodes; got {steps}"
    )
    engine = Engine(budget=16, long_prefill_token_threshold=1)
    engine.add("a", 3)
    steps = [batch(engine.step()[0]) for _ in range(3)]
    assert steps == [[("a", 1)], [("a", 1)], [("a", 1)]], (
        f"threshold 1 is a cap like any other (0 alone means off): a's 3-token prompt goes 1, "
        f"1, 1, in the running pass as in the waiting pass (test 0 < threshold < n); got {steps}"
    )


@graded(
    2,
    "Prefix hits: an admitted request skips its cached prefix (get_computed_blocks), "
    "schedules only the rest (with chunked prefill off, the rest is what must fit the "
    "budget left), and the runner is told where it starts",
    f"{DOC}#running-first-then-waiting",
)
def test_prefix_hit_skips_cached_tokens():
    """b shares a's first 8 tokens: it is admitted with 8 computed and schedules 2. Without
    chunked prefill, e's 60-token prompt has 32 cached: its 28 others fit the 33 left."""
    engine = Engine(budget=32)
    engine.add("a", 9)
    engine.step()
    engine.add("b", 10)
    out, _ = engine.step()
    assert batch(out) == [("a", 1), ("b", 2)], (
        f"b's first two blocks are cached: it needs only 2 tokens; got {batch(out)}"
    )
    new_b = out.scheduled_new_reqs[0]
    assert new_b.num_computed_tokens == 8, (
        f"NewRequestData.num_computed_tokens must be the hit (8), got {new_b.num_computed_tokens}"
    )
    assert new_b.block_ids[0][:2] == engine.table("a")[:2], (
        f"b's table must start with a's two cached blocks {engine.table('a')[:2]}, got "
        f"{new_b.block_ids[0]}"
    )
    engine.run()
    engine.check_drained()

    engine = Engine(40, budget=64, max_model_len=64, enable_chunked_prefill=False)
    engine.add("a", 40, base=0, max_tokens=3)
    engine.step()
    engine.add("d", 30, base=100, max_tokens=2)
    engine.add("e", prompt=[*range(32), *range(200, 228)], max_tokens=2)
    out, _ = engine.step()
    assert batch(out) == [("a", 1), ("d", 30), ("e", 28)], (
        "chunked prefill off, budget 64: a decodes (1), d's 30 tokens fit, and e's prompt of "
        "60 tokens starts with a's 32 cached ones: only its 28 others are computed, and they "
        "fit the 33 left, so e is admitted (compare the tokens left to compute, not the whole "
        f"prompt, with the budget); got {batch(out)}"
    )
    engine.run()
    engine.check_drained()


@graded(
    2,
    "finished_req_ids: each output gets the set of requests finished since the previous "
    "one, and the scheduler starts a new set afterwards (self.finished_req_ids = set(), "
    "not .clear(), which would empty the set the output just took)",
    f"{DOC}#advancing-the-computed-token-count",
)
def test_each_output_keeps_its_finished_ids():
    """a finishes after one token; the next output must list it, now and later."""
    side = learner_module("learner_side")
    sched = side.make_scheduler(20, BS, 64, 16, 4)
    sched.add_request(side.make_request("a", [1, 2, 3], BS, max_tokens=1))
    first = sched.schedule()
    sched.update_from_output(first, {"a": [7]})
    second = sched.schedule()
    got = set(second.finished_req_ids)
    assert got == {"a"}, (
        f"a finished with its only token: the next output's finished_req_ids must be {{'a'}}, "
        f"got {got}. If it is empty, _update_after_schedule emptied the set the output holds: "
        "give self.finished_req_ids a new set instead of clearing it"
    )
    third = sched.schedule()
    got = set(second.finished_req_ids)
    assert got == {"a"}, (
        f"after one more schedule(), the previous output's finished_req_ids became {got}: the "
        "runner may read an output after the next one is planned (async scheduling), so each "
        "output keeps its own set"
    )
    got = set(third.finished_req_ids)
    assert got == set(), (
        f"a was reported finished once, in the second output: the third output's "
        f"finished_req_ids must be empty, got {got} (start a new set after each schedule())"
    )


@graded(
    2,
    "Cost: a step's work grows with the requests it schedules, not with the waiting queue",
    "labs/lab-08-scheduler/README.md#your-tasks",
    timeout=30,
)
def test_a_step_costs_what_it_schedules():
    """40 decode steps of the same four running requests cost about the same with 500 and with
    50,000 requests waiting behind them (max_num_seqs is reached: the waiting pass stops at
    once), and stay under a ceiling measured in the judge (CPU time of plain relinks)."""
    side = learner_module("learner_side")
    steps, times = 40, {}
    for waiting in (500, 50_000):
        sched = side.crowded_scheduler(waiting)

        def one_run(sched=sched, waiting=waiting) -> float:
            seconds, got = timed_call(side.decode_steps, sched, steps)
            assert same_data(got, [["r0", "r1", "r2", "r3"]] * steps), (
                f"with r0..r3 running, max_num_seqs 4 and {waiting:,} requests waiting, each "
                f"decode step must schedule r0..r3 alone: got {str(got)[:200]}"
            )
            return seconds

        times[waiting] = best_time(one_run)
    t_small, t_big = times[500], times[50_000]
    assert_cost_does_not_grow(
        t_small,
        t_big,
        lambda ratio, ceiling: (
            f"{steps} decode steps of 4 running requests took {t_big * 1e3:.1f} ms with 50,000 "
            f"requests waiting vs {t_small * 1e3:.1f} ms with 500 ({ratio:.0f}x; at most 12x, and "
            f"{ceiling * 1e3:.0f} ms on this machine): a step must walk the requests it schedules "
            "(num_scheduled_tokens), not every request the scheduler knows, and the waiting pass "
            "stops at the first request it cannot admit (README, after the task table)"
        ),
    )
