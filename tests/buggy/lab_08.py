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
        caught_by="test_stop.py::test_eos_stops",
    ),
    Mutant(
        name="ignore_eos_also_ignores_stop_tokens",
        file=FILE,
        find="if last_token_id in (sampling_params.stop_token_ids or ()):",
        replace="if not sampling_params.ignore_eos and last_token_id in "
        "(sampling_params.stop_token_ids or ()):",
        why="reads ignore_eos as 'ignore every stop condition': upstream ignores only EOS, a "
        "stop token still ends the request",
        caught_by="test_stop.py::test_stop_tokens_apply_even_with_ignore_eos",
    ),
    Mutant(
        name="stops_on_all_stop_token_ids",
        file=FILE,
        find="if last_token_id in (sampling_params.stop_token_ids or ()):",
        replace="if last_token_id in sampling_params.all_stop_token_ids:",
        why="checks all_stop_token_ids, which holds the model's EOS even under ignore_eos (it is "
        "the set min_tokens masks): ignore_eos requests stop on EOS anyway",
        caught_by="test_stop.py::test_stop_tokens_apply_even_with_ignore_eos",
    ),
    Mutant(
        name="max_tokens_off_by_one",
        file=FILE,
        find="request.num_output_tokens >= request.max_tokens",
        replace="request.num_output_tokens > request.max_tokens",
        why="stops one token late: a request asked for max_tokens outputs gets max_tokens + 1",
        caught_by="test_stop.py::test_max_tokens_stops_exactly",
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
        caught_by="test_stop.py::test_min_tokens_and_the_order_of_checks",
    ),
    # -- update_from_output --------------------------------------------------------------------
    Mutant(
        name="output_not_trimmed_at_stop",
        file=FILE,
        find="del new_token_ids[num_new:]",
        replace="pass",
        why="the tokens sampled after the stop token are still returned to the client",
        caught_by="test_stop.py::test_update_from_output_trims_and_frees",
    ),
    Mutant(
        name="finished_request_stays_running",
        file=FILE,
        find="stopped_running_reqs.add(request)",
        replace="pass",
        why="a finished (and freed) request is never removed from running: the next step "
        "schedules a request that has no blocks any more",
        caught_by="test_stop.py::test_update_from_output_trims_and_frees",
    ),
    Mutant(
        name="stopped_preempted_request_left_in_waiting",
        file=FILE,
        find="""
            if stopped_preempted_reqs:
                self.waiting.remove_requests(stopped_preempted_reqs)
        """,
        replace="",
        why="only running is filtered: a request that stops while PREEMPTED (its token was in "
        "flight when the next schedule() preempted it, as async scheduling does) stays in "
        "the waiting queue, finished and freed; it is counted as unfinished, and the next "
        "schedule() tries to admit it",
        caught_by="test_preemption.py::test_a_request_that_stops_while_preempted_leaves_the_waiting_queue",
    ),
    Mutant(
        name="every_stopped_request_taken_for_running",
        file=FILE,
        find="""
            if status_before_stop == RequestStatus.RUNNING:
                stopped_running_reqs.add(request)
            else:
                # Preempted by a schedule() planned while this step ran (async
                # scheduling): it waits in the waiting queue, not in running.
                stopped_preempted_reqs.add(request)
        """,
        replace="""
            stopped_running_reqs.add(request)
        """,
        why="assumes a request that got a token is running: one preempted since its step was "
        "scheduled is filtered out of running, where it is not, and stays in the waiting "
        "queue although finished",
        caught_by="test_preemption.py::test_a_request_that_stops_while_preempted_leaves_the_waiting_queue",
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
        caught_by="test_stop.py::test_update_from_output_trims_and_frees",
    ),
    # -- schedule: the running loop ------------------------------------------------------------
    Mutant(
        name="preempts_the_first_running_request",
        file=FILE,
        find="preempted_req = self.running.pop()",
        replace="preempted_req = self.running.pop(0)",
        why="preempts the oldest running request instead of the last admitted one: under FCFS "
        "the latest arrival has the lowest priority",
        caught_by="test_preemption.py::test_preempts_the_last_running_request",
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
        caught_by="test_schedule.py::test_one_budget_for_everyone",
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
        caught_by="test_schedule.py::test_long_prefill_token_threshold",
    ),
    Mutant(
        name="threshold_of_one_read_as_off_for_running",
        file=FILE,
        find="if 0 < self.long_prefill_token_threshold < num_new_tokens:",
        replace="if 1 < self.long_prefill_token_threshold < num_new_tokens:",
        why="a threshold of 1 is read as no threshold in the running pass: after its first "
        "1-token chunk a prompt takes the rest of the budget (only 0 turns the cap off)",
        caught_by="test_schedule.py::test_long_prefill_token_threshold",
    ),
    # -- schedule: the waiting loop ------------------------------------------------------------
    Mutant(
        name="admits_after_a_preemption",
        file=FILE,
        find="if not preempted_reqs:",
        replace="if True:",
        why="admits waiting requests in a step that had to preempt: memory is tight, so the "
        "newcomer will only cause the next preemption",
        caught_by="test_preemption.py::test_the_victim_is_not_readmitted_in_the_same_step",
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
        caught_by="test_schedule.py::test_one_budget_for_everyone",
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
        caught_by="test_schedule.py::test_max_num_seqs",
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
        caught_by="test_schedule.py::test_running_first_then_waiting",
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
        caught_by="test_schedule.py::test_long_prefill_token_threshold",
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
                full_sequence_must_fit=self.scheduler_reserve_full_isl,
            )
        """,
        replace="""
            num_computed_tokens = 0
            num_new_tokens = min(request.num_tokens, token_budget)
            if 0 < threshold < num_new_tokens:
                num_new_tokens = threshold
            new_blocks = self.kv_cache_manager.allocate_slots(
                request, num_new_tokens, full_sequence_must_fit=self.scheduler_reserve_full_isl
            )
        """,
        why="looks the prefix up but does not use the hit: the whole prompt is recomputed and "
        "the cached blocks are not shared",
        caught_by="test_schedule.py::test_prefix_hit_skips_cached_tokens",
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
        caught_by="test_schedule.py::test_without_chunked_prefill",
    ),
    # -- preemption and the end of a step ------------------------------------------------------
    Mutant(
        name="preempted_request_to_the_back",
        file=FILE,
        find="self.waiting.prepend_request(request)",
        replace="self.waiting.add_request(request)",
        why="the preempted request goes to the back of the waiting queue: requests that arrived "
        "after it overtake it (not FCFS)",
        caught_by="test_preemption.py::test_preempted_request_goes_to_the_front",
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
        caught_by="test_preemption.py::test_preempts_the_last_running_request",
    ),
    Mutant(
        name="preemption_not_counted",
        file=FILE,
        find="request.num_preemptions += 1",
        replace="pass",
        why="num_preemptions is not incremented: the prefix-cache stats count a resumed request "
        "as new traffic and the metrics never see preemptions",
        caught_by="test_preemption.py::test_preempts_the_last_running_request",
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
        caught_by="test_preemption.py::test_preempts_the_last_running_request",
    ),
    Mutant(
        name="chunk_not_resumed",
        file=FILE,
        find="request.num_computed_tokens += num_tokens",
        replace="request.num_computed_tokens = num_tokens",
        why="_update_after_schedule sets num_computed_tokens to this step's tokens instead of "
        "adding them: a chunked prompt restarts at the wrong place",
        caught_by="test_stop.py::test_no_output_for_a_prefill_chunk",
    ),
    Mutant(
        name="update_after_schedule_walks_all_running",
        file=FILE,
        find="""
            for req_id, num_tokens in scheduler_output.num_scheduled_tokens.items():
                request = self.requests[req_id]
                request.num_computed_tokens += num_tokens
        """,
        replace="""
            for request in self.running:
                num_tokens = scheduler_output.num_scheduled_tokens.get(request.request_id, 0)
                request.num_computed_tokens += num_tokens
        """,
        why="_update_after_schedule walks every running request, adding 0 for those left out "
        "of the step: a decoding request the pass never reached is marked mid-prefill, and "
        "the runner's token for it then raises instead of being ignored",
        caught_by="test_admission.py::test_requests_left_out_of_the_step_keep_their_progress",
    ),
    Mutant(
        name="previous_step_not_remembered",
        file=FILE,
        find="""
            self.prev_step_scheduled_req_ids = set(num_scheduled_tokens)
        """,
        replace="",
        why="schedule() never records the ids it scheduled, so _make_cached_request_data takes "
        "every running request for one the runner has not seen and resends its whole token "
        "list every step (upstream sends it only to resumed requests and to those that sat "
        "out the previous step)",
        caught_by="test_schedule.py::test_whole_token_lists_only_where_the_runner_may_be_stale",
    ),
    # -- finish_requests (aborts) --------------------------------------------------------------
    Mutant(
        name="abort_repeated_ids_not_deduped",
        file=FILE,
        find="ids = dict.fromkeys(request_ids)  # dedupe, keep order",
        replace="ids = list(request_ids)",
        why="finish_requests(['a', 'a']) finds a unfinished twice (statuses change only after "
        "the first pass), so it frees a twice and lists it twice",
        caught_by="test_aborts.py::test_finish_requests_aborts",
    ),
    Mutant(
        name="abort_str_iterated_per_character",
        file=FILE,
        find="""
            if isinstance(request_ids, str):
                ids: Iterable[str] = (request_ids,)
            elif request_ids is None:
        """,
        replace="""
            if request_ids is None:
        """,
        why="forgets that one id may come as a str: finish_requests('r1') iterates 'r' and '1', "
        "finds no such requests and aborts nothing",
        caught_by="test_aborts.py::test_finish_requests_aborts",
    ),
    Mutant(
        name="abort_of_preempted_left_in_waiting",
        file=FILE,
        find="""
            if request.status == RequestStatus.RUNNING:
                running_to_remove.add(request)
            else:
                waiting_to_remove.append(request)
        """,
        replace="""
            if request.status == RequestStatus.RUNNING:
                running_to_remove.add(request)
            elif request.status == RequestStatus.WAITING:
                waiting_to_remove.append(request)
        """,
        why="only WAITING requests are taken out of the waiting queue: an aborted PREEMPTED one "
        "stays there, finished, and is scheduled again later",
        caught_by="test_aborts.py::test_finish_requests_aborts",
    ),
    Mutant(
        name="abort_of_waiting_not_removed",
        file=FILE,
        find="""
            if waiting_to_remove:
                self.waiting.remove_requests(waiting_to_remove)
        """,
        replace="""
            pass
        """,
        why="aborted waiting requests are freed but left in the waiting queue, where the "
        "scheduler finds a finished request to admit",
        caught_by="test_aborts.py::test_finish_requests_aborts",
    ),
    Mutant(
        name="abort_of_waiting_not_freed",
        file=FILE,
        find="""
            request.status = finished_status
            self._free_request(request)
        """,
        replace="""
            request.status = finished_status
            if request in running_to_remove:
                self._free_request(request)
        """,
        why="'a waiting request holds no blocks, so there is nothing to free': but freeing also "
        "forgets the request and reports it to the runner; it stays in requests forever",
        caught_by="test_aborts.py::test_finish_requests_aborts",
    ),
    # -- update_from_output: what the runner hands back ----------------------------------------
    Mutant(
        name="update_assumes_scheduled_requests_still_exist",
        file=FILE,
        find="""
            request = self.requests.get(req_id)
            if request is None or request.is_finished():
                # Aborted while the step ran.
                continue
        """,
        replace="""
            request = self.requests[req_id]
        """,
        why="every request of the output is assumed to be still there: one aborted between "
        "schedule() and update_from_output() raises KeyError",
        caught_by="test_aborts.py::test_abort_between_schedule_and_update",
    ),
    Mutant(
        name="update_applies_tokens_of_unscheduled_requests",
        file=FILE,
        find="for req_id in scheduler_output.num_scheduled_tokens:",
        replace="for req_id in sampled_token_ids:",
        why="walks the runner's sampled tokens instead of the scheduled requests: tokens handed "
        "back for a request that was not in the step (waiting, preempted, not reached) are "
        "appended to it",
        caught_by="test_aborts.py::test_update_from_output_checks_the_runner",
    ),
    Mutant(
        name="update_trusts_tokens_for_a_prefill_chunk",
        file=FILE,
        find="""
            # Reject a runner bug before changing anything.
            for req_id, tokens in sampled_token_ids.items():
                request = self.requests.get(req_id)
                if tokens and request is not None and request.is_prefill_chunk:
                    raise ValueError(
                        f"request {req_id!r} is mid-prefill ({request.num_computed_tokens} of "
                        f"{request.num_tokens} tokens computed) but was given sampled tokens "
                        f"{list(tokens)}; a partial prefill samples nothing"
                    )
        """,
        replace="",
        why="no check of the runner's output: a token sampled from the logits of a non-final "
        "prompt chunk is appended as if it were the model's next token",
        caught_by="test_aborts.py::test_update_from_output_checks_the_runner",
    ),
    Mutant(
        name="update_rejects_an_empty_list_for_a_prefill_chunk",
        file=FILE,
        find="if tokens and request is not None and request.is_prefill_chunk:",
        replace="if request is not None and request.is_prefill_chunk:",
        why="any entry for a request mid-prefill is taken for a runner bug, even the empty list "
        "a runner hands back for a partial prefill (no token): a correct step is refused",
        caught_by="test_aborts.py::test_update_from_output_checks_the_runner",
    ),
    Mutant(
        name="update_checks_the_runner_while_applying",
        file=FILE,
        find="""
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
        """,
        replace="""
            outputs: list[EngineCoreOutput] = []
            stopped_running_reqs: set[Request] = set()
            stopped_preempted_reqs: set[Request] = set()
            for req_id in scheduler_output.num_scheduled_tokens:
                request = self.requests.get(req_id)
                if request is None or request.is_finished():
                    # Aborted while the step ran.
                    continue
                new_token_ids = list(sampled_token_ids.get(req_id, ()))
                if new_token_ids and request.is_prefill_chunk:
                    raise ValueError(f"request {req_id!r} is mid-prefill but got tokens")
        """,
        why="checks the runner's tokens request by request while applying them: when a later "
        "request of the batch turns out to be mid-prefill, the earlier ones already got "
        "their tokens, and the step is half applied",
        caught_by="test_aborts.py::test_update_from_output_checks_the_runner",
    ),
    Mutant(
        name="finished_ids_reset_in_update",
        file=FILE,
        find="outputs: list[EngineCoreOutput] = []",
        replace="self.finished_req_ids = set()\noutputs: list[EngineCoreOutput] = []",
        why="starts a fresh finished set when a step's results come in instead of when its "
        "output is built: a request aborted while the step ran is never reported to the "
        "runner, which keeps its state forever",
        caught_by="test_preemption.py::test_a_request_that_stops_while_preempted_leaves_the_waiting_queue",
    ),
    # -- the admission gate and the priority policy -------------------------------------------
    Mutant(
        name="gate_not_passed",
        file=FILE,
        find="full_sequence_must_fit=self.scheduler_reserve_full_isl,",
        replace="",
        why="never asks allocate_slots for the admission gate: a prompt is admitted when its "
        "first chunk fits, and one that cannot finish is later preempted mid-prefill",
        caught_by="test_admission.py::test_the_gate_waits_for_the_whole_prompt",
    ),
    Mutant(
        name="gate_always_on",
        file=FILE,
        find="full_sequence_must_fit=self.scheduler_reserve_full_isl,",
        replace="full_sequence_must_fit=True,",
        why="ignores scheduler_reserve_full_isl=False: the engine option to admit on the first "
        "chunk does nothing",
        caught_by="test_preemption.py::test_the_victim_is_not_readmitted_in_the_same_step",
    ),
    Mutant(
        name="priority_victim_is_the_last",
        file=FILE,
        find="if self.policy == SchedulingPolicy.PRIORITY:",
        replace="if False:",
        why="preempts the last admitted request under the priority policy too: a low-priority "
        "request admitted early keeps running while an urgent one is thrown out",
        caught_by="test_admission.py::test_priority_preempts_the_lowest_priority",
    ),
    Mutant(
        name="priority_victim_keeps_its_tokens",
        file=FILE,
        find="if preempted_req in scheduled_running_reqs:",
        replace="if False:",
        why="a victim already scheduled this step stays in the batch: its tokens are not given "
        "back to the budget and the runner is sent a preempted request whose blocks are gone",
        caught_by="test_admission.py::test_priority_preempts_the_lowest_priority",
    ),
    Mutant(
        name="priority_victim_index_not_adjusted",
        file=FILE,
        find="req_index -= 1",
        replace="pass",
        why="removing an earlier running request shifts the list, but the index is not moved "
        "back: the request after the current one is skipped this step",
        caught_by="test_admission.py::test_priority_preempts_the_lowest_priority",
    ),
    Mutant(
        name="priority_victim_by_priority_only",
        file=FILE,
        find="preempted_req = max(self.running, key=lambda r: (r.priority, r.arrival_time))",
        replace="preempted_req = max(self.running, key=lambda r: r.priority)",
        why="ties in priority are not broken by arrival: among equals the earliest arrival is "
        "preempted instead of the latest",
        caught_by="test_admission.py::test_priority_random_workloads",
    ),
    Mutant(
        name="repetition_before_length",
        file=FILE,
        find="if request.num_tokens >= max_model_len or request.num_output_tokens >= request.max_tokens:",
        replace="if sampling_params.repetition_detection is not None and check_sequence_repetition(request.output_token_ids, sampling_params.repetition_detection):\n    request.status = RequestStatus.FINISHED_REPETITION\n    request.stop_reason = 'repetition_detected'\n    return True\nif request.num_tokens >= max_model_len or request.num_output_tokens >= request.max_tokens:",
        why="checks the repetition before the length limits: a request whose last allowed token "
        "completes a loop reports 'repetition' instead of 'length'",
        caught_by="test_stop.py::test_repetition_stops_the_request",
    ),
    Mutant(
        name="repetition_ignored",
        file=FILE,
        find="if repetition is not None and check_sequence_repetition(request.output_token_ids, repetition):",
        replace="if False:",
        why="never applies repetition_detection: a model stuck in a loop runs to max_tokens",
        caught_by="test_stop.py::test_repetition_stops_the_request",
    ),
    Mutant(
        name="finished_ids_cleared_in_place",
        file=FILE,
        find="self.finished_req_ids = set()",
        replace="self.finished_req_ids.clear()",
        why="clears the finished set in place right after the output took it: the runner never "
        "hears that a request finished and keeps its state",
        caught_by="test_schedule.py::test_each_output_keeps_its_finished_ids",
    ),
    # -- found by a hunt for gaps: each needed a stronger or a new test -----------------------
    Mutant(
        name="min_tokens_guards_only_eos",
        file=FILE,
        find="""
            if request.num_output_tokens < sampling_params.min_tokens:
                return False
            last_token_id = request.output_token_ids[-1]
            if request.eos_token_id is not None and last_token_id == request.eos_token_id:
        """,
        replace="""
            last_token_id = request.output_token_ids[-1]
            if (
                request.num_output_tokens >= sampling_params.min_tokens
                and request.eos_token_id is not None
                and last_token_id == request.eos_token_id
            ):
        """,
        why="reads min_tokens as 'no EOS before min_tokens' only: a stop token still ends the "
        "request before min_tokens outputs",
        caught_by="test_stop.py::test_min_tokens_and_the_order_of_checks",
    ),
    Mutant(
        name="length_checked_before_stop_tokens",
        file=FILE,
        find="""
            last_token_id = request.output_token_ids[-1]
            if request.eos_token_id is not None and last_token_id == request.eos_token_id:
        """,
        replace="""
            last_token_id = request.output_token_ids[-1]
            if request.num_tokens >= max_model_len or request.num_output_tokens >= request.max_tokens:
                request.status = RequestStatus.FINISHED_LENGTH_CAPPED
                return True
            if request.eos_token_id is not None and last_token_id == request.eos_token_id:
        """,
        why="checks the length limits first: EOS or a stop token on the max_tokens-th output is "
        "reported as 'length' (and loses its stop_reason) instead of 'stop'",
        caught_by="test_stop.py::test_min_tokens_and_the_order_of_checks",
    ),
    Mutant(
        name="repetition_checked_on_all_tokens",
        file=FILE,
        find="check_sequence_repetition(request.output_token_ids, repetition)",
        replace="check_sequence_repetition(request.all_token_ids, repetition)",
        why="looks for the repeated pattern in prompt + output: a pattern that starts in the "
        "prompt stops the request before its output repeats anything min_count times",
        caught_by="test_stop.py::test_repetition_stops_the_request",
    ),
    Mutant(
        name="check_stop_reads_sampling_params_max_tokens",
        file=FILE,
        find="request.num_output_tokens >= request.max_tokens:",
        replace="request.num_output_tokens >= sampling_params.max_tokens:",
        why="compares with sampling_params.max_tokens, which stays None for max_tokens=None "
        "(add_request resolves it into request.max_tokens): such a request raises TypeError "
        "on its first token",
        caught_by="test_stop.py::test_max_model_len_stops",
    ),
    Mutant(
        name="zero_token_request_stops_running_loop",
        file=FILE,
        find="""
            if num_new_tokens <= 0:
                # Its last token is not sampled yet. Serve the others: FCFS is bent on
                # purpose, as upstream does.
                req_index += 1
                continue
        """,
        replace="""
            if num_new_tokens <= 0:
                break
        """,
        why="a running request with nothing to compute (schedule() called again before its "
        "token came back) ends the running pass: the requests after it get nothing",
        caught_by="test_schedule.py::test_a_request_with_nothing_to_compute_is_skipped",
    ),
    Mutant(
        name="zero_token_request_not_skipped",
        file=FILE,
        find="""
            if num_new_tokens <= 0:
                # Its last token is not sampled yet. Serve the others: FCFS is bent on
                # purpose, as upstream does.
                req_index += 1
                continue
        """,
        replace="",
        why="no skip for a running request with nothing to compute: allocate_slots(request, 0) "
        "raises when schedule() runs again before the last step's tokens are in",
        caught_by="test_schedule.py::test_a_request_with_nothing_to_compute_is_skipped",
    ),
    Mutant(
        name="no_chunk_check_uses_ge",
        file=FILE,
        find="if not self.enable_chunked_prefill and num_new_tokens > token_budget:",
        replace="if not self.enable_chunked_prefill and num_new_tokens >= token_budget:",
        why="without chunked prefill, a prompt that fills the budget left exactly is taken for "
        "one that does not fit, and waits a step (with everyone behind it)",
        caught_by="test_schedule.py::test_without_chunked_prefill",
    ),
    Mutant(
        name="waiting_popped_then_put_back",
        file=FILE,
        find="""
            if new_blocks is None:
                # Does not fit; FCFS forbids letting a later request overtake.
                break

            request = self.waiting.pop_request()
        """,
        replace="""
            request = self.waiting.pop_request()
            if new_blocks is None:
                self.waiting.add_request(request)
                break
        """,
        why="pops the front request before knowing it fits and puts a refused one back with "
        "add_request, at the END of the queue: the requests behind it overtake it (not FCFS)",
        caught_by="test_admission.py::test_the_gate_waits_for_the_whole_prompt",
    ),
    Mutant(
        name="priority_victim_budget_not_returned",
        file=FILE,
        find="token_budget += num_scheduled_tokens.pop(preempted_req.request_id)",
        replace="num_scheduled_tokens.pop(preempted_req.request_id)",
        why="a victim already scheduled leaves the batch, but its tokens are not given back to "
        "the budget: the requests after it get less than is left",
        caught_by="test_admission.py::test_priority_preempts_the_lowest_priority",
    ),
    Mutant(
        name="self_preempted_loop_continues",
        file=FILE,
        find="""
            if new_blocks is None:
                break

            scheduled_running_reqs.append(request)
        """,
        replace="""
            if new_blocks is None:
                continue

            scheduled_running_reqs.append(request)
        """,
        why="after a request preempts itself the running pass goes on with the next one: "
        "under the priority policy the requests after it are scheduled in a step that had "
        "no room for it (upstream stops there)",
        caught_by="test_admission.py::test_priority_a_request_that_preempts_itself_stops_the_loop",
    ),
    Mutant(
        name="finish_requests_accepts_any_status",
        file=FILE,
        find="""
            if not RequestStatus.is_finished(finished_status):
                raise ValueError(f"{finished_status} is not a finished status")
        """,
        replace="",
        why="no check of the status: finish_requests(ids, RUNNING) takes the request out of "
        "its queue and then trips over the unfinished status while freeing it",
        caught_by="test_aborts.py::test_finish_requests_aborts",
    ),
    Mutant(
        name="repetition_ignores_min_tokens",
        file=FILE,
        find="""
            if request.num_output_tokens < sampling_params.min_tokens:
                return False
            last_token_id = request.output_token_ids[-1]
            if request.eos_token_id is not None and last_token_id == request.eos_token_id:
                request.status = RequestStatus.FINISHED_STOPPED
                return True
            if last_token_id in (sampling_params.stop_token_ids or ()):
        """,
        replace="""
            last_token_id = request.output_token_ids[-1]
            early = request.num_output_tokens < sampling_params.min_tokens
            if not early and request.eos_token_id is not None and last_token_id == request.eos_token_id:
                request.status = RequestStatus.FINISHED_STOPPED
                return True
            if not early and last_token_id in (sampling_params.stop_token_ids or ()):
        """,
        why="min_tokens guards only EOS and the stop tokens: a repeated pattern ends the request "
        "before min_tokens outputs (upstream returns False before any check)",
        caught_by="test_stop.py::test_min_tokens_and_the_order_of_checks",
    ),
    Mutant(
        name="no_chunk_check_ignores_prefix_hit",
        file=FILE,
        find="if not self.enable_chunked_prefill and num_new_tokens > token_budget:",
        replace="if not self.enable_chunked_prefill and request.num_tokens > token_budget:",
        why="with chunked prefill off, compares the whole prompt with the budget left instead of "
        "the tokens left to compute after the prefix hit: a request whose uncached rest fits "
        "waits a step, and everyone behind it",
        caught_by="test_schedule.py::test_prefix_hit_skips_cached_tokens",
    ),
    Mutant(
        name="max_num_seqs_counts_the_batch",
        file=FILE,
        find="if len(self.running) == self.max_num_running_reqs:",
        replace="if len(num_scheduled_tokens) == self.max_num_running_reqs:",
        why="takes max_num_seqs for the batch size: a running request left out of this step "
        "(its token still in flight when schedule() runs again) is not counted, and one more "
        "request than max_num_seqs is admitted",
        caught_by="test_schedule.py::test_a_request_with_nothing_to_compute_is_skipped",
    ),
    Mutant(
        name="preempts_once_then_gives_up",
        file=FILE,
        find="""
            if preempted_req is request:
                # It preempted itself: nobody is left to make room for it.
                break
        """,
        replace="""
            if preempted_req is request:
                # It preempted itself: nobody is left to make room for it.
                break
            new_blocks = self.kv_cache_manager.allocate_slots(request, num_new_tokens)
            break
        """,
        why="preempts one victim and retries once (an if, not a loop): a request that needs "
        "the blocks of two victims is not scheduled, and the running pass stops there with "
        "one request preempted for nothing",
        caught_by="test_preemption.py::test_preempts_again_until_it_fits",
    ),
    Mutant(
        name="threshold_caps_only_prompt_tokens",
        file=FILE,
        find="""
            if 0 < self.long_prefill_token_threshold < num_new_tokens:
                num_new_tokens = self.long_prefill_token_threshold
        """,
        replace="""
            if (
                request.num_computed_tokens < request.num_prompt_tokens
                and 0 < self.long_prefill_token_threshold < num_new_tokens
            ):
                num_new_tokens = self.long_prefill_token_threshold
        """,
        why="reads long_prefill_token_threshold as a cap on prompt tokens only: a resumed "
        "request recomputing its outputs takes more than the threshold once its prompt is done",
        caught_by="test_preemption.py::test_resumed_recompute_is_capped_by_the_threshold",
    ),
    Mutant(
        name="priority_victim_returns_the_wrong_count",
        file=FILE,
        find="token_budget += num_scheduled_tokens.pop(preempted_req.request_id)",
        replace="num_scheduled_tokens.pop(preempted_req.request_id)\ntoken_budget += num_new_tokens",
        why="a victim already scheduled leaves the batch, but the budget gets back the current "
        "request's token count instead of the victim's: the step overruns (or underuses) "
        "max_num_batched_tokens",
        caught_by="test_admission.py::test_priority_preempts_the_lowest_priority",
    ),
    Mutant(
        name="preemption_split_with_its_caller",
        file=FILE,
        find="""
                self._preempt_request(preempted_req)
        """,
        replace="""
                self._preempt_request(preempted_req)
                preempted_req.status = RequestStatus.PREEMPTED
                self.waiting.prepend_request(preempted_req)
        """,
        more=(
            (
                """
        request.status = RequestStatus.PREEMPTED
        request.num_computed_tokens = 0
        request.spec_token_ids = []
        request.num_preemptions += 1
        self.waiting.prepend_request(request)
        """,
                """
        request.num_computed_tokens = 0
        request.spec_token_ids = []
        request.num_preemptions += 1
        """,
            ),
        ),
        why="_preempt_request frees and resets, but schedule() sets PREEMPTED and requeues the "
        "victim itself: right inside schedule(), while reset_prefix_cache("
        "reset_running_requests=True), given code that relies on _preempt_request, loses every "
        "running request",
        caught_by="test_preemption.py::test_reset_prefix_cache_preempts_every_running_request",
    ),
    Mutant(
        name="stop_token_searched_in_all_outputs",
        file=FILE,
        find="if last_token_id in (sampling_params.stop_token_ids or ()):",
        replace=(
            "if any(t in (sampling_params.stop_token_ids or ()) for t in request.output_token_ids):"
        ),
        why="check_stop looks for a stop token among all outputs, not the one just appended: a "
        "stop token sampled while min_tokens deferred it stops the request at the first token "
        "after min_tokens",
        caught_by="test_stop.py::test_min_tokens_and_the_order_of_checks",
    ),
    Mutant(
        name="eos_searched_in_all_outputs",
        file=FILE,
        find="if request.eos_token_id is not None and last_token_id == request.eos_token_id:",
        replace=(
            "if request.eos_token_id is not None and request.eos_token_id in "
            "request.output_token_ids:"
        ),
        why="check_stop asks whether EOS is among the outputs: an EOS sampled while min_tokens "
        "deferred it stops the request at the first token after min_tokens",
        caught_by="test_stop.py::test_min_tokens_and_the_order_of_checks",
    ),
    Mutant(
        name="runner_checked_on_the_step_only",
        file=FILE,
        find="""
                for req_id, tokens in sampled_token_ids.items():
                    request = self.requests.get(req_id)
        """,
        replace="""
                for req_id in scheduler_output.num_scheduled_tokens:
                    tokens = sampled_token_ids.get(req_id)
                    request = self.requests.get(req_id)
        """,
        why="checks the runner's tokens only for the requests the step scheduled: a token for "
        "a request left out of the step while mid-prefill is ignored instead of refused",
        caught_by="test_admission.py::test_requests_left_out_of_the_step_keep_their_progress",
    ),
    Mutant(
        name="prev_step_ids_are_the_running_ones",
        file=FILE,
        find="        self.prev_step_scheduled_req_ids = set(num_scheduled_tokens)\n",
        replace="        self.prev_step_scheduled_req_ids = {r.request_id for r in self.running}\n",
        why="records the running requests as the ones the step scheduled: a running request the "
        "step left out is later sent without its whole token list, and the runner's is stale",
        caught_by="test_admission.py::test_requests_left_out_of_the_step_keep_their_progress",
    ),
    Mutant(
        name="prev_step_ids_set_before_the_cached_data",
        file=FILE,
        find="""
                cached_reqs_data = self._make_cached_request_data(
                    scheduled_running_reqs, scheduled_resumed_reqs, num_scheduled_tokens, req_to_new_blocks
                )
                self.prev_step_scheduled_req_ids = set(num_scheduled_tokens)
        """,
        replace="""
                self.prev_step_scheduled_req_ids = set(num_scheduled_tokens)
                cached_reqs_data = self._make_cached_request_data(
                    scheduled_running_reqs, scheduled_resumed_reqs, num_scheduled_tokens, req_to_new_blocks
                )
        """,
        why="records this step's ids before building the cached requests' data, which reads "
        "the previous step's: no running request ever gets its whole token list again",
        caught_by="test_admission.py::test_requests_left_out_of_the_step_keep_their_progress",
    ),
    Mutant(
        name="no_chunking_check_before_the_threshold",
        file=FILE,
        find="""
                        threshold = self.long_prefill_token_threshold
                        if 0 < threshold < num_new_tokens:
                            num_new_tokens = threshold
                        if not self.enable_chunked_prefill and num_new_tokens > token_budget:
                            # Without chunking the prompt must fit whole; nobody may overtake it.
                            break
        """,
        replace="""
                        if not self.enable_chunked_prefill and num_new_tokens > token_budget:
                            # Without chunking the prompt must fit whole; nobody may overtake it.
                            break
                        threshold = self.long_prefill_token_threshold
                        if 0 < threshold < num_new_tokens:
                            num_new_tokens = threshold
        """,
        why="with chunked prefill off, checks the whole prompt against the budget before the "
        "threshold caps it: a prompt whose capped share fits waits, and everyone behind it",
        caught_by="test_schedule.py::test_without_chunked_prefill",
    ),
    Mutant(
        name="preemption_clears_is_prefill_chunk",
        file=FILE,
        find="""
                request.num_computed_tokens = 0
                request.spec_token_ids = []
        """,
        replace="""
                request.num_computed_tokens = 0
                request.is_prefill_chunk = False
                request.spec_token_ids = []
        """,
        why="clears is_prefill_chunk when preempting: a token the runner hands back for the "
        "preempted request's non-final chunk, still in flight, is appended instead of refused",
        caught_by="test_aborts.py::test_update_from_output_checks_the_runner",
    ),
    Mutant(
        name="finish_requests_always_aborts",
        file=FILE,
        find="            request.status = finished_status\n",
        replace="            request.status = RequestStatus.FINISHED_ABORTED\n",
        why="sets FINISHED_ABORTED whatever status the caller gave: a request stopped from "
        "outside reports the wrong finish reason",
        caught_by="test_aborts.py::test_finish_requests_aborts",
    ),
    Mutant(
        name="finish_requests_accepts_only_aborts",
        file=FILE,
        find="        if not RequestStatus.is_finished(finished_status):\n",
        replace="        if finished_status != RequestStatus.FINISHED_ABORTED:\n",
        why="refuses every finished status but FINISHED_ABORTED: a caller stopping a request "
        "(FINISHED_STOPPED) gets a ValueError",
        caught_by="test_aborts.py::test_finish_requests_aborts",
    ),
    Mutant(
        name="outputs_in_the_runners_order",
        file=FILE,
        find="""
                for req_id in scheduler_output.num_scheduled_tokens:
                    request = self.requests.get(req_id)
                    if request is None or request.is_finished():
        """,
        replace="""
                for req_id in sampled_token_ids:
                    if req_id not in scheduler_output.num_scheduled_tokens:
                        continue
                    request = self.requests.get(req_id)
                    if request is None or request.is_finished():
        """,
        why="walks the runner's dict instead of the step's batch: the outputs come in whatever "
        "order the runner used, not in scheduling order",
        caught_by="test_aborts.py::test_random_traces_with_aborts_match_the_reference",
    ),
    Mutant(
        name="priority_ties_broken_by_request_id",
        file=FILE,
        find="max(self.running, key=lambda r: (r.priority, r.arrival_time))",
        replace="max(self.running, key=lambda r: (r.priority, r.request_id))",
        why="breaks priority ties by request id instead of arrival time: with ids that do not "
        "sort in arrival order, the request that came first is preempted",
        caught_by="test_admission.py::test_priority_random_workloads",
    ),
    # -- red team, 2026-11-28: static batching --------------------------------------------------
    Mutant(
        name="static_batching_admits_only_into_an_idle_step",
        file=FILE,
        find="""
                        if len(self.running) == self.max_num_running_reqs:
                            break
                        request = self.waiting.peek_request()
        """,
        replace="""
                        if len(self.running) == self.max_num_running_reqs or scheduled_running_reqs:
                            break
                        request = self.waiting.peek_request()
        """,
        why="waiting requests admitted only in a step where no running request was scheduled "
        "(static batching): every request still finishes with its tokens, first admissions in "
        "arrival order, which was all the FCFS random workloads checked",
        caught_by="test_traces.py::test_random_workloads_finish_correctly",
    ),
    # -- helper probe, 2026-11-28 (round 3) ----------------------------------------------------
    Mutant(
        name="stopped_requests_freed_after_the_loop_last_first",
        file=FILE,
        find="""
            finish_reason = request.get_finished_reason()
            self._free_request(request)
        """,
        replace="""
            finish_reason = request.get_finished_reason()
            to_free.append(request)
        """,
        more=(
            (
                """
        outputs: list[EngineCoreOutput] = []
        stopped_running_reqs: set[Request] = set()
        """,
                """
        outputs: list[EngineCoreOutput] = []
        to_free: list[Request] = []
        stopped_running_reqs: set[Request] = set()
        """,
            ),
            (
                """
        if stopped_running_reqs:
            self.running = [req for req in self.running if req not in stopped_running_reqs]
        """,
                """
        for req in reversed(to_free):
            self._free_request(req)
        if stopped_running_reqs:
            self.running = [req for req in self.running if req not in stopped_running_reqs]
        """,
            ),
        ),
        why="frees the requests that stopped after the loop, last first, instead of each as it "
        "stops: the free queue gets b's blocks before a's, so a later allocation evicts the "
        "cached prefix of the other request (a set of stopped requests freed after the loop "
        "gives an arbitrary order); every count and table still matched the reference",
        caught_by="test_preemption.py::test_finished_requests_are_freed",
    ),
    Mutant(
        name="no_chunking_check_in_the_running_pass",
        file=FILE,
        find="""
            room = self.max_model_len - 1 - request.num_computed_tokens
            num_new_tokens = min(num_new_tokens, token_budget, room)
        """,
        replace="""
            room = self.max_model_len - 1 - request.num_computed_tokens
            if not self.enable_chunked_prefill and num_new_tokens > token_budget:
                req_index += 1
                continue
            num_new_tokens = min(num_new_tokens, token_budget, room)
        """,
        why="applies the waiting pass's no-chunking rule to running requests too: one whose "
        "share does not fit the budget left is skipped instead of capped. In a plain loop it "
        "never binds (a running request's share never grows); a step planned while the last "
        "one runs (a decode with nothing to compute) admits a prompt that the next step "
        "cannot give its whole share",
        caught_by="test_schedule.py::test_without_chunked_prefill",
    ),
    Mutant(
        name="repetition_over_all_token_ids",
        file=FILE,
        find="check_sequence_repetition(request.output_token_ids, repetition)",
        replace="check_sequence_repetition(request.all_token_ids, repetition)",
        why="the repetition searched over prompt and output together: a prompt that ends the "
        "way the output begins completes a 'loop' early (found by a blind implementation, when "
        "the README did not say which tokens)",
        caught_by="test_stop.py::test_repetition_stops_the_request",
    ),
    Mutant(
        name="preempt_clears_is_prefill_chunk",
        file=FILE,
        find="        request.num_computed_tokens = 0\n",
        replace="        request.num_computed_tokens = 0\n        request.is_prefill_chunk = False\n",
        why="preemption clears the flag that describes the step still in flight: a runner that "
        "then hands back tokens for that step's partial chunk is no longer refused (found by a "
        "blind implementation)",
        caught_by="test_aborts.py::test_update_from_output_checks_the_runner",
    ),
    # -- the probe of 2026-11-29 ---------------------------------------------------------------
    Mutant(
        name="priority_ties_to_the_last_admitted",
        file=FILE,
        find="preempted_req = max(self.running, key=lambda r: (r.priority, r.arrival_time))",
        replace="preempted_req = max(reversed(self.running), key=lambda r: r.priority)",
        why="ties in priority go to the last admitted (FCFS's rule) instead of the latest "
        "arrival: the same whenever requests reach the scheduler in arrival order, not when one "
        "arrives late with an earlier arrival_time",
        caught_by="test_admission.py::test_priority_preempts_the_lowest_priority",
    ),
    Mutant(
        name="no_chunking_check_on_the_prompt_only",
        file=FILE,
        find="if not self.enable_chunked_prefill and num_new_tokens > token_budget:",
        replace="if (\n"
        "    not self.enable_chunked_prefill\n"
        "    and min(num_new_tokens, request.num_prompt_tokens) > token_budget\n"
        "):",
        why="with chunked prefill off, only the prompt must fit the budget left: a resumed "
        "request, which recomputes its outputs too, is admitted with a chunk of its tokens",
        caught_by="test_schedule.py::test_without_chunked_prefill",
    ),
    Mutant(
        name="resumed_admitted_past_max_num_seqs",
        file=FILE,
        find="""
            if len(self.running) == self.max_num_running_reqs:
                break""",
        replace="""
            if (
                len(self.running) == self.max_num_running_reqs
                and self.waiting.peek_request().status == RequestStatus.WAITING
            ):
                break""",
        more=(("assert len(self.running) <= self.max_num_running_reqs\n", ""),),
        why="max_num_seqs applied to new requests only: a preempted request is readmitted "
        "past it (under FCFS it is always at the front while a place is free; under the "
        "priority policy new requests can fill the places first)",
        caught_by="test_schedule.py::test_max_num_seqs",
    ),
    # -- the probe of 2026-11-29 (2) -----------------------------------------------------------
    Mutant(
        name="max_num_seqs_checked_after_allocating",
        file=FILE,
        find="""
            if len(self.running) == self.max_num_running_reqs:
                break
            request = self.waiting.peek_request()""",
        replace="""
            request = self.waiting.peek_request()""",
        more=(
            (
                """
                if new_blocks is None:
                    # Does not fit; FCFS forbids letting a later request overtake.
                    break
                """,
                """
                if new_blocks is None:
                    # Does not fit; FCFS forbids letting a later request overtake.
                    break
                if len(self.running) == self.max_num_running_reqs:
                    self.kv_cache_manager.free(request)  # no place: give the blocks back
                    break
                """,
            ),
        ),
        why="max_num_seqs checked once the front request has its blocks, which are freed "
        "again: allocate_slots has published them as computed (a later hit reads KV nobody "
        "wrote) and took fresh blocks from the front of the free queue, evicting cached "
        "prefixes; the waiting request holds nothing after the step, so only a later hit shows",
        caught_by="test_schedule.py::test_max_num_seqs",
    ),
    Mutant(
        name="max_num_seqs_checked_after_the_lookup",
        file=FILE,
        find="""
            if len(self.running) == self.max_num_running_reqs:
                break
            request = self.waiting.peek_request()""",
        replace="""
            request = self.waiting.peek_request()""",
        more=(
            (
                "num_computed_tokens = num_new_local_computed_tokens\n",
                "num_computed_tokens = num_new_local_computed_tokens\n"
                "if len(self.running) == self.max_num_running_reqs:\n"
                "    break\n",
            ),
        ),
        why="the front request is looked up in the prefix cache before max_num_seqs is "
        "checked: every step with the batch full counts one more lookup (and its tokens) in "
        "the prefix-cache statistics, which upstream never makes",
        caught_by="test_traces.py::test_random_workloads_finish_correctly",
    ),
    Mutant(
        name="budget_checked_after_the_lookup",
        file=FILE,
        find="while self.waiting and token_budget > 0:",
        replace="while self.waiting:",
        more=(
            (
                "num_computed_tokens = num_new_local_computed_tokens\n",
                "num_computed_tokens = num_new_local_computed_tokens\n"
                "if token_budget <= 0:\n"
                "    break\n",
            ),
        ),
        why="the front request is looked up in the prefix cache before the budget is checked: "
        "a step whose budget the running requests used up counts a lookup in the prefix-cache "
        "statistics that upstream never makes",
        caught_by="test_traces.py::test_random_workloads_finish_correctly",
    ),
    Mutant(
        name="preempt_without_the_running_check",
        file=FILE,
        find="""
        if request.status != RequestStatus.RUNNING:
            raise RuntimeError(f"only running requests can be preempted: {request!r}")
