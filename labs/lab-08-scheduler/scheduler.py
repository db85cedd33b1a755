# lab-08: write the functions below that raise NotImplementedError.
# Grade your work: make lab-08   Guide: labs/lab-08-scheduler/README.md
"""The scheduler, continuous batching with chunked prefill and preemption: the file of lab-08.

Each step ``Scheduler.schedule()`` hands out a budget of ``max_num_batched_tokens`` tokens, running
requests first and then waiting ones in queue order, so that every request's ``num_computed_tokens``
catches up with its ``num_tokens``: a whole prompt, a chunk of one and one decode token are the same
operation. When the KV cache manager cannot give a running request its slots, the lowest-priority
running request (the last one, first come first served) is preempted by recompute.
``update_from_output`` appends the sampled tokens and applies the stop rules of ``check_stop``. You
write ``schedule``, ``update_from_output``, ``check_stop``, ``finish_requests`` and the helpers they
call (``_update_request_with_output``, ``_free_request``, ``_update_after_schedule``,
``_preempt_request``); the rest is given (read ``__init__`` first).

The grader drives your scheduler with the simulator's fake model, whose output is known in advance:
small traces, whole simulations step by step, random workloads on tiny pools. Only ``check_stop``
scores on its own; every other test runs a whole step, so its row stays NOT STARTED until
``schedule`` runs. The KV cache manager is imported from ``mini_vllm.core.kv_cache_manager``: the
engine's, so when ``allocate_slots`` returns ``None`` it is right, or with ``--chain`` your own
lab-07 manager.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from mini_vllm.core.kv_cache_manager import KVCacheBlocks, KVCacheManager
from mini_vllm.core.sched.output import (
    CachedRequestData,
    EngineCoreOutput,
    NewRequestData,
    SchedulerOutput,
)
from mini_vllm.core.sched.request_queue import SchedulingPolicy, create_request_queue
from mini_vllm.request import Request, RequestStatus
from mini_vllm.sampling_params import RepetitionDetectionParams


def check_sequence_repetition(token_ids: Sequence[int], params: RepetitionDetectionParams) -> bool:
    """Whether ``token_ids`` ends in a pattern repeated ``params.min_count`` times (only the
    tail: the check runs after every token, so a loop is caught the step it completes)."""
    if params.max_pattern_size <= 0 or params.min_count < 2:
        return False
    n = len(token_ids)
    for length in range(max(params.min_pattern_size, 1), params.max_pattern_size + 1):
        if length * params.min_count > n:
            return False
        tail = list(token_ids[n - length :])
        if list(token_ids[n - length * params.min_count :]) == tail * params.min_count:
            return True
    return False


def check_stop(request: Request, max_model_len: int) -> bool:
    """Decide whether the token just appended ends ``request``; set its status if so.
    Upstream's order: nothing stops a request before ``min_tokens`` outputs; then EOS (unless
    ignored), a stop token (kept as ``stop_reason``), the length limits (``max_tokens`` outputs
    or ``max_model_len`` tokens in all), a repeated pattern (``"repetition_detected"``)."""
    raise NotImplementedError(
        "lab-08: check_stop — nothing before min_tokens; then EOS, a stop token (stop_reason), "
        "max_tokens or max_model_len ends the request; last, a pattern repeated at the end of "
        "the output"
    )


class Scheduler:
    """Picks, every step, which requests run and how many tokens each.

    1. Running requests first, in order, each asking for its missing tokens, capped by
       ``long_prefill_token_threshold`` (> 0: a long prompt cannot starve the decodes) and the
       budget left. If the KV cache cannot hold them, the lowest-priority running request (FCFS:
       the last admitted; priority: the largest ``(priority, arrival_time)``) is preempted by
       recompute and the allocation retried; if the victim is the request itself, stop.
    2. Waiting requests in queue order, only if nobody was preempted (else memory is tight), until
       ``max_num_seqs``, an empty budget, or one that does not fit: through the admission gate
       (``scheduler_reserve_full_isl``, on as upstream) its whole sequence must fit, so that no
       prompt is started only to be preempted mid-prefill.
    3. ``num_computed_tokens`` advances once the output is built (``_update_after_schedule``).
    """

    def __init__(
        self,
        kv_cache_manager: KVCacheManager,
        max_num_batched_tokens: int,
        max_num_seqs: int,
        max_model_len: int,
        enable_chunked_prefill: bool = True,
        long_prefill_token_threshold: int = 0,
        scheduler_reserve_full_isl: bool = True,
        policy: SchedulingPolicy | str = SchedulingPolicy.FCFS,
    ) -> None:
        if max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be >= 1, got {max_num_seqs}")
        if max_num_batched_tokens < max_num_seqs:
            raise ValueError(
                f"max_num_batched_tokens ({max_num_batched_tokens}) must be >= max_num_seqs "
                f"({max_num_seqs}): every running request needs at least one token per step"
            )
        if not enable_chunked_prefill and max_num_batched_tokens < max_model_len:
            raise ValueError(
                f"max_num_batched_tokens ({max_num_batched_tokens}) is smaller than max_model_len "
                f"({max_model_len}) with chunked prefill disabled: a long prompt could never run"
            )
        if long_prefill_token_threshold < 0:
            raise ValueError(
                f"long_prefill_token_threshold must be >= 0, got {long_prefill_token_threshold}"
            )
        if max_model_len > kv_cache_manager.max_model_len:
            raise ValueError(
                f"max_model_len ({max_model_len}) exceeds the KV cache manager's "
                f"({kv_cache_manager.max_model_len})"
            )
        self.kv_cache_manager = kv_cache_manager
        self.max_num_scheduled_tokens = max_num_batched_tokens
        self.max_num_running_reqs = max_num_seqs
        self.max_model_len = max_model_len
        self.enable_chunked_prefill = enable_chunked_prefill
        self.long_prefill_token_threshold = long_prefill_token_threshold
        self.scheduler_reserve_full_isl = scheduler_reserve_full_isl

        self.requests: dict[str, Request] = {}  # every request not finished yet
        self.policy = SchedulingPolicy(policy)
        self.waiting = create_request_queue(self.policy)
        # In admission order: under FCFS the last one is the first to be preempted.
        self.running: list[Request] = []
        # Finished since the last schedule(): the next output tells the runner to drop them.
        self.finished_req_ids: set[str] = set()
        self.prev_step_scheduled_req_ids: set[str] = set()  # their runner state is current

    def add_request(self, request: Request) -> None:
        """Queue a new request. Its prompt must leave room within ``max_model_len`` for one
        output token (as upstream's input processor checks) and for ``min_tokens``;
        ``max_tokens=None`` becomes that room."""
        if request.request_id in self.requests:
            raise ValueError(f"duplicate request id {request.request_id!r}")
        if request.status != RequestStatus.WAITING:
            raise ValueError(f"only a WAITING request can be added: {request!r}")
        if request.num_prompt_tokens >= self.max_model_len:
            raise ValueError(
                f"request {request.request_id!r}: prompt of {request.num_prompt_tokens} tokens "
                f"leaves no room for an output token within max_model_len={self.max_model_len}"
            )
        room = self.max_model_len - request.num_prompt_tokens
        if request.sampling_params.min_tokens > room:
            # Upstream accepts it, and schedules a negative token count for it after a preemption.
            raise ValueError(
                f"request {request.request_id!r}: min_tokens={request.sampling_params.min_tokens}"
                f" cannot be reached: the prompt of {request.num_prompt_tokens} tokens leaves "
                f"room for {room} output tokens within max_model_len={self.max_model_len}"
            )
        if request.max_tokens is None:
            request.max_tokens = room
        self.waiting.add_request(request)
        self.requests[request.request_id] = request

    def finish_requests(
        self, request_ids: str | Iterable[str] | None, finished_status: RequestStatus
    ) -> list[str]:
        """Finish requests from outside the scheduler (e.g. a client abort); return their ids.
        ``None`` finishes every request; unknown or finished ids are ignored; a status that is
        not a finished one raises ValueError. Blocks are freed at once; the runner hears of it
        through the next ``SchedulerOutput.finished_req_ids``."""
        raise NotImplementedError(
            "lab-08: Scheduler.finish_requests — finish running or waiting requests from "
            "outside (abort) and free them"
        )

    def get_num_unfinished_requests(self) -> int:
        return len(self.waiting) + len(self.running)

    def reset_prefix_cache(self, reset_running_requests: bool = False) -> bool:
        """Forget every cached prefix (e.g. new weights made the cached KV stale). The pool
        refuses while a block is held; ``reset_running_requests`` first preempts every running
        request, last first, so they requeue in their original order."""
        if reset_running_requests:
            while self.running:
                self._preempt_request(self.running.pop())
        reset = self.kv_cache_manager.reset_prefix_cache()
        if reset_running_requests and not reset:
            raise RuntimeError("prefix cache not reset: blocks held after preempting all requests")
        return reset

    def has_unfinished_requests(self) -> bool:
        return self.get_num_unfinished_requests() > 0

    def has_finished_requests(self) -> bool:
        """Whether finished requests still have to be reported to the runner."""
        return len(self.finished_req_ids) > 0

    def get_request_counts(self) -> tuple[int, int]:
        """(running, waiting) request counts."""
        return len(self.running), len(self.waiting)

    def schedule(self) -> SchedulerOutput:
        """Pick this step's batch; see the class docstring for the policy."""
        raise NotImplementedError(
            "lab-08: Scheduler.schedule — running first, then waiting in queue order (through "
            "the admission gate), under one token budget; on None preempt the lowest-priority "
            "running request"
        )

    def _preempt_request(self, request: Request) -> None:
        """Preempt by recompute: free the blocks, reset progress, count it, requeue at the front.
        The caller took the request (RUNNING, else RuntimeError) out of ``self.running``; its
        tokens are kept, and once readmitted it recomputes their KV."""
        raise NotImplementedError(
            "lab-08: Scheduler._preempt_request — free the blocks, reset num_computed_tokens, "
            "count the preemption, requeue at the front"
        )

    def _update_after_schedule(self, scheduler_output: SchedulerOutput) -> None:
        """Advance ``num_computed_tokens`` of the scheduled requests; start a new finished set.
        Done once the output (which carries the old values) is built, before the step runs, so a
        prompt's next chunk can be scheduled at once. ``is_prefill_chunk``: no token is sampled."""
        raise NotImplementedError(
            "lab-08: Scheduler._update_after_schedule — advance num_computed_tokens of every "
            "scheduled request; start a fresh finished set"
        )

    def _make_cached_request_data(
        self,
        running_reqs: list[Request],
        resumed_reqs: list[Request],
        num_scheduled_tokens: dict[str, int],
        req_to_new_blocks: dict[str, KVCacheBlocks],
    ) -> CachedRequestData:
        """Describe the scheduled requests the runner already knows (see CachedRequestData)."""
        reqs = running_reqs + resumed_reqs
        resumed_req_ids = {req.request_id for req in resumed_reqs}
        # The runner's token list is current only for a request it ran last step, unpreempted.
        current = self.prev_step_scheduled_req_ids - resumed_req_ids
        new_token_ids: list[list[int]] = []
        for req in reqs:
            start = req.num_computed_tokens
            end = start + num_scheduled_tokens[req.request_id]
            new_token_ids.append(req.all_token_ids[start:end])
        return CachedRequestData(
            req_ids=[req.request_id for req in reqs],
            resumed_req_ids=resumed_req_ids,
            new_token_ids=new_token_ids,
            all_token_ids={
                req.request_id: req.all_token_ids.copy()
                for req in reqs
                if req.request_id not in current
            },
            new_block_ids=[
                req_to_new_blocks[req.request_id].get_block_ids(allow_none=True) for req in reqs
            ],
            num_computed_tokens=[req.num_computed_tokens for req in reqs],
            # Counting the tokens a step in flight is sampling (async scheduling), as upstream.
            num_output_tokens=[req.num_output_tokens + req.num_output_placeholders for req in reqs],
        )

    def update_from_output(
        self, scheduler_output: SchedulerOutput, sampled_token_ids: dict[str, list[int]]
    ) -> list[EngineCoreOutput]:
        """Apply one executed step: append sampled tokens, stop and free requests.
        ``sampled_token_ids``: request id -> this step's tokens. A request mid-prefill must get
        none (a non-final chunk's logits predict nothing): else ValueError, before any change.
        Returns one ``EngineCoreOutput`` per request that got tokens or finished, in scheduling
        order; finished requests leave ``running`` (or ``waiting``, if preempted meanwhile)."""
        raise NotImplementedError(
            "lab-08: Scheduler.update_from_output — apply one step's sampled tokens; free "
            "finished requests and drop them from running"
        )

    def _update_request_with_output(
        self, request: Request, new_token_ids: list[int]
    ) -> tuple[list[int], bool]:
        """Append tokens one by one, stopping (and trimming) at the first stop."""
        raise NotImplementedError(
            "lab-08: Scheduler._update_request_with_output — append the sampled tokens one by "
            "one; stop and trim at the first stop"
        )

    def _free_request(self, request: Request) -> None:
        """Release a finished request: its blocks now, its runner state next step."""
        raise NotImplementedError(
            "lab-08: Scheduler._free_request — free the request's blocks now, report its id "
            "next step, forget it"
        )
