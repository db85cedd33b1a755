"""lab-02, part 2: the simulation loop, checked step by step on small traces.

The hand-made traces read the learner's objects through proxies (a few requests each); the
property tests run a whole simulation with one request (``learner_side.simulate``) and check
the plain data it returns, here in the judge.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from grading.suite import graded, learner_module, load_impl
from tests.labs.lab_02.oracle import (
    RANDOM_SETTINGS,
    bounded_shrinking,
    first_step_difference,
    reference_simulate,
)
from tests.labs.lab_02.worked_example import (
    BLOCK_SIZE,
    CAPACITY,
    CONTIGUOUS_STEPS,
    DOC,
    MAX_MODEL_LEN,
    PAGED_STEPS,
    TRACE,
    make_trace,
    step_row,
    steps_of,
)


def frag():
    return load_impl("fragmentation")


def run(mod, rows, allocator, max_model_len=MAX_MODEL_LEN):
    return mod.simulate(make_trace(mod, rows), allocator, max_model_len)


def compare_steps(sim, expected) -> None:
    steps = steps_of(sim)
    got = [step_row(s) for s in steps]
    assert [s.step for s in steps] == list(range(len(steps))), (
        "steps are numbered 0, 1, ... with none skipped"
    )
    for i, (g, e) in enumerate(zip(got, expected)):
        assert g == e, (
            f"step {i}: (running, used, reserved, internal, free, largest free range, blocked) "
            f"is {g}, expected {e}"
        )
    assert len(got) == len(expected), (
        f"the simulation ran {len(got)} steps, expected {len(expected)} (it ends with the step "
        "in which the last request finishes)"
    )


def expect_runs(sim, admitted: dict, finished: dict, preemptions: int | None = None) -> None:
    """The step each request was admitted and finished in, and the number of preemptions."""
    assert sim.admitted == admitted, (
        f"the step each request is admitted in: expected {admitted}, got {sim.admitted}"
    )
    assert sim.finished == finished, (
        f"the step each request finishes in: expected {finished}, got {sim.finished}"
    )
    if preemptions is not None:
        assert sim.num_preemptions == preemptions, (
            f"num_preemptions: expected {preemptions}, got {sim.num_preemptions}"
        )


@graded(
    4,
    "Simulation (contiguous): each request reserves max_len at admission; finished "
    "requests free their range for the NEXT step; D waits while 16 slots are free in two "
    "holes of 8",
    f"{DOC}#worked-example",
)
def test_worked_example_contiguous():
    """The README's worked example, step by step, on the contiguous allocator."""
    mod = frag()
    sim = run(mod, TRACE, mod.ContiguousAllocator(CAPACITY))
    compare_steps(sim, CONTIGUOUS_STEPS)
    expect_runs(sim, {"A": 0, "B": 0, "C": 0, "D": 4}, {"A": 1, "C": 1, "B": 3, "D": 6}, 0)


@graded(
    4,
    "Simulation (paged): requests hold whole blocks for the tokens they have; D is "
    "admitted at step 1 because any free block serves any request",
    f"{DOC}#worked-example",
)
def test_worked_example_paged():
    """The README's worked example, step by step, on the paged allocator."""
    mod = frag()
    sim = run(mod, TRACE, mod.PagedAllocator(CAPACITY, BLOCK_SIZE))
    compare_steps(sim, PAGED_STEPS)
    expect_runs(sim, {"A": 0, "B": 0, "C": 0, "D": 1}, {"A": 1, "C": 1, "B": 3, "D": 3}, 0)


@graded(
    2,
    "Admission is first come, first served: when the request at the head of the queue "
    "does not fit, no later request is admitted in its place",
    f"{DOC}#task-4-the-simulation-loop",
)
def test_fcfs_head_of_line_blocking():
    """C would fit, but B arrived first and does not: C waits behind B."""
    mod = frag()
    rows = (("A", 0, 2, 3, 8), ("B", 0, 2, 2, 12), ("C", 0, 1, 1, 4))
    sim = run(mod, rows, mod.ContiguousAllocator(16))
    assert sim.admitted == {"A": 0, "B": 3, "C": 3}, (
        f"B must wait for A to finish (step 2) and C must wait behind B: admitted {sim.admitted}"
    )
    waiting = [s.waiting for s in steps_of(sim)[:3]]
    assert waiting == [2, 2, 2], f"B and C wait during steps 0-2: waiting per step {waiting}"
    assert steps_of(sim)[0].blocked is None, "8 slots free < the 12 B reserves: not fragmentation"


