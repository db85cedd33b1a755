"""Greedy generation equals Hugging Face's, token for token, whatever the engine does meanwhile.

Each configuration below changes *how* the engine gets to the tokens (prefix-cache hits skip
work, small budgets chunk prompts across steps, a tiny KV cache forces preemption and recompute,
odd block sizes move block boundaries), never *which* tokens: all must reproduce
``transformers``' ``generate(do_sample=False)`` exactly.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

from mini_vllm.llm import LLM
from mini_vllm.sampling_params import SamplingParams

from .conftest import ON_CUDA, TINY_VOCAB, SharedEngines, hf_greedy, kv_block_bytes, random_prompts

MAX_NEW = 24
MODELS = ["tiny_llama", "tiny_llama3"]


def _prompts() -> list[list[int]]:
    prompts = random_prompts(10, seed=3)
    base = random_prompts(1, seed=4, min_len=37, max_len=37)[0]
    # Shared prefixes (more than two blocks) so that prefix caching has something to hit.
    return [*prompts, [*base, 1, 2, 3], [*base, 4, 5], base[:33]]


PROMPTS = _prompts()


@pytest.fixture(scope="module")
def references(request: pytest.FixtureRequest) -> dict[str, list[list[int]]]:
    refs = {}
    for name in MODELS:
        hf = request.getfixturevalue(f"hf_{name}")
        refs[name] = [hf_greedy(hf, p, MAX_NEW) for p in PROMPTS]
    return refs


CONFIGS: dict[str, dict[str, Any]] = {
    "default": {},
    "no_prefix_caching": dict(enable_prefix_caching=False),
    "chunked_prefill_16_tokens": dict(max_num_batched_tokens=16, max_num_seqs=4),
    "no_chunked_prefill": dict(
        enable_chunked_prefill=False, max_model_len=128, max_num_batched_tokens=128
    ),
    "block_size_1": dict(block_size=1, max_model_len=128),
    "block_size_5_long_prefill_threshold": dict(block_size=5, long_prefill_token_threshold=7),
    "preemption": dict(max_model_len=128),  # plus a 10-block budget, below
    # The engine schedules asynchronously by default (upstream's default); the plain loop too:
    "sync_scheduling": dict(async_scheduling=False),
    "preemption_sync_scheduling": dict(max_model_len=128, async_scheduling=False),
    # Admission on the first chunk (upstream's option; the gate is on by default).
    "preemption_no_admission_gate": dict(max_model_len=128, scheduler_reserve_full_isl=False),
    # Priorities (below) reorder admission and pick other victims: the tokens stay the same.
    "preemption_priority_policy": dict(max_model_len=128, scheduling_policy="priority"),
}
if ON_CUDA:
    # Decode steps outside CUDA graphs (a CPU has none, so there it would repeat "default").
    CONFIGS["enforce_eager"] = dict(enforce_eager=True)

# float32 everywhere: on a GPU "auto" would pick bfloat16, which no float32 reference matches.
DTYPE = "float32"


def _make_llm(engines: SharedEngines, path: Path, hf: Any, config: str) -> LLM:
    """The engine of one configuration, shared by every test that asks for it."""
    kwargs = dict(CONFIGS[config])
    if config.startswith("preemption"):
        # 10 blocks: the null block plus 9, enough for one 128-token request but far from
        # the ~50 blocks the 13 prompts want at once.
        kwargs["kv_cache_memory_bytes"] = 10 * kv_block_bytes(hf.config, DTYPE)
    return engines.get(path, dtype=DTYPE, **kwargs)


@pytest.mark.parametrize("config", list(CONFIGS))
@pytest.mark.parametrize("model", MODELS)
def test_greedy_matches_hf(
    model: str,
    config: str,
    references: dict[str, list[list[int]]],
    engines: SharedEngines,
    request: pytest.FixtureRequest,
) -> None:
    path = request.getfixturevalue(f"{model}_dir")
    hf = request.getfixturevalue(f"hf_{model}")
    llm = _make_llm(engines, path, hf, config)
    params = SamplingParams(temperature=0.0, max_tokens=MAX_NEW)
    priority = None
    if CONFIGS[config].get("scheduling_policy") == "priority":
        priority = [(5 * i) % 3 - 1 for i in range(len(PROMPTS))]
    outputs = llm.generate(
        [{"prompt_token_ids": p} for p in PROMPTS], params, use_tqdm=False, priority=priority
    )

    assert [o.prompt_token_ids for o in outputs] == PROMPTS  # input order
    for i, (out, ref) in enumerate(zip(outputs, references[model])):
        assert out.outputs[0].token_ids == ref, f"prompt {i} diverged from Hugging Face"
        assert out.finished and out.outputs[0].finish_reason == "length"

    stats = llm.get_stats()
    if config.startswith("preemption"):
        assert stats.num_preemptions > 0
        assert stats.kv_blocks_used_peak <= 9
    else:
        assert stats.num_preemptions == 0
    if CONFIGS[config].get("enable_prefix_caching", True):
        assert stats.prefix_cache_hits > 0
    else:
        assert stats.prefix_cache_queries == 0
    assert stats.num_generation_tokens == MAX_NEW * len(PROMPTS)


# Prompts with no shared prefix, then the three that share one: interpreted kernels are slow,
# so the Triton path gets a subset that still holds prefix hits, chunks and preemptions.
TRITON_PROMPTS = [0, 1, 2, 10, 11, 12]


@pytest.mark.parametrize(
    ("model", "config"),
    [
        ("tiny_llama", "default"),
        ("tiny_llama3", "chunked_prefill_16_tokens"),
        ("tiny_llama", "preemption"),
    ],
)
def test_greedy_matches_hf_through_the_triton_kernels(
    model: str,
    config: str,
    references: dict[str, list[list[int]]],
    engines: SharedEngines,
    request: pytest.FixtureRequest,
) -> None:
    """The GPU attention path (Triton cache write, decode kernel, varlen kernel for steps that
    hold a prefill) gives the same tokens; without a GPU it runs in Triton's interpreter."""
    pytest.importorskip("triton")
    path = request.getfixturevalue(f"{model}_dir")
    hf = request.getfixturevalue(f"hf_{model}")
    llm = _make_llm(engines, path, hf, config)
    runner = llm.llm_engine.model_runner
    if ON_CUDA:
        # A GPU engine takes the Triton path (and captures decode graphs) by itself.
        assert runner.use_triton and runner.cudagraph_batch_sizes
    params = SamplingParams(temperature=0.0, max_tokens=MAX_NEW)
    prompts = [{"prompt_token_ids": PROMPTS[i]} for i in TRITON_PROMPTS]
    # On a CPU: interpreted (tests/conftest.py), on the shared engine, put back afterwards.
    use_triton, runner.use_triton = runner.use_triton, True
    try:
        outputs = llm.generate(prompts, params, use_tqdm=False)
    finally:
        runner.use_triton = use_triton
    for i, out in zip(TRITON_PROMPTS, outputs):
        assert out.outputs[0].token_ids == references[model][i], f"prompt {i} diverged from HF"
    stats = llm.get_stats()
    assert (stats.num_preemptions > 0) == (config == "preemption")
    assert stats.prefix_cache_hits > 0


