"""A tiny random Llama checkpoint for lab-03's engine tests, written once per session.

torch and transformers are imported inside the fixture, never at collection: the formula tests
of this suite need neither, and run wherever the grader runs. The checkpoint is the judge's: the
engine that reads it runs here; the learner process, which cannot see this folder, gets the
checkpoint's config.json as data (``learner_side.hf_config``).

The formula tests (part 1, milliseconds each) run before the engine tests (part 2, seconds
each): a mistake that both catch is reported by the first, and a grader that stops at the first
failure never starts an engine for it.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

#: The checkpoint's shape: GQA (4 query heads, 2 KV heads) and an explicit head_dim (24, not
#: hidden_size / heads = 16), so that a config read the wrong way gives a wrong block size.
TINY = dict(
    vocab_size=128,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=24,
    max_position_embeddings=256,
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Part 1 (the formulas) before part 2 (the engine), each in file order."""
    items.sort(key=lambda item: item.path.name == "test_engine.py")


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import torch
    import transformers

    torch.set_num_threads(1)  # tiny matmuls: threads cost more than they give
    config = transformers.LlamaConfig(
        **TINY,
        rms_norm_eps=1e-5,
        initializer_range=0.2,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
    )
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("lab03_tiny_llama")
    transformers.LlamaForCausalLM(config).eval().save_pretrained(path)
    return path
