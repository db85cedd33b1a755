"""Paged attention in torch: the CPU path the engine's model calls, and the GPU prefill path.

Same five names and semantics as :mod:`mini_vllm.teaching.paged_attention_numpy` on torch
tensors, plus :func:`paged_attention_varlen`, the one entry point the model uses for a whole
scheduler step: as in vLLM V1, a step's tokens, prefills and decodes mixed, are one flat batch
described by ``query_start_loc`` and ``seq_lens``, and a decode is a sequence whose query length
is 1. Vectorisation and precision: docs/upstream-fidelity.md (module notes).
"""

from __future__ import annotations

import itertools

import torch

from mini_vllm.utils.math_utils import cdiv

__all__ = [
    "compute_slot_mapping",
    "dense_attention",
    "paged_attention_decode",
    "paged_attention_prefill",
    "paged_attention_varlen",
    "reshape_and_cache",
]


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    if not dtype.is_floating_point:
        raise ValueError(f"attention needs floating-point inputs, got {dtype}")
    return dtype if dtype in (torch.float32, torch.float64) else torch.float32


def _check_cache(key_cache: torch.Tensor, value_cache: torch.Tensor) -> tuple[int, int, int, int]:
    if key_cache.dim() != 4:
        raise ValueError(
            "key_cache must be [num_blocks, block_size, num_kv_heads, head_dim], "
            f"got shape {tuple(key_cache.shape)}"
        )
    if value_cache.shape != key_cache.shape:
        raise ValueError(
            f"value_cache shape {tuple(value_cache.shape)} differs from key_cache shape "
            f"{tuple(key_cache.shape)}"
        )
    num_blocks, block_size, num_kv_heads, head_dim = key_cache.shape
    return num_blocks, block_size, num_kv_heads, head_dim


def _check_gqa(num_heads: int, num_kv_heads: int) -> int:
    if num_kv_heads <= 0 or num_heads % num_kv_heads != 0:
        raise ValueError(
            f"num_heads ({num_heads}) must be a positive multiple of num_kv_heads ({num_kv_heads})"
        )
    return num_heads // num_kv_heads


