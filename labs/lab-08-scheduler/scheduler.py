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

import itertools
import logging
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

logger = logging.getLogger(__name__)


def check_sequence_repetition(token_ids: Sequence[int], params: RepetitionDetectionParams) -> bool:
    """Whether ``token_ids`` ends in a pattern repeated ``params.min_count`` times.

    Only the tail matters: the check runs after every new token, so a loop is
    caught the step it completes its ``min_count``-th round. Pattern lengths are
    tried from the shortest; once ``length * min_count`` exceeds the output,
    no longer pattern can repeat often enough either.
    """
    shortest = max(params.min_pattern_size, 1)
    if params.max_pattern_size <= 0 or params.min_count < 2:
        return False
    for length in range(shortest, params.max_pattern_size + 1):
        if length * params.min_count > len(token_ids):
            return False
        tail = token_ids[len(token_ids) - length :]
        if all(
            token_ids[len(token_ids) - length * (k + 1) : len(token_ids) - length * k] == tail
            for k in range(1, params.min_count)
        ):
            return True
    return False


def check_stop(request: Request, max_model_len: int) -> bool:
    """Decide whether the token just appended ends ``request``; set its status if so.

    Checked in upstream's order: nothing stops a request before ``min_tokens``
    outputs; then EOS (unless ignored), then a stop token (recorded as
    ``stop_reason``), then the length limits (``max_tokens`` outputs, or
    ``max_model_len`` tokens in total, beyond which the KV cache has no room),
    and last a repeated pattern if the request asked for that check
    (``stop_reason`` ``"repetition_detected"``).
    """
    raise NotImplementedError(
        "lab-08: check_stop — nothing before min_tokens; then EOS, a stop token (stop_reason), "
        "max_tokens or max_model_len ends the request"
    )