@graded(
    1,
    "blocked: the request at the head of the queue refused although free_tokens >= "
    "tokens_to_hold(its length, its max_len); exactly enough free memory counts (>=, not >)",
    f"{DOC}#task-4-the-simulation-loop",
)
def test_blocked_with_exactly_enough_free():
    """A and C finish at step 0 and leave two holes of 4: 8 slots free, exactly D's 8."""
    mod = frag()
    rows = (("A", 0, 1, 1, 4), ("B", 0, 1, 3, 4), ("C", 0, 1, 1, 4), ("D", 0, 1, 1, 8))
    sim = run(mod, rows, mod.ContiguousAllocator(12))
    got = [(s.blocked, s.external_tokens) for s in steps_of(sim)]
    expected = [(None, 0), ("D", 8), ("D", 8), (None, 0)]
    assert got == expected, (
        f"(blocked, external_tokens) per step: expected {expected}, got {got}; at steps 1 and 2 "
        "D needs 8 slots in one piece and 8 are free in two holes of 4: free_tokens >= "
        "tokens_to_hold, so D is blocked (at step 0 nothing is free: a full memory, not "
        "fragmentation)"
    )


@graded(
    1,
    "A request is not admitted before its arrival_step; requests arriving in the same "
    "step queue in TRACE order (not by id); steps where nothing runs are still steps, and "
    "an empty trace has none",
    f"{DOC}#task-4-the-simulation-loop",
)
def test_arrivals_and_idle_steps():
    """Nothing arrives before step 2, so steps 0 and 1 are idle; Z, listed before A, goes first."""
    mod = frag()
    sim = run(mod, (("A", 2, 2, 2, None), ("B", 5, 1, 1, None)), mod.PagedAllocator(16, 4))
    expect_runs(sim, {"A": 2, "B": 5}, {"A": 3, "B": 5})
    running = [tuple(s.running) for s in steps_of(sim)]
    assert running == [(), (), ("A",), ("A",), (), ("B",)], (
        f"steps 0, 1 and 4 are idle but still steps: running per step {running}"
    )
    first = steps_of(sim)[0]
    assert first.free_tokens == 16 and first.used_tokens == 0, (
        f"an idle step 0: 16 tokens free, 0 used; got {first.free_tokens} free, "
        f"{first.used_tokens} used"
    )
    sim = run(mod, (), mod.ContiguousAllocator(16))
    got = (len(steps_of(sim)), sim.admitted, sim.finished, sim.num_preemptions)
    assert got == (0, {}, {}, 0), (
        f"an empty trace: no step (steps run from step 0 to the step the last request "
        f"finishes, and there is none), nothing admitted or finished; got (steps, admitted, "
        f"finished, num_preemptions) {got}"
    )
    # Memory for one of them at a time: the one listed first in the trace runs first.
    sim = run(mod, (("Z", 1, 6, 2, None), ("A", 1, 6, 2, None)), mod.PagedAllocator(8, 4))
    assert sim.admitted == {"Z": 1, "A": 3}, (
        f"Z and A both arrive at step 1 and only one fits; Z is listed first in the trace, so "
        f"it queues first: expected admitted {{'Z': 1, 'A': 3}}, got {sim.admitted} (sort "
        "the trace by arrival_step only: Python's sort is stable)"
    )


