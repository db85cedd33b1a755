"""Tests of mini_vllm.teaching.paged_attention_numpy: the write path, the read path, and the
ground truth they are checked against (dense attention, itself checked against the textbook
per-query formula)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mini_vllm.teaching.paged_attention_numpy import (
    compute_slot_mapping,
    dense_attention,
    paged_attention_decode,
    paged_attention_prefill,
    reshape_and_cache,
)

TOL = 1e-12


def naive_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, scale: float, causal: bool):
    """Per query, per head, the formula from the paper; slow and obviously right."""
    query_len, num_heads, _ = q.shape
    kv_len, num_kv_heads, _ = k.shape
    group = num_heads // num_kv_heads
    out = np.zeros_like(q)
    for i in range(query_len):
        last = kv_len - query_len + i if causal else kv_len - 1
        for h in range(num_heads):
            kh = h // group
            s = np.array([q[i, h] @ k[j, kh] * scale for j in range(last + 1)])
            w = np.exp(s - s.max())
            w /= w.sum()
            out[i, h] = sum(w[j] * v[j, kh] for j in range(last + 1))
    return out


class PagedSeqs:
    """Sequences written into a shared paged cache through randomly permuted block tables."""

    def __init__(
        self,
        rng: np.random.Generator,
        seq_lens: list[int],
        block_size: int,
        num_kv_heads: int,
        head_dim: int,
        spare_blocks: int = 3,
        pad_value: int = -1,
    ) -> None:
        self.block_size = block_size
        used = [-(-n // block_size) for n in seq_lens]
        max_blocks = max(used) + 2
        num_blocks = sum(used) + spare_blocks
        # Fill with garbage: any read outside the tables would show up as a wrong answer.
        self.key_cache = rng.standard_normal((num_blocks, block_size, num_kv_heads, head_dim)) * 9
        self.value_cache = rng.standard_normal(self.key_cache.shape) * 9
        perm = rng.permutation(num_blocks)
        self.block_tables = np.full((len(seq_lens), max_blocks), pad_value, dtype=np.int32)
        self.keys, self.values = [], []
        start = 0
        for i, (n, u) in enumerate(zip(seq_lens, used)):
            self.block_tables[i, :u] = perm[start : start + u]
            start += u
            k = rng.standard_normal((n, num_kv_heads, head_dim))
            v = rng.standard_normal((n, num_kv_heads, head_dim))
            slots = compute_slot_mapping(self.block_tables[i], np.arange(n), block_size)
            reshape_and_cache(k, v, self.key_cache, self.value_cache, slots)
            self.keys.append(k)
            self.values.append(v)
        self.seq_lens = np.array(seq_lens)


# ---------------------------------------------------------------- compute_slot_mapping


def test_slot_mapping_formula_by_hand() -> None:
    table = np.array([7, 2, 5])
    slots = compute_slot_mapping(table, np.array([0, 1, 3, 4, 5, 9, 11]), block_size=4)
    assert slots.dtype == np.int64
    assert slots.tolist() == [28, 29, 31, 8, 9, 21, 23]


def test_slot_mapping_negative_position_is_padding() -> None:
    slots = compute_slot_mapping(np.array([3]), np.array([0, -1, 2]), block_size=4)
    assert slots.tolist() == [12, -1, 14]


def test_slot_mapping_rejects_position_past_table() -> None:
    with pytest.raises(ValueError, match="logical block 2"):
        compute_slot_mapping(np.array([1, 2]), np.array([8]), block_size=4)


@given(
    block_size=st.sampled_from([1, 2, 4, 8, 16]),
    num_blocks=st.integers(1, 12),
    data=st.data(),
)
@settings(max_examples=60, deadline=None)
def test_slot_mapping_property(block_size: int, num_blocks: int, data: st.DataObject) -> None:
    table = np.array(data.draw(st.permutations(range(num_blocks))))
    positions = np.array(
        data.draw(st.lists(st.integers(0, num_blocks * block_size - 1), max_size=20)),
        dtype=np.int64,
    )
    slots = compute_slot_mapping(table, positions, block_size)
    assert np.array_equal(slots // block_size, table[positions // block_size])
    assert np.array_equal(slots % block_size, positions % block_size)


# ---------------------------------------------------------------- reshape_and_cache


def test_reshape_and_cache_writes_slots_and_skips_padding() -> None:
    rng = np.random.default_rng(0)
    kc = np.zeros((4, 2, 3, 5))
    vc = np.zeros_like(kc)
    k = rng.standard_normal((4, 3, 5))
    v = rng.standard_normal((4, 3, 5))
    reshape_and_cache(k, v, kc, vc, np.array([5, -1, 0, 2]))
    assert np.array_equal(kc[2, 1], k[0]) and np.array_equal(vc[2, 1], v[0])
    assert np.array_equal(kc[0, 0], k[2]) and np.array_equal(kc[1, 0], k[3])
    written = {(2, 1), (0, 0), (1, 0)}
    for b in range(4):
        for o in range(2):
            if (b, o) not in written:
                assert not kc[b, o].any() and not vc[b, o].any(), "padding token was written"


def test_reshape_and_cache_in_place_on_a_layer_slice() -> None:
    """A layer's cache is often a slice of one big tensor; the write must land in it."""
    rng = np.random.default_rng(1)
    stacked = np.zeros((2, 3, 4, 2, 8))  # [k/v, blocks, block_size, heads, dim]
    strided = np.zeros((3, 4, 4, 8))[:, :, ::2]  # a non-contiguous cache
    k = rng.standard_normal((2, 2, 8))
    reshape_and_cache(k, k, stacked[0], stacked[1], np.array([1, 11]))
    reshape_and_cache(k, k, strided, strided, np.array([1, 11]))
    assert np.array_equal(stacked[0, 0, 1], k[0]) and np.array_equal(stacked[1, 2, 3], k[1])
    assert np.array_equal(strided[0, 1], k[0]) and np.array_equal(strided[2, 3], k[1])


