"""lab-06's helpers in the learner process: they run the learner's code on objects that cannot
cross between the processes as they are, and never judge.

The grader copies this file into the learner's sandbox as the top-level module
``learner_side``; the tests reach it with ``learner_module("learner_side")``. Arrays cross by
value and arrive contiguous, so a cache that is a *view* into a larger buffer (K and V
interleaved in one allocation, as engines lay them out) has to be made here, from the buffer the
judge sends; what the learner's code left in it goes back to the judge as plain data.
"""

from __future__ import annotations

from typing import Any


def write_interleaved(buffer: Any, key: Any, value: Any, slot_mapping: Any) -> Any:
    """The learner's ``reshape_and_cache`` on the strided views ``buffer[:, 0]`` (K) and
    ``buffer[:, 1]`` (V) of ``buffer [num_blocks, 2, block_size, num_kv_heads, head_dim]``.

    Returns the buffer after the call (the return value is ``test_reshape_and_cache_returns_none``'s
    business).
    """
    import paged_attention_numpy as yours

    yours.reshape_and_cache(key, value, buffer[:, 0], buffer[:, 1], slot_mapping)
    return buffer


def slot_mapping_and_inputs(
    block_table: Any, positions: Any, block_size: int
) -> tuple[Any, Any, Any]:
    """The learner's ``compute_slot_mapping(block_table, positions, block_size)``, and the two
    input arrays as they are after the call.

    Returns ``(slots, block_table, positions)``.
    """
    import paged_attention_numpy as yours

    slots = yours.compute_slot_mapping(block_table, positions, block_size)
    return slots, block_table, positions


def _rows(array: Any) -> int:
    """How many rows ``array`` has, read by numpy's own ``shape`` descriptor (-1 for anything
    but an array): an ``ndarray`` subclass can answer ``len`` and ``.shape`` as it likes
    (tests/hostile/split_k_pieces_that_report_their_own_length.py)."""
    import numpy as np

    if not issubclass(type(array), np.ndarray):
        return -1
    shape = np.ndarray.shape.__get__(array)
    return int(shape[0]) if shape else -1


def split_k_pieces(*args: Any) -> list[Any]:
    """``[output, piece sizes, merges]`` of the learner's ``paged_attention_decode_split_k``:
    the number of keys of every ``attend_split`` call it made, and how many ``merge_splits``
    calls, counted by wrapping the module's two functions for the length of the call.

    Only the split-K call's own behaviour is recorded (the output alone cannot tell a split
    decode from a dense one: the merge is exact). A count kept here, beside the learner's code,
    is a hint for honest mistakes, not a defence: see docs/grader.md."""
    import paged_attention_numpy as yours

    pieces: list[int] = []
    merges: list[int] = []
    attend, merge = yours.attend_split, yours.merge_splits

    def counted_attend(*a: Any, **k: Any) -> Any:
        key = a[1] if len(a) > 1 else k.get("key")
        pieces.append(_rows(key))
        return attend(*a, **k)

    def counted_merge(*a: Any, **k: Any) -> Any:
        merges.append(1)
        return merge(*a, **k)

    yours.attend_split, yours.merge_splits = counted_attend, counted_merge
    try:
        output = yours.paged_attention_decode_split_k(*args)
    finally:
        yours.attend_split, yours.merge_splits = attend, merge
    return [output, pieces, len(merges)]