def test_second_batch_hits_the_prefix_cache(
    tiny_llama_dir: Path, references: dict[str, list[list[int]]], engines: SharedEngines
) -> None:
    llm = engines.get(tiny_llama_dir, dtype=DTYPE)
    params = SamplingParams(temperature=0.0, max_tokens=MAX_NEW)
    prompts = [{"prompt_token_ids": p} for p in PROMPTS]
    first = llm.generate(prompts, params, use_tqdm=False)
    hits_before = llm.get_stats().prefix_cache_hits
    again = llm.generate(prompts, params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in again] == references["tiny_llama"]
    assert llm.get_stats().prefix_cache_hits > hits_before
    # Every full block of the prompt is cached now (the last token is always recomputed).
    for out in again:
        n = len(out.prompt_token_ids)
        assert out.num_cached_tokens == (n - 1) // 16 * 16
    # Ids count on from the first batch's, in input order (the engine is shared: not from 0).
    first_ids = [int(o.request_id) for o in first]
    assert first_ids == list(range(first_ids[0], first_ids[0] + len(PROMPTS)))
    assert [int(o.request_id) for o in again] == [i + len(PROMPTS) for i in first_ids]


def test_cache_salt_separates_the_prefix_cache(
    tiny_llama_dir: Path, engines: SharedEngines
) -> None:
    """A salted prompt shares blocks only with prompts of the same salt (upstream's
    multi-tenant guard, phases/02-paged-attention/INTERVIEW.md question 14); the outputs do not
    change."""
    llm = engines.get(tiny_llama_dir, dtype=DTYPE)
    params = SamplingParams(temperature=0.0, max_tokens=2)
    tokens = [(7 * i) % 120 + 3 for i in range(40)]  # two full blocks and a part
    llm.reset_prefix_cache()

    def run(**salt: str) -> tuple[int, list[int]]:
        (out,) = llm.generate([{"prompt_token_ids": tokens, **salt}], params, use_tqdm=False)
        return out.num_cached_tokens, list(out.outputs[0].token_ids)

    cached, first = run(cache_salt="tenant-a")
    assert cached == 0
    assert run(cache_salt="tenant-b") == (0, first), "blocks were shared across salts"
    assert run() == (0, first), "an unsalted prompt found blocks cached under a salt"
    assert run(cache_salt="tenant-a") == (32, first), "a salt did not find its own blocks"
    assert run() == (32, first), "unsalted prompts stopped sharing blocks"


