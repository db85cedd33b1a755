# lab-04: write the functions below that raise NotImplementedError.
# Grade your work: make lab-04   Guide: labs/lab-04-triton-paged-attn/README.md
"""Paged attention in Triton, the cache write and a split-K GQA decode kernel: the file of lab-04.

You write the three ``@triton.jit`` kernels: ``_reshape_and_cache_kernel`` (one program per new
token copies its K and V rows to its slot; a negative slot is padding and writes nothing),
``_paged_decode_kernel`` (one program per sequence, KV head and split serves every query head of the
group, so each K/V tile is loaded once; it walks tiles of ``BLOCK_N`` tokens through the block table
with an online softmax in float32, base 2) and ``_merge_splits_kernel`` (combines the splits'
partial outputs by their log-sum-exp). Everything else is given. Read the launchers
``reshape_and_cache`` and ``paged_attention_decode`` first: they check shapes, choose the grid and
the number of splits, and show exactly what each kernel receives. Keep the kernels' names and
parameter lists: the launchers pass arguments by position, constexprs by name. Prefill and
``compute_slot_mapping`` come from the torch path
(``mini_vllm/attention/torch_paged_attention.py``).

Without a GPU the grader runs your kernels in Triton's interpreter on CPU tensors (set
``TRITON_INTERPRET=1`` before importing this module to do the same yourself); with one it compiles
them and adds tests at real shapes. A kernel that still contains ``raise NotImplementedError`` is
reported NOT STARTED without being run: delete that line when you start a kernel.
"""

from __future__ import annotations

import functools
import math
import os

import torch
import triton
import triton.language as tl

from mini_vllm.attention.torch_paged_attention import (
    compute_slot_mapping,
    paged_attention_prefill,
)

__all__ = [
    "compute_slot_mapping",
    "default_num_splits",
    "paged_attention_decode",
    "paged_attention_prefill",
    "reshape_and_cache",
]

_LOG2E = math.log2(math.e)  # exp(x) == exp2(x * log2(e))

# Launch defaults and split heuristic, from the tuning grid of ``bench/bench_paged_decode.py
# --sweep`` on an H100 (bf16, head_dim 128, GQA 4 and 8, block sizes 16-128). Tiles of 32 tokens
# with two pipeline stages were best or within 1 % on the split grids (batch <= 64): less shared
# memory per program, so more programs per SM and more loads in flight; 32 also keeps any block
# size >= 32 on the one-table-entry-per-tile path. With one split (large batches) each program
# walks its whole sequence in one long loop, which wants more loads in flight: 64-token tiles
# with three stages measured 2-17 % faster at batch 128 and within 2 % at batch 64. Splits of
# 64 tokens (not 256) made the batch-1 and batch-8 x 512 launches 1.07-1.78x faster and change
# nothing at batch >= 32 (``bench_paged_decode.py --split-floor 256,64``).
_BLOCK_N = 32
_NUM_WARPS = 4
_NUM_STAGES = 2
_ONE_SPLIT_BLOCK_N = 64
_ONE_SPLIT_NUM_STAGES = 3
_PROGRAMS_PER_SM = 4
_MIN_TOKENS_PER_SPLIT = 64
_MAX_SPLITS = 64


# --------------------------------------------------------------------------------------------
# reshape_and_cache
# --------------------------------------------------------------------------------------------


