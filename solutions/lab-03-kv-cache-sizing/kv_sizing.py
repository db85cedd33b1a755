"""How many KV-cache blocks fit in memory, the arithmetic of vLLM's startup log: the file of lab-03.

You write the nine formulas, from ``dtype_size`` to ``max_concurrency``; ``DTYPE_SIZES``, the helper
``_check_positive`` and ``cdiv`` (ceiling division, imported from the engine's
``mini_vllm.utils.math_utils``) are given. Every function takes plain integers (a dtype may be named
by a string) and returns integers, except ``max_concurrency``, a float as vLLM logs it. Keep the
signatures: the engine calls the same functions, from ``mini_vllm/worker/kv_sizing.py``, and with
``--chain`` later labs run the engine on yours.

The grader checks your formulas to the byte on the published configs of real models, then starts the
engine on a tiny random Llama and checks that it chose the block count your functions predict (with
a GPU, one more test does the same from the memory the engine measured). Keep bytes in bytes until
the very end: rounding to MiB or GiB early is how sizing bugs of a few blocks are born.
"""

from __future__ import annotations

import math

from mini_vllm.utils.math_utils import cdiv

# Bytes per element of the dtypes a KV cache is stored in.
DTYPE_SIZES: dict[str, int] = {
    "float32": 4,
    "float": 4,
    "float16": 2,
    "half": 2,
    "bfloat16": 2,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
    "fp8": 1,
}


def dtype_size(dtype: str | int) -> int:
    """Bytes per element: ``dtype_size("bfloat16") == 2``; an int passes through unchanged."""
    if isinstance(dtype, int):
        if dtype <= 0:
            raise ValueError(f"dtype size must be positive, got {dtype}")
        return dtype
    name = str(dtype).removeprefix("torch.")
    if name not in DTYPE_SIZES:
        raise ValueError(f"unknown KV cache dtype {dtype!r}; known: {sorted(DTYPE_SIZES)}")
    return DTYPE_SIZES[name]


def kv_cache_dims(config: object) -> tuple[int, int, int]:
    """``(num_layers, num_kv_heads, head_dim)`` of a Llama-family model's config.

    The three numbers the cache's size depends on, read the way the model reads them (upstream:
    ``ModelConfig.get_num_layers``, ``get_num_kv_heads``, ``get_head_size``). ``config`` is a
    transformers config or any object with its attribute names: duck-typed, so that this file
    needs no transformers. A config without
    ``num_key_value_heads`` (or with None) is multi-head attention: one KV head per query head.
    ``head_dim`` is the config's own when it states one, since some models (Gemma, a few Llamas)
    make it unequal to ``hidden_size / num_attention_heads``.
    """
    num_heads = int(config.num_attention_heads)  # type: ignore[attr-defined]
    num_kv_heads = int(getattr(config, "num_key_value_heads", None) or num_heads)
    hidden_size = int(config.hidden_size)  # type: ignore[attr-defined]
    head_dim = int(getattr(config, "head_dim", None) or hidden_size // num_heads)
    return int(config.num_hidden_layers), num_kv_heads, head_dim  # type: ignore[attr-defined]


def bytes_per_token(
    num_layers: int, num_kv_heads: int, head_dim: int, dtype_bytes: int | str
) -> int:
    """KV cache bytes one token occupies across the whole model.

    Each layer stores one key and one value vector (the factor 2) per KV head. Query heads cost
    nothing here, which is why grouped-query attention shrinks the cache by
    ``num_heads / num_kv_heads``.
    """
    _check_positive(num_layers=num_layers, num_kv_heads=num_kv_heads, head_dim=head_dim)
    return 2 * num_layers * num_kv_heads * head_dim * dtype_size(dtype_bytes)


def bytes_per_block(
    block_size: int, num_layers: int, num_kv_heads: int, head_dim: int, dtype_bytes: int | str
) -> int:
    """Bytes of one block across all layers: ``block_size`` tokens' worth.

    A block id names the same slot range in every layer's cache, so allocating one block costs
    this much memory at once. (Upstream's ``page_size_bytes`` is the one-layer share of it.)
    """
    _check_positive(block_size=block_size)
    return block_size * bytes_per_token(num_layers, num_kv_heads, head_dim, dtype_bytes)


def available_kv_cache_memory(
    total_memory: int, gpu_memory_utilization: float, non_kv_cache_memory: int
) -> int:
    """The KV cache budget on a GPU: the allowed share of the device minus what the model needs.

    The share is of the device's *total* memory, not of what is free at startup: the setting
    says how much of the GPU this engine may occupy in all, so memory another process holds
    must be left out of it by lowering ``gpu_memory_utilization``, never silently subtracted.
    The share is rounded up to a whole byte, as upstream's ``request_memory`` does.
    ``non_kv_cache_memory`` is the peak measured by a profiling forward pass at the largest
    batch: weights plus activations (plus the CUDA context where it is measured). The result may
    be negative, which means the model alone does not fit the allowed share.
    """
    if not 0.0 < gpu_memory_utilization <= 1.0:
        raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {gpu_memory_utilization}")
    return math.ceil(total_memory * gpu_memory_utilization) - int(non_kv_cache_memory)


def num_gpu_blocks_from_budget(budget_bytes: int, block_bytes: int) -> int:
    """Whole blocks that fit in ``budget_bytes`` (0 for an empty or negative budget)."""
    _check_positive(block_bytes=block_bytes)
    return max(int(budget_bytes) // block_bytes, 0)


def blocks_per_request(num_tokens: int, block_size: int) -> int:
    """Blocks a sequence of ``num_tokens`` tokens holds: its last block may be partly empty."""
    _check_positive(block_size=block_size)
    return cdiv(num_tokens, block_size)


def min_num_gpu_blocks(max_model_len: int, block_size: int, num_requests: int = 1) -> int:
    """Blocks a cache needs to hold ``num_requests`` requests of ``max_model_len`` tokens at once.

    One more than their blocks: block 0 is the null block, reserved by the block pool as the
    placeholder of padded block tables and never handed to a request. An engine whose cache is
    smaller than ``min_num_gpu_blocks(max_model_len, block_size)`` would accept a prompt it can
    never finish, so it refuses to start.
    """
    _check_positive(max_model_len=max_model_len, num_requests=num_requests)
    return num_requests * blocks_per_request(max_model_len, block_size) + 1


def max_concurrency(num_gpu_blocks: int, block_size: int, max_model_len: int) -> float:
    """How many requests of ``max_model_len`` tokens the cache holds at once.

    The figure upstream logs at startup ("Maximum concurrency for N tokens per request"): a
    lower bound, since real requests are usually shorter and share prefixes. Like upstream's,
    it divides every block of the cache, the null block included: a figure for a log line, not
    a promise (``min_num_gpu_blocks`` is where the null block is counted exactly).
    """
    _check_positive(max_model_len=max_model_len)
    return num_gpu_blocks / blocks_per_request(max_model_len, block_size)


def _check_positive(**values: int) -> None:
    for name, value in values.items():
        if int(value) <= 0:
            raise ValueError(f"{name} must be positive, got {value}")
