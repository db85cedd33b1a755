"""Fixtures of lab-09's parity tests: a tiny random Llama, Hugging Face's greedy answers, and the
seam that runs the engine on your ``prepare_inputs``.

torch and transformers are imported inside the fixtures, never at collection. The checkpoint is
saved by transformers itself and loaded by the engine through its ordinary path, once per
session; its weights are drawn wide (``initializer_range=0.2``) so that greedy decoding is
decided by the model, never by float noise between two nearly equal logits.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

VOCAB = 128
MAX_NEW = 16


def make_prompts() -> list[list[int]]:
    """Eight prompts of 3..40 tokens, three of them sharing a 37-token prefix (2 full blocks of
    16, so that prefix caching has something to hit), drawn from a fixed seed."""
    import random

    rng = random.Random(9)
    prompts = [[rng.randrange(VOCAB) for _ in range(rng.randint(3, 40))] for _ in range(5)]
    base = [rng.randrange(VOCAB) for _ in range(37)]
    return [*prompts, [*base, 1, 2, 3], [*base, 4, 5], base[:33]]


PROMPTS = make_prompts()


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import torch
    import transformers

    torch.set_num_threads(1)  # tiny matmuls: threads cost more than they give
    config = transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
        rms_norm_eps=1e-5, initializer_range=0.2, tie_word_embeddings=True,
        bos_token_id=None, eos_token_id=None, pad_token_id=None,
    )
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("lab09_tiny_llama")
    transformers.LlamaForCausalLM(config).eval().save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def hf_greedy(tiny_checkpoint: Path) -> list[list[int]]:
    """Hugging Face's own greedy continuation of every prompt (one at a time, no padding)."""
    import torch
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(
        tiny_checkpoint, local_files_only=True).float().eval()
    answers = []
    with torch.no_grad():
        for prompt in PROMPTS:
            out = model.generate(torch.tensor([prompt]),
                                 attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                                 max_new_tokens=MAX_NEW, do_sample=False, pad_token_id=0)
            answers.append(out[0, len(prompt):].tolist())
    return answers


@pytest.fixture
def your_prepare_inputs(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """Route the engine's input preparation through your ``prepare_inputs``.

    ``ModelRunner.execute_model`` looks ``prepare_inputs`` up in its module at every step, so
    replacing that module attribute is enough. Yields a list holding the number of calls, so a
    test can check that your function really ran.
    """
    from grading.suite import load_impl
    from mini_vllm.worker import model_runner

    yours: Callable[..., Any] = load_impl("model_runner").prepare_inputs
    calls = [0]

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        return yours(*args, **kwargs)

    monkeypatch.setattr(model_runner, "prepare_inputs", counted)
    yield calls
