"""Buggy implementations of lab-01 (the free queue and the block pool).

Each mutant is one mistake a learner plausibly makes, written as an edit of the solution
(``grading.mutants.Mutant``). ``python -m grading check-suites lab-01`` and
``tests/test_buggy_implementations.py`` check that the graded suite catches every one of them.
"""

from __future__ import annotations

from grading.mutants import Mutant

FILE = "block_pool.py"

MUTANTS = [
    # -- FreeKVCacheBlockQueue ----------------------------------------------------------------
    Mutant(
        name="init_last_block_not_linked_to_tail",
        file=FILE,
        find="""
            prev.next_free_block = self.fake_free_list_tail
            self.fake_free_list_tail.prev_free_block = prev
        """,
        replace="""
            self.fake_free_list_tail.prev_free_block = prev
        """,
        why="the constructor links the tail sentinel back to the last block but leaves the last "
        "block's next_free_block None: walking forward falls off the list (I2)",
        caught_by="test_free_queue.py::test_new_queue_links_blocks_in_order",
    ),
    Mutant(
        name="popleft_keeps_links",
        file=FILE,
        find="""
            second.prev_free_block = self.fake_free_list_head
            first.prev_free_block = first.next_free_block = None
            self.num_free_blocks -= 1
            return first
        """,
        replace="""
            second.prev_free_block = self.fake_free_list_head
            self.num_free_blocks -= 1
            return first
        """,
        why="popleft relinks the neighbours but leaves the popped block's prev/next set, so the "
        "block still looks queued (append refuses it, remove corrupts the list)",
        caught_by="test_free_queue.py::test_popleft_takes_the_front",
    ),
    Mutant(
        name="popleft_n_refuses_the_last_block",
        file=FILE,
        find="if n > self.num_free_blocks:",
        replace="if n >= self.num_free_blocks:",
        why="off-by-one in popleft_n's bound: popping exactly the number of free blocks is "
        "refused, so the pool can never be drained",
        caught_by="test_free_queue.py::test_popleft_n",
    ),
    Mutant(
        name="popleft_n_keeps_links",
        file=FILE,
        find="""
            following = block.next_free_block
            block.prev_free_block = block.next_free_block = None
            block = following
        assert block is not None
        """,
        replace="""
            following = block.next_free_block
            block = following
        assert block is not None
        """,
        why="popleft_n relinks the head sentinel past the popped run but never clears the "
        "popped blocks' own links",
        caught_by="test_free_queue.py::test_popleft_n",
    ),
    Mutant(
        name="popleft_n_front_not_linked_back",
        file=FILE,
        find="""
            self.fake_free_list_head.next_free_block = block
            block.prev_free_block = self.fake_free_list_head
            self.num_free_blocks -= n
        """,
        replace="""
            self.fake_free_list_head.next_free_block = block
            self.num_free_blocks -= n
        """,
        why="popleft_n moves the head sentinel's next pointer but the new front block still "
        "points back at a popped block: walking backward breaks (I2)",
        caught_by="test_free_queue.py::test_popleft_n",
    ),
    Mutant(
        name="remove_does_not_relink_prev",
        file=FILE,
        find="""
            prev.next_free_block = following
            following.prev_free_block = prev
            block.prev_free_block = block.next_free_block = None
            self.num_free_blocks -= 1
        """,
        replace="""
            prev.next_free_block = following
            block.prev_free_block = block.next_free_block = None
            self.num_free_blocks -= 1
        """,
        why="remove fixes the forward link only: the next block's prev_free_block still points "
        "at the removed block, so forward and backward walks disagree (I2)",
        caught_by="test_free_queue.py::test_remove_from_middle_head_and_tail",
    ),
    Mutant(
        name="remove_does_not_decrement_count",
        file=FILE,
        find="""
            following.prev_free_block = prev
            block.prev_free_block = block.next_free_block = None
            self.num_free_blocks -= 1
        """,
        replace="""
            following.prev_free_block = prev
            block.prev_free_block = block.next_free_block = None
        """,
        why="remove unlinks the block but forgets num_free_blocks, so the counter overstates "
        "the free blocks (I2) and the pool hands out blocks it does not have",
        caught_by="test_free_queue.py::test_remove_from_middle_head_and_tail",
    ),
    Mutant(
        name="remove_walks_the_list",
        file=FILE,
        find="""
            prev, following = block.prev_free_block, block.next_free_block
            if prev is None or following is None:
        """,
        replace="""
            # find the block by walking from the front, like list.remove
            node = self.fake_free_list_head.next_free_block
            while node is not None and node is not self.fake_free_list_tail and node is not block:
                node = node.next_free_block
            prev, following = block.prev_free_block, block.next_free_block
            if node is not block or prev is None or following is None:
        """,
        why="remove searches the list for the block before unlinking it: O(n) per removal, "
        "which makes every prefix-cache hit cost a walk of the free queue",
        caught_by="test_free_queue.py::test_operations_are_constant_time",
    ),
    Mutant(
        name="remove_not_in_queue_unchecked",
        file=FILE,
        find="""
            if prev is None or following is None:
                raise RuntimeError(
                    f"Cannot remove block {block.block_id} from the free queue: it is not in it "
                    f"(ref_cnt={block.ref_cnt})"
                )
            prev.next_free_block = following
        """,
        replace="""
            prev.next_free_block = following
        """,
        why="remove trusts its caller: removing a block that is not queued dereferences None "
        "instead of raising a clear error",
        caught_by="test_free_queue.py::test_remove_block_not_in_queue_is_an_error",
    ),
    Mutant(
        name="append_to_the_front",
        file=FILE,
        find="""
            tail = self.fake_free_list_tail
            last = tail.prev_free_block
            assert last is not None  # the tail sentinel always has a predecessor
            last.next_free_block = block
            block.prev_free_block = last
            block.next_free_block = tail
            tail.prev_free_block = block
            self.num_free_blocks += 1
        """,
        replace="""
            head = self.fake_free_list_head
            first = head.next_free_block
            assert first is not None
            head.next_free_block = block
            block.prev_free_block = head
            block.next_free_block = first
            first.prev_free_block = block
            self.num_free_blocks += 1
        """,
        why="append links the block in right after the head sentinel: a freed block becomes "
        "the next to be reused, the opposite of LRU",
        caught_by="test_free_queue.py::test_append_goes_to_the_back",
    ),
    Mutant(
        name="append_n_reverses_order",
        file=FILE,
        find="""
            for block in blocks:
                if block.prev_free_block is not None or block.next_free_block is not None:
                    self._unlink_after(anchor, count)
        """,
        replace="""
            for block in list(blocks)[::-1]:
                if block.prev_free_block is not None or block.next_free_block is not None:
                    self._unlink_after(anchor, count)
        """,
        why="append_n appends its blocks last to first, so a request's blocks are evicted in "
        "the wrong order",
        caught_by="test_free_queue.py::test_append_n_keeps_order",
    ),
    Mutant(
        name="append_n_count_not_updated",
        file=FILE,
        find="""
            tail.prev_free_block = last
            self.num_free_blocks += count
        """,
        replace="""
            tail.prev_free_block = last
        """,
        why="append_n links the blocks in but forgets num_free_blocks (append does it, append_n "
        "does not)",
        caught_by="test_free_queue.py::test_append_n_keeps_order",
    ),
    # -- BlockPool ------------------------------------------------------------------------------
    Mutant(
        name="null_block_not_popped",
        file=FILE,
        find="self.null_block = self.free_block_queue.popleft()",
        replace="self.null_block = self.blocks[0]",
        why="the null block is marked but left in the free queue, so get_new_blocks hands out "
        "block 0 like any other (I1)",
        caught_by="test_block_pool.py::test_null_block_is_reserved",
    ),
    Mutant(
        name="get_new_blocks_pops_from_the_back",
        file=FILE,
        find="""
            blocks = self.free_block_queue.popleft_n(num_blocks)
            for block in blocks:
        """,
        replace="""
            blocks = []
            for _ in range(num_blocks):
                last = self.free_block_queue.fake_free_list_tail.prev_free_block
                self.free_block_queue.remove(last)
                blocks.append(last)
            for block in blocks:
        """,
        why="get_new_blocks takes the most recently freed blocks (the back of the queue) "
        "instead of the least recently used ones at the front",
        caught_by="test_block_pool.py::test_get_new_blocks_pops_from_the_front",
    ),
    Mutant(
        name="partial_allocation",
        file=FILE,
        find="""
            num_free = self.get_num_free_blocks()
            if num_blocks > num_free:
                raise ValueError(
                    f"Cannot get {num_blocks} free blocks from the pool: only {num_free} are free"
                )
            blocks = self.free_block_queue.popleft_n(num_blocks)
        """,
        replace="""
            num_free = self.get_num_free_blocks()
            blocks = self.free_block_queue.popleft_n(min(num_blocks, num_free))
        """,
        why="asking for more blocks than are free returns what is there instead of raising: "
        "the caller believes it got every block it asked for",
        caught_by="test_block_pool.py::test_null_block_never_handed_out",
    ),
    Mutant(
        name="stale_hash_not_evicted",
        file=FILE,
        find="""
            if self.enable_caching:
                self._maybe_evict_cached_block(block)
        """,
        replace="",
        why="get_new_blocks reuses a free cached block without evicting its hash: the cache map "
        "still points new requests at a page that is about to be overwritten (I4)",
        caught_by="test_block_pool.py::test_reused_block_loses_its_stale_hash",
    ),
    Mutant(
        name="free_appends_shared_blocks",
        file=FILE,
        find="""
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                newly_free.append(block)
        """,
        replace="""
            block.ref_cnt -= 1
            newly_free.append(block)
        """,
        why="free_blocks appends every block it is given, even one another request still holds "
        "(ref_cnt > 0): a block in use can be handed out again (I1)",
        caught_by="test_block_pool.py::test_shared_block_freed_only_at_zero",
    ),
    Mutant(
        name="free_zeroes_ref_cnt",
        file=FILE,
        find="""
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                newly_free.append(block)
        """,
        replace="""
            block.ref_cnt = 0
            newly_free.append(block)
        """,
        why="free_blocks sets ref_cnt to 0 instead of dropping one reference: a block that "
        "another request still holds (a shared prefix, ref_cnt 2) is queued again and can "
        "be handed out while in use (I1)",
        caught_by="test_block_pool.py::test_shared_block_freed_only_at_zero",
    ),
    Mutant(
        name="free_appends_in_reverse",
        file=FILE,
        find="self.free_block_queue.append_n(newly_free)",
        replace="self.free_block_queue.append_n(reversed(newly_free))",
        why="free_blocks reverses the order it was given, so a request's head blocks are "
        "evicted before its tail (I4 eviction order)",
        caught_by="test_block_pool.py::test_free_blocks_appends_in_given_order",
    ),
    Mutant(
        name="double_free_unchecked",
        file=FILE,
        find="""
            elif block.ref_cnt <= 0:
                error = (
                    f"Cannot free block {block.block_id}: its ref_cnt is already {block.ref_cnt} "
                    "(double free?)"
                )
        """,
        replace="",
        why="free_blocks decrements without checking: a double free drives ref_cnt negative "
        "instead of raising ValueError",
        caught_by="test_block_pool.py::test_double_free_is_an_error",
    ),
    Mutant(
        name="failed_free_not_rolled_back",
        file=FILE,
        find="""
            if error is not None:
                for done in blocks[:i]:
                    done.ref_cnt += 1
                raise ValueError(error)
        """,
        replace="""
            if error is not None:
                raise ValueError(error)
        """,
        why="free_blocks raises on a double free in the middle of its list but keeps the "
        "decrements it already made: the refused call half-happened",
        caught_by="test_block_pool.py::test_double_free_is_an_error",
    ),
    Mutant(
        name="usage_counts_the_null_block",
        file=FILE,
        find="total = self.num_gpu_blocks - 1",
        replace="total = self.num_gpu_blocks",
        why="get_usage divides by num_gpu_blocks, counting the null block as usable memory: "
        "a full pool never reaches 100 %",
        caught_by="test_block_pool.py::test_usage",
    ),
    Mutant(
        name="num_free_blocks_by_walking",
        file=FILE,
        find="return self.free_block_queue.num_free_blocks",
        replace="return len(self.free_block_queue.get_all_free_blocks())",
        why="get_num_free_blocks counts the queue by walking it: O(n) on every call, and the "
        "scheduler calls it every step",
        caught_by="test_block_pool.py::test_pool_operations_are_constant_time",
    ),
    # -- added with the judge/learner split (issue #20): bugs no earlier test reached ---------------
    Mutant(
        name="append_accepts_a_queued_block",
        file=FILE,
        find="""
            if block.prev_free_block is not None or block.next_free_block is not None:
                raise RuntimeError(
                    f"Cannot append block {block.block_id} to the free queue: it is already in it"
                )
            tail = self.fake_free_list_tail
        """,
        replace="""
            tail = self.fake_free_list_tail
        """,
        why="append trusts its caller: appending a block that is still queued links it in a "
        "second time and the list loops (the misuse table says RuntimeError)",
        caught_by="test_free_queue.py::test_appending_a_queued_block_is_an_error",
    ),
    Mutant(
        name="failed_free_rollback_resets_to_one",
        file=FILE,
        find="done.ref_cnt += 1",
        replace="done.ref_cnt = 1",
        why="a refused free_blocks 'rolls back' by setting ref_cnt = 1 on the blocks it had "
        "already decremented: right for a block with one holder, but a shared block "
        "(ref_cnt 2) loses a reference and is later freed while still in use (I1)",
        caught_by="test_block_pool.py::test_double_free_is_an_error",
    ),
    Mutant(
        name="usage_of_a_null_only_pool_divides_by_zero",
        file=FILE,
        find="""
            total = self.num_gpu_blocks - 1
            if total == 0:
                return 0.0
        """,
        replace="""
            total = self.num_gpu_blocks - 1
        """,
        why="get_usage divides by num_gpu_blocks - 1 without the guard: a pool of one block "
        "(only the null block) raises ZeroDivisionError instead of reporting 0.0",
        caught_by="test_block_pool.py::test_usage",
    ),
    # -- added by a mutant hunt: bugs no earlier test reached ------------------------------------
    Mutant(
        name="popleft_n_negative_unchecked",
        file=FILE,
        find="""
            if n < 0:
                raise ValueError(f"Cannot pop a negative number of blocks ({n})")
        """,
        replace="",
        why="popleft_n forgets the n < 0 check: popleft_n(-1) pops nothing but adds one to "
        "num_free_blocks, so the counter overstates the queue (I2)",
        caught_by="test_free_queue.py::test_popleft_n_too_many_is_an_error",
    ),
    Mutant(
        name="popleft_n_too_many_raises_runtime_error",
        file=FILE,
        find="""
            if n > self.num_free_blocks:
                raise ValueError(
        """,
        replace="""
            if n > self.num_free_blocks:
                raise RuntimeError(
        """,
        why="popleft_n raises RuntimeError for more blocks than are free; the task and the "
        "misuse table say ValueError (a bad argument, not a broken state)",
        caught_by="test_free_queue.py::test_popleft_n_too_many_is_an_error",
    ),
    Mutant(
        name="remove_not_in_queue_raises_value_error",
        file=FILE,
        find="""
            if prev is None or following is None:
                raise RuntimeError(
        """,
        replace="""
            if prev is None or following is None:
                raise ValueError(
        """,
        why="remove raises ValueError for a block that is not in the queue; the task and the "
        "misuse table say RuntimeError (a broken state, which touch reaches for a free block "
        "that is not queued)",
        caught_by="test_free_queue.py::test_remove_block_not_in_queue_is_an_error",
    ),
    Mutant(
        name="class_level_sentinels",
        file=FILE,
        find="""
        def __init__(self, blocks: list[KVCacheBlock]) -> None:
            self.num_free_blocks = len(blocks)
            self.fake_free_list_head = KVCacheBlock(block_id=-1)
            self.fake_free_list_tail = KVCacheBlock(block_id=-1)
        """,
        replace="""
        fake_free_list_head = KVCacheBlock(block_id=-1)
        fake_free_list_tail = KVCacheBlock(block_id=-1)

        def __init__(self, blocks: list[KVCacheBlock]) -> None:
            self.num_free_blocks = len(blocks)
        """,
        why="the sentinels are class attributes, one pair shared by every queue: building a "
        "second queue (a second pool) relinks the first queue's sentinels to its own blocks",
        caught_by="test_free_queue.py::test_new_queue_links_blocks_in_order",
    ),
    Mutant(
        name="pool_size_checked_against_zero",
        file=FILE,
        find="if not isinstance(num_gpu_blocks, int) or num_gpu_blocks < 1:",
        replace="if not isinstance(num_gpu_blocks, int) or num_gpu_blocks < 0:",
        why="BlockPool(num_gpu_blocks=0) passes the check (< 0 instead of < 1) and fails only "
        "when the null block is popped from an empty queue: a ValueError that says the queue is "
        "empty, not that the pool size is wrong",
        caught_by="test_block_pool.py::test_bad_pool_sizes_are_errors",
    ),
    Mutant(
        name="null_block_freed_as_a_double_free",
        file=FILE,
        find="""
            if block.is_null:
                error = (
                    f"Cannot free the null block (block {block.block_id}): it is never allocated"
                )
            elif block.ref_cnt <= 0:
        """,
        replace="""
            if block.ref_cnt <= 0:
        """,
        why="free_blocks leaves the null block to the double-free check (its ref_cnt is 0): "
        "the free is refused, but the error blames a double free of block 0 instead of naming "
        "the null block",
        caught_by="test_block_pool.py::test_freeing_the_null_block_is_an_error",
    ),
    Mutant(
        name="pool_refuses_one_token_blocks",
        file=FILE,
        find="if hash_block_size < 1:",
        replace="if hash_block_size <= 1:",
        why="BlockPool refuses hash_block_size 1 (<= instead of <): blocks of one token are "
        "legal, and the misuse table refuses only sizes below 1",
        caught_by="test_block_pool.py::test_bad_pool_sizes_are_errors",
    ),
    Mutant(
        name="free_blocks_argument_not_listed",
        file=FILE,
        find="blocks = list(ordered_blocks)",
        replace="blocks = ordered_blocks",
        why="free_blocks walks ordered_blocks as given: one pass works on an iterator, but a "
        "refused call rolls back with blocks[:i], which an iterator (reversed(...), what the KV "
        "cache manager passes) cannot do: a TypeError, and the references already dropped stay "
        "dropped",
        caught_by="test_block_pool.py::test_double_free_is_an_error",
    ),
    Mutant(
        name="pool_hash_block_size_unchecked",
        file=FILE,
        find="""
            if hash_block_size < 1:
                raise ValueError(f"hash_block_size must be positive, got {hash_block_size}")
        """,
        replace="",
        why="BlockPool accepts hash_block_size 0 (the misuse table says ValueError): a pool "
        "for blocks of no tokens",
        caught_by="test_block_pool.py::test_bad_pool_sizes_are_errors",
    ),
    Mutant(
        name="get_new_blocks_ref_cnt_unchecked",
        file=FILE,
        find="""
            if block.ref_cnt != 0:
                raise RuntimeError(
                    f"Block {block.block_id} was in the free queue with ref_cnt={block.ref_cnt}"
                )
        """,
        replace="",
        why="get_new_blocks hands out a queued block whose ref_cnt is not 0 and sets it to 1, "
        "hiding a corrupted pool (a block in use in the free queue, I1) instead of raising "
        "RuntimeError",
        caught_by="test_block_pool.py::test_queued_block_in_use_is_an_error",
    ),
    Mutant(
        name="free_blocks_iterates_twice",
        file=FILE,
        find="""
            blocks = list(ordered_blocks)
            newly_free: list[KVCacheBlock] = []
            for i, block in enumerate(blocks):
                error: str | None = None
                if block.is_null:
                    error = (
                        f"Cannot free the null block (block {block.block_id}): it is never allocated"
                    )
                elif block.ref_cnt <= 0:
                    error = (
                        f"Cannot free block {block.block_id}: its ref_cnt is already {block.ref_cnt} "
                        "(double free?)"
                    )
                if error is not None:
                    for done in blocks[:i]:
                        done.ref_cnt += 1
                    raise ValueError(error)
                block.ref_cnt -= 1
                if block.ref_cnt == 0:
                    newly_free.append(block)
            self.free_block_queue.append_n(newly_free)
        """,
        replace="""
            for block in ordered_blocks:
                if block.is_null:
                    raise ValueError(f"Cannot free the null block (block {block.block_id})")
                if block.ref_cnt <= 0:
                    raise ValueError(f"Cannot free block {block.block_id}: double free")
            newly_free: list[KVCacheBlock] = []
            for block in ordered_blocks:
                block.ref_cnt -= 1
                if block.ref_cnt == 0:
                    newly_free.append(block)
            self.free_block_queue.append_n(newly_free)
        """,
        why="free_blocks validates in a first pass over ordered_blocks and decrements in a "
        "second: an iterator such as reversed(blocks), which the KV cache manager passes, is "
        "used up by the first pass, so nothing is freed",
        caught_by="test_block_pool.py::test_free_blocks_appends_in_given_order",
    ),
    Mutant(
        name="free_blocks_validates_then_decrements",
        file=FILE,
        find="""
            blocks = list(ordered_blocks)
            newly_free: list[KVCacheBlock] = []
            for i, block in enumerate(blocks):
                error: str | None = None
                if block.is_null:
                    error = (
                        f"Cannot free the null block (block {block.block_id}): it is never allocated"
                    )
                elif block.ref_cnt <= 0:
                    error = (
                        f"Cannot free block {block.block_id}: its ref_cnt is already {block.ref_cnt} "
                        "(double free?)"
                    )
                if error is not None:
                    for done in blocks[:i]:
                        done.ref_cnt += 1
                    raise ValueError(error)
                block.ref_cnt -= 1
                if block.ref_cnt == 0:
                    newly_free.append(block)
            self.free_block_queue.append_n(newly_free)
        """,
        replace="""
            blocks = list(ordered_blocks)
            for block in blocks:
                if block.is_null:
                    raise ValueError(f"Cannot free the null block (block {block.block_id})")
                if block.ref_cnt <= 0:
                    raise ValueError(f"Cannot free block {block.block_id}: double free")
            newly_free: list[KVCacheBlock] = []
            for block in blocks:
                block.ref_cnt -= 1
                if block.ref_cnt == 0:
                    newly_free.append(block)
            self.free_block_queue.append_n(newly_free)
        """,
        why="free_blocks checks every block before dropping any reference, each against its "
        "ref_cnt before the call: a block listed twice with one holder passes, and ends in the "
        "free queue with ref_cnt -1 (a double free within one call, I1)",
        caught_by="test_block_pool.py::test_double_free_is_an_error",
    ),
    Mutant(
        name="get_new_blocks_evicts_only_the_last_block",
        file=FILE,
        find="""
            for block in blocks:
                if self.enable_caching:
                    self._maybe_evict_cached_block(block)
                if block.ref_cnt != 0:
        """,
        replace="""
            if self.enable_caching and blocks:
                self._maybe_evict_cached_block(blocks[-1])
            for block in blocks:
                if block.ref_cnt != 0:
        """,
        why="the eviction sits outside the loop (an indentation slip), so only the last block "
        "handed out loses its stale hash: the others keep producing prefix-cache hits on pages "
        "about to be overwritten (I4)",
        caught_by="test_block_pool.py::test_reused_block_loses_its_stale_hash",
    ),
    Mutant(
        name="allocation_not_reported_to_collector",
        file=FILE,
        find="""
                block.ref_cnt = 1
                if self.metrics_collector is not None:
                    self.metrics_collector.on_block_allocated(block)
        """,
        replace="""
                block.ref_cnt = 1
        """,
        why="get_new_blocks never calls the collector's on_block_allocated, so upstream's "
        "residency metrics see hits and evictions of blocks that were never allocated",
        caught_by="test_block_pool.py::test_allocations_are_reported_to_the_metrics_collector",
    ),
    Mutant(
        name="popleft_counts_before_the_empty_check",
        file=FILE,
        find="""
                first = self.fake_free_list_head.next_free_block
                if first is None or first is self.fake_free_list_tail:
                    raise ValueError("No free blocks available")
        """,
        replace="""
                self.num_free_blocks -= 1
                first = self.fake_free_list_head.next_free_block
                if first is None or first is self.fake_free_list_tail:
                    raise ValueError("No free blocks available")
        """,
        more=(
            (
                """
                first.prev_free_block = first.next_free_block = None
                self.num_free_blocks -= 1
                return first
                """,
                """
                first.prev_free_block = first.next_free_block = None
                return first
                """,
            ),
        ),
        why="popleft lowers the counter before it checks that the queue is empty: a refused "
        "popleft leaves num_free_blocks at -1 (I2)",
        caught_by="test_free_queue.py::test_empty_queue",
    ),
    Mutant(
        name="free_blocks_counted_by_walking_the_queue",
        file=FILE,
        find="        num_free = self.get_num_free_blocks()\n",
        replace="        num_free = len(self.free_block_queue.get_all_free_blocks())\n",
        why="get_new_blocks counts the free blocks by listing the queue: every allocation "
        "walks the whole free list, O(n) where the counter is O(1) (I2)",
        caught_by="test_block_pool.py::test_pool_operations_are_constant_time",
    ),
    Mutant(
        name="caching_branch_forgets_the_collector",
        file=FILE,
        find="""
                block.ref_cnt = 1
                if self.metrics_collector is not None:
                    self.metrics_collector.on_block_allocated(block)
        """,
        replace="""
                block.ref_cnt = 1
                if self.metrics_collector is not None and not self.enable_caching:
                    self.metrics_collector.on_block_allocated(block)
        """,
        why="reports allocations only when caching is off (upstream's two branches, the "
        "collector call left out of the caching one): a caching pool's allocations go unseen",
        caught_by="test_block_pool.py::test_allocations_are_reported_to_the_metrics_collector",
    ),
    Mutant(
        name="caching_branch_skips_the_ref_cnt_check",
        file=FILE,
        find="            if block.ref_cnt != 0:\n                raise RuntimeError(\n"
        '                    f"Block {block.block_id} was in the free queue',
        replace="            if block.ref_cnt != 0 and not self.enable_caching:\n"
        "                raise RuntimeError(\n"
        '                    f"Block {block.block_id} was in the free queue',
        why="checks that a popped block is unreferenced only when caching is off: a caching "
        "pool hands out a block someone still holds (I1)",
        caught_by="test_block_pool.py::test_queued_block_in_use_is_an_error",
    ),
    Mutant(
        name="ref_cnt_checked_on_the_front_block_only",
        file=FILE,
        find="            if block.ref_cnt != 0:\n                raise RuntimeError(\n"
        '                    f"Block {block.block_id} was in the free queue',
        replace="            if block is blocks[0] and block.ref_cnt != 0:\n"
        "                raise RuntimeError(\n"
        '                    f"Block {block.block_id} was in the free queue',
        why="checks only the first popped block's ref_cnt: a held block further back is "
        "handed out to a second owner (I1)",
        caught_by="test_block_pool.py::test_queued_block_in_use_is_an_error",
    ),
    Mutant(
        name="newly_free_collected_after_the_loop",
        file=FILE,
        find="""
                    block.ref_cnt -= 1
                    if block.ref_cnt == 0:
                        newly_free.append(block)
                self.free_block_queue.append_n(newly_free)
        """,
        replace="""
                    block.ref_cnt -= 1
                newly_free = [block for block in blocks if block.ref_cnt == 0]
                self.free_block_queue.append_n(newly_free)
        """,
        why="collects the blocks at 0 after the loop: a block listed once per holder appears "
        "twice, append_n refuses it, and the block is left at ref_cnt 0 outside the queue (I1)",
        caught_by="test_block_pool.py::test_shared_block_freed_only_at_zero",
    ),
    Mutant(
        name="allocated_reported_before_the_eviction",
        file=FILE,
        find="""
                    if self.enable_caching:
                        self._maybe_evict_cached_block(block)
                    if block.ref_cnt != 0:
        """,
        replace="""
                    if block.ref_cnt != 0:
        """,
        more=(
            (
                """
                    block.ref_cnt = 1
                    if self.metrics_collector is not None:
                        self.metrics_collector.on_block_allocated(block)
                return blocks
                """,
                """
                    block.ref_cnt = 1
                    if self.metrics_collector is not None:
                        self.metrics_collector.on_block_allocated(block)
                    if self.enable_caching:
                        self._maybe_evict_cached_block(block)
                return blocks
                """,
            ),
        ),
        why="evicts each block after reporting it allocated: the collector ends the residency "
        "it has just started, and loses the block's new one",
        caught_by="test_block_pool.py::test_allocations_are_reported_to_the_metrics_collector",
    ),
    Mutant(
        name="only_cached_blocks_go_through_eviction",
        file=FILE,
        find="""
                    if self.enable_caching:
                        self._maybe_evict_cached_block(block)
        """,
        replace="""
                    if self.enable_caching and block.block_hash is not None:
                        self._maybe_evict_cached_block(block)
        """,
        why="calls _maybe_evict_cached_block only for blocks with a hash: the hashes are "
        "dropped alike, but the collector never hears that an uncached block's residency ended",
        caught_by="test_block_pool.py::test_allocations_are_reported_to_the_metrics_collector",
    ),
    Mutant(
        name="hash_block_size_tested_for_truth",
        file=FILE,
        find="        if hash_block_size < 1:\n",
        replace="        if not hash_block_size:\n",
        why="refuses hash_block_size 0 only: a negative block size is accepted",
        caught_by="test_block_pool.py::test_bad_pool_sizes_are_errors",
    ),
    Mutant(
        name="num_gpu_blocks_type_unchecked",
        file=FILE,
        find="        if not isinstance(num_gpu_blocks, int) or num_gpu_blocks < 1:\n",
        replace="        if num_gpu_blocks < 1:\n",
        why="BlockPool(num_gpu_blocks=2.5) fails later with a TypeError from range() instead "
        "of the ValueError that names the argument",
        caught_by="test_block_pool.py::test_bad_pool_sizes_are_errors",
    ),
    Mutant(
        name="append_n_walks_its_blocks_twice",
        file=FILE,
        find="""
                for block in blocks:
                    if block.prev_free_block is not None or block.next_free_block is not None:
                        self._unlink_after(anchor, count)
        """,
        replace="""
                for block in blocks:
                    if block.prev_free_block is not None or block.next_free_block is not None:
                        raise RuntimeError(f"block {block.block_id} is already in the queue")
                for block in blocks:
                    if block.prev_free_block is not None or block.next_free_block is not None:
                        self._unlink_after(anchor, count)
        """,
        why="validates every block in a first pass and links them in a second: an iterator "
        "is spent by the first pass, and its blocks are never linked",
        caught_by="test_free_queue.py::test_append_n_keeps_order",
    ),
    Mutant(
        name="append_n_counts_with_len",
        file=FILE,
        find="        self.num_free_blocks += count\n",
        replace="        self.num_free_blocks += len(blocks)\n",
        why="counts the appended blocks with len(): an iterator has none (TypeError after "
        "the blocks were linked)",
        caught_by="test_free_queue.py::test_append_n_keeps_order",
    ),
    Mutant(
        name="append_n_remembers_its_blocks_in_a_list",
        file=FILE,
        find="""
                count = 0
                for block in blocks:
                    if block.prev_free_block is not None or block.next_free_block is not None:
        """,
        replace="""
                count = 0
                seen: list[KVCacheBlock] = []
                for block in blocks:
                    if block in seen:
                        self._unlink_after(anchor, count)
                        raise RuntimeError(f"block {block.block_id} is listed twice")
                    seen.append(block)
                    if block.prev_free_block is not None or block.next_free_block is not None:
        """,
        why="looks each block up in a list of the blocks seen so far: appending k blocks "
        "costs O(k^2), seconds for a long run (I2: O(1) per block)",
        caught_by="test_free_queue.py::test_operations_are_constant_time",
    ),
    Mutant(
        name="append_n_walks_to_the_last_block",
        file=FILE,
        find="""
                anchor = tail.prev_free_block
                assert anchor is not None  # the tail sentinel always has a predecessor
        """,
        replace="""
                anchor = self.fake_free_list_head
                while anchor.next_free_block is not tail:
                    anchor = anchor.next_free_block
        """,
        why="finds the last block by walking from the head instead of asking the tail "
        "sentinel: every append_n is O(n) in the queue's length (I2)",
        caught_by="test_free_queue.py::test_operations_are_constant_time",
    ),
    # -- learner-bug probe, round 2 (a helper's 56 tries, 2026-11-28) ------------------------------
    Mutant(
        name="sentinels_with_id_0",
        file=FILE,
        find="""
            self.fake_free_list_head = KVCacheBlock(block_id=-1)
            self.fake_free_list_tail = KVCacheBlock(block_id=-1)
        """,
        replace="""
            self.fake_free_list_head = KVCacheBlock(block_id=0)
            self.fake_free_list_tail = KVCacheBlock(block_id=0)
        """,
        why="sentinels with the id of the null block: a debugger or a log that prints ids shows "
        "block 0 at both ends of every queue",
        caught_by="test_free_queue.py::test_new_queue_links_blocks_in_order",
    ),
    Mutant(
        name="popleft_without_a_message",
        file=FILE,
        find='raise ValueError("No free blocks available")',
        replace="raise ValueError",
        why="a bare ValueError: the caller learns something was wrong, not what",
        caught_by="test_free_queue.py::test_empty_queue",
    ),
    Mutant(
        name="append_without_naming_the_block",
        file=FILE,
        find="""
                raise RuntimeError(
                    f"Cannot append block {block.block_id} to the free queue: it is already in it"
                )
        """,
        replace="""
                raise RuntimeError("already in the queue")
        """,
        why="the refusal does not name the block that was already queued",
        caught_by="test_free_queue.py::test_appending_a_queued_block_is_an_error",
    ),
    Mutant(
        name="remove_checks_the_prev_link_only",
        file=FILE,
        find="if prev is None or following is None:",
        replace="if prev is None:",
        why="remove of the tail sentinel (prev set, next None) goes ahead: it sets the last "
        "block's next to None, then fails on None, leaving the queue broken",
        caught_by="test_free_queue.py::test_remove_block_not_in_queue_is_an_error",
    ),
    Mutant(
        name="hash_block_size_error_without_the_size",
        file=FILE,
        find='raise ValueError(f"hash_block_size must be positive, got {hash_block_size}")',
        replace='raise ValueError("bad pool")',
        why="the refusal does not say which size was wrong",
        caught_by="test_block_pool.py::test_bad_pool_sizes_are_errors",
    ),
    Mutant(
        name="no_cache_map_without_caching",
        file=FILE,
        find="""
            self.cached_block_hash_to_block = BlockHashToBlockMap()
            self.null_block = self.free_block_queue.popleft()
        """,
        replace="""
            self.cached_block_hash_to_block = BlockHashToBlockMap() if enable_caching else None
            self.null_block = self.free_block_queue.popleft()
        """,
        why="the cache map made only with caching on: get_cached_block on a caching-off pool "
        "fails on None instead of finding nothing",
        caught_by="test_block_pool.py::test_null_block_is_reserved",
    ),
    Mutant(
        name="queued_ref_cnt_checked_positive_only",
        file=FILE,
        find="if block.ref_cnt != 0:",
        replace="if block.ref_cnt > 0:",
        why="a queued block whose count went below zero is handed out as if it were sound",
        caught_by="test_block_pool.py::test_queued_block_in_use_is_an_error",
    ),
    Mutant(
        name="allocation_error_without_naming_the_block",
        file=FILE,
        find="""
                    raise RuntimeError(
                        f"Block {block.block_id} was in the free queue with ref_cnt={block.ref_cnt}"
                    )
        """,
        replace="""
                    raise RuntimeError("a queued block is in use")
        """,
        why="the broken-state error does not name the block that was queued while held",
        caught_by="test_block_pool.py::test_queued_block_in_use_is_an_error",
    ),
    Mutant(
        name="allocation_pops_then_puts_back_on_refusal",
        file=FILE,
        find="""
            num_free = self.get_num_free_blocks()
            if num_blocks > num_free:
                raise ValueError(
                    f"Cannot get {num_blocks} free blocks from the pool: only {num_free} are free"
                )
            blocks = self.free_block_queue.popleft_n(num_blocks)
            for block in blocks:
                if self.enable_caching:
                    self._maybe_evict_cached_block(block)
        """,
        replace="""
            blocks = []
            try:
                for _ in range(num_blocks):
                    block = self.free_block_queue.popleft()
                    if self.enable_caching:
                        self._maybe_evict_cached_block(block)
                    blocks.append(block)
            except ValueError:
                self.free_block_queue.append_n(blocks)
                raise
            for block in blocks:
        """,
        why="blocks popped (and evicted) one at a time and put back when the queue runs dry: "
        "the queue is restored, but a refused call has wiped the cached blocks' hashes",
        caught_by="test_block_pool.py::test_too_many_blocks_is_an_error",
    ),
    Mutant(
        name="eviction_drops_the_whole_hash_entry",
        file=FILE,
        find="""
                if self.enable_caching:
                    self._maybe_evict_cached_block(block)
                if block.ref_cnt != 0:
        """,
        replace="""
                if self.enable_caching:
                    if self.metrics_collector is not None:
                        self.metrics_collector.on_block_evicted(block)
                    if block.block_hash is not None:
                        self.cached_block_hash_to_block._cache.pop(block.block_hash, None)
                        block.reset_hash()
                if block.ref_cnt != 0:
        """,
        why="an eviction of its own that pops the hash's whole entry: a second block cached "
        "under the same hash stops answering for it (I3)",
        caught_by="test_block_pool.py::test_reused_block_loses_its_stale_hash",
    ),
    Mutant(
        name="rollback_once_per_distinct_block",
        file=FILE,
        find="for done in blocks[:i]:",
        replace="for done in set(blocks[:i]):",
        why="a refused free gives back one reference per distinct block: a block listed twice "
        "before the bad entry ends one reference short",
        caught_by="test_block_pool.py::test_double_free_is_an_error",
    ),
    Mutant(
        name="free_blocks_grouped_by_block",
        file=FILE,
        find="""
            newly_free: list[KVCacheBlock] = []
            for i, block in enumerate(blocks):
        """,
        replace="""
            from collections import Counter

            counts = Counter(blocks)
            for block, k in counts.items():
                if block.is_null or block.ref_cnt < k:
                    raise ValueError(f"Cannot free block {block.block_id}")
            newly_free: list[KVCacheBlock] = []
            for block, k in counts.items():
                block.ref_cnt -= k
                if block.ref_cnt == 0:
                    newly_free.append(block)
            self.free_block_queue.append_n(newly_free)
            return
            for i, block in enumerate(blocks):
        """,
        why="entries counted per block first: a block listed twice joins the queue at its "
        "first entry, not where its count reaches 0",
        caught_by="test_block_pool.py::test_shared_block_freed_only_at_zero",
    ),
    Mutant(
        name="free_blocks_dedupes_with_in_list",
        file=FILE,
        find="""
                if block.ref_cnt == 0:
                    newly_free.append(block)
        """,
        replace="""
                if block.ref_cnt == 0 and block not in newly_free:
                    newly_free.append(block)
        """,
        why="a search of the blocks collected so far for every entry: freeing k blocks in one "
        "call costs O(k^2)",
        caught_by="test_block_pool.py::test_pool_operations_are_constant_time",
    ),
    # -- helper probe, 2026-11-29 ----------------------------------------------------------------
    Mutant(
        name="allocated_reported_before_the_ref_cnt",
        file=FILE,
        find="""
                block.ref_cnt = 1
                if self.metrics_collector is not None:
                    self.metrics_collector.on_block_allocated(block)
        """,
        replace="""
                if self.metrics_collector is not None:
                    self.metrics_collector.on_block_allocated(block)
                block.ref_cnt = 1
        """,
        why="tells the collector before taking the block: on_block_allocated sees ref_cnt 0, "
        "a free block (README row 11: set ref_cnt to 1, then tell the collector)",
        caught_by="test_block_pool.py::test_allocations_are_reported_to_the_metrics_collector",
    ),
    Mutant(
        name="double_free_error_without_naming_the_block",
        file=FILE,
        find='f"Cannot free block {block.block_id}: its ref_cnt is already {block.ref_cnt} "',
        replace='"Cannot free a block whose ref_cnt is already 0 "',
        why="a double free refused with a message that does not name the block (the misuse "
        "table: a message naming the block and what was wrong)",
        caught_by="test_block_pool.py::test_double_free_is_an_error",
    ),
    Mutant(
        name="allocation_refused_without_the_count",
        file=FILE,
        find='f"Cannot get {num_blocks} free blocks from the pool: only {num_free} are free"',
        replace='"Not enough free blocks in the pool"',
        why="an allocation of more blocks than are free refused without saying how many were "
        "asked (popleft_n's refusal names it too)",
        caught_by="test_block_pool.py::test_too_many_blocks_is_an_error",
    ),
    Mutant(
        name="usage_rounded",
        file=FILE,
        find="        return 1.0 - self.get_num_free_blocks() / total\n",
        replace="        return round(1.0 - self.get_num_free_blocks() / total, 2)\n",
        why="rounds the usage to two decimals: 1 of 3 usable blocks in use reads 0.33, not 1/3 "
        "(the test's pool of 11 blocks gave only tenths, which round to themselves)",
        caught_by="test_block_pool.py::test_usage",
    ),
    # -- helper probe, 2026-11-29 (2) ----------------------------------------------------------
    Mutant(
        name="append_n_refused_without_naming_the_block",
        file=FILE,
        find="""
                    raise RuntimeError(
                        f"Cannot append block {block.block_id} to the free queue: it is already in "
                        "it (or listed twice)"
                    )
        """,
        replace="""
                    raise RuntimeError("append_n: a block is already in the free queue")
        """,
        why="append_n refuses a queued block with a message that does not say which block (the "
        "misuse table: a message naming the block and what was wrong; append's refusal was "
        "checked, append_n's was not)",
        caught_by="test_free_queue.py::test_appending_a_queued_block_is_an_error",
    ),
    Mutant(
        name="newly_free_copied_per_block",
        file=FILE,
        find="""
                if block.ref_cnt == 0:
                    newly_free.append(block)
        """,
        replace="""
                if block.ref_cnt == 0:
                    newly_free = newly_free + [block]
        """,
        why="the blocks reaching 0 are collected by building a new list per block: right, but "
        "one free_blocks of k blocks copies O(k^2) pointers (3 s for 50,000 blocks); the bench "
        "timed the long call per 500 blocks, 30 ms, under the 50 ms noise floor, which now "
        "applies to the whole call (README: O(1) per block; a complexity probe, 2026-11-29)",
        caught_by="test_block_pool.py::test_pool_operations_are_constant_time",
    ),
]
