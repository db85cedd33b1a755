"""The block pool's invariants I1-I4 as code, written once for every caller (see CONTRIBUTING.md).

The reference's tests, the simulator and the notebooks check pools in their own process; the
graded suites check a learner's pool that lives in a sandboxed process and must never be
trusted to judge itself. So the checks come in two halves. *Reading* (:func:`queue_snapshot`,
:func:`pool_snapshot`) turns a free queue or a pool into plain data: block ids, identity keys,
ref counts, whether a block keeps a link, how each walk of the links ended, and, if asked, the
hashes and the cache map. It reads only upstream's attribute names (``fake_free_list_head``,
``prev_free_block``, ``ref_cnt``, ``cached_block_hash_to_block``...), never a method, so a broken
method cannot vouch for itself, and it decides nothing: the graded suites run it in the
learner's process (their ``learner_side`` imports it). *Judging* (:func:`check_queue_snapshot`,
:func:`check_pool_snapshot`) runs wherever the verdict is taken, on that data alone: values are
compared as plain ``int``, ``bytes`` and ``list`` after their types are checked, never through an
object's own ``__eq__``. :func:`check_free_queue` and :func:`check_block_pool` do both in one call
for objects in this process.

Every failure is an ``AssertionError`` whose message starts with the invariant's name and says
which block broke it, so that a learner sees *what* is wrong, not just *that* something is. What
a static snapshot cannot show is checked against a model the caller keeps: the order the free
queue should have (I4: LRU, tail of a request first), the hash each block should carry (I3: the
hash of parent and tokens; I4: in-use blocks keep it, reused blocks lose it) and the reference
counts. The checks walk every block, O(num_gpu_blocks) per call: use them on small pools.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = [
    "as_int",
    "check_block_pool",
    "check_free_queue",
    "check_pool_snapshot",
    "check_queue_snapshot",
    "describe",
    "int_list",
    "pool_snapshot",
    "queue_snapshot",
    "same_data",
    "walk_links",
]

#: How a walk along the free-list links ended (a snapshot's ``forward_end``/``backward_end``).
REACHED, HIT_NONE, TOO_LONG, NOT_A_BLOCK, NO_SENTINEL = (
    "sentinel",
    "none",
    "limit",
    "not-a-block",
    "no-sentinel",
)
_MISSING = object()


# -- reading: objects to plain data (no verdicts) --------------------------------------------------
def walk_links(start: Any, stop: Any, link: str, limit: int) -> tuple[list[Any], str]:
    """The nodes from ``start``'s ``link`` up to ``stop`` (exclusive), and how the walk ended
    (``REACHED``, ``HIT_NONE``, ``TOO_LONG`` after ``limit`` nodes, ``NOT_A_BLOCK``...)."""
    nodes: list[Any] = []
    if start is None:
        return nodes, NO_SENTINEL
    node = getattr(start, link, _MISSING)
    while node is not stop:
        if node is None:
            return nodes, HIT_NONE
        if node is _MISSING:
            return nodes, NOT_A_BLOCK
        if len(nodes) >= limit:
            return nodes, TOO_LONG
        nodes.append(node)
        node = getattr(node, link, _MISSING)
    return nodes, REACHED


def queue_snapshot(
    queue: Any, limit: int = 100_000, hold: list[Any] | None = None
) -> dict[str, Any]:
    """A free queue's links as data.

    Block ids and identity keys (``id``) walking forward from the head sentinel and backward from
    the tail sentinel (both listed front to back), how each walk ended, whether a sentinel links
    outside the list, and the ``num_free_blocks`` counter. A walk stops after ``limit`` blocks (a
    cycle). Identity keys are only meaningful while the objects live: a caller whose objects may
    be temporary (the grader's proxies) passes ``hold``, which keeps them.
    """
    head = getattr(queue, "fake_free_list_head", None)
    tail = getattr(queue, "fake_free_list_tail", None)
    forward, forward_end = walk_links(head, tail, "next_free_block", limit)
    backward, backward_end = walk_links(tail, head, "prev_free_block", limit)
    backward.reverse()
    if hold is not None:
        hold += [head, tail, forward, backward]
    return {
        "forward": [getattr(b, "block_id", None) for b in forward],
        "forward_keys": [id(b) for b in forward],
        "forward_end": forward_end,
        "backward": [getattr(b, "block_id", None) for b in backward],
        "backward_keys": [id(b) for b in backward],
        "backward_end": backward_end,
        "head_prev": head is not None and getattr(head, "prev_free_block", None) is not None,
        "tail_next": tail is not None and getattr(tail, "next_free_block", None) is not None,
        "num_free_blocks": getattr(queue, "num_free_blocks", None),
    }


def _cache_entries(pool: Any, hold: list[Any] | None) -> list[list[Any]] | None:
    """``[key, filed under block id (or None), block's identity key, block's id]`` for every block
    of the pool's cache map (``[key, None, None, None]`` for a key that maps to no block), or None
    when the pool has no readable map (upstream's ``BlockHashToBlockMap._cache``)."""
    raw = getattr(getattr(pool, "cached_block_hash_to_block", None), "_cache", None)
    if not isinstance(raw, dict):
        return None
    entries: list[list[Any]] = []
    for key, value in raw.items():
        filed = list(value.items()) if isinstance(value, dict) else [(None, value)]
        if not filed:
            entries.append([key, None, None, None])
        for filed_under, block in filed:
            entries.append([key, filed_under, id(block), getattr(block, "block_id", None)])
            if hold is not None:
                hold.append(block)
    return entries


def pool_snapshot(
    pool: Any, hashes: bool = False, cache_map: bool = False, hold: list[Any] | None = None
) -> dict[str, Any]:
    """A block pool as data: every block of ``pool.blocks`` (id, identity key, ref_cnt, is_null,
    whether it keeps a free-list link, its hash if ``hashes``), ``num_gpu_blocks``, the null
    block's key, the free queue (:func:`queue_snapshot`) and, if ``cache_map``, the cache map's
    entries. ``hold`` as in :func:`queue_snapshot`."""
    blocks = list(pool.blocks)
    null = getattr(pool, "null_block", None)
    if hold is not None:
        hold += [blocks, null]
    return {
        "ids": [getattr(b, "block_id", None) for b in blocks],
        "keys": [id(b) for b in blocks],
        "ref_cnts": [getattr(b, "ref_cnt", None) for b in blocks],
        "is_null": [getattr(b, "is_null", None) for b in blocks],
        "linked": [
            getattr(b, "prev_free_block", None) is not None
            or getattr(b, "next_free_block", None) is not None
            for b in blocks
        ],
        "hashes": [getattr(b, "block_hash", None) for b in blocks] if hashes else None,
        "num_gpu_blocks": getattr(pool, "num_gpu_blocks", None),
        "null_key": id(null),
        "null_is_null": getattr(null, "is_null", None),
        "queue": queue_snapshot(getattr(pool, "free_block_queue", None), len(blocks) + 2, hold),
        "cache_map": _cache_entries(pool, hold) if cache_map else None,
    }


# -- reading values without trusting them ----------------------------------------------------------
def _plain(value: Any, depth: int = 0) -> bool:
    """Whether ``value`` is built of builtin data only (so its ``repr`` runs no foreign code)."""
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
    """A short, safe description of a value from the learner (never its own ``__repr__``).

    A proxy of the grader (an object living in the learner's process) is named by its type
    there; the grader is looked up only if it is already loaded, so nothing here depends on it.
    """
    remote = sys.modules.get("grading.remote")
    if remote is not None and isinstance(value, remote.Remote):
        return f"a {remote.type_name(value)} object"
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
                f"every item of {what} must be a plain int; item {i} is {describe(value)}"
            )
    return values


def plain_data(value: Any, what: str) -> Any:
    """``value`` if it is builtin data all the way down (``str``, ``int``, ``float``, ``bool``,
    ``None``, ``bytes``, lists, tuples and dicts of them, exact types), else a failure.

    A value of a learner's own class (a ``str`` subclass included) reaches the judge as an
    object living in the learner's process, whose ``in``, truth and methods run learner code:
    a check such as ``"\ufffd" not in text`` would let that code answer. Read what the
    learner returns through this first, and no learner code takes part in the checks after."""
    kind = type(value)
    if value is None or kind in (bool, int, float, str, bytes):
        return value
    if kind in (list, tuple):
        for i, item in enumerate(value):
            plain_data(item, f"{what}[{i}]")
        return value
    if kind is dict:
        for key, item in value.items():
            plain_data(key, f"a key of {what}")
            plain_data(item, f"{what}[{describe(key)}]")
        return value
    raise AssertionError(
        f"{what} must be plain data (str, int, float, list, dict ...), got {describe(value)}: "
        "return the value itself, not an object of a class of your own"
    )


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


def _hash(key: Any) -> str:
    if type(key) is bytes:
        return key.hex()[:16] + "..."
    return describe(key)


# -- judging: plain data to a verdict --------------------------------------------------------------
def _walk_failure(end: Any, forward: bool, limit: int, last: Any) -> str | None:
    """What a walk's end says is wrong, or None. ``last`` is the id of the last block reached."""
    way, start, stop, link = (
        ("forward", "head", "tail", "next_free_block")
        if forward
        else ("backward", "tail", "head", "prev_free_block")
    )
    if end == REACHED:
        return None
    if end == HIT_NONE:
        where = f"the {start} sentinel" if last is _MISSING else f"block {describe(last)}"
        return (
            f"I2 violated: walking {way} from the {start} sentinel hit None before the {stop} "
            f"sentinel (a block's {link} was not linked: the walk reached {where}, whose "
            f"{link} is None)"
        )
    if end == TOO_LONG:
        return (
            f"I2 violated: walking {way} visited more than {limit} blocks without reaching "
            f"the {stop} sentinel: the list has a cycle"
        )
    if end == NO_SENTINEL:
        return f"I2 violated: the queue has no {start} sentinel (fake_free_list_{start} is None)"
    if end == NOT_A_BLOCK:
        return f"I2 violated: walking {way}, a {link} points at something that is not a block"
    return f"the queue snapshot ended its {way} walk oddly ({describe(end)})"


def _first_broken_pair(
    ids_f: list[int], keys_f: list[int], ids_b: list[int], keys_b: list[int]
) -> str:
    """Where the two walks part, told as the one link that does not point back.

    Both lists run front to back; walking the backward one from its end retraces the forward
    walk until some block's ``prev_free_block`` names another block than the one whose
    ``next_free_block`` leads to it.
    """
    f_ids, f_keys = ids_f[::-1], keys_f[::-1]
    b_ids, b_keys = ids_b[::-1], keys_b[::-1]
    j = 0
    while j < len(f_keys) and j < len(b_keys) and f_keys[j] == b_keys[j]:
        j += 1
    if j == len(f_keys) == len(b_keys):
        return "the same blocks gave different block_ids on two reads"
    after = "the tail sentinel" if j == 0 else f"block {f_ids[j - 1]}"
    if j < len(b_keys) and j < len(f_keys):
        return (
            f"{after}'s prev_free_block is block {b_ids[j]}, but walking forward block "
            f"{f_ids[j]} comes before it"
        )
    if j < len(f_keys):
        return (
            f"{after}'s prev_free_block is the head sentinel, but walking forward block "
            f"{f_ids[j]} comes before it"
        )
    return (
        f"{after}'s prev_free_block is block {b_ids[j]}, but walking forward it comes first "
        "(the head sentinel's next_free_block)"
    )


def check_queue_snapshot(
    snap: dict[str, Any], limit: int = 100_000, forward_only: bool = False
) -> list[int]:
    """I2 on a queue snapshot: a consistent doubly linked list between two sentinels, walking
    forward and backward visits the same blocks, each once, and their number is
    ``num_free_blocks``. Returns the free block ids, front to back (walking forward only, without
    the rest of I2, if ``forward_only``)."""
    if type(snap) is not dict:
        raise AssertionError(f"the queue snapshot came back as {describe(snap)}, not as data")
    ids_f = int_list(snap.get("forward"), "the queued blocks' block_ids")
    problem = _walk_failure(snap.get("forward_end"), True, limit, ids_f[-1] if ids_f else _MISSING)
    if problem:
        raise AssertionError(problem)
    keys_f = int_list(snap.get("forward_keys"), "the snapshot's keys")
    if len(set(keys_f)) != len(keys_f):
        raise AssertionError(f"I2 violated: a block appears twice in the free queue: {ids_f[:12]}")
    if forward_only:
        return ids_f
    ids_b = int_list(snap.get("backward"), "the queued blocks' block_ids")
    problem = _walk_failure(snap.get("backward_end"), False, limit, ids_b[0] if ids_b else _MISSING)
    if problem:
        raise AssertionError(problem)
    keys_b = int_list(snap.get("backward_keys"), "the snapshot's keys")
    if ids_f != ids_b or keys_f != keys_b:
        raise AssertionError(
            f"I2 violated: walking forward gives {ids_f[:12]} but walking backward gives "
            f"{ids_b[:12]}: some prev_free_block / next_free_block pair disagrees "
            f"({_first_broken_pair(ids_f, keys_f, ids_b, keys_b)})"
        )
    if snap.get("head_prev") is True:
        raise AssertionError(
            "I2 violated: the head sentinel has a prev_free_block; nothing comes before the head"
        )
    if snap.get("tail_next") is True:
        raise AssertionError(
            "I2 violated: the tail sentinel has a next_free_block; nothing comes after the tail"
        )
    count = as_int(snap.get("num_free_blocks"), "num_free_blocks")
    if count != len(ids_f):
        raise AssertionError(
            f"I2 violated: num_free_blocks is {count} but the queue links {len(ids_f)} blocks"
        )
    return ids_f


def check_pool_snapshot(
    snap: dict[str, Any],
    expected_free_order: Sequence[int] | None = None,
    expected_block_hashes: Mapping[int, bytes | None] | None = None,
    expected_ref_cnts: Mapping[int, int] | None = None,
) -> list[int]:
    """I1 and I2 on a pool snapshot, I3 where it holds the hashes and the cache map, and I3/I4
    against the caller's model where one is given. Returns the free block ids, front to back.

    Args:
        snap: What :func:`pool_snapshot` returned.
        expected_free_order: Block ids the free queue should hold, front (evicted first) to back.
        expected_block_hashes: For some or all block ids, the cache key (block hash with group
            id) the block should carry, or None if it should not be cached (needs the hashes).
        expected_ref_cnts: For some or all block ids, the reference count the block should have.
    """
    if type(snap) is not dict:
        raise AssertionError(f"the pool snapshot came back as {describe(snap)}, not as data")
    ids = int_list(snap.get("ids"), "the block_ids of pool.blocks")
    keys = int_list(snap.get("keys"), "the snapshot's keys")
    refs, linked = snap.get("ref_cnts"), snap.get("linked")
    is_null, hashes = snap.get("is_null"), snap.get("hashes")
    if (
        type(refs) is not list
        or type(linked) is not list
        or type(is_null) is not list
        or not (len(ids) == len(keys) == len(refs) == len(linked) == len(is_null))
        or (hashes is not None and (type(hashes) is not list or len(hashes) != len(ids)))
    ):
        raise AssertionError("the pool snapshot is malformed (one entry per block expected)")
    count = as_int(snap.get("num_gpu_blocks"), "num_gpu_blocks")
    if count != len(ids):
        raise AssertionError(
            f"I1 violated: the pool has {len(ids)} blocks but num_gpu_blocks is {count}"
        )

    # I1: the null block is block 0, marked, never linked, never cached; no other is marked.
    null_key = snap.get("null_key")
    if not ids or null_key != keys[0] or snap.get("null_is_null") is not True:
        raise AssertionError(
            "I1 violated: the null block must be block 0 (pool.blocks[0]) with is_null set"
        )
    if linked[0] is not False:
        raise AssertionError("I1 violated: the null block (block 0) is linked into the free queue")
    if hashes is not None and hashes[0] is not None:
        raise AssertionError(
            "I1 violated: the null block (block 0) has a hash; it must never be cached"
        )

    # I2: the free queue's structure.
    queue = snap.get("queue")
    if type(queue) is not dict:
        raise AssertionError(f"the pool snapshot's queue came back as {describe(queue)}")
    free = check_queue_snapshot(queue, len(ids) + 2)

    # I1: in the free queue if and only if ref_cnt == 0.
    in_queue = set(queue["forward_keys"])
    position = {key: i for i, key in enumerate(keys)}
    foreign = [b for b, key in zip(free, queue["forward_keys"]) if key not in position]
    if foreign:
        raise AssertionError(
            f"I1 violated: the free queue holds block(s) {foreign[:8]} that are not objects of "
            "pool.blocks (a copy, or a block made elsewhere)"
        )
    if null_key in in_queue:
        raise AssertionError("I1 violated: the null block (block 0) is in the free queue")
    for i, (block_id, key, ref, links, null) in enumerate(zip(ids, keys, refs, linked, is_null)):
        if key == null_key:
            continue
        if null is not False:
            raise AssertionError(
                f"I1 violated: block {block_id} has is_null {describe(null)}; "
                "only block 0 may be the null block"
            )
        ref = as_int(ref, f"block {block_id}'s ref_cnt")
        if ref < 0:
            raise AssertionError(f"I1 violated: block {block_id} has ref_cnt {ref}")
        queued = key in in_queue
        if (ref == 0) != queued:
            where = "is" if queued else "is not"
            raise AssertionError(
                f"I1 violated: block {block_id} has ref_cnt {ref} and {where} in the free queue "
                "(free blocks, and only they, belong in the queue)"
            )
        if not queued and links is not False:
            raise AssertionError(
                f"I2 violated: block {block_id} is not in the free queue but keeps a "
                "prev_free_block / next_free_block link into it (set both to None when a block "
                "leaves the queue)"
            )
        if block_id != i:
            raise AssertionError(
                f"pool.blocks[{i}] has block_id {block_id}: blocks are kept in id order"
            )
    for block_id, ref in (expected_ref_cnts or {}).items():
        if refs[block_id] != ref:
            raise AssertionError(
                f"I1 violated: block {block_id} has ref_cnt {refs[block_id]}, expected {ref}"
            )

    # I3: the cache map and the blocks' hashes agree.
    entries = snap.get("cache_map")
    if entries is not None and hashes is not None:
        _check_cache_map(entries, keys, hashes, null_key)

    # I3/I4 against the caller's model.
    for block_id, expected in (expected_block_hashes or {}).items():
        if hashes is None:
            raise AssertionError("expected_block_hashes needs a snapshot taken with hashes=True")
        actual = hashes[block_id]
        if same_data(actual, expected):
            continue
        if actual is None:
            raise AssertionError(
                f"I4 violated: block {block_id} (ref_cnt={refs[block_id]}) lost its cached hash "
                f"{_hash(expected)} although it was neither reused nor evicted"
            )
        if expected is None:
            raise AssertionError(
                f"I4 violated: block {block_id} (ref_cnt={refs[block_id]}) still carries hash "
                f"{_hash(actual)}, which should have left the cache (stale hash)"
            )
        raise AssertionError(
            f"I3 violated: block {block_id} has hash {_hash(actual)}, expected {_hash(expected)}"
        )
    if expected_free_order is not None and free != list(expected_free_order):
        raise AssertionError(
            f"I4 violated: the free queue is {free} but the eviction order (LRU, tail of a "
            f"request first) is {list(expected_free_order)}"
        )
    return free


def _check_cache_map(entries: Any, keys: list[int], hashes: list[Any], null_key: Any) -> None:
    """I3: each cached block is filed once, under its own hash; each hashed block is filed."""
    if type(entries) is not list:
        raise AssertionError(f"the pool snapshot's cache map came back as {describe(entries)}")
    position = {key: i for i, key in enumerate(keys)}
    filed: set[int] = set()
    for entry in entries:
        if type(entry) is not list or len(entry) != 4:
            raise AssertionError(f"a cache map entry came back as {describe(entry)}")
        key, filed_under, block_key, block_id = entry
        if block_key is None:
            raise AssertionError(f"I3 violated: cache key {_hash(key)} maps to no block")
        if block_key == null_key:
            raise AssertionError("I3 violated: the null block (block 0) is in the cache map")
        if block_key not in position:
            what = "an object" if block_id is None else f"block {describe(block_id)}"
            raise AssertionError(
                f"I3 violated: the cache map files {what} under {_hash(key)}, "
                "not one of the pool's blocks"
            )
        i = position[block_key]
        if filed_under is not None and not same_data(filed_under, i):
            raise AssertionError(
                f"I3 violated: block {i} is filed under block id "
                f"{describe(filed_under)} for cache key {_hash(key)}"
            )
        if not (type(key) is bytes and same_data(hashes[i], key)):
            raise AssertionError(
                f"I3 violated: block {i} is in the cache map under {_hash(key)} "
                f"but its block_hash is {_hash(hashes[i])}"
            )
        if i in filed:
            raise AssertionError(f"I3 violated: block {i} is in the cache map twice")
        filed.add(i)
    for i, block_hash in enumerate(hashes):
        if block_hash is not None and i not in filed:
            raise AssertionError(
                f"I3 violated: block {i} has block_hash {_hash(block_hash)} but "
                "is not in the cache map"
            )


# -- both at once, for objects in this process -----------------------------------------------------
def check_free_queue(queue: Any, limit: int = 100_000) -> list[int]:
    """Check I2 on a ``FreeKVCacheBlockQueue``; return its block ids, front to back."""
    return check_queue_snapshot(queue_snapshot(queue, limit), limit)


def check_block_pool(
    pool: Any,
    expected_free_order: Sequence[int] | None = None,
    expected_block_hashes: Mapping[int, bytes | None] | None = None,
    expected_ref_cnts: Mapping[int, int] | None = None,
) -> list[int]:
    """Check I1-I4 on a ``BlockPool``, optionally against a model of what it should hold
    (arguments as in :func:`check_pool_snapshot`); return the free block ids, front to back.

    Besides the snapshot, the pool's own counter ``get_num_free_blocks()`` must agree with its
    queue (the graded suites check that counter where they call it).
    """
    free = check_pool_snapshot(
        pool_snapshot(pool, hashes=True, cache_map=True),
        expected_free_order,
        expected_block_hashes,
        expected_ref_cnts,
    )
    if pool.get_num_free_blocks() != len(free):
        raise AssertionError(
            f"I2 violated: get_num_free_blocks() is {pool.get_num_free_blocks()} "
            f"but the free queue holds {len(free)} blocks"
        )
    return free
