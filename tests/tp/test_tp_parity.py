"""Tensor parallelism changes where the arithmetic runs, not what it computes.

A tiny random Llama with 8 query and 2 KV heads runs on one rank (in-process) and on 2 and 4
worker processes over gloo; greedy outputs must agree token for token, through chunked prefill
(a 32-token step budget cuts the longer prompts), prefix-cache hits (two prompts share a
prefix) and, on TP=4, KV heads replicated on two ranks each. Seeded sampling must agree too:
every rank samples from the same all-gathered logits with the same generators.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from mini_vllm.executor.multiproc_executor import MultiprocExecutor
from mini_vllm.llm import LLM
from mini_vllm.sampling_params import SamplingParams
from mini_vllm.worker import kv_sizing
from tests.tp.conftest import process_gone

ENGINE_KWARGS = dict(skip_tokenizer_init=True, max_model_len=128, max_num_batched_tokens=32)
GREEDY = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)


def _prompts() -> list[list[int]]:
    gen = torch.Generator().manual_seed(7)
    prompts = [torch.randint(0, 250, (n,), generator=gen).tolist() for n in (3, 11, 40, 57)]
    prompts.append([*prompts[3][:48], 5, 6, 7])  # shares three blocks with the previous one
    return prompts


def _tokens(outputs) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in outputs]


LOGPROBS = SamplingParams(
    temperature=0, max_tokens=6, ignore_eos=True, logprobs=3, prompt_logprobs=2
)


def _logprobs(outputs) -> list[tuple[int, int | None, float]]:
    """Every (token, rank, logprob) entry of every prompt position (the first has none) and then
    every output position of every request, in order."""
    entries = []
    for o in outputs:
        positions = [*(o.prompt_logprobs or [None])[1:], *o.outputs[0].logprobs]
        entries += [(t, lp.rank, lp.logprob) for pos in positions for t, lp in pos.items()]
    return entries


@pytest.fixture(scope="module")
def reference(tiny_tp_dir: Path) -> dict[str, list[list[int]]]:
    llm = LLM(str(tiny_tp_dir), **ENGINE_KWARGS)
    # One rank is the single-process engine of phase 05: no worker, no process group.
    assert multiprocessing.active_children() == []
    assert not isinstance(llm.llm_engine.model_runner, MultiprocExecutor)
    prompts = _prompts()
    seeded = [SamplingParams(temperature=0.8, top_p=0.9, seed=i, max_tokens=12) for i in range(5)]
    return {
        "greedy": _tokens(llm.generate(prompts, GREEDY, use_tqdm=False)),
        "seeded": _tokens(llm.generate(prompts, seeded, use_tqdm=False)),
        "logprobs": _logprobs(llm.generate(prompts[:2], LOGPROBS, use_tqdm=False)),
        "block_bytes": [llm.llm_engine.model_runner.kv_cache_block_bytes],
    }


@pytest.fixture(scope="module")
def tp2(tiny_tp_dir: Path) -> Iterator[LLM]:
    llm = LLM(str(tiny_tp_dir), tensor_parallel_size=2, **ENGINE_KWARGS)
    yield llm
    llm.llm_engine.shutdown()


def test_tp2_greedy_equals_tp1(reference, tp2: LLM) -> None:
    assert _tokens(tp2.generate(_prompts(), GREEDY, use_tqdm=False)) == reference["greedy"]
    assert tp2.get_stats().prefix_cache_hits > 0  # the shared prefix was served from cache


def test_tp2_seeded_sampling_equals_tp1(reference, tp2: LLM) -> None:
    seeded = [SamplingParams(temperature=0.8, top_p=0.9, seed=i, max_tokens=12) for i in range(5)]
    assert _tokens(tp2.generate(_prompts(), seeded, use_tqdm=False)) == reference["seeded"]


def test_tp2_logprobs_equal_tp1(reference, tp2: LLM) -> None:
    """Rank 0's sampler output travels back with its logprob rows, prompt logprobs included;
    they match one rank's."""
    got = _logprobs(tp2.generate(_prompts()[:2], LOGPROBS, use_tqdm=False))
    want = reference["logprobs"]
    assert [entry[:2] for entry in got] == [entry[:2] for entry in want]  # tokens and ranks
    assert [entry[2] for entry in got] == pytest.approx([entry[2] for entry in want], abs=1e-4)