def compute_slot_mapping(
    block_table: torch.Tensor, positions: torch.Tensor, block_size: int
) -> torch.Tensor:
    """Map positions of one sequence to flat cache slots (see the numpy reference for why).

    ``slot = block_table[p // block_size] * block_size + p % block_size``; negative positions are
    padding and map to ``-1``. Runs on the tensors' device; the range check reads one scalar back.

    Args:
        block_table: ``[max_blocks]`` integer tensor.
        positions: integer tensor of any shape.
        block_size: tokens per block.

    Returns:
        int64 tensor of ``positions.shape``.
    """
    if block_table.dim() != 1:
        raise ValueError(
            f"block_table must be 1-D [max_blocks], got shape {tuple(block_table.shape)}"
        )
    if block_table.dtype.is_floating_point or positions.dtype.is_floating_point:
        raise ValueError("block_table and positions must be integer tensors")
    if int(block_size) <= 0:
        raise ValueError(f"block_size must be positive, got {block_size}")
    positions = positions.to(torch.int64)
    valid = positions >= 0
    logical = torch.where(valid, positions // block_size, 0)
    if logical.numel() and int(logical.max()) >= block_table.shape[0]:
        raise ValueError(
            f"position {int(positions.max())} needs logical block {int(logical.max())}, but the "
            f"block table has only {block_table.shape[0]} entries"
        )
    block_ids = block_table.to(torch.int64)[logical]
    if bool((valid & (block_ids < 0)).any()):
        raise ValueError(
            "a used block table entry is negative; padding belongs past the used blocks"
        )
    slots = block_ids * block_size + positions % block_size
    return torch.where(valid, slots, -1)


def reshape_and_cache(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Scatter new K/V rows into their cache slots in place; negative slots (padding) are skipped.

    Indexing with ``[block, offset]`` pairs (not a flattened ``view``) keeps the write in place
    for a cache that is a strided slice of a bigger allocation, e.g. one layer of a stacked cache.

    Args:
        key, value: ``[num_tokens, num_kv_heads, head_dim]``.
        key_cache, value_cache: ``[num_blocks, block_size, num_kv_heads, head_dim]`` (mutated).
        slot_mapping: ``[num_tokens]`` integer slots, negative for padding.
    """
    num_blocks, block_size, num_kv_heads, head_dim = _check_cache(key_cache, value_cache)
    if key.dim() != 3 or key.shape != value.shape:
        raise ValueError(
            "key and value must both be [num_tokens, num_kv_heads, head_dim], "
            f"got {tuple(key.shape)} and {tuple(value.shape)}"
        )
    if tuple(key.shape[1:]) != (num_kv_heads, head_dim):
        raise ValueError(
            f"key rows are {tuple(key.shape[1:])} but the cache holds (num_kv_heads, head_dim) = "
            f"{(num_kv_heads, head_dim)}"
        )
    if slot_mapping.shape != (key.shape[0],):
        raise ValueError(
            f"slot_mapping must be [num_tokens] = [{key.shape[0]}], got {tuple(slot_mapping.shape)}"
        )
    if slot_mapping.dtype.is_floating_point:
        raise ValueError(f"slot_mapping must hold integers, got {slot_mapping.dtype}")
    slots = slot_mapping.to(device=key_cache.device, dtype=torch.int64)
    valid = slots >= 0
    kept = slots[valid]
    if kept.numel() and int(kept.max()) >= num_blocks * block_size:
        raise ValueError(
            f"slot {int(kept.max())} is out of range for a cache of {num_blocks} blocks of "
            f"{block_size} tokens"
        )
    blocks, offsets = kept // block_size, kept % block_size
    key_cache[blocks, offsets] = key[valid].to(key_cache.dtype)
    value_cache[blocks, offsets] = value[valid].to(value_cache.dtype)


def _attend(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    scale: float,
    causal: bool,
) -> torch.Tensor:
    """Attention of ``[q, Hq, D]`` queries over ``[s, Hkv, D]`` keys, queries at the end (causal).

    Query heads are grouped under their KV head (``[Hkv, group * q, D]``) so one batched matmul per
    KV head does the work without materialising repeated keys.
    """
    query_len, num_heads, head_dim = query.shape
    kv_len, num_kv_heads, _ = key.shape
    group = num_heads // num_kv_heads
    dtype = _compute_dtype(query.dtype)
    q = query.to(dtype).reshape(query_len, num_kv_heads, group, head_dim)
    q = q.permute(1, 2, 0, 3).reshape(num_kv_heads, group * query_len, head_dim)
    k = key.to(dtype).transpose(0, 1)  # [Hkv, s, D]
    v = value.to(dtype).transpose(0, 1)
    scores = torch.matmul(q, k.transpose(1, 2)) * scale  # [Hkv, group * q, s]
    if causal:
        q_pos = torch.arange(query_len, device=query.device) + (kv_len - query_len)
        visible = torch.arange(kv_len, device=query.device)[None, :] <= q_pos[:, None]
        scores = scores.masked_fill(~visible.repeat(group, 1), float("-inf"))
    probs = torch.softmax(scores, dim=-1)  # subtracts the row max internally
    out = torch.matmul(probs, v)  # [Hkv, group * q, D]
    out = out.reshape(num_kv_heads, group, query_len, head_dim).permute(2, 0, 1, 3)
    return out.reshape(query_len, num_heads, head_dim).to(query.dtype)


def dense_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    scale: float,
    causal: bool = False,
) -> torch.Tensor:
    """Softmax attention over contiguous K/V; ``causal`` aligns the queries to the end of the keys.

    Args:
        query: ``[query_len, num_heads, head_dim]``.
        key, value: ``[kv_len, num_kv_heads, head_dim]``.
        scale: multiplier of ``q . k``.
        causal: query ``i`` sees keys ``<= kv_len - query_len + i`` (bottom-right mask).
    """
    if query.dim() != 3 or key.dim() != 3 or value.dim() != 3:
        raise ValueError(
            "query, key and value must be 3-D [tokens, heads, head_dim], got "
            f"{tuple(query.shape)}, {tuple(key.shape)}, {tuple(value.shape)}"
        )
    if key.shape != value.shape:
        raise ValueError(f"key shape {tuple(key.shape)} differs from value {tuple(value.shape)}")
    if query.shape[2] != key.shape[2]:
        raise ValueError(f"query head_dim {query.shape[2]} differs from key's {key.shape[2]}")
    _check_gqa(query.shape[1], key.shape[1])
    if key.shape[0] == 0:
        raise ValueError("attention over zero keys is undefined")
    if causal and query.shape[0] > key.shape[0]:
        raise ValueError(
            f"causal attention needs query_len ({query.shape[0]}) <= kv_len ({key.shape[0]})"
        )
    return _attend(query, key, value, scale, causal)


def _gather_sequence(
    key_cache: torch.Tensor, value_cache: torch.Tensor, block_table: torch.Tensor, seq_len: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The first ``seq_len`` tokens of a sequence, read through its table (later entries unread)."""
    num_blocks, block_size, num_kv_heads, head_dim = key_cache.shape
    if seq_len < 1:
        raise ValueError(f"seq_len must be >= 1, got {seq_len}")
    used = cdiv(seq_len, block_size)
    if used > block_table.shape[0]:
        raise ValueError(
            f"seq_len {seq_len} needs {used} blocks of {block_size} tokens, but the block table "
            f"has only {block_table.shape[0]} entries"
        )
    ids = block_table[:used].to(device=key_cache.device, dtype=torch.int64)
    if int(ids.min()) < 0 or int(ids.max()) >= num_blocks:
        raise ValueError(
            f"block table entries {ids.tolist()} fall outside the cache's {num_blocks} blocks"
        )
    k = key_cache[ids].reshape(used * block_size, num_kv_heads, head_dim)[:seq_len]
    v = value_cache[ids].reshape(used * block_size, num_kv_heads, head_dim)[:seq_len]
    return k, v


def _check_query(query: torch.Tensor, num_kv_heads: int, head_dim: int, what: str) -> None:
    if query.dim() != 3:
        raise ValueError(f"query must be [{what}, num_heads, head_dim], got {tuple(query.shape)}")
    if query.shape[2] != head_dim:
        raise ValueError(f"query head_dim {query.shape[2]} differs from the cache's {head_dim}")
    _check_gqa(query.shape[1], num_kv_heads)


def paged_attention_decode(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """One query per sequence over its ``seq_lens[i]`` cached tokens, all sequences at once.

    The tables are cut to the longest sequence's block count and every entry past a sequence's
    used blocks is replaced by block 0 before gathering: callers may pad tables with anything
    (``-1``, stale ids), and a gather must never index with it. The over-read tail is masked out
    of the softmax by length, so it costs memory traffic but never changes the result.

    Args:
        query: ``[num_seqs, num_heads, head_dim]``.
        key_cache, value_cache: ``[num_blocks, block_size, num_kv_heads, head_dim]``.
        block_tables: ``[num_seqs, max_blocks]`` integer tensor.
        seq_lens: ``[num_seqs]`` lengths including the new token (>= 1).
        scale: softmax scale.

    Returns:
        ``[num_seqs, num_heads, head_dim]`` in ``query``'s dtype.
    """
    num_blocks, block_size, num_kv_heads, head_dim = _check_cache(key_cache, value_cache)
    _check_query(query, num_kv_heads, head_dim, "num_seqs")
    num_seqs, num_heads, _ = query.shape
    group = num_heads // num_kv_heads
    if block_tables.dim() != 2 or block_tables.shape[0] != num_seqs:
        raise ValueError(
            f"block_tables must be [num_seqs={num_seqs}, max_blocks], "
            f"got {tuple(block_tables.shape)}"
        )
    if seq_lens.shape != (num_seqs,):
        raise ValueError(f"seq_lens must be [num_seqs={num_seqs}], got {tuple(seq_lens.shape)}")
    if num_seqs == 0:
        return torch.empty_like(query)
    device = key_cache.device
    lens = seq_lens.to(device=device, dtype=torch.int64)
    if int(lens.min()) < 1:
        raise ValueError("every seq_len must be >= 1 (a decode query attends at least to itself)")
    max_len = int(lens.max())
    used_blocks = cdiv(max_len, block_size)
    if used_blocks > block_tables.shape[1]:
        raise ValueError(
            f"seq_len {max_len} needs {used_blocks} blocks but block_tables has "
            f"{block_tables.shape[1]} columns"
        )
    tables = block_tables[:, :used_blocks].to(device=device, dtype=torch.int64)
    in_use = (
        torch.arange(used_blocks, device=device)[None, :]
        < (lens[:, None] + block_size - 1) // block_size
    )
    used_ids = tables[in_use]
    if used_ids.numel() and (int(used_ids.min()) < 0 or int(used_ids.max()) >= num_blocks):
        raise ValueError(f"a used block table entry falls outside the cache's {num_blocks} blocks")
    tables = torch.where(in_use, tables, 0)

    dtype = _compute_dtype(query.dtype)
    span = used_blocks * block_size
    # [num_seqs, span, Hkv, D]: each sequence's keys in logical order (tail masked below).
    k = key_cache[tables].reshape(num_seqs, span, num_kv_heads, head_dim).to(dtype)
    v = value_cache[tables].reshape(num_seqs, span, num_kv_heads, head_dim).to(dtype)
    q = query.to(dtype).reshape(num_seqs, num_kv_heads, group, head_dim)
    scores = torch.einsum("bhgd,bshd->bhgs", q, k) * scale
    visible = torch.arange(span, device=device)[None, :] < lens[:, None]  # [num_seqs, span]
    scores = scores.masked_fill(~visible[:, None, None, :], float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    out = torch.einsum("bhgs,bshd->bhgd", probs, v)
    return out.reshape(num_seqs, num_heads, head_dim).to(query.dtype)


def paged_attention_prefill(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_table: torch.Tensor,
    context_len: int,
    scale: float,
) -> torch.Tensor:
    """A chunk of one sequence's new tokens, causal over its cached prefix and itself.

    The queries are at positions ``context_len .. context_len + query_len - 1`` and their own
    K/V must already be in the cache (write, then attend).

    Args:
        query: ``[query_len, num_heads, head_dim]``.
        key_cache, value_cache: ``[num_blocks, block_size, num_kv_heads, head_dim]``.
        block_table: ``[max_blocks]`` of this sequence.
        context_len: tokens before the first query (>= 0).
        scale: softmax scale.
    """
    _, _, num_kv_heads, head_dim = _check_cache(key_cache, value_cache)
    _check_query(query, num_kv_heads, head_dim, "query_len")
    if block_table.dim() != 1:
        raise ValueError(
            f"block_table must be 1-D [max_blocks], got shape {tuple(block_table.shape)}"
        )
    context_len = int(context_len)
    if context_len < 0:
        raise ValueError(f"context_len must be >= 0, got {context_len}")
    if query.shape[0] == 0:
        return torch.empty_like(query)
    k, v = _gather_sequence(key_cache, value_cache, block_table, context_len + query.shape[0])
    return _attend(query, k, v, scale, causal=True)


def paged_attention_varlen(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """Attention for one flattened scheduler step: prefills, prefill chunks and decodes mixed.

    This is the call the model makes in every attention layer, after
    ``reshape_and_cache(key, value, key_cache, value_cache, slot_mapping)`` has written the step's
    new K/V. Sequence ``i`` owns query rows ``query_start_loc[i] : query_start_loc[i + 1]``; those
    ``query_len`` tokens are the *last* ``query_len`` of its ``seq_lens[i]`` tokens, so its
    context (cached prefix) is ``seq_lens[i] - query_len`` tokens and the mask is causal aligned to
    the end. A decode is the case ``query_len == 1``; a fresh prompt is ``query_len ==
    seq_lens[i]``. This mirrors the metadata of upstream's ``FlashAttentionMetadata``
    (``query_start_loc``, ``seq_lens``, ``block_table``).

    Rows of ``query`` past ``query_start_loc[-1]`` (a batch padded to a fixed size) are returned
    as zeros. Sequences with ``query_len == 0`` are skipped.

    Args:
        query: ``[num_tokens, num_heads, head_dim]``, sequences concatenated.
        key_cache, value_cache: ``[num_blocks, block_size, num_kv_heads, head_dim]``.
        block_tables: ``[num_seqs, max_blocks]``; entries past each sequence's used blocks ignored.
        query_start_loc: ``[num_seqs + 1]`` cumulative query lengths, starting at 0.
        seq_lens: ``[num_seqs]`` context + new tokens per sequence.
        scale: softmax scale.

    Returns:
        ``[num_tokens, num_heads, head_dim]`` in ``query``'s dtype.
    """
    _, _, num_kv_heads, head_dim = _check_cache(key_cache, value_cache)
    _check_query(query, num_kv_heads, head_dim, "num_tokens")
    num_seqs = seq_lens.shape[0] if seq_lens.dim() == 1 else -1
    if num_seqs < 0:
        raise ValueError(f"seq_lens must be 1-D [num_seqs], got {tuple(seq_lens.shape)}")
    if query_start_loc.shape != (num_seqs + 1,):
        raise ValueError(
            f"query_start_loc must be [num_seqs + 1] = [{num_seqs + 1}], "
            f"got {tuple(query_start_loc.shape)}"
        )
    if block_tables.dim() != 2 or block_tables.shape[0] != num_seqs:
        raise ValueError(
            f"block_tables must be [num_seqs={num_seqs}, max_blocks], "
            f"got {tuple(block_tables.shape)}"
        )
    starts = [int(x) for x in query_start_loc.tolist()]
    lens = [int(x) for x in seq_lens.tolist()]
    if starts[0] != 0 or any(b < a for a, b in itertools.pairwise(starts)):
        raise ValueError(f"query_start_loc must start at 0 and not decrease, got {starts}")
    if starts[-1] > query.shape[0]:
        raise ValueError(
            f"query_start_loc ends at {starts[-1]} but query has only {query.shape[0]} rows"
        )
    out = torch.zeros_like(query)
    for i in range(num_seqs):
        start, end = starts[i], starts[i + 1]
        query_len = end - start
        if query_len == 0:
            continue
        if lens[i] < query_len:
            raise ValueError(
                f"sequence {i}: seq_len {lens[i]} is shorter than its query_len {query_len}"
            )
        k, v = _gather_sequence(key_cache, value_cache, block_tables[i], lens[i])
        out[start:end] = _attend(query[start:end], k, v, scale, causal=True)
    return out
