"""Judge-side checks of lab-07's state snapshots (``learner_side.snapshot``, expanded).

A snapshot is plain data read from the learner process in one call; everything here runs in the
judge on that data. :func:`check_state` checks the invariants I1-I3 of the block pool (stated in
``mini_vllm/teaching/invariants.py``, shared by every suite) and the manager's bookkeeping (each
block's ref_cnt is the number of block tables holding it); :func:`compare_states` says where
the learner's state differs from the reference manager's after the same operations. Every
failure names what broke and shows both sides.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import Any

from mini_vllm.teaching.invariants import check_pool_snapshot, describe, same_data


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


def as_pool_snapshot(state: Mapping[str, Any]) -> dict[str, Any]:
    """The pool part of a state, in the shape ``check_pool_snapshot`` reads.

    lab-07's snapshot names every block by its position in ``pool.blocks`` (found by identity in
    the learner process, -1 for an object that is not one of them), so the positions serve as
    the identity keys; each -1 gets a key of its own that no block has.
    """
    ids = state["block_id"]
    n = len(ids) if type(ids) is list else 0

    def key(pos: Any, other: int) -> Any:
        return pos if _is_int(pos) and 0 <= pos < n else -1 - other

    def walk(positions: Any) -> tuple[list[Any], list[Any]]:
        if type(positions) is not list:
            return positions, positions  # the judge refuses it as malformed
        keys = [key(pos, i) for i, pos in enumerate(positions)]
        return [ids[k] if k >= 0 else -1 for k in keys], keys

    forward, forward_keys = walk(state["forward"])
    backward, backward_keys = walk(state["backward"])
    null = key(state["null"], 1 << 40)  # keys of objects not in pool.blocks: all distinct

    def cache_entry(entry: Any) -> Any:
        if type(entry) is not list or len(entry) != 3:
            return entry  # the judge refuses it as malformed
        cache_key, filed_under, pos = entry
        k = key(pos, 1 << 41)
        return [cache_key, filed_under, k, ids[k] if k >= 0 else None]

    entries = state["cache_map"]
    if type(entries) is list:
        entries = [cache_entry(entry) for entry in entries]
    is_null = state["is_null"]
    return {
        "ids": ids,
        "keys": list(range(n)),
        "ref_cnts": state["ref_cnt"],
        "is_null": is_null,
        "linked": state["linked"],
        "hashes": state["hash"],
        "num_gpu_blocks": state["num_gpu_blocks"],
        "null_key": null,
        "null_is_null": is_null[null] if null >= 0 and type(is_null) is list else None,
        "queue": {
            "forward": forward,
            "forward_keys": forward_keys,
            "forward_end": state["forward_end"],
            "backward": backward,
            "backward_keys": backward_keys,
            "backward_end": state["backward_end"],
            "head_prev": state["head_prev"],
            "tail_next": state["tail_next"],
            "num_free_blocks": state["num_free_blocks"],
        },
        "cache_map": entries,
    }


def check_pool_state(
    state: Mapping[str, Any], expected_ref_cnts: Mapping[int, int] | None = None
) -> None:
    """I1-I3 on a snapshot of a block pool, as ``mini_vllm.teaching.invariants`` states them,
    and the pool's own counter ``get_num_free_blocks()``."""
    free = check_pool_snapshot(as_pool_snapshot(state), expected_ref_cnts=expected_ref_cnts)
    if not same_data(state["get_num_free_blocks"], len(free)):
        _fail(
            f"I2 violated: the free queue links {len(free)} blocks but get_num_free_blocks() "
            f"is {describe(state['get_num_free_blocks'])}"
        )


def check_state(
    state: Mapping[str, Any], expected_ref_cnts: Mapping[int, int] | None = None
) -> None:
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
            _fail(
                f"I1 violated: block {i} has ref_cnt {ref} but {holders[i]} block table(s) "
                f"hold it ({who}): every request holding a block adds exactly one reference "
                "(touch once per claim, release once per free)"
            )
    held = len(holders)
    if held + num_free(state) != n - 1:
        _fail(
            f"{held} blocks held + {num_free(state)} free != {n - 1} usable blocks: a block "
            "leaked or is counted twice"
        )


def _first_difference(a: list[Any], b: list[Any]) -> int:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return min(len(a), len(b))


def visible(state: Mapping[str, Any], key: str) -> Any:
    """One part of a state as the contract sees it: a ``num_cached_block`` entry of 0 is no
    entry (upstream records 0 for a new request that has published nothing yet)."""
    if key == "num_cached_block":
        return {rid: n for rid, n in state[key].items() if n != 0}
    return state[key]


def compare_states(got: Mapping[str, Any], want: Mapping[str, Any], after: str) -> None:
    """The learner's state must be the reference's after the same operations (``after``)."""
    tables, ref_tables = got["tables"], want["tables"]
    if sorted(tables) != sorted(ref_tables):
        _fail(
            f"after {after}: req_to_blocks has tables for {sorted(tables)}, the reference "
            f"manager has them for {sorted(ref_tables)} (only requests holding blocks have "
            "one; free forgets the request)"
        )
    for rid in sorted(ref_tables):
        if tables[rid] != ref_tables[rid]:
            _fail(
                f"after {after}: {rid}'s block table is {tables[rid]}, the reference's is "
                f"{ref_tables[rid]}"
            )
    if got["forward"] != want["forward"]:
        _fail(
            f"after {after}: the free queue (front = evicted first) is {got['forward']}, the "
            f"reference's is {want['forward']}"
        )
    if got["ref_cnt"] != want["ref_cnt"]:
        i = _first_difference(got["ref_cnt"], want["ref_cnt"])
        _fail(
            f"after {after}: block {i} has ref_cnt {got['ref_cnt'][i]}, the reference's "
            f"{want['ref_cnt'][i]} (ref counts {got['ref_cnt']} vs {want['ref_cnt']})"
        )
    if got["hash"] != want["hash"]:
        i = _first_difference(got["hash"], want["hash"])
        mine = "not cached" if got["hash"][i] is None else f"cached as {_short(got['hash'][i])}"
        ref = "not cached" if want["hash"][i] is None else f"cached as {_short(want['hash'][i])}"
        _fail(
            f"after {after}: block {i} is {mine}, in the reference it is {ref} (a block is "
            "published once all its tokens are computed, under its request's chained hash)"
        )
    cached = visible(got, "num_cached_block")
    ref_cached = visible(want, "num_cached_block")
    if cached != ref_cached:
        _fail(
            f"after {after}: num_cached_block is {cached}, the reference's is {ref_cached} "
            "(how many leading blocks of each running request are published; free forgets "
            "the request)"
        )
    if got["progress"] != want["progress"]:
        _fail(
            f"after {after}: the requests' [num_tokens, num_computed_tokens, num_preemptions] "
            f"are {got['progress']}, the reference's {want['progress']}"
        )
