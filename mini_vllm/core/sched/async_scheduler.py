"""Async scheduling: plan step N+1 while step N is still on the GPU.

Mirrors ``vllm/v1/core/sched/async_scheduler.py`` (``AsyncScheduler``), on by default at the pin.
The engine calls ``schedule()`` for the next step right after launching the current one, so the
Python of scheduling and output handling overlaps the GPU; each request that will get a token from
the step in flight carries an output placeholder (``Request.num_output_placeholders``) that
``schedule()`` counts as a known token and ``_update_request_with_output`` retires when the token
arrives. Why it pays, and what happens to a request that stops on the token in flight:
docs/upstream-fidelity.md (module notes).
"""

from __future__ import annotations

from mini_vllm.core.sched.output import SchedulerOutput
from mini_vllm.core.sched.scheduler import Scheduler
from mini_vllm.request import Request, RequestStatus


class AsyncScheduler(Scheduler):
    """The scheduler with output placeholders for the step in flight."""

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
        # The token's block may now be full: publish it to the prefix cache right away (a
        # preempted request's blocks are gone). Only blocks whose KV is computed: a request
        # that stops here may still have a step in flight, whose placeholder stays counted,
        # and the block that step's token completes holds no KV for it yet.
        if status_before_update == RequestStatus.RUNNING:
            self.kv_cache_manager.cache_blocks(
                request, request.num_computed_tokens - request.num_output_placeholders
            )
        return new_token_ids, stopped
