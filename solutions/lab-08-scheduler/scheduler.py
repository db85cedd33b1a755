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
    sampling_params = request.sampling_params
    if request.num_output_tokens < sampling_params.min_tokens:
        return False
    last_token_id = request.output_token_ids[-1]
    if request.eos_token_id is not None and last_token_id == request.eos_token_id:
        request.status = RequestStatus.FINISHED_STOPPED
        return True
    if last_token_id in (sampling_params.stop_token_ids or ()):
        request.status = RequestStatus.FINISHED_STOPPED
        request.stop_reason = last_token_id
        return True
    assert request.max_tokens is not None
    if request.num_tokens >= max_model_len or request.num_output_tokens >= request.max_tokens:
        request.status = RequestStatus.FINISHED_LENGTH_CAPPED
        return True
    repetition = sampling_params.repetition_detection
    if repetition is not None and check_sequence_repetition(request.output_token_ids, repetition):
        request.status = RequestStatus.FINISHED_REPETITION
        request.stop_reason = "repetition_detected"
        return True
    return False


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
        if not RequestStatus.is_finished(finished_status):
            raise ValueError(f"{finished_status} is not a finished status")
        if isinstance(request_ids, str):
            ids: Iterable[str] = (request_ids,)
        elif request_ids is None:
            ids = list(self.requests)
        else:
            ids = dict.fromkeys(request_ids)  # dedupe, keep order

        running_to_remove: set[Request] = set()
        waiting_to_remove: list[Request] = []
        valid: list[Request] = []
        for req_id in ids:
            request = self.requests.get(req_id)
            if request is None or request.is_finished():
                continue
            valid.append(request)
            if request.status == RequestStatus.RUNNING:
                running_to_remove.add(request)
            else:
                waiting_to_remove.append(request)
        if running_to_remove:
            self.running = [req for req in self.running if req not in running_to_remove]
        if waiting_to_remove:
            self.waiting.remove_requests(waiting_to_remove)
        for request in valid:
            request.status = finished_status
            self._free_request(request)
        return [request.request_id for request in valid]

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
        scheduled_new_reqs: list[Request] = []
        scheduled_resumed_reqs: list[Request] = []
        scheduled_running_reqs: list[Request] = []
        preempted_reqs: list[Request] = []

        req_to_new_blocks: dict[str, KVCacheBlocks] = {}
        num_scheduled_tokens: dict[str, int] = {}
        token_budget = self.max_num_scheduled_tokens

        # 1. Running requests.
        req_index = 0
        while req_index < len(self.running) and token_budget > 0:
            request = self.running[req_index]
            if (
                request.num_output_placeholders > 0
                and request.max_tokens is not None
                and request.num_output_tokens + request.num_output_placeholders
                >= request.max_tokens
            ):
                # Async scheduling: the step in flight samples its last token; another step
                # would compute a token nobody may have.
                req_index += 1
                continue

            # Placeholders (async scheduling; always 0 otherwise) are tokens the step on the
            # GPU is sampling: the next step runs them although their ids are not known yet.
            num_new_tokens = (
                request.num_tokens_with_spec
                + request.num_output_placeholders
                - request.num_computed_tokens
            )
            if 0 < self.long_prefill_token_threshold < num_new_tokens:
                num_new_tokens = self.long_prefill_token_threshold
            # The input positions must stay below max_model_len.
            room = self.max_model_len - 1 - request.num_computed_tokens
            num_new_tokens = min(num_new_tokens, token_budget, room)
            if num_new_tokens <= 0:
                # Its last token is not sampled yet. Serve the others: FCFS is bent on
                # purpose, as upstream does.
                req_index += 1
                continue

            while True:
                new_blocks = self.kv_cache_manager.allocate_slots(request, num_new_tokens)
                if new_blocks is not None:
                    break
                # Out of blocks: preempt the lowest-priority request and try again.
                if self.policy == SchedulingPolicy.PRIORITY:
                    # The victim may already be scheduled in this step: then its
                    # tokens go back to the budget and its entry leaves the output.
                    preempted_req = max(self.running, key=lambda r: (r.priority, r.arrival_time))
                    self.running.remove(preempted_req)
                    if preempted_req in scheduled_running_reqs:
                        scheduled_running_reqs.remove(preempted_req)
                        token_budget += num_scheduled_tokens.pop(preempted_req.request_id)
                        req_to_new_blocks.pop(preempted_req.request_id)
                        req_index -= 1
                else:
                    # Under FCFS the lowest priority is the last admitted.
                    preempted_req = self.running.pop()
                self._preempt_request(preempted_req)
                preempted_reqs.append(preempted_req)
                if preempted_req is request:
                    # It preempted itself: nobody is left to make room for it.
                    break
            if new_blocks is None:
                break

            scheduled_running_reqs.append(request)
            req_to_new_blocks[request.request_id] = new_blocks
            num_scheduled_tokens[request.request_id] = num_new_tokens
            token_budget -= num_new_tokens
            req_index += 1

        # 2. Waiting requests, only when memory was not tight this step.
        if not preempted_reqs:
            while self.waiting and token_budget > 0:
                if len(self.running) == self.max_num_running_reqs:
                    break
                request = self.waiting.peek_request()

                # A resumed request too: its freed blocks may still be cached.
                new_computed_blocks, num_new_local_computed_tokens = (
                    self.kv_cache_manager.get_computed_blocks(request)
                )
                num_computed_tokens = num_new_local_computed_tokens
                assert num_computed_tokens < request.num_tokens

                # num_tokens: a resumed request also recomputes its earlier outputs.
                num_new_tokens = request.num_tokens - num_computed_tokens
                threshold = self.long_prefill_token_threshold
                if 0 < threshold < num_new_tokens:
                    num_new_tokens = threshold
                if not self.enable_chunked_prefill and num_new_tokens > token_budget:
                    # Without chunking the prompt must fit whole; nobody may overtake it.
                    break
                num_new_tokens = min(num_new_tokens, token_budget)
                assert num_new_tokens > 0

                new_blocks = self.kv_cache_manager.allocate_slots(
                    request,
                    num_new_tokens,
                    num_new_computed_tokens=num_new_local_computed_tokens,
                    new_computed_blocks=new_computed_blocks,
                    full_sequence_must_fit=self.scheduler_reserve_full_isl,
                )
                if new_blocks is None:
                    # Does not fit; FCFS forbids letting a later request overtake.
                    break

                request = self.waiting.pop_request()
                self.running.append(request)
                if request.status == RequestStatus.WAITING:
                    scheduled_new_reqs.append(request)
                elif request.status == RequestStatus.PREEMPTED:
                    scheduled_resumed_reqs.append(request)
                else:
                    raise RuntimeError(
                        f"request {request.request_id!r} in the waiting queue has status "
                        f"{request.status}"
                    )
                req_to_new_blocks[request.request_id] = self.kv_cache_manager.get_blocks(
                    request.request_id
                )
                num_scheduled_tokens[request.request_id] = num_new_tokens
                token_budget -= num_new_tokens
                request.status = RequestStatus.RUNNING
                request.num_computed_tokens = num_computed_tokens

        total_num_scheduled_tokens = sum(num_scheduled_tokens.values())
        assert total_num_scheduled_tokens <= self.max_num_scheduled_tokens
        assert token_budget >= 0
        assert len(self.running) <= self.max_num_running_reqs
        assert len(scheduled_new_reqs) + len(scheduled_resumed_reqs) + len(
            scheduled_running_reqs
        ) <= len(self.running)

        new_reqs_data = [
            NewRequestData.from_request(req, req_to_new_blocks[req.request_id].get_block_ids())
            for req in scheduled_new_reqs
        ]
        cached_reqs_data = self._make_cached_request_data(
            scheduled_running_reqs, scheduled_resumed_reqs, num_scheduled_tokens, req_to_new_blocks
        )
        self.prev_step_scheduled_req_ids = set(num_scheduled_tokens)

        scheduler_output = SchedulerOutput(
            scheduled_new_reqs=new_reqs_data,
            scheduled_cached_reqs=cached_reqs_data,
            num_scheduled_tokens=num_scheduled_tokens,
            total_num_scheduled_tokens=total_num_scheduled_tokens,
            # Finished since the previous schedule(); a new set is started below.
            finished_req_ids=self.finished_req_ids,
            preempted_req_ids={req.request_id for req in preempted_reqs},
        )
        self._update_after_schedule(scheduler_output)
        return scheduler_output

    def _preempt_request(self, request: Request) -> None:
        """Preempt by recompute: free the blocks, reset progress, count it, requeue at the front.
        The caller took the request (RUNNING, else RuntimeError) out of ``self.running``; its
        tokens are kept, and once readmitted it recomputes their KV."""
        if request.status != RequestStatus.RUNNING:
            raise RuntimeError(f"only running requests can be preempted: {request!r}")
        self.kv_cache_manager.free(request)
        request.status = RequestStatus.PREEMPTED
        request.num_computed_tokens = 0
        request.spec_token_ids = []
        request.num_preemptions += 1
        self.waiting.prepend_request(request)

    def _update_after_schedule(self, scheduler_output: SchedulerOutput) -> None:
        """Advance ``num_computed_tokens`` of the scheduled requests; start a new finished set.
        Done once the output (which carries the old values) is built, before the step runs, so a
        prompt's next chunk can be scheduled at once. ``is_prefill_chunk``: no token is sampled."""
        for req_id, num_tokens in scheduler_output.num_scheduled_tokens.items():
            request = self.requests[req_id]
            request.num_computed_tokens += num_tokens
            request.is_prefill_chunk = request.num_computed_tokens < request.num_tokens
        # A fresh set: the output just built keeps a reference to the old one.
        self.finished_req_ids = set()

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
        # Reject a runner bug before changing anything.
        for req_id, tokens in sampled_token_ids.items():
            request = self.requests.get(req_id)
            if tokens and request is not None and request.is_prefill_chunk:
                raise ValueError(
                    f"request {req_id!r} is mid-prefill ({request.num_computed_tokens} of "
                    f"{request.num_tokens} tokens computed) but was given sampled tokens "
                    f"{list(tokens)}; a partial prefill samples nothing"
                )

        outputs: list[EngineCoreOutput] = []
        stopped_running_reqs: set[Request] = set()
        stopped_preempted_reqs: set[Request] = set()
        for req_id in scheduler_output.num_scheduled_tokens:
            request = self.requests.get(req_id)
            if request is None or request.is_finished():
                # Aborted while the step ran.
                continue
            new_token_ids = list(sampled_token_ids.get(req_id, ()))
            stopped = False
            status_before_stop = request.status
            if new_token_ids:
                new_token_ids, stopped = self._update_request_with_output(request, new_token_ids)
            finish_reason = None
            if stopped:
                finish_reason = request.get_finished_reason()
                self._free_request(request)
                if status_before_stop == RequestStatus.RUNNING:
                    stopped_running_reqs.add(request)
                else:
                    # Preempted by a schedule() planned while this step ran (async
                    # scheduling): it waits in the waiting queue, not in running.
                    stopped_preempted_reqs.add(request)
            if new_token_ids or stopped:
                output = EngineCoreOutput(req_id, new_token_ids, finish_reason, request.stop_reason)
                outputs.append(output)
        if stopped_running_reqs:
            self.running = [req for req in self.running if req not in stopped_running_reqs]
        if stopped_preempted_reqs:
            self.waiting.remove_requests(stopped_preempted_reqs)
        return outputs

    def _update_request_with_output(
        self, request: Request, new_token_ids: list[int]
    ) -> tuple[list[int], bool]:
        """Append tokens one by one, stopping (and trimming) at the first stop."""
        stopped = False
        for num_new, token_id in enumerate(new_token_ids, 1):
            request.append_output_token_ids(token_id)
            stopped = check_stop(request, self.max_model_len)
            if stopped:
                del new_token_ids[num_new:]
                break
        return new_token_ids, stopped

    def _free_request(self, request: Request) -> None:
        """Release a finished request: its blocks now, its runner state next step."""
        assert request.is_finished()
        self.kv_cache_manager.free(request)
        self.finished_req_ids.add(request.request_id)
        del self.requests[request.request_id]
