"""Judge-side checks of lab-07's state snapshots (``learner_side.snapshot``, expanded).

A snapshot is plain data read from the learner process in one call; everything here runs in the
judge on that data. :func:`check_state` states the invariants I1-I3 of the block pool and the
manager's bookkeeping (each block's ref_cnt is the number of block tables holding it);
:func:`compare_states` says where the learner's state differs from the reference manager's after
the same operations. Every failure names what broke and shows both sides.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import Any


def _fail(message: str) -> None:
    raise AssertionError(message)


def _short(key: Any) -> str:
    if isinstance(key, bytes):
        return key.hex()[:12] + "…"
    return repr(key)[:40]


def _is_int(value: Any) -> bool:
    return type(value) is int


def free_queue(state: Mapping[str, Any]) -> list[int]:
    """The free queue, front (evicted first) to back, as block ids."""
    return list(state["forward"])


def table(state: Mapping[str, Any], request_id: str) -> list[int]:
    """The request's block table as block ids ([] when it has none)."""
    return list(state["tables"].get(request_id, []))


def num_free(state: Mapping[str, Any]) -> int:
    return len(state["forward"])


def check_pool_state(state: Mapping[str, Any],
                     expected_ref_cnts: Mapping[int, int] | None = None) -> None:
    """I1-I3 on a snapshot of a block pool (see ``mini_vllm.core.invariants``)."""
    n = state["num_gpu_blocks"]
    ids = state["block_id"]
    if not _is_int(n) or len(ids) != n:
        _fail(f"I1 violated: the pool has {len(ids)} blocks but num_gpu_blocks is {n!r}")
    for i, block_id in enumerate(ids):
        if not _is_int(block_id) or block_id != i:
            _fail(f"I1 violated: pool.blocks[{i}] has block_id {block_id!r}")
    if state["null"] != 0 or state["is_null"][0] is not True:
        _fail("I1 violated: the null block must be block 0 with is_null set")
    if state["linked"][0] or state["hash"][0] is not None:
        _fail("I1 violated: the null block (block 0) is linked into the free queue or cached")
    for i in range(1, n):
        if state["is_null"][i] is not False:
            _fail(f"I1 violated: block {i} is marked is_null; only block 0 may be")
    # I2: the free queue is a consistent doubly linked list.
    if state["head_prev"] or state["tail_next"]:
        _fail("I2 violated: a sentinel of the free queue links outside the list")
    forward, backward = state["forward"], state["backward"]
    for name in ("forward", "backward"):
        end = state[f"{name}_end"]
        if end == "none":
            _fail(f"I2 violated: walking {name} the free queue's links end before the other "
                  f"sentinel (after {state[name][:12]})")
        if end == "loop":
            _fail(f"I2 violated: walking {name} the free queue never reaches the other "
                  f"sentinel: the links form a cycle")
    if forward != backward:
        _fail(f"I2 violated: walking forward gives {forward[:12]} but walking backward gives "
              f"{backward[:12]}: some prev_free_block / next_free_block pair disagrees")
    if -1 in forward:
        _fail("I2 violated: the free queue links an object that is not one of the pool's blocks")
    if len(set(forward)) != len(forward):
        _fail(f"I2 violated: a block appears twice in the free queue: {forward[:12]}")
    if 0 in forward:
        _fail("I1 violated: the null block (block 0) is in the free queue")
    if state["num_free_blocks"] != len(forward) or state["get_num_free_blocks"] != len(forward):
        _fail(f"I2 violated: the free queue links {len(forward)} blocks but num_free_blocks is "
              f"{state['num_free_blocks']!r} and get_num_free_blocks() "
              f"{state['get_num_free_blocks']!r}")
    # I1: free (ref_cnt 0) exactly when in the free queue.
    in_queue = set(forward)
    for i in range(1, n):
        ref = state["ref_cnt"][i]
        if not _is_int(ref) or ref < 0:
            _fail(f"I1 violated: block {i} has ref_cnt {ref!r}")
        if (ref == 0) != (i in in_queue):
            where = "is" if i in in_queue else "is not"
            _fail(f"I1 violated: block {i} has ref_cnt {ref} and {where} in the free queue "
                  "(free blocks, and only they, belong in the queue)")
        if i not in in_queue and state["linked"][i]:
            _fail(f"I2 violated: block {i} is not in the free queue but still has links")
    if expected_ref_cnts is not None:
        for block_id, ref in expected_ref_cnts.items():
            if state["ref_cnt"][block_id] != ref:
                _fail(f"I1 violated: block {block_id} has ref_cnt {state['ref_cnt'][block_id]}, "
                      f"expected {ref}")
    # I3: the cache map and the blocks' hashes agree.
    entries = state["cache_map"]
    if entries is not None:
        filed: set[int] = set()
        for key, block_id, pos in entries:
            if pos <= 0:
                what = "the null block" if pos == 0 else "an object that is not one of the pool's"
                _fail(f"I3 violated: the cache map files {what} under {_short(key)}")
            if block_id is not None and block_id != pos:
                _fail(f"I3 violated: block {pos} is filed under block id {block_id!r}")
            if state["hash"][pos] != key:
                _fail(f"I3 violated: block {pos} is in the cache map under {_short(key)} but its "
                      f"block_hash is {_short(state['hash'][pos])}")
            if pos in filed:
                _fail(f"I3 violated: block {pos} is in the cache map twice")
            filed.add(pos)
        for i in range(1, n):
            if state["hash"][i] is not None and i not in filed:
                _fail(f"I3 violated: block {i} has block_hash {_short(state['hash'][i])} but is "
                      "not in the cache map")


