"""lab-01's helpers in the learner process: they build, run and read back; they never judge.

The grader copies this file into the learner's sandbox as the top-level module
``learner_side``; the tests reach it with ``learner_module("learner_side")``. It runs beside the
learner's code, so nothing here decides anything: it builds what the learner's code must
receive, runs the operation sequences the tests dictate, and returns what it reads as plain
data (attribute values as they are: the judge checks their types and every invariant). It
imports only the standard library, the reference's readers below and, when called, the learner's
``block_pool``.

``queue_snapshot`` and ``pool_snapshot`` are what ``tests/labs/common.py`` asks for: the readers
of ``mini_vllm/teaching/invariants.py``, which take plain data and judge nothing (another
suite's ``learner_side`` may import them too; without, common.py walks the proxies).
"""

from __future__ import annotations

import types
from typing import Any

from mini_vllm.teaching.invariants import pool_snapshot, queue_snapshot  # noqa: F401
from mini_vllm.teaching.recording_collector import RecordingCollector


# -- building -----------------------------------------------------------------------------------
def make_queue(n: int) -> list[Any]:
    """``[blocks, queue]``: blocks 0 .. n-1 (the learner's ``KVCacheBlock``) and a queue of them."""
    import block_pool

    blocks = [block_pool.KVCacheBlock(i) for i in range(n)]
    return [blocks, block_pool.FreeKVCacheBlockQueue(blocks)]


def make_request(request_id: str, token_ids: list[int], block_hashes: list[bytes]) -> Any:
    """What ``cache_full_blocks`` reads of a request, with the hashes the judge computed."""
    return types.SimpleNamespace(
        request_id=request_id,
        block_hashes=list(block_hashes),
        all_token_ids=list(token_ids),
        num_tokens=len(token_ids),
        lora_request=None,
    )


def block_ids(blocks: Any) -> list[Any]:
    """The ``block_id`` of each block, as found."""
    return [getattr(b, "block_id", None) for b in blocks]


def make_queue_bench(n: int) -> Any:
    """Like :func:`make_queue`, kept here as one object (``.blocks``, ``.queue``), so that a
    queue of 200,000 blocks costs the judge one handle, not 200,000."""
    blocks, queue = make_queue(n)
    return types.SimpleNamespace(blocks=blocks, queue=queue)


class _AllocationRecorder(RecordingCollector):
    """A ``RecordingCollector`` that also keeps each object ``on_block_allocated`` was given
    (``allocated_blocks``) and ``[block_id, ref_cnt]`` as read from it at the call
    (``allocated_ref_cnts``): the block is reported once taken. Which object that was is for
    the judge to check, by identity with the blocks ``get_new_blocks`` returned: the pool's
    ``blocks`` is the learner's attribute and could list stand-ins too (lab-05's
    ``_AccessRecorder``; tests/hostile/hand_the_allocation_recorder_stand_ins.py)."""

    def __init__(self) -> None:
        super().__init__()
        self.allocated_blocks: list[Any] = []
        self.allocated_ref_cnts: list[list[Any]] = []

    def on_block_allocated(self, block: Any) -> None:
        self.allocated_blocks.append(block)
        seen = [getattr(block, "block_id", None), getattr(block, "ref_cnt", None)]
        self.allocated_ref_cnts.append(seen)
        super().on_block_allocated(block)


def make_pool_with_collector(n: int, enable_caching: bool = False) -> list[Any]:
    """``[pool, collector]``: the learner's ``BlockPool`` of ``n`` blocks with a
    ``RecordingCollector`` as its ``metrics_collector`` (which also records each allocated
    block and its ``ref_cnt`` at the call, ``allocated_blocks``, ``allocated_ref_cnts``)."""
    import block_pool

    collector = _AllocationRecorder()
    pool = block_pool.BlockPool(
        num_gpu_blocks=n,
        enable_caching=enable_caching,
        hash_block_size=4,
        metrics_collector=collector,
    )
    return [pool, collector]


# -- running a batch the judge dictates -------------------------------------------------------
def run_queue_ops(bench: Any, ops: list[list[Any]]) -> list[Any]:
    """Run ``ops`` on ``bench.queue``; blocks are named by their index in ``bench.blocks``.

    ``["popleft"]``, ``["popleft_n", k]``, ``["remove", i]``, ``["append", i]``,
    ``["append_n", [i, ...]]``, ``["append_n_iter", [i, ...]]`` (the blocks as an iterator),
    ``["num_free_blocks"]``. Returns, in order, what the
    operations that return something returned: a popped block's ``block_id``, a list of them,
    or the counter.
    """
    queue, blocks = bench.queue, bench.blocks
    out: list[Any] = []
    for op in ops:
        name = op[0]
        if name == "popleft":
            out.append(queue.popleft().block_id)
        elif name == "popleft_n":
            out.append([b.block_id for b in queue.popleft_n(op[1])])
        elif name == "remove":
            queue.remove(blocks[op[1]])
        elif name == "append":
            queue.append(blocks[op[1]])
        elif name == "append_n":
            queue.append_n([blocks[i] for i in op[1]])
        elif name == "append_n_iter":
            queue.append_n(iter([blocks[i] for i in op[1]]))
        elif name == "num_free_blocks":
            out.append(queue.num_free_blocks)
        else:
            raise ValueError(f"unknown queue operation {name!r}")
    return out


def make_pool(n: int, enable_caching: bool = False, hash_block_size: int = 4) -> Any:
    """The learner's ``BlockPool`` of ``n`` blocks."""
    import block_pool

    return block_pool.BlockPool(
        num_gpu_blocks=n, enable_caching=enable_caching, hash_block_size=hash_block_size
    )


def free_reversed(pool: Any, blocks: list[Any]) -> None:
    """``pool.free_blocks(reversed(blocks))``: an iterator, as the KV cache manager passes."""
    pool.free_blocks(reversed(blocks))


def run_pool_ops(pool: Any, ops: list[list[Any]]) -> list[Any]:
    """Run ``ops`` on ``pool``; blocks are named by id (``pool.blocks[i]``).

    ``["get_new_blocks", k]``, ``["free_blocks", [i, ...]]``, ``["get_num_free_blocks"]``,
    ``["get_usage"]``. Returns, in order, what the operations that return something returned
    (``get_new_blocks``: the blocks' ids).
    """
    blocks = pool.blocks
    out: list[Any] = []
    for op in ops:
        name = op[0]
        if name == "get_new_blocks":
            out.append([b.block_id for b in pool.get_new_blocks(op[1])])
        elif name == "free_blocks":
            pool.free_blocks([blocks[i] for i in op[1]])
        elif name == "get_num_free_blocks":
            out.append(pool.get_num_free_blocks())
        elif name == "get_usage":
            out.append(pool.get_usage())
        else:
            raise ValueError(f"unknown pool operation {name!r}")
    return out


# -- reading back ---------------------------------------------------------------------------------
