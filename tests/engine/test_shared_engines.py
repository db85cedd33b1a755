"""The shared engines of these tests (``engines`` in conftest.py) are handed out as if new.

Every engine test that shares an engine relies on this: a prefix cached by an earlier test would
change its schedule and hit counts, and counters carried over would break its statistics.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mini_vllm.sampling_params import SamplingParams

from .conftest import GPU_KV_CACHE_BYTES, ON_CUDA, SharedEngines, kv_block_bytes

PROMPT = {"prompt_token_ids": list(range(40))}  # two full blocks of 16 to cache
GREEDY = SamplingParams(temperature=0.0, max_tokens=4)


def test_a_shared_engine_comes_back_reset(
    tiny_llama_dir: Path, hf_tiny_llama: Any, engines: SharedEngines
) -> None:
    llm = engines.get(tiny_llama_dir, dtype="float32", max_model_len=64)
    first = llm.generate([PROMPT], GREEDY, use_tqdm=False)[0]
    again = llm.generate([PROMPT], GREEDY, use_tqdm=False)[0]
    assert again.num_cached_tokens == 32  # the engine does cache: the reset below is needed
    assert llm.get_stats().num_generation_tokens == 8
    if ON_CUDA:  # the shared budget, not 90 % of the device
        block = kv_block_bytes(hf_tiny_llama.config, "float32")
        assert llm.llm_engine.num_gpu_blocks == GPU_KV_CACHE_BYTES // block

    # Arguments equal to LLM's defaults are not part of the key: the same engine.
    same = engines.get(tiny_llama_dir, dtype="float32", max_model_len=64, async_scheduling=True)
    assert same is llm
    stats = same.get_stats()
    assert (stats.num_generation_tokens, stats.prefix_cache_queries, stats.num_steps) == (0, 0, 0)
    out = same.generate([PROMPT], GREEDY, use_tqdm=False)[0]
    assert out.num_cached_tokens == 0, "a prefix cached by an earlier user was hit"
    assert out.outputs[0].token_ids == first.outputs[0].token_ids

    # A request left behind (a test that failed mid-way) cannot be reset away: a new engine.
    same.llm_engine.add_request("left-behind", [1, 2, 3], GREEDY)
    replaced = engines.get(tiny_llama_dir, dtype="float32", max_model_len=64)
    assert replaced is not llm and not replaced.llm_engine.has_unfinished_requests()
