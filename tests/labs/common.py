"""Checks shared by the graded suites, decided in the judge on plain data.

The learner's objects live in the learner process; a suite reaches them through proxies
(``grading/remote.py``). The block pool's invariants I1-I4 are stated once, in
``mini_vllm/teaching/invariants.py``, for the reference's tests and for these suites alike: its
``pool_snapshot`` / ``queue_snapshot`` read a pool or a free queue as plain data (lists of block
ids, reference counts and identity keys) and run in the learner process, imported by the
suite's ``learner_side``, one request per snapshot (for a suite whose ``learner_side`` has none,
the same functions walk the proxies here, one request per attribute). They only read the
attributes the labs define (upstream's names: ``fake_free_list_head``, ``prev_free_block``,
``ref_cnt``…), never the learner's own methods, so a broken method cannot vouch for itself; and
every verdict (``check_pool_snapshot``, ``check_queue_snapshot``, re-exported here) is taken
here, on the data received: values are compared as plain ``int`` / ``list`` after checking
their types, never through a learner object's ``__eq__``. Every failure names the invariant it
broke.

Timing checks (:func:`assert_constant_time`) take the time in the judge, around one request that
runs a whole batch of operations in the learner process, and the caller checks what the batch
returned and the state it left.
"""

from __future__ import annotations

import itertools
import math
import re
import time
import weakref
from collections.abc import Callable
from typing import Any

from hypothesis import HealthCheck, settings

from mini_vllm.teaching import invariants
from mini_vllm.teaching.invariants import (
    as_int,
    check_pool_snapshot,
    check_queue_snapshot,
    describe,
    int_list,
    plain_data,
    same_data,
)

__all__ = [  # what the suites import from here (the invariants' names included)
    "GRADED_SETTINGS",
    "STATEFUL_SETTINGS",
    "as_int",
    "assert_constant_time",
    "best_time",
    "block_ids",
    "check_pool",
    "check_pool_snapshot",
    "check_queue",
    "check_queue_snapshot",
    "close_to",
    "describe",
    "int_list",
    "learner_helper",
    "plain_data",
    "pool_snapshot",
    "queue_snapshot",
    "reading_only",
    "run_machine",
    "same_data",
    "timed_call",
]

#: Property tests are derandomized so a grade is reproducible, and unhurried on slow laptops.
GRADED_SETTINGS = settings(
    max_examples=60,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=list(HealthCheck),
)
STATEFUL_SETTINGS = settings(GRADED_SETTINGS, max_examples=40, stateful_step_count=40)


class _ShrinkUntil:
    """Hypothesis computes ``perf_counter() + MAX_SHRINKING_SECONDS`` when it starts shrinking:
    this gives back a fixed moment instead, so that shrinking ends before the test's deadline."""

    def __init__(self, stop_at: float) -> None:
        self.stop_at = stop_at

    def __radd__(self, now: float) -> float:
        return max(now + 0.5, self.stop_at)


def run_machine(machine: type, settings: Any = STATEFUL_SETTINGS, margin: float = 2.0) -> None:
    """``run_state_machine_as_test``, with shrinking cut short ``margin`` seconds before the
    test's deadline.

    Each step of a machine is a few requests to the learner process, so shrinking a failure
    to its shortest sequence can take longer than the test may run; cut short, Hypothesis still
    reports the shortest failing sequence found so far (the module constant patched here is
    the one Hypothesis leaves for that purpose). Without a deadline (outside the grader), it
    shrinks as usual. The ``explain`` phase (more runs, for a note on which lines only failing
    runs reached) is left out.
    """
    from hypothesis import Phase
    from hypothesis.internal.conjecture import engine
    from hypothesis.stateful import run_state_machine_as_test

    from grading.suite import SESSION

    saved = engine.MAX_SHRINKING_SECONDS
    if SESSION.deadline is not None:
        left = SESSION.deadline - time.monotonic()
        engine.MAX_SHRINKING_SECONDS = _ShrinkUntil(  # type: ignore[assignment]
            time.perf_counter() + left - margin
        )
    quick = type(settings)(settings, phases=[p for p in settings.phases if p != Phase.explain])
    try:
        run_state_machine_as_test(machine, settings=quick)
    except BaseException as exc:
        _drop_invariant_steps(exc, _invariant_names(machine))
        raise
    finally:
        engine.MAX_SHRINKING_SECONDS = saved


def _invariant_names(machine: type) -> set[str]:
    """The machine's ``@invariant`` methods: checks that run after every step, not steps."""
    from hypothesis.stateful import INVARIANT_MARKER

    return {
        name
        for name in dir(machine)
        if getattr(getattr(machine, name, None), INVARIANT_MARKER, None) is not None
    }


