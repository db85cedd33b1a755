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


def write_interleaved(buffer: Any, key: Any, value: Any, slot_mapping: Any) -> tuple[Any, Any]:
    """The learner's ``reshape_and_cache`` on the strided views ``buffer[:, 0]`` (K) and
    ``buffer[:, 1]`` (V) of ``buffer [num_blocks, 2, block_size, num_kv_heads, head_dim]``.

    Returns ``(buffer after the call, what the call returned)``.
    """
    import paged_attention_numpy as yours

    result = yours.reshape_and_cache(key, value, buffer[:, 0], buffer[:, 1], slot_mapping)
    return buffer, result


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