def test_stop_tokens_and_max_tokens(
    tiny_llama_dir: Path, references: dict[str, list[list[int]]], engines: SharedEngines
) -> None:
    llm = engines.get(tiny_llama_dir, dtype=DTYPE)
    ref = references["tiny_llama"][0]
    stop = ref[5]
    first = ref.index(stop)
    out = llm.generate(
        {"prompt_token_ids": PROMPTS[0]},
        SamplingParams(temperature=0.0, max_tokens=MAX_NEW, stop_token_ids=[stop]),
        use_tqdm=False,
    )[0].outputs[0]
    assert out.token_ids == ref[: first + 1]  # the stop token is kept
    assert out.finish_reason == "stop" and out.stop_reason == stop
    short = llm.generate(PROMPTS[0], SamplingParams(temperature=0.0, max_tokens=3), use_tqdm=False)[
        0
    ].outputs[0]
    assert short.token_ids == ref[:3] and short.finish_reason == "length"


def test_async_and_sync_scheduling_agree_on_stops_seeds_and_lengths(
    tiny_llama_dir: Path, monkeypatch: pytest.MonkeyPatch, engines: SharedEngines
) -> None:
    """Async scheduling launches each step before the previous one's tokens are known. Requests
    that stop on a token (not on their length) were then launched once more, and that step's
    token for them must be discarded; seeded sampling, min_tokens, stop tokens and max_tokens
    must come out as without it."""
    from mini_vllm.core.sched.async_scheduler import AsyncScheduler

    discarded: list[str] = []
    original = AsyncScheduler.update_from_output

    def spy(self: Any, scheduler_output: Any, sampled_token_ids: Any) -> Any:
        for req_id, tokens in sampled_token_ids.items():
            request = self.requests.get(req_id)
            if tokens and (request is None or request.is_finished()):
                discarded.append(req_id)
        return original(self, scheduler_output, sampled_token_ids)

    monkeypatch.setattr(AsyncScheduler, "update_from_output", spy)
    prompts = [{"prompt_token_ids": p} for p in PROMPTS]
    params = [
        SamplingParams(
            temperature=0.8,
            seed=i,
            max_tokens=5 + 3 * i,
            # Every 7th id of the tiny vocabulary stops: stops come early, often before
            # min_tokens, which must then mask them in both modes alike.
            stop_token_ids=list(range(0, TINY_VOCAB, 7)),
            min_tokens=2 * (i % 3),
        )
        for i in range(len(PROMPTS))
    ]
    results = {}
    for mode in (False, True):
        # The parity tests' "sync_scheduling" and "default" engines (the patch is on the class).
        llm = engines.get(tiny_llama_dir, dtype=DTYPE, async_scheduling=mode)
        outputs = llm.generate(prompts, params, use_tqdm=False)
        results[mode] = [(o.outputs[0].token_ids, o.outputs[0].finish_reason) for o in outputs]
    assert results[True] == results[False]
    assert any(reason == "stop" for _, reason in results[True])  # stops were exercised
    assert discarded, "no stopped request was launched once more: the test lost its point"


