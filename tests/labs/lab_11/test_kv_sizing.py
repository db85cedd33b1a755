"""lab-11, part 6: KV blocks per rank. A block costs each rank only its own KV heads; every rank
gets the smallest block count any rank can hold; and the guide's worked table follows."""

from __future__ import annotations

from grading.suite import graded
from mini_vllm.worker import kv_sizing as ref_kv
from tests.labs.lab_11.support import KV_BLOCKS, check_table, side, value

KiB, GiB = 2**10, 2**30


@graded(
    3,
    "bytes_per_block_per_rank = bytes_per_block with max(1, kv // tp) KV heads: the "
    "rank's share, and never below one head (replicated); ValueError for tp < 1",
    KV_BLOCKS,
)
def test_bytes_per_block_per_rank():
    """Every (KV heads, ranks) pair up to 16; SmolLM2 in float32 at TP 1 and 3; Llama-3-8B in
    bfloat16 at TP 8 and 16 (its 8 KV heads replicated on 2 ranks each); TP 0 and -2 refused."""
    cases = [
        [16, 2, kv, 8, 2, tp]
        for kv in range(1, 17)
        for tp in range(1, 17)
        if kv % tp == 0 or tp % kv == 0
    ]
    cases += [[16, 2, 4, 8, 2, -2]]  # below 1 is refused, not only 0
    cases += [[16, 30, 3, 64, "float32", tp] for tp in (1, 3)]
    cases += [[16, 32, 8, 128, "bfloat16", tp] for tp in (8, 16)]
    cases += [[16, 30, 3, 64, 4, 0]]
    got = check_table("bytes_per_block_per_rank", cases, "bytes per block per rank")
    smollm2 = [value(o, "SmolLM2") // KiB for o in got[-5:-3]]
    assert smollm2 == [720, 240], (
        f"SmolLM2 (30 layers, 3 KV heads, head_dim 64, float32, 16-token blocks) at TP 1 and 3 "
        f"should take 720 and 240 KiB per block per rank, got {smollm2}"
    )
    llama = [value(o, "Llama-3-8B") // KiB for o in got[-3:-1]]
    assert llama == [256, 256], (
        f"Llama-3-8B (32 layers, 8 KV heads, head_dim 128, bfloat16, 16-token blocks) at TP 8 "
        f"and 16 should take 256 KiB per block per rank both times (at 16 each rank still holds "
        f"one whole KV head, replicated), got {llama}"
    )


@graded(
    2,
    "num_gpu_blocks_across_ranks: the MINIMUM of the ranks' counts (the one scheduler's "
    "block ids must be valid on every rank), 0 included; ValueError for an empty list; the "
    "ranks' list is read, never reordered",
    KV_BLOCKS,
)
def test_every_rank_gets_the_smallest_count():
    """[900, 850, 1000] -> 850 and [300, 500, 400] -> 300: a rank that measured less memory
    limits them all, rank 0 included; [500, 0, 700] -> 0: a rank with no room for a block leaves
    none for the others. The list the executor passes is still in rank order afterwards."""
    check_table(
        "num_gpu_blocks_across_ranks",
        [
            [[900, 850, 1000]],
            [[7]],
            [[5, 5]],
            [[12_000, 7_999, 10_500, 8_000]],
            [[500, 0, 700]],
            [[300, 500, 400]],
            [[]],
        ],
        "the block count every rank agrees on",
    )
    counts = [900, 850, 1000]
    (got,) = side().outcomes("num_gpu_blocks_across_ranks", [[counts]])
    value(got, f"num_gpu_blocks_across_ranks({counts})")
    after = got[2]  # the list as it is after the call
    assert after == counts, (
        f"num_gpu_blocks_across_ranks({counts}) left the ranks' list as {after}: it must not "
        f"reorder it (no .sort() in place): the executor then looks the tightest rank up by "
        f"its position in that list (blocks.index) and sizes the cache from another rank's "
        f"memory"
    )


def guide_row(m, params: int, layers: int, kv: int, head_dim: int, other: int, tp: int):
    """The guide's model: an 80 GiB GPU at 0.9, bf16 weights split evenly, ``other`` bytes of
    activations and runtime per rank, 16-token blocks, 8,192-token requests. Your block size
    per rank and your agreement across ranks; the rest is lab-03's (the reference's)."""
    block = value(
        side().outcomes("bytes_per_block_per_rank", [[16, layers, kv, head_dim, "bfloat16", tp]])[
            0
        ],
        f"bytes_per_block_per_rank(16, {layers}, {kv}, {head_dim}, 'bfloat16', {tp})",
    )
    budget = ref_kv.available_kv_cache_memory(80 * GiB, 0.9, params * 2 // tp + other)
    per_rank = [ref_kv.num_gpu_blocks_from_budget(budget, block)] * tp
    blocks = value(
        m.outcomes("num_gpu_blocks_across_ranks", [[per_rank]])[0], "num_gpu_blocks_across_ranks"
    )
    return block // KiB, blocks, round(ref_kv.max_concurrency(blocks, 16, 8192), 1)


GUIDE = [
    ("Llama-3-8B", (8_030_261_248, 32, 8, 128, 2 * GiB), 1, (2048, 28181, 55.0)),
    ("Llama-3-8B", (8_030_261_248, 32, 8, 128, 2 * GiB), 2, (1024, 64021, 125.0)),
    ("Llama-3-8B", (8_030_261_248, 32, 8, 128, 2 * GiB), 8, (256, 279061, 545.0)),
    ("Llama-3-8B", (8_030_261_248, 32, 8, 128, 2 * GiB), 16, (256, 282890, 552.5)),
    ("SmolLM2-135M", (134_515_008, 30, 3, 64, 1 * GiB), 1, (360, 206072, 402.5)),
    ("SmolLM2-135M", (134_515_008, 30, 3, 64, 1 * GiB), 3, (120, 619677, 1210.3)),
]


@graded(
    3,
    "the guide's worked table: block per rank shrinks with tp until the KV heads run "
    "out (then it stays: replicated heads), and concurrency follows",
    KV_BLOCKS,
)
def test_the_guides_worked_table():
    """Every row of phase 07's table, from your two functions and lab-03's formulas."""
    m = side()
    for name, shape, tp, want in GUIDE:
        got = guide_row(m, *shape, tp)
        assert got == want, (
            f"{name} at TP={tp}: (KiB per block per rank, blocks, max concurrency) should be "
            f"{want}, got {got}"
        )
