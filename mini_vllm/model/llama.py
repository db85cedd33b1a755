"""A Llama-family decoder that runs over one flattened batch and a paged KV cache.

Mirrors ``vllm/model_executor/models/llama.py``: the same class names, the fused ``qkv_proj`` and
``gate_up_proj`` matrices, ``forward(input_ids, positions, ...)`` over a flat token axis with no
batch or padding dimension, and ``compute_logits`` kept separate. Covers what the Llama family
varies (grouped-query attention, an explicit ``head_dim``, biases on the projections, RoPE with
llama3 or linear scaling, tied or untied embeddings), and builds tensor parallelism in as upstream
does (docs/upstream-fidelity.md, module notes).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

from mini_vllm.model.attention import Attention, AttentionMetadata
from mini_vllm.model.layers import RMSNorm, SiluAndMul, get_rope
from mini_vllm.model.linear import (
    MergedColumnParallelLinear,
    QKVParallelLinear,
    RowParallelLinear,
)
from mini_vllm.model.vocab_parallel_embedding import ParallelLMHead, VocabParallelEmbedding


class LlamaMLP(nn.Module):
    """SwiGLU feed-forward: ``down(silu(gate(x)) * up(x))`` with gate and up fused.

    Under tensor parallelism ``gate_up_proj`` is column-parallel and ``down_proj`` row-parallel:
    each rank runs SiLU-and-multiply on its own slice of the intermediate width, and one
    all-reduce at the end of ``down_proj`` completes the output.
    """

    def __init__(self, hidden_size: int, intermediate_size: int, bias: bool = False) -> None:
        super().__init__()
        self.gate_up_proj = MergedColumnParallelLinear(
            hidden_size, [intermediate_size] * 2, bias=bias
        )
        self.down_proj = RowParallelLinear(intermediate_size, hidden_size, bias=bias)
        self.act_fn = SiluAndMul()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act_fn(self.gate_up_proj(x)))


class LlamaAttention(nn.Module):
    """Project to Q/K/V in one matmul, rotate Q and K, attend through the paged cache.

    ``num_heads`` and ``num_kv_heads`` are this rank's: all of them on one rank, a
    ``1 / tensor_parallel_size`` share on many (KV heads replicated when there are fewer of them
    than ranks). Attention is independent per head, so each rank attends over its heads alone,
    through a KV cache that holds only its KV heads.
    """

    def __init__(self, config: Any) -> None:
        super().__init__()
        hidden_size = config.hidden_size
        self.total_num_heads = config.num_attention_heads
        self.total_num_kv_heads = (
            getattr(config, "num_key_value_heads", None) or self.total_num_heads
        )
        self.head_dim = getattr(config, "head_dim", None) or hidden_size // self.total_num_heads
        bias = bool(getattr(config, "attention_bias", False))
        self.qkv_proj = QKVParallelLinear(
            hidden_size, self.head_dim, self.total_num_heads, self.total_num_kv_heads, bias=bias
        )
        self.num_heads = self.qkv_proj.num_heads
        self.num_kv_heads = self.qkv_proj.num_kv_heads
        self.q_size = self.num_heads * self.head_dim
        self.kv_size = self.num_kv_heads * self.head_dim
        self.o_proj = RowParallelLinear(
            self.total_num_heads * self.head_dim, hidden_size, bias=bias
        )
        self.rotary_emb = get_rope(self.head_dim, config)
        self.attn = Attention(self.num_heads, self.head_dim, self.head_dim**-0.5, self.num_kv_heads)

    def forward(
        self,
        positions: torch.Tensor,
        hidden_states: torch.Tensor,
        kv_cache: torch.Tensor | None,
        attn_metadata: AttentionMetadata | None,
    ) -> torch.Tensor:
        qkv = self.qkv_proj(hidden_states)
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        num_tokens = hidden_states.shape[0]
        q = q.view(num_tokens, self.num_heads, self.head_dim)
        k = k.view(num_tokens, self.num_kv_heads, self.head_dim)
        v = v.reshape(num_tokens, self.num_kv_heads, self.head_dim)
        q, k = self.rotary_emb(positions, q, k)
        # q, k and v may stay strided views of ``qkv``: every attention backend takes strides.
        out = self.attn(q, k, v, kv_cache, attn_metadata)
        return self.o_proj(out.reshape(num_tokens, self.q_size))


class LlamaDecoderLayer(nn.Module):
    """Pre-norm block: ``x + attn(norm(x))`` then ``x + mlp(norm(x))``.

    The residual stream travels separately and is added inside the next norm (see ``RMSNorm``),
    so a layer returns ``(hidden_states, residual)`` rather than their sum.
    """

    def __init__(self, config: Any) -> None:
        super().__init__()
        eps = config.rms_norm_eps
        self.self_attn = LlamaAttention(config)
        self.mlp = LlamaMLP(
            config.hidden_size, config.intermediate_size, bool(getattr(config, "mlp_bias", False))
        )
        self.input_layernorm = RMSNorm(config.hidden_size, eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, eps)

    def forward(
        self,
        positions: torch.Tensor,
        hidden_states: torch.Tensor,
        residual: torch.Tensor | None,
        kv_cache: torch.Tensor | None,
        attn_metadata: AttentionMetadata | None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if residual is None:
            residual = hidden_states
            hidden_states = self.input_layernorm(hidden_states)
        else:
            hidden_states, residual = self.input_layernorm(hidden_states, residual)
        hidden_states = self.self_attn(positions, hidden_states, kv_cache, attn_metadata)
        hidden_states, residual = self.post_attention_layernorm(hidden_states, residual)
        return self.mlp(hidden_states), residual


class LlamaModel(nn.Module):
    """Embedding, the decoder stack and the final norm; returns hidden states, not logits."""

    def __init__(self, config: Any) -> None:
        super().__init__()
        self.embed_tokens = VocabParallelEmbedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(
            [LlamaDecoderLayer(config) for _ in range(config.num_hidden_layers)]
        )
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: list[torch.Tensor] | None,
        attn_metadata: AttentionMetadata | None,
    ) -> torch.Tensor:
        hidden_states = self.embed_tokens(input_ids)
        residual = None
        for i, layer in enumerate(self.layers):
            kv_cache = kv_caches[i] if kv_caches is not None else None
            hidden_states, residual = layer(
                positions, hidden_states, residual, kv_cache, attn_metadata
            )
        hidden_states, _ = self.norm(hidden_states, residual)
        return hidden_states


class LlamaForCausalLM(nn.Module):
    """The decoder plus its language-model head, loading Hugging Face-named weights.

    ``forward`` returns one hidden state per token; ``compute_logits`` turns the few selected rows
    into vocabulary scores. With ``tie_word_embeddings`` the head *is* the embedding matrix (one
    tensor, two uses), which is how SmolLM2 saves a fifth of its parameters.
    """

    # Hugging Face stores these separately; we keep them stacked for one matmul each.
    # (our parameter, the checkpoint's parameter, its shard id in the stack: upstream's ids)
    stacked_params_mapping: tuple[tuple[str, str, int | str], ...] = (
        (".qkv_proj", ".q_proj", "q"),
        (".qkv_proj", ".k_proj", "k"),
        (".qkv_proj", ".v_proj", "v"),
        (".gate_up_proj", ".gate_proj", 0),
        (".gate_up_proj", ".up_proj", 1),
    )

    def __init__(self, config: Any) -> None:
        super().__init__()
        self.config = config
        self.model = LlamaModel(config)
        self.lm_head = ParallelLMHead(config.vocab_size, config.hidden_size)
        if getattr(config, "tie_word_embeddings", False):
            self.lm_head.weight = self.model.embed_tokens.weight

    @property
    def num_layers(self) -> int:
        return len(self.model.layers)

    @property
    def num_heads(self) -> int:
        return self._first_attention().num_heads

    @property
    def num_kv_heads(self) -> int:
        return self._first_attention().num_kv_heads

    @property
    def head_dim(self) -> int:
        return self._first_attention().head_dim

    def _first_attention(self) -> LlamaAttention:
        # An nn.ModuleList hands back plain Modules: name the layer type it was built with.
        layer = self.model.layers[0]
        assert isinstance(layer, LlamaDecoderLayer)
        return layer.self_attn

    @property
    def tp_size(self) -> int:
        return self.lm_head.tp_size

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: list[torch.Tensor] | None = None,
        attn_metadata: AttentionMetadata | None = None,
    ) -> torch.Tensor:
        """Hidden states ``[num_tokens, hidden_size]`` for a flat batch of tokens."""
        return self.model(input_ids, positions, kv_caches, attn_metadata)

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """Vocabulary logits for the rows the caller selected (usually each request's last).

        Under tensor parallelism every rank gets the full logits (an all-gather of the vocabulary
        slices), so every rank samples the same token, as upstream's workers do.
        """
        return self.lm_head.compute_logits(hidden_states)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Copy Hugging Face-named tensors into our (partly fused, possibly sharded) parameters.

        Every tensor arrives whole; the layer that owns the parameter keeps its own shard of it
        (its ``weight_loader``, as upstream's layers do), so the same loop loads the full model
        on one rank and rank ``r``'s shard on many. Returns the names of our parameters that
        were filled, and raises if one was missed: a silently random layer would still produce
        fluent-looking nonsense, so a partial load must not pass for a model.
        """
        params = dict(self.named_parameters(remove_duplicate=False))
        loaded: set[str] = set()
        tied = getattr(self.config, "tie_word_embeddings", False)
        for name, tensor in weights:
            if "rotary_emb.inv_freq" in name:
                continue
            if tied and name == "lm_head.weight":
                continue
            for ours, theirs, shard in self.stacked_params_mapping:
                if theirs in name:
                    target = name.replace(theirs, ours)
                    # A fused layer; its loader's shard id is "q"/"k"/"v" or 0/1 (the mapping
                    # pairs them), so the call is typed no tighter than the mapping is.
                    layer: Any = self.get_submodule(target.rsplit(".", 1)[0])
                    layer.weight_loader(params[target], tensor, shard)
                    loaded.add(f"{target}#{shard}")
                    break
            else:
                if name not in params:
                    raise KeyError(f"checkpoint tensor {name!r} has no place in LlamaForCausalLM")
                param = params[name]
                loader = getattr(self.get_submodule(name.rsplit(".", 1)[0]), "weight_loader", None)
                if loader is not None:
                    try:
                        loader(param, tensor)
                    except ValueError as exc:
                        raise ValueError(f"{name}: {exc}") from exc
                else:
                    if param.shape != tensor.shape:
                        raise ValueError(
                            f"{name}: checkpoint shape {tuple(tensor.shape)} != "
                            f"{tuple(param.shape)}"
                        )
                    with torch.no_grad():
                        param.copy_(tensor)
                loaded.add(name)
        expected = self._expected_names(params, tied)
        missing = expected - loaded
        if missing:
            raise ValueError(f"checkpoint is missing weights: {sorted(missing)[:8]}")
        return {n.split("#")[0] for n in loaded}

    def _expected_names(self, params: dict[str, nn.Parameter], tied: bool) -> set[str]:
        expected: set[str] = set()
        for name in params:
            if tied and name == "lm_head.weight":
                continue
            if ".qkv_proj." in name:
                expected.update(f"{name}#{i}" for i in "qkv")
            elif ".gate_up_proj." in name:
                expected.update(f"{name}#{i}" for i in range(2))
            else:
                expected.add(name)
        return expected