def test_async_request_stopping_on_eos_while_preempted(
    tiny_llama_dir: Path, hf_tiny_llama: Any, tmp_path: Path
) -> None:
    """Issue #21 through the real engine: a KV cache of the null block plus 2 blocks of 4 tokens,
    two 4-token prompts. The engine plans step 1 before step 0's tokens are in; A's 5th token
    needs a second block, so B is preempted; then step 0's token for B is EOS, so B stops while
    preempted. It must leave the waiting queue: before the fix it stayed there, finished, and
    the engine's next schedule() raised once A had freed its blocks."""
    prompt_a, prompt_b = [0, 1, 2, 3], [10, 11, 12, 13]
    ref_a = hf_greedy(hf_tiny_llama, prompt_a, 4)
    eos = hf_greedy(hf_tiny_llama, prompt_b, 1)[0]
    assert eos not in ref_a, "A would stop on the EOS too: pick other prompts"
    # The same weights, with B's first greedy token declared the checkpoint's EOS.
    path = tmp_path / "tiny_llama_eos"
    shutil.copytree(tiny_llama_dir, path)
    for name in ("config.json", "generation_config.json"):
        config = json.loads((path / name).read_text())
        config["eos_token_id"] = eos
        (path / name).write_text(json.dumps(config))

    # Its own engine: no other test uses this checkpoint, and the 3-block cache is the point.
    llm = LLM(
        str(path),
        skip_tokenizer_init=True,
        dtype=DTYPE,
        block_size=4,
        max_model_len=8,
        kv_cache_memory_bytes=3 * kv_block_bytes(hf_tiny_llama.config, DTYPE, block_size=4),
    )
    engine = llm.llm_engine
    assert engine.args.async_scheduling and engine.num_gpu_blocks == 3
    params = SamplingParams(temperature=0.0, max_tokens=4)
    outputs = llm.generate(
        [{"prompt_token_ids": prompt_a}, {"prompt_token_ids": prompt_b}], params, use_tqdm=False
    )
    a, b = (o.outputs[0] for o in outputs)
    assert (a.token_ids, a.finish_reason) == (ref_a, "length")
    assert (b.token_ids, b.finish_reason) == ([eos], "stop")
    assert llm.get_stats().num_preemptions == 1
    assert not engine.has_unfinished_requests() and not engine.scheduler.waiting
    assert engine.kv_cache_manager.block_pool.get_num_free_blocks() == 2


def test_warm_up_step_writes_nothing_to_the_cache(
    tiny_llama_dir: Path, engines: SharedEngines
) -> None:
    """The dummy step run at startup (it compiles the kernels before the first request needs
    them) must leave every cache slot as it was: its tokens go to slot -1."""
    llm = engines.get(tiny_llama_dir, dtype=DTYPE)
    runner = llm.llm_engine.model_runner
    assert runner.kv_cache is not None
    saved = runner.kv_cache.clone()  # the engine is shared: its cache is put back afterwards
    try:
        runner.kv_cache.normal_()
        before = runner.kv_cache.clone()
        runner.warm_up_model()
        assert torch.equal(runner.kv_cache, before), "the warm-up step wrote into the KV cache"
    finally:
        runner.kv_cache.copy_(saved)
