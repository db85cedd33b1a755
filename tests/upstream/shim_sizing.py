"""KV-cache-sizing adapters of the upstream-test shim (see ``shim.py``'s docstring).

Upstream sizes the cache from per-layer specs (``dict[layer_name, KVCacheSpec]``) and bytes;
mini_vllm's ``worker/kv_sizing.py`` does the same arithmetic on plain integers for one
full-attention group whose layers share one shape. Each adapter checks that the specs are of
that kind (anything else raises :class:`UpstreamOnlyError`), turns them into mini_vllm's
arguments (block size, layer count, KV heads, head size, dtype) and lets ``kv_sizing`` compute
every number the tests compare: the block count, the per-layer tensor sizes, the estimated and
the auto-fitted ``max_model_len``, the concurrency, and the startup check's refusal.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from mini_vllm.worker import kv_sizing

from .shim import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    KVCacheTensor,
    UpstreamOnlyError,
    single_group_block_size,
)


def _one_group(kv_cache_spec: Mapping[str, Any]) -> tuple[FullAttentionSpec, int]:
    """The layers' common full-attention spec and the number of layers; raise for anything else."""
    specs = list(kv_cache_spec.values())
    if not specs:
        raise UpstreamOnlyError("an attention-free model: mini-vLLM serves Llama-family decoders")
    first = specs[0]
    for spec in specs:
        if (
            not isinstance(spec, FullAttentionSpec)
            or spec.sliding_window is not None
            or (spec.attention_chunk_size is not None)
        ):
            raise UpstreamOnlyError(
                f"a {type(spec).__name__} layer: mini-vLLM has one full-attention KV cache group"
            )
        if spec != first:
            raise UpstreamOnlyError(
                "layers of different shapes (upstream's UniformTypeKVCacheSpecs): mini-vLLM's "
                "layers share one KV cache shape"
            )
    if first.page_size_padded is not None:
        raise UpstreamOnlyError("padded KV cache pages are not mirrored by mini_vllm")
    return first, len(specs)


def _block_bytes(spec: FullAttentionSpec, num_layers: int) -> int:
    """Bytes of one block over ``num_layers`` layers, by mini_vllm's formula."""
    return kv_sizing.bytes_per_block(
        spec.block_size, num_layers, spec.num_kv_heads, spec.head_size, str(spec.dtype)
    )


def estimate_max_model_len(
    vllm_config: Any, kv_cache_spec: Mapping[str, Any], available_memory: int
) -> int:
    """Upstream's ``estimate_max_model_len``: the longest request whose KV fits the bytes.

    Like upstream's, a question about one request's blocks, so every block of the budget
    counts; mini_vllm's startup check and auto-fit take the null block out first.
    """
    spec, num_layers = _one_group(kv_cache_spec)
    num_blocks = kv_sizing.num_gpu_blocks_from_budget(
        available_memory, _block_bytes(spec, num_layers)
    )
    return kv_sizing.estimate_max_model_len(
        num_blocks, spec.block_size, vllm_config.model_config.max_model_len
    )


def get_max_concurrency_for_kv_cache_config(
    vllm_config: Any, kv_cache_config: KVCacheConfig
) -> float:
    """Upstream's concurrency figure, by ``kv_sizing.max_concurrency``."""
    block_size = single_group_block_size(kv_cache_config)
    return kv_sizing.max_concurrency(
        kv_cache_config.num_blocks, block_size, vllm_config.model_config.max_model_len
    )


def get_kv_cache_configs(
    vllm_config: Any,
    kv_cache_specs: Sequence[Mapping[str, Any]],
    available_memory: Sequence[int],
) -> list[KVCacheConfig]:
    """Upstream's sizing at startup, for one worker and one full-attention group.

    The block count is the budget's (``num_gpu_blocks_from_budget``) or the override
    (``may_override_num_blocks``); ``max_model_len=-1`` (``original_max_model_len``) is fitted to
    it (``auto_fit_max_model_len``); a pool that cannot hold one request of ``max_model_len``
    tokens is refused (``check_enough_kv_cache_memory``). Upstream gives each layer its own
    tensor of ``num_blocks`` one-layer pages; mini_vllm's runner allocates the same bytes as
    one tensor for all layers, so the records below are sized per layer by the same formula.
    """
    if len(kv_cache_specs) != 1 or len(available_memory) != 1:
        raise UpstreamOnlyError(
            f"{len(kv_cache_specs)} workers: mini-vLLM runs on one GPU (no pipeline parallelism)"
        )
    layer_specs = kv_cache_specs[0]
    spec, num_layers = _one_group(layer_specs)
    num_blocks = kv_sizing.may_override_num_blocks(
        kv_sizing.num_gpu_blocks_from_budget(available_memory[0], _block_bytes(spec, num_layers)),
        vllm_config.cache_config.num_gpu_blocks_override,
    )
    model_config = vllm_config.model_config
    if model_config.original_max_model_len == -1:
        model_config.max_model_len = kv_sizing.auto_fit_max_model_len(
            num_blocks, spec.block_size, model_config.max_model_len
        )
    kv_sizing.check_enough_kv_cache_memory(num_blocks, spec.block_size, model_config.max_model_len)
    layer_bytes = _block_bytes(spec, 1)
    return [
        KVCacheConfig(
            num_blocks=num_blocks,
            kv_cache_tensors=[
                KVCacheTensor(size=layer_bytes * num_blocks, shared_by=[name])
                for name in layer_specs
            ],
            kv_cache_groups=[KVCacheGroupSpec(list(layer_specs), spec)],
        )
    ]


# Names ``vllm.v1.core.kv_cache_utils`` gets on top of mini_vllm's ``core/kv_cache_utils.py``.
OVERRIDES: dict[str, dict[str, Any]] = {
    "kv_cache_utils": {
        "estimate_max_model_len": estimate_max_model_len,
        "get_max_concurrency_for_kv_cache_config": get_max_concurrency_for_kv_cache_config,
        "get_kv_cache_configs": get_kv_cache_configs,
    },
}
