"""Tensor parallelism on the real checkpoint: SmolLM2-135M-Instruct (9 query, 3 KV heads).

TP=3 gives each rank 3 query heads and 1 KV head; its greedy output must equal the one-rank
engine's token for token. TP=2 does not divide the 9 heads and must be refused, before any
weight is read or any process started.

The checkpoint is read once for the module: both engines' loaders are handed the same
Hugging Face instance (as tests/engine/test_real_model.py does), everything after the read
(sharding, shared memory, workers) runs as in production.
"""

from __future__ import annotations

import multiprocessing
import time
from typing import Any

import pytest

from mini_vllm.llm import LLM
from mini_vllm.model.loader import default_model_path, resolve_model
from mini_vllm.sampling_params import SamplingParams

PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time"]
GREEDY = SamplingParams(temperature=0, max_tokens=16)


@pytest.fixture(scope="module")
def smollm2() -> Any:
    try:
        source = resolve_model(default_model_path())
    except FileNotFoundError as exc:
        pytest.skip(str(exc))
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(source.path, **source.from_pretrained_kwargs())
    return model.eval()


@pytest.fixture
def loaded_once(smollm2: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from transformers import AutoModelForCausalLM

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", lambda *a, **k: smollm2)


def test_tp3_greedy_equals_tp1_on_smollm2(loaded_once: None) -> None:
    one = LLM(max_model_len=256).generate(PROMPTS, GREEDY, use_tqdm=False)
    llm = LLM(max_model_len=256, tensor_parallel_size=3)
    try:
        executor = llm.llm_engine.model_runner
        assert [(i["num_heads"], i["num_kv_heads"]) for i in executor.worker_info] == [(3, 1)] * 3
        three = llm.generate(PROMPTS, GREEDY, use_tqdm=False)
    finally:
        llm.llm_engine.shutdown()
    assert [o.outputs[0].token_ids for o in three] == [o.outputs[0].token_ids for o in one]
    assert three[0].outputs[0].text.strip().startswith("Paris")


def test_tp2_is_refused_on_smollm2_before_anything_starts(loaded_once: None) -> None:
    start = time.monotonic()
    with pytest.raises(ValueError) as excinfo:
        LLM(tensor_parallel_size=2)
    message = str(excinfo.value)
    assert "attention heads (9)" in message and "tensor_parallel_size (2)" in message
    assert "not divisible" in message
    assert multiprocessing.active_children() == []  # no worker was started
    assert time.monotonic() - start < 30  # the config only, not the weights
