"""Sample logprobs: the model's own log-softmax, ranked and trimmed per request, through the engine.

The oracle is Hugging Face's forward pass on prompt + output: position ``t``'s logits, put
through ``log_softmax``, must give the logprob the engine reported for output token ``t``, its
rank, and the top-k tokens in order, whatever else the batch holds (greedy and random rows, a
request with more logprobs than another, a request with none, chunked prefills, async steps).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from mini_vllm.logprobs import Logprob, LogprobsLists, LogprobsTensors
from mini_vllm.sample.sampler import Sampler, SamplingMetadata
from mini_vllm.sampling_params import SamplingParams

from .conftest import SharedEngines, kv_block_bytes, random_prompts

MAX_NEW = 12


def _hf_logprobs(hf: Any, prompt: list[int], output: list[int]) -> torch.Tensor:
    """``[len(output), vocab]``: the log-softmax from which each output token was drawn."""
    with torch.no_grad():
        logits = hf(torch.tensor([prompt + output])).logits[0].float()
    return logits[len(prompt) - 1 : len(prompt) - 1 + len(output)].log_softmax(-1)


def _check_against_hf(hf: Any, prompt: list[int], completion: Any, num_logprobs: int) -> None:
    assert completion.logprobs is not None, "asked for logprobs, got none"
    output = completion.token_ids
    assert len(completion.logprobs) == len(output), "one logprobs dict per output token"
    reference = _hf_logprobs(hf, prompt, output)
    cumulative = 0.0
    for t, (token_id, position) in enumerate(zip(output, completion.logprobs)):
        row = reference[t]
        sampled = position[token_id]
        assert sampled.logprob == pytest.approx(row[token_id].item(), abs=1e-4), f"token {t}"
        assert sampled.rank == int((row >= row[token_id]).sum()), f"rank of token {t}"
        top = row.topk(num_logprobs)
        for rank, (value, top_id) in enumerate(zip(top.values, top.indices), 1):
            entry = position[int(top_id)]
            assert entry.rank == rank and entry.logprob == pytest.approx(value.item(), abs=1e-4)
        expected_keys = {token_id, *top.indices.tolist()}
        assert set(position) == expected_keys, f"position {t}: sampled + top-{num_logprobs} only"
        cumulative += sampled.logprob
    assert completion.cumulative_logprob == pytest.approx(cumulative, abs=1e-3)


@pytest.mark.parametrize("async_scheduling", [True, False], ids=["async", "sync"])
def test_logprobs_match_hf_in_a_mixed_batch(
    tiny_llama_dir: Path, hf_tiny_llama: Any, async_scheduling: bool, engines: SharedEngines
) -> None:
    llm = engines.get(
        tiny_llama_dir,
        dtype="float32",
        async_scheduling=async_scheduling,
        max_num_batched_tokens=32,  # chunked prefills in the same steps as decodes
    )
    prompts = random_prompts(6, seed=11, min_len=5, max_len=45)
    wanted = [0, 3, None, 5, 1, None]
    params = [
        SamplingParams(
            temperature=0.0 if i % 2 == 0 else 0.8,
            seed=i,
            max_tokens=MAX_NEW,
            logprobs=k,
            ignore_eos=True,
        )
        for i, k in enumerate(wanted)
    ]
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    for prompt, k, out in zip(prompts, wanted, outputs):
        completion = out.outputs[0]
        if k is None:
            assert completion.logprobs is None and completion.cumulative_logprob is None
            continue
        _check_against_hf(hf_tiny_llama, prompt, completion, k)


def test_only_requests_that_asked_carry_logprob_rows(
    tiny_llama_dir: Path, engines: SharedEngines
) -> None:
    """A batch-mate without ``logprobs`` gets no rows on its per-step output (the engine core
    would otherwise ship them to the front-end every step, for nothing)."""
    engine = engines.get(tiny_llama_dir, dtype="float32").llm_engine
    engine.add_request("asks", {"prompt_token_ids": [1, 2, 3]}, SamplingParams(logprobs=2))
    engine.add_request("silent", {"prompt_token_ids": [4, 5, 6]}, SamplingParams())
    seen: dict[str, list[bool]] = {"asks": [], "silent": []}
    while engine.has_unfinished_requests():
        engine.step()
        for out in engine.last_core_outputs:
            if out.new_token_ids:
                seen[out.request_id].append(out.new_logprobs is not None)
    assert seen["asks"] and all(seen["asks"]), "every step of 'asks' carries its rows"
    assert seen["silent"] and not any(seen["silent"]), "'silent' asked for none: no rows"


def test_logprobs_do_not_change_the_tokens(tiny_llama_dir: Path, engines: SharedEngines) -> None:
    """Computing logprobs reads the logits; it must not touch what is sampled from them."""
    llm = engines.get(tiny_llama_dir, dtype="float32")
    prompts = [{"prompt_token_ids": p} for p in random_prompts(4, seed=12)]

    def run(logprobs: int | None) -> list[list[int]]:
        params = SamplingParams(temperature=1.0, seed=7, max_tokens=MAX_NEW, logprobs=logprobs)
        return [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]

    assert run(None) == run(4)


def test_logprobs_beyond_max_logprobs_are_refused(
    tiny_llama_dir: Path, engines: SharedEngines
) -> None:
    llm = engines.get(tiny_llama_dir, dtype="float32", max_logprobs=3)
    prompt = {"prompt_token_ids": [1, 2, 3]}
    with pytest.raises(ValueError, match="greater than max allowed: 3"):
        llm.generate(prompt, SamplingParams(logprobs=4), use_tqdm=False)
    with pytest.raises(ValueError, match="greater than max allowed"):
        llm.generate(prompt, SamplingParams(logprobs=-1), use_tqdm=False)
    with pytest.raises(ValueError, match="prompt logprobs of 4, which is greater than max allowed"):
        llm.generate(prompt, SamplingParams(prompt_logprobs=4), use_tqdm=False)
    out = llm.generate(prompt, SamplingParams(logprobs=3, max_tokens=2), use_tqdm=False)
    assert all(len(p) in (3, 4) for p in out[0].outputs[0].logprobs)


@pytest.mark.parametrize("bad", [-2, 1.5, False])
def test_sampling_params_refuse_bad_logprobs(bad: Any) -> None:
    """``True`` is upstream's shorthand for 1 (tests/reference/test_request.py); ``False`` is
    refused as any other bool, where upstream would read it as 0 (docs/upstream-fidelity.md)."""
    for name in ("logprobs", "prompt_logprobs"):
        with pytest.raises((ValueError, TypeError), match=name):
            SamplingParams(**{name: bad})


def test_gather_logprobs_puts_the_sampled_token_first_with_its_rank() -> None:
    logits = torch.tensor([[0.0, 3.0, 1.0, 2.0], [5.0, 5.0, -1.0, 0.0]])
    metadata = SamplingMetadata(
        temperature=None, all_greedy=True, all_random=False, top_p=None, top_k=None,
        max_num_logprobs=2,
    )  # fmt: skip
    out = Sampler()(logits, metadata)
    assert out.sampled_token_ids.tolist() == [1, 0]
    lp = out.logprobs_tensors
    assert isinstance(lp, LogprobsTensors)
    assert lp.logprob_token_ids[0].tolist() == [1, 1, 3]
    assert lp.selected_token_ranks.tolist() == [1, 2]  # a tie ranks last among the tied
    expected = logits.log_softmax(-1)
    assert torch.allclose(lp.logprobs[:, 0], expected[[0, 1], [1, 0]])


def test_slice_request_reads_each_requests_own_rows() -> None:
    lists = LogprobsLists([[7], [8], [9]], [[-1.0], [-2.0], [-3.0]], [1, 2, 3], [0, 1, 1, 2])
    assert lists.slice_request(1, 0).logprob_token_ids == []
    assert lists.slice_request(2, 1).logprob_token_ids == [[8]]
    assert lists.slice_request(3, 1).sampled_token_ranks == [3]


def test_logprob_is_upstreams_shape() -> None:
    entry = Logprob(logprob=-0.5, rank=1, decoded_token="a")
    assert (entry.logprob, entry.rank, entry.decoded_token) == (-0.5, 1, "a")


# Scheduler configurations the prompt logprobs must survive: chunks of 8 tokens score a prompt
# over several steps; a 6-block cache preempts requests, which then compute their prompt again.
PROMPT_CONFIGS: dict[str, dict[str, Any]] = {
    "default": {},
    "sync_scheduling": dict(async_scheduling=False),
    "chunked_prefill_8_tokens": dict(max_num_batched_tokens=8, max_num_seqs=3),
    "preemption": dict(max_model_len=64),  # plus a 6-block budget, below
}


@pytest.mark.parametrize("config", list(PROMPT_CONFIGS))
def test_prompt_logprobs_match_hf(
    config: str, tiny_llama_dir: Path, hf_tiny_llama: Any, engines: SharedEngines
) -> None:
    """``prompt_logprobs``: for each prompt token but the first, its logprob, rank and the best
    ``k`` from Hugging Face's forward pass over the prompt (upstream: ``None`` for the first);
    rows without it in the same batches get none, and its requests read no cached prefix."""
    kwargs = dict(PROMPT_CONFIGS[config])
    if config == "preemption":
        kwargs["kv_cache_memory_bytes"] = 6 * kv_block_bytes(hf_tiny_llama.config, "float32")
    llm = engines.get(tiny_llama_dir, dtype="float32", **kwargs)
    prompts = random_prompts(6, seed=21, min_len=5, max_len=30)
    wanted = [2, None, 0, 4, None, 3]
    params = [
        SamplingParams(temperature=0.0, max_tokens=20, prompt_logprobs=k, ignore_eos=True)
        for k in wanted
    ]
    for attempt in range(2):  # the second time the prompts are cached
        outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        for prompt, k, out in zip(prompts, wanted, outputs):
            if k is None:
                assert out.prompt_logprobs is None
                continue
            assert out.prompt_logprobs is not None and out.prompt_logprobs[0] is None
            assert len(out.prompt_logprobs) == len(prompt), "one entry per prompt token"
            assert attempt == 0 or out.num_cached_tokens == 0, "read a cached prefix"
            with torch.no_grad():
                reference = hf_tiny_llama(torch.tensor([prompt])).logits[0].float().log_softmax(-1)
            for j in range(1, len(prompt)):
                position, row = out.prompt_logprobs[j], reference[j - 1]
                assert position is not None
                token = position[prompt[j]]
                assert token.logprob == pytest.approx(row[prompt[j]].item(), abs=1e-4), j
                assert token.rank == int((row >= row[prompt[j]]).sum()), f"rank at {j}"
                assert set(position) == {prompt[j], *row.topk(k).indices.tolist()}, j
    if config == "preemption":
        assert llm.get_stats().num_preemptions > 0