@triton.jit
def _reshape_and_cache_kernel(
    key_ptr,
    value_ptr,
    key_cache_ptr,
    value_cache_ptr,
    slot_mapping_ptr,
    stride_key_tok,
    stride_key_head,
    stride_value_tok,
    stride_value_head,
    stride_kc_blk,
    stride_kc_tok,
    stride_kc_head,
    stride_vc_blk,
    stride_vc_tok,
    stride_vc_head,
    NUM_KV_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    TILE: tl.constexpr,
):
    """Program ``(token, tile)``: copy token ``token``'s K and V rows into their cache slot.

    Each program reads ``slot_mapping[token]``; a negative slot is padding and the program
    returns before any store. Otherwise the slot splits into ``block = slot // BLOCK_SIZE`` and
    ``offset = slot % BLOCK_SIZE``, and the program copies elements ``tile * TILE ..`` of the
    token's ``NUM_KV_HEADS * HEAD_DIM`` values (head ``i // HEAD_DIM``, dim ``i % HEAD_DIM``),
    masked past the end, from ``key``/``value`` to ``key_cache``/``value_cache[block, offset]``.
    Every address is built from the strides passed in (elements, not bytes; ``head_dim`` has
    stride 1 everywhere), so strided inputs and a layer slice of a larger cache work as is.
    """
    raise NotImplementedError(
        "lab-04: _reshape_and_cache_kernel — copy token i's K/V rows to slot_mapping[i]; return "
        "early for a slot < 0"
    )


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
    if value_cache.dtype != key_cache.dtype:
        raise ValueError(f"key_cache is {key_cache.dtype} but value_cache is {value_cache.dtype}")
    if key_cache.stride(-1) != 1 or value_cache.stride(-1) != 1:
        raise ValueError("the caches' head_dim must be contiguous (stride 1)")
    num_blocks, block_size, num_kv_heads, head_dim = key_cache.shape
    if block_size & (block_size - 1):
        raise ValueError(f"block_size must be a power of two, got {block_size}")
    return num_blocks, block_size, num_kv_heads, head_dim


