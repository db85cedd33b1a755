"""lab-02, part 3: the report: exact ratios from the steps of a simulation."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from grading.suite import graded, learner_module, load_impl
from tests.labs.common import close_to, same_data
from tests.labs.lab_02.oracle import (
    RANDOM_SETTINGS,
    bounded_shrinking,
    reference_summarize_steps,
)
from tests.labs.lab_02.worked_example import (
    BLOCK_SIZE,
    CAPACITY,
    DOC,
    MAX_MODEL_LEN,
    make_trace,
    steps_of,
)


def frag():
    return load_impl("fragmentation")


def report_fields(report) -> dict:
    names = (
        "num_steps",
        "token_share",
        "token_share_at_peak",
        "reserved_share",
        "internal_fragmentation",
        "external_fragmentation",
        "max_running",
        "mean_running",
        "blocked_steps",
        "delayed_with_enough_free",
        "num_preemptions",
    )
    return {name: getattr(report, name) for name in names}


def assert_report(report, expected: dict) -> None:
    got = report_fields(report)
    wrong = {k: (got[k], v) for k, v in expected.items() if not close_to(got[k], v, rel=0)}
    assert not wrong, "report fields (got, expected): " + ", ".join(
        f"{k}: {g!r} vs {e!r}" for k, (g, e) in wrong.items()
    )


@graded(
    3,
    "Report (contiguous): shares of held memory are ratios of sums over all steps "
    "(52 token-steps of 100 held); external fragmentation is over capacity x steps",
    f"{DOC}#task-5-the-report",
)
def test_report_worked_example_contiguous():
    """The worked example's contiguous numbers, as the README derives them."""
    mod = frag()
    sim = mod.simulate(make_trace(mod), mod.ContiguousAllocator(CAPACITY), MAX_MODEL_LEN)
    assert_report(
        mod.summarize(sim),
        {
            "num_steps": 7,
            "token_share": 52 / 100,
            "token_share_at_peak": 10 / 24,
            "reserved_share": 11 / 100,
            "internal_fragmentation": 37 / 100,
            "external_fragmentation": 32 / (24 * 7),
            "max_running": 3,
            "mean_running": 11 / 7,
            "blocked_steps": 2,
            "delayed_with_enough_free": 1,
            "num_preemptions": 0,
        },
    )


@graded(
    2,
    "Report (paged): the same 52 token-steps now fill 52 of 68 held slot-steps, with "
    "no external fragmentation",
    f"{DOC}#task-5-the-report",
)
def test_report_worked_example_paged():
    """The worked example's paged numbers."""
    mod = frag()
    sim = mod.simulate(make_trace(mod), mod.PagedAllocator(CAPACITY, BLOCK_SIZE), MAX_MODEL_LEN)
    assert_report(
        mod.summarize(sim),
        {
            "num_steps": 4,
            "token_share": 52 / 68,
            "token_share_at_peak": 18 / 24,
            "reserved_share": 6 / 68,
            "internal_fragmentation": 10 / 68,
            "external_fragmentation": 0.0,
            "max_running": 4,
            "mean_running": 11 / 4,
            "blocked_steps": 0,
            "delayed_with_enough_free": 0,
            "num_preemptions": 0,
        },
    )


def _steps(mod, rows):
    """StepStats from (running, used, reserved, internal, free, blocked, preempted)."""
    return [
        mod.StepStats(
            step=i,
            running=running,
            used_tokens=u,
            reserved_tokens=r,
            internal_tokens=n,
            free_tokens=f,
            largest_free_range=0,
            waiting=0,
            blocked=b,
            external_tokens=f if b else 0,
            preempted=p,
        )
        for i, (running, u, r, n, f, b, p) in enumerate(rows)
    ]


@graded(
    3,
    "Report: time averages weigh each step by the memory it held (sum used / sum held, "
    "not the mean of per-step ratios); the peak is the FIRST step holding the most; mean "
    "concurrency counts only steps where something runs; a request blocked twice is one "
    "delayed request; the simulation is left as it was",
    f"{DOC}#task-5-the-report",
)
def test_report_definitions_on_handmade_steps():
    """summarize alone, on steps built by hand (no simulation involved)."""
    mod = frag()
    rows = [
        ((), 0, 0, 0, 40, None, ()),
        (("a",), 5, 3, 2, 30, "x", ()),
        (("a", "b", "c"), 27, 1, 2, 10, None, ("d",)),
        (("a", "b"), 20, 6, 4, 10, "x", ()),
        (("a",), 9, 0, 1, 30, "y", ()),
    ]
    steps = _steps(mod, rows)
    sim = mod.Simulation(
        capacity_tokens=40, steps=steps, admitted={}, finished={}, num_preemptions=1
    )
    assert_report(
        mod.summarize(sim),
        {
            "num_steps": 5,
            "token_share": 61 / 80,  # not the mean of 5/10, 27/30, 20/30, 9/10
            "token_share_at_peak": 27 / 30,  # steps 2 and 3 both hold 30: the first one
            "reserved_share": 10 / 80,
            "internal_fragmentation": 9 / 80,
            "external_fragmentation": (30 + 10 + 30) / (40 * 5),
            "max_running": 3,
            "mean_running": 7 / 4,  # the idle step 0 does not count
            "blocked_steps": 3,
            "delayed_with_enough_free": 2,  # x (twice) and y
            "num_preemptions": 1,
        },
    )
    # The same step objects, in the same order, each with the fields it was built with: the
    # steps' own `step` numbers alone would not do, since summarize could renumber the steps it
    # sorted (tests/hostile/renumber_the_steps_it_sorted.py).
    after = steps_of(sim)
    order = [s.step for s in after]
    same_objects = len(after) == len(steps) and all(a is b for a, b in zip(after, steps))
    fields = [
        (s.running, s.used_tokens, s.reserved_tokens, s.internal_tokens, s.free_tokens, s.blocked)
        for s in after
    ]
    built = [row[:6] for row in rows]
    assert same_objects and order == [0, 1, 2, 3, 4] and same_data(fields, built), (
        f"summarize reads the simulation and changes nothing in it: its steps must still be the "
        f"same StepStats in step order 0..4, each as it was built, afterwards; got steps "
        f"numbered {order} (sort a copy, or take the max, to find the peak)"
    )