def test_reshape_and_cache_validates() -> None:
    kc = np.zeros((2, 4, 2, 8))
    k = np.zeros((3, 2, 8))
    with pytest.raises(ValueError, match="out of range"):
        reshape_and_cache(k, k, kc, kc.copy(), np.array([0, 1, 8]))
    with pytest.raises(ValueError, match="slot_mapping"):
        reshape_and_cache(k, k, kc, kc.copy(), np.array([0, 1]))
    with pytest.raises(ValueError, match="num_kv_heads"):
        reshape_and_cache(np.zeros((3, 1, 8)), np.zeros((3, 1, 8)), kc, kc.copy(), np.arange(3))
    with pytest.raises(ValueError, match="value_cache"):
        reshape_and_cache(k, k, kc, np.zeros((2, 4, 2, 4)), np.arange(3))


# ---------------------------------------------------------------- dense_attention


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize(("num_heads", "num_kv_heads"), [(4, 4), (6, 2), (4, 1)])
def test_dense_attention_matches_naive(causal: bool, num_heads: int, num_kv_heads: int) -> None:
    rng = np.random.default_rng(2)
    q = rng.standard_normal((3, num_heads, 8))
    k = rng.standard_normal((7, num_kv_heads, 8))
    v = rng.standard_normal((7, num_kv_heads, 8))
    got = dense_attention(q, k, v, 0.4, causal=causal)
    assert np.abs(got - naive_attention(q, k, v, 0.4, causal)).max() < TOL


def test_dense_attention_gqa_equals_repeated_kv_heads() -> None:
    rng = np.random.default_rng(3)
    q = rng.standard_normal((5, 8, 4))
    k = rng.standard_normal((5, 2, 4))
    v = rng.standard_normal((5, 2, 4))
    mha = dense_attention(q, np.repeat(k, 4, axis=1), np.repeat(v, 4, axis=1), 0.5, causal=True)
    assert np.abs(dense_attention(q, k, v, 0.5, causal=True) - mha).max() < TOL