@graded(
    3,
    "Paged preemption: a running request that cannot get a block preempts the most "
    "recently admitted one (which keeps its tokens and goes back to the FRONT of the "
    "queue); nothing is admitted in that step; every preemption counts, and a step's "
    "preempted lists them in the order they were preempted (the most recently admitted "
    "first)",
    f"{DOC}#preemption",
)
def test_preemption_newest_first():
    """Memory for 8 tokens: A grows into B's blocks; B comes back when A is done. Then four
    requests that all need a second block in the same step: two of them are preempted."""
    mod = frag()
    rows = (("A", 0, 3, 4, None), ("B", 0, 3, 3, None), ("C", 1, 1, 1, None))
    sim = run(mod, rows, mod.PagedAllocator(8, 2))
    assert [tuple(s.preempted) for s in steps_of(sim)] == [(), ("B",), (), (), (), ()], (
        f"A needs a third block at step 1: B, the newest, is preempted: "
        f"{[tuple(s.preempted) for s in steps_of(sim)]}"
    )
    assert sim.num_preemptions == 1, f"one preemption (B), got {sim.num_preemptions}"
    rows_seen = [(tuple(s.running), s.used_tokens, s.free_tokens, s.waiting) for s in steps_of(sim)]
    assert rows_seen == [
        (("A", "B"), 8, 0, 0),
        (("A",), 5, 2, 2),  # C arrived, but nothing is admitted in a step with a preemption
        (("A",), 6, 2, 2),  # B (front of the queue) needs 3 blocks for 3 + 1 + 1 tokens
        (("A",), 7, 0, 2),
        (("B", "C"), 7, 0, 0),
        (("B",), 6, 2, 0),
    ], f"(running, used, free, waiting) per step: {rows_seen}"
    expect_runs(sim, {"A": 0, "B": 0, "C": 4}, {"A": 3, "C": 4, "B": 5}, 1)

    rows = (("A", 0, 1, 3, None), ("B", 0, 1, 3, None), ("C", 0, 1, 2, None), ("D", 0, 1, 2, None))
    sim = run(mod, rows, mod.PagedAllocator(8, 2))
    preempted = [tuple(s.preempted) for s in steps_of(sim)]
    assert preempted == [(), ("D", "C"), (), ()], (
        "4 blocks of 2, A B C D each hold 1 and all need a second at step 1: A preempts D "
        "(the newest), then B preempts C, so step 1's preempted is ('D', 'C'), most recent "
        f"first; preempted per step: {preempted}"
    )
    assert sim.num_preemptions == 2, (
        f"two requests were preempted (in the same step): num_preemptions 2, got "
        f"{sim.num_preemptions}"
    )
    expect_runs(sim, {"A": 0, "B": 0, "C": 0, "D": 0}, {"A": 2, "B": 2, "C": 3, "D": 3}, 2)

    rows = (("A", 1, 1, 6, None), ("B", 1, 1, 4, None), ("C", 0, 2, 4, None))
    sim = run(mod, rows, mod.PagedAllocator(8, 2), max_model_len=20)
    seen = [(tuple(s.preempted), tuple(s.running)) for s in steps_of(sim)[2:5]]
    assert seen == [(("B", "A"), ("C",)), ((), ("C",)), ((), ("A", "B"))], (
        "at step 2 C needs a third block and preempts B (the newest), then A needs a second "
        "and, now the newest, preempts itself: each victim goes to the FRONT of the queue in "
        "turn, so A (preempted last) is first and step 4 runs ('A', 'B'); (preempted, running) "
        f"at steps 2-4: {seen}"
    )
    expect_runs(sim, {"C": 0, "A": 1, "B": 1}, {"C": 3, "A": 8, "B": 9}, 3)


@graded(
    1,
    "simulate rejects traces it cannot run: duplicate ids, a max_len below the final "
    "length, no max_len without max_model_len, a request larger than the memory",
    f"{DOC}#task-4-the-simulation-loop",
)
def test_bad_traces_are_errors():
    """Every one of these raises ValueError instead of looping forever."""
    mod = frag()
    cases = [
        ((("A", 0, 2, 2, 8), ("A", 1, 2, 2, 8)), 8),
        ((("A", 0, 6, 4, 8),), 8),
        ((("A", 0, 2, 2, None),), None),
        ((("A", 0, 2, 2, 32),), 8),
    ]
    for rows, max_model_len in cases:
        # The trace and the allocator are built first: only simulate's own ValueError counts.
        trace, allocator = make_trace(mod, rows), mod.ContiguousAllocator(16)
        with pytest.raises(ValueError):
            mod.simulate(trace, allocator, max_model_len)


requests = st.lists(
    st.tuples(st.integers(0, 6), st.integers(1, 6), st.integers(1, 6), st.integers(0, 4)),
    min_size=1,
    max_size=7,
)


def side():
    return learner_module("learner_side")


@graded(
    1,
    "simulate takes any Iterable of TraceRequest, a one-shot iterator too: read it once "
    "(trace = list(trace)) before validating, sorting and counting",
    f"{DOC}#task-4-the-simulation-loop",
)
def test_trace_may_be_a_one_shot_iterator():
    """The worked example handed over as iter(trace): the same run as from a list."""
    frag()
    rows = [list(row) for row in TRACE]
    got = side().simulate(rows, ["contiguous", CAPACITY], MAX_MODEL_LEN, True)
    runs = (len(got["steps"]), got["admitted"], got["finished"])
    expected = (
        len(CONTIGUOUS_STEPS),
        {"A": 0, "B": 0, "C": 0, "D": 4},
        {"A": 1, "C": 1, "B": 3, "D": 6},
    )
    assert runs == expected, (
        f"the worked example passed as iter(trace): expected (steps, admitted, finished) "
        f"{expected}, got {runs}; an iterator can be read only once, so going over the trace "
        "twice (to validate it, then to sort it) leaves nothing for the second pass"
    )


