"""Paged attention in numpy, writing through slots and reading through tables: the file of lab-06.

You write eight functions: ``compute_slot_mapping``, ``reshape_and_cache`` and ``_gather_sequence``
(a slot is ``block_id * block_size + offset``), ``paged_attention_decode`` and
``paged_attention_prefill``, and for part 3 decode split the way a GPU kernel splits it
(``attend_split``, ``merge_splits``, ``paged_attention_decode_split_k``). ``dense_attention``, plain
softmax attention over contiguous keys, is given with the validation helpers: read it first, since
once your gather is right, decode and prefill are a call to it. With grouped-query attention, query
head ``h`` reads KV head ``h // group``, where ``group = num_heads // num_kv_heads``. Each
function's docstring gives its shapes (vLLM's flash layout).

The grader compares every result with float64 attention over contiguous keys, to 1e-12: paging may
move keys around, never change the answer. Padding is any negative slot, and skipping it is your
job, since numpy happily writes ``cache[-1]``. Fancy indexing with the slots does the scatter and
the gather without a loop per token.
"""

from __future__ import annotations

import numpy as np

from mini_vllm.utils.math_utils import cdiv

__all__ = [
    "attend_split",
    "compute_slot_mapping",
    "dense_attention",
    "merge_splits",
    "paged_attention_decode",
    "paged_attention_decode_split_k",
    "paged_attention_prefill",
    "reshape_and_cache",
]


def _compute_dtype(*arrays: np.ndarray) -> np.dtype:
    """Float64 stays float64; half and single precision are computed in float32.

    Accumulating fp16 scores in fp16 would lose the very precision a reference is for, and the
    GPU kernels accumulate in fp32 too, so the reference models that.
    """
    dtype = np.result_type(*arrays)
    if not np.issubdtype(dtype, np.floating):
        raise ValueError(f"attention needs floating-point inputs, got {dtype}")
    return np.dtype(np.float64) if dtype == np.float64 else np.dtype(np.float32)


