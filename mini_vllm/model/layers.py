"""The small layers every Llama-family decoder is built from: RMSNorm, rotary embeddings, SwiGLU.

Each mirrors the upstream layer of the same name (``vllm/model_executor/layers/layernorm.py``,
``rotary_embedding/``, ``activation.py``) in behaviour, written for one device and no kernels,
following Hugging Face's Llama step by step (same dtype casts, same order) so that the logits
match to 1e-4 in float32. On a GPU each layer hands CUDA tensors to one fused Triton kernel
instead (:mod:`mini_vllm.model.triton_ops`), because there the launches, not the arithmetic, are
the cost (docs/upstream-fidelity.md, module notes).
"""

from __future__ import annotations

import functools
import math
from types import ModuleType
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn


@functools.cache
def _load_triton_ops() -> ModuleType | None:
    try:
        from mini_vllm.model import triton_ops
    except Exception:  # no triton (CPU-only installs), or a kernel module that fails to import
        return None
    return triton_ops


def gpu_ops(x: torch.Tensor) -> ModuleType | None:
    """The fused kernels for a CUDA tensor; None (use torch) on CPU or without Triton."""
    return _load_triton_ops() if x.is_cuda else None


class RMSNorm(nn.Module):
    """Root-mean-square layer norm, with the residual add fused in as upstream does.

    Passing ``residual`` makes the call compute ``x + residual`` first and hand that sum back as the
    new residual: each decoder layer then needs one call per norm instead of a separate add, which
    is the calling convention of vLLM's decoder layers. The normalisation runs in float32 whatever
    the model dtype, because the mean of squares overflows or loses precision in half precision.
    """

    def __init__(self, hidden_size: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.variance_epsilon = eps

    def _norm(self, x: torch.Tensor) -> torch.Tensor:
        orig_dtype = x.dtype
        x32 = x.to(torch.float32)
        variance = x32.pow(2).mean(-1, keepdim=True)
        x32 = x32 * torch.rsqrt(variance + self.variance_epsilon)
        return self.weight * x32.to(orig_dtype)

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        ops = gpu_ops(x)
        if ops is not None and x.dim() == 2:
            if residual is None:
                return ops.rms_norm(x, self.weight, self.variance_epsilon)
            return ops.fused_add_rms_norm(x, residual, self.weight, self.variance_epsilon)
        if residual is None:
            return self._norm(x)
        x = x + residual
        return self._norm(x), x


class SiluAndMul(nn.Module):
    """SwiGLU's gate: ``silu(gate) * up`` on the two halves of one fused projection.

    The gate and up projections are stored as one ``gate_up_proj`` matrix (upstream's
    ``MergedColumnParallelLinear``) so that the MLP costs one matmul instead of two; this layer
    splits the result back in half.
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ops = gpu_ops(x)
        if ops is not None and x.dim() == 2:
            return ops.silu_and_mul(x)
        gate, up = x.chunk(2, dim=-1)
        return F.silu(gate) * up


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class RotaryEmbedding(nn.Module):
    """Rotary position embedding (GPT-NeoX layout: the two halves of each head are the pairs).

    Cos and sin are computed from ``positions`` on every call rather than read from a cache sized
    by ``max_position_embeddings``: positions then never go out of range whatever ``max_model_len``
    is, the cost (one ``[num_tokens, head_dim/2]`` outer product) is negligible next to the
    projections, and the computation has no host synchronisation, so it can live inside a CUDA
    graph. ``inv_freq`` is precomputed once and already carries any context-extension scaling.
    """

    inv_freq: torch.Tensor  # a (non-persistent) buffer, registered in __init__

    def __init__(self, head_dim: int, inv_freq: torch.Tensor, attention_scaling: float = 1.0):
        super().__init__()
        self.head_dim = head_dim
        self.attention_scaling = attention_scaling
        self.register_buffer("inv_freq", inv_freq.to(torch.float32), persistent=False)

    def cos_sin(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = positions.to(torch.float32)[:, None] * self.inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos() * self.attention_scaling, emb.sin() * self.attention_scaling

    def forward(
        self, positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Rotate ``query`` ``[T, num_heads, head_dim]`` and ``key`` ``[T, num_kv_heads, ...]``.

        On CUDA the rotation happens in place (one kernel; the inputs may be views of the QKV
        projection); on CPU new tensors are returned.
        """
        ops = gpu_ops(query)
        if ops is not None:
            return ops.rotary_embedding(
                positions, query, key, self.inv_freq, self.attention_scaling
            )
        cos, sin = self.cos_sin(positions)
        cos = cos[:, None, :].to(query.dtype)
        sin = sin[:, None, :].to(query.dtype)
        query = query * cos + _rotate_half(query) * sin
        key = key * cos + _rotate_half(key) * sin
        return query, key


def default_inv_freq(head_dim: int, rope_theta: float) -> torch.Tensor:
    """``1 / theta^(2i/d)``, computed with the same dtype steps as Hugging Face (bit-equal)."""
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).to(torch.float32) / head_dim
    return 1.0 / (rope_theta**exponents)


