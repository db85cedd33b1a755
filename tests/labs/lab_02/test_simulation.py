"""lab-02, part 2: the simulation loop, checked step by step on small traces."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from grading.suite import graded, load_impl
from tests.labs.common import GRADED_SETTINGS
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
)


def frag():
    return load_impl("fragmentation")


def run(mod, rows, allocator, max_model_len=MAX_MODEL_LEN):
    return mod.simulate(make_trace(mod, rows), allocator, max_model_len)


def compare_steps(sim, expected) -> None:
    got = [step_row(s) for s in sim.steps]
    assert [s.step for s in sim.steps] == list(range(len(sim.steps))), (
        "steps are numbered 0, 1, ... with none skipped")
    for i, (g, e) in enumerate(zip(got, expected)):
        assert g == e, (
            f"step {i}: (running, used, reserved, internal, free, largest free range, blocked) "
            f"is {g}, expected {e}")
    assert len(got) == len(expected), (
        f"the simulation ran {len(got)} steps, expected {len(expected)} (it ends with the step "
        "in which the last request finishes)")


@graded(4, "Simulation (contiguous): each request reserves max_len at admission; finished "
           "requests free their range for the NEXT step; D waits while 16 slots are free in two "
           "holes of 8", f"{DOC}#worked-example")
def test_worked_example_contiguous():
    """The README's worked example, step by step, on the contiguous allocator."""
    mod = frag()
    sim = run(mod, TRACE, mod.ContiguousAllocator(CAPACITY))
    compare_steps(sim, CONTIGUOUS_STEPS)
    assert sim.admitted == {"A": 0, "B": 0, "C": 0, "D": 4}
    assert sim.finished == {"A": 1, "C": 1, "B": 3, "D": 6}
    assert sim.num_preemptions == 0


@graded(4, "Simulation (paged): requests hold whole blocks for the tokens they have; D is "
           "admitted at step 1 because any free block serves any request",
        f"{DOC}#worked-example")
def test_worked_example_paged():
    """The README's worked example, step by step, on the paged allocator."""
    mod = frag()
    sim = run(mod, TRACE, mod.PagedAllocator(CAPACITY, BLOCK_SIZE))
    compare_steps(sim, PAGED_STEPS)
    assert sim.admitted == {"A": 0, "B": 0, "C": 0, "D": 1}
    assert sim.finished == {"A": 1, "C": 1, "B": 3, "D": 3}
    assert sim.num_preemptions == 0


@graded(2, "Admission is first come, first served: when the request at the head of the queue "
           "does not fit, no later request is admitted in its place",
        f"{DOC}#task-4-the-simulation-loop")
def test_fcfs_head_of_line_blocking():
    """C would fit, but B arrived first and does not: C waits behind B."""
    mod = frag()
    rows = (("A", 0, 2, 3, 8), ("B", 0, 2, 2, 12), ("C", 0, 1, 1, 4))
    sim = run(mod, rows, mod.ContiguousAllocator(16))
    assert sim.admitted == {"A": 0, "B": 3, "C": 3}, (
        f"B must wait for A to finish (step 2) and C must wait behind B: admitted "
        f"{sim.admitted}")
    assert [s.waiting for s in sim.steps[:3]] == [2, 2, 2]
    assert sim.steps[0].blocked is None, "8 slots free < the 12 B reserves: not fragmentation"


@graded(1, "A request is not admitted before its arrival_step; steps where nothing runs are "
           "still steps", f"{DOC}#task-4-the-simulation-loop")
def test_arrivals_and_idle_steps():
    """Nothing arrives before step 2, so steps 0 and 1 are idle."""
    mod = frag()
    sim = run(mod, (("A", 2, 2, 2, None), ("B", 5, 1, 1, None)), mod.PagedAllocator(16, 4))
    assert sim.admitted == {"A": 2, "B": 5}
    assert sim.finished == {"A": 3, "B": 5}
    assert [tuple(s.running) for s in sim.steps] == [(), (), ("A",), ("A",), (), ("B",)]
    assert sim.steps[0].free_tokens == 16 and sim.steps[0].used_tokens == 0