@graded(
    1,
    "Report: an empty simulation reports zeros instead of dividing by zero",
    f"{DOC}#task-5-the-report",
)
def test_report_of_nothing():
    """No steps: every count and share is 0; two idle steps: two steps, every share 0."""
    mod = frag()
    sim = mod.Simulation(capacity_tokens=16, steps=[], admitted={}, finished={})
    report = mod.summarize(sim)
    for field in (
        "num_steps",
        "max_running",
        "token_share",
        "mean_running",
        "external_fragmentation",
        "token_share_at_peak",
    ):
        value = getattr(report, field)
        assert value == 0, f"the report of no steps has {field} 0, got {value!r}"
    # The control: two idle steps hold no memory either (every share is 0 / 0), but they are
    # two steps; a report of zeros whatever the simulation is not what this point is for.
    idle = dict(running=(), used_tokens=0, reserved_tokens=0, internal_tokens=0)
    idle |= dict(free_tokens=16, largest_free_range=16, waiting=0, blocked=None)
    idle |= dict(external_tokens=0, preempted=())
    steps = [dict(idle, step=0), dict(idle, step=1)]
    got = learner_module("learner_side").summarize_steps(16, steps, 0)
    want = reference_summarize_steps(16, steps, 0)
    wrong = {k: (got[k], v) for k, v in want.items() if not close_to(got[k], v, rel=0)}
    assert not wrong, (
        "two idle steps (nothing running, nothing held): report fields (got, expected): "
        + ", ".join(f"{k}: {g!r} vs {e!r}" for k, (g, e) in wrong.items())
    )


@st.composite
def step_lists(draw):
    """Up to 8 made-up steps of a 40-slot memory: idle steps, ties in held memory, refusals of
    the same request over several steps, preemptions."""
    steps = []
    for i in range(draw(st.integers(0, 8))):
        running = draw(st.sampled_from([(), ("a",), ("a", "b"), ("a", "b", "c"), ("b", "d")]))
        used, reserved, internal = (draw(st.integers(0, n)) for n in (12, 4, 4))
        if not running:
            used = reserved = internal = 0
        free = 40 - used - reserved - internal
        blocked = draw(st.sampled_from([None, None, "x", "y"]))
        steps.append(
            dict(
                step=i,
                running=running,
                used_tokens=used,
                reserved_tokens=reserved,
                internal_tokens=internal,
                free_tokens=free,
                largest_free_range=draw(st.integers(0, free)),
                waiting=draw(st.integers(0, 3)),
                blocked=blocked,
                external_tokens=free if blocked else 0,
                preempted=draw(st.sampled_from([(), (), ("d",)])),
            )
        )
    return steps, draw(st.integers(0, 3))


@graded(
    2,
    "Report on random steps, as the reference computes it: sums before dividing, the "
    "first peak, concurrency over busy steps, distinct delayed requests, zeros for "
    "nothing",
    f"{DOC}#task-5-the-report",
)
def test_report_of_random_steps_matches_the_reference():
    """summarize alone, on random steps built from the same fields here and in your process."""
    frag()
    with bounded_shrinking():
        _report_of_random_steps_matches_the_reference()


@RANDOM_SETTINGS
@given(case=step_lists())
def _report_of_random_steps_matches_the_reference(case):
    steps, num_preemptions = case
    got = learner_module("learner_side").summarize_steps(40, steps, num_preemptions)
    want = reference_summarize_steps(40, steps, num_preemptions)
    rows = [
        (
            s["running"],
            s["used_tokens"],
            s["reserved_tokens"],
            s["internal_tokens"],
            s["free_tokens"],
            s["blocked"],
        )
        for s in steps
    ]
    wrong = {k: (got[k], v) for k, v in want.items() if not close_to(got[k], v, rel=0)}
    assert not wrong, (
        f"steps (running, used, reserved, internal, free, blocked) {rows} with "
        f"{num_preemptions} preemptions: report fields (got, expected): "
        + ", ".join(f"{k}: {g!r} vs {e!r}" for k, (g, e) in wrong.items())
    )
