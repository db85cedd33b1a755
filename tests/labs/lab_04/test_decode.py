"""lab-04, part 2: the decode kernel (``_paged_decode_kernel``) and the merge of its splits
(``_merge_splits_kernel``), through the given launcher ``paged_attention_decode``.

Without a GPU these run in Triton's interpreter on small shapes (head_dim 16, a few dozen
tokens); with one, the same tests run compiled, and the ``gpu_`` tests add real shapes.
"""

from __future__ import annotations

import numpy as np

from grading.remote import LearnerError, writes
from grading.suite import graded
from tests.labs.lab_04.learner_side import gpu_case
from tests.labs.lab_04.support import (
    DECODE,
    DECODE_SPLIT,
    FAR_RESERVABLE,
    TOLERANCE,
    WRITE,
    assert_close,
    device,
    expect_tensor,
    load,
    make_case,
    oracle_decode,
    run_decode,
    side,
    torch_module,
)

DOC = "phases/04-attention-kernels/README.md"


@graded(
    2,
    "decode: one program per (sequence, KV head) reads the sequence's blocks through "
    "its table and equals dense attention",
    f"{DOC}#one-program-per-sequence-and-kv-head",
)
def test_decode_one_sequence():
    """One 21-token sequence in blocks of 8, 4 query heads over 2 KV heads, one split."""
    got, want, tol = run_decode(load(*DECODE), make_case(1, [21], 8, 4, 2), num_splits=1)
    assert_close(got, want, tol, "one sequence of 21 tokens, blocks of 8")


@graded(
    2,
    "blocks smaller than a tile: each token t of a tile has its own table entry "
    "t // block_size and row t % block_size",
    f"{DOC}#tiles-of-tokens",
)
def test_decode_blocks_smaller_than_a_tile():
    """Block sizes 1 and 4 (a 32-token tile spans many blocks), lengths 1 to 37."""
    mod = load(*DECODE)
    for block_size in (1, 4):
        case = make_case(10 + block_size, [1, 5, 37], block_size, 4, 2)
        got, want, tol = run_decode(mod, case, num_splits=1)
        assert_close(got, want, tol, f"lengths [1, 5, 37] in blocks of {block_size}")


@graded(
    2,
    "blocks larger than a tile: a tile starting at token s lies in block "
    "table[s // block_size], rows s % block_size ..",
    f"{DOC}#tiles-of-tokens",
)
def test_decode_blocks_larger_than_a_tile():
    """Blocks of 64 tokens, read a 32-token tile at a time: lengths 50, 100 and 130."""
    case = make_case(2, [50, 100, 130], 64, 2, 1)
    # block_n: one split would take 64-token tiles, as large as the blocks.
    got, want, tol = run_decode(load(*DECODE), case, num_splits=1, block_n=32)
    assert_close(got, want, tol, "lengths [50, 100, 130] in blocks of 64, tiles of 32")


