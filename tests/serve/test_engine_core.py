"""``EngineCore`` in-process: what the busy loop runs, without sockets.

The core loads no tokenizer (text is the front-end's), so the EOS id it stops on is the one each
request brings from the front-end's tokenizer, as upstream's ``EngineCoreRequest.eos_token_id``.
"""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from mini_vllm.engine import EngineCoreEventType
from mini_vllm.engine.core import (
    EngineCore,
    EngineCoreOutput,
    EngineCoreRequest,
    EngineCoreSamplingParams,
)
from mini_vllm.engine.llm_engine import EngineArgs
from tests.serve.conftest import TINY_KV_BYTES, TINY_MAX_MODEL_LEN

PROMPT = [1, 17, 230, 41, 9]


@pytest.fixture(scope="module")
def core(tiny_serve_dir: Path) -> EngineCore:
    return EngineCore(
        EngineArgs(
            model=str(tiny_serve_dir),
            max_model_len=TINY_MAX_MODEL_LEN,
            kv_cache_memory_bytes=TINY_KV_BYTES,
            device="cpu",
        )
    )


def _run(core: EngineCore, request: EngineCoreRequest) -> list:
    assert core.add_request(request) is None
    outputs = []
    while core.has_unfinished_requests():
        outputs += [out for out in core.step() if out.request_id == request.request_id]
    return outputs


def test_the_core_loads_no_tokenizer(core):
    assert core.engine.tokenizer is None


def test_the_core_stops_on_the_eos_the_request_brings(core):
    greedy = EngineCoreSamplingParams(temperature=0.0, max_tokens=4)
    free = _run(core, EngineCoreRequest("free", PROMPT, greedy, eos_token_id=None))
    tokens = [t for out in free for t in out.new_token_ids]
    assert len(tokens) == 4, "without its EOS among them, the request runs to max_tokens"
    # The front-end says the model's first greedy token is the EOS: it must stop right there.
    stopped = _run(core, EngineCoreRequest("eos", PROMPT, greedy, eos_token_id=tokens[0]))
    assert [t for out in stopped for t in out.new_token_ids] == tokens[:1]
    assert stopped[-1].finish_reason == "stop"


def test_priority_orders_admission_under_the_priority_policy(tiny_serve_dir):
    """The request's ``priority`` crosses the wire and the core's scheduler orders by it; one
    sequence at a time, so the order of first tokens is the order of admission."""
    core = EngineCore(
        EngineArgs(
            model=str(tiny_serve_dir),
            max_model_len=TINY_MAX_MODEL_LEN,
            kv_cache_memory_bytes=TINY_KV_BYTES,
            device="cpu",
            max_num_seqs=1,
            scheduling_policy="priority",
        )
    )
    params = EngineCoreSamplingParams(temperature=0.0, max_tokens=2)
    arrivals = [("late-but-urgent", 0), ("first-but-low", 5)][::-1]
    for number, (request_id, priority) in enumerate(arrivals):
        wire = msgspec.msgpack.encode(
            EngineCoreRequest(request_id, PROMPT, params, arrival_time=1.0 + number,
                              priority=priority)
        )  # fmt: skip
        assert core.add_request(msgspec.msgpack.decode(wire, type=EngineCoreRequest)) is None
    started: list[str] = []
    while core.has_unfinished_requests():
        for out in core.step():
            if out.new_token_ids and out.request_id not in started:
                started.append(out.request_id)
    assert started == ["late-but-urgent", "first-but-low"], (
        "under --scheduling-policy priority the smaller priority is admitted first, whatever "
        "arrived earlier (phase 03, the priority policy)"
    )


def _wire(outputs: list[EngineCoreOutput]) -> list[EngineCoreOutput]:
    """The outputs as the front-end decodes them (events included)."""
    return msgspec.msgpack.decode(msgspec.msgpack.encode(outputs), type=list[EngineCoreOutput])


def test_the_first_output_carries_the_requests_stamps(core):
    """QUEUED (at ``add_request``) and SCHEDULED (at its first schedule) reach the front-end on
    the request's first output, in that order, with the prefix-cache hits of that schedule;
    later outputs carry none. The front-end's queue, prefill and decode times are made of them
    (upstream's ``EngineCoreEvent``; phase 06, metrics)."""
    prompt = [(7 * i) % 200 + 3 for i in range(40)]  # 2 full blocks of 16, then 8 tokens
    greedy = EngineCoreSamplingParams(temperature=0.0, max_tokens=3)
    for request_id, hits in (("cold", 0), ("warm", 32)):
        outputs = _wire(_run(core, EngineCoreRequest(request_id, prompt, greedy)))
        first, *later = outputs
        assert first.events is not None, "the first output must carry QUEUED and SCHEDULED"
        assert [e.type for e in first.events] == [
            EngineCoreEventType.QUEUED,
            EngineCoreEventType.SCHEDULED,
        ]
        assert first.events[0].timestamp <= first.events[1].timestamp
        assert first.num_cached_tokens == hits, "the second run finds both full blocks cached"
        assert all(out.events is None and out.num_cached_tokens == 0 for out in later)
    assert not core._events and not core._num_cached_tokens, "stamps left behind"


