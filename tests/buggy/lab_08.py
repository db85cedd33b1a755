"""Buggy implementations of lab-08 (the scheduler).

Each mutant is one mistake a learner plausibly makes, written as an edit of the solution
(``grading.mutants.Mutant``). ``python -m grading check-suites lab-08`` and
``tests/test_buggy_implementations.py`` check that the graded suite catches every one of them.
"""

from __future__ import annotations

from grading.mutants import Mutant

FILE = "scheduler.py"

MUTANTS = [
    # -- check_stop ----------------------------------------------------------------------------
    Mutant(
        name="eos_ignored",
        file=FILE,
        find="""
            if request.eos_token_id is not None and last_token_id == request.eos_token_id:
                request.status = RequestStatus.FINISHED_STOPPED
                return True
        """,
        replace="",
        why="check_stop never looks at EOS: requests run on to max_tokens after the model has "
            "said it is done",
    ),
    Mutant(
        name="ignore_eos_also_ignores_stop_tokens",
        file=FILE,
        find="if last_token_id in (sampling_params.stop_token_ids or ()):",
        replace="if not sampling_params.ignore_eos and last_token_id in "
                "(sampling_params.stop_token_ids or ()):",
        why="reads ignore_eos as 'ignore every stop condition': upstream ignores only EOS, a "
            "stop token still ends the request",
    ),
    Mutant(
        name="stops_on_all_stop_token_ids",
        file=FILE,
        find="if last_token_id in (sampling_params.stop_token_ids or ()):",
        replace="if last_token_id in sampling_params.all_stop_token_ids:",
        why="checks all_stop_token_ids, which holds the model's EOS even under ignore_eos (it is "
            "the set min_tokens masks): ignore_eos requests stop on EOS anyway",
    ),
    Mutant(
        name="max_tokens_off_by_one",
        file=FILE,
        find="request.num_output_tokens >= request.max_tokens",
        replace="request.num_output_tokens > request.max_tokens",
        why="stops one token late: a request asked for max_tokens outputs gets max_tokens + 1",
    ),
    Mutant(
        name="min_tokens_ignored",
        file=FILE,
        find="""
            if request.num_output_tokens < sampling_params.min_tokens:
                return False
        """,
        replace="",
        why="EOS and stop tokens end the request before min_tokens outputs were generated",
    ),
    # -- update_from_output --------------------------------------------------------------------
    Mutant(
        name="output_not_trimmed_at_stop",
        file=FILE,
        find="del new_token_ids[num_new:]",
        replace="pass",
        why="the tokens sampled after the stop token are still returned to the client",
    ),
    Mutant(
        name="finished_request_stays_running",
        file=FILE,
        find="stopped_running_reqs.add(request)",
        replace="pass",
        why="a finished (and freed) request is never removed from running: the next step "
            "schedules a request that has no blocks any more",
    ),
    Mutant(
        name="finished_blocks_leaked",
        file=FILE,
        find="""
            assert request.is_finished()
            self.kv_cache_manager.free(request)
        """,
        replace="""
            assert request.is_finished()
        """,
        why="_free_request forgets kv_cache_manager.free: every finished request leaks its "
            "blocks until the pool is empty",
    ),
    # -- schedule: the running loop ------------------------------------------------------------
    Mutant(
        name="preempts_the_first_running_request",
        file=FILE,
        find="preempted_req = self.running.pop()",
        replace="preempted_req = self.running.pop(0)",
        why="preempts the oldest running request instead of the last admitted one: under FCFS "
            "the latest arrival has the lowest priority",
    ),
    Mutant(
        name="running_tokens_not_subtracted",
        file=FILE,
        find="""
            num_scheduled_tokens[request.request_id] = num_new_tokens
            token_budget -= num_new_tokens
            req_index += 1
        """,
        replace="""
            num_scheduled_tokens[request.request_id] = num_new_tokens
            req_index += 1
        """,
        why="the running loop does not charge its tokens to the budget: the step overruns "
            "max_num_batched_tokens",
    ),
    Mutant(
        name="threshold_ignored_for_running",
        file=FILE,
        find="""
            if 0 < self.long_prefill_token_threshold < num_new_tokens:
                num_new_tokens = self.long_prefill_token_threshold
        """,
        replace="",
        why="long_prefill_token_threshold caps only the first chunk: a running request "
            "continuing its prefill takes the whole budget",
    ),
    # -- schedule: the waiting loop ------------------------------------------------------------
    Mutant(
        name="admits_after_a_preemption",
        file=FILE,
        find="if not preempted_reqs:",
        replace="if True:",
        why="admits waiting requests in a step that had to preempt: memory is tight, so the "
            "newcomer will only cause the next preemption",
    ),
    Mutant(
        name="separate_budget_for_waiting",
        file=FILE,
        find="""
            if not preempted_reqs:
                while self.waiting and token_budget > 0:
        """,
        replace="""
            if not preempted_reqs:
                token_budget = self.max_num_scheduled_tokens
                while self.waiting and token_budget > 0:
        """,
        why="gives prefill (waiting requests) its own budget, as if there were separate prefill "
            "and decode phases: the step overruns max_num_batched_tokens",
    ),
    Mutant(
        name="max_num_seqs_ignored",
        file=FILE,
        find="""
            if len(self.running) == self.max_num_running_reqs:
                break
        """,
        replace="",
        why="admission never checks max_num_seqs: more requests run at once than the runner "
            "has room for",
    ),
    Mutant(
        name="waiting_tokens_not_subtracted",
        file=FILE,
        find="""
            num_scheduled_tokens[request.request_id] = num_new_tokens
            token_budget -= num_new_tokens
            request.status = RequestStatus.RUNNING
        """,
        replace="""
            num_scheduled_tokens[request.request_id] = num_new_tokens
            request.status = RequestStatus.RUNNING
        """,
        why="admissions do not charge their tokens to the budget: every waiting prompt gets "
            "the full budget and the step overruns it",
    ),
    Mutant(
        name="threshold_ignored_for_waiting",
        file=FILE,
        find="""
            if 0 < threshold < num_new_tokens:
                num_new_tokens = threshold
        """,
        replace="",
        why="long_prefill_token_threshold is not applied on admission: a long new prompt takes "
            "the whole budget in its first step",
    ),
    Mutant(
        name="prefix_hits_ignored",
        file=FILE,
        find="""
            new_blocks = self.kv_cache_manager.allocate_slots(
                request,
                num_new_tokens,
                num_new_computed_tokens=num_new_local_computed_tokens,
                new_computed_blocks=new_computed_blocks,
            )
        """,
        replace="""
            num_computed_tokens = 0
            num_new_tokens = min(request.num_tokens, token_budget)
            if 0 < threshold < num_new_tokens:
                num_new_tokens = threshold
            new_blocks = self.kv_cache_manager.allocate_slots(request, num_new_tokens)
        """,
        why="looks the prefix up but does not use the hit: the whole prompt is recomputed and "
            "the cached blocks are not shared",
    ),
    Mutant(
        name="no_chunked_prefill_check",
        file=FILE,
        find="""
            if not self.enable_chunked_prefill and num_new_tokens > token_budget:
        """,
        replace="""
            if False:
        """,
        why="ignores enable_chunked_prefill=False: a prompt that does not fit is split anyway",
    ),
    # -- preemption and the end of a step ------------------------------------------------------
    Mutant(
        name="preempted_request_to_the_back",
        file=FILE,
        find="self.waiting.prepend_request(request)",
        replace="self.waiting.add_request(request)",
        why="the preempted request goes to the back of the waiting queue: requests that arrived "
            "after it overtake it (not FCFS)",
    ),
    Mutant(
        name="num_computed_tokens_not_reset",
        file=FILE,
        find="""
            request.status = RequestStatus.PREEMPTED
            request.num_computed_tokens = 0
        """,
        replace="""
            request.status = RequestStatus.PREEMPTED
        """,
        why="a preempted request keeps num_computed_tokens although its KV was freed: it claims "
            "to have computed tokens it no longer holds",
    ),
    Mutant(
        name="preemption_not_counted",
        file=FILE,
        find="request.num_preemptions += 1",
        replace="pass",
        why="num_preemptions is not incremented: the prefix-cache stats count a resumed request "
            "as new traffic and the metrics never see preemptions",
    ),
    Mutant(
        name="preempted_blocks_not_freed",
        file=FILE,
        find="""
            self.kv_cache_manager.free(request)
            request.status = RequestStatus.PREEMPTED
        """,
        replace="""
            request.status = RequestStatus.PREEMPTED
        """,
        why="preemption forgets to free the victim's blocks, so it frees no memory: the retry "
            "fails again and everyone gets preempted",
    ),
    Mutant(
        name="chunk_not_resumed",
        file=FILE,
        find="request.num_computed_tokens += num_tokens",
        replace="request.num_computed_tokens = num_tokens",
        why="_update_after_schedule sets num_computed_tokens to this step's tokens instead of "
            "adding them: a chunked prompt restarts at the wrong place",
    ),
]
