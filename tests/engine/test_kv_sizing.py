"""KV cache sizing: the arithmetic, the real model's numbers, and the engine agreeing with both."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from mini_vllm.worker import kv_sizing

from .conftest import GPU_KV_CACHE_BYTES, ON_CUDA, kv_block_bytes


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

    from mini_vllm.utils import math_utils

    def imports(module: object) -> set[str]:
        tree = ast.parse(inspect.getsource(module))
        return {
            alias.name
            for node in ast.walk(tree)
            if isinstance(node, ast.Import | ast.ImportFrom)
            for alias in (
                node.names if isinstance(node, ast.Import) else [ast.alias(node.module or "")]
            )
        }

    assert imports(kv_sizing) <= {"__future__", "math", "numpy", "mini_vllm.utils.math_utils"}
    assert imports(math_utils) <= {"__future__", "typing"}


def test_engine_agrees_with_formula(tiny_llama_dir: Path) -> None:
    import torch

    from mini_vllm.llm import LLM

    budget = 3 * 2**20 + 123
    llm = LLM(str(tiny_llama_dir), skip_tokenizer_init=True, kv_cache_memory_bytes=budget)
    engine = llm.llm_engine
    # dtype "auto": float32 on CPU, bfloat16 on a GPU (tiny_llama's config names no dtype).
    assert engine.dtype == (torch.bfloat16 if ON_CUDA else torch.float32)
    # tiny_llama: 2 layers, 2 KV heads of 16, in the dtype in use
    block_bytes = kv_sizing.bytes_per_block(16, 2, 2, 16, engine.dtype.itemsize)
    assert block_bytes == (4096 if ON_CUDA else 8192)
    assert engine.model_runner.kv_cache_block_bytes == block_bytes
    assert engine.num_gpu_blocks == budget // block_bytes
    assert engine.kv_cache_manager.block_pool.num_gpu_blocks == engine.num_gpu_blocks
    kv_cache = engine.model_runner.kv_cache
    assert kv_cache is not None
    assert kv_cache.numel() * kv_cache.element_size() == engine.num_gpu_blocks * block_bytes
    assert kv_cache.dtype == engine.dtype and kv_cache.device.type == engine.device.type


def test_estimate_and_auto_fit_max_model_len() -> None:
    # Every block full; capped at the model's length; 0 when no block is left.
    assert kv_sizing.estimate_max_model_len(1024, 16, 16385) == 16384
    assert kv_sizing.estimate_max_model_len(1024, 16, 16383) == 16383
    assert kv_sizing.estimate_max_model_len(0, 16, 100) == 0
    assert kv_sizing.estimate_max_model_len(-3, 16, 100) == 0
    # Auto-fit leaves the null block out, so its answer passes the startup check.
    assert kv_sizing.auto_fit_max_model_len(32, 16, 1024) == 31 * 16
    assert kv_sizing.auto_fit_max_model_len(1024, 16, 1024) == 1024
    for num_blocks, block_size, model_len in [(2, 16, 16), (7, 4, 100), (65, 16, 1024)]:
        fitted = kv_sizing.auto_fit_max_model_len(num_blocks, block_size, model_len)
        kv_sizing.check_enough_kv_cache_memory(num_blocks, block_size, fitted)
        with pytest.raises(ValueError, match="max seq len"):
            kv_sizing.check_enough_kv_cache_memory(num_blocks, block_size, fitted + block_size)
    with pytest.raises(ValueError, match="null block"):
        kv_sizing.auto_fit_max_model_len(1, 16, 1024)


def test_check_enough_kv_cache_memory_names_what_fits() -> None:
    kv_sizing.check_enough_kv_cache_memory(65, 16, 1024)  # 64 blocks + the null block
    with pytest.raises(ValueError, match=r"needs 65 blocks.*longest request it holds is 1008"):
        kv_sizing.check_enough_kv_cache_memory(64, 16, 1024)
    with pytest.raises(ValueError, match="holds no token"):
        kv_sizing.check_enough_kv_cache_memory(1, 16, 1024)


def test_num_gpu_blocks_override() -> None:
    assert kv_sizing.may_override_num_blocks(100, None) == 100
    assert kv_sizing.may_override_num_blocks(100, 7) == 7
    assert kv_sizing.may_override_num_blocks(3, 7) == 7  # either direction
    with pytest.raises(ValueError, match="num_gpu_blocks_override"):
        kv_sizing.may_override_num_blocks(100, 0)


def test_engine_auto_fits_max_model_len(tiny_llama_dir: Path, hf_tiny_llama: Any) -> None:
    from mini_vllm.llm import LLM
    from mini_vllm.sampling_params import SamplingParams

    # tiny_llama: max_position_embeddings=256; a block of 16 tokens is 8 KiB in float32 (CPU),
    # 4 KiB in bfloat16 (GPU). Three blocks: the null block and two for a request, so
    # max_model_len=-1 becomes 32.
    llm = LLM(
        str(tiny_llama_dir),
        skip_tokenizer_init=True,
        kv_cache_memory_bytes=3 * kv_block_bytes(hf_tiny_llama.config),
        max_model_len=-1,
    )
    engine = llm.llm_engine
    assert engine.num_gpu_blocks == 3
    assert engine.max_model_len == engine.scheduler.max_model_len == 32
    assert engine.model_runner.max_num_blocks_per_req == 2
    out = llm.generate([[1, 2, 3]], SamplingParams(temperature=0.0, max_tokens=100), use_tqdm=False)
    assert len(out[0].outputs[0].token_ids) == 32 - 3  # stopped by the fitted length
    # The override is what auto-fit sizes against, not the (large) budget.
    llm = LLM(
        str(tiny_llama_dir),
        skip_tokenizer_init=True,
        kv_cache_memory_bytes=2**20,
        num_gpu_blocks_override=5,
        max_model_len=-1,
    )
    assert llm.llm_engine.num_gpu_blocks == 5 and llm.llm_engine.max_model_len == 64
    # Enough blocks: the checkpoint's whole length is kept. On a GPU an explicit budget: 90 %
    # of the device is millions of tiny_llama blocks, seconds of block bookkeeping to build
    # (test_real_model.py checks the measured budget, on a model with larger blocks).
    budget = {"kv_cache_memory_bytes": GPU_KV_CACHE_BYTES} if ON_CUDA else {}
    llm = LLM(str(tiny_llama_dir), skip_tokenizer_init=True, max_model_len=-1, **budget)
    assert llm.llm_engine.max_model_len == 256
    with pytest.raises(ValueError, match="null block"):
        LLM(
            str(tiny_llama_dir),
            skip_tokenizer_init=True,
            num_gpu_blocks_override=1,
            max_model_len=-1,
        )
