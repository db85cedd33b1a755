"""Penalties change which token is greedy; the engine's must be Hugging Face's, token for token.

The repetition penalty is Hugging Face's own ``repetition_penalty``; frequency and presence
penalties (OpenAI's definitions, which Hugging Face lacks) are a logits processor written here
from the definition. Rows with and without penalties share every batch, and under async
scheduling (the default) a request's last output token is still being sampled when its next
step's penalties are counted: the counts must hold the real token, not the placeholder.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from mini_vllm.sampling_params import SamplingParams

from .conftest import SharedEngines, hf_greedy, kv_block_bytes, random_prompts

MAX_NEW = 20
PROMPTS = random_prompts(8, seed=11, min_len=5, max_len=30)
# (presence, frequency, repetition) per prompt; the neutral rows share the batches.
PENALTIES = [
    (0.0, 0.0, 1.3),
    (0.0, 0.0, 1.0),
    (0.0, 1.5, 1.0),
    (1.5, 0.0, 1.0),
    (-0.5, 0.7, 0.8),
    (0.0, 0.0, 1.0),
    (0.4, 0.4, 1.5),
    (2.0, 2.0, 1.2),
]
CONFIGS: dict[str, dict[str, Any]] = {
    "default": {},
    "sync_scheduling": dict(async_scheduling=False),
    "chunked_prefill_8_tokens": dict(max_num_batched_tokens=8, max_num_seqs=3),
    "preemption": dict(max_model_len=64),  # plus a 6-block budget, below
}


class _OutputPenalties:
    """Hugging Face logits processor: OpenAI's frequency and presence penalties, counted over
    the generated tokens only."""

    def __init__(self, prompt_len: int, presence: float, frequency: float) -> None:
        self.prompt_len, self.presence, self.frequency = prompt_len, presence, frequency

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        generated = input_ids[:, self.prompt_len :]
        counts = torch.zeros_like(scores).scatter_add_(
            1, generated, torch.ones_like(generated, dtype=scores.dtype)
        )
        return scores - self.frequency * counts - self.presence * (counts > 0)


def _hf_penalized(hf: Any, prompt: list[int], penalties: tuple[float, float, float]) -> list[int]:
    from transformers import LogitsProcessorList

    presence, frequency, repetition = penalties
    output_penalties = _OutputPenalties(len(prompt), presence, frequency)
    return hf_greedy(
        hf,
        prompt,
        MAX_NEW,
        repetition_penalty=repetition,
        logits_processor=LogitsProcessorList([output_penalties]),
    )


def _engine(config: str, engines: SharedEngines, tiny_llama_dir: Any, hf_tiny_llama: Any) -> Any:
    """The shared float32 engine of one of ``CONFIGS``; "preemption" gets a 6-block cache."""
    kwargs = dict(CONFIGS[config])
    if config == "preemption":
        kwargs["kv_cache_memory_bytes"] = 6 * kv_block_bytes(hf_tiny_llama.config, "float32")
    return engines.get(tiny_llama_dir, dtype="float32", **kwargs)


@pytest.fixture(scope="module")
def references(hf_tiny_llama: Any) -> list[list[int]]:
    return [_hf_penalized(hf_tiny_llama, p, pen) for p, pen in zip(PROMPTS, PENALTIES)]


@pytest.mark.parametrize("config", list(CONFIGS))
def test_penalized_greedy_matches_hf(
    config: str,
    references: list[list[int]],
    engines: SharedEngines,
    tiny_llama_dir: Any,
    hf_tiny_llama: Any,
) -> None:
    llm = _engine(config, engines, tiny_llama_dir, hf_tiny_llama)
    params = [
        SamplingParams(
            temperature=0.0,
            max_tokens=MAX_NEW,
            presence_penalty=presence,
            frequency_penalty=frequency,
            repetition_penalty=repetition,
        )
        for presence, frequency, repetition in PENALTIES
    ]
    outputs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params, use_tqdm=False)
    for i, (out, ref) in enumerate(zip(outputs, references)):
        assert out.outputs[0].token_ids == ref, (
            f"prompt {i} with (presence, frequency, repetition) = {PENALTIES[i]} diverged from "
            "Hugging Face's penalized greedy decoding"
        )
    if config == "preemption":
        assert llm.get_stats().num_preemptions > 0


def test_the_penalties_change_the_tokens(references: list[list[int]], hf_tiny_llama: Any):
    """A control: without its penalties, every penalized prompt decodes differently (else the
    parity above could not tell penalties applied from penalties ignored)."""
    plain = [hf_greedy(hf_tiny_llama, p, MAX_NEW) for p in PROMPTS]
    changed = [i for i, pen in enumerate(PENALTIES) if pen != (0.0, 0.0, 1.0)]
    assert all(plain[i] != references[i] for i in changed), [
        i for i in changed if plain[i] == references[i]
    ]


def test_logit_bias_and_allowed_token_ids(engines: SharedEngines, tiny_llama_dir: Any) -> None:
    """A bias of +100 makes its token every greedy choice; ``allowed_token_ids`` keeps every
    sampled token among its own; both share a batch with a plain request, which they leave
    alone; ids outside the vocabulary are refused when the request is added (upstream's
    ``_validate_logit_bias``, ``_validate_allowed_token_ids``)."""
    llm = engines.get(tiny_llama_dir, dtype="float32")
    prompts = [{"prompt_token_ids": p} for p in PROMPTS[:3]]
    params = [
        SamplingParams(temperature=0.0, max_tokens=8, logit_bias={7: 100.0}),
        SamplingParams(temperature=1.0, seed=3, max_tokens=8, allowed_token_ids=[3, 5, 11]),
        SamplingParams(temperature=0.0, max_tokens=8),
    ]
    biased, allowed, plain = (
        o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)
    )
    assert biased == [7] * 8
    assert set(allowed) <= {3, 5, 11}
    (alone,) = llm.generate(prompts[2:], params[2:], use_tqdm=False)
    assert plain == alone.outputs[0].token_ids
    for bad in (dict(logit_bias={10**6: 1.0}), dict(allowed_token_ids=[-1])):
        with pytest.raises(ValueError, match="outside the vocabulary"):
            llm.generate(prompts[:1], SamplingParams(max_tokens=2, **bad), use_tqdm=False)
    with pytest.raises(ValueError, match="allowed_token_ids is not None and empty"):
        SamplingParams(allowed_token_ids=[])
    with pytest.raises(ValueError, match="allowed_token_ids must hold only ints"):
        SamplingParams(allowed_token_ids=[1, "2"])


def _bad_word_for(prompt: list[int], plain: list[int], length: int) -> list[int]:
    """A word of ``length`` tokens that the plain greedy output says: banning it changes the
    output from there on. One word per prompt, so that no earlier ban keeps a later word from
    being said. Hugging Face matches a word's start against the prompt too, upstream (and
    mini-vLLM) against the output only: the word starts where no prompt token could begin it."""
    start = 2 * length
    while plain[start] in prompt[-2:]:
        start += 1
    return plain[start : start + length]


# Word lengths of the prompts that have one; the other prompts share the batches without.
BAD_WORD_LENGTHS = {0: 1, 2: 2, 4: 3, 6: 2}


@pytest.fixture(scope="module")
def bad_words_references(hf_tiny_llama: Any) -> dict[int, tuple[list[int], list[int]]]:
    """Per prompt with a word: the word, and Hugging Face's greedy output with it banned."""
    references = {}
    for i, length in BAD_WORD_LENGTHS.items():
        plain = hf_greedy(hf_tiny_llama, PROMPTS[i], MAX_NEW)
        word = _bad_word_for(PROMPTS[i], plain, length)
        banned = hf_greedy(hf_tiny_llama, PROMPTS[i], MAX_NEW, bad_words_ids=[word])
        # The control: the ban changes the output, so the parity below tells a word applied
        # from a word ignored.
        assert banned != plain, f"banning {word} left prompt {i}'s output unchanged"
        references[i] = (word, banned)
    return references