@graded(3, "Paged preemption: a running request that cannot get a block preempts the most "
           "recently admitted one (which keeps its tokens and goes back to the FRONT of the "
           "queue); nothing is admitted in that step", f"{DOC}#preemption")
def test_preemption_newest_first():
    """Memory for 8 tokens: A grows into B's blocks; B comes back when A is done."""
    mod = frag()
    rows = (("A", 0, 3, 4, None), ("B", 0, 3, 3, None), ("C", 1, 1, 1, None))
    sim = run(mod, rows, mod.PagedAllocator(8, 2))
    assert [tuple(s.preempted) for s in sim.steps] == [(), ("B",), (), (), (), ()], (
        f"A needs a third block at step 1: B, the newest, is preempted: "
        f"{[tuple(s.preempted) for s in sim.steps]}")
    assert sim.num_preemptions == 1
    rows_seen = [(tuple(s.running), s.used_tokens, s.free_tokens, s.waiting) for s in sim.steps]
    assert rows_seen == [
        (("A", "B"), 8, 0, 0),
        (("A",), 5, 2, 2),   # C arrived, but nothing is admitted in a step with a preemption
        (("A",), 6, 2, 2),   # B (front of the queue) needs 3 blocks for 3 + 1 + 1 tokens
        (("A",), 7, 0, 2),
        (("B", "C"), 7, 0, 0),
        (("B",), 6, 2, 0),
    ], f"(running, used, free, waiting) per step: {rows_seen}"
    assert sim.admitted == {"A": 0, "B": 0, "C": 4}
    assert sim.finished == {"A": 3, "C": 4, "B": 5}


@graded(1, "simulate rejects traces it cannot run: duplicate ids, a max_len below the final "
           "length, no max_len without max_model_len, a request larger than the memory",
        f"{DOC}#task-4-the-simulation-loop")
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
        with pytest.raises(ValueError):
            run(mod, rows, mod.ContiguousAllocator(16), max_model_len)


requests = st.lists(
    st.tuples(st.integers(0, 6), st.integers(1, 6), st.integers(1, 6), st.integers(0, 4)),
    min_size=1, max_size=7)


@graded(3, "Accounting: at every step used + reserved + internal (the held slots) + free = "
           "capacity; every request runs output_len steps (more only if preempted) and finishes "
           "once; memory is all free at the end", f"{DOC}#invariants")
@GRADED_SETTINGS
@given(rows=requests, paged=st.booleans())
def test_random_traces_keep_the_accounting(rows, paged):
    """Property test on random small traces, for both allocators."""
    mod = frag()
    trace = [mod.TraceRequest(f"r{i}", arr, p, o, p + o + extra)
             for i, (arr, p, o, extra) in enumerate(rows)]
    alloc = mod.PagedAllocator(24, 4) if paged else mod.ContiguousAllocator(24)
    sim = mod.simulate(trace, alloc)
    steps_running = {r.request_id: 0 for r in trace}
    for s in sim.steps:
        held = s.used_tokens + s.reserved_tokens + s.internal_tokens
        assert held + s.free_tokens == 24, (
            f"step {s.step}: used + reserved + internal = {held} held, plus {s.free_tokens} "
            "free, must be the capacity 24")
        assert min(s.used_tokens, s.reserved_tokens, s.internal_tokens) >= 0
        assert s.largest_free_range <= s.free_tokens
        if paged:
            assert s.blocked is None and s.external_tokens == 0, (
                "paging never refuses a request while enough blocks are free")
        for rid in s.running:
            steps_running[rid] += 1
    for req in trace:
        assert req.request_id in sim.finished, f"{req.request_id} never finished"
        if sim.num_preemptions == 0:
            assert steps_running[req.request_id] == req.output_len, (
                f"{req.request_id} ran {steps_running[req.request_id]} steps for "
                f"{req.output_len} tokens")
    assert alloc.num_free_tokens() == 24, "every request freed its memory at the end"
    if not paged:
        assert alloc.free_ranges == [(0, 24)]
