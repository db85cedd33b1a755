"""Tests of mini_vllm.attention.torch_paged_attention against the numpy reference.

The torch path is what the engine's model calls on CPU, so beyond the lab-06 functions it is
checked on whole scheduler steps (``paged_attention_varlen``: prefills, prefill chunks after a
cached prefix, and decodes in one flattened batch)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")

from mini_vllm.attention.torch_paged_attention import (  # noqa: E402
    compute_slot_mapping,
    dense_attention,
    paged_attention_decode,
    paged_attention_prefill,
    paged_attention_varlen,
    reshape_and_cache,
)
from mini_vllm.teaching import paged_attention_numpy as ref  # noqa: E402

TOL = 1e-12


def t(x: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(x))


def make_cache(
    rng: np.random.Generator,
    seq_lens: list[int],
    block_size: int,
    num_kv_heads: int,
    head_dim: int,
    pad_value: int = -1,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[np.ndarray], list[np.ndarray]]:
    """A garbage-filled paged cache holding each sequence through a permuted block table."""
    used = [-(-n // block_size) for n in seq_lens]
    num_blocks = sum(used) + 3
    kc = rng.standard_normal((num_blocks, block_size, num_kv_heads, head_dim)) * 9
    vc = rng.standard_normal(kc.shape) * 9
    perm = rng.permutation(num_blocks)
    tables = np.full((len(seq_lens), max(used) + 2), pad_value, dtype=np.int32)
    keys, values, start = [], [], 0
    for i, (n, u) in enumerate(zip(seq_lens, used)):
        tables[i, :u] = perm[start : start + u]
        start += u
        k = rng.standard_normal((n, num_kv_heads, head_dim))
        v = rng.standard_normal((n, num_kv_heads, head_dim))
        slots = ref.compute_slot_mapping(tables[i], np.arange(n), block_size)
        ref.reshape_and_cache(k, v, kc, vc, slots)
        keys.append(k)
        values.append(v)
    return kc, vc, tables, keys, values


def test_slot_mapping_matches_reference() -> None:
    table = np.array([7, 2, 5, 1])
    pos = np.array([0, 3, 4, 9, -1, 15])
    assert (
        compute_slot_mapping(t(table), t(pos), 4).tolist()
        == ref.compute_slot_mapping(table, pos, 4).tolist()
    )
    with pytest.raises(ValueError, match="logical block"):
        compute_slot_mapping(t(table), torch.tensor([16]), 4)


def test_reshape_and_cache_matches_reference_and_skips_padding() -> None:
    rng = np.random.default_rng(0)
    kc = np.zeros((5, 4, 2, 8))
    vc = np.zeros_like(kc)
    k = rng.standard_normal((6, 2, 8))
    v = rng.standard_normal((6, 2, 8))
    slots = np.array([3, -1, 17, 0, 19, -7])
    kc_t, vc_t = t(kc.copy()), t(vc.copy())
    reshape_and_cache(t(k), t(v), kc_t, vc_t, t(slots))
    ref.reshape_and_cache(k, v, kc, vc, slots)
    assert np.array_equal(kc_t.numpy(), kc) and np.array_equal(vc_t.numpy(), vc)


def test_reshape_and_cache_into_a_stacked_layer_cache_and_casts() -> None:
    stacked = torch.zeros(2, 3, 4, 2, 8, dtype=torch.bfloat16)
    k = torch.randn(2, 2, 8)
    reshape_and_cache(k, k, stacked[0], stacked[1], torch.tensor([1, 11]))
    assert torch.equal(stacked[0, 0, 1], k[0].bfloat16())
    assert torch.equal(stacked[1, 2, 3], k[1].bfloat16())
    with pytest.raises(ValueError, match="out of range"):
        reshape_and_cache(k, k, stacked[0], stacked[1], torch.tensor([1, 12]))


@pytest.mark.parametrize("causal", [False, True])
def test_dense_attention_matches_reference(causal: bool) -> None:
    rng = np.random.default_rng(1)
    q = rng.standard_normal((3, 8, 16))
    k = rng.standard_normal((9, 2, 16))
    v = rng.standard_normal((9, 2, 16))
    got = dense_attention(t(q), t(k), t(v), 0.25, causal=causal).numpy()
    assert np.abs(got - ref.dense_attention(q, k, v, 0.25, causal=causal)).max() < TOL


@pytest.mark.parametrize("block_size", [1, 4, 16])
@pytest.mark.parametrize(("num_heads", "num_kv_heads"), [(4, 4), (8, 2), (9, 3)])
def test_decode_matches_reference(block_size: int, num_heads: int, num_kv_heads: int) -> None:
    rng = np.random.default_rng(block_size + num_heads)
    seq_lens = [1, block_size + 1, 33, 2 * block_size]
    kc, vc, tables, _, _ = make_cache(rng, seq_lens, block_size, num_kv_heads, 16)
    q = rng.standard_normal((len(seq_lens), num_heads, 16))
    got = paged_attention_decode(t(q), t(kc), t(vc), t(tables), t(np.array(seq_lens)), 0.25)
    want = ref.paged_attention_decode(q, kc, vc, tables, np.array(seq_lens), 0.25)
    assert got.dtype == torch.float64
    assert np.abs(got.numpy() - want).max() < TOL


def test_decode_with_garbage_table_padding() -> None:
    rng = np.random.default_rng(2)
    kc, vc, tables, _, _ = make_cache(rng, [3, 17, 8], 4, 2, 8, pad_value=2**30)
    q = rng.standard_normal((3, 4, 8))
    lens = np.array([3, 17, 8])
    got = paged_attention_decode(t(q), t(kc), t(vc), t(tables), t(lens), 0.3).numpy()
    tables[tables == 2**30] = 0
    assert np.abs(got - ref.paged_attention_decode(q, kc, vc, tables, lens, 0.3)).max() < TOL


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_decode_low_precision(dtype: torch.dtype) -> None:
    rng = np.random.default_rng(3)
    kc, vc, tables, _, _ = make_cache(rng, [20, 7], 4, 2, 16)
    kc, vc = kc / 9, vc / 9
    q = rng.standard_normal((2, 4, 16))
    lens = np.array([20, 7])
    got = paged_attention_decode(
        t(q).to(dtype), t(kc).to(dtype), t(vc).to(dtype), t(tables), t(lens), 0.25
    )
    assert got.dtype == dtype
    want = ref.paged_attention_decode(q, kc, vc, tables, lens, 0.25)
    tol = {torch.float32: 1e-5, torch.float16: 5e-3, torch.bfloat16: 3e-2}[dtype]
    assert np.abs(got.double().numpy() - want).max() < tol


@pytest.mark.parametrize("context_len", [0, 5, 12])
def test_prefill_matches_reference(context_len: int) -> None:
    rng = np.random.default_rng(context_len)
    total = context_len + 7
    kc, vc, tables, _, _ = make_cache(rng, [total], 4, 2, 8)
    q = rng.standard_normal((7, 6, 8))
    got = paged_attention_prefill(t(q), t(kc), t(vc), t(tables[0]), context_len, 0.3).numpy()
    want = ref.paged_attention_prefill(q, kc, vc, tables[0], context_len, 0.3)
    assert np.abs(got - want).max() < TOL


def test_validation_errors() -> None:
    kc = torch.zeros(4, 4, 2, 8)
    q = torch.zeros(1, 4, 8)
    table = torch.tensor([[0, 1]])
    with pytest.raises(ValueError, match="multiple"):
        paged_attention_decode(torch.zeros(1, 3, 8), kc, kc, table, torch.tensor([3]), 1.0)
    with pytest.raises(ValueError, match=">= 1"):
        paged_attention_decode(q, kc, kc, table, torch.tensor([0]), 1.0)
    with pytest.raises(ValueError, match="columns"):
        paged_attention_decode(q, kc, kc, table, torch.tensor([9]), 1.0)
    with pytest.raises(ValueError, match="outside"):
        paged_attention_decode(q, kc, kc, torch.tensor([[0, 7]]), torch.tensor([8]), 1.0)
    with pytest.raises(ValueError, match="query_start_loc"):
        paged_attention_varlen(q, kc, kc, table, torch.tensor([0]), torch.tensor([3]), 1.0)
    with pytest.raises(ValueError, match="shorter"):
        paged_attention_varlen(
            torch.zeros(3, 4, 8), kc, kc, table, torch.tensor([0, 3]), torch.tensor([2]), 1.0
        )


def _varlen_case(
    rng: np.random.Generator,
    query_lens: list[int],
    context_lens: list[int],
    block_size: int,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int = 8,
    padded_rows: int = 0,
):
    seq_lens = [c + q for c, q in zip(context_lens, query_lens)]
    kc, vc, tables, _, _ = make_cache(rng, seq_lens, block_size, num_kv_heads, head_dim)
    q = rng.standard_normal((sum(query_lens) + padded_rows, num_heads, head_dim))
    qsl = np.concatenate([[0], np.cumsum(query_lens)]).astype(np.int32)
    got = paged_attention_varlen(
        t(q), t(kc), t(vc), t(tables), t(qsl), t(np.array(seq_lens, dtype=np.int32)), 0.3
    ).numpy()
    wants = [
        ref.paged_attention_prefill(q[qsl[i] : qsl[i + 1]], kc, vc, tables[i], context_lens[i], 0.3)
        for i in range(len(query_lens))
    ]
    return got, wants, qsl


def test_varlen_mixed_batch_of_prefills_chunks_and_decodes() -> None:
    rng = np.random.default_rng(4)
    # fresh prompt, chunk after a cached prefix, three decodes, and an idle sequence
    query_lens = [9, 5, 1, 1, 1, 0]
    context_lens = [0, 11, 4, 30, 0, 3]
    got, wants, qsl = _varlen_case(rng, query_lens, context_lens, 4, 6, 2, padded_rows=3)
    for i, want in enumerate(wants):
        assert np.allclose(got[qsl[i] : qsl[i + 1]], want, rtol=0, atol=TOL)
    assert not got[qsl[-1] :].any(), "padding rows must come back as zeros"


def test_varlen_decode_only_batch_equals_decode() -> None:
    rng = np.random.default_rng(5)
    seq_lens = np.array([3, 16, 9], dtype=np.int32)
    kc, vc, tables, _, _ = make_cache(rng, seq_lens.tolist(), 8, 1, 8)
    q = rng.standard_normal((3, 4, 8))
    a = paged_attention_varlen(
        t(q), t(kc), t(vc), t(tables), torch.tensor([0, 1, 2, 3]), t(seq_lens), 0.3
    )
    b = paged_attention_decode(t(q), t(kc), t(vc), t(tables), t(seq_lens), 0.3)
    assert (a - b).abs().max() < TOL


@given(
    block_size=st.sampled_from([1, 2, 4, 16]),
    group=st.sampled_from([1, 3, 4]),
    num_kv_heads=st.integers(1, 2),
    seqs=st.lists(st.tuples(st.integers(0, 6), st.integers(0, 20)), min_size=1, max_size=5),
    seed=st.integers(0, 2**32 - 1),
)
@settings(max_examples=40, deadline=None)
def test_varlen_property(
    block_size: int, group: int, num_kv_heads: int, seqs: list[tuple[int, int]], seed: int
) -> None:
    query_lens = [q for q, _ in seqs]
    context_lens = [c if q else max(c, 1) for q, c in seqs]  # a sequence holds >= 1 token
    rng = np.random.default_rng(seed)
    got, wants, qsl = _varlen_case(
        rng, query_lens, context_lens, block_size, group * num_kv_heads, num_kv_heads
    )
    for i, want in enumerate(wants):
        assert np.allclose(got[qsl[i] : qsl[i + 1]], want, rtol=0, atol=TOL)


def test_engine_style_write_then_attend_round_trip() -> None:
    """The model's per-layer sequence: slot mapping, write, varlen attention; steps accumulate."""
    torch.manual_seed(0)
    block_size, num_heads, num_kv_heads, dim = 4, 4, 2, 8
    kc = torch.zeros(16, block_size, num_kv_heads, dim, dtype=torch.float64)
    vc = torch.zeros_like(kc)
    tables = torch.tensor([[3, 9, 1, 12, 0, 0], [7, 2, 14, 5, 0, 0]])
    total = [13, 6]
    qs = [torch.randn(n, num_heads, dim, dtype=torch.float64) for n in total]
    ks = [torch.randn(n, num_kv_heads, dim, dtype=torch.float64) for n in total]
    vs = [torch.randn(n, num_kv_heads, dim, dtype=torch.float64) for n in total]
    done = [0, 0]
    outs: list[list[torch.Tensor]] = [[], []]
    for step in ([8, 6], [5, 0], [0, 0]):  # chunked prefill, then a step that finishes seq 0
        step = [min(s, total[i] - done[i]) for i, s in enumerate(step)]
        pos = [torch.arange(done[i], done[i] + step[i]) for i in range(2)]
        slots = torch.cat([compute_slot_mapping(tables[i], pos[i], block_size) for i in range(2)])
        reshape_and_cache(
            torch.cat([ks[i][pos[i]] for i in range(2)]),
            torch.cat([vs[i][pos[i]] for i in range(2)]),
            kc, vc, slots,
        )  # fmt: skip
        qsl = torch.tensor([0, step[0], step[0] + step[1]])
        seq_lens = torch.tensor([done[0] + step[0], max(done[1] + step[1], 1)])
        out = paged_attention_varlen(
            torch.cat([qs[i][pos[i]] for i in range(2)]), kc, vc, tables, qsl, seq_lens, 0.3
        )
        for i in range(2):
            outs[i].append(out[qsl[i] : qsl[i + 1]])
            done[i] += step[i]
    for i in range(2):
        want = dense_attention(qs[i], ks[i], vs[i], 0.3, causal=True)
        assert (torch.cat(outs[i]) - want).abs().max() < TOL