def _drop_invariant_steps(exc: BaseException, names: set[str]) -> None:
    """Hypothesis lists each invariant check among a failing run's steps (``state.check()``);
    the learner replays the rules, so the checks are left out (``grading/messages.py`` makes
    the rest compact)."""
    for inner in [exc, *(getattr(exc, "exceptions", None) or ())]:
        notes = getattr(inner, "__notes__", None)
        if isinstance(notes, list):
            inner.__notes__ = [
                n
                for n in notes
                if not (
                    isinstance(n, str)
                    and n.startswith("state.")
                    and n.removeprefix("state.").removesuffix("()") in names
                )
            ]


# -- reading values ----------------------------------------------------------------------------
def block_ids(blocks: Any, what: str = "a block's block_id") -> list[int]:
    """The ids of a list of (learner) blocks, each checked to be a plain int."""
    if type(blocks) is not list:
        blocks = list(blocks)  # a learner object: iterating it is one request, giving a list
    return [as_int(b.block_id, what) for b in blocks]


def close_to(got: Any, want: float, rel: float = 1e-6, abs: float = 1e-12) -> bool:
    """``got`` is a number (an ``int`` or a ``float``, numpy's scalars included; never a bool,
    an array, a list or a learner object) within ``rel`` or ``abs`` of ``want``.

    Use it, not ``got == pytest.approx(want)``, on learner data: ``approx`` compares an array
    element by element, so an array with no elements equals every ``approx``. The tolerances
    are ``approx``'s defaults; give ``rel=0`` for an absolute tolerance only.
    """
    import numpy as np

    if isinstance(got, bool | np.bool_) or not isinstance(
        got, int | float | np.integer | np.floating
    ):
        return False
    try:
        return math.isclose(float(got), want, rel_tol=rel, abs_tol=abs)
    except OverflowError:
        return False


class _ReadingOnly:
    """See :func:`reading_only`."""

    def __init__(self, module: Any, writes: dict[str, tuple[int | str, ...]]) -> None:
        self._module, self._writes = module, writes

    def __getattr__(self, name: str) -> Any:
        from grading.remote import writes

        fn = getattr(self._module, name)
        may_write = self._writes.get(name, ())

        def call(*args: Any, **kwargs: Any) -> Any:
            args = tuple(writes(a) if i in may_write else a for i, a in enumerate(args))
            kwargs = {k: writes(v) if k in may_write else v for k, v in kwargs.items()}
            return fn(*args, **kwargs)

        return call


def reading_only(module: Any, writes: dict[str, tuple[int | str, ...]] | None = None) -> Any:
    """``module`` (a learner module's proxy) whose functions may write only into the numpy
    arrays and torch tensors ``writes`` names for them (by position from 0, and by keyword):
    those are marked ``grading.remote.writes`` for each call. The grader copies back into the
    judge's arrays only what a call marks as its outputs, and fails a call that changed any
    other array or tensor it was given (``LearnerWroteAnInput``): a function that rewrote an
    input the test then hands to its oracle (zero the query, and every softmax is uniform)
    would be compared with an expectation it chose.
    """
    return _ReadingOnly(module, writes or {})


# -- snapshots -----------------------------------------------------------------------------------
_helpers: weakref.WeakKeyDictionary[Any, dict[str, Any]] = weakref.WeakKeyDictionary()


def learner_helper(name: str, owner: Any = None) -> Any | None:
    """``learner_side.<name>`` in the learner process, or None if this suite's has none.

    With ``owner`` (a proxy the helper will be called on), the answer is remembered for as long
    as that proxy lives, which is within one test: the next snapshot of it costs one request.
    """
    from grading.remote import Remote
    from grading.suite import learner_module

    known = _helpers.get(owner) if isinstance(owner, Remote) else None
    if known is not None and name in known:
        return known[name]
    try:
        helper = getattr(learner_module("learner_side"), name)
    except (ImportError, AttributeError):  # learner errors are instances of these builtins
        helper = None
    if isinstance(owner, Remote):
        _helpers.setdefault(owner, {})[name] = helper
    return helper


def queue_snapshot(queue: Any, limit: int = 100_000) -> dict[str, Any]:
    """The free queue as data: ids and identity keys walking both ways, and its counter."""
    helper = learner_helper("queue_snapshot", queue)
    if helper is None:
        hold: list[Any] = []  # keeps the proxies, and so their identity keys, alive
        return {**invariants.queue_snapshot(queue, limit, hold), "_hold": hold}
    return _snapshot_dict(helper(queue, limit), "queue snapshot")


