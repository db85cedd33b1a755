"""Drive the real scheduler and KV cache manager with the fake model, step by step.

Each step submits the requests that have arrived, calls ``Scheduler.schedule()``,
executes the output with ``FakeModelRunner``, feeds the sampled tokens back with
``update_from_output`` and records a ``StepRecord``. With ``check_invariants``
the simulator also checks, after every step, what must hold whatever the
workload: the block pool invariants (``check_block_pool``), the token budget
and ``max_num_seqs``, that every running request's blocks cover its computed
tokens, and that waiting requests hold no blocks. Any violation raises
``AssertionError`` at the step where it happened.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from mini_vllm.core.kv_cache_manager import KVCacheManager
from mini_vllm.core.kv_cache_utils import get_request_block_hasher, sha256
from mini_vllm.core.sched.scheduler import Scheduler
from mini_vllm.metrics.stats import PrefixCacheStats
from mini_vllm.request import FinishReason, Request, RequestStatus
from mini_vllm.teaching.invariants import check_block_pool
from mini_vllm.teaching.sim.fake_model import FakeModelRunner, expected_output
from mini_vllm.teaching.sim.workload import RequestSpec
from mini_vllm.utils.math_utils import cdiv


@dataclass(frozen=True)
class SimConfig:
    """Engine and fake-model settings of one simulation."""

    num_gpu_blocks: int = 12
    block_size: int = 4
    max_num_batched_tokens: int = 16
    max_num_seqs: int = 4
    max_model_len: int = 40
    enable_chunked_prefill: bool = True
    long_prefill_token_threshold: int = 0
    enable_caching: bool = True
    # Admit a waiting request only if its whole sequence fits (upstream's default).
    scheduler_reserve_full_isl: bool = True
    # "fcfs" or "priority" (the workload's priorities then order admission and preemption).
    scheduling_policy: str = "fcfs"
    seed: int = 0
    vocab_size: int = 64
    eos_token_id: int | None = None
    max_steps: int = 10_000
    check_invariants: bool = True


@dataclass
class StepRecord:
    """What happened in one engine step.

    ``scheduled`` lists ``(request_id, num_tokens, kind)`` in batch order, where
    kind is ``prefill`` (a whole prompt or its last chunk: a token is sampled),
    ``chunk`` (a non-final prompt chunk: nothing sampled) or ``decode``.
    ``block_tables`` is every running request's block table after scheduling.
    """

    step: int
    scheduled: list[tuple[str, int, str]]
    num_scheduled_tokens: int
    admitted: list[str]
    resumed: list[str]
    prefix_hits: dict[str, int]
    preempted: list[str]
    finished: list[tuple[str, FinishReason]]
    block_tables: dict[str, list[int]]
    num_free_blocks: int
    kv_usage: float
    waiting: list[str]


@dataclass
class SimResult:
    """The outcome of a simulation: the trace, the outputs and what was expected."""

    config: SimConfig
    steps: list[StepRecord]
    outputs: dict[str, list[int]]
    finish_reasons: dict[str, FinishReason]
    expected: dict[str, tuple[list[int], FinishReason]]
    requests: dict[str, Request]
    admission_order: list[str]
    prefix_cache_stats: PrefixCacheStats
    kv_cache_manager: KVCacheManager = field(repr=False)

    @property
    def num_steps(self) -> int:
        """Engine steps executed (idle gaps between arrivals are skipped)."""
        return len(self.steps)

    @property
    def mismatches(self) -> list[str]:
        """Ids of requests whose output or finish reason differs from the expected one."""
        return [
            rid
            for rid, (tokens, reason) in self.expected.items()
            if self.outputs.get(rid) != tokens or self.finish_reasons.get(rid) != reason
        ]


class Simulator:
    """Replays ``workload`` on a fresh scheduler built from ``config``."""

    def __init__(self, config: SimConfig, workload: Sequence[RequestSpec]) -> None:
        self.config = config
        self.workload = sorted(workload, key=lambda spec: spec.arrival_step)
        ids = [spec.request_id for spec in self.workload]
        if len(set(ids)) != len(ids):
            raise ValueError("request ids in the workload must be unique")
        usable_blocks = config.num_gpu_blocks - 1
        for spec in self.workload:
            # The last token is sampled, never fed back: the most KV slots a request
            # needs is one less than the longest it may grow.
            max_tokens = spec.sampling_params.max_tokens
            longest = config.max_model_len
            if max_tokens is not None:
                longest = min(len(spec.prompt_token_ids) + max_tokens, longest)
            if cdiv(longest - 1, config.block_size) > usable_blocks:
                raise ValueError(
                    f"{spec.request_id} may need {longest - 1} KV slots, more than the "
                    f"{usable_blocks} usable blocks of {config.block_size} tokens hold: it "
                    f"could never run, even alone"
                )
        self.kv_cache_manager = KVCacheManager(
            num_gpu_blocks=config.num_gpu_blocks,
            block_size=config.block_size,
            max_model_len=config.max_model_len,
            enable_caching=config.enable_caching,
            log_stats=True,
        )
        self.scheduler = Scheduler(
            self.kv_cache_manager,
            max_num_batched_tokens=config.max_num_batched_tokens,
            max_num_seqs=config.max_num_seqs,
            max_model_len=config.max_model_len,
            enable_chunked_prefill=config.enable_chunked_prefill,
            long_prefill_token_threshold=config.long_prefill_token_threshold,
            scheduler_reserve_full_isl=config.scheduler_reserve_full_isl,
            policy=config.scheduling_policy,
        )
        self.runner = FakeModelRunner(config.block_size, config.seed, config.vocab_size)
        self._block_hasher = get_request_block_hasher(config.block_size, sha256)

    def _make_request(self, spec: RequestSpec) -> Request:
        return Request(
            spec.request_id,
            list(spec.prompt_token_ids),
            spec.sampling_params,
            eos_token_id=self.config.eos_token_id,
            arrival_time=float(spec.arrival_step),
            priority=spec.priority,
            block_hasher=self._block_hasher,
        )

    def run(self) -> SimResult:
        """Run until every request finished; return the trace and the outputs."""
        cfg = self.config
        sched = self.scheduler
        pending = list(self.workload)
        requests: dict[str, Request] = {}
        outputs: dict[str, list[int]] = {}
        finish_reasons: dict[str, FinishReason] = {}
        admission_order: list[str] = []
        records: list[StepRecord] = []
        stats = PrefixCacheStats()
        step = 0
        while pending or sched.has_unfinished_requests():
            if not sched.has_unfinished_requests() and pending[0].arrival_step > step:
                step = pending[0].arrival_step  # skip idle steps
            while pending and pending[0].arrival_step <= step:
                request = self._make_request(pending.pop(0))
                requests[request.request_id] = request
                outputs[request.request_id] = []
                sched.add_request(request)
            if len(records) >= cfg.max_steps:
                raise RuntimeError(f"no completion after {cfg.max_steps} steps (livelock?)")

            out = sched.schedule()
            step_stats = self.kv_cache_manager.make_prefix_cache_stats()
            assert step_stats is not None
            _accumulate(stats, step_stats)
            new_ids = [new.req_id for new in out.scheduled_new_reqs]
            admission_order.extend(new_ids)
            scheduled = [
                (rid, n, _kind(requests[rid], n)) for rid, n in out.num_scheduled_tokens.items()
            ]
            prefix_hits = {
                new.req_id: new.num_computed_tokens
                for new in out.scheduled_new_reqs
                if new.num_computed_tokens
            }
            cached = out.scheduled_cached_reqs
            for i, rid in enumerate(cached.req_ids):
                if rid in cached.resumed_req_ids and cached.num_computed_tokens[i]:
                    prefix_hits[rid] = cached.num_computed_tokens[i]
            block_tables = {
                req.request_id: self.kv_cache_manager.get_block_ids(req.request_id)[0]
                for req in sched.running
            }
            if cfg.check_invariants:
                self._check_after_schedule(out.total_num_scheduled_tokens)

            sampled = self.runner.execute_model(out)
            finished: list[tuple[str, FinishReason]] = []
            for engine_output in sched.update_from_output(out, sampled):
                outputs[engine_output.request_id].extend(engine_output.new_token_ids)
                if engine_output.finish_reason is not None:
                    finished.append((engine_output.request_id, engine_output.finish_reason))
                    finish_reasons[engine_output.request_id] = engine_output.finish_reason
            if cfg.check_invariants:
                self._check_after_update()

            records.append(
                StepRecord(
                    step=step,
                    scheduled=scheduled,
                    num_scheduled_tokens=out.total_num_scheduled_tokens,
                    admitted=new_ids,
                    resumed=sorted(cached.resumed_req_ids, key=cached.req_ids.index),
                    prefix_hits=prefix_hits,
                    preempted=sorted(out.preempted_req_ids, key=_id_order),
                    finished=finished,
                    block_tables=block_tables,
                    num_free_blocks=self.kv_cache_manager.block_pool.get_num_free_blocks(),
                    kv_usage=self.kv_cache_manager.usage,
                    waiting=[req.request_id for req in sched.waiting],
                )
            )
            step += 1

        if cfg.check_invariants:
            pool = self.kv_cache_manager.block_pool
            check_block_pool(pool)
            assert pool.get_num_free_blocks() == cfg.num_gpu_blocks - 1, "blocks leaked"
            assert not self.kv_cache_manager.req_to_blocks, "block tables leaked"

        expected = {
            rid: expected_output(
                rid,
                req.num_prompt_tokens,
                req.sampling_params,
                req.eos_token_id,
                cfg.max_model_len,
                cfg.seed,
                cfg.vocab_size,
            )
            for rid, req in requests.items()
        }
        return SimResult(
            config=cfg,
            steps=records,
            outputs=outputs,
            finish_reasons=finish_reasons,
            expected=expected,
            requests=requests,
            admission_order=admission_order,
            prefix_cache_stats=stats,
            kv_cache_manager=self.kv_cache_manager,
        )

    def _check_after_schedule(self, total_num_scheduled_tokens: int) -> None:
        cfg = self.config
        sched = self.scheduler
        mgr = self.kv_cache_manager
        assert total_num_scheduled_tokens <= cfg.max_num_batched_tokens, "token budget exceeded"
        assert len(sched.running) <= cfg.max_num_seqs, "max_num_seqs exceeded"
        check_block_pool(mgr.block_pool)
        for req in sched.running:
            assert req.status == RequestStatus.RUNNING
            num_slots = len(mgr.req_to_blocks.get(req.request_id, ())) * cfg.block_size
            assert num_slots >= req.num_computed_tokens, (
                f"{req.request_id} computed {req.num_computed_tokens} tokens in {num_slots} slots"
            )
        for req in sched.waiting:
            assert req.status in (RequestStatus.WAITING, RequestStatus.PREEMPTED)
            assert req.num_computed_tokens == 0
            assert req.request_id not in mgr.req_to_blocks, f"waiting {req.request_id} holds blocks"
        held = {id(b) for blocks in mgr.req_to_blocks.values() for b in blocks}
        num_free = mgr.block_pool.get_num_free_blocks()
        assert len(held) + num_free == cfg.num_gpu_blocks - 1, "a block is neither held nor free"

    def _check_after_update(self) -> None:
        check_block_pool(self.kv_cache_manager.block_pool)
        for req in self.scheduler.running:
            assert not req.is_finished()


def _kind(request: Request, num_tokens: int) -> str:
    """Classify a scheduled slice (called after ``schedule()`` advanced the counters)."""
    if request.is_prefill_chunk:
        return "chunk"
    if num_tokens == 1 and request.num_output_tokens > 0:
        return "decode"
    return "prefill"


def _id_order(request_id: str) -> tuple[int, str]:
    digits = "".join(ch for ch in request_id if ch.isdigit())
    return (int(digits) if digits else -1, request_id)


def _accumulate(total: PrefixCacheStats, step: PrefixCacheStats) -> None:
    total.reset |= step.reset
    total.requests += step.requests
    total.queries += step.queries
    total.hits += step.hits
    total.preempted_requests += step.preempted_requests
    total.preempted_queries += step.preempted_queries
    total.preempted_hits += step.preempted_hits
