"""Fused GPU kernels for the small layers: RMSNorm (with the residual add), rotary, SiLU-and-mul.

Upstream replaces the torch layers with custom ops of the same names (``vllm/_custom_ops.py``:
``rms_norm``, ``fused_add_rms_norm``, ``rotary_embedding``, ``silu_and_mul``); these are Triton
versions, one launch each instead of up to eighteen, reproducing the rounding of the torch
layers of :mod:`mini_vllm.model.layers` where it is cheap to. The layers call them only for CUDA
tensors; under ``TRITON_INTERPRET=1`` they also run on CPU tensors, which is how the tests
compare them with the torch layers. The launch counts and the rounding:
docs/upstream-fidelity.md (module notes).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

__all__ = ["fused_add_rms_norm", "rms_norm", "rotary_embedding", "silu_and_mul"]


@triton.jit
def _rms_norm_kernel(
    x_ptr,
    residual_ptr,
    weight_ptr,
    out_ptr,
    residual_out_ptr,
    eps,
    stride_x,
    stride_r,
    stride_o,
    stride_ro,
    hidden_size,
    HAS_RESIDUAL: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """Program ``row``: ``out = weight * norm(x [+ residual])``; the sum is also stored."""
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < hidden_size
    x = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0)
    if HAS_RESIDUAL:
        r = tl.load(residual_ptr + row * stride_r + offs, mask=mask, other=0.0)
        x = (x.to(tl.float32) + r.to(tl.float32)).to(x_ptr.dtype.element_ty)
        tl.store(residual_out_ptr + row * stride_ro + offs, x, mask=mask)
    x32 = x.to(tl.float32)
    variance = tl.sum(x32 * x32, 0) / hidden_size
    normed = (x32 * tl.rsqrt(variance + eps)).to(x_ptr.dtype.element_ty)
    w = tl.load(weight_ptr + offs, mask=mask, other=0.0)
    y = w.to(tl.float32) * normed.to(tl.float32)
    tl.store(out_ptr + row * stride_o + offs, y.to(out_ptr.dtype.element_ty), mask=mask)


def _launch_rms_norm(
    x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor | None]:
    if x.dim() != 2 or x.stride(-1) != 1:
        raise ValueError(f"x must be [num_tokens, hidden] with contiguous rows, got {x.shape}")
    if residual is not None and (residual.shape != x.shape or residual.stride(-1) != 1):
        raise ValueError(f"residual must match x {tuple(x.shape)}, got {tuple(residual.shape)}")
    num_tokens, hidden = x.shape
    # The output takes the dtype torch's ``weight * x`` would have: the wider of the two.
    out = torch.empty(x.shape, dtype=torch.promote_types(x.dtype, weight.dtype), device=x.device)
    residual_out = torch.empty_like(x) if residual is not None else None
    if num_tokens:
        block = triton.next_power_of_2(hidden)
        _rms_norm_kernel[(num_tokens,)](
            x, residual if residual is not None else x, weight, out,
            residual_out if residual_out is not None else out,
            eps, x.stride(0),
            residual.stride(0) if residual is not None else 0,
            out.stride(0),
            residual_out.stride(0) if residual_out is not None else 0,
            hidden,
            HAS_RESIDUAL=residual is not None, BLOCK=block,
            num_warps=8 if block >= 2048 else 4,
        )  # fmt: skip
    return out, residual_out


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``weight * x / sqrt(mean(x^2) + eps)`` per row, the statistics in float32."""
    out, _ = _launch_rms_norm(x, None, weight, eps)
    return out