def _check_cache(key_cache: np.ndarray, value_cache: np.ndarray) -> tuple[int, int, int, int]:
    if key_cache.ndim != 4:
        raise ValueError(
            "key_cache must be [num_blocks, block_size, num_kv_heads, head_dim], "
            f"got shape {key_cache.shape}"
        )
    if value_cache.shape != key_cache.shape:
        raise ValueError(
            f"value_cache shape {value_cache.shape} differs from key_cache shape {key_cache.shape}"
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
    block_table: np.ndarray, positions: np.ndarray, block_size: int
) -> np.ndarray:
    """Map token positions of one sequence to flat slots of the KV cache.

    ``slot = block_table[p // block_size] * block_size + p % block_size``: the block table says
    which physical block holds logical block ``p // block_size``; the offset inside the block is
    unchanged by paging. The flat slot is what ``reshape_and_cache`` consumes, so the cache write
    needs no knowledge of tables at all (upstream builds the same ``slot_mapping`` tensor in its
    model runner's block table helper).

    A negative position is padding and maps to slot ``-1``, which ``reshape_and_cache`` skips; this
    lets a batch padded to a fixed size reuse the same call.

    Args:
        block_table: ``[max_blocks]`` physical block ids of the sequence.
        positions: integer array (any shape) of token positions in the sequence.
        block_size: tokens per block.

    Returns:
        int64 array of ``positions.shape``.
    """
    block_table = np.asarray(block_table)
    positions = np.asarray(positions)
    if block_table.ndim != 1:
        raise ValueError(f"block_table must be 1-D [max_blocks], got shape {block_table.shape}")
    if not np.issubdtype(block_table.dtype, np.integer):
        raise ValueError(f"block_table must hold integers, got {block_table.dtype}")
    if positions.size and not np.issubdtype(positions.dtype, np.integer):
        raise ValueError(f"positions must be integers, got {positions.dtype}")
    if int(block_size) <= 0:
        raise ValueError(f"block_size must be positive, got {block_size}")
    positions = positions.astype(np.int64)
    valid = positions >= 0
    logical = np.where(valid, positions // block_size, 0)
    if valid.any() and int(logical[valid].max()) >= block_table.shape[0]:
        bad = int(positions[valid].max())
        raise ValueError(
            f"position {bad} needs logical block {bad // block_size}, but the block table has only "
            f"{block_table.shape[0]} entries"
        )
    block_ids = block_table.astype(np.int64)[logical]
    if np.any(valid & (block_ids < 0)):
        raise ValueError(
            "a used block table entry is negative; padding belongs past the used blocks"
        )
    slots = block_ids * block_size + positions % block_size
    return np.where(valid, slots, -1).astype(np.int64)


def reshape_and_cache(
    key: np.ndarray,
    value: np.ndarray,
    key_cache: np.ndarray,
    value_cache: np.ndarray,
    slot_mapping: np.ndarray,
) -> None:
    """Scatter new key/value rows into their cache slots, in place.

    Token ``i`` goes to block ``slot_mapping[i] // block_size``, offset ``slot_mapping[i] %
    block_size``. A negative slot marks a padding token and is skipped: the engine pads batches
    (fixed shapes, CUDA graphs) and must not let padding overwrite a real block, not even the
    null block 0. Writes go through ``[block, offset]`` indexing rather than a flattened view so
    that a non-contiguous cache is still updated in place.

    Args:
        key, value: ``[num_tokens, num_kv_heads, head_dim]``.
        key_cache, value_cache: ``[num_blocks, block_size, num_kv_heads, head_dim]`` (mutated).
        slot_mapping: ``[num_tokens]`` integer slots, ``-1`` (any negative) for padding.
    """
    num_blocks, block_size, num_kv_heads, head_dim = _check_cache(key_cache, value_cache)
    if key.ndim != 3 or key.shape != value.shape:
        raise ValueError(
            "key and value must both be [num_tokens, num_kv_heads, head_dim], "
            f"got {key.shape} and {value.shape}"
        )
    if key.shape[1:] != (num_kv_heads, head_dim):
        raise ValueError(
            f"key rows are {key.shape[1:]} but the cache holds (num_kv_heads, head_dim) = "
            f"{(num_kv_heads, head_dim)}"
        )
    slot_mapping = np.asarray(slot_mapping)
    if slot_mapping.shape != (key.shape[0],):
        raise ValueError(
            f"slot_mapping must be [num_tokens] = [{key.shape[0]}], got {slot_mapping.shape}"
        )
    if slot_mapping.size and not np.issubdtype(slot_mapping.dtype, np.integer):
        raise ValueError(f"slot_mapping must hold integers, got {slot_mapping.dtype}")
    slots = slot_mapping.astype(np.int64)
    valid = slots >= 0
    if valid.any() and int(slots[valid].max()) >= num_blocks * block_size:
        raise ValueError(
            f"slot {int(slots[valid].max())} is out of range for a cache of {num_blocks} blocks "
            f"of {block_size} tokens"
        )
    kept = slots[valid]
    key_cache[kept // block_size, kept % block_size] = key[valid]
    value_cache[kept // block_size, kept % block_size] = value[valid]


def dense_attention(
    query: np.ndarray,
    key: np.ndarray,
    value: np.ndarray,
    scale: float,
    causal: bool = False,
) -> np.ndarray:
    """Plain softmax attention over contiguous keys: the ground truth for every paged path.

    With ``causal=True`` the queries are the *last* ``query_len`` positions of the key sequence
    (bottom-right alignment, as in flash-attention and vLLM's chunked prefill): query ``i`` sits at
    position ``kv_len - query_len + i`` and sees keys ``0 .. kv_len - query_len + i``. That is the
    mask a prefill chunk after a cached prefix needs; with ``query_len == kv_len`` it is the usual
    lower-triangular mask.

    The softmax subtracts each row's maximum before exponentiating, so large scores do not
    overflow; every row has at least one visible key, so no row is all ``-inf``.

    Args:
        query: ``[query_len, num_heads, head_dim]``.
        key, value: ``[kv_len, num_kv_heads, head_dim]``; ``num_heads % num_kv_heads == 0``.
        scale: multiplier of ``q . k`` (usually ``head_dim ** -0.5``).
        causal: apply the bottom-right causal mask.

    Returns:
        ``[query_len, num_heads, head_dim]`` in ``query``'s dtype.
    """
    if query.ndim != 3 or key.ndim != 3 or value.ndim != 3:
        raise ValueError(
            "query, key and value must be 3-D [tokens, heads, head_dim], got "
            f"{query.shape}, {key.shape}, {value.shape}"
        )
    if key.shape != value.shape:
        raise ValueError(f"key shape {key.shape} differs from value shape {value.shape}")
    query_len, num_heads, head_dim = query.shape
    kv_len, num_kv_heads, kv_head_dim = key.shape
    if kv_head_dim != head_dim:
        raise ValueError(f"query head_dim {head_dim} differs from key head_dim {kv_head_dim}")
    group = _check_gqa(num_heads, num_kv_heads)
    if causal and query_len > kv_len:
        raise ValueError(
            f"causal attention needs query_len ({query_len}) <= kv_len ({kv_len}): the queries "
            "are the last positions of the key sequence"
        )
    if kv_len == 0:
        raise ValueError("attention over zero keys is undefined")
    dtype = _compute_dtype(query, key, value)
    q = query.astype(dtype, copy=False).reshape(query_len, num_kv_heads, group, head_dim)
    k = key.astype(dtype, copy=False)
    v = value.astype(dtype, copy=False)
    # scores[kv_head, group, q, s]: grouping the query heads avoids materialising repeated K/V.
    scores = np.einsum("qhgd,shd->hgqs", q, k) * dtype.type(scale)
    if causal:
        q_pos = np.arange(query_len)[:, None] + (kv_len - query_len)
        visible = np.arange(kv_len)[None, :] <= q_pos
        scores = np.where(visible, scores, -np.inf)
    scores = scores - scores.max(axis=-1, keepdims=True)
    probs = np.exp(scores)
    probs /= probs.sum(axis=-1, keepdims=True)
    out = np.einsum("hgqs,shd->qhgd", probs, v)
    return out.reshape(query_len, num_heads, head_dim).astype(query.dtype, copy=False)


def _gather_sequence(
    key_cache: np.ndarray, value_cache: np.ndarray, block_table: np.ndarray, seq_len: int
) -> tuple[np.ndarray, np.ndarray]:
    """Read the first ``seq_len`` tokens of a sequence back through its block table.

    Only the first ``cdiv(seq_len, block_size)`` table entries are looked at: entries past them
    are padding the caller is free to fill with anything (vLLM pads with the null block 0).
    """
    num_blocks, block_size, num_kv_heads, head_dim = key_cache.shape
    if seq_len < 1:
        raise ValueError(f"seq_len must be >= 1, got {seq_len}")
    used = cdiv(seq_len, block_size)
    if used > block_table.shape[0]:
        raise ValueError(
            f"seq_len {seq_len} needs {used} blocks of {block_size} tokens, but the block table "
            f"has only {block_table.shape[0]} entries"
        )
    ids = block_table[:used].astype(np.int64)
    if ids.size and (ids.min() < 0 or ids.max() >= num_blocks):
        raise ValueError(
            f"block table entries {ids.tolist()} fall outside the cache's {num_blocks} blocks"
        )
    k = key_cache[ids].reshape(used * block_size, num_kv_heads, head_dim)[:seq_len]
    v = value_cache[ids].reshape(used * block_size, num_kv_heads, head_dim)[:seq_len]
    return k, v


def paged_attention_decode(
    query: np.ndarray,
    key_cache: np.ndarray,
    value_cache: np.ndarray,
    block_tables: np.ndarray,
    seq_lens: np.ndarray,
    scale: float,
) -> np.ndarray:
    """One new token per sequence attends to all of that sequence's cached tokens.

    In decode each sequence contributes exactly one query, the token at position
    ``seq_len - 1``, whose own K/V has already been written by ``reshape_and_cache``. It is the
    last position, so every cached token is visible and no causal mask is needed. Sequences have
    different lengths; each reads only its own ``seq_lens[i]`` tokens.

    Args:
        query: ``[num_seqs, num_heads, head_dim]``.
        key_cache, value_cache: ``[num_blocks, block_size, num_kv_heads, head_dim]``.
        block_tables: ``[num_seqs, max_blocks]``; entries past the used blocks are ignored.
        seq_lens: ``[num_seqs]`` tokens in each sequence, including the new one (>= 1).
        scale: softmax scale.

    Returns:
        ``[num_seqs, num_heads, head_dim]`` in ``query``'s dtype.
    """
    _, _, num_kv_heads, head_dim = _check_cache(key_cache, value_cache)
    if query.ndim != 3:
        raise ValueError(f"query must be [num_seqs, num_heads, head_dim], got {query.shape}")
    num_seqs, num_heads, q_head_dim = query.shape
    if q_head_dim != head_dim:
        raise ValueError(f"query head_dim {q_head_dim} differs from the cache's {head_dim}")
    _check_gqa(num_heads, num_kv_heads)
    block_tables = np.asarray(block_tables)
    seq_lens = np.asarray(seq_lens)
    if block_tables.ndim != 2 or block_tables.shape[0] != num_seqs:
        raise ValueError(
            f"block_tables must be [num_seqs={num_seqs}, max_blocks], got {block_tables.shape}"
        )
    if seq_lens.shape != (num_seqs,):
        raise ValueError(f"seq_lens must be [num_seqs={num_seqs}], got {seq_lens.shape}")
    out = np.empty_like(query)
    for i in range(num_seqs):
        k, v = _gather_sequence(key_cache, value_cache, block_tables[i], int(seq_lens[i]))
        out[i] = dense_attention(query[i : i + 1], k, v, scale)[0]
    return out


def attend_split(
    query: np.ndarray, key: np.ndarray, value: np.ndarray, scale: float
) -> tuple[np.ndarray, np.ndarray]:
    """One decode query's attention over one contiguous piece of its keys, and that piece's
    log-sum-exp: what one split of a split-K ("flash-decoding") kernel produces.

    The partial output is normalised by the piece's *own* softmax sum, ``sum_t p_t v_t / sum_t
    p_t`` over the piece's tokens ``t``, and ``lse = log(sum_t exp(s_t))`` of its scaled scores
    ``s_t = scale * q . k_t``. Computed as ``m + log(sum_t exp(s_t - m))`` with ``m`` the
    piece's largest score, so that large scores do not overflow. Together, the two say
    everything :func:`merge_splits` needs to rebuild the softmax over all keys exactly.

    A piece of no keys (the last splits of a short sequence) gives a zero output and
    ``lse = -inf``: it has no weight in the merge. Lab-04's Triton kernel writes the same two
    things per split, in base 2 (``m + log2(l)``).

    Args:
        query: ``[num_heads, head_dim]``, one token's query.
        key, value: ``[n, num_kv_heads, head_dim]``, the piece's keys (``n >= 0``);
            ``num_heads % num_kv_heads == 0``.
        scale: softmax scale.

    Returns:
        ``(partial [num_heads, head_dim], lse [num_heads])``, in the compute dtype (float64
        for float64 inputs, float32 otherwise).
    """
    if query.ndim != 2 or key.ndim != 3 or key.shape != value.shape:
        raise ValueError(
            "query must be [num_heads, head_dim] and key, value [n, num_kv_heads, head_dim], "
            f"got {query.shape}, {key.shape}, {value.shape}"
        )
    num_heads, head_dim = query.shape
    n, num_kv_heads, kv_head_dim = key.shape
    if kv_head_dim != head_dim:
        raise ValueError(f"query head_dim {head_dim} differs from key head_dim {kv_head_dim}")
    group = _check_gqa(num_heads, num_kv_heads)
    dtype = _compute_dtype(query, key, value)
    if n == 0:
        return np.zeros((num_heads, head_dim), dtype), np.full(num_heads, -np.inf, dtype)
    q = query.astype(dtype, copy=False).reshape(num_kv_heads, group, head_dim)
    scores = np.einsum("hgd,shd->hgs", q, key.astype(dtype, copy=False)) * dtype.type(scale)
    m = scores.max(axis=-1, keepdims=True)
    p = np.exp(scores - m)
    total = p.sum(axis=-1, keepdims=True)
    partial = np.einsum("hgs,shd->hgd", p / total, value.astype(dtype, copy=False))
    lse = (m + np.log(total))[..., 0]
    return partial.reshape(num_heads, head_dim), lse.reshape(num_heads)


def merge_splits(partial: np.ndarray, lse: np.ndarray) -> np.ndarray:
    """Merge the splits of one decode query into the softmax over all its keys, exactly.

    Split ``i`` attended to its own keys with weights ``exp(s_t - lse_i)``; over all keys the
    weights are ``exp(s_t - LSE)`` with ``LSE = log(sum_i exp(lse_i))``. So the full output is
    ``sum_i w_i * partial_i`` with ``w_i = exp(lse_i - LSE)``: a softmax over the splits' lse.
    It is computed as ``exp(lse_i - max_j lse_j)`` normalised, so that an lse of several
    hundred does not overflow; a split with ``lse = -inf`` (no keys) gets weight 0, whatever
    its partial holds. This is the reduce step of vLLM's ``paged_attention_v2`` and of lab-04's
    ``_merge_splits_kernel``.

    Args:
        partial: ``[num_splits, num_heads, head_dim]``, each split's normalised output.
        lse: ``[num_splits, num_heads]``; at least one split per head is finite.

    Returns:
        ``[num_heads, head_dim]`` in ``partial``'s dtype.
    """
    if partial.ndim != 3 or lse.shape != partial.shape[:2]:
        raise ValueError(
            "partial must be [num_splits, num_heads, head_dim] and lse [num_splits, num_heads], "
            f"got {partial.shape} and {lse.shape}"
        )
    if partial.shape[0] == 0 or not np.isfinite(lse.max(axis=0)).all():
        raise ValueError("every head needs at least one split with keys (a finite lse)")
    top = lse.max(axis=0, keepdims=True)
    weights = np.exp(lse - top)  # exp(-inf) = 0: an empty split has no weight
    weights /= weights.sum(axis=0, keepdims=True)
    kept = np.where(np.isfinite(lse)[..., None], partial, 0.0)  # 0 * garbage must stay 0
    return np.einsum("sh,shd->hd", weights, kept).astype(partial.dtype, copy=False)


def paged_attention_decode_split_k(
    query: np.ndarray,
    key_cache: np.ndarray,
    value_cache: np.ndarray,
    block_tables: np.ndarray,
    seq_lens: np.ndarray,
    scale: float,
    num_splits: int,
) -> np.ndarray:
    """:func:`paged_attention_decode`, computed the way a split-K GPU kernel does.

    Each sequence's ``seq_len`` tokens are cut into ``num_splits`` contiguous ranges of
    ``cdiv(seq_len, num_splits)`` tokens (the last ranges may be short or empty), each range
    is attended to on its own (:func:`attend_split`), and the pieces are merged
    (:func:`merge_splits`). The result equals dense attention to rounding, whatever
    ``num_splits``: on a GPU the splits run in parallel, which is what makes a batch of a few
    long sequences fast; here they show that the merge is exact.

    Args:
        query, key_cache, value_cache, block_tables, seq_lens, scale: as in
            :func:`paged_attention_decode`.
        num_splits: ranges per sequence (>= 1); more splits than tokens leaves some empty.

    Returns:
        ``[num_seqs, num_heads, head_dim]`` in ``query``'s dtype.
    """
    _, _, num_kv_heads, head_dim = _check_cache(key_cache, value_cache)
    if query.ndim != 3:
        raise ValueError(f"query must be [num_seqs, num_heads, head_dim], got {query.shape}")
    num_seqs, num_heads, q_head_dim = query.shape
    if q_head_dim != head_dim:
        raise ValueError(f"query head_dim {q_head_dim} differs from the cache's {head_dim}")
    _check_gqa(num_heads, num_kv_heads)
    if int(num_splits) < 1:
        raise ValueError(f"num_splits must be >= 1, got {num_splits}")
    num_splits = int(num_splits)
    block_tables = np.asarray(block_tables)
    seq_lens = np.asarray(seq_lens)
    if block_tables.ndim != 2 or block_tables.shape[0] != num_seqs:
        raise ValueError(
            f"block_tables must be [num_seqs={num_seqs}, max_blocks], got {block_tables.shape}"
        )
    if seq_lens.shape != (num_seqs,):
        raise ValueError(f"seq_lens must be [num_seqs={num_seqs}], got {seq_lens.shape}")
    out = np.empty_like(query)
    for i in range(num_seqs):
        seq_len = int(seq_lens[i])
        k, v = _gather_sequence(key_cache, value_cache, block_tables[i], seq_len)
        per_split = cdiv(seq_len, num_splits)
        pieces = [
            attend_split(
                query[i],
                k[j * per_split : (j + 1) * per_split],
                v[j * per_split : (j + 1) * per_split],
                scale,
            )
            for j in range(num_splits)
        ]
        partial = np.stack([p for p, _ in pieces])
        lse = np.stack([m for _, m in pieces])
        out[i] = merge_splits(partial, lse)
    return out


def paged_attention_prefill(
    query: np.ndarray,
    key_cache: np.ndarray,
    value_cache: np.ndarray,
    block_table: np.ndarray,
    context_len: int,
    scale: float,
) -> np.ndarray:
    """A chunk of new tokens of one sequence attends causally to its cached prefix and itself.

    The queries sit at positions ``context_len .. context_len + query_len - 1``. The prefix
    (``context_len`` tokens) may come from an earlier chunk of a chunked prefill or from a prefix
    cache hit; the chunk's own K/V must already be in the cache (write first, then attend, as
    upstream's attention layers do), so the whole key sequence is read through ``block_table``.

    Args:
        query: ``[query_len, num_heads, head_dim]``.
        key_cache, value_cache: ``[num_blocks, block_size, num_kv_heads, head_dim]``.
        block_table: ``[max_blocks]`` of this sequence.
        context_len: number of tokens before the first query (>= 0).
        scale: softmax scale.

    Returns:
        ``[query_len, num_heads, head_dim]`` in ``query``'s dtype.
    """
    _, _, num_kv_heads, head_dim = _check_cache(key_cache, value_cache)
    if query.ndim != 3:
        raise ValueError(f"query must be [query_len, num_heads, head_dim], got {query.shape}")
    query_len, num_heads, q_head_dim = query.shape
    if q_head_dim != head_dim:
        raise ValueError(f"query head_dim {q_head_dim} differs from the cache's {head_dim}")
    _check_gqa(num_heads, num_kv_heads)
    block_table = np.asarray(block_table)
    if block_table.ndim != 1:
        raise ValueError(f"block_table must be 1-D [max_blocks], got shape {block_table.shape}")
    context_len = int(context_len)
    if context_len < 0:
        raise ValueError(f"context_len must be >= 0, got {context_len}")
    if query_len == 0:
        return np.empty_like(query)
    k, v = _gather_sequence(key_cache, value_cache, block_table, context_len + query_len)
    return dense_attention(query, k, v, scale, causal=True)
