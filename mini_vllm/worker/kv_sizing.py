"""How many KV cache blocks fit in memory: the arithmetic behind vLLM's startup log line.

vLLM sizes its KV cache once, at startup, and never again: it measures what the model needs
(weights plus the activation peak of a profiling forward pass at the largest batch), gives
everything else that ``gpu_memory_utilization`` allows to the cache, and cuts that budget into
fixed-size blocks. Here that arithmetic, upstream's startup check and auto-fit of
``max_model_len`` (which, unlike upstream's, count the null block) and tensor parallelism's share
live in one place, integers in and out, with no torch, so they can be read, tested and graded
alone; where upstream keeps each piece: docs/upstream-fidelity.md (module notes).
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


# --- Fitting max_model_len to the cache (upstream: ``--max-model-len -1``) -------------------
#
# The functions below are not part of lab-03: they build on its formulas to answer the question
# the other way round. Given the blocks the budget buys, how long may a request be?


def may_override_num_blocks(num_gpu_blocks: int, num_gpu_blocks_override: int | None) -> int:
    """The block count the cache gets: the measured one, or ``num_gpu_blocks_override``.

    The override (upstream's ``CacheConfig.num_gpu_blocks_override``, used by tests and to
    reproduce another machine's pool) replaces the figure the budget gave, in either
    direction. Everything sized after it, the startup check and auto-fit included, must use the
    overridden figure: a length that fits the budget but not the override would pass the check
    and then never be schedulable.
    """
    if num_gpu_blocks_override is None:
        return num_gpu_blocks
    _check_positive(num_gpu_blocks_override=num_gpu_blocks_override)
    return num_gpu_blocks_override


def estimate_max_model_len(num_blocks: int, block_size: int, max_model_len: int) -> int:
    """The longest sequence, at most ``max_model_len`` tokens, whose blocks fit in ``num_blocks``.

    0 when not even one block is available. Upstream's ``estimate_max_model_len`` binary-searches
    the lengths whose KV bytes fit the budget; with one full-attention group a length needs
    ``blocks_per_request(length)`` blocks, so the answer has a closed form: every block full.
    ``num_blocks`` counts the blocks one request may hold; the caller decides whether the null
    block is among them (``auto_fit_max_model_len`` takes it out, as the startup check does).
    """
    _check_positive(block_size=block_size, max_model_len=max_model_len)
    return min(max_model_len, max(int(num_blocks), 0) * block_size)


def check_enough_kv_cache_memory(num_gpu_blocks: int, block_size: int, max_model_len: int) -> None:
    """Refuse a cache that cannot hold one request of ``max_model_len`` tokens.

    Such an engine would accept a prompt it can never finish. The null block is counted
    (``min_num_gpu_blocks``), so a pool that passes can really hold a longest request. The
    error names the longest length the pool does hold, so the fix can be read off it.
    """
    needed = min_num_gpu_blocks(max_model_len, block_size)
    if num_gpu_blocks >= needed:
        return
    fits = estimate_max_model_len(num_gpu_blocks - 1, block_size, max_model_len)
    hint = f"the longest request it holds is {fits} tokens" if fits else "it holds no token"
    raise ValueError(
        f"the KV cache has {num_gpu_blocks} blocks of {block_size} tokens, but one request of "
        f"the max seq len (max_model_len={max_model_len}) needs {needed} blocks, null block "
        f"included; {hint}. Give the cache more memory, or lower max_model_len (or pass "
        "max_model_len=-1 to fit it automatically)."
    )


def auto_fit_max_model_len(num_gpu_blocks: int, block_size: int, max_model_len: int) -> int:
    """The ``max_model_len`` to serve when asked to fit it to the cache (``max_model_len=-1``).

    ``max_model_len`` is the longest the model allows (the checkpoint's context length); it is
    kept when one such request fits, and otherwise lowered to the longest that fits in the
    pool minus the null block, so the result always passes ``check_enough_kv_cache_memory``.
    A ValueError when not even one token fits.
    """
    fitted = estimate_max_model_len(num_gpu_blocks - 1, block_size, max_model_len)
    if fitted < 1:
        raise ValueError(
            f"cannot fit max_model_len to a KV cache of {num_gpu_blocks} blocks: one block is "
            "the null block and no other is left for a request. Give the cache more memory."
        )
    return fitted


# --- Tensor parallelism (phase 07): each rank's share of the cache ----------------------------
#
# Under tensor parallelism every rank stores the K/V of its own KV heads only, for every token
# and every layer: a block id names the same token slots on every rank, each rank holding a
# slice of the heads. One scheduler hands out block ids for all ranks at once, so every rank
# must have the same number of blocks: the smallest any rank can afford.


def bytes_per_block_per_rank(
    block_size: int,
    num_layers: int,
    total_num_kv_heads: int,
    head_dim: int,
    dtype_bytes: int | str,
    tensor_parallel_size: int,
) -> int:
    """Bytes one block takes on one rank: ``bytes_per_block`` with that rank's KV heads.

    A rank holds ``max(1, total_num_kv_heads // tensor_parallel_size)`` KV heads (upstream's
    ``ModelConfig.get_num_kv_heads``): an even share, or one replicated head when there are fewer
    KV heads than ranks. In the replicated case the block does not shrink as ranks are added,
    which is why TP beyond the number of KV heads buys no more KV cache per rank.
    """
    _check_positive(tensor_parallel_size=tensor_parallel_size)
    # The rule of mini_vllm.distributed.sharding.num_kv_heads_per_rank, repeated here so that
    # this module keeps needing nothing but the standard library (tests/tp checks they agree).
    heads = max(1, total_num_kv_heads // tensor_parallel_size)
    return bytes_per_block(block_size, num_layers, heads, head_dim, dtype_bytes)


def num_gpu_blocks_across_ranks(num_blocks_per_rank: list[int]) -> int:
    """The block count every rank gets: the smallest any rank can hold.

    Upstream's ``get_kv_cache_configs`` sizes each worker from its own free memory, then gives
    all of them the minimum, since the one scheduler's block ids must be valid on every rank.
    """
    if not num_blocks_per_rank:
        raise ValueError("no rank reported a block count")
    return min(int(n) for n in num_blocks_per_rank)


def _check_positive(**values: int) -> None:
    for name, value in values.items():
        if int(value) <= 0:
            raise ValueError(f"{name} must be positive, got {value}")
