"""Checks shared by the graded suites, decided in the judge on plain data.

The learner's objects live in the learner process; a suite reaches them through proxies
(``grading/remote.py``). The checks here read the free queue and the pool as *snapshots*: plain
lists of block ids, reference counts and identity keys, taken in one request by the suite's
``learner_side.queue_snapshot`` / ``pool_snapshot`` (from ``tests/labs/learner_snapshots.py``,
staged beside each ``learner_side``), or, for a suite whose ``learner_side`` has none, by
walking the proxies (the same data, one request per attribute).
The snapshot only reads the attributes the labs define (upstream's names:
``fake_free_list_head``, ``prev_free_block``, ``ref_cnt``…), never the learner's own methods, so
a broken method cannot vouch for itself; and every verdict is taken here, on the data received:
values are compared as plain ``int`` / ``list`` after checking their types, never through a
learner object's ``__eq__``. Every failure names the invariant it broke.

Timing checks (:func:`assert_constant_time`) take the time in the judge, around one request that
runs a whole batch of operations in the learner process, and the caller checks what the batch
returned and the state it left.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable
from typing import Any

from hypothesis import HealthCheck, settings

#: Property tests are derandomized so a grade is reproducible, and unhurried on slow laptops.
GRADED_SETTINGS = settings(
    max_examples=60,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=list(HealthCheck),
)
STATEFUL_SETTINGS = settings(GRADED_SETTINGS, max_examples=40, stateful_step_count=40)

#: How a walk along the free-list links ended (the snapshot's ``*_end`` fields).
REACHED, HIT_NONE, TOO_LONG, NOT_A_BLOCK, NO_SENTINEL = (
    "sentinel", "none", "limit", "not-a-block", "no-sentinel")


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
            time.perf_counter() + left - margin)
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

    return {name for name in dir(machine)
            if getattr(getattr(machine, name, None), INVARIANT_MARKER, None) is not None}


def _drop_invariant_steps(exc: BaseException, names: set[str]) -> None:
    """Hypothesis lists each invariant check among a failing run's steps (``state.check()``);
    the learner replays the rules, so the checks are left out (``grading/messages.py`` makes
    the rest compact)."""
    for inner in [exc, *(getattr(exc, "exceptions", None) or ())]:
        notes = getattr(inner, "__notes__", None)
        if isinstance(notes, list):
            inner.__notes__ = [n for n in notes if not (
                isinstance(n, str) and n.startswith("state.")
                and n.removeprefix("state.").removesuffix("()") in names)]


# -- reading values ----------------------------------------------------------------------------
def _plain(value: Any, depth: int = 0) -> bool:
    """Whether ``value`` is built of builtin data only (so its ``repr`` runs no learner code)."""
    kind = type(value)
    if value is None or kind in (bool, int, float, str, bytes):
        return True
    if depth > 8:
        return False
    if kind in (list, tuple, set, frozenset):
        return all(_plain(v, depth + 1) for v in value)
    if kind is dict:
        return all(_plain(k, depth + 1) and _plain(v, depth + 1) for k, v in value.items())
    return False


def describe(value: Any) -> str:
    """A short, safe description of a value from the learner (never its own ``__repr__``)."""
    from grading.remote import Remote, type_name

    if isinstance(value, Remote):
        return f"a {type_name(value)} object"
    if _plain(value):
        text = repr(value)
        return text if len(text) <= 80 else text[:77] + "..."
    return f"a {type(value).__module__}.{type(value).__qualname__}"


def as_int(value: Any, what: str) -> int:
    """``value`` if it is a plain ``int`` (not a bool, not a learner object), else a failure."""
    if type(value) is not int:
        raise AssertionError(f"{what} must be a plain int, got {describe(value)}")
    return value


def int_list(values: Any, what: str) -> list[int]:
    """``values`` if it is a list of plain ints."""
    if type(values) is not list:
        raise AssertionError(f"{what} must be a list, got {describe(values)}")
    for i, value in enumerate(values):
        if type(value) is not int:
            raise AssertionError(
                f"every item of {what} must be a plain int; item {i} is {describe(value)}")
    return values


def same_data(got: Any, want: Any) -> bool:
    """``got == want`` where ``want`` is plain data (ints, floats, strings, lists, dicts…) and
    ``got`` must have the very same types: a learner object, a numpy scalar or an int subclass
    never compares equal, and no learner code takes part in the comparison."""
    if type(got) is not type(want):
        return False
    if type(want) in (list, tuple):
        return len(got) == len(want) and all(same_data(g, w) for g, w in zip(got, want))
    if type(want) is dict:
        return got.keys() == want.keys() and all(same_data(got[k], want[k]) for k in want)
    return bool(got == want)


def block_ids(blocks: Any, what: str = "a block's block_id") -> list[int]:
    """The ids of a list of (learner) blocks, each checked to be a plain int."""
    if type(blocks) is not list:
        blocks = list(blocks)  # a learner object: iterating it is one request, giving a list
    return [as_int(b.block_id, what) for b in blocks]


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


def _walk_proxies(start: Any, stop: Any, link: str, limit: int) -> tuple[list[Any], str]:
    nodes: list[Any] = []
    if start is None:
        return nodes, NO_SENTINEL
    node = getattr(start, link)
    while node is not stop:
        if node is None:
            return nodes, HIT_NONE
        if len(nodes) >= limit:
            return nodes, TOO_LONG
        nodes.append(node)
        node = getattr(node, link)
    return nodes, REACHED


def _proxy_queue_snapshot(queue: Any, limit: int) -> dict[str, Any]:
    """What ``learner_side.queue_snapshot`` returns, read one attribute per request."""
    head, tail = queue.fake_free_list_head, queue.fake_free_list_tail
    forward, forward_end = _walk_proxies(head, tail, "next_free_block", limit)
    backward, backward_end = _walk_proxies(tail, head, "prev_free_block", limit)
    backward.reverse()
    return {
        "forward": [b.block_id for b in forward], "forward_keys": [id(b) for b in forward],
        "forward_end": forward_end,
        "backward": [b.block_id for b in backward], "backward_keys": [id(b) for b in backward],
        "backward_end": backward_end,
        "num_free_blocks": queue.num_free_blocks,
        "_hold": [head, tail, forward, backward],  # keeps the proxies (and their keys) alive
    }


def queue_snapshot(queue: Any, limit: int = 100_000) -> dict[str, Any]:
    """The free queue as data: ids and identity keys walking both ways, and its counter."""
    helper = learner_helper("queue_snapshot", queue)
    if helper is None:
        return _proxy_queue_snapshot(queue, limit)
    return _snapshot_dict(helper(queue, limit), "queue snapshot")


def pool_snapshot(pool: Any, hashes: bool = False) -> dict[str, Any]:
    """The pool as data: every block's id, ref_cnt, links and (if asked) hash, and its queue."""
    helper = learner_helper("pool_snapshot", pool)
    if helper is not None:
        return _snapshot_dict(helper(pool, hashes), "pool snapshot")
    blocks = list(pool.blocks)
    null = pool.null_block
    return {
        "ids": [b.block_id for b in blocks], "keys": [id(b) for b in blocks],
        "ref_cnts": [b.ref_cnt for b in blocks],
        "linked": [b.prev_free_block is not None or b.next_free_block is not None
                   for b in blocks],
        "hashes": [b.block_hash for b in blocks] if hashes else None,
        "null_key": id(null), "null_is_null": null.is_null,
        "queue": _proxy_queue_snapshot(pool.free_block_queue, len(blocks) + 2),
        "_hold": [blocks, null],
    }


