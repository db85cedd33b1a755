"""Async scheduling (``vllm/v1/core/sched/async_scheduler.py``, on by default): plan step N+1
while step N is still on the GPU (why, and how: docs/upstream-fidelity.md)."""

from __future__ import annotations

from mini_vllm.core.sched.output import SchedulerOutput
from mini_vllm.core.sched.scheduler import Scheduler
from mini_vllm.request import Request, RequestStatus


class AsyncScheduler(Scheduler):
    """The scheduler with output placeholders for the step in flight: ``schedule()`` counts a
    request's placeholder as a known token; the sampled token's arrival retires it."""

    def _update_after_schedule(self, scheduler_output: SchedulerOutput) -> None:
        super()._update_after_schedule(scheduler_output)
        for req_id in scheduler_output.num_scheduled_tokens:
            request = self.requests[req_id]
            if not request.is_prefill_chunk:
                # This step ends with every known token computed: it samples one.
                request.num_output_placeholders += 1

    def _update_request_with_output(
        self, request: Request, new_token_ids: list[int]
    ) -> tuple[list[int], bool]:
        status_before_update = request.status
        new_token_ids, stopped = super()._update_request_with_output(request, new_token_ids)
        request.num_output_placeholders -= len(new_token_ids)
        assert request.num_output_placeholders >= 0
        # Publish the blocks the token filled now (a preempted request has none), only those
        # with KV: a step still in flight holds a placeholder whose KV is not written yet.
        if status_before_update == RequestStatus.RUNNING:
            self.kv_cache_manager.cache_blocks(
                request, request.num_computed_tokens - request.num_output_placeholders
            )
        return new_token_ids, stopped