""",
        replace="\n",
        why="_preempt_request preempts whatever it is given: a request already PREEMPTED is "
        "requeued a second time and counted twice, where upstream asserts RUNNING first",
        caught_by="test_preemption.py::test_reset_prefix_cache_preempts_every_running_request",
    ),
    Mutant(
        name="prefill_chunk_against_the_prompt",
        file=FILE,
        find="request.is_prefill_chunk = request.num_computed_tokens < request.num_tokens",
        replace="request.is_prefill_chunk = request.num_computed_tokens < request.num_prompt_tokens",
        why="is_prefill_chunk measured against the prompt, as 'prefill' reads in engines that "
        "fold a preempted request's outputs into its prompt: a resumed request recomputing its "
        "outputs in chunks looks done after its prompt, so a runner's token for its non-final "
        "chunk is appended instead of refused (only the priority random workload met the case)",
        caught_by="test_aborts.py::test_update_from_output_checks_the_runner",
    ),
    Mutant(
        name="fcfs_victim_by_arrival_time",
        file=FILE,
        find="preempted_req = self.running.pop()",
        replace="preempted_req = max(self.running, key=lambda r: r.arrival_time)\n"
        "self.running.remove(preempted_req)",
        why="the FCFS victim taken as the latest arrival, as schedulers that kept running sorted "
        "by arrival time did: a request admitted before another that arrived earlier (it "
        "reached the scheduler late) is preempted instead of the last admitted one",
        caught_by="test_preemption.py::test_preempts_the_last_running_request",
    ),
    Mutant(
        name="preempted_requeued_by_arrival_time",
        file=FILE,
        find="self.waiting.prepend_request(request)",
        replace="queued = sorted([*self.waiting, request], key=lambda r: r.arrival_time)\n"
        "self.waiting.remove_requests(list(self.waiting))\n"
        "for queued_request in queued:\n"
        "    self.waiting.add_request(queued_request)",
        why="the victim put back in arrival order, as schedulers that kept the waiting queue "
        "sorted by arrival time did: a request waiting since before the preemption that "
        "reached the scheduler late (an earlier arrival time) is readmitted first",
        caught_by="test_preemption.py::test_preempted_request_goes_to_the_front",
    ),
    Mutant(
        name="fcfs_waiting_by_arrival_time",
        file=FILE,
        find="request = self.waiting.peek_request()",
        replace="request = (\n"
        "    min(self.waiting, key=lambda r: r.arrival_time)\n"
        "    if self.policy == SchedulingPolicy.FCFS\n"
        "    else self.waiting.peek_request()\n"
        ")",
        more=(("request = self.waiting.pop_request()", "self.waiting.remove_request(request)"),),
        why="FCFS read as 'the earliest arrival_time first', as schedulers that sorted the "
        "waiting queue by arrival did: a request added later with an earlier arrival_time "
        "(a caller may pass one) overtakes the queue's front",
        caught_by="test_schedule.py::test_running_first_then_waiting",
    ),
    Mutant(
        name="update_walks_running",
        file=FILE,
        find="for req_id in scheduler_output.num_scheduled_tokens:",
        replace="for req_id in [\n"
        "    r.request_id for r in self.running if r.request_id in scheduler_output.num_scheduled_tokens\n"
        "]:",
        why="update_from_output walks running, as older vLLM V1 did, instead of the step's "
        "requests: a request preempted by a schedule() planned while its step ran (async "
        "scheduling) never gets its in-flight token, nor stops on it",
        caught_by="test_preemption.py::test_a_request_that_stops_while_preempted_leaves_the_waiting_queue",
    ),
    Mutant(
        name="priority_victim_sorted_last",
        file=FILE,
        find="preempted_req = max(self.running, key=lambda r: (r.priority, r.arrival_time))",
        replace="preempted_req = sorted(self.running, key=lambda r: (r.priority, r.arrival_time))[-1]",
        why="the priority victim taken as the last of the running requests sorted by "
        "(priority, arrival_time): on a full tie (one arrival time given to a batch) the last "
        "tied request is preempted, where upstream's max takes the first",
        caught_by="test_admission.py::test_priority_preempts_the_lowest_priority",
    ),
    Mutant(
        name="finish_all_newest_first",
        file=FILE,
        find="ids = list(self.requests)",
        replace="ids = list(reversed(self.requests))",
        why="finish_requests(None) walks the requests newest first, as the given "
        "reset_prefix_cache pops running: their blocks join the free queue in the other "
        "order, so a later allocation evicts another request's cached prefix than upstream's",
        caught_by="test_aborts.py::test_finish_requests_aborts",
    ),
    Mutant(
        name="after_schedule_walks_every_request",
        file=FILE,
        find="""
            for req_id, num_tokens in scheduler_output.num_scheduled_tokens.items():
                request = self.requests[req_id]
                request.num_computed_tokens += num_tokens
        """,
        replace="""
            for request in list(self.requests.values()):
                num_tokens = scheduler_output.num_scheduled_tokens.get(request.request_id)
                if num_tokens is None:
                    continue
                request.num_computed_tokens += num_tokens
        """,
        why="_update_after_schedule walks every request the scheduler knows, the waiting ones "
        "too, and skips those not scheduled: right, but each step costs O(all requests) "
        "instead of O(scheduled) (README: a step's work grows with the requests it schedules; "
        "a complexity probe, 2026-11-29)",
        caught_by="test_schedule.py::test_a_step_costs_what_it_schedules",
    ),
    Mutant(
        name="finish_requests_removes_one_at_a_time",
        file=FILE,
        find="""
            if running_to_remove:
                self.running = [req for req in self.running if req not in running_to_remove]
            if waiting_to_remove:
                self.waiting.remove_requests(waiting_to_remove)
        """,
        replace="""
            for req in running_to_remove:
                self.running.remove(req)
            for req in waiting_to_remove:
                self.waiting.remove_request(req)
        """,
        why="finish_requests takes each request out of its queue with list.remove or "
        "waiting.remove_request, a search from the front per id: right, but aborting k of n "
        "waiting requests costs O(n x k) where upstream's one pass costs O(n) (README, after "
        "the task table; a learner's-mistakes probe, 2026-11-29 (8))",
        caught_by="test_aborts.py::test_aborting_many_costs_each_the_same",
    ),
    # -- helper focus, 2026-11-29 (s48): caught by the random workloads only until now ---------
    Mutant(
        name="gate_in_the_running_pass",
        file=FILE,
        find="new_blocks = self.kv_cache_manager.allocate_slots(request, num_new_tokens)",
        replace="new_blocks = self.kv_cache_manager.allocate_slots(\n"
        "    request, num_new_tokens, full_sequence_must_fit=self.scheduler_reserve_full_isl\n"
        ")",
        why="passes the admission gate in the running pass too: a running request in the "
        "middle of its prompt gets its next chunk only if the rest of its prompt fits, so one "
        "whose chunk fits is refused and preempts someone (README: the gate is for the waiting "
        "pass, never the running pass)",
        caught_by="test_admission.py::test_the_gate_is_for_the_waiting_pass_only",
    ),
    Mutant(
        name="gate_only_for_new_requests",
        file=FILE,
        find="full_sequence_must_fit=self.scheduler_reserve_full_isl,",
        replace="full_sequence_must_fit=self.scheduler_reserve_full_isl\n"
        "and request.status == RequestStatus.WAITING,",
        why="passes the admission gate for new requests only: a preempted request comes back "
        "on its first chunk although its whole sequence (its outputs included) cannot fit, and "
        "is preempted again mid-prefill (README: the gate applies to every request the waiting "
        "pass admits, new or resumed, as upstream)",
        caught_by="test_admission.py::test_the_gate_holds_back_a_resumed_request",
    ),
]
