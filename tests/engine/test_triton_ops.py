"""The fused Triton layer kernels against the torch layers they replace on a GPU.

Without a GPU they run in Triton's interpreter on CPU tensors (tests/conftest.py sets
``TRITON_INTERPRET``). In float32 they must agree with :mod:`mini_vllm.model.layers` to float
rounding; the model-level check is the GPU run of the parity tests (``dtype="float32"``).
"""

from __future__ import annotations

import os

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from mini_vllm.model import triton_ops  # noqa: E402
from mini_vllm.model.layers import (  # noqa: E402
    RMSNorm,
    RotaryEmbedding,
    SiluAndMul,
    default_inv_freq,
    llama3_inv_freq,
)

DEVICE = (
    "cuda" if torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1" else "cpu"
)


@pytest.mark.parametrize("hidden", [64, 576, 100])
@pytest.mark.parametrize("with_residual", [False, True])
def test_rms_norm_matches_the_torch_layer(hidden: int, with_residual: bool) -> None:
    torch.manual_seed(hidden)
    norm = RMSNorm(hidden, eps=1e-5)
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
    x = torch.randn(7, hidden) * 3
    residual = torch.randn(7, hidden) if with_residual else None
    weight = norm.weight.detach().to(DEVICE)
    if residual is None:
        want = norm(x)
        got = triton_ops.rms_norm(x.to(DEVICE), weight, 1e-5)
        torch.testing.assert_close(got.cpu(), want, atol=1e-5, rtol=1e-5)
    else:
        want, want_res = norm(x, residual)
        got, got_res = triton_ops.fused_add_rms_norm(
            x.to(DEVICE), residual.to(DEVICE), weight, 1e-5
        )
        torch.testing.assert_close(got.cpu(), want, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(got_res.cpu(), want_res, atol=0, rtol=0)


def test_rms_norm_rows_are_independent_and_half_precision_is_close() -> None:
    x = torch.randn(5, 96, dtype=torch.float32)
    x[2] *= 1000  # one huge row must not change the others
    weight = torch.ones(96)
    got = triton_ops.rms_norm(x.to(DEVICE), weight.to(DEVICE), 1e-6).cpu()
    torch.testing.assert_close(got, RMSNorm(96, 1e-6)(x), atol=1e-5, rtol=1e-5)
    xb = x.to(torch.bfloat16)
    got_b = triton_ops.rms_norm(xb.to(DEVICE), weight.to(DEVICE, torch.bfloat16), 1e-6).cpu()
    assert got_b.dtype == torch.bfloat16
    torch.testing.assert_close(got_b.float(), got, atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize(
    ("num_heads", "num_kv_heads", "head_dim"), [(4, 2, 16), (9, 3, 64), (6, 6, 24)]
)
def test_rotary_matches_the_torch_layer_in_place_on_qkv_views(
    num_heads: int, num_kv_heads: int, head_dim: int
) -> None:
    torch.manual_seed(head_dim)
    inv_freq = default_inv_freq(head_dim, 10000.0)
    if head_dim == 64:  # a scaled spectrum too
        inv_freq = llama3_inv_freq(
            inv_freq, {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                       "original_max_position_embeddings": 32},
        )  # fmt: skip
    rope = RotaryEmbedding(head_dim, inv_freq, attention_scaling=1.0 if head_dim != 24 else 0.9)
    tokens = 11
    q_size, kv_size = num_heads * head_dim, num_kv_heads * head_dim
    qkv = torch.randn(tokens, q_size + 2 * kv_size)
    positions = torch.tensor([0, 1, 2, 5, 17, 100, 1000, 4095, 3, 3, 70000])
    q = qkv[:, :q_size].view(tokens, num_heads, head_dim)
    k = qkv[:, q_size : q_size + kv_size].view(tokens, num_kv_heads, head_dim)
    want_q, want_k = rope(positions, q, k)  # CPU: new tensors

    qkv_dev = qkv.to(DEVICE)
    v_before = qkv_dev[:, q_size + kv_size :].clone()
    q_dev = qkv_dev[:, :q_size].view(tokens, num_heads, head_dim)
    k_dev = qkv_dev[:, q_size : q_size + kv_size].view(tokens, num_kv_heads, head_dim)
    got_q, got_k = triton_ops.rotary_embedding(
        positions.to(DEVICE), q_dev, k_dev, rope.inv_freq.to(DEVICE), rope.attention_scaling
    )
    assert got_q.data_ptr() == q_dev.data_ptr()  # in place, on the views
    # Large positions: angles of thousands of radians, where cos/sin implementations differ
    # by a few ulps of the angle.
    torch.testing.assert_close(got_q.cpu(), want_q, atol=2e-4, rtol=1e-4)
    torch.testing.assert_close(got_k.cpu(), want_k, atol=2e-4, rtol=1e-4)
    assert torch.equal(qkv_dev[:, q_size + kv_size :], v_before)  # v untouched


@pytest.mark.parametrize("d", [16, 1536, 100])
def test_silu_and_mul_matches_the_torch_layer(d: int) -> None:
    torch.manual_seed(d)
    x = torch.randn(6, 2 * d) * 4
    got = triton_ops.silu_and_mul(x.to(DEVICE)).cpu()
    torch.testing.assert_close(got, SiluAndMul()(x), atol=1e-6, rtol=1e-5)


def test_validation_errors() -> None:
    with pytest.raises(ValueError, match="2 \\* d"):
        triton_ops.silu_and_mul(torch.randn(3, 5))
    with pytest.raises(ValueError, match="residual"):
        triton_ops.fused_add_rms_norm(torch.randn(3, 8), torch.randn(3, 4), torch.ones(8), 1e-5)
    with pytest.raises(ValueError, match="inv_freq"):
        q = torch.randn(2, 2, 8)
        triton_ops.rotary_embedding(torch.arange(2), q, q.clone(), torch.ones(3))