@graded(
    3,
    "Accounting: at every step used + reserved + internal (the held slots) + free = "
    "capacity; every request runs output_len steps (more only if preempted) and finishes "
    "once; memory is all free at the end",
    f"{DOC}#invariants",
)
def test_random_traces_keep_the_accounting():
    """Property test on random small traces, for both allocators."""
    frag()
    with bounded_shrinking():
        _random_traces_keep_the_accounting()


@RANDOM_SETTINGS
@given(rows=requests, paged=st.booleans())
def _random_traces_keep_the_accounting(rows, paged):
    trace = [(f"r{i}", arr, p, o, p + o + extra) for i, (arr, p, o, extra) in enumerate(rows)]
    spec = ["paged", 24, 4] if paged else ["contiguous", 24]
    got = side().simulate(trace, spec)
    steps_running = {rid: 0 for rid, *_ in trace}
    for s in got["steps"]:
        used, reserved, internal, free = (
            s[k] for k in ("used_tokens", "reserved_tokens", "internal_tokens", "free_tokens")
        )
        held = used + reserved + internal
        assert held + free == 24, (
            f"step {s['step']}: used + reserved + internal = {held} held, plus {free} "
            "free, must be the capacity 24"
        )
        assert min(used, reserved, internal) >= 0, (
            f"step {s['step']}: negative counts (used, reserved, internal) = "
            f"{(used, reserved, internal)}"
        )
        assert s["largest_free_range"] <= free, (
            f"step {s['step']}: the largest free range {s['largest_free_range']} exceeds the "
            f"{free} free slots"
        )
        if paged:
            assert s["blocked"] is None and s["external_tokens"] == 0, (
                "paging never refuses a request while enough blocks are free"
            )
        for rid in s["running"]:
            assert rid in steps_running, f"step {s['step']}: {rid!r} is not a request of the trace"
            steps_running[rid] += 1
    for rid, _, _, output_len, _ in trace:
        assert rid in got["finished"], f"{rid} never finished"
        ran = steps_running[rid]
        assert ran >= output_len, f"{rid} ran {ran} steps, too few for its {output_len} tokens"
        if got["num_preemptions"] == 0:
            assert ran == output_len, f"{rid} ran {ran} steps for {output_len} tokens"
    assert got["allocator"]["free_tokens"] == 24, "every request freed its memory at the end"
    if not paged:
        assert got["allocator"]["free_ranges"] == [(0, 24)], (
            f"the free ranges must merge back into one: {got['allocator']['free_ranges']}"
        )


@st.composite
def traces(draw):
    """A random trace and an allocator whose memory holds its largest request, sometimes only
    just (so that paged runs preempt): ``(rows, allocator spec, max_model_len)``."""
    rows = []
    for i in range(draw(st.integers(1, 7))):
        prompt, output = draw(st.integers(1, 8)), draw(st.integers(1, 8))
        max_len = draw(st.one_of(st.none(), st.integers(prompt + output, prompt + output + 6)))
        rows.append((f"r{i}", draw(st.integers(0, 6)), prompt, output, max_len))
    max_model_len = max(p + o for _, _, p, o, _ in rows) + draw(st.integers(0, 6))
    if draw(st.booleans()):
        block_size = draw(st.sampled_from([1, 2, 4]))
        need = max(-(-(p + o) // block_size) * block_size for _, _, p, o, _ in rows)
        spec = ["paged", need + block_size * draw(st.integers(0, 6)), block_size]
    else:
        need = max(m if m is not None else max_model_len for *_, m in rows)
        spec = ["contiguous", need + draw(st.integers(0, 24))]
    return rows, spec, max_model_len


@graded(
    3,
    "Simulation on random traces, step by step as the reference runs them: the order "
    "of events in a step (arrive, grow and preempt the newest, admit FCFS only if "
    "nothing was preempted, measure, produce, finish and free)",
    f"{DOC}#task-4-the-simulation-loop",
)
def test_random_traces_match_the_reference():
    """Random traces on both allocators, memory tight enough to preempt: every field of every
    step, the admission and finish steps, and the preemptions equal the reference's."""
    frag()
    with bounded_shrinking():
        _random_traces_match_the_reference()


@RANDOM_SETTINGS
@given(case=traces())
def _random_traces_match_the_reference(case):
    rows, spec, max_model_len = case
    got = side().simulate(rows, spec, max_model_len)
    want = reference_simulate(rows, spec, max_model_len)
    where = f"trace {rows} on {spec} (max_model_len {max_model_len})"
    difference = first_step_difference(got["steps"], want["steps"])
    assert difference is None, f"{where}: {difference}"
    for name in ("admitted", "finished", "num_preemptions"):
        assert got[name] == want[name], f"{where}: {name} is {got[name]!r}, expected {want[name]!r}"
