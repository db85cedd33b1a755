"""Paged attention for a whole mixed step in Triton: prefills, prefill chunks and decodes at once.

The decode kernel of lab-04 assumes one new token per sequence, and the torch reference
(:func:`~mini_vllm.attention.torch_paged_attention.paged_attention_varlen`) loops over the
sequences in Python. This kernel does the whole step in one launch per layer, the job of
upstream's ``vllm/v1/attention/ops/triton_unified_attention.py``, with the reference's metadata
(``query_start_loc``, ``seq_lens``, ``block_tables``) and a grid the host sizes without reading the
GPU. How a flat token axis becomes that grid: docs/upstream-fidelity.md (module notes).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from mini_vllm.attention.triton_paged_attention import _LOG2E, _check_cache, _interpreting

__all__ = ["paged_attention_varlen"]

# Rows of (token, head) pairs per program and keys per tile. 64 x 32 keeps a program's tiles in
# registers for head_dim up to 128 with 4 warps; prefill steps are bound by the model's matmuls,
# not by this kernel, so no per-shape tuning is attempted.
_BLOCK_M = 64
_BLOCK_N = 32
_NUM_WARPS = 4
_NUM_STAGES = 2


@triton.jit
def _find_sequence(query_start_loc_ptr, num_seqs, pid, BLOCK_Q: tl.constexpr):
    """The largest ``seq`` with ``query_start_loc[seq] // BLOCK_Q + seq <= pid`` (binary search)."""
    lo = 0
    hi = num_seqs - 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        start = tl.load(query_start_loc_ptr + mid) // BLOCK_Q + mid
        if start <= pid:
            lo = mid
        else:
            hi = mid - 1
    return lo


