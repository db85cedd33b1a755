"""Tests of mini_vllm.attention.triton_varlen_attention against the torch reference.

The reference (``torch_paged_attention.paged_attention_varlen``) loops over sequences in float64;
the kernel must agree on every mix a scheduler step can hold: fresh prompts, chunks continuing
after cached context (prefix hits, chunked prefill), decodes, empty sequences, padding rows, any
GQA group (3 is not a power of two), any power-of-two block size and tile shape. Runs in Triton's
interpreter without a GPU, compiled on one.
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

import mini_vllm.attention.triton_varlen_attention as tva  # noqa: E402
from mini_vllm.attention import torch_paged_attention as ref  # noqa: E402

INTERPRET = os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")
if INTERPRET and type(tva._paged_varlen_kernel).__name__ != "InterpretedFunction":
    tva = importlib.reload(tva)
DEVICE = "cpu" if INTERPRET else "cuda"

pytestmark = pytest.mark.timeout(120)

TOL = {torch.float32: 2e-5, torch.float16: 4e-3, torch.bfloat16: 2e-2}


def make_case(
    seed: int,
    query_lens: list[int],
    context_lens: list[int],
    block_size: int,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int = 32,
    pad_rows: int = 0,
) -> dict:
    """Random cache and tables (a random block permutation, -1 past each sequence's blocks)."""
    rng = np.random.default_rng(seed)
    seq_lens = [q + c for q, c in zip(query_lens, context_lens)]
    used = [-(-n // block_size) for n in seq_lens]
    num_blocks = sum(used) + 2
    kc = rng.standard_normal((num_blocks, block_size, num_kv_heads, head_dim))
    vc = rng.standard_normal(kc.shape)
    perm = rng.permutation(num_blocks)
    tables = np.full((len(seq_lens), max(used) + 1), -1, dtype=np.int32)
    start = 0
    for i, u in enumerate(used):
        tables[i, :u] = perm[start : start + u]
        start += u
    num_tokens = sum(query_lens) + pad_rows
    return {
        "q": rng.standard_normal((num_tokens, num_heads, head_dim)),
        "kc": kc,
        "vc": vc,
        "tables": tables,
        "qsl": np.concatenate(([0], np.cumsum(query_lens))).astype(np.int32),
        "lens": np.array(seq_lens, np.int32),
    }


def run(case: dict, dtype: torch.dtype = torch.float32, scale: float = 0.25, **kw) -> None:
    def dev(x: np.ndarray, dt: torch.dtype | None = None) -> torch.Tensor:
        tensor = torch.from_numpy(np.ascontiguousarray(x))
        return tensor.to(device=DEVICE, dtype=dt) if dt else tensor.to(DEVICE)

    q, kc, vc = dev(case["q"], dtype), dev(case["kc"], dtype), dev(case["vc"], dtype)
    got = tva.paged_attention_varlen(
        q, kc, vc, dev(case["tables"]), dev(case["qsl"]), dev(case["lens"]), scale, **kw
    )
    assert got.dtype == dtype and got.shape == q.shape
    # The reference on the same rounded values, in float64; it rejects -1 table entries past
    # the used blocks no more than the kernel reads them.
    want = ref.paged_attention_varlen(
        q.double().cpu(), kc.double().cpu(), vc.double().cpu(),
        torch.from_numpy(case["tables"]).clamp(min=0), torch.from_numpy(case["qsl"]),
        torch.from_numpy(case["lens"]), scale,
    )  # fmt: skip
    np.testing.assert_allclose(got.double().cpu().numpy(), want.numpy(), atol=TOL[dtype], rtol=0)


@pytest.mark.parametrize("block_size", [1, 4, 16, 32, 64])
def test_mixed_step_block_sizes(block_size: int) -> None:
    # A fresh prompt, a chunk after cached context, two decodes, a prompt longer than a q tile.
    run(make_case(block_size, [7, 5, 1, 1, 40], [0, 19, 33, 0, 3], block_size, 4, 2))


@pytest.mark.parametrize(("num_heads", "num_kv_heads"), [(4, 4), (6, 2), (8, 1), (9, 3)])
def test_gqa_groups_including_non_power_of_two(num_heads: int, num_kv_heads: int) -> None:
    run(make_case(1, [23, 1, 9], [0, 50, 12], 16, num_heads, num_kv_heads))


@pytest.mark.parametrize(("block_m", "block_n"), [(16, 16), (32, 64), (128, 16)])
def test_tile_shapes(block_m: int, block_n: int) -> None:
    # Query tiles that cut prompts mid-way and key tiles larger or smaller than a block.
    run(make_case(2, [37, 2, 17], [5, 60, 0], 16, 8, 2), block_m=block_m, block_n=block_n)


def test_empty_sequences_and_padding_rows_stay_zero() -> None:
    case = make_case(3, [4, 0, 3, 0], [2, 7, 0, 5], 8, 4, 2, pad_rows=5)
    run(case)
    q = torch.from_numpy(case["q"]).to(DEVICE, torch.float32)
    out = tva.paged_attention_varlen(
        q, *(torch.from_numpy(case[k]).to(DEVICE, torch.float32) for k in ("kc", "vc")),
        torch.from_numpy(case["tables"]).to(DEVICE), torch.from_numpy(case["qsl"]).to(DEVICE),
        torch.from_numpy(case["lens"]).to(DEVICE), 0.25,
    )  # fmt: skip
    assert torch.count_nonzero(out[7:]) == 0


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision(dtype: torch.dtype) -> None:
    run(make_case(4, [30, 1, 6], [10, 70, 40], 16, 8, 2, head_dim=64), dtype=dtype)


def test_head_dim_not_power_of_two_and_large_scores() -> None:
    case = make_case(5, [11, 3], [4, 20], 8, 6, 3, head_dim=24)
    case["q"] *= 30.0  # scores in the hundreds: the online softmax must rescale, not overflow
    run(case)


@pytest.mark.parametrize("seed", range(6))
def test_random_steps(seed: int) -> None:
    rng = np.random.default_rng(100 + seed)
    n = int(rng.integers(1, 7))
    query_lens = [int(x) for x in rng.choice([0, 1, 1, 2, 5, 17, 33], size=n)]
    context_lens = [int(x) for x in rng.integers(0, 40, size=n)]
    if sum(query_lens) == 0:
        query_lens[0] = 1
    kv = int(rng.choice([1, 2, 3]))
    run(
        make_case(
            seed,
            query_lens,
            context_lens,
            int(rng.choice([2, 8, 16])),
            kv * int(rng.choice([1, 2, 3])),
            kv,
            head_dim=int(rng.choice([16, 32, 40])),
        ),
    )


def test_validation_errors() -> None:
    case = make_case(6, [3], [0], 8, 4, 2)
    q = torch.from_numpy(case["q"]).float()
    kc, vc = torch.from_numpy(case["kc"]).float(), torch.from_numpy(case["vc"]).float()
    tables, qsl, lens = (torch.from_numpy(case[k]) for k in ("tables", "qsl", "lens"))
    with pytest.raises(ValueError, match="query_start_loc"):
        tva.paged_attention_varlen(q, kc, vc, tables, qsl[:1], lens, 0.1)
    with pytest.raises(ValueError, match="block_tables"):
        tva.paged_attention_varlen(q, kc, vc, tables[:0], qsl, lens, 0.1)
    with pytest.raises(ValueError, match="head_dim"):
        tva.paged_attention_varlen(q[..., :16], kc, vc, tables, qsl, lens, 0.1)
    with pytest.raises(ValueError, match="multiple"):
        tva.paged_attention_varlen(q[:, :3], kc, vc, tables, qsl, lens, 0.1)
    with pytest.raises(ValueError, match="block_m"):
        tva.paged_attention_varlen(q, kc, vc, tables, qsl, lens, 0.1, block_m=24)