def _snapshot_dict(data: Any, what: str) -> dict[str, Any]:
    if type(data) is not dict:
        raise AssertionError(f"the {what} came back as {describe(data)}, not as data")
    return data


# -- the invariants ------------------------------------------------------------------------------
def _walk_failure(end: Any, forward: bool, limit: int) -> str | None:
    way, start, stop, link = (("forward", "head", "tail", "next_free_block") if forward else
                              ("backward", "tail", "head", "prev_free_block"))
    if end == REACHED:
        return None
    if end == HIT_NONE:
        return (f"I2 violated: walking {way} from the {start} sentinel hit None before the {stop} "
                f"sentinel (a block's {link} was not linked)")
    if end == TOO_LONG:
        return (f"I2 violated: walking {way} visited more than {limit} blocks without reaching "
                f"the {stop} sentinel: the list has a cycle")
    if end == NO_SENTINEL:
        return f"I2 violated: the queue has no {start} sentinel (fake_free_list_{start} is None)"
    if end == NOT_A_BLOCK:
        return f"I2 violated: walking {way}, a {link} points at something that is not a block"
    return f"the queue snapshot ended its {way} walk oddly ({describe(end)})"


def check_queue_snapshot(snap: dict[str, Any], limit: int = 100_000,
                         forward_only: bool = False) -> list[int]:
    """Invariant I2 on a queue snapshot; returns the free block ids, front to back."""
    problem = _walk_failure(snap.get("forward_end"), True, limit)
    if problem:
        raise AssertionError(problem)
    ids_f = int_list(snap.get("forward"), "the queued blocks' block_ids")
    keys_f = int_list(snap.get("forward_keys"), "the snapshot's keys")
    if len(set(keys_f)) != len(keys_f):
        raise AssertionError(f"I2 violated: a block appears twice in the free queue: {ids_f[:12]}")
    if forward_only:
        return ids_f
    problem = _walk_failure(snap.get("backward_end"), False, limit)
    if problem:
        raise AssertionError(problem)
    ids_b = int_list(snap.get("backward"), "the queued blocks' block_ids")
    keys_b = int_list(snap.get("backward_keys"), "the snapshot's keys")
    if ids_f != ids_b or keys_f != keys_b:
        raise AssertionError(
            f"I2 violated: walking forward gives {ids_f[:12]} but walking backward gives "
            f"{ids_b[:12]}: some prev_free_block / next_free_block pair disagrees")
    count = as_int(snap.get("num_free_blocks"), "num_free_blocks")
    if count != len(ids_f):
        raise AssertionError(
            f"I2 violated: num_free_blocks is {count} but the queue links {len(ids_f)} blocks")
    return ids_f