def llama3_inv_freq(inv_freq: torch.Tensor, scaling: dict[str, Any]) -> torch.Tensor:
    """Llama 3.1's frequency-dependent context extension.

    Frequencies whose wavelength is short next to the original context keep their value (they
    encode local order, which long contexts do not change); those with a wavelength longer than
    the original context are divided by ``factor`` (stretched like linear scaling); the band in
    between is interpolated smoothly between the two so the spectrum has no step.
    """
    factor = float(scaling["factor"])
    low_freq_factor = float(scaling.get("low_freq_factor", 1.0))
    high_freq_factor = float(scaling.get("high_freq_factor", 4.0))
    old_context_len = float(scaling["original_max_position_embeddings"])

    low_freq_wavelen = old_context_len / low_freq_factor
    high_freq_wavelen = old_context_len / high_freq_factor
    wavelen = 2 * math.pi / inv_freq

    stretched = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    blended = (1 - smooth) * stretched / factor + smooth * stretched
    in_band = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen)
    return torch.where(in_band, blended, stretched)


def rope_parameters(hf_config: Any) -> tuple[float, dict[str, Any] | None]:
    """Read ``(rope_theta, scaling)`` from a config written by any transformers version.

    transformers >= 5 folds both into ``config.rope_parameters``; older configs carry
    ``rope_theta`` and ``rope_scaling`` as separate attributes. ``scaling`` is None for plain RoPE.
    """
    params = getattr(hf_config, "rope_parameters", None)
    if isinstance(params, dict) and "rope_theta" in params:
        theta = float(params["rope_theta"])
        scaling: dict[str, Any] | None = dict(params)
    else:
        theta = float(getattr(hf_config, "rope_theta", 10000.0))
        scaling = getattr(hf_config, "rope_scaling", None)
        scaling = dict(scaling) if scaling else None
    if scaling is not None:
        rope_type = scaling.get("rope_type", scaling.get("type", "default"))
        if rope_type == "default":
            scaling = None
        else:
            scaling["rope_type"] = rope_type
    return theta, scaling


def get_rope(head_dim: int, hf_config: Any) -> RotaryEmbedding:
    """Build the rotary embedding a checkpoint asks for: plain, ``linear`` or ``llama3``.

    Other schemes (yarn, dynamic NTK, longrope) change more than ``inv_freq`` and are refused
    loudly rather than silently decoded with the wrong positions.
    """
    theta, scaling = rope_parameters(hf_config)
    if getattr(hf_config, "partial_rotary_factor", 1.0) != 1.0:
        raise ValueError("partial rotary embeddings are not supported by mini-vLLM's Llama")
    inv_freq = default_inv_freq(head_dim, theta)
    if scaling is not None:
        rope_type = scaling["rope_type"]
        if rope_type == "llama3":
            inv_freq = llama3_inv_freq(inv_freq, scaling)
        elif rope_type == "linear":
            inv_freq = inv_freq / float(scaling["factor"])
        else:
            raise ValueError(
                f"rope scaling {rope_type!r} is not supported (supported: default, linear, llama3)"
            )
    return RotaryEmbedding(head_dim, inv_freq)