@pytest.mark.parametrize("config", list(CONFIGS))
def test_bad_words_match_hf(
    config: str,
    bad_words_references: dict[int, tuple[list[int], list[int]]],
    engines: SharedEngines,
    tiny_llama_dir: Any,
    hf_tiny_llama: Any,
) -> None:
    """Upstream's ``apply_bad_words`` equals Hugging Face's ``bad_words_ids`` on the output: a
    word's last token is banned once the output ends with its other tokens. Under async
    scheduling the token before it is still being sampled when the ban is decided, so it is
    decided on the device (``_bad_words`` in ``worker/sampling_metadata.py``)."""
    llm = _engine(config, engines, tiny_llama_dir, hf_tiny_llama)
    params = [
        SamplingParams(
            temperature=0.0,
            max_tokens=MAX_NEW,
            _bad_words_token_ids=[bad_words_references[i][0]] if i in BAD_WORD_LENGTHS else None,
        )
        for i in range(len(PROMPTS))
    ]
    outputs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params, use_tqdm=False)
    for i, (word, reference) in bad_words_references.items():
        assert outputs[i].outputs[0].token_ids == reference, (
            f"prompt {i} with the bad word {word} diverged from Hugging Face's bad_words_ids"
        )
    if config == "preemption":
        assert llm.get_stats().num_preemptions > 0


def test_bad_words_are_tokenized_as_upstream() -> None:
    """Each word as it is and, when it is another sequence of the same length, after a space
    (its spelling inside a text); empty words and ids outside the vocabulary are refused."""

    class Tokenizer:
        def encode(self, text: str, add_special_tokens: bool) -> list[int]:
            assert not add_special_tokens
            table = {"cat": [5], " cat": [6], "hot dog": [7, 8], " hot dog": [9, 10, 8]}
            return table[text]

    params = SamplingParams(bad_words=["cat", " hot dog"])
    params.update_from_tokenizer(Tokenizer(), vocab_size=11)
    assert params.bad_words_token_ids == [[5], [6], [7, 8]]
    with pytest.raises(ValueError, match="following tokens were specified as bad: \\[5, 6\\]"):
        SamplingParams(bad_words=["cat"]).update_from_tokenizer(Tokenizer(), vocab_size=5)
    with pytest.raises(ValueError, match="bad_words cannot contain an empty string"):
        SamplingParams(bad_words=["cat", ""])
