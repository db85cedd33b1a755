"""lab-06, part 2: attention through block tables (``_gather_sequence``,
``paged_attention_decode``, ``paged_attention_prefill``).

Every result is compared with :func:`tests.labs.lab_06.oracle.attention`, a float64 loop over
contiguous keys, to 1e-12: paging changes where keys live, never what attention computes.
"""

from __future__ import annotations

import copy
import itertools

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from grading.suite import graded
from tests.labs.common import GRADED_SETTINGS, describe
from tests.labs.lab_06.oracle import (
    as_array,
    assert_close,
    assert_half_computed_in_float32,
    assert_rounded_once,
    attention,
    pa,
    write_paged,
)

DOC = "phases/04-attention-kernels/README.md"
TOL = 1e-12


def decode_oracle(query, paged, scale):
    return np.stack(
        [
            attention(query[i : i + 1], paged.keys[i], paged.values[i], scale)[0]
            for i in range(len(paged.keys))
        ]
    )


def run_decode(paged, query, scale):
    return pa().paged_attention_decode(
        query, paged.key_cache, paged.value_cache, paged.tables, paged.seq_lens, scale
    )


# ------------------------------------------------------------------------------------ decode


@graded(
    2,
    "decode reads the sequence's blocks in table order and equals dense attention",
    f"{DOC}#reading-the-cache",
)
def test_decode_single_sequence_equals_dense():
    """One sequence of three full blocks, scattered over the cache."""
    rng = np.random.default_rng(1)
    paged = write_paged(rng, [12], block_size=4, num_kv_heads=2, head_dim=8)
    query = rng.standard_normal((1, 4, 8))
    got = run_decode(paged, query, 0.35)
    assert_close(
        got, decode_oracle(query, paged, 0.35), TOL, "decode of one 12-token sequence (blocks of 4)"
    )


@graded(
    2,
    "only the first seq_len tokens are attended: the rest of the last block is stale "
    "data of another request",
    f"{DOC}#masking-past-the-sequence-length",
)
def test_decode_partial_last_block():
    """seq_len 10 with blocks of 4: the last block holds 2 real tokens and 2 garbage slots."""
    rng = np.random.default_rng(2)
    paged = write_paged(rng, [10], block_size=4, num_kv_heads=1, head_dim=8)
    query = rng.standard_normal((1, 2, 8))
    got = run_decode(paged, query, 0.35)
    assert_close(
        got,
        decode_oracle(query, paged, 0.35),
        TOL,
        "decode of a 10-token sequence in blocks of 4 (2 slots past seq_len)",
    )


@graded(
    1,
    "seq_len counts the new token: decode attends to all seq_lens[i] tokens, itself included",
    f"{DOC}#decode-and-prefill",
)
def test_decode_sees_the_newest_token():
    """The newest token's key dominates its own query: leaving it out changes the answer."""
    rng = np.random.default_rng(3)
    paged = write_paged(rng, [7], block_size=4, num_kv_heads=1, head_dim=8)
    query = (paged.keys[0][6:7] * 2.0).reshape(1, 1, 8)  # aligned with the last key
    got = run_decode(paged, query, 1.0)
    assert_close(
        got,
        decode_oracle(query, paged, 1.0),
        TOL,
        "decode of a 7-token sequence whose query matches token 6",
    )


@st.composite
def decode_cases(draw):
    block_size = draw(st.sampled_from([1, 2, 4, 8, 16]))
    num_kv_heads = draw(st.integers(1, 2))
    group = draw(st.sampled_from([1, 2, 4]))
    lens = draw(st.lists(st.integers(1, 40), min_size=1, max_size=4))
    pad = draw(st.sampled_from([-1, 0]))
    return block_size, num_kv_heads, group, lens, pad, draw(st.integers(0, 2**16))


