"""Misuse fails at once, with a message that says what was wrong and what to do."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from mini_vllm.llm import LLM
from mini_vllm.sampling_params import SamplingParams

from .conftest import SharedEngines, kv_block_bytes


@pytest.fixture
def llm(tiny_llama_dir: Path, engines: SharedEngines) -> LLM:
    # dtype "auto": float32 on CPU, bfloat16 on a GPU (misuse is refused the same in both).
    return engines.get(tiny_llama_dir, max_model_len=32)


GREEDY = SamplingParams(temperature=0.0, max_tokens=4)


@pytest.mark.parametrize("length", [32, 40])
def test_prompt_longer_than_max_model_len(llm: LLM, length: int) -> None:
    with pytest.raises(ValueError, match=rf"prompt has {length} tokens.*max_model_len=32"):
        llm.generate([list(range(length))], GREEDY, use_tqdm=False)


def test_failed_batch_leaves_nothing_queued(llm: LLM) -> None:
    with pytest.raises(ValueError, match="max_model_len"):
        llm.generate([[1, 2, 3], list(range(40))], GREEDY, use_tqdm=False)
    assert not llm.llm_engine.has_unfinished_requests()
    outputs = llm.generate([[1, 2, 3]], GREEDY, use_tqdm=False)
    assert len(outputs) == 1 and len(outputs[0].outputs[0].token_ids) == 4


def test_bad_prompts(llm: LLM) -> None:
    with pytest.raises(ValueError, match="outside the vocabulary"):
        llm.generate([[1, 500]], GREEDY, use_tqdm=False)
    with pytest.raises(ValueError, match="empty"):
        llm.generate([{"prompt_token_ids": []}], GREEDY, use_tqdm=False)
    with pytest.raises(ValueError, match="need a tokenizer"):
        llm.generate("text needs a tokenizer", GREEDY, use_tqdm=False)
    with pytest.raises(ValueError, match="2 sampling params for 3 prompts"):
        llm.generate([[1], [2], [3]], [GREEDY, GREEDY], use_tqdm=False)
    for salt in ("", 7):
        with pytest.raises(ValueError, match="cache_salt must be a non-empty str"):
            llm.generate({"prompt_token_ids": [1, 2], "cache_salt": salt}, GREEDY, use_tqdm=False)


def test_unknown_model_path(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"not found.*never downloads"):
        LLM(str(tmp_path / "no-such-model"))
    with pytest.raises(FileNotFoundError, match=r"neither a config\.json nor a \.gguf"):
        LLM(str(tmp_path))


def test_unsupported_architecture(tmp_path: Path) -> None:
    import transformers

    transformers.GPT2Config(n_layer=1, n_embd=16, n_head=2).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="'gpt2' is not a Llama-family decoder"):
        LLM(str(tmp_path))


def test_kv_budget_too_small_for_one_request(tiny_llama_dir: Path, hf_tiny_llama: Any) -> None:
    # The budget is counted in blocks of the dtype in use ("auto": tiny_llama's block of 16
    # tokens is 8 KiB in float32 on CPU, 4 KiB in bfloat16 on a GPU); 256 tokens need 16
    # blocks + the null block.
    block = kv_block_bytes(hf_tiny_llama.config)
    with pytest.raises(ValueError, match=r"holds 3 blocks .* needs 17 blocks") as info:
        LLM(str(tiny_llama_dir), skip_tokenizer_init=True, kv_cache_memory_bytes=3 * block + 5)
    assert "kv_cache_memory_bytes" in str(info.value) and "max_model_len" in str(info.value)
    assert f"({block / 2**10:.1f} KiB each)" in str(info.value)
    # The same budget is enough once max_model_len shrinks to what it can hold.
    llm = LLM(
        str(tiny_llama_dir),
        skip_tokenizer_init=True,
        kv_cache_memory_bytes=3 * block,
        max_model_len=32,
    )
    assert llm.llm_engine.num_gpu_blocks == 3


def test_max_model_len_beyond_the_model(tiny_llama_dir: Path) -> None:
    with pytest.raises(ValueError, match="exceeds the model's max_position_embeddings=256"):
        LLM(str(tiny_llama_dir), skip_tokenizer_init=True, max_model_len=1024)