@graded(
    2,
    "tokens at positions >= seq_len get score -inf and are not loaded (K and V loads "
    "masked): the rest of the last block and of the last tile is another request's data",
    f"{DOC}#masking-past-the-sequence-length",
)
def test_decode_masks_past_seq_len():
    """Lengths that end mid-block and mid-tile; the slots after them hold large garbage, then
    inf (a cache's unused slots hold whatever was there: p = 0 times inf is nan)."""
    mod = load(*DECODE)
    case = make_case(3, [3, 19, 45], 16, 2, 2, garbage=20.0)
    got, want, tol = run_decode(mod, case, num_splits=1)
    assert_close(got, want, tol, "lengths [3, 19, 45] in blocks of 16 (garbage after them)")
    case = make_case(3, [3, 19, 45], 16, 2, 2, garbage=np.inf)
    got, want, tol = run_decode(mod, case, num_splits=1)
    assert_close(
        got,
        want,
        tol,
        "lengths [3, 19, 45] in blocks of 16, +-inf in the slots after them (load K AND V "
        "with the token mask, other=0: a V row read past seq_len times p = 0 is still nan)",
    )
    # A finite stand-in for -inf (-1e4 as in attention-mask code, -65504 as fp16's minimum)
    # passes while real scores are larger. Here the query is all ones and every key all -2**15:
    # each real score is exactly -131072 (about -189,000 in base 2) in any summation order, so
    # the softmax is uniform, exact in float32 on any device.
    case = make_case(3, [9], 8, 1, 1)
    case.query[0, 0] = 1.0
    for p in range(9):
        case.buffer_k[case.tables[0, p // 8] + 1, p % 8, 0] = -(2.0**15)  # +1: the guard block
    got, want, tol = run_decode(mod, case, num_splits=1)
    assert_close(
        got,
        want,
        tol,
        "9 tokens in blocks of 8 whose every score is about -189,000 (base 2): the 55 "
        "positions of the 64-token tile past seq_len must score -inf itself, not a large "
        "negative number such as -1e4 or -65504 (then they outweigh every real token)",
    )


@graded(
    2,
    "GQA: the program for KV head j serves query heads j * group .. j * group + group - 1 "
    "(query head h reads KV head h // group, not h % num_kv_heads); rows past the group "
    "(offs_g >= QUERIES_PER_KV) are masked in every load and store",
    f"{DOC}#one-program-per-sequence-and-kv-head",
)
def test_decode_gqa_groups():
    """Groups of 1, 3 (not a power of two), 4 and 32 (more rows than the 16-row pad)."""
    mod = load(*DECODE)
    for num_heads, num_kv_heads in ((4, 4), (6, 2), (8, 2), (32, 1)):
        case = make_case(num_heads, [9, 26], 8, num_heads, num_kv_heads)
        case.buffer_v += 5.0 * np.arange(num_kv_heads)[None, None, :, None]  # tell KV heads apart
        got, want, tol = run_decode(mod, case, num_splits=1)
        assert_close(got, want, tol, f"{num_heads} query heads over {num_kv_heads} KV heads")


@graded(
    1,
    "decode loads only what is the sequence's: table entries of tokens < seq_len (the "
    "per-token table load is masked with the token mask; entries past a sequence's blocks "
    "are padding and may lie past the table's end) and query rows < QUERIES_PER_KV",
    f"{DOC}#reading-the-cache",
)
def test_decode_reads_nothing_past_its_inputs():
    """Tables exactly as wide as the longest sequence needs, that sequence last: a load past a
    sequence's table entries, or past the query's last group, reads memory outside every tensor
    the kernel was given, which the learner process's check of every load in the interpreter
    refuses (``learner_side._bound_the_loads``). Blocks smaller than a tile (one table entry per
    token) and larger, groups that leave padded query rows."""
    load(*DECODE)  # the proof that the kernel is written (NOT STARTED otherwise)
    torch = torch_module()
    dev = device()
    for seq_lens, block_size, num_heads, num_kv_heads in (
        ([30, 9], 8, 2, 1),
        ([5, 13], 4, 6, 2),
        ([7, 40], 16, 3, 3),
        ([20, 70], 64, 4, 2),
    ):
        case = make_case(12, seq_lens, block_size, num_heads, num_kv_heads)
        query, key_cache, value_cache = (
            a.astype(np.float32) for a in (case.query, case.buffer_k[1:-1], case.buffer_v[1:-1])
        )
        width = max(-(-n // block_size) for n in seq_lens)
        tables = np.ascontiguousarray(case.tables[:, :width])
        what = (
            f"lengths {seq_lens} in blocks of {block_size}, {num_heads} query heads over "
            f"{num_kv_heads} KV heads, a table {width} entries wide"
        )
        try:
            got = side().decode_plain(
                torch.from_numpy(query).to(dev),
                torch.from_numpy(key_cache).to(dev),
                torch.from_numpy(value_cache).to(dev),
                torch.from_numpy(tables).to(dev),
                torch.from_numpy(case.seq_lens).to(dev),
                0.25,
                {"num_splits": 1},
            )
        except LearnerError as exc:
            raise AssertionError(
                f"{what}: {exc}. Mask the per-token table load with the token mask "
                "(t < seq_len) and the query load with offs_g < QUERIES_PER_KV"
            ) from None
        expect_tensor(got, "paged_attention_decode")
        want = oracle_decode(
            *(a.astype(np.float64) for a in (query, key_cache, value_cache)),
            tables,
            case.seq_lens,
            0.25,
        )
        assert_close(np.asarray(got.cpu()), want, TOLERANCE["float32"][0], what)


@graded(
    1,
    "online softmax: when a later tile raises the running max, acc and l are rescaled "
    "by exp2(m_old - m_new)",
    f"{DOC}#the-online-softmax",
)
def test_decode_later_tiles_dominate():
    """Scores that grow along the sequence: every tile raises the running maximum."""
    case = make_case(4, [100], 16, 2, 1)
    direction = case.query[0, 0] / np.linalg.norm(case.query[0, 0])
    for p in range(100):
        block, offset = case.tables[0, p // 16] + 1, p % 16
        case.buffer_k[block, offset, 0] += 0.08 * p * direction
    got, want, tol = run_decode(load(*DECODE), case, num_splits=1)
    assert_close(got, want, tol, "a 100-token sequence whose scores grow along it")


@graded(
    3,
    "split-K: split s walks tiles [s * per_split, min((s + 1) * per_split, num_tiles)) "
    "with per_split = cdiv(num_tiles, num_splits); the merge weights each partial by "
    "2**(lse_s - max lse)",
    f"{DOC}#split-k-and-the-log-sum-exp-merge",
)
def test_decode_split_k_is_exact():
    """2 and 3 splits of sequences of 1-130 tokens (tiles of 16, uneven shares), in blocks of 4
    and in blocks of 16 (a tile in one block)."""
    mod = load(*DECODE_SPLIT)
    case = make_case(5, [1, 19, 130, 64], 4, 4, 2)
    for num_splits in (2, 3):
        got, want, tol = run_decode(mod, case, num_splits=num_splits, block_n=16)
        assert_close(got, want, tol, f"{num_splits} splits of lengths [1, 19, 130, 64]")
    # Blocks as large as the tile: a split that starts mid-tile (its share counted in tokens,
    # cdiv(seq_len, num_splits), as flash-decoding ports do) runs its tiles across a block's end
    # into whatever block follows it in memory, since a tile takes one table entry here.
    case = make_case(5, [50, 37, 16], 16, 4, 2)
    for num_splits in (2, 3):
        got, want, tol = run_decode(mod, case, num_splits=num_splits, block_n=16)
        assert_close(
            got,
            want,
            tol,
            f"{num_splits} splits of lengths [50, 37, 16] in blocks of 16, tiles of 16: each "
            "split takes whole tiles (per_split = cdiv(num_tiles, num_splits) tiles), so every "
            "tile starts on a multiple of the tile and stays in one block; a share counted in "
            "tokens starts mid-tile and reads past its block",
        )


@graded(
    1,
    "an empty split (more splits than tiles) stores a zero partial and lse = -inf, "
    "and the merge gives it weight 0",
    f"{DOC}#split-k-and-the-log-sum-exp-merge",
)
def test_decode_more_splits_than_tiles():
    """7 splits of sequences that have only 1 to 3 tiles."""
    case = make_case(6, [5, 40], 8, 2, 1)
    got, want, tol = run_decode(load(*DECODE_SPLIT), case, num_splits=7, block_n=16)
    assert_close(got, want, tol, "7 splits of lengths [5, 40] (most splits empty)")


@graded(
    2,
    "numerics: subtract the running max (starting at -inf) before exp2, and the max lse in "
    "the merge; scores of several hundred overflow (or all underflow) otherwise",
    f"{DOC}#numerics",
)
def test_decode_large_logits_fp16():
    """fp16 caches and queries scaled by 30: scores in the hundreds (one head's all far below
    zero, another's last tile far above its first), one split and three."""
    mod = load(*DECODE_SPLIT)
    case = make_case(7, [40, 9], 8, 4, 2)
    case.query *= 30.0
    # Sequence 1's keys point away from query head 0: all its scores are below -200, so
    # exp2(score - m) underflows to 0 unless m is the true running max (which starts at -inf).
    direction = case.query[1, 0] / np.linalg.norm(case.query[1, 0])
    for p in range(9):
        block, offset = case.tables[1, p // 8] + 1, p % 8
        case.buffer_k[block, offset, 0] -= 3.0 * direction
    # Sequence 0's last tile (tokens 32-39, the third split's) points toward query head 0: that
    # split's lse exceeds the first's by hundreds, so 2**(lse - lse of split 0) overflows.
    direction = case.query[0, 0] / np.linalg.norm(case.query[0, 0])
    for p in range(32, 40):
        block, offset = case.tables[0, p // 8] + 1, p % 8
        case.buffer_k[block, offset, 0] += 3.0 * direction
    for num_splits in (1, 3):
        got, want, tol = run_decode(
            mod, case, "float16", scale=1.0, num_splits=num_splits, block_n=16
        )
        assert_close(
            got,
            want,
            tol,
            f"fp16, scores in the hundreds (sequence 1, query head 0: all below -200; sequence "
            f"0, query head 0: the last tile's hundreds above the rest), {num_splits} split(s)",
        )


@graded(
    1,
    "fp16 and bf16 caches: the dots read the cache dtype, softmax and accumulator stay "
    "float32, the output has the query's dtype",
    f"{DOC}#numerics",
)
def test_decode_half_precision():
    """fp16 and bf16 caches, split and unsplit; then a float32 query over fp16 caches, without
    out= (the launcher allocates the output), as the engine calls it."""
    mod = load(*DECODE_SPLIT)
    case = make_case(8, [33, 100], 16, 8, 2)
    for dtype in ("float16", "bfloat16"):
        for num_splits in (1, 4):
            got, want, tol = run_decode(mod, case, dtype, num_splits=num_splits)
            where = f"{dtype}, {num_splits} split(s)"
            if (
                dtype == "bfloat16"
                and device() != "cuda"
                and np.abs(np.nan_to_num(got)).max() > 1e4
            ):
                where += (
                    " (outputs near 1e9: the interpreter's tl.dot of bf16 operands is wrong; "
                    "under IEEE_DOT cast q, k and v to tl.float32 before the dots)"
                )
            assert_close(got, want, tol, where)
    torch = torch_module()
    dev = device()
    small = make_case(12, [20], 16, 4, 2)
    query = torch.from_numpy(small.query).to(device=dev, dtype=torch.float32)
    caches = [
        torch.from_numpy(buf[1:-1]).to(device=dev, dtype=torch.float16)
        for buf in (small.buffer_k, small.buffer_v)
    ]
    # Expected from the judge's own copies, before the call: arguments come back from the
    # learner's process into these tensors, so afterwards they hold what its code left there.
    want = oracle_decode(
        query.to(torch.float16).double().cpu().numpy(),
        *(c.double().cpu().numpy() for c in caches),
        small.tables,
        small.seq_lens,
        0.25,
    )
    # On a GPU the dots round p to the cache dtype; in the interpreter (IEEE float32 dots) only
    # a store in the cache dtype, of the output or of a split's partial, loses that much.
    rel = 2e-3 if dev == "cuda" else 1e-5
    for num_splits in (1, 3):
        got = side().decode_plain(
            query,
            *caches,
            torch.from_numpy(np.maximum(small.tables, 0)).to(dev),
            torch.from_numpy(small.seq_lens).to(dev),
            0.25,
            {"num_splits": num_splits},
        )
        expect_tensor(got, "paged_attention_decode")
        assert got.dtype == torch.float32 and tuple(got.shape) == tuple(query.shape), (
            f"a float32 query over float16 caches (no out=) returned {got.dtype} "
            f"{tuple(got.shape)}: the output must have the query's dtype and shape, float32 "
            f"{tuple(query.shape)} (the dots run in the cache dtype, the result does not)"
        )
        assert_close(
            got.double().cpu().numpy(),
            want,
            rel + rel * float(np.abs(want).max()),
            f"a float32 query over float16 caches, no out=, {num_splits} split(s): the "
            "accumulator, a split's partial and the output stay float32 (only the dots' inputs "
            "are in the cache dtype)",
        )


@graded(
    2,
    "any batch: variable lengths, any power-of-two block size, any split count, any head_dim "
    "(columns past it masked), the query, the K and V caches and the output each addressed "
    "through their own strides (a query sliced from a fused QKV projection; blocks further "
    "apart than block_size rows)",
    f"{DOC}#reading-the-cache",
)
def test_decode_random_batches():
    """Four seeded random configurations: block size, group, lengths, splits; head_dim 24 (not a
    power of two), tiles of 16, a value cache whose rows are wider than head_dim in memory, and
    caches whose blocks are further apart than block_size rows (sliced out of larger ones), a
    query sliced out of a wider [seqs, heads + 2, head_dim + 8] tensor (a fused QKV projection),
    an out= whose rows are wider than head_dim."""
    mod = load(*DECODE_SPLIT)
    rng = np.random.default_rng(2024)
    for trial in range(4):
        block_size = int(rng.choice([1, 2, 8, 16, 32]))
        group, num_kv_heads = int(rng.choice([1, 2, 4])), int(rng.integers(1, 3))
        lens = rng.integers(1, 70, size=int(rng.integers(1, 4))).tolist()
        num_splits = int(rng.integers(1, 4))
        heads = group * num_kv_heads
        case = make_case(100 + trial, lens, block_size, heads, num_kv_heads, head_dim=24)
        got, want, tol = run_decode(
            mod,
            case,
            num_splits=num_splits,
            block_n=16,
            value_pad=8,
            key_pad=4,
            block_pad=1,
            fused_query=True,
            out_pad=4,
        )
        assert_close(
            got,
            want,
            tol,
            f"lengths {lens}, blocks of {block_size}, {heads}/{num_kv_heads} heads, head_dim 24, "
            f"{num_splits} split(s), tiles of 16; the query, out= and the K and V caches are "
            "strided views, each with its own strides (blocks 1 (K) / 2 (V) rows further apart "
            "than block_size, heads 28 (K) / 32 (V) elements apart for a head_dim of 24): "
            "address each through the strides the "
            "launcher passes (stride_q_*, stride_k_*, stride_v_*, stride_o_*), never "
            "num_heads * head_dim or block_size * the token stride",
        )


@graded(
    2,
    "the whole path: slots from the table, your cache write, your decode, equal to "
    "dense attention over the keys written, also where a block's address passes 2**31 elements "
    "(addresses built in int64)",
    f"{DOC}#where-attention-meets-the-block-table",
)
def test_write_then_decode():
    """23 tokens written with your cache-write kernel, then decoded in 2 splits; then the same
    in the last blocks of float16 caches whose addresses pass 2**31 elements (left out only
    where the judge, before any learner code ran, could not reserve the 4 GiB they take
    either: ``FAR_RESERVABLE``)."""
    torch = torch_module()
    load(*WRITE, *DECODE_SPLIT)
    dev = device()
    gen = torch.Generator().manual_seed(9)
    block_size, heads, kv_heads, dim, n = 4, 8, 2, 16, 23
    key = torch.randn((n, kv_heads, dim), generator=gen)
    value = torch.randn((n, kv_heads, dim), generator=gen)
    query = torch.randn((1, heads, dim), generator=gen)
    table = torch.tensor([11, 2, 7, 0, 5, 9])
    key_cache = torch.randn((12, block_size, kv_heads, dim), generator=gen).to(dev)
    value_cache = torch.randn((12, block_size, kv_heads, dim), generator=gen).to(dev)
    kc = np.zeros((6, block_size, kv_heads, dim))
    vc = np.zeros_like(kc)
    for p in range(n):  # the expected cache, laid out by the test
        kc[p // block_size, p % block_size] = key[p].double().numpy()
        vc[p // block_size, p % block_size] = value[p].double().numpy()
    want = oracle_decode(query.double().numpy(), kc, vc, np.arange(6)[None], np.array([n]), 0.25)
    # One request: the learner process maps tokens 0..22 to slots through the table (the given
    # compute_slot_mapping), runs your write, then your decode, and returns the output.
    out = side().write_then_decode(
        key.to(dev),
        value.to(dev),
        writes(key_cache),
        writes(value_cache),
        table,
        block_size,
        query.to(dev),
        0.25,
        2,
    )
    expect_tensor(out, "paged_attention_decode")
    assert_close(out.double().cpu().numpy(), want, 2e-5, "write 23 tokens, then decode them")
    # The same where addresses pass 2**31 elements (K and V: halves of one 4 GiB buffer), the
    # sequence in its last blocks (an int32 table, as the engine's; block id x block stride
    # > 2**31): an address built in int32 wraps there. Blocks of 8 and 32 with tiles of 32: one
    # table entry per token, and one per tile.
    rows = [t.half().double().numpy() for t in (key, value)]
    for p in range(n):
        kc[p // block_size, p % block_size] = rows[0][p]
        vc[p // block_size, p % block_size] = rows[1][p]
    q16 = query.half().double().numpy()  # the launcher casts the query to the cache dtype
    want = oracle_decode(q16, kc, vc, np.arange(6)[None], np.array([n]), 0.25)
    atol, rtol = TOLERANCE["float16"]
    for far_block_size in (8, 32):
        far = side().write_then_decode_far(
            key.to(dev), value.to(dev), query.to(dev), 0.25, 2, far_block_size
        )
        if far is None:  # the learner process could not reserve 4 GiB of address space
            if FAR_RESERVABLE:  # ... where the judge could: the learner's code prevented it
                raise AssertionError(
                    "the learner process could not reserve the 4 GiB of the far-address check, "
                    "which this machine allows (the judge reserved as much before your code "
                    "ran): do not lower your process's limits or fill its memory"
                )
            return
        expect_tensor(far, "paged_attention_decode")
        assert_close(
            far.double().cpu().numpy(),
            want,
            atol + rtol * float(np.abs(want).max()),
            f"write 23 tokens into the last blocks (of {far_block_size}) of float16 caches whose "
            "addresses pass 2**31 elements (an int32 table, block id x block stride > 2**31), then "
            "decode "
            "them: build every address in 64 bits (.to(tl.int64)) before multiplying by a "
            "stride, or block * stride wraps",
        )


# ------------------------------------------------------------------------------ GPU, real shapes


def gpu_oracle(q, key_cache, value_cache, tables, seq_lens, scale):
    """float32 attention on the GPU, gathering each sequence through its table."""
    torch = torch_module()
    out = torch.empty(q.shape, dtype=torch.float32, device=q.device)
    group = q.shape[1] // key_cache.shape[2]
    block_size = key_cache.shape[1]
    for i in range(q.shape[0]):
        n = int(seq_lens[i])
        blocks = tables[i, : -(-n // block_size)].long()
        k = key_cache[blocks].flatten(0, 1)[:n].float().repeat_interleave(group, dim=1)
        v = value_cache[blocks].flatten(0, 1)[:n].float().repeat_interleave(group, dim=1)
        scores = torch.einsum("hd,nhd->hn", q[i].float(), k) * scale
        out[i] = torch.einsum("hn,nhd->hd", scores.softmax(-1), v)
    return out


def check_gpu(got, want, what):
    torch = torch_module()
    expect_tensor(got, "paged_attention_decode")
    assert tuple(got.shape) == tuple(want.shape), (
        f"{what}: output shape {tuple(got.shape)}, expected {tuple(want.shape)}"
    )
    assert bool(torch.isfinite(got).all()), f"{what}: the output holds inf/nan"
    err = float((got.float() - want).abs().max())
    tol = 1e-2 * float(want.abs().max()) + 2e-3
    assert err <= tol, f"{what}: max |got - expected| = {err:.3g} > {tol:.2g}"


@graded(
    3,
    "real shapes (bf16, head_dim 128, 32/8 heads, blocks of 16, thousands of tokens, "
    "the default split count)",
    f"{DOC}#split-k-and-the-log-sum-exp-merge",
    gpu=True,
)
def test_gpu_decode_long_sequences_split():
    """A batch of 4 long, uneven sequences: the launcher chooses several splits."""
    load(*DECODE_SPLIT)
    case = (0, [3001, 1, 517, 8192], 16, 32, 8)  # seed, lengths, block size, heads, KV heads
    got = side().gpu_decode(*case, 128**-0.5)  # the learner process builds the same case
    q, kc, vc, tables, lens = gpu_case(*case)
    check_gpu(got, gpu_oracle(q, kc, vc, tables, lens, 128**-0.5), "4 long sequences, bf16")


@graded(
    2,
    "real shapes, large batch (one split: the decode kernel writes the output itself)",
    f"{DOC}#one-program-per-sequence-and-kv-head",
    gpu=True,
)
def test_gpu_decode_large_batch_single_split():
    """128 sequences of about 1000 tokens, 64/8 heads, blocks of 128."""
    load(*DECODE_SPLIT)
    lens = [900 + 7 * i for i in range(128)]
    got = side().gpu_decode(1, lens, 128, 64, 8, 128**-0.5)  # caches of 370 MB each: built there
    q, kc, vc, tables, seq_lens = gpu_case(1, lens, 128, 64, 8)
    check_gpu(got, gpu_oracle(q, kc, vc, tables, seq_lens, 128**-0.5), "128 sequences, bf16")


@graded(
    1,
    "real shapes: 4096 tokens of 8 x 128 bf16 written in one launch, padding skipped",
    f"{DOC}#the-cache-write-kernel",
    gpu=True,
)
def test_gpu_cache_write_real_shapes():
    """A prefill-sized write: 4096 tokens, every 10th one padding."""
    torch = torch_module()
    load(*WRITE)
    gen = torch.Generator(device="cuda").manual_seed(2)
    kc = torch.zeros((300, 16, 8, 128), dtype=torch.bfloat16, device="cuda")
    vc = torch.zeros_like(kc)
    key = torch.randn((4096, 8, 128), generator=gen, device="cuda").to(torch.bfloat16)
    value = torch.randn((4096, 8, 128), generator=gen, device="cuda").to(torch.bfloat16)
    slots = torch.randperm(300 * 16, generator=gen, device="cuda")[:4096]
    slots[::10] = -1
    key_in, value_in = key.clone(), value.clone()
    side().write(key, value, writes(kc), writes(vc), slots)  # the caches come back by value
    keep = slots >= 0
    flat_k, flat_v = kc.view(-1, 8, 128), vc.view(-1, 8, 128)
    assert torch.equal(flat_k[slots[keep]], key_in[keep]), "a key row is not in its slot"
    assert torch.equal(flat_v[slots[keep]], value_in[keep]), "a value row is not in its slot"
    written = torch.zeros(300 * 16, dtype=torch.bool, device="cuda")
    written[slots[keep]] = True
    assert flat_k[~written].abs().sum() == 0 and flat_v[~written].abs().sum() == 0, (
        "slots no token maps to were written"
    )
