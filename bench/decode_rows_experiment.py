"""Does reading whole KV rows speed up decode attention for narrow KV heads? (It does not.)

SmolLM2-135M's cache rows are narrow: 3 KV heads x 64 dims, so a token's row is 384 bytes (bf16
K) and lab-04's kernel, one program per (sequence, KV head), reads a 128-byte third of each row
with a 384-byte stride. docs/performance.md once named that layout as what keeps the SmolLM2
step above twice its bandwidth floor. This script tests the claim with a kernel built to read
whole rows: one program per sequence serves every query head, and walks the sequence's
``(token, kv_head)`` rows, which lie contiguously inside a block, in tiles of ``ROWS`` rows.
Each query head scores every row of its tile and masks out the rows of other KV heads (two
thirds of the dot's work is thrown away; decode attention is bound by memory, not by the
dot). Same lengths and cache as ``sweep_decode_tiles.py`` (the engine benchmark's batch-256
state), against the engine's launch (``decode_launch_options``) and lab-04's default one.

    python bench/decode_rows_experiment.py --out docs/perf/decode_rows_experiment_h100.md

The kernel is an experiment, not the engine's: it exists to keep the measurement repeatable.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import math
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from sweep_decode_tiles import (  # noqa: E402
    BLOCK_SIZE,
    GENERATED,
    HEAD_DIM,
    SHAPES,
    engine_batch_state,
)


@triton.jit
def _whole_rows_decode_kernel(
    q_ptr, k_ptr, v_ptr, tables_ptr, lens_ptr, out_ptr, qk_scale,
    stride_q_seq, stride_k_blk, stride_v_blk, stride_t_seq, stride_o_seq,
    NUM_HEADS: tl.constexpr, HEADS_PAD: tl.constexpr, NUM_KV_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr, ROWS: tl.constexpr,
):  # fmt: skip
    """Program ``seq``: all query heads over the ``seq_len * NUM_KV_HEADS`` cache rows (row
    ``f`` is token ``f // NUM_KV_HEADS``, KV head ``f % NUM_KV_HEADS``), streaming softmax in
    base 2, one split. Needs a contiguous ``[blocks, BLOCK_SIZE, NUM_KV_HEADS, HEAD_DIM]`` cache
    and ``ROWS >= NUM_KV_HEADS`` (each tile but the last holds a row of every KV head)."""
    seq = tl.program_id(0)
    seq_len = tl.load(lens_ptr + seq)
    offs_h = tl.arange(0, HEADS_PAD)
    offs_d = tl.arange(0, HEAD_DIM)
    offs_r = tl.arange(0, ROWS)
    h_mask = offs_h < NUM_HEADS
    q = tl.load(
        q_ptr + seq.to(tl.int64) * stride_q_seq + offs_h[:, None] * HEAD_DIM + offs_d[None, :],
        mask=h_mask[:, None],
        other=0.0,
    )
    kv_head_of_query = offs_h // (NUM_HEADS // NUM_KV_HEADS)
    rows_per_block: tl.constexpr = BLOCK_SIZE * NUM_KV_HEADS
    num_rows = seq_len * NUM_KV_HEADS
    m_i = tl.full([HEADS_PAD], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([HEADS_PAD], dtype=tl.float32)
    acc = tl.zeros([HEADS_PAD, HEAD_DIM], dtype=tl.float32)
    table = tables_ptr + seq.to(tl.int64) * stride_t_seq
    for tile in range(tl.cdiv(num_rows, ROWS)):
        f = tile * ROWS + offs_r
        f_mask = f < num_rows
        block = tl.load(table + f // rows_per_block, mask=f_mask, other=0).to(tl.int64)
        within = (f % rows_per_block)[:, None] * HEAD_DIM + offs_d[None, :]
        k = tl.load(k_ptr + block[:, None] * stride_k_blk + within, mask=f_mask[:, None])
        v = tl.load(v_ptr + block[:, None] * stride_v_blk + within, mask=f_mask[:, None])
        own = f_mask[None, :] & (kv_head_of_query[:, None] == (f % NUM_KV_HEADS)[None, :])
        s = tl.where(own, tl.dot(q, tl.trans(k)) * qk_scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # padded query rows
        alpha = tl.exp2(m_i - m_safe)
        p = tl.exp2(s - m_safe[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new
    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    o_ptrs = (
        out_ptr + seq.to(tl.int64) * stride_o_seq + offs_h[:, None] * HEAD_DIM + offs_d[None, :]
    )
    tl.store(o_ptrs, out.to(out_ptr.dtype.element_ty), mask=h_mask[:, None])


def whole_rows_decode(query, key_cache, value_cache, tables, seq_lens, scale, rows, warps, stages):
    num_seqs, num_heads, head_dim = query.shape
    out = torch.empty_like(query)
    _whole_rows_decode_kernel[(num_seqs,)](
        query, key_cache, value_cache, tables, seq_lens, out, scale * math.log2(math.e),
        query.stride(0), key_cache.stride(0), value_cache.stride(0), tables.stride(0),
        out.stride(0),
        NUM_HEADS=num_heads, HEADS_PAD=max(16, triton.next_power_of_2(num_heads)),
        NUM_KV_HEADS=key_cache.shape[2], HEAD_DIM=head_dim, BLOCK_SIZE=key_cache.shape[1],
        ROWS=rows, num_warps=warps, num_stages=stages,
    )  # fmt: skip
    return out


def measure(
    name: str,
    num_heads: int,
    num_kv_heads: int,
    tables: torch.Tensor,
    seq_lens: torch.Tensor,
    num_blocks: int,
) -> str:
    """One table row: the copy, lab-04's kernel (two launches) and the best whole-row launch."""
    from mini_vllm.attention.triton_paged_attention import paged_attention_decode
    from mini_vllm.model.attention import decode_launch_options

    bench = functools.partial(triton.testing.do_bench, warmup=25, rep=200)
    cache = torch.randn(
        2, num_blocks, BLOCK_SIZE, num_kv_heads, HEAD_DIM, dtype=torch.bfloat16, device="cuda"
    )
    query = torch.randn(len(seq_lens), num_heads, HEAD_DIM, dtype=torch.bfloat16, device="cuda")
    kv_bytes = 2 * int(seq_lens.sum()) * num_kv_heads * HEAD_DIM * 2
    src = torch.empty(kv_bytes // 2, dtype=torch.bfloat16, device="cuda")
    dst = torch.empty_like(src)
    copy_ms = bench(lambda: dst.copy_(src)) / 2  # a copy reads and writes the bytes
    call = functools.partial(paged_attention_decode, query, cache[0], cache[1], tables, seq_lens)
    engine_ms = bench(lambda: call(0.125, **decode_launch_options(HEAD_DIM)))
    default_ms = bench(lambda: call(0.125))
    reference = call(0.125).float()
    timed = []
    for rows, warps, stages in itertools.product((64, 128, 256), (2, 4, 8), (2, 3)):
        run = functools.partial(
            whole_rows_decode, query, cache[0], cache[1], tables, seq_lens, 0.125,
            rows, warps, stages,
        )  # fmt: skip
        err = (run().float() - reference).abs().max().item()
        assert err < 2e-2, f"{name} rows={rows}: max error {err}"
        timed.append((bench(run), rows, warps, stages))
    best_ms, *best = min(timed)

    def cell(ms: float) -> str:
        return f"{ms * 1e3:.1f} us ({copy_ms / ms:.0%} of copy)"

    return (
        f"| {name} ({num_heads}/{num_kv_heads} heads) | {kv_bytes / 1e6:.0f} MB | "
        f"{copy_ms * 1e3:.1f} us | {cell(engine_ms)} | {cell(default_ms)} | {cell(best_ms)} "
        f"| {', '.join(map(str, best))} | {engine_ms / best_ms:.2f}x |"
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, default=None, help="markdown report")
    args = p.parse_args(argv)

    tables, seq_lens, next_block = engine_batch_state()
    lens = seq_lens.cpu()
    lines = [
        "## Whole-row decode attention against lab-04's kernel (64-wide heads, batch 256)",
        "",
        f"Command: `python bench/decode_rows_experiment.py --out {args.out}`",
        "",
        f"Device: {torch.cuda.get_device_name()}, torch {torch.__version__}, triton "
        f"{triton.__version__}. Lengths: the engine benchmark's prompts + {GENERATED} (mean "
        f"{float(lens.float().mean()):.0f}), blocks of {BLOCK_SIZE}, bf16, one split. Time: "
        "`triton.testing.do_bench` median; copy: `torch.Tensor.copy_` of the same bytes.",
        "",
        "| shape | KV read | copy | engine's launch | lab-04 default | whole rows, best | "
        "best options (rows, warps, stages) | engine / whole rows (> 1: rows faster) |",
        "|---|---:|---:|---:|---:|---:|---|---:|",
    ]
    torch.manual_seed(0)
    for name, (num_heads, num_kv_heads) in SHAPES.items():
        lines.append(measure(name, num_heads, num_kv_heads, tables, seq_lens, next_block))
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