def pool_snapshot(pool: Any, hashes: bool = False) -> dict[str, Any]:
    """The pool as data: every block's id, ref_cnt, links and (if asked) hash, and its queue."""
    helper = learner_helper("pool_snapshot", pool)
    if helper is None:
        hold: list[Any] = []
        return {**invariants.pool_snapshot(pool, hashes, hold=hold), "_hold": hold}
    return _snapshot_dict(helper(pool, hashes), "pool snapshot")


def _snapshot_dict(data: Any, what: str) -> dict[str, Any]:
    if type(data) is not dict:
        raise AssertionError(f"the {what} came back as {describe(data)}, not as data")
    return data


# -- the invariants (stated in mini_vllm/teaching/invariants.py) ---------------------------------
def check_queue(queue: Any, limit: int = 100_000) -> list[int]:
    """Invariant I2: a consistent doubly linked list whose length is ``num_free_blocks``.

    Returns the free block ids, front to back.
    """
    return check_queue_snapshot(queue_snapshot(queue, limit), limit)


def check_pool(pool: Any) -> list[int]:
    """Invariants I1 and I2 on a block pool; returns the free block ids, front to back."""
    return check_pool_snapshot(pool_snapshot(pool))


# -- timing --------------------------------------------------------------------------------------
def timed_call(fn: Callable[..., Any], *args: Any) -> tuple[float, Any]:
    """``fn(*args)`` (one request to the learner process) and the seconds it took, here."""
    t0 = time.perf_counter()
    result = fn(*args)
    return time.perf_counter() - t0, result


def best_time(step: Callable[[], float | None], repeat: int = 3, budget: float = 2.0) -> float:
    """The least time of up to ``repeat`` runs of ``step``, measured in the judge.

    ``step()`` may return the seconds it wants counted (its one request, timed with
    :func:`timed_call`, leaving out its own preparation and checks); if it returns None, the
    whole call is timed. Noise only ever adds time, so the least is the estimate; runs stop
    early once ``budget`` seconds are spent (an O(n) operation on a big structure is slow
    every time).
    """
    best = float("inf")
    start = time.perf_counter()
    for _ in range(repeat):
        t0 = time.perf_counter()
        counted = step()
        elapsed = time.perf_counter() - t0 if counted is None else counted
        best = min(best, elapsed)
        if time.perf_counter() - start > budget:
            break
    return best


class _Link:
    __slots__ = ("next", "prev")


#: A batch on the big structure may take at most this many times what the judge itself takes
#: for 1,000 plain relinks (:func:`judge_relink_time`). The reference's slowest batch takes
#: about 125 times that, round trips included; an O(n) one on 200,000 blocks, thousands.
CEILING_FACTOR = 1000


def judge_seconds(step: Callable[[], Any], repeat: int = 3) -> float:
    """The least CPU time of ``repeat`` runs of ``step`` in the judge: a yardstick.

    CPU time of the judge's own thread, not wall time: the learner's processes share the
    machine's CPUs (there is no cgroup), and processes it leaves running, or starts just before
    its request returns, could slow the judge's clock and raise every ceiling made from it (a
    red-team helper did, to pass lab-10's cost test with a quadratic detokenizer). They cannot
    add to the CPU time this thread spends.
    """
    best = float("inf")
    for _ in range(repeat):
        t0 = time.thread_time()
        step()
        best = min(best, time.thread_time() - t0)
    return best


def judge_relink_time(ops: int = 1_000) -> float:
    """Seconds of CPU this machine takes, here in the judge, for ``ops`` O(1) moves (pop the
    front, link it at the back) on a plain Python doubly linked list; the least of three runs.

    The yardstick for :func:`assert_constant_time`'s ceiling: measured where the learner's code
    cannot run, in CPU time (:func:`judge_seconds`), so nothing it does moves it.
    """
    nodes = [_Link() for _ in range(ops + 2)]
    best = float("inf")
    for _ in range(3):
        for a, b in itertools.pairwise(nodes):
            a.next, b.prev = b, a
        head, tail = nodes[0], nodes[-1]
        t0 = time.thread_time()
        for _ in range(ops):
            node = head.next
            head.next, node.next.prev = node.next, head
            last = tail.prev
            last.next, node.prev, node.next, tail.prev = node, last, tail, node
        best = min(best, time.thread_time() - t0)
    return best


