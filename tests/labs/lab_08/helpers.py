"""Shared set-up of the lab-08 suite: a scheduler on the reference KV cache, and an engine loop.

The scheduler under test is the learner's ``Scheduler``; the KV cache manager under it is
``mini_vllm.core.kv_cache_manager.KVCacheManager``, looked up when a test runs so that ``--chain``
can put the learner's own lab-07 manager there. Steps are executed by the simulator's fake model
(``mini_vllm.sim.FakeModelRunner``), which learns about requests only through the
``SchedulerOutput`` and checks it as a real model runner would: a wrong block table, a wrong
``num_computed_tokens`` or a missing resumed request fails the step with a message.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any

from grading.suite import load_impl
from mini_vllm.core.invariants import check_block_pool
from mini_vllm.core.kv_cache_utils import get_request_block_hasher, sha256
from mini_vllm.request import Request
from mini_vllm.sampling_params import SamplingParams
from mini_vllm.sim import FakeModelRunner, SimConfig, Simulator, fake_next_token

DOC = "phases/03-prefix-caching-and-scheduling/README.md"
BS = 4
SEED = 0
VOCAB = 64
HASHER = get_request_block_hasher(BS, sha256)


def scheduler_module() -> Any:
    return load_impl("scheduler")


def kv_cache_manager_class() -> Any:
    """The KV cache manager in use (the reference's, or the learner's lab-07 under --chain)."""
    scheduler_module()  # applies --chain before the manager is looked up
    return importlib.import_module("mini_vllm.core.kv_cache_manager").KVCacheManager


def make_scheduler(num_blocks: int = 20, budget: int = 16, max_num_seqs: int = 4,
                   max_model_len: int = 64, caching: bool = True, **kwargs: Any) -> Any:
    """The learner's scheduler over a fresh KV cache of ``num_blocks`` blocks of ``BS`` tokens."""
    manager = kv_cache_manager_class()(num_blocks, BS, max_model_len, enable_caching=caching,
                                       log_stats=True)
    return scheduler_module().Scheduler(manager, budget, max_num_seqs, max_model_len, **kwargs)


def make_request(rid: str, num_prompt: int, max_tokens: int | None = 8, base: int = 0,
                 eos: int | None = None, **sampling: Any) -> Request:
    """A greedy request whose prompt is ``base, base + 1, ...``; blocks are hashed (chained)."""
    return Request(rid, [base + i for i in range(num_prompt)],
                   SamplingParams(temperature=0.0, max_tokens=max_tokens, **sampling),
                   eos_token_id=eos, block_hasher=HASHER)


def model_token(rid: str, position: int) -> int:
    """The token the fake model emits at ``position`` of ``rid``."""
    return fake_next_token(SEED, rid, position, VOCAB)


def running_ids(sched: Any) -> list[str]:
    return [req.request_id for req in sched.running]


def waiting_ids(sched: Any) -> list[str]:
    return [req.request_id for req in sched.waiting]


def table(sched: Any, rid: str) -> list[int]:
    """A request's block table, read from the KV cache manager's ``req_to_blocks``."""
    return [b.block_id for b in sched.kv_cache_manager.req_to_blocks.get(rid, [])]


def num_free(sched: Any) -> int:
    return sched.kv_cache_manager.block_pool.get_num_free_blocks()


@dataclass
class Engine:
    """schedule() -> the fake model -> update_from_output(), one step at a time."""

    sched: Any
    runner: FakeModelRunner = field(init=False)
    outputs: dict[str, list[int]] = field(default_factory=dict)
    finished: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.runner = FakeModelRunner(BS, SEED, VOCAB)

    def add(self, *requests: Request) -> None:
        for req in requests:
            self.sched.add_request(req)
            self.outputs[req.request_id] = []

    def step(self) -> tuple[Any, list[Any]]:
        """One engine step; returns the SchedulerOutput and the EngineCoreOutputs."""
        out = self.sched.schedule()
        total = sum(out.num_scheduled_tokens.values())
        budget = self.sched.max_num_scheduled_tokens
        assert total <= budget, (
            f"token budget: {total} tokens scheduled ({out.num_scheduled_tokens}) but "
            f"max_num_batched_tokens is {budget}")
        assert out.total_num_scheduled_tokens == total, (
            f"total_num_scheduled_tokens is {out.total_num_scheduled_tokens}, the batch sums to "
            f"{total}")
        sampled = self.runner.execute_model(out)
        results = self.sched.update_from_output(out, sampled)
        for res in results:
            self.outputs.setdefault(res.request_id, []).extend(res.new_token_ids)
            if res.finish_reason is not None:
                self.finished[res.request_id] = res.finish_reason
        check_block_pool(self.sched.kv_cache_manager.block_pool)
        return out, results

    def run(self, max_steps: int = 300) -> int:
        """Step until no request is left; return the number of steps."""
        for n in range(max_steps):
            if not self.sched.has_unfinished_requests():
                return n
            self.step()
        raise AssertionError(
            f"requests still unfinished after {max_steps} steps (running {running_ids(self.sched)}"
            f", waiting {waiting_ids(self.sched)}): the scheduler makes no progress")


def simulate(config: SimConfig, workload: list[Any]) -> Any:
    """Run ``mini_vllm.sim``'s simulator with the learner's scheduler; return its SimResult."""
    mod = scheduler_module()
    sim = Simulator(config, workload)
    sim.kv_cache_manager = kv_cache_manager_class()(
        config.num_gpu_blocks, config.block_size, config.max_model_len,
        enable_caching=config.enable_caching, log_stats=True)
    sim.scheduler = mod.Scheduler(
        sim.kv_cache_manager,
        max_num_batched_tokens=config.max_num_batched_tokens,
        max_num_seqs=config.max_num_seqs,
        max_model_len=config.max_model_len,
        enable_chunked_prefill=config.enable_chunked_prefill,
        long_prefill_token_threshold=config.long_prefill_token_threshold,
    )
    return sim.run()
