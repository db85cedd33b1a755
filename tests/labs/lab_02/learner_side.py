"""lab-02's helpers in the learner process: they build traces, run the learner's simulation the
way the judge dictates, and read the outcome back as plain data. They never judge.

The grader copies this file into the learner's sandbox as the top-level module
``learner_side``; the tests reach it with ``learner_module("learner_side")``. One call runs a
whole simulation and returns every step's fields, so a property test costs one request per
example instead of one per attribute. The fields are read as the lab defines them (the
attributes of ``StepStats``, ``Simulation``, ``FragmentationReport``, the allocators' state);
containers are copied into plain lists and dicts. Every verdict is taken in the judge, on this
data.
"""

from __future__ import annotations

from typing import Any

STEP_FIELDS = (
    "step",
    "running",
    "used_tokens",
    "reserved_tokens",
    "internal_tokens",
    "free_tokens",
    "largest_free_range",
    "waiting",
    "blocked",
    "external_tokens",
    "preempted",
)
REPORT_FIELDS = (
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


def _allocator(spec: list[Any]) -> Any:
    """``["contiguous", capacity]`` or ``["paged", capacity, block_size]``: the learner's."""
    import fragmentation as yours

    kind, *args = spec
    return yours.PagedAllocator(*args) if kind == "paged" else yours.ContiguousAllocator(*args)


def _step(step: Any) -> dict[str, Any]:
    row = {name: getattr(step, name) for name in STEP_FIELDS}
    row["running"] = list(row["running"])
    row["preempted"] = list(row["preempted"])
    return row


def _allocator_state(kind: str, alloc: Any) -> dict[str, Any]:
    state: dict[str, Any] = {"free_tokens": alloc.num_free_tokens()}
    if kind == "paged":
        state["free_block_ids"] = list(alloc.free_block_ids)
        state["block_tables"] = {k: list(v) for k, v in dict(alloc.block_tables).items()}
    else:
        state["free_ranges"] = [tuple(r) for r in alloc.free_ranges]
        state["ranges"] = {k: tuple(v) for k, v in dict(alloc.ranges).items()}
    return state


def simulate(
    rows: list[list[Any]],
    allocator: list[Any],
    max_model_len: int | None = None,
    one_shot: bool = False,
) -> dict[str, Any]:
    """The learner's ``simulate`` of ``TraceRequest(*row)`` for each row on a fresh allocator
    (handed over as a one-shot iterator instead of a list with ``one_shot``).

    Returns ``{"steps": [{field: value}], "admitted": {...}, "finished": {...},
    "num_preemptions": n, "allocator": {its state after the run}, "sim": the Simulation}``
    (``sim`` stays in this process; the judge gets a handle to pass to :func:`report`).
    """
    import fragmentation as yours

    alloc = _allocator(allocator)
    trace = [yours.TraceRequest(*row) for row in rows]
    sim = yours.simulate(iter(trace) if one_shot else trace, alloc, max_model_len)
    # A list of the learner's own class is sent as it is (a learner object, which the judge
    # refuses as the steps): its own __iter__ would choose the steps read here.
    steps = sim.steps
    return {
        "steps": [_step(s) for s in steps] if type(steps) is list else steps,
        "admitted": dict(sim.admitted),
        "finished": dict(sim.finished),
        "num_preemptions": sim.num_preemptions,
        "allocator": _allocator_state(allocator[0], alloc),
        "sim": sim,
    }


def report(sim: Any) -> dict[str, Any]:
    """The learner's ``summarize(sim)``, field by field."""
    import fragmentation as yours

    result = yours.summarize(sim)
    return {name: getattr(result, name) for name in REPORT_FIELDS}


def summarize_steps(
    capacity: int, steps: list[dict[str, Any]], num_preemptions: int
) -> dict[str, Any]:
    """The learner's ``summarize`` of a ``Simulation`` holding ``StepStats(**fields)`` for each
    of ``steps`` (no simulation involved), field by field."""
    import fragmentation as yours

    built = [yours.StepStats(**fields) for fields in steps]
    sim = yours.Simulation(
        capacity_tokens=capacity,
        steps=built,
        admitted={},
        finished={},
        num_preemptions=num_preemptions,
    )
    return report(sim)