def test_dense_attention_is_stable_for_huge_scores() -> None:
    q = np.full((1, 1, 4), 100.0)
    k = np.array([[[100.0] * 4], [[99.0] * 4]])
    v = np.array([[[1.0] * 4], [[2.0] * 4]])
    out = dense_attention(q, k, v, 1.0)  # scores 40000 and 39600: exp would overflow
    assert np.isfinite(out).all() and np.allclose(out, 1.0)


def test_dense_attention_validates() -> None:
    with pytest.raises(ValueError, match="multiple"):
        dense_attention(np.zeros((1, 3, 4)), np.zeros((2, 2, 4)), np.zeros((2, 2, 4)), 1.0)
    with pytest.raises(ValueError, match="query_len"):
        dense_attention(
            np.zeros((3, 2, 4)), np.zeros((2, 2, 4)), np.zeros((2, 2, 4)), 1.0, causal=True
        )


# ---------------------------------------------------------------- decode


@pytest.mark.parametrize("block_size", [1, 2, 4, 16])
@pytest.mark.parametrize(("num_heads", "num_kv_heads"), [(4, 4), (8, 2), (6, 1)])
def test_decode_equals_dense(block_size: int, num_heads: int, num_kv_heads: int) -> None:
    rng = np.random.default_rng(block_size * 100 + num_heads)
    seq_lens = [1, block_size, 3 * block_size + 1, 37]  # includes non-multiples of block_size
    paged = PagedSeqs(rng, seq_lens, block_size, num_kv_heads, 8)
    q = rng.standard_normal((len(seq_lens), num_heads, 8))
    out = paged_attention_decode(
        q, paged.key_cache, paged.value_cache, paged.block_tables, paged.seq_lens, 0.3
    )
    for i in range(len(seq_lens)):
        ref = dense_attention(q[i : i + 1], paged.keys[i], paged.values[i], 0.3)
        assert np.abs(out[i] - ref[0]).max() < TOL


def test_decode_ignores_table_entries_past_the_used_blocks() -> None:
    rng = np.random.default_rng(4)
    paged = PagedSeqs(rng, [5, 9], 4, 2, 8, pad_value=10**6)  # out-of-range padding
    q = rng.standard_normal((2, 4, 8))
    a = paged_attention_decode(
        q, paged.key_cache, paged.value_cache, paged.block_tables, paged.seq_lens, 0.3
    )
    tables = paged.block_tables.copy()
    tables[tables == 10**6] = 0
    b = paged_attention_decode(q, paged.key_cache, paged.value_cache, tables, paged.seq_lens, 0.3)
    assert np.array_equal(a, b)


def test_decode_validates() -> None:
    rng = np.random.default_rng(5)
    paged = PagedSeqs(rng, [5], 4, 2, 8)
    q = np.zeros((1, 4, 8))
    kc, vc, bt = paged.key_cache, paged.value_cache, paged.block_tables
    with pytest.raises(ValueError, match="needs"):
        paged_attention_decode(q, kc, vc, bt, np.array([4 * bt.shape[1] + 1]), 1.0)
    with pytest.raises(ValueError, match=">= 1"):
        paged_attention_decode(q, kc, vc, bt, np.array([0]), 1.0)
    with pytest.raises(ValueError, match="multiple"):
        paged_attention_decode(np.zeros((1, 3, 8)), kc, vc, bt, np.array([5]), 1.0)
    with pytest.raises(ValueError, match="head_dim"):
        paged_attention_decode(np.zeros((1, 4, 4)), kc, vc, bt, np.array([5]), 1.0)
    with pytest.raises(ValueError, match="block_tables"):
        paged_attention_decode(q, kc, vc, bt[0], np.array([5]), 1.0)


# ---------------------------------------------------------------- prefill


