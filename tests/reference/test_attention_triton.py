"""Tests of mini_vllm.attention.triton_paged_attention (the lab-04 kernels) against the numpy
reference.

Without a GPU the kernels run in Triton's interpreter (``TRITON_INTERPRET=1``, set below before
Triton is imported) on CPU tensors; with one they are compiled and run on it. Shapes are small so
that the interpreter runs this whole file in well under a minute on two cores; the bandwidth the
design is for is measured by ``bench/bench_paged_decode.py``, never here.
"""

from __future__ import annotations

import importlib
import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton")

import mini_vllm.attention.triton_paged_attention as tpa  # noqa: E402
from mini_vllm.teaching import paged_attention_numpy as ref  # noqa: E402

INTERPRET = os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")
if INTERPRET and type(tpa._paged_decode_kernel).__name__ != "InterpretedFunction":
    # Imported earlier in this process before the variable was set: decorate the kernels again.
    tpa = importlib.reload(tpa)
DEVICE = "cpu" if INTERPRET else "cuda"

pytestmark = pytest.mark.timeout(60)

TOL = {torch.float32: 2e-5, torch.float16: 4e-3, torch.bfloat16: 2e-2}


def make_case(
    seed: int,
    seq_lens: list[int],
    block_size: int,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int = 32,
    pad_value: int = -1,
) -> dict:
    """A garbage-filled float64 paged cache plus per-sequence tables (random block permutation)."""
    rng = np.random.default_rng(seed)
    used = [-(-n // block_size) for n in seq_lens]
    num_blocks = sum(used) + 2
    kc = rng.standard_normal((num_blocks, block_size, num_kv_heads, head_dim))
    vc = rng.standard_normal(kc.shape)
    perm = rng.permutation(num_blocks)
    tables = np.full((len(seq_lens), max(used) + 1), pad_value, dtype=np.int32)
    start = 0
    for i, u in enumerate(used):
        tables[i, :u] = perm[start : start + u]
        start += u
    q = rng.standard_normal((len(seq_lens), num_heads, head_dim))
    return {"q": q, "kc": kc, "vc": vc, "tables": tables, "lens": np.array(seq_lens, np.int32)}


def run_decode(case: dict, dtype: torch.dtype = torch.float32, scale: float = 0.2, **kw):
    """Our kernel on ``dtype`` copies, and the float64 reference on the same rounded values."""

    def dev(x: np.ndarray, dt: torch.dtype | None = None) -> torch.Tensor:
        tensor = torch.from_numpy(np.ascontiguousarray(x))
        return tensor.to(device=DEVICE, dtype=dt) if dt else tensor.to(DEVICE)

    q, kc, vc = dev(case["q"], dtype), dev(case["kc"], dtype), dev(case["vc"], dtype)
    got = tpa.paged_attention_decode(q, kc, vc, dev(case["tables"]), dev(case["lens"]), scale, **kw)
    assert got.dtype == dtype and got.shape == q.shape
    want = ref.paged_attention_decode(
        q.double().cpu().numpy(), kc.double().cpu().numpy(), vc.double().cpu().numpy(),
        case["tables"], case["lens"], scale,
    )  # fmt: skip
    return got.double().cpu().numpy(), want


@pytest.mark.parametrize("block_size", [1, 2, 4, 8, 16, 32, 128])
def test_decode_block_sizes(block_size: int) -> None:
    # lengths: 1, exactly one block, not a multiple of the block size, several tiles
    lens = [1, block_size, block_size * 2 + 3, 70]
    got, want = run_decode(make_case(block_size, lens, block_size, 8, 2))
    assert np.abs(got - want).max() < TOL[torch.float32]


@pytest.mark.parametrize(("num_heads", "num_kv_heads"), [(4, 4), (6, 2), (16, 2), (32, 8), (32, 1)])
def test_decode_gqa_groups(num_heads: int, num_kv_heads: int) -> None:
    """Group sizes 1, 3 (not a power of two), 8, 4 and 32 (more rows than the 16-row pad)."""
    got, want = run_decode(make_case(num_heads, [5, 40, 17], 8, num_heads, num_kv_heads))
    assert np.abs(got - want).max() < TOL[torch.float32]


@pytest.mark.parametrize("num_splits", [1, 2, 3, 7, 40])
def test_decode_split_k(num_splits: int) -> None:
    """Any split count is exact, including more splits than tiles (empty splits merged away)."""
    case = make_case(11, [1, 19, 130, 64], 4, 4, 2)
    got, want = run_decode(case, num_splits=num_splits, block_n=16)
    assert np.abs(got - want).max() < TOL[torch.float32]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("num_splits", [1, 4])
def test_decode_half_precision(dtype: torch.dtype, num_splits: int) -> None:
    got, want = run_decode(make_case(3, [33, 100], 16, 8, 2), dtype, num_splits=num_splits)
    assert np.abs(got - want).max() < TOL[dtype]


def test_decode_head_dim_not_power_of_two_and_garbage_padding() -> None:
    case = make_case(5, [9, 26, 3], 4, 6, 3, head_dim=24, pad_value=2**30)
    got, want = run_decode(case, num_splits=2)
    assert np.abs(got - want).max() < TOL[torch.float32]


def test_decode_int64_tables_strided_query_and_out_buffer() -> None:
    case = make_case(6, [12, 31], 8, 4, 2)
    wide = np.concatenate([case["q"], np.zeros_like(case["q"])], axis=1)  # [2, 8, 32]
    q = torch.from_numpy(wide).float().to(DEVICE)[:, ::2]  # non-contiguous heads
    kc = torch.from_numpy(case["kc"]).float().to(DEVICE)
    vc = torch.from_numpy(case["vc"]).float().to(DEVICE)
    out = torch.full((2, 4, 32), float("nan"), device=DEVICE)
    tables = torch.from_numpy(case["tables"]).long().to(DEVICE)
    lens = torch.from_numpy(case["lens"]).long().to(DEVICE)
    res = tpa.paged_attention_decode(q, kc, vc, tables, lens, 0.2, out=out, max_seq_len=31)
    assert res is out
    want = ref.paged_attention_decode(
        q.double().cpu().numpy(), case["kc"], case["vc"], case["tables"], case["lens"], 0.2
    )
    assert np.abs(out.double().cpu().numpy() - want).max() < TOL[torch.float32]


def test_decode_large_scores_are_stable() -> None:
    case = make_case(7, [40, 9], 8, 4, 2)
    case["q"] *= 30.0  # scores in the hundreds: exp would overflow without max subtraction
    got, want = run_decode(case, num_splits=3)
    assert np.isfinite(got).all()
    assert np.abs(got - want).max() < 1e-4


@pytest.mark.parametrize("seed", range(10))
def test_decode_random_configs(seed: int) -> None:
    """Random block size, group, KV heads, lengths and split count (seeded, so reproducible;
    plain numpy rather than hypothesis so the file runs wherever torch and triton do)."""
    rng = np.random.default_rng(1000 + seed)
    block_size = int(rng.choice([1, 2, 4, 8, 16]))
    group = int(rng.choice([1, 2, 4, 8]))
    num_kv_heads = int(rng.integers(1, 3))
    lens = rng.integers(1, 49, size=int(rng.integers(1, 4))).tolist()
    case = make_case(seed, lens, block_size, group * num_kv_heads, num_kv_heads, head_dim=16)
    got, want = run_decode(case, num_splits=int(rng.integers(1, 5)))
    assert np.abs(got - want).max() < TOL[torch.float32]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_reshape_and_cache_matches_reference(dtype: torch.dtype) -> None:
    rng = np.random.default_rng(8)
    kc = np.zeros((6, 4, 3, 16))
    k = rng.standard_normal((7, 3, 16))
    v = rng.standard_normal((7, 3, 16))
    slots = np.array([3, -1, 17, 0, 23, -9, 9])
    kc_t = torch.zeros(kc.shape, dtype=dtype, device=DEVICE)
    vc_t = torch.zeros_like(kc_t)
    tpa.reshape_and_cache(
        torch.from_numpy(k).to(DEVICE), torch.from_numpy(v).to(DEVICE), kc_t, vc_t,
        torch.from_numpy(slots).to(DEVICE),
    )  # fmt: skip
    vc = np.zeros_like(kc)
    k_r = torch.from_numpy(k).to(dtype).double().numpy()
    v_r = torch.from_numpy(v).to(dtype).double().numpy()
    ref.reshape_and_cache(k_r, v_r, kc, vc, slots)
    assert np.array_equal(kc_t.double().cpu().numpy(), kc)
    assert np.array_equal(vc_t.double().cpu().numpy(), vc)


def test_reshape_and_cache_strided_inputs_and_layer_slice() -> None:
    """Keys sliced out of a fused QKV projection, written into one layer of a stacked cache."""
    qkv = torch.randn(5, 4 + 2 + 2, 16, device=DEVICE)
    key, value = qkv[:, 4:6], qkv[:, 6:8]
    stacked = torch.zeros(2, 2, 3, 4, 2, 16, device=DEVICE)  # [layer, k/v, blocks, bs, h, d]
    layer = stacked[1]
    slots = torch.tensor([0, 5, -1, 11, 6], device=DEVICE)
    tpa.reshape_and_cache(key, value, layer[0], layer[1], slots)
    flat_k = stacked[1, 0].reshape(12, 2, 16)
    flat_v = stacked[1, 1].reshape(12, 2, 16)
    for i, s in enumerate(slots.tolist()):
        if s >= 0:
            assert torch.equal(flat_k[s], key[i]) and torch.equal(flat_v[s], value[i])
    assert stacked[0].abs().sum() == 0, "another layer was touched"
    assert flat_k[[1, 2, 3, 4, 7, 8, 9, 10]].abs().sum() == 0, "a padding token was written"


def test_write_then_decode_round_trip() -> None:
    """Slot mapping, the Triton write and the Triton decode together equal dense attention."""
    torch.manual_seed(0)
    block_size, num_heads, num_kv_heads, dim, seq_len = 4, 8, 2, 32, 23
    k = torch.randn(seq_len, num_kv_heads, dim, dtype=torch.float64)
    v = torch.randn(seq_len, num_kv_heads, dim, dtype=torch.float64)
    q = torch.randn(1, num_heads, dim, dtype=torch.float64)
    table = torch.tensor([11, 2, 7, 0, 5, 9])
    kc = torch.randn(12, block_size, num_kv_heads, dim, device=DEVICE)
    vc = torch.randn_like(kc)
    slots = tpa.compute_slot_mapping(table, torch.arange(seq_len), block_size)
    tpa.reshape_and_cache(k.float().to(DEVICE), v.float().to(DEVICE), kc, vc, slots.to(DEVICE))
    out = tpa.paged_attention_decode(
        q.float().to(DEVICE), kc, vc, table[None].to(DEVICE),
        torch.tensor([seq_len], device=DEVICE), 0.2, num_splits=2,
    )  # fmt: skip
    want = ref.dense_attention(
        q.float().double().numpy(), k.float().double().numpy(), v.float().double().numpy(), 0.2
    )
    assert np.abs(out.double().cpu().numpy() - want).max() < TOL[torch.float32]


def test_default_num_splits() -> None:
    # few pairs, long context: split up to the SM target; many pairs: no split
    assert tpa.default_num_splits(1, 8, 16384, 132) > 1
    assert tpa.default_num_splits(128, 8, 16384, 132) == 1
    # never shorter than the minimum split length, never more than the cap
    floor = tpa._MIN_TOKENS_PER_SPLIT
    assert tpa.default_num_splits(1, 1, 300, 132) == -(-300 // floor)
    assert tpa.default_num_splits(1, 1, floor, 132) == 1
    assert 1 <= tpa.default_num_splits(1, 1, 10**7, 10**4) <= 64
    for pairs in (1, 8, 64, 256, 4096):
        assert tpa.default_num_splits(pairs, 1, 2048, 132) >= tpa.default_num_splits(
            pairs * 2, 1, 2048, 132
        )


def test_validation_errors() -> None:
    kc = torch.zeros(4, 4, 2, 16, device=DEVICE)
    q = torch.zeros(1, 4, 16, device=DEVICE)
    tables = torch.zeros(1, 2, dtype=torch.int32, device=DEVICE)
    lens = torch.ones(1, dtype=torch.int32, device=DEVICE)
    decode = tpa.paged_attention_decode
    with pytest.raises(ValueError, match="multiple"):
        decode(torch.zeros(1, 3, 16, device=DEVICE), kc, kc, tables, lens, 1.0)
    with pytest.raises(ValueError, match="head_dim"):
        decode(torch.zeros(1, 4, 8, device=DEVICE), kc, kc, tables, lens, 1.0)
    with pytest.raises(ValueError, match="power of two"):
        decode(q, torch.zeros(4, 3, 2, 16, device=DEVICE), torch.zeros(4, 3, 2, 16), tables,
               lens, 1.0)  # fmt: skip
    with pytest.raises(ValueError, match="block_tables"):
        decode(q, kc, kc, tables[0], lens, 1.0)
    with pytest.raises(ValueError, match="num_splits"):
        decode(q, kc, kc, tables, lens, 1.0, num_splits=0)
    with pytest.raises(ValueError, match="block_n"):
        decode(q, kc, kc, tables, lens, 1.0, block_n=8)
    with pytest.raises(ValueError, match="slot_mapping"):
        tpa.reshape_and_cache(
            torch.zeros(3, 2, 16, device=DEVICE), torch.zeros(3, 2, 16, device=DEVICE), kc, kc,
            torch.zeros(2, dtype=torch.long, device=DEVICE),
        )  # fmt: skip
