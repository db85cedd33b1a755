"""The attention layer that reads and writes the paged KV cache, and the metadata it needs.

Upstream splits this between ``vllm/model_executor/layers/attention/`` (the layer) and one
metadata class per backend (``FlashAttentionMetadata``); here one small dataclass serves both of
our backends, the torch reference and the Triton kernels. The model never learns what a block is:
the runner hands it a ``slot_mapping`` and the block tables, and the attention kernel does the
rest, which is the whole point of paged attention (docs/upstream-fidelity.md, module notes).
"""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType

import torch
import torch.nn.functional as F
from torch import nn

from mini_vllm.attention import torch_paged_attention


def _triton_backend() -> ModuleType:
    """The Triton kernels, imported on first use: CPU-only installs have no triton."""
    from mini_vllm.attention import triton_paged_attention

    return triton_paged_attention


def _triton_varlen() -> ModuleType:
    from mini_vllm.attention import triton_varlen_attention

    return triton_varlen_attention


def decode_launch_options(head_dim: int) -> dict[str, int]:
    """Tile options for the decode kernel in the engine, by head size.

    lab-04's defaults (32-token tiles, 4 warps) were tuned on 128-wide heads. With 64-wide heads
    (SmolLM2, Llama-3.2-1B) a 32-token tile is only 4 KiB of K, too little per loop iteration
    to keep enough loads in flight: at the engine benchmark's batch-256 state on an H100,
    64-token tiles with 2 warps ran 14 % faster for SmolLM2's 9/3 heads and 6 % for
    Llama-3.2-1B's 32/8 (``bench/sweep_decode_tiles.py``, docs/perf/decode_tiles_h100.md),
    with the two pipeline stages that sweep used (the launcher's one-split default is three).
    """
    if head_dim <= 64:
        return {"block_n": 64, "num_warps": 2, "num_stages": 2}
    return {}


@dataclass
class AttentionMetadata:
    """Everything attention needs to know about one flattened batch, shared by every layer.

    Lengths follow upstream's vocabulary: ``seq_len`` = ``context_len`` (tokens already in the
    cache) + ``query_len`` (tokens in this step). The batch is one flat token axis; request ``i``
    owns tokens ``query_start_loc[i]:query_start_loc[i+1]``.
    """

    slot_mapping: torch.Tensor  # [num_tokens] int64: cache slot of each new token, -1 = padding
    block_tables: torch.Tensor  # [num_seqs, max_blocks] int32: block ids per request
    query_start_loc: torch.Tensor  # [num_seqs + 1] int32: cumulative query lengths
    seq_lens: torch.Tensor  # [num_seqs] int32: context + new tokens per request
    max_query_len: int
    max_seq_len: int
    # True only on CUDA with the Triton kernels importable: decode-only batches then run the
    # split-K decode kernel of lab-04 and any other batch the varlen kernel, one launch per
    # layer either way. Otherwise the torch reference serves every batch (slow, but anywhere).
    use_triton: bool = False

    @property
    def num_seqs(self) -> int:
        return self.seq_lens.shape[0]

    @property
    def is_decode_only(self) -> bool:
        return self.max_query_len == 1


class Attention(nn.Module):
    """Store this step's K/V into the paged cache, then attend through the block tables.

    ``kv_cache`` is this layer's slice of the cache, ``[2, num_blocks, block_size, num_kv_heads,
    head_dim]`` (upstream's flash layout): index 0 holds keys, 1 values. Writing before reading
    is what lets one kernel call serve prefill and decode alike: a request's new tokens attend to
    themselves through the cache, exactly as they will attend to earlier tokens next step.

    With ``attn_metadata=None`` there is no cache (the memory-profiling run before the cache is
    allocated): the flattened batch is treated as one causal sequence, which costs the same
    activation memory as a real prefill of that many tokens.
    """

    def __init__(self, num_heads: int, head_dim: int, scale: float, num_kv_heads: int) -> None:
        super().__init__()
        if num_heads % num_kv_heads != 0:
            raise ValueError(f"num_heads={num_heads} is not a multiple of {num_kv_heads=}")
        self.num_heads = num_heads
        self.head_dim = head_dim
        self.scale = scale
        self.num_kv_heads = num_kv_heads
        self.decode_options = decode_launch_options(head_dim)

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        kv_cache: torch.Tensor | None,
        attn_metadata: AttentionMetadata | None,
    ) -> torch.Tensor:
        """``query`` ``[T, num_heads, head_dim]``, ``key``/``value`` ``[T, num_kv_heads, ...]``."""
        if attn_metadata is None or kv_cache is None:
            return self._dense_causal(query, key, value)
        key_cache, value_cache = kv_cache[0], kv_cache[1]
        backend = _triton_backend() if attn_metadata.use_triton else torch_paged_attention
        backend.reshape_and_cache(key, value, key_cache, value_cache, attn_metadata.slot_mapping)
        if attn_metadata.use_triton and attn_metadata.is_decode_only:
            # max_seq_len (a host-side bound, never read from the device) sizes the split-K
            # grid, which keeps the call capturable in a CUDA graph.
            return backend.paged_attention_decode(
                query,
                key_cache,
                value_cache,
                attn_metadata.block_tables,
                attn_metadata.seq_lens,
                self.scale,
                max_seq_len=attn_metadata.max_seq_len,
                **self.decode_options,
            )
        varlen = _triton_varlen() if attn_metadata.use_triton else torch_paged_attention
        return varlen.paged_attention_varlen(
            query,
            key_cache,
            value_cache,
            attn_metadata.block_tables,
            attn_metadata.query_start_loc,
            attn_metadata.seq_lens,
            self.scale,
        )

    def _dense_causal(
        self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor
    ) -> torch.Tensor:
        q = query.transpose(0, 1).unsqueeze(0)
        k = key.transpose(0, 1).unsqueeze(0)
        v = value.transpose(0, 1).unsqueeze(0)
        groups = self.num_heads // self.num_kv_heads
        if groups > 1:
            k = k.repeat_interleave(groups, dim=1)
            v = v.repeat_interleave(groups, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=self.scale)
        return out.squeeze(0).transpose(0, 1)
