"""Tensor parallelism over NCCL on two GPUs: the same tokens as one GPU, collectives in graphs.

The gloo tests (``test_tp_parity.py``) prove the sharding on a CPU; this file is the GPU half of
phase 07's proof, run by ``make test-gpu`` on a host with at least two CUDA devices (it skips,
saying so, everywhere else). The tiny random Llama of the gloo tests runs in float32 on
``cuda:0`` as one rank, then on ``cuda:0`` and ``cuda:1`` as two ranks joined by NCCL, with the
decode steps captured in CUDA graphs (their all-reduces inside the graphs) and once more
eagerly; greedy and seeded outputs must agree token for token, logprobs to float32 noise.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from mini_vllm.llm import LLM
from mini_vllm.sampling_params import SamplingParams
from tests.tp.conftest import process_gone
from tests.tp.test_tp_parity import GREEDY, LOGPROBS, _logprobs, _prompts, _tokens

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.device_count() < 2,
    reason="needs two CUDA devices (NCCL tensor parallelism); the gloo tests cover the CPU",
)

# float32 end to end; a small fixed KV budget so that three engines share the GPUs.
GPU_KWARGS = dict(
    skip_tokenizer_init=True,
    device="cuda",
    dtype="float32",
    max_model_len=128,
    max_num_batched_tokens=32,
    max_num_seqs=16,
    kv_cache_memory_bytes=16 << 20,
)
SEEDED = [SamplingParams(temperature=0.8, top_p=0.9, seed=i, max_tokens=12) for i in range(5)]


def _run(llm: LLM) -> dict[str, list]:
    prompts = _prompts()
    return {
        "greedy": _tokens(llm.generate(prompts, GREEDY, use_tqdm=False)),
        "seeded": _tokens(llm.generate(prompts, SEEDED, use_tqdm=False)),
        "logprobs": _logprobs(llm.generate(prompts[:2], LOGPROBS, use_tqdm=False)),
    }


@pytest.fixture(scope="module")
def one_gpu(tiny_tp_dir: Path) -> dict[str, list]:
    llm = LLM(str(tiny_tp_dir), **GPU_KWARGS)
    assert llm.llm_engine.model_runner.cudagraph_batch_sizes, "TP=1 should capture graphs"
    result = _run(llm)
    del llm
    torch.cuda.empty_cache()
    return result


@pytest.fixture(scope="module", params=["cuda-graphs", "eager"])
def two_gpus(request: pytest.FixtureRequest, tiny_tp_dir: Path) -> Iterator[LLM]:
    eager = request.param == "eager"
    llm = LLM(str(tiny_tp_dir), tensor_parallel_size=2, enforce_eager=eager, **GPU_KWARGS)
    yield llm
    pids = llm.llm_engine.model_runner.worker_pids
    llm.llm_engine.shutdown()
    assert all(process_gone(pid) for pid in pids), "a worker outlived its engine"


def test_ranks_use_nccl_on_their_own_gpu(two_gpus: LLM) -> None:
    executor = two_gpus.llm_engine.model_runner
    infos = executor.collective_rpc("describe")
    assert [(i["device"], i["backend"]) for i in infos] == [("cuda:0", "nccl"), ("cuda:1", "nccl")]
    eager = two_gpus.llm_engine.args.enforce_eager
    for info in infos:
        assert bool(info["cudagraph_batch_sizes"]) != eager, info
    assert executor.cudagraph_batch_sizes == infos[0]["cudagraph_batch_sizes"]


def test_two_gpus_equal_one(one_gpu: dict[str, list], two_gpus: LLM) -> None:
    got = _run(two_gpus)
    assert got["greedy"] == one_gpu["greedy"]
    assert got["seeded"] == one_gpu["seeded"]
    assert [e[:2] for e in got["logprobs"]] == [e[:2] for e in one_gpu["logprobs"]]
    assert [e[2] for e in got["logprobs"]] == pytest.approx(
        [e[2] for e in one_gpu["logprobs"]], abs=1e-4
    )


def test_profile_sees_the_all_reduces(two_gpus: LLM) -> None:
    """Each rank's profile holds NCCL kernels, as many on one rank as on the other.

    A decode step of the 2-layer model runs 5 all-reduces (embedding, then ``o_proj`` and
    ``down_proj`` per layer) and one all-gather of the logits.
    """
    engine = two_gpus.llm_engine
    executor = engine.model_runner
    engine.add_request("p", {"prompt_token_ids": _prompts()[1]}, GREEDY)
    while engine.scheduler.waiting or engine.scheduler.running[0].num_output_tokens == 0:
        engine.step()
    executor.collective_rpc("profile", args=(True,))
    steps = 4
    for _ in range(steps):
        engine.step()
    per_rank = executor.collective_rpc("profile", args=(False,))
    engine.abort_request(["p"])
    while engine.has_unfinished_requests():
        engine.step()
    counts = [
        sum(n for name, (n, _) in times.items() if name.startswith("nccl")) for times in per_rank
    ]
    # the step in flight when the window opens may or may not fall inside it
    assert counts[0] == counts[1] >= (steps - 1) * 6, per_rank
