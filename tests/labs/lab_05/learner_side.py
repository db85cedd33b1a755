"""lab-05's helpers in the learner process: they build, run and read back; they never judge.

The grader copies this file into the learner's sandbox as the top-level module
``learner_side``; the tests reach it with ``learner_module("learner_side")``. It runs beside the
learner's code, so nothing here decides anything: it builds what the learner's code must
receive (requests, a recording hash function), runs the operation sequences the tests dictate,
and returns what it reads as plain data (attribute values as they are: the judge checks their
types and every invariant). It imports only the standard library, the reference's ``sha256``
(not a lab-05 task), the reference's snapshot readers (``mini_vllm/teaching/invariants.py``:
they read, the judge checks) and, when called, the learner's ``block_pool``.

Block hashes are computed in the judge (``hash_block_tokens`` is graded here, so the sandbox's
reference has it stubbed out) and passed in as bytes. The reading-back part is the same as
lab-01's ``learner_side.py``.
"""

from __future__ import annotations

import types
from typing import Any

from mini_vllm.teaching.invariants import pool_snapshot, queue_snapshot  # noqa: F401
from mini_vllm.teaching.recording_collector import RecordingCollector


# -- building -----------------------------------------------------------------------------------
def make_request(request_id: str, token_ids: list[int], block_hashes: list[bytes]) -> Any:
    """What ``cache_full_blocks`` reads of a request, with the hashes the judge computed."""
    return types.SimpleNamespace(
        request_id=request_id,
        block_hashes=list(block_hashes),
        all_token_ids=list(token_ids),
        num_tokens=len(token_ids),
        lora_request=None,
    )


class RecordingHasher:
    """A hash function that keeps what it was given and returned.

    Its digests are not ``sha256(value)`` but a hash of that digest tagged as this
    recorder's: a ``hash_block_tokens`` that calls the function it is given but returns its
    own ``sha256`` of the same value would otherwise return a digest the recorder returned too
    (tests/hostile/call_the_hash_function_and_ignore_it.py)."""

    def __init__(self) -> None:
        self.inputs: list[Any] = []
        self.outputs: list[Any] = []
        #: The type name of each call's token ids, read here: a list and a tuple cross to the
        #: judge alike, and the engine's sha256 encodes them alike, but a hash function the
        #: engine may be given (a pickle, ``hash``) does not.
        self.token_types: list[str] = []

    def __call__(self, value: Any) -> bytes:
        from mini_vllm.core.kv_cache_utils import sha256

        self.inputs.append(value)
        tokens = value[1] if type(value) is tuple and len(value) == 3 else value
        self.token_types.append(type(tokens).__name__)
        import hashlib

        digest = hashlib.sha256(b"lab-05 RecordingHasher" + sha256(value)).digest()
        self.outputs.append(digest)
        return digest


def make_pool(n: int, enable_caching: bool = True, hash_block_size: int = 2) -> Any:
    """The learner's ``BlockPool`` of ``n`` blocks."""
    import block_pool

    return block_pool.BlockPool(
        num_gpu_blocks=n, enable_caching=enable_caching, hash_block_size=hash_block_size
    )


class _AccessRecorder(RecordingCollector):
    """A ``RecordingCollector`` that also keeps each object ``on_block_accessed`` was given
    (``accessed_blocks``) and ``[block_id, ref_cnt]`` as read from it at the call
    (``accessed_ref_cnts``): a touched block is reported once it holds the new reference.

    Which object that was is for the judge to check, by identity with the blocks it passed to
    ``touch``: an object that merely says a block's id and the ref_cnt it will have cannot pass
    for the block after the reference is taken. Nothing here decides which objects are "the
    pool's blocks": the pool's ``blocks`` is the learner's attribute, which could list
    stand-ins too (tests/hostile/report_a_stand_in_to_the_collector.py,
    hand_the_collector_stand_ins_from_the_first_read.py)."""

    def __init__(self) -> None:
        super().__init__()
        self.accessed_blocks: list[Any] = []
        self.accessed_ref_cnts: list[list[Any]] = []

    def on_block_accessed(self, block: Any) -> None:
        self.accessed_blocks.append(block)
        self.accessed_ref_cnts.append(
            [getattr(block, "block_id", None), getattr(block, "ref_cnt", None)]
        )
        super().on_block_accessed(block)