def fused_add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(rms_norm(x + residual), x + residual)`` in one pass, as :class:`RMSNorm` returns them."""
    out, residual_out = _launch_rms_norm(x, residual, weight, eps)
    assert residual_out is not None
    return out, residual_out


@triton.jit
def _rotate(
    x_ptr, stride_tok, stride_head, token, cos, sin, num_heads,
    HEADS_PAD: tl.constexpr, HALF: tl.constexpr, HALF_PAD: tl.constexpr,
):  # fmt: skip
    """Rotate every head of one token in place: the pairs are (i, i + HALF) (GPT-NeoX layout)."""
    offs_h = tl.arange(0, HEADS_PAD)
    offs_j = tl.arange(0, HALF_PAD)
    mask = (offs_h[:, None] < num_heads) & (offs_j[None, :] < HALF)
    first = x_ptr + token * stride_tok + offs_h[:, None] * stride_head + offs_j[None, :]
    x1 = tl.load(first, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(first + HALF, mask=mask, other=0.0).to(tl.float32)
    out1 = x1 * cos[None, :] - x2 * sin[None, :]
    out2 = x2 * cos[None, :] + x1 * sin[None, :]
    tl.store(first, out1.to(x_ptr.dtype.element_ty), mask=mask)
    tl.store(first + HALF, out2.to(x_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _rotary_kernel(
    positions_ptr,
    inv_freq_ptr,
    q_ptr,
    k_ptr,
    attention_scaling,
    stride_q_tok,
    stride_q_head,
    stride_k_tok,
    stride_k_head,
    num_q_heads,
    num_k_heads,
    Q_HEADS_PAD: tl.constexpr,
    K_HEADS_PAD: tl.constexpr,
    HALF: tl.constexpr,
    HALF_PAD: tl.constexpr,
):
    """Program ``token``: cos/sin of its position, then every query and key head rotated."""
    token = tl.program_id(0).to(tl.int64)
    position = tl.load(positions_ptr + token).to(tl.float32)
    offs_j = tl.arange(0, HALF_PAD)
    inv_freq = tl.load(inv_freq_ptr + offs_j, mask=offs_j < HALF, other=0.0)
    angle = position * inv_freq
    cos = tl.cos(angle) * attention_scaling
    sin = tl.sin(angle) * attention_scaling
    _rotate(q_ptr, stride_q_tok, stride_q_head, token, cos, sin, num_q_heads,
            Q_HEADS_PAD, HALF, HALF_PAD)  # fmt: skip
    _rotate(k_ptr, stride_k_tok, stride_k_head, token, cos, sin, num_k_heads,
            K_HEADS_PAD, HALF, HALF_PAD)  # fmt: skip


def rotary_embedding(
    positions: torch.Tensor,
    query: torch.Tensor,
    key: torch.Tensor,
    inv_freq: torch.Tensor,
    attention_scaling: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate ``query`` ``[T, num_heads, head_dim]`` and ``key`` ``[T, num_kv_heads, head_dim]``
    in place (they may be strided views of one QKV projection) and return them.

    The angle of pair ``j`` at position ``p`` is ``p * inv_freq[j]``, computed in float32 inside
    the kernel as :class:`~mini_vllm.model.layers.RotaryEmbedding` computes it, so no cos/sin
    cache bounds the positions.
    """
    if query.dim() != 3 or key.dim() != 3 or query.shape[2] != key.shape[2]:
        raise ValueError(
            f"query and key must be [T, heads, head_dim], got {query.shape} and {key.shape}"
        )
    num_tokens, num_q_heads, head_dim = query.shape
    if head_dim % 2 or inv_freq.shape != (head_dim // 2,):
        raise ValueError(
            f"inv_freq must be [head_dim / 2] = [{head_dim // 2}], got {inv_freq.shape}"
        )
    if query.stride(-1) != 1 or key.stride(-1) != 1 or key.shape[0] != num_tokens:
        raise ValueError("query and key need contiguous head_dim and the same number of tokens")
    if num_tokens:
        half = head_dim // 2
        _rotary_kernel[(num_tokens,)](
            positions, inv_freq, query, key, float(attention_scaling),
            query.stride(0), query.stride(1), key.stride(0), key.stride(1),
            num_q_heads, key.shape[1],
            Q_HEADS_PAD=triton.next_power_of_2(num_q_heads),
            K_HEADS_PAD=triton.next_power_of_2(key.shape[1]),
            HALF=half, HALF_PAD=triton.next_power_of_2(half),
            num_warps=4,
        )  # fmt: skip
    return query, key


@triton.jit
def _silu_and_mul_kernel(x_ptr, out_ptr, stride_x, stride_o, d, BLOCK: tl.constexpr):
    """Program ``(row, tile)``: ``silu(x[:d]) * x[d:]``, rounded where torch rounds."""
    row = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < d
    gate = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + row * stride_x + d + offs, mask=mask, other=0.0).to(tl.float32)
    silu = (gate * tl.sigmoid(gate)).to(out_ptr.dtype.element_ty).to(tl.float32)
    tl.store(out_ptr + row * stride_o + offs, (silu * up).to(out_ptr.dtype.element_ty), mask=mask)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up`` for ``x = [gate | up]`` of shape ``[T, 2 * d]``; returns ``[T, d]``."""
    if x.dim() != 2 or x.shape[1] % 2 or x.stride(-1) != 1:
        raise ValueError(f"x must be [num_tokens, 2 * d] with contiguous rows, got {x.shape}")
    num_tokens, width = x.shape
    d = width // 2
    out = torch.empty((num_tokens, d), dtype=x.dtype, device=x.device)
    if num_tokens:
        block = min(triton.next_power_of_2(d), 1024)
        grid = (num_tokens, triton.cdiv(d, block))
        _silu_and_mul_kernel[grid](x, out, x.stride(0), out.stride(0), d, BLOCK=block, num_warps=4)
    return out
