"""The reference simulation, run in the judge, for the randomized lab-02 tests.

``mini_vllm.teaching.fragmentation`` is the course's reference engine (the solution's classes and
functions are kept identical to it by ``tests/test_lab_sync.py``). It runs here, in the judge,
on the same trace as the learner's code, which runs in the learner process and sends back plain
data (``learner_side.simulate``); the tests compare the two field by field. The hand-made tests
of the suite keep their expected values written out; these only widen the search to random
traces.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

from hypothesis import Phase, settings

from grading.suite import SESSION
from tests.labs.common import GRADED_SETTINGS
from tests.labs.lab_02.learner_side import REPORT_FIELDS, STEP_FIELDS

#: At most this long is spent shortening a failing random example.
SHRINK_SECONDS = 3.0
#: Random tests: reproducible, and no ``explain`` phase (more replays of a failing example).
RANDOM_SETTINGS = settings(
    GRADED_SETTINGS, phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink]
)


@contextlib.contextmanager
def bounded_shrinking(seconds: float = SHRINK_SECONDS) -> Iterator[None]:
    """Hypothesis shortens a failing example for at most ``seconds`` (and never past the test's
    deadline): each try is a whole simulation in the learner process and one here, and without
    a bound a failure would show as a timeout instead of the trace that broke."""
    from hypothesis.internal.conjecture import engine

    saved = engine.MAX_SHRINKING_SECONDS
    if SESSION.deadline is not None:
        seconds = max(0.5, min(seconds, SESSION.deadline - time.monotonic() - 4.0))
    engine.MAX_SHRINKING_SECONDS = seconds
    try:
        yield
    finally:
        engine.MAX_SHRINKING_SECONDS = saved


def reference_allocator(spec: list[Any]) -> Any:
    from mini_vllm.teaching import fragmentation as ref

    kind, *args = spec
    return ref.PagedAllocator(*args) if kind == "paged" else ref.ContiguousAllocator(*args)


def step_fields(step: Any) -> dict[str, Any]:
    row = {name: getattr(step, name) for name in STEP_FIELDS}
    row["running"] = list(row["running"])
    row["preempted"] = list(row["preempted"])
    return row


def reference_simulate(
    rows: list[list[Any]], allocator: list[Any], max_model_len: int | None = None
) -> dict[str, Any]:
    """What ``learner_side.simulate`` returns, computed by the reference."""
    from mini_vllm.teaching import fragmentation as ref

    sim = ref.simulate(
        [ref.TraceRequest(*row) for row in rows], reference_allocator(allocator), max_model_len
    )
    return {
        "steps": [step_fields(s) for s in sim.steps],
        "admitted": dict(sim.admitted),
        "finished": dict(sim.finished),
        "num_preemptions": sim.num_preemptions,
        "sim": sim,
    }


def reference_report(sim: Any) -> dict[str, Any]:
    from mini_vllm.teaching import fragmentation as ref

    result = ref.summarize(sim)
    return {name: getattr(result, name) for name in REPORT_FIELDS}


def reference_summarize_steps(
    capacity: int, steps: list[dict[str, Any]], num_preemptions: int
) -> dict[str, Any]:
    from mini_vllm.teaching import fragmentation as ref

    sim = ref.Simulation(
        capacity_tokens=capacity,
        steps=[ref.StepStats(**f) for f in steps],
        admitted={},
        finished={},
        num_preemptions=num_preemptions,
    )
    return reference_report(sim)


def first_step_difference(got: list[Any], want: list[dict[str, Any]]) -> str | None:
    """Where the learner's steps (``got``, as received) first differ from the reference's."""
    if not isinstance(got, list) or not all(isinstance(s, dict) for s in got):
        return "the steps did not come back as a list of steps"
    for i, (g, w) in enumerate(zip(got, want)):
        wrong = [name for name in STEP_FIELDS if g.get(name) != w[name]]
        if wrong:
            return f"step {i}: " + ", ".join(
                f"{name} is {g.get(name)!r}, expected {w[name]!r}" for name in wrong
            )
    if len(got) != len(want):
        return (
            f"the simulation ran {len(got)} steps, expected {len(want)} (it ends with the "
            "step in which the last request finishes)"
        )
    return None