@pytest.mark.parametrize("block_size", [1, 4, 8])
@pytest.mark.parametrize("context_len", [0, 3, 8, 13])
def test_prefix_plus_prefill_equals_dense_causal(block_size: int, context_len: int) -> None:
    rng = np.random.default_rng(block_size + 31 * context_len)
    query_len, num_heads, num_kv_heads = 6, 4, 2
    total = context_len + query_len
    paged = PagedSeqs(rng, [total], block_size, num_kv_heads, 8)
    k, v = paged.keys[0], paged.values[0]
    q_all = rng.standard_normal((total, num_heads, 8))
    out = paged_attention_prefill(
        q_all[context_len:], paged.key_cache, paged.value_cache, paged.block_tables[0],
        context_len, 0.35,
    )  # fmt: skip
    full = dense_attention(q_all, k, v, 0.35, causal=True)
    assert np.abs(out - full[context_len:]).max() < TOL


def test_chunked_prefill_then_decode_reproduce_one_dense_pass() -> None:
    """Write and attend chunk by chunk (chunked prefill), then decode: same as one causal pass."""
    rng = np.random.default_rng(6)
    block_size, num_heads, num_kv_heads, dim, total = 4, 6, 3, 8, 19
    q = rng.standard_normal((total, num_heads, dim))
    k = rng.standard_normal((total, num_kv_heads, dim))
    v = rng.standard_normal((total, num_kv_heads, dim))
    kc = np.zeros((8, block_size, num_kv_heads, dim))
    vc = np.zeros_like(kc)
    table = rng.permutation(8)[:5]
    outs, start = [], 0
    for chunk in (7, 5, 6):
        pos = np.arange(start, start + chunk)
        reshape_and_cache(k[pos], v[pos], kc, vc, compute_slot_mapping(table, pos, block_size))
        outs.append(paged_attention_prefill(q[pos], kc, vc, table, start, 0.3))
        start += chunk
    reshape_and_cache(
        k[start:], v[start:], kc, vc, compute_slot_mapping(table, np.array([start]), block_size)
    )
    outs.append(paged_attention_decode(q[start:], kc, vc, table[None], np.array([total]), 0.3))
    assert np.abs(np.concatenate(outs) - dense_attention(q, k, v, 0.3, causal=True)).max() < TOL


@given(
    block_size=st.sampled_from([1, 2, 4, 8]),
    group=st.sampled_from([1, 2, 4]),
    num_kv_heads=st.integers(1, 3),
    context_len=st.integers(0, 20),
    query_len=st.integers(1, 6),
    seed=st.integers(0, 2**32 - 1),
)
@settings(max_examples=40, deadline=None)
def test_prefill_property(
    block_size: int, group: int, num_kv_heads: int, context_len: int, query_len: int, seed: int
) -> None:
    rng = np.random.default_rng(seed)
    total = context_len + query_len
    paged = PagedSeqs(rng, [total], block_size, num_kv_heads, 4)
    q = rng.standard_normal((query_len, group * num_kv_heads, 4))
    out = paged_attention_prefill(
        q, paged.key_cache, paged.value_cache, paged.block_tables[0], context_len, 0.5
    )
    ref = naive_attention(
        np.concatenate([np.zeros((context_len, *q.shape[1:])), q]),
        paged.keys[0], paged.values[0], 0.5, causal=True,
    )[context_len:]  # fmt: skip
    assert np.abs(out - ref).max() < 1e-10


def test_float32_inputs_keep_their_dtype() -> None:
    rng = np.random.default_rng(7)
    paged = PagedSeqs(rng, [9], 4, 1, 8)
    kc = paged.key_cache.astype(np.float32)
    vc = paged.value_cache.astype(np.float32)
    q = rng.standard_normal((1, 2, 8)).astype(np.float32)
    out = paged_attention_decode(q, kc, vc, paged.block_tables, paged.seq_lens, 0.3)
    assert out.dtype == np.float32
    ref = paged_attention_decode(
        q.astype(np.float64), kc.astype(np.float64), vc.astype(np.float64),
        paged.block_tables, paged.seq_lens, 0.3,
    )  # fmt: skip
    assert np.abs(out - ref).max() < 1e-5
