"""Decode attention tile options at the engine benchmark's batch-256 state, for 64-wide heads.

lab-04's kernel defaults (32-token tiles, 4 warps, 2 stages) were tuned on 128-wide heads. The
engine benchmark's models have 64-wide heads (SmolLM2-135M: 9 query / 3 KV heads; Llama-3.2-1B:
32 / 8), so this times the decode kernel on their shapes at the state where the engine spends
its largest decode steps: 256 sequences whose lengths are the benchmark's prompts (uniform in
[100, 1024], seed 0) plus 42 generated tokens, in a paged cache of 16-token blocks handed out
in order, as a fresh engine does. It sweeps tokens per tile, warps, stages and splits, and prints
each against lab-04's defaults. ``mini_vllm.model.attention.decode_launch_options`` holds the
choice.

    python bench/sweep_decode_tiles.py --out docs/perf/decode_tiles_h100.md
"""

from __future__ import annotations

import argparse
import functools
import itertools
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import bench_engine  # noqa: E402  (same directory)

SHAPES = {"smollm2-135m": (9, 3), "llama-1b": (32, 8)}
HEAD_DIM, BLOCK_SIZE, GENERATED = 64, 16, 42


def engine_batch_state() -> tuple[Any, Any, int]:
    """Block tables and lengths (on the GPU) of the engine benchmark's batch-256 decode state,
    blocks handed out in order from block 1 as a fresh engine does, and the blocks used + 1."""
    import torch

    work = bench_engine.make_workload(256, 100, 1024, 100, 1024, 0, 10_000)
    lens = torch.tensor([len(r["prompt"]) + GENERATED for r in work], dtype=torch.int32)
    blocks = (lens + BLOCK_SIZE - 1) // BLOCK_SIZE
    tables = torch.zeros(len(lens), int(blocks.max()), dtype=torch.int32)
    next_block = 1  # block 0 is the null block
    for i, n in enumerate(blocks.tolist()):
        tables[i, :n] = torch.arange(next_block, next_block + n)
        next_block += n
    return tables.cuda(), lens.cuda(), next_block


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, default=None, help="markdown table")
    args = p.parse_args(argv)

    import torch
    import triton

    from mini_vllm.attention.triton_paged_attention import paged_attention_decode

    tables, seq_lens, next_block = engine_batch_state()
    lens = seq_lens.cpu()
    lines = [
        "## Decode attention tiles at batch 256 (64-wide heads)",
        "",
        f"Command: `python bench/sweep_decode_tiles.py --out {args.out}`",
        "",
        f"Device: {torch.cuda.get_device_name()}, torch {torch.__version__}, triton "
        f"{triton.__version__}. Lengths: the engine benchmark's prompts + {GENERATED} "
        f"(mean {float(lens.float().mean()):.0f}, max {int(lens.max())}), blocks of "
        f"{BLOCK_SIZE} tokens, bf16. Time: `triton.testing.do_bench` median.",
        "",
    ]
    grid = list(itertools.product((1, 2, 4), (32, 64), (2, 4), (2, 3)))
    torch.manual_seed(0)
    for name, (num_heads, num_kv_heads) in SHAPES.items():
        cache = torch.randn(
            2, next_block, BLOCK_SIZE, num_kv_heads, HEAD_DIM, dtype=torch.bfloat16, device="cuda"
        )
        query = torch.randn(len(lens), num_heads, HEAD_DIM, dtype=torch.bfloat16, device="cuda")
        kv_bytes = 2 * int(lens.sum()) * num_kv_heads * HEAD_DIM * 2
        results = []
        for splits, block_n, warps, stages in grid:
            call = functools.partial(
                paged_attention_decode,
                query,
                cache[0],
                cache[1],
                tables,
                seq_lens,
                0.125,
                num_splits=splits,
                block_n=block_n,
                num_warps=warps,
                num_stages=stages,
            )
            ms = triton.testing.do_bench(call, warmup=25, rep=200)
            results.append((ms, splits, block_n, warps, stages))
        default = next(r[0] for r in results if r[1:] == (1, 32, 4, 2))
        lines += [
            f"### {name} ({num_heads} query / {num_kv_heads} KV heads)",
            "",
            "| splits | tokens per tile | warps | stages | time (us) | GB/s | vs lab-04 defaults |",
            "|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for ms, splits, block_n, warps, stages in sorted(results):
            lines.append(
                f"| {splits} | {block_n} | {warps} | {stages} | {ms * 1e3:.1f} | "
                f"{kv_bytes / ms / 1e6:,.0f} | {default / ms:.2f}x |"
            )
        lines.append("")
    text = "\n".join(lines)
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
