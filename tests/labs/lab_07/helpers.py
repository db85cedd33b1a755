"""Shared set-up of the lab-07 suite: managers, requests, and reads of the pool's state.

The manager under test is the learner's ``KVCacheManager``; the block pool inside it and the
``Request`` objects are the reference's (or, under ``--chain``, the learner's own lab-05 pool).
State is read through upstream's attribute names (``block_pool``, ``req_to_blocks``,
``num_cached_block``, ``ref_cnt``, ``block_hash``, the free queue's links), never through the
methods being graded, so that a broken method cannot vouch for itself.
"""

from __future__ import annotations

from typing import Any

from grading.suite import load_impl
from mini_vllm.core.kv_cache_utils import (
    get_request_block_hasher,
    make_block_hash_with_group_id,
    sha256,
)
from mini_vllm.request import Request
from mini_vllm.sampling_params import SamplingParams
from tests.labs.common import free_ids

DOC = "phases/03-prefix-caching-and-scheduling/README.md"
BS = 4
HASHER = get_request_block_hasher(BS, sha256)


def make_manager(num_blocks: int = 10, max_model_len: int = 64, **kwargs: Any) -> Any:
    """The learner's manager over ``num_blocks`` blocks of ``BS`` tokens (block 0 is null)."""
    mod = load_impl("kv_cache_manager")
    return mod.KVCacheManager(num_blocks, BS, max_model_len, **kwargs)


def make_request(request_id: str, tokens: list[int], hasher: Any = HASHER) -> Request:
    """A request whose full blocks are hashed (chained) as its tokens arrive."""
    return Request(request_id, list(tokens), SamplingParams(max_tokens=100), block_hasher=hasher)


def admit(mgr: Any, req: Request, num_new_tokens: int | None = None) -> tuple[Any, int]:
    """Admit ``req`` as the scheduler does: look up its prefix, then allocate the rest.

    Returns the new blocks (None if they did not fit) and the number of hit tokens.
    """
    hits, num_hit = mgr.get_computed_blocks(req)
    if num_new_tokens is None:
        num_new_tokens = req.num_tokens - num_hit
    new = mgr.allocate_slots(req, num_new_tokens, num_hit, hits)
    if new is not None:
        req.num_computed_tokens = num_hit + num_new_tokens
    return new, num_hit


def decode(mgr: Any, req: Request, token: int) -> Any:
    """Append a sampled token and give it a slot: one decode step."""
    req.append_output_token_ids(token)
    new = mgr.allocate_slots(req, 1)
    if new is not None:
        req.num_computed_tokens += 1
    return new


def block_ids(kv_blocks: Any) -> list[int]:
    """The ids in a ``KVCacheBlocks`` (its only group)."""
    return [b.block_id for b in kv_blocks.blocks[0]]


def table(mgr: Any, request_id: str) -> list[int]:
    """The request's block table, read from ``req_to_blocks``."""
    return [b.block_id for b in mgr.req_to_blocks.get(request_id, [])]


def free_queue(mgr: Any) -> list[int]:
    """The pool's free queue, front (evicted first) to back."""
    return free_ids(mgr.block_pool.free_block_queue)


def cache_key(req: Request, index: int) -> bytes:
    """The key block ``index`` of ``req`` is cached under (its chained hash, group 0)."""
    return make_block_hash_with_group_id(req.block_hashes[index], 0)


def snapshot(mgr: Any) -> tuple[Any, ...]:
    """Everything an allocation may change: queue order, ref counts, hashes, tables."""
    pool = mgr.block_pool
    return (
        free_queue(mgr),
        [(b.ref_cnt, b.block_hash) for b in pool.blocks],
        {rid: [b.block_id for b in blocks] for rid, blocks in mgr.req_to_blocks.items()},
        dict(mgr.num_cached_block),
    )


def describe_change(before: tuple[Any, ...], after: tuple[Any, ...]) -> str:
    """Say which part of the state a refused allocation changed."""
    names = ("the free queue", "ref counts / block hashes", "the block tables (req_to_blocks)",
             "num_cached_block")
    changed = [name for name, a, b in zip(names, before, after) if a != b]
    detail = []
    if before[0] != after[0]:
        detail.append(f"free queue {before[0]} -> {after[0]}")
    if before[2] != after[2]:
        detail.append(f"tables {before[2]} -> {after[2]}")
    return ", ".join(changed) + (f" ({'; '.join(detail)})" if detail else "")