def make_pool_with_collector(n: int, hash_block_size: int = 2) -> list[Any]:
    """``[pool, collector]``: the learner's caching ``BlockPool`` of ``n`` blocks, with a
    ``RecordingCollector`` as its ``metrics_collector`` (which also records each touched
    block and its ``ref_cnt`` at the call, ``accessed_blocks``, ``accessed_ref_cnts``)."""
    import block_pool

    collector = _AccessRecorder()
    pool = block_pool.BlockPool(
        num_gpu_blocks=n,
        enable_caching=True,
        hash_block_size=hash_block_size,
        metrics_collector=collector,
    )
    return [pool, collector]


def block_ids(blocks: Any) -> list[Any]:
    """The ``block_id`` of each block, as found."""
    return [getattr(b, "block_id", None) for b in blocks]


# -- running a batch the judge dictates -------------------------------------------------------
def run_pool_ops(pool: Any, ops: list[list[Any]], request: Any = None) -> list[Any]:
    """Run ``ops`` on ``pool``; blocks are named by id (``pool.blocks[i]``).

    ``["get_new_blocks", k]``, ``["free_blocks", [i, ...]]``, ``["touch", [i, ...]]``,
    ``["cache_full_blocks", [i, ...], num_cached, num_full, block_size, group_id]`` (for
    ``request``), ``["publish_each", [i, ...], [[num_cached, num_full], ...], block_size,
    group_id]`` (one list of those blocks, built once, then one ``cache_full_blocks`` call per
    pair: a long request publishing its blocks as they fill, at the cost of the calls alone),
    ``["evict_each", [i, ...]]`` (one ``evict_blocks({i})`` per id),
    ``["lookup_each", [h, ...]]`` (one ``get_cached_block(h, [0])`` per hash: the ids found, or
    None), ``["get_num_free_blocks"]``. Returns, in order, what the operations that return
    something returned (``get_new_blocks``: the blocks' ids).
    """
    blocks = pool.blocks
    out: list[Any] = []
    for op in ops:
        name = op[0]
        if name == "get_new_blocks":
            out.append([b.block_id for b in pool.get_new_blocks(op[1])])
        elif name == "free_blocks":
            pool.free_blocks([blocks[i] for i in op[1]])
        elif name == "touch":
            pool.touch([blocks[i] for i in op[1]])
        elif name == "cache_full_blocks":
            pool.cache_full_blocks(request, [blocks[i] for i in op[1]], *op[2:])
        elif name == "publish_each":
            held = [blocks[i] for i in op[1]]
            for num_cached, num_full in op[2]:
                pool.cache_full_blocks(request, held, num_cached, num_full, *op[3:])
        elif name == "evict_each":
            for i in op[1]:
                pool.evict_blocks({i})
        elif name == "lookup_each":
            found = [pool.get_cached_block(h, [0]) for h in op[1]]
            out.append([None if f is None else [b.block_id for b in f] for f in found])
        elif name == "get_num_free_blocks":
            out.append(pool.get_num_free_blocks())
        else:
            raise ValueError(f"unknown pool operation {name!r}")
    return out


def evict_blocks_given_a_set(pool: Any, block_ids: list[int]) -> Any:
    """Call ``pool.evict_blocks`` with a set of ``block_ids``; return a holder of that set
    (``.given``), for :func:`given_ids` to read now and again at the end of the test: the set
    belongs to the caller, and emptying it at a later call of the pool is changing it too
    (tests/hostile/empty_the_callers_set_one_call_later.py)."""
    holder = types.SimpleNamespace(given=set(block_ids))
    pool.evict_blocks(holder.given)
    return holder


def given_ids(holder: Any) -> list[Any]:
    """The set held by ``holder`` (:func:`evict_blocks_given_a_set`), sorted."""
    return sorted(holder.given)


# -- reading back ---------------------------------------------------------------------------------