class Scheduler:
    """Picks, every step, which requests run and how many tokens each.

    One step of ``schedule()``:

    1. **Running requests first**, in order. Each asks for the tokens it is
       missing (``num_tokens_with_spec - num_computed_tokens``: 1 while
       generating, the rest of the prompt while prefilling), capped by
       ``long_prefill_token_threshold`` (if set) and by the budget left. If the
       KV cache cannot hold them (``allocate_slots`` returns None), the
       lowest-priority running request is preempted by recompute: its blocks
       are freed, its progress reset, and it goes back to the waiting queue
       (under FCFS that is the *last* admitted, and it goes to the front; under
       the priority policy the largest ``(priority, arrival_time)``, placed by
       the heap). Then the allocation is retried.
       If the request being scheduled is itself the one preempted, the loop
       stops: nobody after it can be served either.
    2. **Waiting requests next**, in queue order, but only if step 1 preempted nobody
       (memory is tight: admitting someone now would only cause the next
       preemption). Admission stops at ``max_num_seqs`` running requests, an
       exhausted budget, or the first request that does not fit (with the
       admission gate, the first whose whole sequence does not fit). A request's
       cached prefix (``get_computed_blocks``) is skipped over; without
       chunked prefill, a prompt that does not fit the budget left waits for
       the next step.
    3. ``num_computed_tokens`` of every scheduled request is advanced *after*
       the output is built (``_update_after_schedule``): the runner needs the old
       value to know where the scheduled tokens start, and the next
       ``schedule()`` must see them as computed so a chunked prompt continues
       where the last chunk ended even before the step's results are in.

    ``update_from_output`` then appends the sampled tokens, checks the stop
    conditions and frees finished requests.

    Args:
        kv_cache_manager: The KV cache the scheduler allocates from.
        max_num_batched_tokens: Token budget of one step.
        max_num_seqs: Most requests running at once.
        max_model_len: Longest sequence (prompt + output) a request may reach.
        enable_chunked_prefill: Whether a prompt may be split across steps.
        long_prefill_token_threshold: If > 0, no request gets more than this
            many tokens in one step, so one long prompt cannot starve the
            decodes sharing its batch.
        scheduler_reserve_full_isl: The admission gate (on by default, as
            upstream): a waiting request is admitted only if the free blocks
            could hold its whole current sequence, not just its first chunk
            (``allocate_slots(..., full_sequence_must_fit=True)``). Admitting on
            the first chunk alone lets several long prompts start that cannot
            all finish, and the scheduler later preempts one mid-prefill.
        policy: ``"fcfs"`` (the default) or ``"priority"``. Under priority the
            waiting queue is a heap on ``(request.priority, arrival_time)`` and
            the request preempted for memory is the running one that sorts
            last, not the last admitted.
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
                f"max_num_batched_tokens ({max_num_batched_tokens}) is smaller than "
                f"max_model_len ({max_model_len}) with chunked prefill disabled: a long "
                f"prompt could never be scheduled"
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
        self.block_size = kv_cache_manager.block_size
        self.max_num_scheduled_tokens = max_num_batched_tokens
        self.max_num_running_reqs = max_num_seqs
        self.max_model_len = max_model_len
        self.enable_chunked_prefill = enable_chunked_prefill
        self.long_prefill_token_threshold = long_prefill_token_threshold
        self.scheduler_reserve_full_isl = scheduler_reserve_full_isl

        # request_id -> Request, for every request not finished yet.
        self.requests: dict[str, Request] = {}
        self.policy = SchedulingPolicy(policy)
        self.waiting = create_request_queue(self.policy)
        # In admission order: under FCFS the last one is the first to be preempted.
        self.running: list[Request] = []
        # Finished between the previous step and the current one; sent to the
        # runner with the next SchedulerOutput so it can drop their state.
        self.finished_req_ids: set[str] = set()
        # Scheduled in the previous step: the runner's state of these is current.
        self.prev_step_scheduled_req_ids: set[str] = set()

    # ------------------------------------------------------------- requests

    def add_request(self, request: Request) -> None:
        """Queue a new request at the back of the waiting queue.

        The prompt must leave room for at least one output token within
        ``max_model_len`` (upstream's input processor enforces the same before
        the request reaches the scheduler), and ``min_tokens`` must fit in what
        it leaves. ``max_tokens=None`` is resolved here to whatever
        ``max_model_len`` leaves after the prompt. Under the priority policy the
        request's ``priority`` places it in the waiting heap.
        """
        if request.request_id in self.requests:
            raise ValueError(f"duplicate request id {request.request_id!r}")
        if request.status != RequestStatus.WAITING:
            raise ValueError(
                f"request {request.request_id!r} must be WAITING to be added, is {request.status}"
            )
        if request.num_prompt_tokens >= self.max_model_len:
            raise ValueError(
                f"request {request.request_id!r}: prompt of {request.num_prompt_tokens} tokens "
                f"leaves no room for an output token within max_model_len={self.max_model_len}"
            )
        room = self.max_model_len - request.num_prompt_tokens
        if request.sampling_params.min_tokens > room:
            # Upstream accepts such a request; after a preemption it then schedules a
            # negative number of tokens for it. The request could never be served.
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
        """Finish requests from outside the scheduler (e.g. a client abort).

        ``request_ids=None`` finishes every request. Unknown or already finished
        ids are ignored. Their blocks are freed at once; the runner hears about
        it through the next ``SchedulerOutput.finished_req_ids``.

        Returns:
            The ids of the requests actually finished by this call.
        """
        raise NotImplementedError(
            "lab-08: Scheduler.finish_requests — finish running or waiting requests from "
            "outside (abort) and free them"
        )

    def get_num_unfinished_requests(self) -> int:
        """Requests waiting or running."""
        return len(self.waiting) + len(self.running)

    def reset_prefix_cache(self, reset_running_requests: bool = False) -> bool:
        """Forget every cached prefix (e.g. after new weights made the cached KV stale).

        The block pool refuses while any block is held, so by default this only
        succeeds when nothing runs. With ``reset_running_requests`` every running
        request is first preempted by recompute, last first, so that they return to
        the front of the waiting queue in their original order.
        """
        if reset_running_requests:
            while self.running:
                self._preempt_request(self.running.pop())
        reset = self.kv_cache_manager.reset_prefix_cache()
        if reset_running_requests and not reset:
            raise RuntimeError(
                "the prefix cache could not be reset although every running request "
                "was preempted: some blocks are still held"
            )
        return reset

    def has_unfinished_requests(self) -> bool:
        """Whether any request is still waiting or running."""
        return self.get_num_unfinished_requests() > 0

    def has_finished_requests(self) -> bool:
        """Whether finished requests still have to be reported to the runner."""
        return len(self.finished_req_ids) > 0

    def get_request_counts(self) -> tuple[int, int]:
        """(running, waiting) request counts."""
        return len(self.running), len(self.waiting)

    # ------------------------------------------------------------- schedule

    def schedule(self) -> SchedulerOutput:
        """Pick this step's batch; see the class docstring for the policy."""
        raise NotImplementedError(
            "lab-08: Scheduler.schedule — running first, then waiting in queue order (through "
            "the admission gate), under one token budget; on None preempt the lowest-priority "
            "running request"
        )

    def _preempt_request(self, request: Request) -> None:
        """Preempt by recompute: free the blocks, reset progress, requeue at the front.

        The caller has already removed ``request`` from ``self.running``. The
        tokens generated so far are kept; when the request is readmitted it
        recomputes the KV of all of them (minus any prefix still cached) and
        continues generating where it stopped.
        """
        raise NotImplementedError(
            "lab-08: Scheduler._preempt_request — free the blocks, reset num_computed_tokens, "
            "count the preemption, requeue at the front"
        )

    def _update_after_schedule(self, scheduler_output: SchedulerOutput) -> None:
        """Advance ``num_computed_tokens`` of the scheduled requests.

        Done after the output was built, which must carry the old values, and
        before the step runs, so that a chunked prompt's next chunk can be
        scheduled right away. ``is_prefill_chunk`` tells the runner (and
        ``update_from_output``) not to expect a sampled token for the request.
        """
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
        req_ids: list[str] = []
        new_token_ids: list[list[int]] = []
        new_block_ids: list[tuple[list[int], ...] | None] = []
        all_token_ids: dict[str, list[int]] = {}
        num_computed_tokens: list[int] = []
        num_output_tokens: list[int] = []
        resumed_req_ids: set[str] = set()
        num_running_reqs = len(running_reqs)
        for idx, req in enumerate(itertools.chain(running_reqs, resumed_reqs)):
            req_id = req.request_id
            req_ids.append(req_id)
            start = req.num_computed_tokens
            new_token_ids.append(req.all_token_ids[start : start + num_scheduled_tokens[req_id]])
            if idx >= num_running_reqs:
                resumed_req_ids.add(req_id)
            if req_id not in self.prev_step_scheduled_req_ids or req_id in resumed_req_ids:
                all_token_ids[req_id] = req.all_token_ids.copy()
            new_block_ids.append(req_to_new_blocks[req_id].get_block_ids(allow_none=True))
            num_computed_tokens.append(req.num_computed_tokens)
            # Counting the tokens a step in flight is sampling (async scheduling), as upstream.
            num_output_tokens.append(req.num_output_tokens + req.num_output_placeholders)
        return CachedRequestData(
            req_ids=req_ids,
            resumed_req_ids=resumed_req_ids,
            new_token_ids=new_token_ids,
            all_token_ids=all_token_ids,
            new_block_ids=new_block_ids,
            num_computed_tokens=num_computed_tokens,
            num_output_tokens=num_output_tokens,
        )

    # ------------------------------------------------------------ outputs

    def update_from_output(
        self,
        scheduler_output: SchedulerOutput,
        sampled_token_ids: dict[str, list[int]],
    ) -> list[EngineCoreOutput]:
        """Apply one executed step: append sampled tokens, stop and free requests.

        Args:
            scheduler_output: The output of the ``schedule()`` that was executed.
            sampled_token_ids: request id -> tokens sampled for it this step
                (one per request without speculative decoding). A request in
                the middle of its prefill must get none (missing or empty): the
                logits of a non-final prompt chunk are not a prediction.

        Returns:
            One ``EngineCoreOutput`` per request that got tokens or finished, in
            scheduling order.
        """
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
