"""lab-06, part 3: split-K decode (``attend_split``, ``merge_splits``,
``paged_attention_decode_split_k``), the arithmetic of lab-04's Triton decode kernel.

A split attends to one piece of a sequence's keys and returns its output normalised by its own
softmax sum, with the log-sum-exp of its scores; the merge weights each split by
``exp(lse_i - max lse)``. Everything is checked against the float64 oracle, to 1e-12: splitting
changes the order of the arithmetic, never the result.
"""

from __future__ import annotations

import itertools

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from grading.suite import graded, learner_module
from tests.labs.common import GRADED_SETTINGS, describe, same_data
from tests.labs.lab_06.oracle import (
    as_array,
    assert_close,
    assert_half_computed_in_float32,
    assert_rounded_once,
    attention,
    pa,
    write_paged,
)

DOC = "labs/lab-06-paged-attention-numpy/README.md"
TOL = 1e-12


def oracle_split(
    query: np.ndarray, key: np.ndarray, value: np.ndarray, scale: float
) -> tuple[np.ndarray, np.ndarray]:
    """``(partial [H, D], lse [H])`` of one query ``[H, D]`` over ``key, value [n, KV, D]``,
    head by head in float64 (no keys: zeros and -inf)."""
    num_heads, head_dim = query.shape
    n, num_kv_heads, _ = key.shape
    partial = np.zeros((num_heads, head_dim))
    lse = np.full(num_heads, -np.inf)
    if n == 0:
        return partial, lse
    partial = attention(query[None], key, value, scale)[0]
    group = num_heads // num_kv_heads
    for h in range(num_heads):
        scores = key[:, h // group] @ query[h] * scale
        top = scores.max()
        lse[h] = top + np.log(np.exp(scores - top).sum())
    return partial, lse


def split_result(got, what: str) -> tuple[np.ndarray, np.ndarray]:
    """The learner's ``(partial, lse)``, checked to be a pair of arrays."""
    if type(got) not in (tuple, list) or len(got) != 2:
        raise AssertionError(
            f"{what}: attend_split must return (partial, lse), got {describe(got)}"
        )
    return as_array(got[0], f"{what}: partial"), as_array(got[1], f"{what}: lse")


@graded(
    2,
    "attend_split: the piece's output is normalised by the piece's OWN softmax sum, and "
    "lse = m + log(sum exp(s - m)) of the scaled scores s = scale * q . k, m being each "
    "head's own largest score",
    f"{DOC}#part-3-split-k-decode",
)
def test_attend_split_output_and_lse():
    """One piece of 11 keys, GQA (6 query heads on 3 KV heads): output and lse per head."""
    rng = np.random.default_rng(6)
    query = rng.standard_normal((6, 8))
    key, value = rng.standard_normal((11, 3, 8)), rng.standard_normal((11, 3, 8))
    partial, lse = split_result(pa().attend_split(query, key, value, 0.35), "11 keys")
    want_partial, want_lse = oracle_split(query, key, value, 0.35)
    assert_close(
        lse,
        want_lse,
        TOL,
        "lse of 11 keys, 6 query heads on 3 KV heads (per head: "
        "log of the sum of exp(scale * q . k); natural log; query head h reads KV head h // 2)",
    )
    assert_close(
        partial,
        want_partial,
        TOL,
        "attend_split's output over 11 keys, 6 query heads on 3 KV heads (softmax over this "
        "piece alone; query head h reads KV head h // 2)",
    )
    # One head's scores in the thousands, the other's near 1: a single max over all heads
    # underflows the second head's exp to 0 (0 / 0).
    query = rng.standard_normal((2, 8)) * np.array([[3000.0], [1.0]])
    key, value = rng.standard_normal((9, 1, 8)), rng.standard_normal((9, 1, 8))
    with np.errstate(all="ignore"):
        partial, lse = split_result(pa().attend_split(query, key, value, 0.35), "9 keys")
    want_partial, want_lse = oracle_split(query, key, value, 0.35)
    assert_close(
        lse,
        want_lse,
        1e-9,
        f"lse of 9 keys, head 0's scores in the thousands and head 1's near 1 (expected "
        f"{np.round(want_lse, 3).tolist()}: subtract each head's own max, not one max of all)",
    )
    assert_close(
        partial,
        want_partial,
        1e-9,
        "attend_split's output over 9 keys, head 0's scores in the thousands and head 1's "
        "near 1 (subtract each head's own max, not one max of all)",
    )


@graded(
    1,
    "attend_split of a piece with no keys (the last splits of a short sequence) gives "
    "zeros and lse = -inf, never nan, in the compute dtype like any other piece",
    f"{DOC}#part-3-split-k-decode",
)
def test_attend_split_of_no_keys():
    """An empty piece: nothing to attend to, no weight in the merge."""
    query = np.ones((2, 4))
    empty = np.zeros((0, 1, 4))
    partial, lse = split_result(pa().attend_split(query, empty, empty, 0.5), "no keys")
    assert partial.shape == (2, 4) and lse.shape == (2,), (
        f"no keys: partial must be [2, 4] and lse [2], got {partial.shape} and {lse.shape}"
    )
    assert not np.isnan(partial).any() and not np.isnan(lse).any(), (
        f"no keys: got nan (0 / 0?): partial {partial.tolist()}, lse {lse.tolist()}"
    )
    assert np.all(lse == -np.inf) and np.all(partial == 0), (
        f"no keys: expected zeros and lse -inf, got partial {partial.tolist()}, lse {lse.tolist()}"
    )
    empty = np.zeros((0, 1, 4), dtype=np.float16)
    partial, lse = split_result(
        pa().attend_split(query.astype(np.float16), empty, empty, 0.5), "no float16 keys"
    )
    assert partial.dtype == np.float32 and lse.dtype == np.float32, (
        f"no float16 keys: partial and lse must be float32 (the compute dtype, as for a piece "
        f"with keys), got {partial.dtype} and {lse.dtype}: float64 is np.zeros(shape) without "
        "a dtype; float16 is a result cast back to the query's dtype, which only the decode "
        "does"
    )


@graded(
    1,
    "attend_split computes in the compute dtype and returns both in it: float32 for float16 "
    "and float32 inputs (float16 sums lose the lse and the output), float64 when any input "
    "is float64",
    "phases/04-attention-kernels/README.md#numerics",
)
def test_attend_split_compute_dtype():
    """float16 pieces are accumulated in float32; a float32 query over float64 keys in float64."""
    rng = np.random.default_rng(8)
    query = rng.standard_normal((4, 8)).astype(np.float16)
    key = rng.standard_normal((40, 2, 8)).astype(np.float16)
    value = rng.standard_normal((40, 2, 8)).astype(np.float16)
    partial, lse = split_result(pa().attend_split(query, key, value, 0.35), "float16 inputs")
    assert partial.dtype == np.float32 and lse.dtype == np.float32, (
        f"attend_split of float16 inputs returned a {partial.dtype} partial and a {lse.dtype} "
        "lse: compute in _compute_dtype (float32 here) from the scores on, and return the "
        "piece in it: not cast back to the query's dtype (only the decode's result is), nor "
        "widened to float64 (a kernel's accumulators are float32)"
    )
    want_partial, want_lse = oracle_split(
        query.astype(np.float64), key.astype(np.float64), value.astype(np.float64), 0.35
    )
    assert_close(lse, want_lse, 1e-5, "lse of 40 float16 keys (computed in float32)")
    assert_close(partial, want_partial, 1e-5, "output over 40 float16 keys (computed in float32)")
    single = [a.astype(np.float32) for a in (query, key, value)]
    partial, lse = split_result(pa().attend_split(*single, 0.35), "float32 inputs")
    assert partial.dtype == np.float32 and lse.dtype == np.float32, (
        f"attend_split of float32 inputs returned a {partial.dtype} partial and a {lse.dtype} "
        "lse: float32 inputs are computed, and returned, in float32 (_compute_dtype)"
    )
    query = rng.standard_normal((4, 8)).astype(np.float32)
    key, value = rng.standard_normal((13, 2, 8)), rng.standard_normal((13, 2, 8))
    partial, lse = split_result(
        pa().attend_split(query, key, value, 0.35), "float32 query over float64 keys"
    )
    want_partial, want_lse = oracle_split(query.astype(np.float64), key, value, 0.35)
    assert_close(
        lse,
        want_lse,
        TOL,
        "lse of a float32 query over 13 float64 keys (float64 inputs are computed in float64, "
        "not in the query's float32)",
    )
    assert_close(
        partial,
        want_partial,
        TOL,
        "output of a float32 query over 13 float64 keys (computed in float64)",
    )


@st.composite
def merge_cases(draw):
    """A query, its keys, and where to cut them into pieces (some may be empty)."""
    n = draw(st.integers(1, 24))
    cuts = sorted(draw(st.lists(st.integers(0, n), min_size=0, max_size=5)))
    return n, cuts, draw(st.sampled_from([1, 2])), draw(st.integers(0, 2**16))


@graded(
    3,
    "merge_splits: the output over all keys is sum_i w_i * partial_i with w_i = "
    "exp(lse_i - max lse) / sum_j exp(lse_j - max lse)",
    f"{DOC}#part-3-split-k-decode",
)
@GRADED_SETTINGS
@given(merge_cases())
def test_merge_splits_equals_one_softmax(case):
    """Pieces computed by the test (not by your attend_split), merged by yours."""
    n, cuts, group, seed = case
    rng = np.random.default_rng(seed)
    query = rng.standard_normal((2 * group, 4))
    key, value = rng.standard_normal((n, 2, 4)), rng.standard_normal((n, 2, 4))
    bounds = [0, *cuts, n]
    pieces = [oracle_split(query, key[a:b], value[a:b], 0.5) for a, b in itertools.pairwise(bounds)]
    partial = np.stack([p for p, _ in pieces])
    lse = np.stack([m for _, m in pieces])
    got = pa().merge_splits(partial, lse)
    assert_close(
        got,
        attention(query[None], key, value, 0.5)[0],
        TOL,
        f"merging {len(pieces)} pieces of {n} keys cut at {cuts} (lse per piece "
        f"{np.round(lse[:, 0], 3).tolist()} for head 0)",
    )


@graded(
    1,
    "merge_splits subtracts EACH HEAD's largest lse before exp: lse values in the "
    "thousands must not overflow, nor swamp another head whose lse are small",
    f"{DOC}#part-3-split-k-decode",
)
def test_merge_splits_large_lse_do_not_overflow():
    """exp(1000) is inf in float64; exp(lse - max lse) is at most 1, per head."""
    partial = np.array([[[1.0, 0.0]], [[0.0, 1.0]], [[5.0, 5.0]]])
    lse = np.array([[1000.0], [1000.0 + np.log(3.0)], [-np.inf]])
    got = pa().merge_splits(partial, lse)
    assert_close(
        got,
        np.array([[0.25, 0.75]]),
        TOL,
        "splits with lse 1000 and 1000 + log 3 weigh 1/4 and 3/4 (an empty third "
        "split, lse -inf, weighs 0)",
    )
    partial = np.array([[[1.0, 0.0], [2.0, 0.0]], [[0.0, 1.0], [0.0, 2.0]]])
    lse = np.array([[1000.0, np.log(3.0)], [1000.0 + np.log(3.0), 0.0]])
    with np.errstate(all="ignore"):
        got = pa().merge_splits(partial, lse)
    assert_close(
        got,
        np.array([[0.25, 0.75], [1.5, 0.5]]),
        TOL,
        "two heads: head 0's splits have lse 1000 and 1000 + log 3 (weights 1/4, 3/4), head "
        "1's log 3 and 0 (weights 3/4, 1/4); head 1's weights are exp(lse - head 1's max), "
        "not exp(lse - 1000)",
    )
    # Lse far apart within one head: only the LARGEST is a safe reference. Subtracting the
    # smallest (or the mean) of them leaves exp(5000) = inf for the others.
    partial = np.array([[[1.0, 0.0]], [[0.0, 1.0]], [[7.0, 7.0]], [[9.0, 9.0]]])
    lse = np.array([[5000.0], [5000.0 + np.log(3.0)], [0.0], [-np.inf]])
    with np.errstate(all="ignore"):
        got = pa().merge_splits(partial, lse)
    assert_close(
        got,
        np.array([[0.25, 0.75]]),
        TOL,
        "splits with lse 5000, 5000 + log 3 and 0 (and an empty one) weigh 1/4, 3/4 and "
        "exp(-5000) = 0: subtract the head's LARGEST lse, since exp(lse - a smaller "
        "reference) overflows",
    )


@graded(
    1,
    "a split with no keys (lse = -inf) has weight 0 in the merge, whatever its partial "
    "output holds; the merged output has partial's dtype, float16 partials being merged in "
    "float32 (_compute_dtype of partial and lse) and only the result rounded to float16",
    f"{DOC}#part-3-split-k-decode",
)
def test_merge_splits_ignores_empty_splits():
    """An empty split's partial may hold anything (a kernel may leave it unwritten)."""
    partial = np.array([[[2.0, -1.0]], [[np.nan, np.inf]]])
    lse = np.array([[0.5], [-np.inf]])
    got = pa().merge_splits(partial, lse)
    assert_close(
        got,
        np.array([[2.0, -1.0]]),
        TOL,
        "one real split and one empty split (lse -inf, partial [nan, inf]: 0 * nan is "
        "nan, so mask it rather than multiply by its weight 0): the result is the real "
        "split's output",
    )
    narrow = pa().merge_splits(partial.astype(np.float32), lse)
    assert narrow.dtype == np.float32, (
        f"float32 partial outputs with float64 lse merged into {narrow.dtype}: the merged "
        "output has partial's dtype (the weights may be computed wider, the result is not)"
    )
    half = pa().merge_splits(partial.astype(np.float16), lse.astype(np.float32))
    assert half.dtype == np.float16, (
        f"float16 partial outputs with float32 lse merged into {half.dtype}: the merged "
        "output has partial's dtype, whatever the compute dtype (_compute_dtype) of float16 is"
    )
    # Five float16 splits of unequal weight: merged in float32 and rounded once, the output is
    # within a float16 ulp of the float64 merge; with the weights (or the lse) rounded to
    # float16 first, as "the result in partial's dtype" misread as "computed in it" does, it
    # is off by several.
    rng = np.random.default_rng(16)
    partial = rng.standard_normal((5, 4, 16)).astype(np.float16)
    lse = (rng.standard_normal((5, 4)) * 3 + 6).astype(np.float32)
    lse[4, 1] = -np.inf
    wide = lse.astype(np.float64)
    weights = np.exp(wide - wide.max(axis=0))
    weights /= weights.sum(axis=0)
    want = np.einsum("sh,shd->hd", weights, partial.astype(np.float64))
    assert_half_computed_in_float32(
        as_array(pa().merge_splits(partial, lse), "merge of float16 partials"),
        want,
        "merge of 5 float16 partial outputs with float32 lse between 0 and 12 (README, "
        "part 3 and 'Compute in _compute_dtype': the merge of float16 partials is computed "
        "in float32, only its result rounded to float16)",
    )


@st.composite
def split_k_cases(draw):
    block_size = draw(st.sampled_from([1, 2, 4, 16]))
    lens = draw(st.lists(st.integers(1, 40), min_size=1, max_size=3))
    num_splits = draw(st.integers(1, 8))
    group = draw(st.sampled_from([1, 3]))
    return block_size, lens, num_splits, group, draw(st.integers(0, 2**16))


@graded(
    3,
    "split-K decode cuts each sequence into num_splits ranges of cdiv(seq_len, "
    "num_splits) tokens (the last may be short or empty), attends to each with attend_split "
    "and the scale given, merges them with merge_splits: the result equals dense attention",
    f"{DOC}#part-3-split-k-decode",
)
@GRADED_SETTINGS
@given(split_k_cases())
def test_split_k_decode_equals_dense(case):
    """Any number of splits, more splits than tokens included, through random block tables."""
    block_size, lens, num_splits, group, seed = case
    rng = np.random.default_rng(seed)
    paged = write_paged(rng, lens, block_size, num_kv_heads=2, head_dim=4, extra_columns=2)
    query = rng.standard_normal((len(lens), 2 * group, 4))
    # scale 0.4, not 0.5: head_dim is 4, and 0.5 would hide a hard-coded head_dim ** -0.5
    got = pa().paged_attention_decode_split_k(
        query, paged.key_cache, paged.value_cache, paged.tables, paged.seq_lens, 0.4, num_splits
    )
    want = np.stack(
        [
            attention(query[i : i + 1], paged.keys[i], paged.values[i], 0.4)[0]
            for i in range(len(lens))
        ]
    )
    assert_close(
        got,
        want,
        TOL,
        f"split-K decode of lengths {lens} in {num_splits} splits, block_size {block_size}, "
        "scale 0.4",
    )
    # The output cannot tell a split decode from a dense one (the merge is exact): the pieces
    # it attended to can. Empty ranges may be skipped (they weigh nothing), and one split may
    # skip the merge (it is the identity).
    _, pieces, merges = learner_module("learner_side").split_k_pieces(
        query, paged.key_cache, paged.value_cache, paged.tables, paged.seq_lens, 0.4, num_splits
    )
    if num_splits == 1:
        return
    per_split = -(-np.array(lens) // num_splits)
    want_pieces = sorted(
        int(min(per, n - j * per))
        for n, per in zip(lens, per_split)
        for j in range(num_splits)
        if n > j * per
    )
    got_pieces = sorted(p for p in pieces if p != 0) if type(pieces) is list else pieces
    assert same_data(got_pieces, want_pieces) and type(merges) is int and merges >= 1, (
        f"split-K decode of lengths {lens} in {num_splits} splits should call attend_split "
        f"once per range, on ranges of cdiv(seq_len, num_splits) keys (sorted sizes of the "
        f"non-empty ones {want_pieces}), and merge them with merge_splits; it called "
        f"attend_split on {describe(got_pieces)} keys and merge_splits {describe(merges)} times"
    )


@graded(
    1,
    "split-K decode keeps the query's dtype (float32 in, float32 out; float16 in, float16 "
    "out) and equals dense attention to float32 rounding; a float32 query over a float64 "
    "cache is computed in float64 and rounded once, a float16 one in float32",
    f"{DOC}#part-3-split-k-decode",
)
def test_split_k_decode_float32():
    """The merge may compute in float64 or float32; the result has the query's dtype. The
    scale is 0.35, not a power of two, so that a query scaled in float32 before the float64
    arithmetic rounds (0.5 multiplies exactly)."""
    rng = np.random.default_rng(3)
    paged = write_paged(rng, [9, 3], 4, num_kv_heads=1, head_dim=4)
    query = rng.standard_normal((2, 2, 4)).astype(np.float32)
    got = as_array(
        pa().paged_attention_decode_split_k(
            query,
            paged.key_cache.astype(np.float32),
            paged.value_cache.astype(np.float32),
            paged.tables,
            paged.seq_lens,
            0.35,
            2,
        ),
        "float32 split-K decode",
    )
    assert got.dtype == np.float32, f"float32 inputs must give float32 output, got {got.dtype}"
    want = np.stack(
        [
            attention(query[i : i + 1].astype(np.float64), paged.keys[i], paged.values[i], 0.35)[0]
            for i in range(2)
        ]
    )
    assert_close(got, want, 1e-5, "float32 split-K decode of lengths [9, 3] in 2 splits")
    mixed = as_array(
        pa().paged_attention_decode_split_k(
            query, paged.key_cache, paged.value_cache, paged.tables, paged.seq_lens, 0.35, 2
        ),
        "split-K decode of a float32 query over a float64 cache",
    )
    assert mixed.dtype == np.float32, (
        f"a float32 query over a float64 cache must give a float32 output, got {mixed.dtype}"
    )
    assert_rounded_once(
        mixed,
        want,
        "split-K decode of lengths [9, 3] in 2 splits, a float32 query over a float64 cache",
    )
    half = as_array(
        pa().paged_attention_decode_split_k(
            query.astype(np.float16),
            paged.key_cache.astype(np.float16),
            paged.value_cache.astype(np.float16),
            paged.tables,
            paged.seq_lens,
            0.35,
            2,
        ),
        "float16 split-K decode",
    )
    assert half.dtype == np.float16, (
        f"float16 inputs must give a float16 output (the query's), got {half.dtype}: the "
        "pieces and the merge stay in float32 (the compute dtype), and only "
        "paged_attention_decode_split_k casts its result to the query's dtype"
    )
    keys = [k.astype(np.float16).astype(np.float64) for k in paged.keys]
    values = [v.astype(np.float16).astype(np.float64) for v in paged.values]
    query16 = query.astype(np.float16).astype(np.float64)
    assert_half_computed_in_float32(
        half,
        np.stack([attention(query16[i : i + 1], keys[i], values[i], 0.35)[0] for i in range(2)]),
        "split-K decode of lengths [9, 3] in 2 splits, float16 queries over a float16 cache",
    )