def assert_constant_time(
    op_name: str,
    run_ops: Callable[[int], Callable[[], float | None]],
    small: int = 2_000,
    big: int = 200_000,
    max_ratio: float = 12.0,
) -> None:
    """Time the same batch of operations on a small and a 100x larger structure.

    ``run_ops(n)`` returns a step for a structure of ``n`` blocks (see :func:`best_time`): it
    runs one fixed-size batch of operations in one request and returns the seconds that
    request took, having checked what the batch returned. An O(1) operation costs about the
    same on both sizes; an O(n) one costs ~100x more on the big one.

    The ratio compares the learner's code with itself, so code that is slow on purpose on the
    small structure (it knows its size) could hide an O(n) operation behind it. So the big
    batch must also stay under a ceiling measured in the judge (:data:`CEILING_FACTOR` times
    :func:`judge_relink_time`, at least 50 ms), which nothing in the learner process can move.
    """
    t_small = best_time(run_ops(small))
    t_big = best_time(run_ops(big))
    assert_cost_does_not_grow(
        t_small,
        t_big,
        lambda ratio, ceiling: (
            f"I2 (O(1) operations): {op_name} took {t_big * 1e3:.1f} ms on {big:,} blocks vs "
            f"{t_small * 1e3:.1f} ms on {small:,} blocks ({ratio:.0f}x for 100x more blocks; "
            f"at most {max_ratio:g}x, and {ceiling * 1e3:.0f} ms on this machine): "
            "it walks the list or copies it instead of relinking neighbours"
        ),
        max_ratio,
    )


def assert_cost_does_not_grow(
    t_small: float,
    t_big: float,
    explain: Callable[[float, float], str],
    max_ratio: float = 12.0,
    ceiling: float | None = None,
) -> None:
    """The rule of :func:`assert_constant_time` for two times the test measured itself (the
    same work beside a small and a 100x larger structure, each :func:`best_time`): the big one
    is at most ``max_ratio`` times the small one (or under 50 ms, where noise dominates), and
    under a ceiling measured in the judge: ``ceiling`` where the test timed a yardstick of its
    own (the reference doing the same work), else :data:`CEILING_FACTOR` plain relinks, at
    least 50 ms. ``explain(ratio, ceiling)`` is the failure's message."""
    ratio = t_big / max(t_small, 1e-6)
    if ceiling is None:
        ceiling = max(0.05, CEILING_FACTOR * judge_relink_time())
    if (ratio > max_ratio and t_big > 0.05) or t_big > ceiling:
        raise AssertionError(explain(ratio, ceiling))


def assert_error_names(error: BaseException, call: str, *names: object) -> None:
    """A misuse error's message says what was wrong: it is not empty, and it names each of
    ``names`` (a block id, a count, a size) as a word of its own."""
    message = str(error)
    missing = [
        name
        for name in names
        if not re.search(rf"(?<![\w.]){re.escape(str(name))}(?![\w.])", message)
    ]
    assert message.strip() and not missing, (
        f"{call} raised {exception_name(error)}({message!r}): the message must say what was "
        f"wrong{', naming ' + ' and '.join(map(str, names)) if names else ''} (the misuse table: "
        "a message naming the block and what was wrong)"
    )


def exception_name(exc: BaseException) -> str:
    """The short type name of an exception, the learner's own where it came from their code."""
    return (getattr(exc, "learner_type", "") or type(exc).__name__).rsplit(".", 1)[-1]


def assert_value_error(
    what: str,
    call: Callable[[], Any],
    why: str = "",
    describe: Callable[[Any], str] | None = None,
) -> None:
    """``call()`` must raise ValueError; any other exception, or a return, fails, naming ``what``
    and the learner's exception type (and, when given, ``why`` it is the caller's bug and
    ``describe`` of what was returned instead). A judge-side ``NotImplementedError`` (a stub
    helper the suite needs) passes through: it means NOT STARTED, not a wrong error.

    Only a ValueError that a call in the learner process raised counts: one raised while an
    argument of ``call`` was read from a learner object (``blocks[:1]``, ``hits.blocks``), or
    by the judge itself, is no refusal (tests/hostile/refuse_when_an_argument_is_read.py)."""
    because = f": {why}" if why else ""
    try:
        result = call()
    except NotImplementedError:
        raise
    except ValueError as exc:
        request = getattr(exc, "request", "")
        if request in ("call", "callmethod"):
            return
        raise AssertionError(
            f"{what} must raise ValueError when called; the ValueError ({exc}) came "
            + (f"from a {request} request to your code" if request else "from the test itself")
            + " (reading an attribute or an item, not the call itself), which is no refusal"
            + because
        ) from None
    except Exception as exc:
        raise AssertionError(
            f"{what} must raise ValueError, it raised {exception_name(exc)}: {exc}{because}"
        ) from None
    got = f" {describe(result)}" if describe is not None else ""
    raise AssertionError(f"{what} must raise ValueError; it returned{got}{because}")