def test_tp2_kv_cache_holds_one_kv_head_per_rank(reference, tp2: LLM) -> None:
    executor = tp2.llm_engine.model_runner
    assert isinstance(executor, MultiprocExecutor)
    assert [(i["num_heads"], i["num_kv_heads"]) for i in executor.worker_info] == [(4, 1)] * 2
    # 2 layers x (K and V) x 1 head x 8 dims x 4 bytes x 16 tokens
    expected = kv_sizing.bytes_per_block_per_rank(16, 2, 2, 8, "float32", 2)
    assert executor.kv_cache_block_bytes == expected == 2 * 2 * 1 * 8 * 4 * 16
    assert expected * 2 == reference["block_bytes"][0]  # half the one-rank block
    assert tp2.llm_engine.model is None  # the engine process holds no weights


def test_tp4_replicates_kv_heads_and_equals_tp1(reference, tiny_tp_dir: Path) -> None:
    """4 ranks, 2 KV heads: ranks 0-1 hold KV head 0, ranks 2-3 KV head 1.

    Also the paths the TP=2 engine does not take: synchronous scheduling (the executor's
    blocking call), ``max_model_len=-1`` fitted to an 8-block cache (the workers follow the
    engine's new length), and preemption (8 blocks cannot hold the five requests at once).
    """
    kwargs = {**ENGINE_KWARGS, "max_model_len": -1, "kv_cache_memory_bytes": 8 * 2048}
    llm = LLM(str(tiny_tp_dir), tensor_parallel_size=4, async_scheduling=False, **kwargs)
    try:
        executor = llm.llm_engine.model_runner
        assert [(i["num_heads"], i["num_kv_heads"]) for i in executor.worker_info] == [(2, 1)] * 4
        # replication: the per-rank block is no smaller than with 2 ranks
        assert (
            executor.kv_cache_block_bytes
            == 2048
            == kv_sizing.bytes_per_block_per_rank(16, 2, 2, 8, 4, 2)
        )
        assert llm.llm_engine.max_model_len == 7 * 16  # 8 blocks, minus the null block
        assert _tokens(llm.generate(_prompts(), GREEDY, use_tqdm=False)) == reference["greedy"]
        assert llm.get_stats().num_preemptions > 0
        pids = executor.worker_pids
    finally:
        llm.llm_engine.shutdown()
    assert all(process_gone(pid) for pid in pids)


def test_the_cli_takes_the_size() -> None:
    from mini_vllm.__main__ import build_parser

    args = build_parser().parse_args(["generate", "hi", "--tensor-parallel-size", "3"])
    assert args.tensor_parallel_size == 3
    assert build_parser().parse_args(["generate", "hi"]).tensor_parallel_size == 1


def test_workers_profile_on_request(tp2: LLM) -> None:
    """``Worker.profile`` (upstream's name) starts and stops a profiler on every rank.

    On a CPU there are no device kernels, so each rank's table is empty; the GPU test
    (``test_tp_nccl.py``) checks that it holds the NCCL kernels.
    """
    executor = tp2.llm_engine.model_runner
    assert executor.collective_rpc("profile", args=(True,)) == [None, None]
    tp2.generate(_prompts()[:1], GREEDY, use_tqdm=False)
    assert executor.collective_rpc("profile", args=(False,)) == [{}, {}]


def test_kernel_profiler_refuses_misuse() -> None:
    from mini_vllm.worker.profiler import KernelProfiler

    profiler = KernelProfiler()
    with pytest.raises(RuntimeError, match="not running"):
        profiler.stop()
    profiler.start()
    with pytest.raises(RuntimeError, match="already running"):
        profiler.start()
    assert profiler.stop() == {}