def check_state(state: Mapping[str, Any],
                expected_ref_cnts: Mapping[int, int] | None = None) -> None:
    """The pool's invariants, and the manager's: every held block is counted once per table."""
    check_pool_state(state, expected_ref_cnts)
    n = state["num_gpu_blocks"]
    holders: Counter[int] = Counter()
    for rid, blocks in state["tables"].items():
        if -1 in blocks:
            _fail(f"req_to_blocks[{rid!r}] holds an object that is not one of the pool's blocks")
        if 0 in blocks:
            _fail(f"req_to_blocks[{rid!r}] = {blocks} holds the null block (block 0)")
        if len(set(blocks)) != len(blocks):
            _fail(f"req_to_blocks[{rid!r}] = {blocks} holds a block twice")
        holders.update(blocks)
    for i in range(1, n):
        ref = state["ref_cnt"][i]
        if ref != holders[i]:
            who = sorted(rid for rid, blocks in state["tables"].items() if i in blocks)
            _fail(f"I1 violated: block {i} has ref_cnt {ref} but {holders[i]} block table(s) "
                  f"hold it ({who}): every request holding a block adds exactly one reference "
                  "(touch once per claim, release once per free)")
    held = len(holders)
    if held + num_free(state) != n - 1:
        _fail(f"{held} blocks held + {num_free(state)} free != {n - 1} usable blocks: a block "
              "leaked or is counted twice")


def _first_difference(a: list[Any], b: list[Any]) -> int:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return min(len(a), len(b))


def compare_states(got: Mapping[str, Any], want: Mapping[str, Any], after: str) -> None:
    """The learner's state must be the reference's after the same operations (``after``)."""
    tables, ref_tables = got["tables"], want["tables"]
    if sorted(tables) != sorted(ref_tables):
        _fail(f"after {after}: req_to_blocks has tables for {sorted(tables)}, the reference "
              f"manager has them for {sorted(ref_tables)} (only requests holding blocks have "
              "one; free forgets the request)")
    for rid in sorted(ref_tables):
        if tables[rid] != ref_tables[rid]:
            _fail(f"after {after}: {rid}'s block table is {tables[rid]}, the reference's is "
                  f"{ref_tables[rid]}")
    if got["forward"] != want["forward"]:
        _fail(f"after {after}: the free queue (front = evicted first) is {got['forward']}, the "
              f"reference's is {want['forward']}")
    if got["ref_cnt"] != want["ref_cnt"]:
        i = _first_difference(got["ref_cnt"], want["ref_cnt"])
        _fail(f"after {after}: block {i} has ref_cnt {got['ref_cnt'][i]}, the reference's "
              f"{want['ref_cnt'][i]} (ref counts {got['ref_cnt']} vs {want['ref_cnt']})")
    if got["hash"] != want["hash"]:
        i = _first_difference(got["hash"], want["hash"])
        mine = "not cached" if got["hash"][i] is None else f"cached as {_short(got['hash'][i])}"
        ref = "not cached" if want["hash"][i] is None else f"cached as {_short(want['hash'][i])}"
        _fail(f"after {after}: block {i} is {mine}, in the reference it is {ref} (a block is "
              "published once all its tokens are computed, under its request's chained hash)")
    cached = {k: v for k, v in got["num_cached_block"].items() if v != 0}
    ref_cached = {k: v for k, v in want["num_cached_block"].items() if v != 0}
    if cached != ref_cached:
        _fail(f"after {after}: num_cached_block is {cached}, the reference's is {ref_cached} "
              "(how many leading blocks of each running request are published; free forgets "
              "the request)")
    if got["progress"] != want["progress"]:
        _fail(f"after {after}: the requests' [num_tokens, num_computed_tokens, num_preemptions] "
              f"are {got['progress']}, the reference's {want['progress']}")
