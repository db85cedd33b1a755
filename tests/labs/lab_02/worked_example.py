"""The README's worked example, shared by the lab-02 tests (plain data: no learner code)."""

from __future__ import annotations

from tests.labs.common import describe

DOC = "labs/lab-02-fragmentation-viz/README.md"

#: (request_id, arrival_step, prompt_len, output_len, max_len)
TRACE = (
    ("A", 0, 3, 2, None),
    ("B", 0, 2, 4, None),
    ("C", 0, 2, 2, None),
    ("D", 1, 4, 3, 12),
)
CAPACITY = 24
BLOCK_SIZE = 4
MAX_MODEL_LEN = 8

#: step: (running, used, reserved, internal, free, largest free range, blocked)
CONTIGUOUS_STEPS = (
    (("A", "B", "C"), 10, 5, 9, 0, 0, None),
    (("A", "B", "C"), 13, 2, 9, 0, 0, None),
    (("B",), 5, 1, 2, 16, 8, "D"),
    (("B",), 6, 0, 2, 16, 8, "D"),
    (("D",), 5, 2, 5, 12, 12, None),
    (("D",), 6, 1, 5, 12, 12, None),
    (("D",), 7, 0, 5, 12, 12, None),
)
PAGED_STEPS = (
    (("A", "B", "C"), 10, 2, 0, 12, 12, None),
    (("A", "B", "C", "D"), 18, 2, 4, 0, 0, None),
    (("B", "D"), 11, 2, 3, 8, 8, None),
    (("B", "D"), 13, 0, 3, 8, 8, None),
)


def make_trace(mod, rows=TRACE):
    """The learner's ``TraceRequest`` objects for ``rows``."""
    return [mod.TraceRequest(*row) for row in rows]


def step_row(step) -> tuple:
    """One step of the learner's simulation, as a row of the tables above."""
    return (
        tuple(step.running),
        step.used_tokens,
        step.reserved_tokens,
        step.internal_tokens,
        step.free_tokens,
        step.largest_free_range,
        step.blocked,
    )


def steps_of(sim) -> list:
    """``sim.steps``, which must be a plain list: a list of the learner's own class would cross
    as a learner object, whose length and items its own ``__len__`` and ``__iter__`` would
    give (tests/hostile/steps_that_report_their_own_length.py)."""
    steps = sim.steps
    if type(steps) is not list:
        raise AssertionError(f"Simulation.steps must be a list of StepStats, got {describe(steps)}")
    return steps
