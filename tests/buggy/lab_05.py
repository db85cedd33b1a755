"""Buggy implementations of lab-05 (prefix caching: hashes, the cache map, touch, eviction).

Each mutant is one mistake a learner plausibly makes, written as an edit of the solution
(``grading.mutants.Mutant``). ``python -m grading check-suites lab-05`` and
``tests/test_buggy_implementations.py`` check that the graded suite catches every one of them.
"""

from __future__ import annotations

from grading.mutants import Mutant

FILE = "block_pool.py"

MUTANTS = [
    # -- hash_block_tokens ----------------------------------------------------------------------
    Mutant(
        name="hash_not_chained",
        file=FILE,
        find="return BlockHash(hash_function((parent_block_hash, tuple(curr_block_token_ids), "
        "extra_keys)))",
        replace="return BlockHash(hash_function((tuple(curr_block_token_ids), extra_keys)))",
        why="the block hash ignores the parent's hash: the same tokens after different prefixes "
        "collide, and a hit would serve KV computed for another prefix (I3)",
        caught_by="test_hashing.py::test_hash_is_chained",
    ),
    Mutant(
        name="parent_none_not_mapped_to_none_hash",
        file=FILE,
        find="""
            if parent_block_hash is None:
                parent_block_hash = kv_cache_utils.NONE_HASH
        """,
        replace="",
        why="the first block hashes (None, tokens) instead of chaining from NONE_HASH, so it "
        "disagrees with hashes seeded explicitly (I3)",
        caught_by="test_hashing.py::test_hash_is_chained",
    ),
    Mutant(
        name="extra_keys_ignored",
        file=FILE,
        find="return BlockHash(hash_function((parent_block_hash, tuple(curr_block_token_ids), "
        "extra_keys)))",
        replace="return BlockHash(hash_function((parent_block_hash, tuple(curr_block_token_ids))))",
        why="extra keys (LoRA adapter, cache salt) are left out of the hash, so two adapters "
        "share KV they did not compute (I3)",
        caught_by="test_hashing.py::test_hash_is_chained",
    ),
    Mutant(
        name="hash_ignores_hash_function",
        file=FILE,
        find="""
            if parent_block_hash is None:
                parent_block_hash = kv_cache_utils.NONE_HASH
            return BlockHash(hash_function((parent_block_hash, tuple(curr_block_token_ids), extra_keys)))
        """,
        replace="""
            if parent_block_hash is None:
                parent_block_hash = kv_cache_utils.NONE_HASH
            import hashlib
            key = (parent_block_hash, tuple(curr_block_token_ids), extra_keys)
            return BlockHash(hashlib.sha256(repr(key).encode()).digest())
        """,
        why="hash_block_tokens hard-codes sha256 instead of the hash_function it is given, so the "
        "engine cannot choose its hash",
        caught_by="test_hashing.py::test_uses_the_given_hash_function",
    ),
    # -- BlockHashToBlockMap --------------------------------------------------------------------
    Mutant(
        name="map_insert_overwrites",
        file=FILE,
        find="""
            blocks = self._cache.get(key)
            if blocks is None:
                self._cache[key] = block
            elif isinstance(blocks, KVCacheBlock):
                self._cache[key] = {blocks.block_id: blocks, block.block_id: block}
            else:
                blocks[block.block_id] = block
        """,
        replace="""
            self._cache[key] = block
        """,
        why="the cache map keeps one block per hash: inserting a duplicate forgets the first, "
        "which keeps its hash while no longer being indexed (I3)",
        caught_by="test_hashing.py::test_map_keeps_several_blocks_per_hash",
    ),
    Mutant(
        name="map_third_duplicate_dropped",
        file=FILE,
        find="""
            elif isinstance(blocks, KVCacheBlock):
                self._cache[key] = {blocks.block_id: blocks, block.block_id: block}
            else:
                blocks[block.block_id] = block
        """,
        replace="""
            elif isinstance(blocks, KVCacheBlock):
                self._cache[key] = {blocks.block_id: blocks, block.block_id: block}
        """,
        why="insert handles an empty key and a key with one block, but not a key that already "
        "holds several: a third block with the same content keeps its hash without being "
        "indexed, so it never serves a hit and its eviction finds nothing to pop (I3)",
        caught_by="test_hashing.py::test_map_keeps_several_blocks_per_hash",
    ),
    Mutant(
        name="map_pop_removes_whole_key",
        file=FILE,
        find="""
            block = blocks.pop(block_id, None)
            if not blocks:
                del self._cache[key]
            return block
        """,
        replace="""
            block = blocks.get(block_id)
            del self._cache[key]
            return block
        """,
        why="popping one of several blocks cached under a hash drops the whole key, losing the "
        "duplicates that still hold the content (I3)",
        caught_by="test_hashing.py::test_map_keeps_several_blocks_per_hash",
    ),
    # -- BlockPool: caching and lookups ---------------------------------------------------------
    Mutant(
        name="get_cached_block_takes_a_reference",
        file=FILE,
        find="""
                cached_blocks.append(block)
            return cached_blocks
        """,
        replace="""
                cached_blocks.append(block)
            self.touch(cached_blocks)
            return cached_blocks
        """,
        why="get_cached_block claims the blocks it finds: a lookup that is not used leaks a "
        "reference (and revives the block from the free queue)",
        caught_by="test_prefix_cache.py::test_cache_full_blocks_indexes_new_full_blocks",
    ),
    Mutant(
        name="get_cached_block_ignores_group",
        file=FILE,
        find="key = make_block_hash_with_group_id(block_hash, group_id)",
        replace="key = make_block_hash_with_group_id(block_hash, 0)",
        why="the lookup always uses group 0, so a hash cached for one KV cache group hits for "
        "every group",
        caught_by="test_prefix_cache.py::test_get_cached_block_hit_and_miss",
    ),
    Mutant(
        name="cache_from_zero",
        file=FILE,
        find="""
            new_full_blocks = blocks[num_cached_blocks:num_full_blocks]
        """,
        replace="""
            new_full_blocks = blocks[:num_full_blocks]
        """,
        why="cache_full_blocks re-caches from block 0 instead of from num_cached_blocks: the "
        "blocks and hashes no longer line up, and already cached blocks are hashed twice",
        caught_by="test_prefix_cache.py::test_cache_full_blocks_indexes_new_full_blocks",
    ),
    Mutant(
        name="cache_stops_one_block_short",
        file=FILE,
        find="""
            new_full_blocks = blocks[num_cached_blocks:num_full_blocks]
        """,
        replace="""
            new_full_blocks = blocks[num_cached_blocks:num_full_blocks - 1]
        """,
        why="off-by-one: the last full block is never cached, so a request's final full block "
        "never produces a hit",
        caught_by="test_prefix_cache.py::test_cache_full_blocks_indexes_new_full_blocks",
    ),
    Mutant(
        name="cache_ignores_block_mask",
        file=FILE,
        find="if not block.is_null and (block_mask is None or block_mask[i])",
        replace="if not block.is_null",
        why="cache_full_blocks caches blocks whose block_mask entry is False",
        caught_by="test_prefix_cache.py::test_cache_full_blocks_skips_null_and_masked_blocks",
    ),
    Mutant(
        name="cache_hashes_the_null_block",
        file=FILE,
        find="if not block.is_null and (block_mask is None or block_mask[i])",
        replace="if block_mask is None or block_mask[i]",
        why="cache_full_blocks gives the null block a hash: a placeholder page then serves "
        "prefix-cache hits",
        caught_by="test_prefix_cache.py::test_cache_full_blocks_skips_null_and_masked_blocks",
    ),
    # -- BlockPool: touch, eviction, reset --------------------------------------------------------
    Mutant(
        name="touch_does_not_remove_from_queue",
        file=FILE,
        find="""
            if block.ref_cnt == 0:
                self.free_block_queue.remove(block)
            block.ref_cnt += 1
        """,
        replace="""
            block.ref_cnt += 1
        """,
        why="touch counts a reference but leaves a revived block in the free queue: it will be "
        "evicted and overwritten while a request uses it (I1, I4)",
        caught_by="test_prefix_cache.py::test_touch_revives_from_the_middle",
    ),
    Mutant(
        name="touch_does_not_count_the_reference",
        file=FILE,
        find="""
            if block.ref_cnt == 0:
                self.free_block_queue.remove(block)
            block.ref_cnt += 1
        """,
        replace="""
            if block.ref_cnt == 0:
                self.free_block_queue.remove(block)
        """,
        why="touch takes a revived block out of the queue but does not count the new user: the "
        "block is neither free nor held (I1)",
        caught_by="test_prefix_cache.py::test_touch_revives_from_the_middle",
    ),
    Mutant(
        name="touch_sets_ref_cnt_to_one",
        file=FILE,
        find="""
            if block.ref_cnt == 0:
                self.free_block_queue.remove(block)
            block.ref_cnt += 1
        """,
        replace="""
            if block.ref_cnt == 0:
                self.free_block_queue.remove(block)
            block.ref_cnt = 1
        """,
        why="touch sets ref_cnt = 1 instead of adding one, so a block shared by two running "
        "requests is freed when the first one finishes",
        caught_by="test_prefix_cache.py::test_touch_shared_block_in_use",
    ),
    Mutant(
        name="touch_rebuilds_the_queue",
        file=FILE,
        find="""
            if block.ref_cnt == 0:
                self.free_block_queue.remove(block)
            block.ref_cnt += 1
        """,
        replace="""
            if block.ref_cnt == 0:
                rest = [b for b in self.free_block_queue.get_all_free_blocks() if b is not block]
                block.prev_free_block = block.next_free_block = None
                self.free_block_queue = FreeKVCacheBlockQueue(rest)
            block.ref_cnt += 1
        """,
        why="touch rebuilds the free queue without the block instead of unlinking it: correct "
        "order, but O(n) per hit",
        caught_by="test_prefix_cache.py::test_touch_is_constant_time",
    ),
    Mutant(
        name="touch_accepts_the_null_block",
        file=FILE,
        find="""
            for block in blocks:
                if block.is_null:
                    raise ValueError(
                        f"Cannot touch the null block (block {block.block_id}): it is a placeholder "
                        "that is never shared"
                    )
        """,
        replace="",
        why="touch takes a reference on the null block instead of refusing it",
        caught_by="test_prefix_cache.py::test_touch_null_block_is_an_error",
    ),
    Mutant(
        name="evict_forgets_reset_hash",
        file=FILE,
        find="""
            if self.cached_block_hash_to_block.pop(key, block.block_id) is None:
                return False
            block.reset_hash()
            return True
        """,
        replace="""
            if self.cached_block_hash_to_block.pop(key, block.block_id) is None:
                return False
            return True
        """,
        why="_maybe_evict_cached_block removes the map entry but the block keeps its hash: the "
        "reused block cannot be cached again and claims content it no longer holds (I3, I4)",
        caught_by="test_prefix_cache.py::test_eviction_is_lru_and_tail_first",
    ),
    Mutant(
        name="evict_forgets_the_map",
        file=FILE,
        find="""
            if self.cached_block_hash_to_block.pop(key, block.block_id) is None:
                return False
            block.reset_hash()
            return True
        """,
        replace="""
            block.reset_hash()
            return True
        """,
        why="_maybe_evict_cached_block clears the block's hash but leaves its map entry: the "
        "cache still serves the overwritten page (I3, I4)",
        caught_by="test_prefix_cache.py::test_eviction_is_lru_and_tail_first",
    ),
    Mutant(
        name="evict_blocks_evicts_all",
        file=FILE,
        find="""
            for block_id in block_ids:
                self._maybe_evict_cached_block(self.blocks[block_id])
        """,
        replace="""
            for block in self.blocks:
                self._maybe_evict_cached_block(block)
        """,
        why="evict_blocks empties the whole prefix cache instead of the given block ids",
        caught_by="test_prefix_cache.py::test_evict_blocks_by_id",
    ),
    Mutant(
        name="reset_while_in_use",
        file=FILE,
        find="""
            if num_used_blocks != 0:
                logger.warning(
                    "Cannot reset the prefix cache: %d blocks are still in use", num_used_blocks
                )
                return False
        """,
        replace="",
        why="reset_prefix_cache resets even while requests hold blocks, whose hashes are needed "
        "when they free them",
        caught_by="test_prefix_cache.py::test_reset_prefix_cache",
    ),
    Mutant(
        name="reset_keeps_block_hashes",
        file=FILE,
        find="""
            for block in self.blocks:
                block.reset_hash()
        """,
        replace="",
        why="reset_prefix_cache empties the map but leaves every block's hash set: blocks can "
        "never be cached again (I3)",
        caught_by="test_prefix_cache.py::test_reset_prefix_cache",
    ),
    # -- added with the judge/learner split (issue #20): bugs no earlier test reached ---------------
    Mutant(
        name="hash_parts_in_another_order",
        file=FILE,
        find="return BlockHash(hash_function((parent_block_hash, tuple(curr_block_token_ids), "
        "extra_keys)))",
        replace="return BlockHash(hash_function((tuple(curr_block_token_ids), parent_block_hash, "
        "extra_keys)))",
        why="the hash covers the right three things in another order, not the documented "
        "hash_function((parent, tokens, extra_keys)): the reference sha256 refuses that shape "
        "(TypeError), and a hash function that took it would agree with no other process (nor "
        "upstream) on any block's hash",
        caught_by="test_hashing.py::test_hash_is_chained",
    ),
    Mutant(
        name="cache_full_blocks_half_caches_on_error",
        file=FILE,
        find="""
            # Validate every block first, so a bad call leaves no block half-cached.
            for block, _ in selected:
                if block.block_hash is not None:
                    raise RuntimeError(
                        f"Cannot cache block {block.block_id}: it already has a hash (was it cached "
                        "twice, or is num_cached_blocks too small?)"
                    )
            for block, block_hash in selected:
        """,
        replace="""
            for block, block_hash in selected:
        """,
        why="cache_full_blocks relies on the block_hash setter to refuse a block that already "
        "has a hash: the blocks before it in the call are cached anyway, so a refused call "
        "half-happened",
        caught_by="test_prefix_cache.py::test_hashing_a_block_twice_is_an_error",
    ),
    Mutant(
        name="evict_blocks_unchecked_ids",
        file=FILE,
        find="""
            for block_id in block_ids:
                if not 0 <= block_id < self.num_gpu_blocks:
                    raise ValueError(
                        f"Cannot evict block {block_id}: block ids are 0 .. {self.num_gpu_blocks - 1}"
                    )
        """,
        replace="",
        why="evict_blocks indexes self.blocks with whatever id it is given: -1 silently evicts "
        "the last block, a too large id raises IndexError after evicting the ids before it",
        caught_by="test_prefix_cache.py::test_evict_blocks_by_id",
    ),
    # -- added by a mutant hunt: bugs no earlier test reached ------------------------------------
    Mutant(
        name="map_pop_single_ignores_block_id",
        file=FILE,
        find="""
            if isinstance(blocks, KVCacheBlock):
                if blocks.block_id != block_id:
                    return None
                del self._cache[key]
                return blocks
        """,
        replace="""
            if isinstance(blocks, KVCacheBlock):
                del self._cache[key]
                return blocks
        """,
        why="pop checks block_id only among duplicates: a key holding a single block loses it "
        "to pop(key, any_id), so evicting one block can drop another block's entry (I3)",
        caught_by="test_hashing.py::test_map_keeps_several_blocks_per_hash",
    ),
    Mutant(
        name="cache_mask_covers_all_blocks",
        file=FILE,
        find="""
            if block_mask is not None and len(block_mask) != len(new_full_blocks):
                raise ValueError(
                    f"block_mask has {len(block_mask)} entries for {len(new_full_blocks)} new full "
                    "blocks"
                )
            selected = [
                (block, block_hash)
                for i, (block, block_hash) in enumerate(
                    zip(new_full_blocks, request.block_hashes[num_cached_blocks:num_full_blocks])
                )
                if not block.is_null and (block_mask is None or block_mask[i])
            ]
        """,
        replace="""
            if block_mask is not None and len(block_mask) != num_full_blocks:
                raise ValueError(f"block_mask has {len(block_mask)} entries")
            selected = [
                (block, block_hash)
                for i, (block, block_hash) in enumerate(
                    zip(new_full_blocks, request.block_hashes[num_cached_blocks:num_full_blocks])
                )
                if not block.is_null and (block_mask is None or block_mask[num_cached_blocks + i])
            ]
        """,
        why="cache_full_blocks reads block_mask as one flag per block from block 0, not one per "
        "new full block (blocks[num_cached_blocks:num_full_blocks]): right only when "
        "num_cached_blocks is 0",
        caught_by="test_prefix_cache.py::test_cache_full_blocks_skips_null_and_masked_blocks",
    ),
    Mutant(
        name="cache_mask_length_unchecked",
        file=FILE,
        find="""
            if block_mask is not None and len(block_mask) != len(new_full_blocks):
                raise ValueError(
                    f"block_mask has {len(block_mask)} entries for {len(new_full_blocks)} new full "
                    "blocks"
                )
        """,
        replace="",
        why="cache_full_blocks does not check the mask's length: a mask too long is silently "
        "accepted, one too short raises IndexError instead of ValueError",
        caught_by="test_prefix_cache.py::test_cache_full_blocks_refuses_bad_arguments",
    ),
    Mutant(
        name="cache_hash_count_unchecked",
        file=FILE,
        find="""
            if num_full_blocks > len(request.block_hashes):
                raise ValueError(
                    f"Cannot cache {num_full_blocks} full blocks: the request has only "
                    f"{len(request.block_hashes)} block hashes"
                )
        """,
        replace="",
        why="cache_full_blocks does not check that the request has a hash per full block: zip "
        "stops at the shortest, so fewer blocks are cached than asked, silently",
        caught_by="test_prefix_cache.py::test_cache_full_blocks_refuses_bad_arguments",
    ),
    Mutant(
        name="cache_block_count_unchecked",
        file=FILE,
        find="""
            if num_full_blocks > len(blocks):
                raise ValueError(
                    f"Cannot cache {num_full_blocks} full blocks: only {len(blocks)} blocks were given"
                )
        """,
        replace="",
        why="cache_full_blocks does not check that num_full_blocks blocks were given: the slice "
        "is shorter and fewer blocks are cached than asked, silently",
        caught_by="test_prefix_cache.py::test_cache_full_blocks_refuses_bad_arguments",
    ),
    Mutant(
        name="cache_block_size_unchecked",
        file=FILE,
        find="""
            if block_size != self.hash_block_size:
                raise ValueError(
        """,
        replace="""
            if False:
                raise ValueError(
        """,
        why="cache_full_blocks accepts a block_size other than the pool's hash_block_size: the "
        "request's hashes cover blocks of another size than the pages they are attached to",
        caught_by="test_prefix_cache.py::test_cache_full_blocks_refuses_bad_arguments",
    ),
    Mutant(
        name="cache_ignores_group_id",
        file=FILE,
        find="key = make_block_hash_with_group_id(block_hash, kv_cache_group_id)",
        replace="key = make_block_hash_with_group_id(block_hash, 0)",
        why="cache_full_blocks keys every block with group 0 (mini-vLLM has one group) whatever "
        "kv_cache_group_id it is given: another group's pages would hit for group 0",
        caught_by="test_prefix_cache.py::test_cache_groups_are_all_or_nothing",
    ),
    Mutant(
        name="get_cached_block_first_group_only",
        file=FILE,
        find="""
                if block is None:
                    return None
                cached_blocks.append(block)
        """,
        replace="""
                if block is None:
                    return None
                cached_blocks.append(block)
                return cached_blocks
        """,
        why="get_cached_block returns after the first group's hit: a miss in a later group goes "
        "unseen, so a prefix that only some groups cache counts as a hit",
        caught_by="test_prefix_cache.py::test_cache_groups_are_all_or_nothing",
    ),
    Mutant(
        name="get_cached_block_skips_missing_groups",
        file=FILE,
        find="""
                if block is None:
                    return None
                cached_blocks.append(block)
            return cached_blocks
        """,
        replace="""
                if block is None:
                    continue
                cached_blocks.append(block)
            return cached_blocks or None
        """,
        why="get_cached_block skips the groups that miss instead of returning None: the caller "
        "gets fewer blocks than groups (all or nothing broken)",
        caught_by="test_prefix_cache.py::test_cache_groups_are_all_or_nothing",
    ),
    Mutant(
        name="touch_revives_only_cached_blocks",
        file=FILE,
        find="""
            if block.ref_cnt == 0:
                self.free_block_queue.remove(block)
        """,
        replace="""
            if block.ref_cnt == 0 and block.block_hash is not None:
                self.free_block_queue.remove(block)
        """,
        why="touch takes only cached blocks out of the free queue: a free block without a hash "
        "gets a reference but stays queued, to be handed out while in use (I1)",
        caught_by="test_prefix_cache.py::test_touch_revives_from_the_middle",
    ),
    Mutant(
        name="touch_not_in_queue_silently_counted",
        file=FILE,
        find="""
            if block.ref_cnt == 0:
                self.free_block_queue.remove(block)
        """,
        replace="""
            if block.ref_cnt == 0 and block.next_free_block is not None:
                self.free_block_queue.remove(block)
        """,
        why="touch removes a ref_cnt-0 block only if it looks queued: a free block missing from "
        "the queue (a broken pool, I1) is counted silently instead of raising RuntimeError",
        caught_by="test_prefix_cache.py::test_touch_free_block_not_in_queue_is_an_error",
    ),
    Mutant(
        name="evict_blocks_refuses_block_zero",
        file=FILE,
        find="if not 0 <= block_id < self.num_gpu_blocks:",
        replace="if not 0 < block_id < self.num_gpu_blocks:",
        why="evict_blocks refuses id 0 (the null block), which is a block of the pool: the "
        "misuse is an id outside 0 .. num_gpu_blocks - 1",
        caught_by="test_prefix_cache.py::test_evict_blocks_by_id",
    ),
    # -- second probe: the task text read literally, a refusal's edge --------------------------------
    Mutant(
        name="cache_rehashes_the_tokens",
        file=FILE,
        find="""
            new_full_blocks = blocks[num_cached_blocks:num_full_blocks]
        """,
        replace="""
            from mini_vllm.core.kv_cache_utils import sha256

            recomputed, parent = [], None
            for start in range(0, num_full_blocks * block_size, block_size):
                tokens = request.all_token_ids[start : start + block_size]
                parent = hash_block_tokens(sha256, parent, tokens)
                recomputed.append(parent)
            request = type("Rehashed", (), {"block_hashes": recomputed})()
            new_full_blocks = blocks[num_cached_blocks:num_full_blocks]
        """,
        why="reads 'hash and index' literally: re-hashes the request's tokens with sha256 and no "
        "extra keys instead of filing blocks under request.block_hashes, which carry the "
        "engine's hash function and the extra keys (LoRA, salt); a salted prefix never hits",
        caught_by="test_prefix_cache.py::test_cache_full_blocks_indexes_new_full_blocks",
    ),
    Mutant(
        name="reset_ignores_one_block_in_use",
        file=FILE,
        find="if num_used_blocks != 0:",
        replace="if num_used_blocks > 1:",
        why="off by one (the null block subtracted twice): a pool with one block in use resets "
        "anyway, though no block may be in use",
        caught_by="test_prefix_cache.py::test_reset_prefix_cache",
    ),
    Mutant(
        name="reset_refused_only_for_cached_blocks_in_use",
        file=FILE,
        find="num_used_blocks = self.num_gpu_blocks - self.get_num_free_blocks() - 1  # minus null",
        replace="""
            num_used_blocks = sum(
                1 for b in self.blocks if b.ref_cnt > 0 and b.block_hash is not None
            )
        """,
        why="counts only cached blocks as in use: a request holding a block not yet full (no "
        "hash) does not stop the reset, though the task says no block may be in use",
        caught_by="test_prefix_cache.py::test_reset_prefix_cache",
    ),
    Mutant(
        name="touch_not_reported_to_collector",
        file=FILE,
        find="""
                block.ref_cnt += 1
                if self.metrics_collector is not None:
                    self.metrics_collector.on_block_accessed(block)
        """,
        replace="""
                block.ref_cnt += 1
        """,
        why="touch never calls the collector's on_block_accessed: upstream's residency metrics "
        "see no prefix-cache hit",
        caught_by="test_prefix_cache.py::test_cache_events_are_reported_to_the_metrics_collector",
    ),
    Mutant(
        name="eviction_not_reported_to_collector",
        file=FILE,
        find="""
            if self.metrics_collector is not None:
                self.metrics_collector.on_block_evicted(block)
            key = block.block_hash
        """,
        replace="""
            key = block.block_hash
        """,
        why="_maybe_evict_cached_block never calls on_block_evicted: the collector keeps "
        "tracking blocks whose pages were reused for other contents",
        caught_by="test_prefix_cache.py::test_cache_events_are_reported_to_the_metrics_collector",
    ),
    Mutant(
        name="reset_keeps_the_collector",
        file=FILE,
        find="""
            if self.metrics_collector is not None:
                self.metrics_collector.reset()
        """,
        replace="",
        why="reset_prefix_cache forgets every prefix but not the collector's statistics about "
        "the blocks that held them",
        caught_by="test_prefix_cache.py::test_cache_events_are_reported_to_the_metrics_collector",
    ),
    Mutant(
        name="eviction_reported_only_for_cached_blocks",
        file=FILE,
        find="""        if self.metrics_collector is not None:
            self.metrics_collector.on_block_evicted(block)
        key = block.block_hash
        if key is None:
            return False
""",
        replace="""        key = block.block_hash
        if key is None:
            return False
        if self.metrics_collector is not None:
            self.metrics_collector.on_block_evicted(block)
""",
        why="tells the collector only of blocks that were cached: a reused block that held no "
        "prefix stays in the collector's residency records",
        caught_by="test_prefix_cache.py::test_cache_events_are_reported_to_the_metrics_collector",
    ),
    Mutant(
        name="touch_reports_only_revived_blocks",
        file=FILE,
        find="""            if block.ref_cnt == 0:
                self.free_block_queue.remove(block)
            block.ref_cnt += 1
            if self.metrics_collector is not None:
                self.metrics_collector.on_block_accessed(block)
""",
        replace="""            if block.ref_cnt == 0:
                self.free_block_queue.remove(block)
                if self.metrics_collector is not None:
                    self.metrics_collector.on_block_accessed(block)
            block.ref_cnt += 1
""",
        why="reports a hit only when it revives a free block: a hit on a block another request "
        "is using is not counted as an access",
        caught_by="test_prefix_cache.py::test_cache_events_are_reported_to_the_metrics_collector",
    ),
    Mutant(
        name="eviction_pops_the_first_block_under_the_hash",
        file=FILE,
        find="""
            if self.cached_block_hash_to_block.pop(key, block.block_id) is None:
        """,
        replace="""
            first = self.cached_block_hash_to_block.get_one_block(key)
            if first is None or self.cached_block_hash_to_block.pop(key, first.block_id) is None:
        """,
        why="evicts whichever block comes first under the hash instead of the block being reused: "
        "when the second of two duplicates is reused, the first loses its map entry and a hit "
        "returns the reused page, which now holds other tokens",
        caught_by="test_prefix_cache.py::test_duplicate_blocks_both_cached",
    ),
    Mutant(
        name="eviction_only_of_the_first_block_under_the_hash",
        file=FILE,
        find="""
            if key is None:
                return False
        """,
        replace="""
            if key is None:
                return False
            if self.cached_block_hash_to_block.get_one_block(key) is not block:
                return False
        """,
        why="evicts a block only if it is the one get_one_block would return: a reused duplicate "
        "keeps its hash and its map entry, and a hit returns its overwritten page",
        caught_by="test_prefix_cache.py::test_duplicate_blocks_both_cached",
    ),
    Mutant(
        name="mask_indexed_after_dropping_the_null_block",
        file=FILE,
        find="""
            selected = [
                (block, block_hash)
                for i, (block, block_hash) in enumerate(
                    zip(new_full_blocks, request.block_hashes[num_cached_blocks:num_full_blocks])
                )
                if not block.is_null and (block_mask is None or block_mask[i])
            ]
        """,
        replace="""
            real = [
                (block, block_hash)
                for block, block_hash in zip(
                    new_full_blocks, request.block_hashes[num_cached_blocks:num_full_blocks]
                )
                if not block.is_null
            ]
            selected = [pair for i, pair in enumerate(real) if block_mask is None or block_mask[i]]
        """,
        why="drops the null blocks before applying block_mask: after a null block every mask entry "
        "applies to the next block, caching the wrong one",
        caught_by="test_prefix_cache.py::test_cache_full_blocks_skips_null_and_masked_blocks",
    ),
    Mutant(
        name="block_count_checked_against_the_new_blocks_only",
        file=FILE,
        find="""
            if num_full_blocks > len(blocks):
        """,
        replace="""
            if num_full_blocks - num_cached_blocks > len(blocks):
        """,
        why="compares the new blocks (num_full_blocks - num_cached_blocks) with len(blocks): with "
        "blocks already cached, too few blocks are silently cached short",
        caught_by="test_prefix_cache.py::test_cache_full_blocks_refuses_bad_arguments",
    ),
    Mutant(
        name="empty_block_mask_read_as_no_mask",
        file=FILE,
        find="""
            if block_mask is not None and len(block_mask) != len(new_full_blocks):
                raise ValueError(
                    f"block_mask has {len(block_mask)} entries for {len(new_full_blocks)} new full "
                    "blocks"
                )
            selected = [
                (block, block_hash)
                for i, (block, block_hash) in enumerate(
                    zip(new_full_blocks, request.block_hashes[num_cached_blocks:num_full_blocks])
                )
                if not block.is_null and (block_mask is None or block_mask[i])
        """,
        replace="""
            if block_mask and len(block_mask) != len(new_full_blocks):
                raise ValueError(
                    f"block_mask has {len(block_mask)} entries for {len(new_full_blocks)} new full "
                    "blocks"
                )
            selected = [
                (block, block_hash)
                for i, (block, block_hash) in enumerate(
                    zip(new_full_blocks, request.block_hashes[num_cached_blocks:num_full_blocks])
                )
                if not block.is_null and (not block_mask or block_mask[i])
        """,
        why="tests block_mask for truth: an empty mask for two new blocks is taken as no mask and "
        "caches both instead of being refused",
        caught_by="test_prefix_cache.py::test_cache_full_blocks_refuses_bad_arguments",
    ),
    Mutant(
        name="rehashing_raises_value_error",
        file=FILE,
        find="""
                if block.block_hash is not None:
                    raise RuntimeError(
        """,
        replace="""
                if block.block_hash is not None:
                    raise ValueError(
        """,
        why="raises ValueError for a block that already has a hash: that is a RuntimeError (the "
        "engine's own state is wrong, not the caller's arguments), as the misuse table says",
        caught_by="test_prefix_cache.py::test_hashing_a_block_twice_is_an_error",
    ),
    Mutant(
        name="collector_reset_before_the_refusal",
        file=FILE,
        find="""
            num_used_blocks = self.num_gpu_blocks - self.get_num_free_blocks() - 1  # minus null
            if num_used_blocks != 0:
                logger.warning(
                    "Cannot reset the prefix cache: %d blocks are still in use", num_used_blocks
                )
                return False
            self.cached_block_hash_to_block = BlockHashToBlockMap()
            for block in self.blocks:
                block.reset_hash()
            if self.metrics_collector is not None:
                self.metrics_collector.reset()
        """,
        replace="""
            if self.metrics_collector is not None:
                self.metrics_collector.reset()
            num_used_blocks = self.num_gpu_blocks - self.get_num_free_blocks() - 1  # minus null
            if num_used_blocks != 0:
                logger.warning(
                    "Cannot reset the prefix cache: %d blocks are still in use", num_used_blocks
                )
                return False
            self.cached_block_hash_to_block = BlockHashToBlockMap()
            for block in self.blocks:
                block.reset_hash()
        """,
        why="resets the metrics collector before checking that no block is in use: a refused reset "
        "still wipes the collector's records",
        caught_by="test_prefix_cache.py::test_cache_events_are_reported_to_the_metrics_collector",
    ),
    Mutant(
        name="evict_blocks_bypasses_maybe_evict",
        file=FILE,
        find="""
                self._maybe_evict_cached_block(self.blocks[block_id])
        """,
        replace="""
                block = self.blocks[block_id]
                if block.block_hash is not None:
                    self.cached_block_hash_to_block.pop(block.block_hash, block_id)
                    block.reset_hash()
        """,
        why="evict_blocks pops the map and clears the hash itself instead of calling "
        "_maybe_evict_cached_block: the collector never hears of those evictions",
        caught_by="test_prefix_cache.py::test_cache_events_are_reported_to_the_metrics_collector",
    ),
    Mutant(
        name="touch_reports_only_cached_blocks",
        file=FILE,
        find="""
                block.ref_cnt += 1
                if self.metrics_collector is not None:
        """,
        replace="""
                block.ref_cnt += 1
                if self.metrics_collector is not None and block.block_hash is not None:
        """,
        why="reports a touch only for a block that holds a prefix: touching a free block with no "
        "hash goes unrecorded",
        caught_by="test_prefix_cache.py::test_cache_events_are_reported_to_the_metrics_collector",
    ),
    Mutant(
        name="own_none_hash_seed",
        file=FILE,
        find="""
            logger = logging.getLogger(__name__)
        """,
        replace="""
            logger = logging.getLogger(__name__)

            NONE_HASH = BlockHash(bytes(32))
        """,
        more=(
            (
                "parent_block_hash = kv_cache_utils.NONE_HASH",
                "parent_block_hash = NONE_HASH",
            ),
        ),
        why="the module binds NONE_HASH to a seed of its own: every first block hashes apart "
        "from the engine's (which chains from kv_cache_utils.NONE_HASH), so no prefix is ever "
        "shared with it (I3)",
        caught_by="test_hashing.py::test_first_block_chains_from_none_hash",
    ),
    Mutant(
        name="empty_extra_keys_hashed_as_none",
        file=FILE,
        find="""
                parent_block_hash = kv_cache_utils.NONE_HASH
            return BlockHash(
        """,
        replace="""
                parent_block_hash = kv_cache_utils.NONE_HASH
            extra_keys = extra_keys or None
            return BlockHash(
        """,
        why="turns an empty tuple of extra keys into None: fn((parent, tokens, ())) is not what "
        "the formula says, so the hash differs from the engine's for the same block (I3)",
        caught_by="test_hashing.py::test_hash_is_the_documented_formula",
    ),
    Mutant(
        name="pop_keeps_the_emptied_key",
        file=FILE,
        find="""
                block = blocks.pop(block_id, None)
                if not blocks:
                    del self._cache[key]
                return block
        """,
        replace="""
                return blocks.pop(block_id, None)
        """,
        more=(("return next(iter(blocks.values()))", "return next(iter(blocks.values()), None)"),),
        why="pop leaves a key whose last block it removed, as an empty dict: lookups still miss, "
        "but len counts dead keys and the map only grows",
        caught_by="test_hashing.py::test_map_keeps_several_blocks_per_hash",
    ),
    Mutant(
        name="rehash_checked_on_the_last_block_only",
        file=FILE,
        find="""
                for block, _ in selected:
                    if block.block_hash is not None:
        """,
        replace="""
                for block, _ in selected[-1:]:
                    if block.block_hash is not None:
        """,
        why="validates only the last block before caching: a call with an already hashed block "
        "in the middle caches the blocks before it and then raises, half done",
        caught_by="test_prefix_cache.py::test_hashing_a_block_twice_is_an_error",
    ),
    Mutant(
        name="touch_takes_one_reference_per_distinct_block",
        file=FILE,
        find="""
                for block in blocks:
                    if block.ref_cnt == 0:
                        self.free_block_queue.remove(block)
        """,
        replace="""
                for block in dict.fromkeys(blocks):
                    if block.ref_cnt == 0:
                        self.free_block_queue.remove(block)
        """,
        why="touch deduplicates its blocks: a block listed twice gains one reference, and the "
        "two free_blocks entries that give them back free it while still in use",
        caught_by="test_prefix_cache.py::test_touch_shared_block_in_use",
    ),
    Mutant(
        name="touch_revives_in_a_loop_of_its_own",
        file=FILE,
        find="""
                for block in blocks:
                    if block.ref_cnt == 0:
                        self.free_block_queue.remove(block)
                    block.ref_cnt += 1
        """,
        replace="""
                for block in [b for b in blocks if b.ref_cnt == 0]:
                    self.free_block_queue.remove(block)
                for block in blocks:
                    block.ref_cnt += 1
        """,
        why="takes free blocks out of the queue in a first loop and counts references in a "
        "second: a free block listed twice is removed from the queue twice",
        caught_by="test_prefix_cache.py::test_touch_shared_block_in_use",
    ),
    Mutant(
        name="evict_blocks_changes_the_callers_set",
        file=FILE,
        find="""
                for block_id in block_ids:
                    self._maybe_evict_cached_block(self.blocks[block_id])
        """,
        replace="""
                block_ids.discard(0)
                for block_id in block_ids:
                    self._maybe_evict_cached_block(self.blocks[block_id])
        """,
        why="evict_blocks drops the null block's id from the set it was given: the caller's set "
        "changes under it",
        caught_by="test_prefix_cache.py::test_evict_blocks_by_id",
    ),
    Mutant(
        name="prefix_cache_never_hits",
        file=FILE,
        find="cached_blocks: list[KVCacheBlock] = []",
        replace="return None",
        why="get_cached_block always misses: every hit it gives is trivially right, but no "
        "prefix is ever shared and every block is computed again",
        caught_by="test_prefix_cache.py::test_random_prefix_sharing_workload",
    ),
    Mutant(
        name="free_cached_blocks_never_hit",
        file=FILE,
        find="if block is None:",
        replace="if block is None or block.ref_cnt == 0:",
        why="a cached block in the free queue misses: once its request ends a prefix is never "
        "reused, though cached does not mean taken (touch revives it)",
        caught_by="test_prefix_cache.py::test_random_prefix_sharing_workload",
    ),
    # -- helper probe, 2026-11-28 (round 1) ------------------------------------------------------
    Mutant(
        name="touch_reports_before_the_null_check",
        file=FILE,
        find="""
            for block in blocks:
                if block.is_null:
                    raise ValueError(
                        f"Cannot touch the null block (block {block.block_id}): it is a placeholder "
                        "that is never shared"
                    )
        """,
        replace="""
            for block in blocks:
                if block.is_null:
                    raise ValueError(
                        f"Cannot touch the null block (block {block.block_id}): it is a placeholder "
                        "that is never shared"
                    )
                if self.metrics_collector is not None:
                    self.metrics_collector.on_block_accessed(block)
        """,
        more=(
            (
                """
                block.ref_cnt += 1
                if self.metrics_collector is not None:
                    self.metrics_collector.on_block_accessed(block)
                """,
                """
                block.ref_cnt += 1
                """,
            ),
        ),
        why="reports each access in the validation loop: a touch refused for the null block "
        "touches no block, yet the collector heard on_block_accessed for the blocks before it",
        caught_by="test_prefix_cache.py::test_cache_events_are_reported_to_the_metrics_collector",
    ),
    Mutant(
        name="touch_reports_once_per_distinct_block",
        file=FILE,
        find="""
                block.ref_cnt += 1
                if self.metrics_collector is not None:
                    self.metrics_collector.on_block_accessed(block)
        """,
        replace="""
                block.ref_cnt += 1
            if self.metrics_collector is not None:
                for block in dict.fromkeys(blocks):
                    self.metrics_collector.on_block_accessed(block)
        """,
        why="touch([b, b]) takes two references but reports one access: the collector hears "
        "on_block_accessed once per distinct block, not once per entry (upstream: per entry)",
        caught_by="test_prefix_cache.py::test_cache_events_are_reported_to_the_metrics_collector",
    ),
    Mutant(
        name="evict_blocks_reports_only_cached_blocks",
        file=FILE,
        find="""
            for block_id in block_ids:
                self._maybe_evict_cached_block(self.blocks[block_id])
        """,
        replace="""
            for block_id in block_ids:
                if self.blocks[block_id].block_hash is not None:
                    self._maybe_evict_cached_block(self.blocks[block_id])
        """,
        why="evict_blocks skips the ids that hold no prefix: _maybe_evict_cached_block is not "
        "called on them, so the collector never hears on_block_evicted for those blocks",
        caught_by="test_prefix_cache.py::test_cache_events_are_reported_to_the_metrics_collector",
    ),
    Mutant(
        name="evict_blocks_takes_free_blocks_out_of_the_queue",
        file=FILE,
        find="""
            for block_id in block_ids:
                self._maybe_evict_cached_block(self.blocks[block_id])
        """,
        replace="""
            for block_id in block_ids:
                block = self.blocks[block_id]
                if self._maybe_evict_cached_block(block) and block.ref_cnt == 0:
                    self.free_block_queue.remove(block)
        """,
        why="reads 'evict' as taking the block away: a free cached block given to evict_blocks "
        "leaves the free queue with ref_cnt 0, lost to the pool for good (I1)",
        caught_by="test_prefix_cache.py::test_evict_blocks_by_id",
    ),
    Mutant(
        name="evict_blocks_moves_free_blocks_to_the_front",
        file=FILE,
        find="""
            for block_id in block_ids:
                self._maybe_evict_cached_block(self.blocks[block_id])
        """,
        replace="""
            for block_id in block_ids:
                block = self.blocks[block_id]
                if self._maybe_evict_cached_block(block) and block.ref_cnt == 0:
                    queue = self.free_block_queue
                    queue.remove(block)
                    first = queue.fake_free_list_head.next_free_block
                    queue.fake_free_list_head.next_free_block = block
                    block.prev_free_block = queue.fake_free_list_head
                    block.next_free_block = first
                    first.prev_free_block = block
                    queue.num_free_blocks += 1
        """,
        why="moves an evicted free block to the front of the free queue, to be reused first: "
        "the queue is no longer in LRU order, and only the cache entry was to go (I4)",
        caught_by="test_prefix_cache.py::test_evict_blocks_by_id",
    ),
    Mutant(
        name="reset_refused_without_caching",
        file=FILE,
        find="""
            num_used_blocks = self.num_gpu_blocks - self.get_num_free_blocks() - 1  # minus null
        """,
        replace="""
            if not self.enable_caching:
                return False
            num_used_blocks = self.num_gpu_blocks - self.get_num_free_blocks() - 1  # minus null
        """,
        why="returns False on a pool without prefix caching: nothing is in use, so the reset "
        "must happen (True); the refusal is only for blocks in use",
        caught_by="test_prefix_cache.py::test_reset_prefix_cache",
    ),
    Mutant(
        name="cache_catches_up_on_earlier_uncached_blocks",
        file=FILE,
        find="""
            selected = [
                (block, block_hash)
                for i, (block, block_hash) in enumerate(
                    zip(new_full_blocks, request.block_hashes[num_cached_blocks:num_full_blocks])
                )
                if not block.is_null and (block_mask is None or block_mask[i])
            ]
        """,
        replace="""
            selected = [
                (block, block_hash)
                for i, (block, block_hash) in enumerate(
                    zip(blocks[:num_full_blocks], request.block_hashes[:num_full_blocks])
                )
                if not block.is_null
                and (i >= num_cached_blocks or block.block_hash is None)
                and (i < num_cached_blocks or block_mask is None or block_mask[i - num_cached_blocks])
            ]
        """,
        why="walks blocks[:num_full_blocks] and also caches any earlier block that has no hash: "
        "a block a mask left out in an earlier call is cached by the next call anyway",
        caught_by="test_prefix_cache.py::test_cache_full_blocks_skips_null_and_masked_blocks",
    ),
    # -- the seed read through its module (#19), 2026-11-28 ----------------------------------
    Mutant(
        name="none_hash_imported_by_name",
        file=FILE,
        find="""
from mini_vllm.core.kv_cache_utils import (
    BlockHash,""",
        replace="""
from mini_vllm.core.kv_cache_utils import (
    NONE_HASH,
    BlockHash,""",
        more=(
            (
                "parent_block_hash = kv_cache_utils.NONE_HASH",
                "parent_block_hash = NONE_HASH",
            ),
        ),
        why="imports NONE_HASH by name, as a copy of its value at import time: after "
        "init_none_hash rebinds the module's seed, first blocks still chain from the old one",
        caught_by="test_hashing.py::test_first_block_follows_a_reseeded_none_hash",
    ),
    # -- the probe of 2026-11-29: nothing to cache returns first ------------------------------
    Mutant(
        name="cache_validates_before_the_nothing_to_cache_return",
        file=FILE,
        find="""
            if num_cached_blocks >= num_full_blocks:
                return
            if block_size != self.hash_block_size:""",
        replace="""
            if block_size != self.hash_block_size:""",
        more=(
            (
                "new_full_blocks = blocks[num_cached_blocks:num_full_blocks]",
                "if num_cached_blocks >= num_full_blocks:\n"
                "    return\n"
                "new_full_blocks = blocks[num_cached_blocks:num_full_blocks]",
            ),
        ),
        why="validates the arguments before looking whether there is anything to cache: a call "
        "with num_cached_blocks >= num_full_blocks raises on counts or a block size it never "
        "uses, where upstream returns at once",
        caught_by="test_prefix_cache.py::test_cache_full_blocks_refuses_bad_arguments",
    ),
    Mutant(
        name="cache_refuses_num_cached_above_num_full",
        file=FILE,
        find="""
            if num_cached_blocks >= num_full_blocks:
                return""",
        replace="""
            if num_cached_blocks > num_full_blocks:
                raise ValueError(
                    f"num_cached_blocks ({num_cached_blocks}) > num_full_blocks ({num_full_blocks})"
                )
            if num_cached_blocks == num_full_blocks:
                return""",
        why="num_cached_blocks > num_full_blocks read as a bad count (ValueError) instead of "
        "nothing to cache",
        caught_by="test_prefix_cache.py::test_cache_full_blocks_refuses_bad_arguments",
    ),
    Mutant(
        name="evict_blocks_refuses_the_last_id",
        file=FILE,
        find="if not 0 <= block_id < self.num_gpu_blocks:",
        replace="if not 0 <= block_id < self.num_gpu_blocks - 1:",
        why="the bound of the id check taken one too low (as if the null block were not counted "
        "in num_gpu_blocks): the pool's last block, a valid id, is refused with ValueError",
        caught_by="test_prefix_cache.py::test_evict_blocks_by_id",
    ),
    # -- helper probe, 2026-11-29 (2) ----------------------------------------------------------
    Mutant(
        name="touch_reports_before_the_reference",
        file=FILE,
        find="""
                if block.ref_cnt == 0:
                    self.free_block_queue.remove(block)
                block.ref_cnt += 1
                if self.metrics_collector is not None:
                    self.metrics_collector.on_block_accessed(block)
        """,
        replace="""
                if self.metrics_collector is not None:
                    self.metrics_collector.on_block_accessed(block)
                if block.ref_cnt == 0:
                    self.free_block_queue.remove(block)
                block.ref_cnt += 1
        """,
        why="tells the collector of a hit before taking the reference: on_block_accessed sees a "
        "revived block with ref_cnt 0, a free block (README row 8: take the reference, then tell "
        "the collector; lab-01's get_new_blocks has the same rule)",
        caught_by="test_prefix_cache.py::test_cache_events_are_reported_to_the_metrics_collector",
    ),
    Mutant(
        name="evict_blocks_skips_the_null_block",
        file=FILE,
        find="""
            for block_id in block_ids:
                self._maybe_evict_cached_block(self.blocks[block_id])
        """,
        replace="""
            for block_id in block_ids:
                if block_id == 0:  # the null block is never cached
                    continue
                self._maybe_evict_cached_block(self.blocks[block_id])
        """,
        why="evict_blocks skips id 0 as never cached, so the collector never hears "
        "on_block_evicted for it (README row 9: every id goes through _maybe_evict_cached_block, "
        "as upstream)",
        caught_by="test_prefix_cache.py::test_cache_events_are_reported_to_the_metrics_collector",
    ),
    Mutant(
        name="reset_evicts_each_cached_block",
        file=FILE,
        find="""
            self.cached_block_hash_to_block = BlockHashToBlockMap()
            for block in self.blocks:
                block.reset_hash()
        """,
        replace="""
            for block in self.blocks:
                if block.block_hash is not None:
                    self._maybe_evict_cached_block(block)
        """,
        why="a reset that evicts every cached block through _maybe_evict_cached_block: the map "
        "and the hashes end up empty, but the collector hears one on_block_evicted per cached "
        "block before its reset() (README row 10: reset() alone; the collector test's reset "
        "came when no block was cached)",
        caught_by="test_prefix_cache.py::test_cache_events_are_reported_to_the_metrics_collector",
    ),
    Mutant(
        name="touch_null_refused_without_naming_it",
        file=FILE,
        find="""
                    raise ValueError(
                        f"Cannot touch the null block (block {block.block_id}): it is a placeholder "
                        "that is never shared"
                    )
        """,
        replace="""
                    raise ValueError("touch: bad block")
        """,
        why="touch refuses the null block with a message that does not say which block (the "
        "misuse table: a message naming the block and what was wrong)",
        caught_by="test_prefix_cache.py::test_touch_null_block_is_an_error",
    ),
    Mutant(
        name="rehash_refused_without_naming_the_block",
        file=FILE,
        find="""
                    raise RuntimeError(
                        f"Cannot cache block {block.block_id}: it already has a hash (was it cached "
                        "twice, or is num_cached_blocks too small?)"
                    )
        """,
        replace="""
                    raise RuntimeError("cache_full_blocks: a block is already cached")
        """,
        why="caching a block that already has a hash is refused without naming the block",
        caught_by="test_prefix_cache.py::test_hashing_a_block_twice_is_an_error",
    ),
    Mutant(
        name="evict_blocks_refused_without_naming_the_id",
        file=FILE,
        find="""
                    raise ValueError(
                        f"Cannot evict block {block_id}: block ids are 0 .. {self.num_gpu_blocks - 1}"
                    )
        """,
        replace="""
                    raise ValueError("evict_blocks: invalid block id")
        """,
        why="an id outside the pool refused without saying which id",
        caught_by="test_prefix_cache.py::test_evict_blocks_by_id",
    ),
    Mutant(
        name="pop_of_a_missing_key_leaves_an_empty_entry",
        file=FILE,
        find="""
            blocks = self._cache.get(key)
            if blocks is None:
                return None
            if isinstance(blocks, KVCacheBlock):
                if blocks.block_id != block_id:
        """,
        replace="""
            blocks = self._cache.setdefault(key, {})  # a missing key gets an empty entry
            if not blocks:
                return None
            if isinstance(blocks, KVCacheBlock):
                if blocks.block_id != block_id:
        """,
        why="a defaultdict's habit: popping a key that was never cached leaves an empty entry "
        "behind, so len() counts a key with no block and a later lookup of it breaks (a red-team "
        "helper's sweep: the test ended on the pop that finds nothing)",
        caught_by="test_hashing.py::test_map_keeps_several_blocks_per_hash",
    ),
    # -- cost: O(1) per block, whatever the size of the pool, the map or the request -----------
    Mutant(
        name="eviction_searches_the_map_for_the_block",
        file=FILE,
        find="""
            key = block.block_hash
            if key is None:
                return False
            if self.cached_block_hash_to_block.pop(key, block.block_id) is None:
        """,
        replace="""
            key = None
            for k, entry in list(self.cached_block_hash_to_block._cache.items()):
                ids = (entry.block_id,) if isinstance(entry, KVCacheBlock) else tuple(entry)
                if block.block_id in ids:
                    key = k
            if key is None:
                return False
            if self.cached_block_hash_to_block.pop(key, block.block_id) is None:
        """,
        why="each eviction finds the block's entry by scanning the whole cache map instead of "
        "popping under its own hash: right, but every allocation from a warm cache costs O(map "
        "size) (README: O(1) per block; a complexity probe, 2026-11-29)",
        caught_by="test_prefix_cache.py::test_evict_and_publish_are_constant_time",
    ),
    Mutant(
        name="map_pop_walks_the_keys",
        file=FILE,
        find="""
            blocks = self._cache.get(key)
            if blocks is None:
                return None
            if isinstance(blocks, KVCacheBlock):
                if blocks.block_id != block_id:
        """,
        replace="""
            blocks = None
            for k in list(self._cache):
                if k == key:
                    blocks = self._cache[k]
            if blocks is None:
                return None
            if isinstance(blocks, KVCacheBlock):
                if blocks.block_id != block_id:
        """,
        why="the map's pop compares the key with every key instead of looking it up: every "
        "eviction is O(map size) (README: O(1) per block)",
        caught_by="test_prefix_cache.py::test_evict_and_publish_are_constant_time",
    ),
    Mutant(
        name="map_insert_walks_the_items",
        file=FILE,
        find="""
            blocks = self._cache.get(key)
            if blocks is None:
                self._cache[key] = block
        """,
        replace="""
            blocks = next((v for k, v in self._cache.items() if k == key), None)
            if blocks is None:
                self._cache[key] = block
        """,
        why="the map's insert looks for the key among all items: publishing a block is O(map "
        "size) (README: O(1) per block)",
        caught_by="test_prefix_cache.py::test_evict_and_publish_are_constant_time",
    ),
    Mutant(
        name="publishing_walks_the_whole_block_list",
        file=FILE,
        find="""
            selected = [
                (block, block_hash)
                for i, (block, block_hash) in enumerate(
                    zip(new_full_blocks, request.block_hashes[num_cached_blocks:num_full_blocks])
                )
                if not block.is_null and (block_mask is None or block_mask[i])
            ]
        """,
        replace="""
            selected = [
                (block, block_hash)
                for j, (block, block_hash) in enumerate(zip(blocks, request.block_hashes))
                if num_cached_blocks <= j < num_full_blocks
                and not block.is_null
                and (block_mask is None or block_mask[j - num_cached_blocks])
            ]
        """,
        why="cache_full_blocks walks the request's whole block list to pick the new blocks: "
        "right, but a decoding request pays O(its length) each time a block fills, O(n^2) over "
        "its life (README: only blocks[num_cached_blocks:num_full_blocks])",
        caught_by="test_prefix_cache.py::test_evict_and_publish_are_constant_time",
    ),
    Mutant(
        name="evict_blocks_scans_the_pool",
        file=FILE,
        find="""
            for block_id in block_ids:
                self._maybe_evict_cached_block(self.blocks[block_id])
        """,
        replace="""
            for block in self.blocks:
                if block.block_id in block_ids:
                    self._maybe_evict_cached_block(block)
        """,
        why="evict_blocks walks every block of the pool for the few ids it is given: O(pool) "
        "per call (README: only the ids it is given)",
        caught_by="test_prefix_cache.py::test_evict_and_publish_are_constant_time",
    ),
    Mutant(
        name="map_lookup_walks_the_items",
        file=FILE,
        find="""
            blocks = self._cache.get(key)
            if blocks is None:
                return None
            if isinstance(blocks, KVCacheBlock):
                return blocks
        """,
        replace="""
            blocks = next((v for k, v in self._cache.items() if k == key), None)
            if blocks is None:
                return None
            if isinstance(blocks, KVCacheBlock):
                return blocks
        """,
        why="get_one_block compares the key with every key of the map: every prefix-cache "
        "lookup is O(map size) (README: a lookup reads its one key)",
        caught_by="test_prefix_cache.py::test_evict_and_publish_are_constant_time",
    ),
    Mutant(
        name="evict_blocks_scans_the_map_for_cached_ids",
        file=FILE,
        find="""
            for block_id in block_ids:
                self._maybe_evict_cached_block(self.blocks[block_id])
        """,
        replace="""
            for block_id in block_ids:
                block = self.blocks[block_id]
                if block.block_hash is not None:
                    for entry in list(self.cached_block_hash_to_block._cache.values()):
                        ids = [entry] if isinstance(entry, KVCacheBlock) else list(entry.values())
                        if block in ids:
                            break
                self._maybe_evict_cached_block(block)
        """,
        why="evict_blocks looks for each cached block's entry by walking the whole map (an "
        "uncached id skips at once): O(map size) per evicted block; the bench evicted only "
        "uncached blocks until a red-team round (README: only the ids it is given)",
        caught_by="test_prefix_cache.py::test_evict_and_publish_are_constant_time",
    ),
    # -- the probe of 2026-11-29 (10): upstream's own bugs ----------------------------------
    Mutant(
        name="nothing_to_cache_only_when_equal",
        file=FILE,
        find="""
            if num_cached_blocks >= num_full_blocks:
                return""",
        replace="""
            if num_cached_blocks == num_full_blocks:
                return""",
        why="upstream's own first line for a long time (vllm-project/vllm#13973, block_pool.py: "
        "'if num_cached_blocks == num_full_blocks: return'): a call with more blocks published "
        "than full goes on to the checks and raises on a block size or a count it never uses "
        "(README task 6: nothing to cache, num_cached_blocks >= num_full_blocks, returns first)",
        caught_by="test_prefix_cache.py::test_nothing_to_cache_past_the_full_count_returns_first",
    ),
    # -- mechanical sweep, 2026-11-29 (s49) -----------------------------------------------------
    Mutant(
        name="tokens_hashed_as_the_callers_list",
        file=FILE,
        find="tuple(curr_block_token_ids)",
        replace="curr_block_token_ids",
        why="hands the hash function the token ids as given, a list from request.all_token_ids: "
        "the engine's sha256 encodes a list as it does a tuple, so every digest tried matched, "
        "but a hash function that pickles its input hashes the block differently and hash() "
        "refuses a list (README task 1: (parent, tuple(tokens), extra_keys))",
        caught_by="test_hashing.py::test_hash_is_the_documented_formula",
    ),
]