@graded(
    3,
    "each sequence reads its OWN block table and its own seq_lens[i] tokens",
    f"{DOC}#reading-the-cache",
)
@GRADED_SETTINGS
@given(decode_cases())
def test_decode_batches_with_random_tables(case):
    """Batches of 1-4 sequences of 1-40 tokens, any block size, tables padded with -1 or 0."""
    block_size, num_kv_heads, group, lens, pad, seed = case
    rng = np.random.default_rng(seed)
    paged = write_paged(
        rng, lens, block_size, num_kv_heads, head_dim=4, table_pad=pad, extra_columns=2
    )
    query = rng.standard_normal((len(lens), num_kv_heads * group, 4))
    got = run_decode(paged, query, 0.5)
    assert_close(
        got,
        decode_oracle(query, paged, 0.5),
        TOL,
        f"decode of lengths {lens}, block_size {block_size}, {num_kv_heads * group} query "
        f"heads / {num_kv_heads} KV heads, tables {paged.tables.tolist()}",
    )


@graded(
    2,
    "GQA: query head h reads KV head h // (num_heads // num_kv_heads), not h % num_kv_heads "
    "nor h // num_kv_heads, in decode and in prefill",
    f"{DOC}#grouped-query-attention",
)
def test_decode_gqa_head_mapping():
    """8 query heads over 2 KV heads (heads 0-3 share KV head 0), and 6 over 3; then a prefill
    chunk with 6 over 3 (h // 3 would be right only when num_kv_heads == group, as with 4 over
    2)."""
    for num_heads, num_kv_heads in ((8, 2), (6, 3)):
        rng = np.random.default_rng(num_heads)
        paged = write_paged(rng, [9, 5], block_size=4, num_kv_heads=num_kv_heads, head_dim=8)
        for values in paged.values:  # make the KV heads' values easy to tell apart
            values += 10.0 * np.arange(num_kv_heads)[None, :, None]
        for i, n in enumerate([9, 5]):
            for p in range(n):
                block, offset = paged.tables[i, p // 4], p % 4
                paged.value_cache[block, offset] = paged.values[i][p]
        query = rng.standard_normal((2, num_heads, 8))
        got = run_decode(paged, query, 0.35)
        assert_close(
            got,
            decode_oracle(query, paged, 0.35),
            TOL,
            f"{num_heads} query heads over {num_kv_heads} KV heads (KV head j's values "
            f"are near 10 * j, so the output shows which KV head a query head read)",
        )
    # paged is the (6, 3) case: prefill positions 5-8 of sequence 0 after a 5-token prefix.
    query = rng.standard_normal((4, 6, 8))
    got = run_prefill(paged, query, 5, 0.35)
    assert_close(
        got,
        prefill_oracle(query, paged, 5, 0.35),
        TOL,
        "prefill of positions 5-8, 6 query heads over 3 KV heads (query head h reads KV head "
        "h // 2; KV head j's values are near 10 * j)",
    )


@graded(
    1,
    "table entries past a sequence's used blocks are padding and must not be read: by "
    "decode, by prefill (only cdiv(context_len + query_len, block_size) entries) and by "
    "split-K decode",
    f"{DOC}#reading-the-cache",
)
def test_decode_ignores_table_padding():
    """A table padded with -1 and with ids far outside the cache still decodes; the same
    tables serve a prefill chunk and a split-K decode. The third sequence fills its two blocks
    exactly, so the entry right after them (an id far outside the cache) is the one that a
    count of ``seq_len // block_size + 1`` blocks, clamped to the table's width, would read."""
    rng = np.random.default_rng(4)
    paged = write_paged(rng, [6, 3, 8], block_size=4, num_kv_heads=1, head_dim=4, extra_columns=3)
    paged.tables[0, 2:] = [-1, 10**6, -1][: paged.tables.shape[1] - 2]
    paged.tables[1, 1:] = 10**6
    paged.tables[2, 2:] = 10**6
    query = rng.standard_normal((3, 2, 4))
    try:
        got = run_decode(paged, query, 0.5)
    except (IndexError, ValueError) as exc:
        raise AssertionError(
            f"decode of lengths [6, 3, 8] (blocks of 4) through tables {paged.tables.tolist()} "
            f"raised {type(exc).__name__} ({exc}); read only the first cdiv(seq_len, "
            "block_size) entries of a table, never all of it nor one more (the 8-token "
            "sequence fills its 2 blocks: entry 2 is padding)"
        ) from None
    assert_close(
        got,
        decode_oracle(query, paged, 0.5),
        TOL,
        f"decode through tables {paged.tables.tolist()} (entries past use are padding)",
    )
    # Gathering every entry and cutting seq_len rows afterwards reads cache[-1] harmlessly,
    # but an id far outside the cache raises: only the used entries may be looked up.
    prompt = write_paged(rng, [8], block_size=4, num_kv_heads=1, head_dim=4, extra_columns=2)
    prompt.tables[0, 2:] = 10**6
    chunk = rng.standard_normal((3, 2, 4))
    setting = (
        f"prefill of positions 5-7 through the table {prompt.tables[0].tolist()} (blocks of 4, "
        "2 used), or split-K decode through the tables above"
    )
    try:
        got = run_prefill(prompt, chunk, 5, 0.5)
        split = pa().paged_attention_decode_split_k(
            query, paged.key_cache, paged.value_cache, paged.tables, paged.seq_lens, 0.5, 2
        )
    except (IndexError, ValueError) as exc:
        raise AssertionError(
            f"{setting}: raised {type(exc).__name__} ({exc}); read only the first "
            "cdiv(seq_len, block_size) entries of a table (_gather_sequence does), never all "
            "of it nor one more"
        ) from None
    assert_close(
        got,
        prefill_oracle(chunk, prompt, 5, 0.5),
        TOL,
        f"prefill of positions 5-7 through the table {prompt.tables[0].tolist()}",
    )
    assert_close(
        split,
        decode_oracle(query, paged, 0.5),
        TOL,
        f"split-K decode (2 splits) through tables {paged.tables.tolist()}",
    )


@graded(
    2,
    "softmax must subtract each row's maximum before exp: scores of several hundred "
    "overflow exp to inf (inf / inf = nan); in prefill, the maximum of the keys the row SEES "
    "(mask first), or a hidden later key's score underflows every visible one (0 / 0 = nan)",
    f"{DOC}#numerics",
)
def test_large_logits_do_not_overflow():
    """Queries scaled by 2000 give scores in the thousands; the output stays finite and exact,
    in decode and in a causal prefill."""
    rng = np.random.default_rng(5)
    paged = write_paged(rng, [11, 4], block_size=4, num_kv_heads=2, head_dim=8)
    query = rng.standard_normal((2, 4, 8)) * 2000.0
    with np.errstate(all="ignore"):
        got = run_decode(paged, query, 0.35)
    want = decode_oracle(query, paged, 0.35)
    assert_close(got, want, 1e-9, "decode with scores in the thousands")
    query = rng.standard_normal((8, 4, 8)) * 2000.0
    with np.errstate(all="ignore"):
        got = run_prefill(paged, query, 3, 0.35)
    want = prefill_oracle(query, paged, 3, 0.35)
    assert_close(
        got,
        want,
        1e-9,
        "prefill of positions 3-10 with scores in the thousands (each row's softmax over "
        "the keys it sees)",
    )


@graded(
    1,
    "the scale multiplies q . k exactly once, before the softmax",
    f"{DOC}#the-attention-to-reproduce",
)
def test_decode_applies_the_scale_once():
    """The same inputs at two scales: each must match its own softmax temperature."""
    rng = np.random.default_rng(6)
    paged = write_paged(rng, [9], block_size=4, num_kv_heads=1, head_dim=8)
    query = rng.standard_normal((1, 2, 8))
    for scale in (8**-0.5, 1.7):
        got = run_decode(paged, query, scale)
        assert_close(got, decode_oracle(query, paged, scale), TOL, f"decode with scale {scale:.4g}")


@graded(
    1,
    "the output takes the QUERY's dtype: float32 queries give a float32 output, over a "
    "float32 cache or a float64 one (computed in float64 then, and rounded once), float16 "
    "queries a float16 output (computed in float32, and rounded once)",
    f"{DOC}#numerics",
)
def test_decode_float32_inputs():
    """Single precision in, single precision out, within float32 rounding; a float32 query over
    a float64 cache is the float64 answer rounded once; half precision in, half out, within an
    ulp of the float64 answer (computed in float32)."""
    rng = np.random.default_rng(7)
    paged = write_paged(rng, [13, 2], block_size=4, num_kv_heads=2, head_dim=8)
    query = rng.standard_normal((2, 4, 8)).astype(np.float32)
    kc, vc = paged.key_cache.astype(np.float32), paged.value_cache.astype(np.float32)
    got = as_array(
        pa().paged_attention_decode(query, kc, vc, paged.tables, paged.seq_lens, 0.35),
        "decode in float32",
    )
    assert got.dtype == np.float32, f"output dtype {got.dtype}, expected float32 (the query's)"
    paged64 = copy.copy(paged)
    paged.keys = [k.astype(np.float32).astype(np.float64) for k in paged.keys]
    paged.values = [v.astype(np.float32).astype(np.float64) for v in paged.values]
    want = decode_oracle(query.astype(np.float64), paged, 0.35)
    assert_close(got, want, 1e-5, "decode in float32")
    got = as_array(
        pa().paged_attention_decode(
            query, paged.key_cache, paged.value_cache, paged.tables, paged.seq_lens, 0.35
        ),
        "decode of a float32 query over a float64 cache",
    )
    assert got.dtype == np.float32, (
        f"a float32 query over a float64 cache: output dtype {got.dtype}, expected float32 "
        "(the query's, not the cache's)"
    )
    assert_rounded_once(
        got,
        decode_oracle(query.astype(np.float64), paged64, 0.35),
        "decode of a float32 query over a float64 cache",
    )
    half = as_array(
        pa().paged_attention_decode(
            query.astype(np.float16),
            kc.astype(np.float16),
            vc.astype(np.float16),
            paged.tables,
            paged.seq_lens,
            0.35,
        ),
        "decode in float16",
    )
    assert half.dtype == np.float16, (
        f"float16 queries over a float16 cache: output dtype {half.dtype}, expected float16 "
        "(the query's; the float32 of the arithmetic, _compute_dtype, is not the output's)"
    )
    paged.keys = [k.astype(np.float16).astype(np.float64) for k in paged.keys]
    paged.values = [v.astype(np.float16).astype(np.float64) for v in paged.values]
    assert_half_computed_in_float32(
        half,
        decode_oracle(query.astype(np.float16).astype(np.float64), paged, 0.35),
        "decode of float16 queries over a float16 cache",
    )


# ----------------------------------------------------------------------------------- prefill


def run_prefill(paged, query, context_len, scale, seq=0):
    return pa().paged_attention_prefill(
        query, paged.key_cache, paged.value_cache, paged.tables[seq], context_len, scale
    )


def prefill_oracle(query, paged, context_len, scale, seq=0):
    positions = np.arange(context_len, context_len + query.shape[0])
    end = context_len + query.shape[0]
    return attention(query, paged.keys[seq][:end], paged.values[seq][:end], scale, positions)


@graded(
    2,
    "prefill is causal: query i (at position context_len + i) sees keys 0 .. "
    "context_len + i, never later ones",
    f"{DOC}#decode-and-prefill",
)
def test_prefill_without_prefix_is_causal():
    """A 9-token prompt with nothing cached before it: lower-triangular attention."""
    rng = np.random.default_rng(8)
    paged = write_paged(rng, [9], block_size=4, num_kv_heads=2, head_dim=8)
    query = rng.standard_normal((9, 4, 8))
    got = run_prefill(paged, query, 0, 0.35)
    assert_close(
        got, prefill_oracle(query, paged, 0, 0.35), TOL, "prefill of 9 tokens at positions 0-8"
    )


@graded(
    3,
    "a chunk after a cached prefix attends to ALL context_len prefix tokens plus the "
    "causal part of the chunk (the mask is aligned bottom-right); a chunk of no tokens gives "
    "an empty [0, num_heads, head_dim] output",
    f"{DOC}#prefill-after-a-cached-prefix",
)
def test_prefill_after_a_cached_prefix():
    """13 cached tokens, then a chunk of 7 (positions 13-19), GQA 4 query heads over 2; then a
    chunk of no tokens after the same prefix."""
    rng = np.random.default_rng(9)
    paged = write_paged(rng, [20], block_size=4, num_kv_heads=2, head_dim=8)
    query = rng.standard_normal((7, 4, 8))
    got = run_prefill(paged, query, 13, 0.35)
    assert_close(
        got,
        prefill_oracle(query, paged, 13, 0.35),
        TOL,
        "prefill of positions 13-19 after a 13-token cached prefix",
    )
    empty = run_prefill(paged, query[:0], 13, 0.35)
    assert isinstance(empty, np.ndarray) and empty.shape == (0, 4, 8), (
        f"prefill of a chunk of no tokens (query [0, 4, 8]) after a 13-token prefix returned "
        f"{describe(empty)}: expected an empty array of shape (0, 4, 8), [query_len, "
        "num_heads, head_dim] with query_len 0"
    )


@st.composite
def chunk_cases(draw):
    length = draw(st.integers(1, 30))
    cuts = sorted(set(draw(st.lists(st.integers(1, max(1, length - 1)), max_size=4))))
    cuts = [c for c in cuts if 0 < c < length]
    return draw(st.sampled_from([1, 2, 4, 8])), length, cuts, draw(st.integers(0, 2**16))


@graded(
    2,
    "chunked prefill: attending chunk by chunk (each after the chunks before it) equals "
    "attending to the whole prompt at once",
    f"{DOC}#prefill-after-a-cached-prefix",
)
@GRADED_SETTINGS
@given(chunk_cases())
def test_chunked_prefill_equals_one_pass(case):
    """A prompt cut into chunks at random points; the outputs, concatenated, are the same."""
    block_size, length, cuts, seed = case
    rng = np.random.default_rng(seed)
    paged = write_paged(rng, [length], block_size, num_kv_heads=1, head_dim=4)
    query = rng.standard_normal((length, 2, 4))
    bounds = [0, *cuts, length]
    outs = [run_prefill(paged, query[a:b], a, 0.5) for a, b in itertools.pairwise(bounds)]
    want = prefill_oracle(query, paged, 0, 0.5)
    assert_close(
        np.concatenate(outs),
        want,
        TOL,
        f"a {length}-token prompt in chunks {list(itertools.pairwise(bounds))}, "
        f"block_size {block_size}",
    )


@graded(
    1,
    "the last query of a prefill chunk is a decode query: both must agree",
    f"{DOC}#decode-and-prefill",
)
def test_prefill_last_row_equals_decode():
    """Prefill's last output row and decode of the same sequence are the same numbers."""
    rng = np.random.default_rng(10)
    paged = write_paged(rng, [11], block_size=4, num_kv_heads=1, head_dim=8)
    query = rng.standard_normal((3, 2, 8))
    prefill = as_array(run_prefill(paged, query, 8, 0.35), "prefill")
    decode = as_array(run_decode(paged, query[2:3], 0.35), "decode")
    assert_close(
        prefill[2:3],
        decode.astype(np.float64),
        TOL,
        "prefill's last row vs decode of the same 11-token sequence",
    )
    assert_close(
        prefill,
        prefill_oracle(query, paged, 8, 0.35),
        TOL,
        "prefill of positions 8-10 after an 8-token prefix",
    )


@graded(
    1,
    "prefill keeps the query's dtype: float32 in, float32 out (an output buffer made "
    "with np.zeros(shape) is float64), over a float64 cache too (computed in float64 then, "
    "and rounded once); float16 in, float16 out (computed in float32, and rounded once)",
    f"{DOC}#numerics",
)
def test_prefill_float32_inputs():
    """A float32 chunk after a float32 prefix: single precision out, within float32 rounding;
    over a float64 prefix, the float64 answer rounded once; a float16 chunk: float16 out, within
    an ulp of the float64 answer (computed in float32)."""
    rng = np.random.default_rng(12)
    paged = write_paged(rng, [10], block_size=4, num_kv_heads=2, head_dim=8)
    query = rng.standard_normal((4, 4, 8)).astype(np.float32)
    kc, vc = paged.key_cache.astype(np.float32), paged.value_cache.astype(np.float32)
    got = as_array(
        pa().paged_attention_prefill(query, kc, vc, paged.tables[0], 6, 0.35), "prefill in float32"
    )
    assert got.dtype == np.float32, f"output dtype {got.dtype}, expected float32 (the query's)"
    mixed = as_array(
        pa().paged_attention_prefill(
            query, paged.key_cache, paged.value_cache, paged.tables[0], 6, 0.35
        ),
        "prefill of a float32 chunk over a float64 cache",
    )
    assert mixed.dtype == np.float32, (
        f"a float32 chunk over a float64 cache: output dtype {mixed.dtype}, expected float32 "
        "(the query's, not the cache's)"
    )
    assert_rounded_once(
        mixed,
        prefill_oracle(query.astype(np.float64), paged, 6, 0.35),
        "prefill of positions 6-9, a float32 chunk over a float64 cache",
    )
    half = as_array(
        pa().paged_attention_prefill(
            query.astype(np.float16),
            kc.astype(np.float16),
            vc.astype(np.float16),
            paged.tables[0],
            6,
            0.35,
        ),
        "prefill in float16",
    )
    assert half.dtype == np.float16, (
        f"a float16 chunk over a float16 cache: output dtype {half.dtype}, expected float16 "
        "(the query's; the float32 of the arithmetic, _compute_dtype, is not the output's)"
    )
    paged.keys = [k.astype(np.float32).astype(np.float64) for k in paged.keys]
    paged.values = [v.astype(np.float32).astype(np.float64) for v in paged.values]
    want = prefill_oracle(query.astype(np.float64), paged, 6, 0.35)
    assert_close(got, want, 1e-5, "prefill of positions 6-9 in float32")
    paged.keys = [k.astype(np.float16).astype(np.float64) for k in paged.keys]
    paged.values = [v.astype(np.float16).astype(np.float64) for v in paged.values]
    assert_half_computed_in_float32(
        half,
        prefill_oracle(query.astype(np.float16).astype(np.float64), paged, 6, 0.35),
        "prefill of positions 6-9, a float16 chunk over a float16 cache",
    )


# -------------------------------------------------------------------------------- round trip


@graded(
    2,
    "the whole path: slots from the table, reshape_and_cache, then attention through "
    "the same table equals dense attention over the keys written",
    f"{DOC}#where-attention-meets-the-block-table",
)
def test_write_then_attend_round_trip():
    """A prompt written in two chunks with your slot mapping and cache write, then decoded."""
    mod = pa()
    rng = np.random.default_rng(11)
    block_size, kv_heads, heads, dim, n = 4, 2, 4, 8, 15
    key_cache = rng.standard_normal((8, block_size, kv_heads, dim))
    value_cache = rng.standard_normal(key_cache.shape)
    table = np.array([6, 1, 7, 3])
    keys = rng.standard_normal((n, kv_heads, dim))
    values = rng.standard_normal((n, kv_heads, dim))
    queries = rng.standard_normal((n, heads, dim))
    outs = []
    for start, end in ((0, 9), (9, 15)):
        positions = np.arange(start, end)
        slots = mod.compute_slot_mapping(table, positions, block_size)
        mod.reshape_and_cache(keys[start:end], values[start:end], key_cache, value_cache, slots)
        outs.append(
            mod.paged_attention_prefill(
                queries[start:end], key_cache, value_cache, table, start, 0.35
            )
        )
    want = attention(queries, keys, values, 0.35, np.arange(n))
    assert_close(np.concatenate(outs), want, TOL, "prefill in two chunks through your cache write")
    query = rng.standard_normal((1, heads, dim))
    got = mod.paged_attention_decode(
        query, key_cache, value_cache, table[None], np.array([n]), 0.35
    )
    assert_close(
        got,
        attention(query, keys, values, 0.35),
        TOL,
        "decode after writing 15 tokens through your slot mapping",
    )
