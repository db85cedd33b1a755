"""Buggy implementations of lab-02 (contiguous vs paged allocation over a trace).

Each mutant is one mistake a learner plausibly makes, written as an edit of the solution
(``grading.mutants.Mutant``). ``python -m grading check-suites lab-02`` and
``tests/test_buggy_implementations.py`` check that the graded suite catches every one of them.
"""

from __future__ import annotations

from grading.mutants import Mutant

FILE = "fragmentation.py"

MUTANTS = [
    # -- ContiguousAllocator ------------------------------------------------------------------
    Mutant(
        name="best_fit_instead_of_first_fit",
        file=FILE,
        find="""
            for i, (start, size) in enumerate(self.free_ranges):
                if size >= max_len:
        """,
        replace="""
            fitting = sorted((size, i) for i, (_, size) in enumerate(self.free_ranges)
                             if size >= max_len)
            for i in [fitting[0][1]] if fitting else []:
                start, size = self.free_ranges[i]
                if size >= max_len:
        """,
        why="ensure picks the smallest free range that fits (best fit) instead of the lowest "
        "one (first fit)",
        caught_by="test_allocators.py::test_first_fit_and_refusal_despite_enough_free",
    ),
    Mutant(
        name="reserves_length_not_max_len",
        file=FILE,
        find="""
            for i, (start, size) in enumerate(self.free_ranges):
                if size >= max_len:
                    self.ranges[request_id] = (start, max_len)
                    if size == max_len:
                        del self.free_ranges[i]
                    else:
                        self.free_ranges[i] = (start + max_len, size - max_len)
                    return True
        """,
        replace="""
            for i, (start, size) in enumerate(self.free_ranges):
                if size >= length:
                    self.ranges[request_id] = (start, length)
                    if size == length:
                        del self.free_ranges[i]
                    else:
                        self.free_ranges[i] = (start + length, size - length)
                    return True
        """,
        why="the contiguous allocator reserves the current length instead of max_len, as if "
        "the request could never grow (the premise of contiguous allocation)",
        caught_by="test_allocators.py::test_contiguous_reserves_max_len_up_front",
    ),
    Mutant(
        name="exact_fit_leaves_empty_range",
        file=FILE,
        find="""
            if size == max_len:
                del self.free_ranges[i]
            else:
                self.free_ranges[i] = (start + max_len, size - max_len)
        """,
        replace="""
            self.free_ranges[i] = (start + max_len, size - max_len)
        """,
        why="an exact fit leaves a zero-length free range behind instead of removing it",
        caught_by="test_allocators.py::test_contiguous_reserves_max_len_up_front",
    ),
    Mutant(
        name="free_does_not_merge_with_next",
        file=FILE,
        find="""
            if i < len(self.free_ranges) and start + size == self.free_ranges[i][0]:
                size += self.free_ranges.pop(i)[1]
        """,
        replace="",
        why="free merges a returned range with the free range before it but not with the one "
        "after it: memory stays cut into pieces that could be one",
        caught_by="test_allocators.py::test_free_coalesces_neighbours",
    ),
    Mutant(
        name="free_does_not_merge_with_previous",
        file=FILE,
        find="""
            if i > 0 and sum(self.free_ranges[i - 1]) == start:
                start, size = self.free_ranges[i - 1][0], self.free_ranges[i - 1][1] + size
                i -= 1
                del self.free_ranges[i]
        """,
        replace="",
        why="free merges a returned range with the free range after it but not with the one "
        "before it",
        caught_by="test_allocators.py::test_free_coalesces_neighbours",
    ),
    Mutant(
        name="free_merges_only_with_the_last_free_range",
        file=FILE,
        find="""
            if i > 0 and sum(self.free_ranges[i - 1]) == start:
                start, size = self.free_ranges[i - 1][0], self.free_ranges[i - 1][1] + size
        """,
        replace="""
            if i > 0 and sum(self.free_ranges[-1]) == start:
                start, size = self.free_ranges[-1][0], self.free_ranges[-1][1] + size
        """,
        why="free looks for the neighbour before in the last free range instead of the one just "
        "before the insertion point: a range freed between two free ranges, with more free "
        "ranges after it, is left unmerged",
        caught_by="test_allocators.py::test_free_coalesces_neighbours",
    ),
    # -- PagedAllocator -----------------------------------------------------------------------
    Mutant(
        name="paged_blocks_rounded_down",
        file=FILE,
        find="needed = -(-length // self.block_size) - len(table)",
        replace="needed = length // self.block_size - len(table)",
        why="ensure rounds the number of blocks down (length // block_size): the tokens of a "
        "partly filled last block have nowhere to go",
        caught_by="test_allocators.py::test_paged_holds_whole_blocks_covering_the_tokens",
    ),
    Mutant(
        name="paged_partial_allocation",
        file=FILE,
        find="""
            if needed > len(self.free_block_ids):
                return False
            table = self.block_tables.setdefault(request_id, table)
            for _ in range(needed):
                table.append(self.free_block_ids.popleft())
            return True
        """,
        replace="""
            table = self.block_tables.setdefault(request_id, table)
            for _ in range(needed):
                if not self.free_block_ids:
                    return False
                table.append(self.free_block_ids.popleft())
            return True
        """,
        why="ensure takes blocks one by one and gives up when they run out, keeping the blocks "
        "it took: not all or nothing",
        caught_by="test_allocators.py::test_paged_ensure_is_all_or_nothing",
    ),
    Mutant(
        name="paged_refuses_when_memory_is_full",
        file=FILE,
        find="""
            if needed > len(self.free_block_ids):
                return False
        """,
        replace="""
            if needed > len(self.free_block_ids) or not self.free_block_ids:
                return False
        """,
        why="ensure refuses whenever no block is free, even for a request whose new token still "
        "fits in its last block: a full memory preempts requests that needed nothing",
        caught_by="test_allocators.py::test_paged_ensure_is_all_or_nothing",
    ),
    Mutant(
        name="paged_free_to_the_front",
        file=FILE,
        find="self.free_block_ids.extend(self.block_tables.pop(request_id))",
        replace="self.free_block_ids.extendleft(self.block_tables.pop(request_id))",
        why="free puts the blocks back at the front of the free list (LIFO) instead of the back",
        caught_by="test_allocators.py::test_paged_free_returns_the_blocks",
    ),
    # -- split_held -----------------------------------------------------------------------------
    Mutant(
        name="split_counts_future_tokens_as_internal",
        file=FILE,
        find="return current_len, will_fill - current_len, held - will_fill",
        replace="return current_len, 0, held - current_len",
        why="every held slot without a token counts as internal fragmentation, even the slots "
        "the request will fill before it finishes",
        caught_by="test_allocators.py::test_split_held",
    ),
    Mutant(
        name="split_ignores_final_len",
        file=FILE,
        find="will_fill = min(final_len, held)",
        replace="will_fill = held",
        why="split_held assumes the request fills everything it holds: no internal "
        "fragmentation ever",
        caught_by="test_allocators.py::test_split_held",
    ),
    # -- simulate -------------------------------------------------------------------------------
    Mutant(
        name="arrives_one_step_late",
        file=FILE,
        find="while pending and pending[0].arrival_step <= step:",
        replace="while pending and pending[0].arrival_step < step:",
        why="off-by-one: a request joins the queue one step after its arrival_step",
        caught_by="test_simulation.py::test_worked_example_contiguous",
    ),
    Mutant(
        name="same_step_arrivals_sorted_by_id",
        file=FILE,
        find="pending = deque(sorted(trace, key=lambda r: r.arrival_step))",
        replace="pending = deque(sorted(trace, key=lambda r: (r.arrival_step, r.request_id)))",
        why="sorts the trace by (arrival_step, request_id): requests arriving in the same step "
        "queue by name instead of in trace order",
        caught_by="test_simulation.py::test_arrivals_and_idle_steps",
    ),
    Mutant(
        name="preempts_the_oldest",
        file=FILE,
        find="victim = running.pop()",
        replace="victim = running.pop(0)",
        why="preemption takes the first admitted running request instead of the most recently "
        "admitted one",
        caught_by="test_simulation.py::test_preemption_newest_first",
    ),
    Mutant(
        name="preempted_to_the_back",
        file=FILE,
        find="waiting.appendleft(victim)",
        replace="waiting.append(victim)",
        why="a preempted request goes to the back of the waiting queue, behind requests that "
        "arrived after it",
        caught_by="test_simulation.py::test_preemption_newest_first",
    ),
    Mutant(
        name="preemptions_counted_per_step",
        file=FILE,
        find="sim.num_preemptions += len(preempted)",
        replace="sim.num_preemptions += bool(preempted)",
        why="counts the steps with a preemption instead of the preemptions: two requests "
        "preempted in the same step count once",
        caught_by="test_simulation.py::test_preemption_newest_first",
    ),
    Mutant(
        name="preempted_listed_oldest_first",
        file=FILE,
        find="preempted.append(victim.request_id)",
        replace="preempted.insert(0, victim.request_id)",
        why="a step's preempted lists its victims in the order opposite to the one they were "
        "preempted in (oldest first): StepStats.preempted is most recent first",
        caught_by="test_simulation.py::test_preemption_newest_first",
    ),
    Mutant(
        name="preemption_restarts_from_scratch",
        file=FILE,
        find="""
            allocator.free(victim.request_id)
            waiting.appendleft(victim)
        """,
        replace="""
            allocator.free(victim.request_id)
            generated[victim.request_id] = 0
            waiting.appendleft(victim)
        """,
        why="a preempted request forgets the tokens it produced and generates them all again",
        caught_by="test_simulation.py::test_preemption_newest_first",
    ),
    Mutant(
        name="no_head_of_line_blocking",
        file=FILE,
        find="""
            while waiting:
                req = waiting[0]
                limit = limits[req.request_id]
                if allocator.ensure(req.request_id, length(req), limit):
                    running.append(waiting.popleft())
                    sim.admitted.setdefault(req.request_id, step)
                    continue
        """,
        replace="""
            for req in [r for r in waiting if r is not waiting[0]]:
                limit = limits[req.request_id]
                if allocator.ensure(req.request_id, length(req), limit):
                    waiting.remove(req)
                    running.append(req)
                    sim.admitted.setdefault(req.request_id, step)
            while waiting:
                req = waiting[0]
                limit = limits[req.request_id]
                if allocator.ensure(req.request_id, length(req), limit):
                    running.append(waiting.popleft())
                    sim.admitted.setdefault(req.request_id, step)
                    continue
        """,
        why="admission lets later requests that fit overtake the request at the head of the "
        "queue (not first come, first served)",
        caught_by="test_simulation.py::test_worked_example_contiguous",
    ),
    Mutant(
        name="blocked_even_without_enough_free",
        file=FILE,
        find="""
            if allocator.num_free_tokens() >= allocator.tokens_to_hold(length(req), limit):
                blocked = req.request_id
        """,
        replace="""
            blocked = req.request_id
        """,
        why="every refusal counts as external fragmentation, even when memory is simply full",
        caught_by="test_simulation.py::test_worked_example_contiguous",
    ),
    Mutant(
        name="finished_one_step_late",
        file=FILE,
        find="sim.finished[req.request_id] = step",
        replace="sim.finished[req.request_id] = step + 1",
        why="off-by-one: a request is recorded as finished in the step after its last token",
        caught_by="test_simulation.py::test_worked_example_contiguous",
    ),
    # -- summarize ------------------------------------------------------------------------------
    Mutant(
        name="token_share_mean_of_ratios",
        file=FILE,
        find="token_share=share(sum(s.used_tokens for s in steps), held),",
        replace="token_share=share(sum(share(s.used_tokens, s.held_tokens) for s in steps "
        "if s.held_tokens), sum(1 for s in steps if s.held_tokens)),",
        why="token_share averages the per-step ratios instead of dividing the sums: a step "
        "holding little memory weighs as much as a full one",
        caught_by="test_report.py::test_report_worked_example_contiguous",
    ),
    Mutant(
        name="peak_is_most_used",
        file=FILE,
        find="peak = max(steps, key=lambda s: s.held_tokens, default=None)",
        replace="peak = max(steps, key=lambda s: s.used_tokens, default=None)",
        why="the peak is taken at the step with the most tokens instead of the most held memory",
        caught_by="test_report.py::test_report_worked_example_contiguous",
    ),
    Mutant(
        name="peak_is_last_on_ties",
        file=FILE,
        find="peak = max(steps, key=lambda s: s.held_tokens, default=None)",
        replace="peak = max(reversed(steps), key=lambda s: s.held_tokens, default=None)",
        why="among steps holding the same most memory, the last is taken instead of the first",
        caught_by="test_report.py::test_report_worked_example_contiguous",
    ),
    Mutant(
        name="mean_running_counts_idle_steps",
        file=FILE,
        find="mean_running=share(sum(busy), len(busy)),",
        replace="mean_running=share(sum(busy), len(steps)),",
        why="mean concurrency divides by every step, idle ones included",
        caught_by="test_report.py::test_report_definitions_on_handmade_steps",
    ),
    Mutant(
        name="external_fragmentation_over_held",
        file=FILE,
        find="""
        external_fragmentation=share(
            sum(s.external_tokens for s in steps), sim.capacity_tokens * len(steps)
        ),
        """,
        replace="""
            external_fragmentation=share(sum(s.external_tokens for s in steps), held),
        """,
        why="external fragmentation is divided by the held memory; it is free memory, a share "
        "of the whole capacity",
        caught_by="test_report.py::test_report_worked_example_contiguous",
    ),
    Mutant(
        name="delayed_counts_steps",
        file=FILE,
        find="delayed_with_enough_free=len({s.blocked for s in steps if s.blocked is not None}),",
        replace="delayed_with_enough_free=sum(s.blocked is not None for s in steps),",
        why="delayed_with_enough_free counts blocked steps, not distinct requests",
        caught_by="test_report.py::test_report_worked_example_contiguous",
    ),
    Mutant(
        name="trace_assumed_sorted_by_arrival",
        file=FILE,
        find="pending = deque(sorted(trace, key=lambda r: r.arrival_step))",
        replace="pending = deque(trace)",
        why="takes the trace in its own order instead of by arrival_step: a request listed "
        "after a later arrival waits for it, although it arrived first",
        caught_by="test_simulation.py::test_random_traces_match_the_reference",
    ),
    Mutant(
        name="self_preemption_keeps_growing",
        file=FILE,
        find="""
                if victim is req:
                    break
        """,
        replace="",
        why="a request that preempts itself (it is the newest) goes on asking for blocks: it "
        "gets memory back while it waits, outside the running set",
        caught_by="test_simulation.py::test_random_traces_match_the_reference",
    ),
    Mutant(
        name="running_listed_by_id",
        file=FILE,
        find="running=tuple(r.request_id for r in running),",
        replace="running=tuple(sorted(r.request_id for r in running)),",
        why="a step's running ids are sorted by name instead of listed in admission order: a "
        "request readmitted after a preemption comes after those admitted before it",
        caught_by="test_simulation.py::test_random_traces_match_the_reference",
    ),
    Mutant(
        name="waiting_counts_future_arrivals",
        file=FILE,
        find="waiting=len(waiting),",
        replace="waiting=len(waiting) + len(pending),",
        why="counts the requests of the trace that have not arrived yet as waiting",
        caught_by="test_simulation.py::test_preemption_newest_first",
    ),
    Mutant(
        name="blocked_needs_strictly_more",
        file=FILE,
        find="if allocator.num_free_tokens() >= allocator.tokens_to_hold(length(req), limit):",
        replace="if allocator.num_free_tokens() > allocator.tokens_to_hold(length(req), limit):",
        why="a refusal with exactly enough free memory (in pieces) is not counted as blocked: "
        "the external fragmentation of that step is lost",
        caught_by="test_simulation.py::test_blocked_with_exactly_enough_free",
    ),
    Mutant(
        name="trace_iterated_twice",
        file=FILE,
        find="""
    trace = list(trace)
    limits = _validate(trace, allocator, max_model_len)
""",
        replace="""
    limits = _validate(trace, allocator, max_model_len)
""",
        why="simulate goes over its Iterable trace twice: a one-shot iterator is used up by the "
        "validation and the simulation runs no request at all",
        caught_by="test_simulation.py::test_trace_may_be_a_one_shot_iterator",
    ),
    Mutant(
        name="contiguous_length_checked_only_once_reserved",
        file=FILE,
        find="""        if length > max_len:
            raise ValueError(
                f"request {request_id} needs {length} tokens but reserves only {max_len}"
            )
        if request_id in self.ranges:
            return True
""",
        replace="""        if request_id in self.ranges:
            if length > self.ranges[request_id][1]:
                raise ValueError(
                    f"request {request_id} needs {length} tokens but reserves only {max_len}"
                )
            return True
""",
        why="checks the length against the range only once a request has one ('a range cannot "
        "grow'): a first call with length > max_len reserves max_len slots for a request "
        "that does not fit them",
        caught_by="test_allocators.py::test_contiguous_reserves_max_len_up_front",
    ),
    Mutant(
        name="victims_queued_in_preemption_order",
        file=FILE,
        find="                waiting.appendleft(victim)",
        replace="                waiting.insert(len(preempted), victim)",
        why="puts a step's victims at the front in the order they were preempted: two victims "
        "of one step come back oldest preemption first, where each going to the front in turn "
        "puts the last one first",
        caught_by="test_simulation.py::test_preemption_newest_first",
    ),
    Mutant(
        name="paged_refusal_leaves_an_empty_table",
        file=FILE,
        find="""        table = self.block_tables.get(request_id, [])
        needed = -(-length // self.block_size) - len(table)
        if needed > len(self.free_block_ids):
            return False
        table = self.block_tables.setdefault(request_id, table)
""",
        replace="""        table = self.block_tables.setdefault(request_id, [])
        needed = -(-length // self.block_size) - len(table)
        if needed > len(self.free_block_ids):
            return False
""",
        why="registers the request before knowing it fits: a refused request keeps an empty "
        "block table, and freeing it no longer says that it holds nothing",
        caught_by="test_allocators.py::test_paged_ensure_is_all_or_nothing",
    ),
    Mutant(
        name="contiguous_worst_fit",
        file=FILE,
        find="""
                for i, (start, size) in enumerate(self.free_ranges):
                    if size >= max_len:
        """,
        replace="""
                order = sorted(range(len(self.free_ranges)), key=lambda j: -self.free_ranges[j][1])
                for i, (start, size) in ((j, self.free_ranges[j]) for j in order):
                    if size >= max_len:
        """,
        why="takes the largest free range (worst fit) instead of the lowest one long enough "
        "(first fit): the suite's holes had put the largest first",
        caught_by="test_allocators.py::test_first_fit_and_refusal_despite_enough_free",
    ),
    Mutant(
        name="paged_free_in_block_id_order",
        file=FILE,
        find="self.free_block_ids.extend(self.block_tables.pop(request_id))",
        replace="self.free_block_ids.extend(sorted(self.block_tables.pop(request_id)))",
        why="gives a request's blocks back sorted by id, neither in table order nor tail first: "
        "every table the suite freed had been taken in id order",
        caught_by="test_allocators.py::test_paged_free_returns_the_blocks",
    ),
    Mutant(
        name="empty_trace_runs_one_idle_step",
        file=FILE,
        find="while pending or waiting or running:",
        replace="while True:",
        more=(
            (
                """
                        step += 1
                    return sim
                """,
                """
                        step += 1
                        if not (pending or waiting or running):
                            break
                    return sim
                """,
            ),
        ),
        why="tests for the end after the step instead of before it: an empty trace gets one "
        "idle step, where it has none",
        caught_by="test_simulation.py::test_arrivals_and_idle_steps",
    ),
    Mutant(
        name="summarize_sorts_the_steps_in_place",
        file=FILE,
        find="peak = max(steps, key=lambda s: s.held_tokens, default=None)",
        replace="""
            steps.sort(key=lambda s: -s.held_tokens)
            peak = steps[0] if steps else None
        """,
        why="finds the peak by sorting the simulation's own steps (stable, so the first peak "
        "wins): the report is right, the simulation's steps are out of order afterwards",
        caught_by="test_report.py::test_report_definitions_on_handmade_steps",
    ),
    Mutant(
        name="paged_round_up_with_a_bit_mask",
        file=FILE,
        find="return -(-length // self.block_size) * self.block_size",
        replace="return (length + self.block_size - 1) & -self.block_size",
        more=(
            (
                "needed = -(-length // self.block_size) - len(table)",
                "needed = ((length + self.block_size - 1) & -self.block_size) // self.block_size "
                "- len(table)",
            ),
        ),
        why="rounds up to whole blocks with the alignment mask (n + b - 1) & -b, right only for "
        "a power of two: every block size of the suite was 1, 2 or 4",
        caught_by="test_allocators.py::test_paged_holds_whole_blocks_covering_the_tokens",
    ),
]