def reshape_and_cache(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Write each token's K/V rows to ``slot_mapping[token]``, in place; negative slots skipped.

    The launch grid is ``(num_tokens, tiles)``: one program (per tile of ``num_kv_heads *
    head_dim`` elements, one tile unless heads are very wide) per token, so the kernel has no loop
    and no cross-token coordination. Slots are not range-checked on the device (that would need a
    synchronising read-back); the numpy and torch paths validate them.

    Args:
        key, value: ``[num_tokens, num_kv_heads, head_dim]``; cast to the cache dtype first.
        key_cache, value_cache: ``[num_blocks, block_size, num_kv_heads, head_dim]`` (mutated).
        slot_mapping: ``[num_tokens]`` integer slots, negative for padding.
    """
    _, block_size, num_kv_heads, head_dim = _check_cache(key_cache, value_cache)
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
    num_tokens = key.shape[0]
    if num_tokens == 0:
        return
    # A dtype mismatch (rare: the engine projects K/V in the cache dtype) is resolved by torch,
    # which rounds every pair of dtypes correctly, rather than by a cast inside the kernel.
    key = key.to(key_cache.dtype)
    value = value.to(value_cache.dtype)
    if key.stride(-1) != 1:
        key = key.contiguous()
    if value.stride(-1) != 1:
        value = value.contiguous()
    slot_mapping = slot_mapping.contiguous()
    tile = min(triton.next_power_of_2(num_kv_heads * head_dim), 4096)
    grid = (num_tokens, triton.cdiv(num_kv_heads * head_dim, tile))
    _reshape_and_cache_kernel[grid](
        key,
        value,
        key_cache,
        value_cache,
        slot_mapping,
        key.stride(0),
        key.stride(1),
        value.stride(0),
        value.stride(1),
        key_cache.stride(0),
        key_cache.stride(1),
        key_cache.stride(2),
        value_cache.stride(0),
        value_cache.stride(1),
        value_cache.stride(2),
        NUM_KV_HEADS=num_kv_heads,
        HEAD_DIM=head_dim,
        BLOCK_SIZE=block_size,
        TILE=tile,
        num_warps=4,
    )


# --------------------------------------------------------------------------------------------
# paged_attention_decode
# --------------------------------------------------------------------------------------------


@triton.jit
def _paged_decode_kernel(
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    block_tables_ptr,
    seq_lens_ptr,
    out_ptr,  # final output [num_seqs, num_heads, D] if WRITE_FINAL, else partial outputs
    lse_ptr,  # [num_seqs, num_heads, num_splits] float32 (log2 domain); unused if WRITE_FINAL
    qk_scale,  # softmax scale * log2(e)
    num_splits,
    stride_q_seq,
    stride_q_head,
    stride_k_blk,
    stride_k_tok,
    stride_k_head,
    stride_v_blk,
    stride_v_tok,
    stride_v_head,
    stride_bt_seq,
    stride_o_seq,
    stride_o_head,
    stride_o_split,
    stride_lse_seq,
    stride_lse_head,
    QUERIES_PER_KV: tl.constexpr,
    GROUP_PAD: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HEAD_DIM_PAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    WRITE_FINAL: tl.constexpr,
    IEEE_DOT: tl.constexpr,
):
    """Program ``(seq, kv_head, split)``: one split of one sequence for one KV head's queries.

    The program serves the ``QUERIES_PER_KV`` query heads ``kv_head * QUERIES_PER_KV + g``
    together, as the rows of a ``[GROUP_PAD, HEAD_DIM_PAD]`` block (rows and columns past the
    real ones are masked), so every K/V element it loads is used by the whole group. The
    sequence's ``cdiv(seq_len, BLOCK_N)`` tiles of ``BLOCK_N`` tokens are divided into
    ``num_splits`` contiguous ranges of ``cdiv(num_tiles, num_splits)`` tiles; this program
    walks range ``split`` (possibly empty). Token ``t`` lives in physical block
    ``block_tables[seq, t // BLOCK_SIZE]`` at row ``t % BLOCK_SIZE``; tokens ``>= seq_len`` get
    score ``-inf``.

    The softmax is the streaming one, in float32 and in base 2: ``qk_scale`` already holds
    ``scale * log2(e)``, so scores go to ``exp2``. A running maximum ``m``, sum ``l`` and
    accumulator ``acc`` are rescaled by ``exp2(m_old - m_new)`` whenever the maximum grows.

    ``WRITE_FINAL`` (one split): store ``acc / l`` into ``out[seq, head]`` in the output dtype.
    Otherwise store the split's normalised partial ``acc / l`` (float32) at
    ``out[seq, head, split]`` and its log-sum-exp ``m + log2(l)`` at ``lse[seq, head, split]``;
    an empty split stores zeros and ``-inf``. ``IEEE_DOT`` runs both dots in float32 IEEE
    precision (fp32 caches, and the interpreter).
    """
    raise NotImplementedError(
        "lab-04: _paged_decode_kernel — one (sequence, KV head, split): online softmax over its "
        "tiles, all query heads of the group at once"
    )


@triton.jit
def _merge_splits_kernel(
    partial_ptr,  # [num_seqs, num_heads, num_splits, D] float32, each normalised by its own sum
    lse_ptr,  # [num_seqs, num_heads, num_splits] float32, log2 domain
    out_ptr,  # [num_seqs, num_heads, D]
    num_splits,
    stride_p_seq,
    stride_p_head,
    stride_p_split,
    stride_lse_seq,
    stride_lse_head,
    stride_o_seq,
    stride_o_head,
    HEAD_DIM: tl.constexpr,
    HEAD_DIM_PAD: tl.constexpr,
    SPLITS_PAD: tl.constexpr,
):
    """Program ``(seq, head)``: merge the ``num_splits`` partial outputs of one query head.

    Split ``i`` holds ``o_i = acc_i / l_i`` and ``lse_i = m_i + log2(l_i)`` (base 2). The exact
    softmax over the whole sequence weights each split by its share of the total sum,
    ``2**lse_i / sum_j 2**lse_j``; computing it as ``2**(lse_i - max lse)`` keeps every term
    in range, and an empty split (``lse = -inf``) gets weight 0. The result is stored in the
    output dtype at ``out[seq, head]``.
    """
    raise NotImplementedError(
        "lab-04: _merge_splits_kernel — combine the splits' partial outputs, weighting each by "
        "2**(lse - max lse)"
    )


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")


@functools.cache
def _num_sms(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 4  # the interpreter: a few splits, enough to exercise the merge


def default_num_splits(num_seqs: int, num_kv_heads: int, max_seq_len: int, num_sms: int) -> int:
    """How many programs to cut each (sequence, KV head) pair into.

    About ``_PROGRAMS_PER_SM`` programs per SM (so loads from several programs overlap), rounded
    *down*: on an H100 a grid that already has that many pairs ran best unsplit, and 256 pairs ran
    best with 2 splits, 64 pairs with 8. Never splits shorter than ``_MIN_TOKENS_PER_SPLIT``
    tokens: below that the fixed cost of a program (loading the query, writing a partial, the
    merge) outweighs its reads. Large batches get 1 split and no merge kernel at all.
    """
    pairs = max(1, num_seqs * num_kv_heads)
    wanted = _PROGRAMS_PER_SM * num_sms // pairs
    by_length = max(1, -(-max_seq_len // _MIN_TOKENS_PER_SPLIT))
    return max(1, min(wanted, by_length, _MAX_SPLITS))


def paged_attention_decode(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    *,
    max_seq_len: int | None = None,
    num_splits: int | None = None,
    block_n: int | None = None,
    num_warps: int | None = None,
    num_stages: int | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Decode attention through block tables: one query token per sequence, GQA, split-K.

    Nothing here reads device memory back to the host, so the call can be captured in a CUDA
    graph; that is why the split count comes from ``max_seq_len`` (default: the table's capacity,
    ``block_tables.shape[1] * block_size``) instead of the actual lengths. Lengths are not
    validated either: ``seq_lens[i]`` must be in ``1 .. block_tables.shape[1] * block_size`` and
    the used table entries must be valid block ids (entries past them are never read).

    Args:
        query: ``[num_seqs, num_heads, head_dim]``.
        key_cache, value_cache: ``[num_blocks, block_size, num_kv_heads, head_dim]``, fp16, bf16
            or fp32, ``head_dim`` contiguous; ``block_size`` a power of two.
        block_tables: ``[num_seqs, max_blocks]`` int32 or int64.
        seq_lens: ``[num_seqs]`` int32 or int64, lengths including the new token.
        scale: softmax scale.
        max_seq_len: an upper bound of ``seq_lens`` used to choose the split count.
        num_splits: force the number of splits (>= 1); default :func:`default_num_splits`.
        block_n, num_warps, num_stages: tuning overrides (tokens per tile, launch options).
        out: optional preallocated ``[num_seqs, num_heads, head_dim]`` output.

    Returns:
        ``[num_seqs, num_heads, head_dim]`` in ``query``'s dtype.
    """
    _, block_size, num_kv_heads, head_dim = _check_cache(key_cache, value_cache)
    if query.dim() != 3:
        raise ValueError(f"query must be [num_seqs, num_heads, head_dim], got {tuple(query.shape)}")
    num_seqs, num_heads, q_head_dim = query.shape
    if q_head_dim != head_dim:
        raise ValueError(f"query head_dim {q_head_dim} differs from the cache's {head_dim}")
    if num_heads % num_kv_heads != 0:
        raise ValueError(
            f"num_heads ({num_heads}) must be a multiple of num_kv_heads ({num_kv_heads})"
        )
    if block_tables.dim() != 2 or block_tables.shape[0] != num_seqs:
        raise ValueError(
            f"block_tables must be [num_seqs={num_seqs}, max_blocks], "
            f"got {tuple(block_tables.shape)}"
        )
    if seq_lens.shape != (num_seqs,):
        raise ValueError(f"seq_lens must be [num_seqs={num_seqs}], got {tuple(seq_lens.shape)}")
    if block_tables.dtype.is_floating_point or seq_lens.dtype.is_floating_point:
        raise ValueError("block_tables and seq_lens must be integer tensors")
    if key_cache.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise ValueError(f"cache dtype must be fp16, bf16 or fp32, got {key_cache.dtype}")
    if out is None:
        out = torch.empty_like(query)
    elif out.shape != query.shape:
        raise ValueError(f"out must have the query's shape {tuple(query.shape)}")
    if num_seqs == 0:
        return out
    if query.dtype != key_cache.dtype:
        query = query.to(key_cache.dtype)  # the dots run in the cache dtype; out keeps its own
    if query.stride(-1) != 1:
        query = query.contiguous()
    if block_tables.stride(-1) != 1:
        block_tables = block_tables.contiguous()
    seq_lens = seq_lens.contiguous()

    queries_per_kv = num_heads // num_kv_heads
    if max_seq_len is None:
        max_seq_len = block_tables.shape[1] * block_size
    if num_splits is None:
        num_splits = default_num_splits(num_seqs, num_kv_heads, max_seq_len, _num_sms(query.device))
    if num_splits < 1:
        raise ValueError(f"num_splits must be >= 1, got {num_splits}")
    one_split = num_splits == 1
    block_n = block_n or (_ONE_SPLIT_BLOCK_N if one_split else _BLOCK_N)
    if block_n < 16 or block_n & (block_n - 1):
        raise ValueError(f"block_n must be a power of two >= 16, got {block_n}")
    launch = {
        "num_warps": num_warps or _NUM_WARPS,
        "num_stages": num_stages or (_ONE_SPLIT_NUM_STAGES if one_split else _NUM_STAGES),
    }
    group_pad = max(16, triton.next_power_of_2(queries_per_kv))
    head_dim_pad = max(16, triton.next_power_of_2(head_dim))
    qk_scale = float(scale) * _LOG2E
    grid = (num_seqs, num_kv_heads, num_splits)
    common = {
        "QUERIES_PER_KV": queries_per_kv,
        "GROUP_PAD": group_pad,
        "HEAD_DIM": head_dim,
        "HEAD_DIM_PAD": head_dim_pad,
        "BLOCK_SIZE": block_size,
        "BLOCK_N": block_n,
        # fp32 caches get IEEE (not TF32) dots; the interpreter's bf16 dot is broken, so there
        # every dot runs in fp32 as well.
        "IEEE_DOT": key_cache.dtype == torch.float32 or _interpreting(),
    }
    if num_splits == 1:
        _paged_decode_kernel[grid](
            query, key_cache, value_cache, block_tables, seq_lens, out, out,
            qk_scale, 1,
            query.stride(0), query.stride(1),
            key_cache.stride(0), key_cache.stride(1), key_cache.stride(2),
            value_cache.stride(0), value_cache.stride(1), value_cache.stride(2),
            block_tables.stride(0),
            out.stride(0), out.stride(1), 0,
            0, 0,
            WRITE_FINAL=True, **common, **launch,
        )  # fmt: skip
        return out

    partial = torch.empty(
        (num_seqs, num_heads, num_splits, head_dim), dtype=torch.float32, device=query.device
    )
    lse = torch.empty((num_seqs, num_heads, num_splits), dtype=torch.float32, device=query.device)
    _paged_decode_kernel[grid](
        query, key_cache, value_cache, block_tables, seq_lens, partial, lse,
        qk_scale, num_splits,
        query.stride(0), query.stride(1),
        key_cache.stride(0), key_cache.stride(1), key_cache.stride(2),
        value_cache.stride(0), value_cache.stride(1), value_cache.stride(2),
        block_tables.stride(0),
        partial.stride(0), partial.stride(1), partial.stride(2),
        lse.stride(0), lse.stride(1),
        WRITE_FINAL=False, **common, **launch,
    )  # fmt: skip
    _merge_splits_kernel[(num_seqs, num_heads)](
        partial, lse, out, num_splits,
        partial.stride(0), partial.stride(1), partial.stride(2),
        lse.stride(0), lse.stride(1),
        out.stride(0), out.stride(1),
        HEAD_DIM=head_dim,
        HEAD_DIM_PAD=head_dim_pad,
        SPLITS_PAD=max(2, triton.next_power_of_2(num_splits)),
        num_warps=4,
    )  # fmt: skip
    return out