def test_an_aborted_request_leaves_no_stamps(core):
    params = EngineCoreSamplingParams(temperature=0.0, max_tokens=3)
    assert core.add_request(EngineCoreRequest("gone", PROMPT, params)) is None
    core.abort_requests(["gone"])
    assert "gone" not in core._events


def test_a_preemption_is_stamped(tiny_serve_dir):
    """A request the scheduler preempts carries PREEMPTED on its next output (upstream counts
    it; the front-end's phases ignore the second SCHEDULED of a resume)."""
    core = EngineCore(
        EngineArgs(
            model=str(tiny_serve_dir),
            max_model_len=128,
            num_gpu_blocks_override=9,  # 8 usable blocks of 16: two requests of 100 outgrow them
            device="cpu",
            enable_prefix_caching=False,
        )
    )
    params = EngineCoreSamplingParams(temperature=0.0, max_tokens=60, ignore_eos=True)
    for request_id in ("a", "b"):
        assert core.add_request(EngineCoreRequest(request_id, PROMPT * 8, params)) is None
    events: list[EngineCoreEventType] = []
    while core.has_unfinished_requests():
        for out in _wire(core.step()):
            events += [e.type for e in out.events or ()]
    assert EngineCoreEventType.PREEMPTED in events
    assert events.count(EngineCoreEventType.QUEUED) == 2
    assert not core._events


def _prompt_logprob_runs(core: EngineCore, prompts: dict[str, list[int]], **params) -> dict:
    """Every request's outputs (as the front-end decodes them), run together to the end."""
    sampling = EngineCoreSamplingParams(temperature=0.0, prompt_logprobs=2, **params)
    for request_id, prompt in prompts.items():
        assert core.add_request(EngineCoreRequest(request_id, prompt, sampling)) is None
    outputs: dict[str, list[EngineCoreOutput]] = {request_id: [] for request_id in prompts}
    while core.has_unfinished_requests():
        for out in _wire(core.step()):
            outputs[out.request_id].append(out)
    return outputs


def _assert_sent_once(outputs: list[EngineCoreOutput], expected, where: str) -> None:
    first, *later = outputs
    assert first.new_token_ids, "the first output is the request's first token"
    assert first.new_prompt_logprobs is not None, (
        f"{where}: the prompt's logprobs must ride on the request's first output"
    )
    assert all(out.new_prompt_logprobs is None for out in later), (
        f"{where}: the prompt's logprobs are sent once (a repeat would show the prompt twice)"
    )
    rows = first.new_prompt_logprobs
    assert rows.logprob_token_ids == expected.logprob_token_ids, where
    assert rows.sampled_token_ranks == expected.sampled_token_ranks, where
    for got, want in zip(rows.logprobs, expected.logprobs, strict=True):
        assert got == pytest.approx(want, abs=1e-5), where


def test_prompt_logprobs_ride_on_the_first_output(tiny_serve_dir):
    """A prompt scored in several prefill chunks (16 tokens a step) reaches the front-end whole,
    once, with the first token, as upstream's ``new_prompt_logprobs_tensors``; the same rows
    as one chunk gives. Preempted requests recompute their prompt, and send it once still."""
    prompt = [(7 * i) % 200 + 3 for i in range(40)]

    def core_with(**overrides) -> EngineCore:
        args = dict(model=str(tiny_serve_dir), max_model_len=128, device="cpu")
        return EngineCore(EngineArgs(**{**args, **overrides}))

    whole = _prompt_logprob_runs(core_with(), {"whole": prompt}, max_tokens=3)["whole"]
    expected = whole[0].new_prompt_logprobs
    assert expected is not None and len(expected.sampled_token_ranks) == len(prompt) - 1, (
        "one row per prompt token but the first"
    )
    assert all(len(ids) in (3, 4) for ids in expected.logprob_token_ids), "token, then 2 best"
    chunked = core_with(max_num_batched_tokens=16, long_prefill_token_threshold=16)
    runs = _prompt_logprob_runs(chunked, {"chunked": prompt}, max_tokens=3)
    _assert_sent_once(runs["chunked"], expected, "a 40-token prompt in chunks of 16")
    # 8 usable blocks of 16 for two requests of 100 tokens: one is preempted and recomputed.
    crowded = core_with(num_gpu_blocks_override=9, enable_prefix_caching=False)
    long_prompt = PROMPT * 8
    alone = _prompt_logprob_runs(core_with(), {"alone": long_prompt}, max_tokens=2)["alone"]
    runs = _prompt_logprob_runs(
        crowded, {"a": long_prompt, "b": long_prompt}, max_tokens=60, ignore_eos=True
    )
    assert crowded.engine.stats.num_preemptions > 0, "the case needs a preemption"
    for request_id, outputs in runs.items():
        _assert_sent_once(outputs, alone[0].new_prompt_logprobs, f"preempted run {request_id}")
    assert not crowded.engine.last_prompt_logprobs