# Triton compiles a variant of a kernel per "shape class" of its integer arguments (== 1,
# divisible by 16, other). The batch size and the block table's width change from step to step,
# so without this a long-running engine stalls for a fresh compile (~0.5 s on an H100) whenever
# one of them first lands in a new class; the grid does not depend on them being known.
@triton.jit(do_not_specialize=["num_seqs", "stride_bt_seq"])
def _paged_varlen_kernel(
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    block_tables_ptr,
    query_start_loc_ptr,
    seq_lens_ptr,
    out_ptr,
    qk_scale,  # softmax scale * log2(e)
    num_seqs,
    stride_q_tok,
    stride_q_head,
    stride_k_blk,
    stride_k_tok,
    stride_k_head,
    stride_v_blk,
    stride_v_tok,
    stride_v_head,
    stride_bt_seq,
    stride_o_tok,
    stride_o_head,
    QUERIES_PER_KV: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HEAD_DIM_PAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    BLOCK_N: tl.constexpr,
    IEEE_DOT: tl.constexpr,
):
    """Program ``(query tile, kv_head)``: ``BLOCK_Q`` tokens x the KV head's query heads.

    Row ``r`` of the program's ``[BLOCK_M, HEAD_DIM_PAD]`` block is token ``r // QUERIES_PER_KV``
    of the tile and query head ``kv_head * QUERIES_PER_KV + r % QUERIES_PER_KV``; rows past
    ``BLOCK_Q * QUERIES_PER_KV`` or past the sequence's last query token are masked and stored
    nowhere. Key ``n`` is visible to a row at position ``p`` when ``n <= p``.
    """
    pid = tl.program_id(0)
    kv_head = tl.program_id(1)
    seq = _find_sequence(query_start_loc_ptr, num_seqs, pid, BLOCK_Q)
    q_start = tl.load(query_start_loc_ptr + seq)
    query_len = tl.load(query_start_loc_ptr + seq + 1) - q_start
    q_tile = pid - (q_start // BLOCK_Q + seq)
    if q_tile * BLOCK_Q >= query_len:
        return  # a gap between two sequences' tiles
    seq_len = tl.load(seq_lens_ptr + seq)
    context_len = seq_len - query_len

    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM_PAD)
    offs_t = tl.arange(0, BLOCK_N)
    token_in_tile = offs_m // QUERIES_PER_KV
    query_idx = q_tile * BLOCK_Q + token_in_tile  # index among the sequence's new tokens
    heads = kv_head * QUERIES_PER_KV + offs_m % QUERIES_PER_KV
    m_mask = (token_in_tile < BLOCK_Q) & (query_idx < query_len)
    d_mask = offs_d < HEAD_DIM
    positions = context_len + query_idx  # causal limit of each row

    tokens = (q_start + query_idx).to(tl.int64)
    q = tl.load(
        q_ptr + tokens[:, None] * stride_q_tok + heads[:, None] * stride_q_head + offs_d[None, :],
        mask=m_mask[:, None] & d_mask[None, :],
        other=0.0,
    ).to(k_cache_ptr.dtype.element_ty)

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM_PAD], dtype=tl.float32)

    # Keys up to the position of the tile's last real token.
    last_query = tl.minimum((q_tile + 1) * BLOCK_Q, query_len) - 1
    num_keys = context_len + last_query + 1
    table = block_tables_ptr + seq.to(tl.int64) * stride_bt_seq
    k_base = k_cache_ptr + kv_head * stride_k_head + offs_d[None, :]
    v_base = v_cache_ptr + kv_head * stride_v_head + offs_d[None, :]
    for start in range(0, num_keys, BLOCK_N):
        offs_n = start + offs_t
        n_mask = offs_n < num_keys
        if BLOCK_SIZE >= BLOCK_N:
            block = tl.load(table + start // BLOCK_SIZE).to(tl.int64)
            in_block = start % BLOCK_SIZE + offs_t
            k_rows = block * stride_k_blk + in_block * stride_k_tok
            v_rows = block * stride_v_blk + in_block * stride_v_tok
        else:
            blocks = tl.load(table + offs_n // BLOCK_SIZE, mask=n_mask, other=0).to(tl.int64)
            in_block = offs_n % BLOCK_SIZE
            k_rows = blocks * stride_k_blk + in_block * stride_k_tok
            v_rows = blocks * stride_v_blk + in_block * stride_v_tok
        kv_mask = n_mask[:, None] & d_mask[None, :]
        k = tl.load(k_base + k_rows[:, None], mask=kv_mask, other=0.0)
        v = tl.load(v_base + v_rows[:, None], mask=kv_mask, other=0.0)

        if IEEE_DOT:
            s = tl.dot(q.to(tl.float32), tl.trans(k.to(tl.float32)), input_precision="ieee")
        else:
            s = tl.dot(q, tl.trans(k))
        visible = (offs_n[None, :] <= positions[:, None]) & m_mask[:, None]
        s = tl.where(visible, s * qk_scale, float("-inf"))
        # A row with nothing visible yet keeps m = -inf; subtract 0 instead to avoid inf - inf.
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m_i - m_safe)
        p = tl.exp2(s - m_safe[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        if IEEE_DOT:
            pv = tl.dot(p, v.to(tl.float32), input_precision="ieee")
        else:
            pv = tl.dot(p.to(v.dtype), v)
        acc = acc * alpha[:, None] + pv
        m_i = m_new

    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    o_ptrs = out_ptr + tokens[:, None] * stride_o_tok + heads[:, None] * stride_o_head
    tl.store(
        o_ptrs + offs_d[None, :],
        out.to(out_ptr.dtype.element_ty),
        mask=m_mask[:, None] & d_mask[None, :],
    )


def paged_attention_varlen(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    *,
    block_m: int | None = None,
    block_n: int | None = None,
    num_warps: int | None = None,
    num_stages: int | None = None,
) -> torch.Tensor:
    """Causal paged attention for one flattened step, one kernel launch, no host reads.

    Same contract as the torch reference
    :func:`mini_vllm.attention.torch_paged_attention.paged_attention_varlen`: sequence ``i`` owns
    query rows ``query_start_loc[i] : query_start_loc[i + 1]``, the last ``query_len`` of its
    ``seq_lens[i]`` tokens, whose K/V are already in the cache (``reshape_and_cache`` runs first).
    Rows past ``query_start_loc[-1]`` are returned as zeros. Unlike the reference, nothing is
    validated on the device: ``query_start_loc`` must start at 0 and not decrease, and
    ``seq_lens[i] >= query_len`` with every used table entry a valid block id.

    Args:
        query: ``[num_tokens, num_heads, head_dim]``.
        key_cache, value_cache: ``[num_blocks, block_size, num_kv_heads, head_dim]``, fp16, bf16
            or fp32, ``head_dim`` contiguous; ``block_size`` a power of two.
        block_tables: ``[num_seqs, max_blocks]`` int32 or int64.
        query_start_loc: ``[num_seqs + 1]`` int32 or int64.
        seq_lens: ``[num_seqs]`` int32 or int64.
        scale: softmax scale.
        block_m, block_n, num_warps, num_stages: tuning overrides.

    Returns:
        ``[num_tokens, num_heads, head_dim]`` in ``query``'s dtype.
    """
    _, block_size, num_kv_heads, head_dim = _check_cache(key_cache, value_cache)
    if query.dim() != 3 or query.shape[2] != head_dim:
        raise ValueError(
            f"query must be [num_tokens, num_heads, head_dim={head_dim}], got {tuple(query.shape)}"
        )
    num_tokens, num_heads, _ = query.shape
    if num_heads % num_kv_heads != 0:
        raise ValueError(f"num_heads ({num_heads}) must be a multiple of {num_kv_heads=}")
    if seq_lens.dim() != 1:
        raise ValueError(f"seq_lens must be 1-D [num_seqs], got {tuple(seq_lens.shape)}")
    num_seqs = seq_lens.shape[0]
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
    if key_cache.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise ValueError(f"cache dtype must be fp16, bf16 or fp32, got {key_cache.dtype}")
    out = torch.zeros_like(query)
    if num_seqs == 0 or num_tokens == 0:
        return out
    if query.dtype != key_cache.dtype:
        query = query.to(key_cache.dtype)
    if query.stride(-1) != 1:
        query = query.contiguous()
    if block_tables.stride(-1) != 1:
        block_tables = block_tables.contiguous()
    query_start_loc = query_start_loc.contiguous()
    seq_lens = seq_lens.contiguous()

    queries_per_kv = num_heads // num_kv_heads
    block_m = block_m or max(_BLOCK_M, triton.next_power_of_2(queries_per_kv))
    block_n = block_n or _BLOCK_N
    for name, value in (("block_m", block_m), ("block_n", block_n)):
        if value < 16 or value & (value - 1):
            raise ValueError(f"{name} must be a power of two >= 16, got {value}")
    if block_m < queries_per_kv:
        raise ValueError(f"block_m ({block_m}) must hold one token's {queries_per_kv} heads")
    block_q = block_m // queries_per_kv
    grid = (num_tokens // block_q + num_seqs, num_kv_heads)
    _paged_varlen_kernel[grid](
        query, key_cache, value_cache, block_tables, query_start_loc, seq_lens, out,
        float(scale) * _LOG2E, num_seqs,
        query.stride(0), query.stride(1),
        key_cache.stride(0), key_cache.stride(1), key_cache.stride(2),
        value_cache.stride(0), value_cache.stride(1), value_cache.stride(2),
        block_tables.stride(0),
        out.stride(0), out.stride(1),
        QUERIES_PER_KV=queries_per_kv,
        HEAD_DIM=head_dim,
        HEAD_DIM_PAD=max(16, triton.next_power_of_2(head_dim)),
        BLOCK_SIZE=block_size,
        BLOCK_M=block_m,
        BLOCK_Q=block_q,
        BLOCK_N=block_n,
        # fp32 caches get IEEE dots; the interpreter's bf16 dot is broken (see the decode kernel).
        IEEE_DOT=key_cache.dtype == torch.float32 or _interpreting(),
        num_warps=num_warps or _NUM_WARPS,
        num_stages=num_stages or _NUM_STAGES,
    )  # fmt: skip
    return out