def check_pool_snapshot(snap: dict[str, Any]) -> list[int]:
    """Invariants I1 and I2 on a pool snapshot; returns the free block ids, front to back."""
    ids = int_list(snap.get("ids"), "the block_ids of pool.blocks")
    keys = int_list(snap.get("keys"), "the snapshot's keys")
    refs = snap.get("ref_cnts")
    linked = snap.get("linked")
    if type(refs) is not list or type(linked) is not list or not (
            len(ids) == len(keys) == len(refs) == len(linked)):
        raise AssertionError("the pool snapshot is malformed (one entry per block expected)")
    queue = snap.get("queue")
    if type(queue) is not dict:
        raise AssertionError(f"the pool snapshot's queue came back as {describe(queue)}")
    free = check_queue_snapshot(queue, len(ids) + 2)
    in_queue = set(queue["forward_keys"])
    position = {key: i for i, key in enumerate(keys)}
    foreign = [b for b, key in zip(free, queue["forward_keys"]) if key not in position]
    if foreign:
        raise AssertionError(
            f"I1 violated: the free queue holds block(s) {foreign[:8]} that are not objects of "
            "pool.blocks (a copy, or a block made elsewhere)")
    null_key = snap.get("null_key")
    if null_key in in_queue:
        raise AssertionError("I1 violated: the null block (block 0) is in the free queue")
    for i, (block_id, key, ref, links) in enumerate(zip(ids, keys, refs, linked)):
        if key == null_key:
            continue
        ref = as_int(ref, f"block {block_id}'s ref_cnt")
        if ref < 0:
            raise AssertionError(f"I1 violated: block {block_id} has ref_cnt {ref}")
        queued = key in in_queue
        if (ref == 0) != queued:
            where = "is" if queued else "is not"
            raise AssertionError(
                f"I1 violated: block {block_id} has ref_cnt {ref} and {where} in the free queue "
                "(free blocks, and only they, belong in the queue)")
        if not queued and links is not False:
            raise AssertionError(
                f"I2 violated: block {block_id} is not in the free queue but keeps a "
                "prev_free_block / next_free_block link into it (set both to None when a block "
                "leaves the queue)")
        if block_id != i:
            raise AssertionError(
                f"pool.blocks[{i}] has block_id {block_id}: blocks are kept in id order")
    return free


def check_queue(queue: Any, limit: int = 100_000) -> list[int]:
    """Invariant I2: a consistent doubly linked list whose length is ``num_free_blocks``.

    Returns the free block ids, front to back.
    """
    return check_queue_snapshot(queue_snapshot(queue, limit), limit)


def check_pool(pool: Any) -> list[int]:
    """Invariants I1 and I2 on a block pool; returns the free block ids, front to back."""
    return check_pool_snapshot(pool_snapshot(pool))


def free_ids(queue: Any, limit: int = 100_000) -> list[int]:
    """The free queue's block ids, front to back, walking forward (checked: no None, no cycle)."""
    return check_queue_snapshot(queue_snapshot(queue, limit), limit, forward_only=True)


def walk_forward(queue: Any, limit: int) -> list[Any]:
    """The blocks (proxies) from the head sentinel to the tail sentinel, refusing to loop."""
    nodes, end = _walk_proxies(queue.fake_free_list_head, queue.fake_free_list_tail,
                               "next_free_block", limit)
    problem = _walk_failure(end, True, limit)
    if problem:
        raise AssertionError(problem)
    return nodes


def walk_backward(queue: Any, limit: int) -> list[Any]:
    """The blocks (proxies) from the head to the tail, found walking back from the tail."""
    nodes, end = _walk_proxies(queue.fake_free_list_tail, queue.fake_free_list_head,
                               "prev_free_block", limit)
    problem = _walk_failure(end, False, limit)
    if problem:
        raise AssertionError(problem)
    nodes.reverse()
    return nodes


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


def assert_constant_time(op_name: str, run_ops: Callable[[int], Callable[[], float | None]],
                         small: int = 2_000, big: int = 200_000, max_ratio: float = 12.0) -> None:
    """Time the same batch of operations on a small and a 100x larger structure.

    ``run_ops(n)`` returns a step for a structure of ``n`` blocks (see :func:`best_time`): it
    runs one fixed-size batch of operations in one request and returns the seconds that
    request took, having checked what the batch returned. An O(1) operation costs about the
    same on both sizes; an O(n) one costs ~100x more on the big one.
    """
    t_small = best_time(run_ops(small))
    t_big = best_time(run_ops(big))
    ratio = t_big / max(t_small, 1e-6)
    if ratio > max_ratio and t_big > 0.05:
        raise AssertionError(
            f"I2 (O(1) operations): {op_name} took {t_big * 1e3:.1f} ms on {big:,} blocks vs "
            f"{t_small * 1e3:.1f} ms on {small:,} blocks ({ratio:.0f}x for 100x more blocks): "
            "it walks the list or copies it instead of relinking neighbours")
