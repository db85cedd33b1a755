"""The engine on the real checkpoint: SmolLM2-135M-Instruct (GGUF, dequantized to float32).

Greedy decoding must reproduce Hugging Face's ``generate(do_sample=False)`` token for token on
every prompt, batched together through the paged cache, as well as answer the course's canary
question. One load of each model for the whole module keeps it within a few minutes on 2 cores.
Not marked slow on purpose: this is the test that says the engine is right.
"""

from __future__ import annotations

import os
from typing import Any

import pytest
import torch

from mini_vllm.llm import LLM
from mini_vllm.model.loader import default_model_path, resolve_model
from mini_vllm.sampling_params import SamplingParams

MAX_NEW = 32
PROMPTS = [
    "The capital of France is",
    "Hello, my name is",
    "def fibonacci(n):",
    "The three primary colors are",
    "Once upon a time, in a small village,",
    "Water boils at a temperature of",
    "The best way to learn a new language is",
    "1, 2, 3, 4, 5,",
]


@pytest.fixture(scope="module")
def hf_real() -> Any:
    from transformers import AutoModelForCausalLM

    source = resolve_model(default_model_path())
    model = AutoModelForCausalLM.from_pretrained(source.path, **source.from_pretrained_kwargs())
    return model.eval()  # already float32: GGUF is dequantized on load


@pytest.fixture(scope="module")
def real_llm(hf_real: Any) -> LLM:
    """The engine on the default model, built from the reference model's already loaded weights.

    Parsing and dequantizing the GGUF file is the slowest part of the module (and is
    transformers' code, not ours), so the engine's loader is handed the reference instance
    instead of reading the file a second time. Everything after the read (our model built on
    the meta device, fused weights copied in, tied head, RoPE buffers) runs as in production,
    and the loader must ask for exactly the default checkpoint, offline.
    """
    from transformers import AutoModelForCausalLM

    source = resolve_model(default_model_path())
    calls = []

    def from_pretrained(path: str, **kwargs: Any) -> Any:
        calls.append((path, kwargs))
        return hf_real

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(AutoModelForCausalLM, "from_pretrained", from_pretrained)
        llm = LLM(max_model_len=1024)
    assert calls == [(source.path, {"local_files_only": True, "gguf_file": source.gguf_file})]
    return llm


def test_default_model_is_smollm2(real_llm: LLM) -> None:
    assert os.path.basename(default_model_path()) == "SmolLM2-135M-Instruct.Q4_1.gguf"
    engine = real_llm.llm_engine
    assert engine.model.num_layers == 30 and engine.model.num_kv_heads == 3
    assert engine.dtype == torch.float32


def test_logits_match_hf(real_llm: LLM, hf_real: Any) -> None:
    tokenizer = real_llm.get_tokenizer()
    ids = tokenizer(PROMPTS[4] + " " + PROMPTS[6]).input_ids
    model = real_llm.llm_engine.model
    with torch.no_grad():
        ref = hf_real(torch.tensor([ids])).logits[0]
        got = model.compute_logits(model(torch.tensor(ids), torch.arange(len(ids))))
    torch.testing.assert_close(got, ref, atol=1e-4, rtol=0)


def test_greedy_batch_matches_hf_generate(real_llm: LLM, hf_real: Any) -> None:
    tokenizer = real_llm.get_tokenizer()
    params = SamplingParams(temperature=0.0, max_tokens=MAX_NEW)
    outputs = real_llm.generate(PROMPTS, params, use_tqdm=False)

    identical = 0
    for prompt, output in zip(PROMPTS, outputs):
        ids = tokenizer(prompt).input_ids
        assert output.prompt_token_ids == ids and output.prompt == prompt
        with torch.no_grad():
            ref = hf_real.generate(
                torch.tensor([ids]),
                attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                max_new_tokens=MAX_NEW,
                do_sample=False,
            )[0, len(ids) :].tolist()
        got = output.outputs[0].token_ids
        assert got == ref, f"{prompt!r}: engine {got} != HF {ref}"
        assert output.outputs[0].text == tokenizer.decode(ref, skip_special_tokens=True)
        identical += 1
    assert identical == len(PROMPTS)
    assert "Paris" in outputs[0].outputs[0].text


def test_chat_answers_the_canary(real_llm: LLM) -> None:
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    output = real_llm.chat(messages, SamplingParams(temperature=0.0, max_tokens=24), use_tqdm=False)
    assert "Paris" in output[0].outputs[0].text


def test_cli_prints_answer_blocks_and_hit_rate(
    real_llm: LLM, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import mini_vllm.__main__ as cli
    import mini_vllm.llm

    monkeypatch.setattr(mini_vllm.llm, "LLM", lambda *args, **kwargs: real_llm)
    # A question: the CLI wraps it in the chat template by default (the model is instruct-tuned).
    assert cli.main(["generate", "What is the capital of France?", "--max-tokens", "12"]) == 0
    out = capsys.readouterr().out
    assert "Paris" in out
    assert "KV blocks used:" in out and "prefix cache hit rate:" in out
