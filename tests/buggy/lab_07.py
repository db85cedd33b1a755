"""Buggy implementations of lab-07 (the KV cache manager).

Each mutant is one mistake a learner plausibly makes, written as an edit of the solution
(``grading.mutants.Mutant``). ``python -m grading check-suites lab-07`` and
``tests/test_buggy_implementations.py`` check that the graded suite catches every one of them.
"""

from __future__ import annotations

from grading.mutants import Mutant

FILE = "kv_cache_manager.py"

MUTANTS = [
    # -- prefix-cache hits ------------------------------------------------------------------
    Mutant(
        name="hit_on_the_last_token",
        file=FILE,
        find="max_cache_hit_length = request.num_tokens - 1",
        replace="max_cache_hit_length = request.num_tokens",
        why="no num_tokens - 1 cap: a fully cached block-aligned prompt is skipped entirely, so "
        "the model never runs on its last token and has no logits to sample from",
        caught_by="test_prefix_hits.py::test_hit_is_capped_at_num_tokens_minus_one",
    ),
    Mutant(
        name="hit_skips_over_a_miss",
        file=FILE,
        find="""
            if not cached:
                break
            computed.append(cached[0])
        """,
        replace="""
            if not cached:
                continue
            computed.append(cached[0])
        """,
        why="find_longest_cache_hit ignores the chain: it keeps looking after a miss, so a later "
        "cached block is glued after a gap and the request reads another prefix's KV",
        caught_by="test_prefix_hits.py::test_the_first_miss_ends_the_hit",
    ),
    Mutant(
        name="hit_limit_in_tokens_not_blocks",
        file=FILE,
        find="max_num_blocks = max(max_cache_hit_length, 0) // self.block_size",
        replace="max_num_blocks = cdiv(max(max_cache_hit_length, 0), self.block_size)",
        why="rounds the hit limit up to whole blocks: a hit can then cover the last token, "
        "which must be recomputed",
        caught_by="test_prefix_hits.py::test_hit_is_capped_at_num_tokens_minus_one",
    ),
    Mutant(
        name="hit_limit_clamped_at_one_token",
        file=FILE,
        find="max_num_blocks = max(max_cache_hit_length, 0) // self.block_size",
        replace="max_num_blocks = max(max_cache_hit_length, 1) // self.block_size",
        why="clamps the hit limit at 1 token instead of 0: unseen with blocks of 4 (1 // 4 = 0), "
        "but with blocks of one token a one-token prompt hits its own token and is left with "
        "nothing to compute",
        caught_by="test_prefix_hits.py::test_hit_is_capped_at_num_tokens_minus_one",
    ),
    Mutant(
        name="stats_ignore_preemption",
        file=FILE,
        find="preempted=request.num_preemptions > 0,",
        replace="preempted=False,",
        why="prefix-cache stats count resumed requests as new traffic: they mostly hit their "
        "own freshly freed blocks, which flatters the hit rate",
        caught_by="test_prefix_hits.py::test_prefix_cache_stats_count_lookups",
    ),
    Mutant(
        name="stats_never_reset",
        file=FILE,
        find="""
            stats = self.prefix_cache_stats
            self.prefix_cache_stats = PrefixCacheStats()
            return stats
        """,
        replace="""
            return self.prefix_cache_stats
        """,
        why="make_prefix_cache_stats hands out the live counters without starting afresh, so "
        "every snapshot counts all lookups since startup (and the logger double counts)",
        caught_by="test_prefix_hits.py::test_make_prefix_cache_stats_resets",
    ),
    # -- allocate_slots -----------------------------------------------------------------------
    Mutant(
        name="hits_claimed_before_the_capacity_check",
        file=FILE,
        find="""
            if num_blocks_to_allocate > self.block_pool.get_num_free_blocks():
                return None

            # Stage 2: claim the prefix hits (an empty set of hits, shared or not, is
            # no hit at all: running requests pass none).
            if new_computed_block_list[0]:
                self.allocate_new_computed_blocks(request.request_id, new_computed_block_list[0])
        """,
        replace="""
            if new_computed_block_list[0]:
                self.allocate_new_computed_blocks(request.request_id, new_computed_block_list[0])
            if num_blocks_to_allocate > self.block_pool.get_num_free_blocks():
                return None
        """,
        why="claims (touches) the prefix hits before checking capacity: a refused admission "
        "leaves its hits referenced and a half-built block table behind",
        caught_by="test_allocate_slots.py::test_none_leaves_hits_unclaimed",
    ),
    Mutant(
        name="empty_table_left_on_none",
        file=FILE,
        find="num_req_blocks = len(self.req_to_blocks.get(request_id, ()))",
        replace="num_req_blocks = len(self.req_to_blocks.setdefault(request_id, []))",
        why="the capacity count creates the request's table with setdefault, so a refused "
        "request leaves an empty entry in req_to_blocks: None must change nothing",
        caught_by="test_allocate_slots.py::test_none_changes_nothing",
    ),
    Mutant(
        name="hits_not_touched",
        file=FILE,
        find="""
            if self.enable_caching:
                self.block_pool.touch(new_computed_blocks)
            elif new_computed_blocks:
        """,
        replace="""
            if new_computed_blocks and not self.enable_caching:
        """,
        why="the hits are put in the table without touch: their ref_cnt does not count the new "
        "user and a free hit stays in the free queue, ready to be evicted under the request",
        caught_by="test_allocate_slots.py::test_hits_are_shared_and_touched",
    ),
    Mutant(
        name="free_hits_not_counted",
        file=FILE,
        find="return num_new_blocks + num_evictable_blocks",
        replace="return num_new_blocks",
        why="hits that sit free in the queue are not counted: claiming them consumes free "
        "blocks, so the allocation runs out half-way instead of returning None",
        caught_by="test_allocate_slots.py::test_none_leaves_hits_unclaimed",
    ),
    Mutant(
        name="returns_the_whole_table",
        file=FILE,
        find="""
            self.cache_blocks(request, num_tokens_to_cache)
        return self.create_kv_cache_blocks((new_blocks,))
        """,
        replace="""
            self.cache_blocks(request, num_tokens_to_cache)
        return self.get_blocks(request.request_id)
        """,
        why="allocate_slots returns the request's whole table instead of the blocks it added: "
        "the runner would append blocks it already has",
        caught_by="test_allocate_slots.py::test_returns_only_new_blocks",
    ),
    Mutant(
        name="hit_blocks_not_marked_cached",
        file=FILE,
        find="""
            req_blocks.extend(new_computed_blocks)
            self.num_cached_block[request_id] = len(req_blocks)
        """,
        replace="""
            req_blocks.extend(new_computed_blocks)
        """,
        why="the hits are not recorded as already published, so cache_blocks hashes them a "
        "second time (a block is hashed once: RuntimeError)",
        caught_by="test_prefix_hits.py::test_prefix_cache_stats_count_lookups",
    ),
    Mutant(
        name="caches_lookahead_slots",
        file=FILE,
        find="num_tokens_to_cache = min(total_computed_tokens + num_new_tokens, request.num_tokens)",
        replace="num_tokens_to_cache = min(num_tokens_need_slot, request.num_tokens)",
        why="publishes the blocks of lookahead slots too: their tokens are not computed this "
        "step, so another request could hit KV that was never written",
        caught_by="test_allocate_slots.py::test_lookahead_slots_are_not_published",
    ),
    Mutant(
        name="caches_partial_blocks",
        file=FILE,
        find="num_full_blocks = num_computed_tokens // self.block_size",
        replace="num_full_blocks = cdiv(num_computed_tokens, self.block_size)",
        why="rounds up in cache_blocks: a block only partly computed (mid-prefill chunk) is "
        "published and can be hit before its KV is written",
        caught_by="test_allocate_slots.py::test_a_chunk_publishes_only_what_it_fills",
    ),
    Mutant(
        name="cache_blocks_rehashes",
        file=FILE,
        find="""
            )
            self.num_cached_block[request_id] = num_full_blocks
        """,
        replace="""
            )
        """,
        why="cache_blocks never records how far it got, so the next step hashes the same "
        "blocks again (a block is hashed once: RuntimeError)",
        caught_by="test_allocate_slots.py::test_returns_only_new_blocks",
    ),
    Mutant(
        name="no_max_model_len_cap",
        file=FILE,
        find="""
            num_tokens_need_slot = min(
                total_computed_tokens + num_new_tokens + num_lookahead_tokens, self.max_model_len
            )
        """,
        replace="""
            num_tokens_need_slot = total_computed_tokens + num_new_tokens + num_lookahead_tokens
        """,
        why="slots are not capped at max_model_len: lookahead slots beyond the model's length "
        "take blocks no token can ever use",
        caught_by="test_allocate_slots.py::test_slots_capped_at_max_model_len",
    ),
    # -- capacity accounting of prefix hits (in use: free of charge; free: one block each) --
    Mutant(
        name="in_use_hits_counted",
        file=FILE,
        find="blk.ref_cnt == 0 and not blk.is_null for blk in new_computed_blocks",
        replace="not blk.is_null for blk in new_computed_blocks",
        why="counts every hit as a block taken from the free queue, also hits on blocks that "
        "running requests hold: a request sharing a running request's prefix is refused "
        "although its fresh blocks fit",
        caught_by="test_allocate_slots.py::test_in_use_hits_cost_no_free_block",
    ),
    Mutant(
        name="hits_not_subtracted_from_fresh",
        file=FILE,
        find="num_new_blocks = max(num_required_blocks - len(new_computed_blocks), 0)",
        replace="num_new_blocks = max(num_required_blocks, 0)",
        why="counts the hit blocks as fresh ones (and the free hits once more): every hit costs "
        "capacity, in-use hits included, so fitting admissions are refused",
        caught_by="test_allocate_slots.py::test_none_leaves_hits_unclaimed",
    ),
    Mutant(
        name="capacity_ignores_the_table",
        file=FILE,
        find="return max(num_required_blocks - num_req_blocks, 0)",
        replace="return max(num_required_blocks, 0)",
        why="counts the blocks a running request already holds as blocks to allocate: a decode "
        "step that needs one block (or none) is refused when fewer blocks than its whole "
        "table are free",
        caught_by="test_allocate_slots.py::test_lookahead_slots_count_against_capacity",
    ),
    Mutant(
        name="capacity_check_off_by_one",
        file=FILE,
        find="if num_blocks_to_allocate > self.block_pool.get_num_free_blocks():",
        replace="if num_blocks_to_allocate >= self.block_pool.get_num_free_blocks():",
        why="refuses an allocation that needs exactly the free blocks: the last free block is "
        "never handed out",
        caught_by="test_allocate_slots.py::test_none_changes_nothing",
    ),
    Mutant(
        name="capacity_without_lookahead",
        file=FILE,
        find="num_tokens=num_tokens_need_slot,",
        replace="num_tokens=min(total_computed_tokens + num_new_tokens, self.max_model_len),",
        why="the capacity check leaves out the lookahead slots the allocation then takes: the "
        "check passes, and the allocation runs out of blocks half-way with the hits claimed",
        caught_by="test_allocate_slots.py::test_lookahead_slots_count_against_capacity",
    ),
    Mutant(
        name="hits_touched_twice",
        file=FILE,
        find="""
            if new_computed_block_list[0]:
                self.allocate_new_computed_blocks(request.request_id, new_computed_block_list[0])
        """,
        replace="""
            if new_computed_block_list[0]:
                self.block_pool.touch(new_computed_block_list[0])
                self.allocate_new_computed_blocks(request.request_id, new_computed_block_list[0])
        """,
        why="allocate_slots touches the hits and allocate_new_computed_blocks touches them "
        "again: each hit gains two references for one holder and never returns to the free "
        "queue (a leak)",
        caught_by="test_allocate_slots.py::test_hits_are_shared_and_touched",
    ),
    Mutant(
        name="hit_capped_at_the_prompt",
        file=FILE,
        find="max_cache_hit_length = request.num_tokens - 1",
        replace="max_cache_hit_length = request.num_prompt_tokens - 1",
        why="caps the hit at the prompt: a preempted request resumed with output tokens "
        "recomputes its cached output blocks instead of hitting them",
        caught_by="test_workload.py::test_random_workload",
    ),
    Mutant(
        name="stats_count_the_capped_query",
        file=FILE,
        find="num_tokens=request.num_tokens,",
        replace="num_tokens=max_cache_hit_length,",
        why="records num_tokens - 1 queried tokens per lookup instead of the request's "
        "num_tokens: the hit rate is computed over the wrong total",
        caught_by="test_prefix_hits.py::test_prefix_cache_stats_count_lookups",
    ),
    Mutant(
        name="free_keeps_num_cached_block",
        file=FILE,
        find="self.num_cached_block.pop(request.request_id, None)",
        replace="pass",
        why="free forgets the table but not how many of its blocks were published: resumed "
        "without a hit, the request skips publishing its first blocks again",
        caught_by="test_free.py::test_free_forgets_the_request",
    ),
    # -- free, ids, usage ---------------------------------------------------------------------
    Mutant(
        name="free_in_forward_order",
        file=FILE,
        find="self.block_pool.free_blocks(list(reversed(req_blocks)))",
        replace="self.block_pool.free_blocks(list(req_blocks))",
        why="frees head first: under LRU eviction the shared prefix is then evicted before the "
        "request's private tail",
        caught_by="test_free.py::test_free_returns_blocks_tail_first",
    ),
    Mutant(
        name="free_keeps_the_table",
        file=FILE,
        find="req_blocks = self.req_to_blocks.pop(request.request_id, [])",
        replace="req_blocks = self.req_to_blocks.get(request.request_id, [])",
        why="free releases the blocks but leaves the request's table in req_to_blocks: a "
        "preempted request readmitted later starts from a stale table of freed blocks",
        caught_by="test_prefix_hits.py::test_lookup_changes_nothing",
    ),
    Mutant(
        name="usage_counts_the_null_block",
        file=FILE,
        find="return self.block_pool.get_usage()",
        replace="return 1.0 - self.block_pool.get_num_free_blocks() / self.num_gpu_blocks",
        why="usage divides by num_gpu_blocks, counting the null block as usable capacity, so "
        "it never reaches 100 %",
        caught_by="test_free.py::test_usage",
    ),
    Mutant(
        name="get_block_ids_none_when_empty",
        file=FILE,
        find="return self.get_blocks(request_id).get_block_ids()",
        replace="return self.get_blocks(request_id).get_block_ids(allow_none=True)",
        why="get_block_ids returns None for a request without blocks instead of ([],): callers "
        "index the result per group",
        caught_by="test_free.py::test_get_block_ids",
    ),
    # -- the admission gate -----------------------------------------------------------------
    Mutant(
        name="gate_ignored",
        file=FILE,
        find="if full_sequence_must_fit:",
        replace="if False:",
        why="accepts full_sequence_must_fit but never checks it: the scheduler admits on the "
        "first chunk, starts prompts the cache cannot finish, and preempts them mid-prefill",
        caught_by="test_allocate_slots.py::test_admission_gate",
    ),
    Mutant(
        name="gate_counts_the_prompt_only",
        file=FILE,
        find="full_num_tokens = min(request.num_tokens, self.max_model_len)",
        replace="full_num_tokens = min(request.num_prompt_tokens, self.max_model_len)",
        why="the gate sizes a resumed request by its prompt: the outputs it must recompute are "
        "forgotten, so it is let in and preempted again",
        caught_by="test_allocate_slots.py::test_admission_gate_counts_outputs",
    ),
    Mutant(
        name="gate_ignores_hits",
        file=FILE,
        find="""
                num_tokens=full_num_tokens,
                new_computed_blocks=new_computed_block_list[0],
        """,
        replace="""
                num_tokens=full_num_tokens,
                new_computed_blocks=(),
        """,
        why="the gate counts every block of the sequence as fresh: a request whose prefix is "
        "held by others (free of charge) is refused although it fits",
        caught_by="test_allocate_slots.py::test_admission_gate",
    ),
    Mutant(
        name="gate_reserves_the_whole_sequence",
        file=FILE,
        find="""
        num_tokens_need_slot = min(
            total_computed_tokens + num_new_tokens + num_lookahead_tokens, self.max_model_len
        )
        """,
        replace="""
        num_tokens_need_slot = min(
            total_computed_tokens + num_new_tokens + num_lookahead_tokens, self.max_model_len
        )
        if full_sequence_must_fit:
            num_tokens_need_slot = max(num_tokens_need_slot, min(request.num_tokens,
                                                                 self.max_model_len))
        """,
        why="the gate allocates blocks for the whole sequence at admission instead of only "
        "checking that they exist: a chunked prompt holds blocks it will not fill for "
        "several steps, which is the waste paging exists to avoid",
        caught_by="test_allocate_slots.py::test_admission_gate",
    ),
    # -- hunted: hashless requests, hits on a running request, the gate's hit count ----------
    Mutant(
        name="hit_indexes_the_hashes",
        file=FILE,
        find="""
            for block_hash in itertools.islice(block_hashes, max_num_blocks):
                cached = self.block_pool.get_cached_block(block_hash, [_GROUP_ID])
        """,
        replace="""
            for i in range(max_num_blocks):
                cached = self.block_pool.get_cached_block(block_hashes[i], [_GROUP_ID])
        """,
        why="walks range(limit) and indexes the hashes: a request with fewer hashes than the "
        "limit (built without a block_hasher: none at all) makes the lookup raise IndexError",
        caught_by="test_prefix_hits.py::test_find_longest_cache_hit_respects_the_limit",
    ),
    Mutant(
        name="cache_blocks_not_capped_by_hashes",
        file=FILE,
        find="""
            num_full_blocks = min(num_full_blocks, len(request.block_hashes))
            if num_cached_blocks >= num_full_blocks:
                return
        """,
        replace="",
        why="cache_blocks publishes every full block whether or not the request has its hash: "
        "a request built without a block_hasher makes cache_full_blocks raise on its first "
        "full block",
        caught_by="test_allocate_slots.py::test_request_without_hashes_publishes_nothing",
    ),
    Mutant(
        name="hits_for_a_running_request_accepted",
        file=FILE,
        find="""
                if new_computed_blocks:
                    raise ValueError(
                        f"request {request_id!r} already holds blocks; prefix-cache hits apply "
                        f"only to a request's first allocation"
                    )
        """,
        replace="",
        why="get_num_blocks_to_allocate counts hits for a request that already holds blocks "
        "instead of rejecting them: the caller's bug goes unnoticed (or turns into a None that "
        "makes the scheduler preempt someone)",
        caught_by="test_allocate_slots.py::test_bad_arguments_are_rejected",
    ),
    Mutant(
        name="gate_subtracts_hits_twice",
        file=FILE,
        find="full_num_tokens = min(request.num_tokens, self.max_model_len)",
        replace="full_num_tokens = min(request.num_tokens - num_new_computed_tokens, "
        "self.max_model_len)",
        why="the gate sizes the sequence as num_tokens less the hit tokens, and "
        "get_num_blocks_to_allocate then subtracts the hit blocks again: a long request "
        "sharing a held prefix passes the gate without room to finish",
        caught_by="test_allocate_slots.py::test_admission_gate",
    ),
    Mutant(
        name="num_cached_block_runs_ahead_of_the_hashes",
        file=FILE,
        find="""
        num_full_blocks = min(num_full_blocks, len(request.block_hashes))
        if num_cached_blocks >= num_full_blocks:
            return
        """,
        replace="""
        if len(request.block_hashes) < num_full_blocks:
            self.num_cached_block[request_id] = num_full_blocks
            return
        """,
        why="when the request has fewer hashes than full blocks, cache_blocks records the "
        "blocks as published without publishing them: num_cached_block no longer counts the "
        "blocks really in the prefix cache",
        caught_by="test_allocate_slots.py::test_request_without_hashes_publishes_nothing",
    ),
    Mutant(
        name="hit_count_checked_one_way",
        file=FILE,
        find="if len(new_computed_block_list[0]) * self.block_size != num_new_computed_tokens:",
        replace="if len(new_computed_block_list[0]) * self.block_size < num_new_computed_tokens:",
        why="checks only that the hits cover at least num_new_computed_tokens: hit blocks "
        "passed with num_new_computed_tokens=0 are claimed and then used as the slots of "
        "tokens to compute, so the request writes over a block another request shares",
        caught_by="test_allocate_slots.py::test_bad_arguments_are_rejected",
    ),
    Mutant(
        name="hit_count_checked_in_blocks",
        file=FILE,
        find="if len(new_computed_block_list[0]) * self.block_size != num_new_computed_tokens:",
        replace="if len(new_computed_block_list[0]) != num_new_computed_tokens // self.block_size:",
        why="compares the hit blocks with num_new_computed_tokens // block_size: a count that is "
        "not a whole number of blocks (one block, block_size + 1 tokens) is accepted, and the "
        "token past the hit counts as computed with no KV written for it",
        caught_by="test_allocate_slots.py::test_bad_arguments_are_rejected",
    ),
    Mutant(
        name="returned_blocks_alias_the_table",
        file=FILE,
        find="""
        new_blocks = self.block_pool.get_new_blocks(num_new_blocks)
        req_blocks.extend(new_blocks)
        return new_blocks
        """,
        replace="""
        new_blocks = self.block_pool.get_new_blocks(num_new_blocks)
        if not req_blocks:
            self.req_to_blocks[request_id] = new_blocks
            return new_blocks
        req_blocks.extend(new_blocks)
        return new_blocks
        """,
        why="a new request's table is the very list allocate_slots returns: every later step "
        "that grows the table also grows the KVCacheBlocks handed out for the prefill",
        caught_by="test_allocate_slots.py::test_returns_only_new_blocks",
    ),
    Mutant(
        name="stats_without_log_stats",
        file=FILE,
        find="""
        if not self.log_stats:
            return None
        stats = self.prefix_cache_stats
        """,
        replace="""
        stats = self.prefix_cache_stats
        """,
        why="make_prefix_cache_stats ignores log_stats: the first call returns the None the "
        "constructor left, every later call an empty PrefixCacheStats a quiet manager should "
        "not have",
        caught_by="test_prefix_hits.py::test_make_prefix_cache_stats_resets",
    ),
    Mutant(
        name="stats_handed_out_as_a_copy",
        file=FILE,
        find="""        stats = self.prefix_cache_stats
        self.prefix_cache_stats = PrefixCacheStats()
        return stats
""",
        replace="""        live = self.prefix_cache_stats
        stats = PrefixCacheStats(
            reset=live.reset,
            requests=live.requests,
            queries=live.queries,
            hits=live.hits,
            preempted_requests=live.preempted_requests,
            preempted_queries=live.preempted_queries,
            preempted_hits=live.preempted_hits,
        )
        live.requests = live.queries = live.hits = 0
        live.preempted_requests = live.preempted_queries = live.preempted_hits = 0
        return stats
""",
        why="hands out a copy and zeroes the counters instead of starting a fresh "
        "PrefixCacheStats: the reset flag is never cleared, so every snapshot after one "
        "reset_prefix_cache says reset=True (and the hit-rate window is cleared every interval)",
        caught_by="test_prefix_hits.py::test_make_prefix_cache_stats_resets",
    ),
    Mutant(
        name="table_is_the_callers_list_of_hits",
        file=FILE,
        find="""        req_blocks.extend(new_computed_blocks)
        self.num_cached_block[request_id] = len(req_blocks)""",
        replace="""        req_blocks = self.req_to_blocks[request_id] = new_computed_blocks
        self.num_cached_block[request_id] = len(req_blocks)""",
        why="starts the request's table with the caller's list of hits instead of a copy: the "
        "KVCacheBlocks that get_computed_blocks returned grows with every block the request "
        "gets",
        caught_by="test_allocate_slots.py::test_hits_are_shared_and_touched",
    ),
    Mutant(
        name="num_new_tokens_checked_after_the_gate",
        file=FILE,
        find="""        if num_new_tokens <= 0:
            raise ValueError(
                f"request {request.request_id!r}: num_new_tokens must be > 0, got {num_new_tokens}"
            )
""",
        replace="""        if num_new_tokens <= 0 and not full_sequence_must_fit:
            raise ValueError(
                f"request {request.request_id!r}: num_new_tokens must be > 0, got {num_new_tokens}"
            )
""",
        why="skips the argument check on the admission gate's path: allocate_slots(r, 0, "
        "full_sequence_must_fit=True) answers None (or blocks) for a call that asks for nothing",
        caught_by="test_allocate_slots.py::test_bad_arguments_are_rejected",
    ),
    Mutant(
        name="negative_lookahead_accepted",
        file=FILE,
        find="""        if num_lookahead_tokens < 0:
            raise ValueError(f"num_lookahead_tokens must be >= 0, got {num_lookahead_tokens}")
""",
        replace="",
        why="validates num_new_tokens but not num_lookahead_tokens: a negative lookahead "
        "silently takes back slots that the step's own tokens need",
        caught_by="test_allocate_slots.py::test_bad_arguments_are_rejected",
    ),
    Mutant(
        name="blocks_per_request_floor_of_max_model_len",
        file=FILE,
        find="        num_required_blocks = cdiv(num_tokens, self.block_size)\n",
        replace="        num_required_blocks = min(\n"
        "            cdiv(num_tokens, self.block_size), self.max_model_len // self.block_size\n"
        "        )\n",
        more=(
            (
                "        num_new_blocks = cdiv(num_tokens, self.block_size) - len(req_blocks)\n",
                "        num_new_blocks = min(\n"
                "            cdiv(num_tokens, self.block_size), self.max_model_len // self.block_size\n"
                "        ) - len(req_blocks)\n",
            ),
            (
                """
                num_tokens_need_slot = min(
                    total_computed_tokens + num_new_tokens + num_lookahead_tokens, self.max_model_len
                )
                """,
                """
                num_tokens_need_slot = total_computed_tokens + num_new_tokens + num_lookahead_tokens
                """,
            ),
        ),
        why="caps a request at max_model_len // block_size blocks: with a max_model_len that is "
        "not a multiple of the block size, the last tokens of a long request have no slot",
        caught_by="test_allocate_slots.py::test_slots_capped_at_max_model_len",
    ),
    Mutant(
        name="slots_capped_below_max_model_len",
        file=FILE,
        find="            total_computed_tokens + num_new_tokens + num_lookahead_tokens, "
        "self.max_model_len\n",
        replace="            total_computed_tokens + num_new_tokens + num_lookahead_tokens, "
        "self.max_model_len - 1\n",
        why="caps the slots at max_model_len - 1 tokens (positions below max_model_len): a "
        "request of exactly max_model_len tokens is a slot short",
        caught_by="test_allocate_slots.py::test_slots_capped_at_max_model_len",
    ),
    Mutant(
        name="gate_sizes_max_model_len_in_whole_blocks",
        file=FILE,
        find="            full_num_tokens = min(request.num_tokens, self.max_model_len)\n",
        replace="            full_num_tokens = min(\n"
        "                request.num_tokens, self.max_model_len // self.block_size * self.block_size\n"
        "            )\n",
        why="rounds max_model_len down to whole blocks in the admission gate: a prompt whose "
        "last block is partly filled is admitted although it cannot fit",
        caught_by="test_allocate_slots.py::test_admission_gate",
    ),
    Mutant(
        name="hits_returned_in_a_reused_buffer",
        file=FILE,
        find="        computed: list[KVCacheBlock] = []\n",
        replace='        computed = self.__dict__.setdefault("_hit_buffer", [])\n'
        "        computed.clear()\n",
        why="returns the hits in one list the manager refills: the next lookup empties the hits "
        "a caller still holds for another request",
        caught_by="test_prefix_hits.py::test_lookup_changes_nothing",
    ),
    Mutant(
        name="cache_blocks_publishes_without_caching",
        file=FILE,
        find="""
                if not self.enable_caching:
                    return
                request_id = request.request_id
                num_cached_blocks = self.num_cached_block.get(request_id, 0)
        """,
        replace="""
                request_id = request.request_id
                num_cached_blocks = self.num_cached_block.get(request_id, 0)
        """,
        why="cache_blocks publishes whatever caching says, relying on allocate_slots' guard: "
        "the async scheduler's direct call publishes blocks with caching off",
        caught_by="test_allocate_slots.py::test_request_without_hashes_publishes_nothing",
    ),
    Mutant(
        name="hash_cap_only_in_allocate_slots",
        file=FILE,
        find="""
                num_full_blocks = min(num_full_blocks, len(request.block_hashes))
                if num_cached_blocks >= num_full_blocks:
                    return
        """,
        replace="",
        more=(
            (
                "            num_tokens_to_cache = min(total_computed_tokens + num_new_tokens, "
                "request.num_tokens)\n",
                "            num_tokens_to_cache = min(\n"
                "                total_computed_tokens + num_new_tokens,\n"
                "                request.num_tokens,\n"
                "                len(request.block_hashes) * self.block_size,\n"
                "            )\n",
            ),
        ),
        why="caps the published blocks at the request's hashes in allocate_slots only: "
        "cache_blocks called directly on a request without hashes raises",
        caught_by="test_allocate_slots.py::test_request_without_hashes_publishes_nothing",
    ),
    Mutant(
        name="cache_blocks_count_can_go_down",
        file=FILE,
        find="""
                num_full_blocks = num_computed_tokens // self.block_size
                if num_cached_blocks >= num_full_blocks:
                    return  # the common case, checked first: no block was filled since the last call
                num_full_blocks = min(num_full_blocks, len(request.block_hashes))
                if num_cached_blocks >= num_full_blocks:
                    return
        """,
        replace="""
                num_full_blocks = min(num_computed_tokens // self.block_size, len(request.block_hashes))
        """,
        why="publishes up to the count given even when it is below what was published: "
        "num_cached_block goes down, and the next call hashes published blocks again",
        caught_by="test_allocate_slots.py::test_request_without_hashes_publishes_nothing",
    ),
    # -- helper probe, 2026-11-28 (round 1) ---------------------------------------------------
    Mutant(
        name="hit_count_checked_after_the_capacity_count",
        file=FILE,
        find="""
        if len(new_computed_block_list[0]) * self.block_size != num_new_computed_tokens:
            raise ValueError(
                f"request {request.request_id!r}: num_new_computed_tokens="
                f"{num_new_computed_tokens} does not match the {len(new_computed_block_list[0])}"
                f" prefix-hit blocks of {self.block_size} tokens"
            )
        """,
        replace="",
        more=(
            (
                """
                if num_blocks_to_allocate > self.block_pool.get_num_free_blocks():
                    return None
                """,
                """
                if num_blocks_to_allocate > self.block_pool.get_num_free_blocks():
                    return None
                if len(new_computed_block_list[0]) * self.block_size != num_new_computed_tokens:
                    raise ValueError("num_new_computed_tokens does not match the hit blocks")
                """,
            ),
        ),
        why="checks that the hits add up only after the gate and the capacity count: hits that "
        "do not match num_new_computed_tokens get None when the pool is short, and the "
        "scheduler preempts someone for its own bug",
        caught_by="test_allocate_slots.py::test_bad_arguments_are_rejected",
    ),
    Mutant(
        name="hit_count_checked_after_the_gate",
        file=FILE,
        find="""
        if len(new_computed_block_list[0]) * self.block_size != num_new_computed_tokens:
            raise ValueError(
                f"request {request.request_id!r}: num_new_computed_tokens="
                f"{num_new_computed_tokens} does not match the {len(new_computed_block_list[0])}"
                f" prefix-hit blocks of {self.block_size} tokens"
            )
        """,
        replace="",
        more=(
            (
                """
                num_tokens_need_slot = min(
                    total_computed_tokens + num_new_tokens + num_lookahead_tokens, self.max_model_len
                )
                """,
                """
                if len(new_computed_block_list[0]) * self.block_size != num_new_computed_tokens:
                    raise ValueError("num_new_computed_tokens does not match the hit blocks")
                num_tokens_need_slot = min(
                    total_computed_tokens + num_new_tokens + num_lookahead_tokens, self.max_model_len
                )
                """,
            ),
        ),
        why="checks that the hits add up after the admission gate: a waiting request whose "
        "hits do not match num_new_computed_tokens is answered None by the gate instead of "
        "ValueError",
        caught_by="test_allocate_slots.py::test_bad_arguments_are_rejected",
    ),
    Mutant(
        name="zero_new_tokens_accepted_with_hits",
        file=FILE,
        find="if num_new_tokens <= 0:",
        replace="if num_new_tokens <= 0 and not num_new_computed_tokens:",
        why="accepts num_new_tokens=0 when hits cover some tokens, as if a fully cached prompt "
        "had nothing to compute: the hit is capped at num_tokens - 1, so such a call is the "
        "caller's bug",
        caught_by="test_allocate_slots.py::test_bad_arguments_are_rejected",
    ),
    Mutant(
        name="only_zero_new_tokens_refused",
        file=FILE,
        find="if num_new_tokens <= 0:",
        replace="if num_new_tokens == 0:",
        why="refuses num_new_tokens == 0 only: a negative count is accepted, sizes the table "
        "below what the request computed and leaves an empty block table behind",
        caught_by="test_allocate_slots.py::test_bad_arguments_are_rejected",
    ),
    Mutant(
        name="hits_of_a_running_request_dropped",
        file=FILE,
        find="""
        if new_computed_blocks is not None:
            new_computed_block_list = new_computed_blocks.blocks
        else:
        """,
        replace="""
        if new_computed_blocks is not None and request.request_id not in self.req_to_blocks:
            new_computed_block_list = new_computed_blocks.blocks
        elif new_computed_blocks is not None:
            new_computed_block_list = self.empty_kv_cache_blocks.blocks
            num_new_computed_tokens = 0
        else:
        """,
        why="silently drops the hits given for a request that already holds blocks instead of "
        "refusing them: the caller's bug goes unnoticed and the step is sized without them",
        caught_by="test_allocate_slots.py::test_bad_arguments_are_rejected",
    ),
    Mutant(
        name="hit_count_checked_only_with_caching",
        file=FILE,
        find="if len(new_computed_block_list[0]) * self.block_size != num_new_computed_tokens:",
        replace="if self.enable_caching and len(new_computed_block_list[0]) * self.block_size "
        "!= num_new_computed_tokens:",
        why="checks the hit count only with caching on: without caching, "
        "num_new_computed_tokens > 0 with no blocks is accepted and those tokens count as "
        "computed with no KV behind them",
        caught_by="test_allocate_slots.py::test_bad_arguments_are_rejected",
    ),
    Mutant(
        name="step_past_the_known_tokens_refused",
        file=FILE,
        find="        num_local_computed_tokens = request.num_computed_tokens + num_new_computed_tokens\n",
        replace="        num_local_computed_tokens = request.num_computed_tokens + num_new_computed_tokens\n"
        "        if num_local_computed_tokens + num_new_tokens > request.num_tokens:\n"
        '            raise ValueError("more tokens scheduled than the request has")\n',
        why="refuses a step that reaches past the request's known tokens: the async scheduler "
        "schedules a decode's next position while the token in flight is unknown, so every "
        "decode step after the first raises",
        caught_by="test_allocate_slots.py::test_a_step_past_the_known_tokens",
    ),
    Mutant(
        name="stats_started_afresh_only_when_counted",
        file=FILE,
        find="""
        stats = self.prefix_cache_stats
        self.prefix_cache_stats = PrefixCacheStats()
        return stats
        """,
        replace="""
        stats = self.prefix_cache_stats
        if stats.requests or stats.preempted_requests or stats.reset:
            self.prefix_cache_stats = PrefixCacheStats()
        return stats
        """,
        why="starts a fresh PrefixCacheStats only when something was counted: an empty "
        "snapshot is the live object, and the lookups after it are counted in a snapshot the "
        "logger already holds, and again in the next one",
        caught_by="test_prefix_hits.py::test_make_prefix_cache_stats_resets",
    ),
    Mutant(
        name="gate_only_for_requests_without_blocks",
        file=FILE,
        find="if full_sequence_must_fit:",
        replace="if full_sequence_must_fit and request.request_id not in self.req_to_blocks:",
        why="applies the admission gate only to requests holding no blocks: a request asking "
        "with full_sequence_must_fit=True after its first chunk gets the chunk although its "
        "whole sequence cannot fit",
        caught_by="test_allocate_slots.py::test_admission_gate",
    ),
    Mutant(
        name="gate_counts_the_tokens_left",
        file=FILE,
        find="full_num_tokens = min(request.num_tokens, self.max_model_len)",
        replace="full_num_tokens = min(request.num_tokens, self.max_model_len) - "
        "request.num_computed_tokens",
        why="the gate counts the tokens left after num_computed_tokens, and "
        "get_num_blocks_to_allocate then subtracts the blocks held for them again: a request "
        "holding blocks passes the gate without room for its whole sequence",
        caught_by="test_allocate_slots.py::test_admission_gate",
    ),
    # -- a blind implementation's legal variants, 2026-11-28 ---------------------------------
    Mutant(
        name="stats_recorded_without_caching",
        file=FILE,
        find="""
            if not self.enable_caching:
                return self.empty_kv_cache_blocks, 0

            max_cache_hit_length = request.num_tokens - 1
            computed_blocks, num_new_computed_tokens = self.find_longest_cache_hit(
                request.block_hashes, max_cache_hit_length
            )
        """,
        replace="""
            if not self.enable_caching:
                computed_blocks, num_new_computed_tokens = ([],), 0
            else:
                max_cache_hit_length = request.num_tokens - 1
                computed_blocks, num_new_computed_tokens = self.find_longest_cache_hit(
                    request.block_hashes, max_cache_hit_length
                )
        """,
        why="records a lookup of every request in prefix_cache_stats with caching off: a "
        "lookup that never happens counts as a miss, so the hit rate reads 0 instead of nothing",
        caught_by="test_prefix_hits.py::test_caching_disabled",
    ),
    Mutant(
        name="hits_on_a_running_request_asserted",
        file=FILE,
        find="""
                if new_computed_blocks:
                    raise ValueError(
                        f"request {request_id!r} already holds blocks; prefix-cache hits apply "
                        f"only to a request's first allocation"
                    )
        """,
        replace="""
                assert not new_computed_blocks, "a running request cannot take prefix hits"
        """,
        why="refuses hits for a request that holds blocks with an assert, as upstream does: the "
        "README asks for a ValueError, which python -O does not strip",
        caught_by="test_allocate_slots.py::test_bad_arguments_are_rejected",
    ),
    # -- helper probe, 2026-11-29 (lab-07/lab-09 round) ---------------------------------------
    Mutant(
        name="cache_blocks_counts_blocks_past_the_hashes",
        file=FILE,
        find="        self.num_cached_block[request_id] = num_full_blocks\n",
        replace="        self.num_cached_block[request_id] = num_computed_tokens // self.block_size\n",
        why="publishes up to the request's hashes but records num_computed_tokens // block_size "
        "as published: called directly with more tokens than hashes, num_cached_block runs "
        "ahead, and the blocks past the hashes are never published once their hashes exist",
        caught_by="test_allocate_slots.py::test_request_without_hashes_publishes_nothing",
    ),
    Mutant(
        name="capacity_keeps_a_watermark",
        file=FILE,
        find="""
            if num_blocks_to_allocate > self.block_pool.get_num_free_blocks():
                return None
        """,
        replace="""
            watermark = int(0.01 * self.num_gpu_blocks)
            if num_blocks_to_allocate > self.block_pool.get_num_free_blocks() - watermark:
                return None
        """,
        why="keeps 1% of the pool back, as vLLM v0's block manager did: invisible on a pool of "
        "fewer than 100 blocks, and on a larger one an allocation that fits exactly is refused",
        caught_by="test_allocate_slots.py::test_prefill_gets_cdiv_blocks",
    ),
    Mutant(
        name="gate_keeps_a_watermark",
        file=FILE,
        find="            if num_blocks_for_full_sequence > self.block_pool.get_num_free_blocks():",
        replace="""
            watermark = int(0.01 * self.num_gpu_blocks)
            if num_blocks_for_full_sequence > self.block_pool.get_num_free_blocks() - watermark:
        """,
        why="the admission gate keeps 1% of the pool back: a whole sequence that needs every "
        "free block of a pool of 100 blocks or more is refused although it fits",
        caught_by="test_allocate_slots.py::test_admission_gate",
    ),
    Mutant(
        name="hit_capped_a_block_below_max_model_len",
        file=FILE,
        find="max_cache_hit_length = request.num_tokens - 1",
        replace="max_cache_hit_length = min(request.num_tokens - 1, self.max_model_len - self.block_size)",
        why="caps the hit a block below max_model_len as well, to leave a block to generate "
        "into: a request as long as a max_model_len that is not a multiple of the block size "
        "loses a block of its hit",
        caught_by="test_prefix_hits.py::test_hit_is_capped_at_num_tokens_minus_one",
    ),
    Mutant(
        name="forward_free_without_caching",
        file=FILE,
        find="self.block_pool.free_blocks(list(reversed(req_blocks)))",
        replace="self.block_pool.free_blocks(\n"
        "    list(reversed(req_blocks)) if self.enable_caching else req_blocks\n"
        ")",
        why="blocks freed tail first only with caching on, as older vLLM V1 did: without "
        "caching a request's blocks join the free queue head first, so the next allocation "
        "reuses them in another order than upstream's (only the random workload met the case)",
        caught_by="test_free.py::test_free_returns_blocks_tail_first",
    ),
    Mutant(
        name="stats_query_is_the_prompt",
        file=FILE,
        find="num_tokens=request.num_tokens,",
        replace="num_tokens=request.num_prompt_tokens,",
        why="a lookup's query counted as the prompt, as when only prompts were looked up: a "
        "resumed request looks up its outputs too, so its hits can exceed its counted queries "
        "(only the random workload met the case)",
        caught_by="test_prefix_hits.py::test_prefix_cache_stats_count_lookups",
    ),
    Mutant(
        name="refused_hits_stay_claimed",
        file=FILE,
        find="""
            if len(new_computed_block_list[0]) * self.block_size != num_new_computed_tokens:
                raise ValueError(
        """,
        replace="""
            if len(new_computed_block_list[0]) * self.block_size != num_new_computed_tokens:
                self.block_pool.touch(new_computed_block_list[0])  # claimed, then refused
                raise ValueError(
        """,
        why="hits whose count does not match num_new_computed_tokens are refused, but only after "
        "they were claimed (touch: ref_cnt + 1, out of the free queue), and nothing gives them "
        "back: a refusal must change nothing (a red-team helper's sweep: the test read no state "
        "after its later refusals)",
        caught_by="test_allocate_slots.py::test_bad_arguments_are_rejected",
    ),
    # -- cost: nothing a step does may grow with the request's length (a complexity probe) ------
    Mutant(
        name="cache_blocks_counts_the_published_blocks_by_walking",
        file=FILE,
        find="""
            num_cached_blocks = self.num_cached_block.get(request_id, 0)
            num_full_blocks = num_computed_tokens // self.block_size
        """,
        replace="""
            num_cached_blocks = sum(
                1 for b in self.req_to_blocks.get(request_id, []) if b.block_hash is not None
            )
            num_full_blocks = num_computed_tokens // self.block_size
        """,
        why="cache_blocks counts the published blocks by walking the table every step instead "
        "of reading num_cached_block: the right count, but each decode step of a long request "
        "costs O(its length), O(n^2) over its life (README: never by walking the table)",
        caught_by="test_prefix_hits.py::test_decode_steps_cost_the_same_on_a_long_request",
    ),
    Mutant(
        name="cache_blocks_walks_the_table_when_a_block_fills",
        file=FILE,
        find="""
            num_full_blocks = min(num_full_blocks, len(request.block_hashes))
            if num_cached_blocks >= num_full_blocks:
                return
        """,
        replace="""
            num_full_blocks = min(num_full_blocks, len(request.block_hashes))
            num_cached_blocks = sum(
                1 for b in self.req_to_blocks.get(request_id, []) if b.block_hash is not None
            )
            if num_cached_blocks >= num_full_blocks:
                return
        """,
        why="the walk is only done once a block may have filled, so a step that fills none is "
        "O(1); but each block filled still costs O(the table), O(n^2 / block_size) over a "
        "request (README: never by walking the table)",
        caught_by="test_prefix_hits.py::test_decode_steps_cost_the_same_on_a_long_request",
    ),
    Mutant(
        name="hit_search_goes_on_past_the_first_miss",
        file=FILE,
        find="""
            for block_hash in itertools.islice(block_hashes, max_num_blocks):
                cached = self.block_pool.get_cached_block(block_hash, [_GROUP_ID])
                if not cached:
                    break
                computed.append(cached[0])
        """,
        replace="""
            missed = False
            for i, block_hash in enumerate(block_hashes):
                cached = self.block_pool.get_cached_block(block_hash, [_GROUP_ID])
                if not cached or i >= max_num_blocks:
                    missed = True
                if not missed:
                    computed.append(cached[0])
        """,
        why="the search notes the first miss but looks up every hash of the prompt anyway: the "
        "right hit, at O(prompt) lookups for every waiting request every step (README task 3: "
        "stop at the first miss)",
        caught_by="test_prefix_hits.py::test_hit_search_stops_at_the_first_miss",
    ),
    # -- helper probe, 2026-11-29 (9): caught by the random workloads only -----------------------
    Mutant(
        name="lookahead_left_out_with_hits",
        file=FILE,
        find="total_computed_tokens + num_new_tokens + num_lookahead_tokens, self.max_model_len",
        replace="total_computed_tokens + num_new_tokens "
        "+ (0 if num_new_computed_tokens else num_lookahead_tokens), self.max_model_len",
        why="adds the lookahead slots only to a request without prefix hits: an admission with "
        "hits and lookahead gets, and counts, too few slots (README: n = computed + new "
        "computed + new + lookahead)",
        caught_by="test_allocate_slots.py::test_lookahead_slots_count_against_capacity",
    ),
    Mutant(
        name="capacity_counted_past_max_model_len",
        file=FILE,
        find="""
            num_blocks_to_allocate = self.get_num_blocks_to_allocate(
                request_id=request.request_id,
                num_tokens=num_tokens_need_slot,
        """,
        replace="""
            num_blocks_to_allocate = self.get_num_blocks_to_allocate(
                request_id=request.request_id,
                num_tokens=total_computed_tokens + num_new_tokens + num_lookahead_tokens,
        """,
        why="caps the slots at max_model_len when allocating but not when counting: near "
        "max_model_len with lookahead, an allocation that fits is refused on a tight pool",
        caught_by="test_allocate_slots.py::test_slots_capped_at_max_model_len",
    ),
    # -- helper focus, 2026-11-29 (s48): caught by the random workload only until now ----------
    Mutant(
        name="gate_counts_the_lookahead",
        file=FILE,
        find="full_num_tokens = min(request.num_tokens, self.max_model_len)",
        replace="full_num_tokens = min(request.num_tokens + num_lookahead_tokens, "
        "self.max_model_len)",
        why="the admission gate sizes the whole sequence with the lookahead slots added: a "
        "request whose sequence fits is refused because of draft slots it may never use "
        "(README task 10: the gate counts min(num_tokens, max_model_len), no lookahead)",
        caught_by="test_allocate_slots.py::test_admission_gate_leaves_out_the_lookahead",
    ),
    Mutant(
        name="get_block_ids_adds_an_empty_table",
        file=FILE,
        find="return self.get_blocks(request_id).get_block_ids()",
        replace="return ([blk.block_id for blk in self.req_to_blocks[request_id]],)",
        why="req_to_blocks is made a defaultdict(list) so that get_block_ids can index it for "
        "any id: asking about a request that holds nothing files an empty table for it, and "
        "get_num_common_prefix_blocks, which counts the tables, then finds no block shared by "
        "all (README: only requests holding blocks have an entry)",
        caught_by="test_free.py::test_get_block_ids_adds_no_table",
        more=(
            (
                "self.req_to_blocks: dict[str, list[KVCacheBlock]] = {}",
                "self.req_to_blocks: dict[str, list[KVCacheBlock]] = defaultdict(list)",
            ),
            ("import itertools", "import itertools\nfrom collections import defaultdict"),
        ),
    ),
    Mutant(
        name="fresh_blocks_taken_before_the_hits_are_claimed",
        file=FILE,
        find="""
            if new_computed_block_list[0]:
                self.allocate_new_computed_blocks(request.request_id, new_computed_block_list[0])

            # Stage 3: fresh blocks, then publish the blocks this step fills.
            new_blocks = self.allocate_new_blocks(request.request_id, num_tokens_need_slot)
        """,
        replace="""
            num_fresh = (
                cdiv(num_tokens_need_slot, self.block_size)
                - len(self.req_to_blocks.get(request.request_id, ()))
                - len(new_computed_block_list[0])
            )
            new_blocks = self.block_pool.get_new_blocks(num_fresh) if num_fresh > 0 else []
            if new_computed_block_list[0]:
                self.allocate_new_computed_blocks(request.request_id, new_computed_block_list[0])
            self.req_to_blocks.setdefault(request.request_id, []).extend(new_blocks)
        """,
        why="takes the fresh blocks from the pool before claiming (touching) the prefix hits: "
        "a hit that is free and cached may be the next block of the free queue, so the fresh "
        "allocation evicts it and the request holds one block twice, as a hit and as a fresh "
        "block (upstream fixed this order in vLLM PR 11562; README task 10: claim hits, then "
        "fresh blocks)",
        caught_by="test_allocate_slots.py::test_hits_are_claimed_before_fresh_blocks",
    ),
]
