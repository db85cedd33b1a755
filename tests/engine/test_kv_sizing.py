"""KV cache sizing: the arithmetic, the real model's numbers, and the engine agreeing with both."""

from __future__ import annotations

from pathlib import Path

import pytest

from mini_vllm.worker import kv_sizing


def test_smollm2_numbers() -> None:
    # SmolLM2-135M: 30 layers, 3 KV heads of 64, float32 on CPU.
    per_token = kv_sizing.bytes_per_token(30, 3, 64, 4)
    assert per_token == 2 * 30 * 3 * 64 * 4 == 46_080
    per_block = kv_sizing.bytes_per_block(16, 30, 3, 64, 4)
    assert per_block == 16 * per_token == 737_280
    blocks = kv_sizing.num_gpu_blocks_from_budget(512 * 2**20, per_block)
    assert blocks == 728
    assert kv_sizing.max_concurrency(blocks, 16, 8192) == pytest.approx(728 / 512)


def test_gpu_budget_is_utilization_share_minus_peak() -> None:
    total = 80 * 2**30
    assert (
        kv_sizing.available_kv_cache_memory(total, 0.9, 10 * 2**30) == int(total * 0.9) - 10 * 2**30
    )
    assert kv_sizing.available_kv_cache_memory(total, 0.1, 10 * 2**30) < 0
    assert kv_sizing.num_gpu_blocks_from_budget(-5, 100) == 0
    with pytest.raises(ValueError, match="gpu_memory_utilization"):
        kv_sizing.available_kv_cache_memory(total, 1.5, 0)


def test_helpers() -> None:
    assert kv_sizing.dtype_size("bfloat16") == 2 and kv_sizing.dtype_size("torch.float32") == 4
    assert kv_sizing.blocks_per_request(17, 16) == 2 and kv_sizing.blocks_per_request(16, 16) == 1
    assert kv_sizing.bytes_per_token(1, 1, 1, "float16") == 4
    with pytest.raises(ValueError, match="unknown KV cache dtype"):
        kv_sizing.dtype_size("int3")
    with pytest.raises(ValueError, match="block_size"):
        kv_sizing.bytes_per_block(0, 1, 1, 1, 4)


def test_sizing_module_needs_no_torch() -> None:
    import ast
    import inspect

    tree = ast.parse(inspect.getsource(kv_sizing))
    imported = {
        alias.name.split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.Import | ast.ImportFrom)
        for alias in (
            node.names if isinstance(node, ast.Import) else [ast.alias(node.module or "")]
        )
    }
    assert imported <= {"__future__", "math", "numpy"}


def test_engine_agrees_with_formula(tiny_llama_dir: Path) -> None:
    from mini_vllm.llm import LLM

    budget = 3 * 2**20 + 123
    llm = LLM(str(tiny_llama_dir), skip_tokenizer_init=True, kv_cache_memory_bytes=budget)
    engine = llm.llm_engine
    # tiny_llama: 2 layers, 2 KV heads of 16, float32
    block_bytes = kv_sizing.bytes_per_block(16, 2, 2, 16, 4)
    assert engine.model_runner.kv_cache_block_bytes == block_bytes
    assert engine.num_gpu_blocks == budget // block_bytes
    assert engine.kv_cache_manager.block_pool.num_gpu_blocks == engine.num_gpu_blocks
    kv_cache = engine.model_runner.kv_cache
    assert kv_cache is not None
    assert kv_cache.numel() * kv_cache.element_size() == engine.num_gpu_blocks * block_bytes
