"""Buggy implementations of lab-06 (paged attention in numpy).

Each mutant is one mistake a learner plausibly makes, written as an edit of the solution
(``grading.mutants.Mutant``). ``python -m grading check-suites lab-06`` and
``tests/test_buggy_implementations.py`` check that the graded suite catches every one of them.
"""

from __future__ import annotations

from grading.mutants import Mutant

FILE = "paged_attention_numpy.py"

MUTANTS = [
    # -- compute_slot_mapping -------------------------------------------------------------------
    Mutant(
        name="slot_offset_off_by_one",
        file=FILE,
        find="slots = block_ids * block_size + positions % block_size",
        replace="slots = block_ids * block_size + (positions + 1) % block_size",
        why="counts positions from 1 inside the block: every token lands one slot late, and the "
        "last token of a block wraps onto the block's first slot",
        caught_by="test_cache_write.py::test_slot_mapping_worked_example",
    ),
    Mutant(
        name="slot_div_mod_swapped",
        file=FILE,
        find="""
            block_ids = block_table.astype(np.int64)[logical]
            if np.any(valid & (block_ids < 0)):
                raise ValueError(
                    "a used block table entry is negative; padding belongs past the used blocks"
                )
            slots = block_ids * block_size + positions % block_size
        """,
        replace="""
            block_ids = block_table.astype(np.int64)[np.where(valid, positions % block_size, 0)]
            slots = block_ids * block_size + positions // block_size
        """,
        why="p % block_size and p // block_size swapped: the offset picks the table entry and "
        "the logical block number becomes the offset",
        caught_by="test_cache_write.py::test_slot_mapping_worked_example",
    ),
    Mutant(
        name="padding_position_looked_up_in_the_table",
        file=FILE,
        find="logical = np.where(valid, positions // block_size, 0)",
        replace="logical = positions // block_size",
        why="looks every position up in the table and masks padding afterwards: numpy wraps a "
        "small negative logical block (-1 // 4 = -1 is the table's last entry), but a "
        "position like -9 or -100 is past the table's start and raises IndexError",
        caught_by="test_cache_write.py::test_negative_positions_are_padding",
    ),
    Mutant(
        name="slot_mapping_clobbers_the_positions",
        file=FILE,
        find="""
            positions = positions.astype(np.int64)
            valid = positions >= 0
            logical = np.where(valid, positions // block_size, 0)
        """,
        replace="""
            valid = positions >= 0
            positions[~valid] = 0
            logical = positions // block_size
        """,
        why="clamps the padding positions to 0 in the caller's array (np.asarray makes no "
        "copy) to keep them out of the table: the slots are right, but the positions the "
        "model still needs (RoPE) have changed",
        caught_by="test_cache_write.py::test_negative_positions_are_padding",
    ),
    Mutant(
        name="slots_in_the_block_table_dtype",
        file=FILE,
        find="return np.where(valid, slots, -1).astype(np.int64)",
        replace="return np.where(valid, slots, -1).astype(block_table.dtype)",
        why="returns the slots in the block table's dtype (int32 in the engine) instead of "
        "int64: the slot mapping vLLM's cache write takes is int64",
        caught_by="test_cache_write.py::test_slot_mapping_keeps_shape",
    ),
    # -- reshape_and_cache -----------------------------------------------------------------------
    Mutant(
        name="padding_slot_written",
        file=FILE,
        find="""
            kept = slots[valid]
            key_cache[kept // block_size, kept % block_size] = key[valid]
            value_cache[kept // block_size, kept % block_size] = value[valid]
        """,
        replace="""
            key_cache[slots // block_size, slots % block_size] = key
            value_cache[slots // block_size, slots % block_size] = value
        """,
        why="padding slots are not skipped: slot -1 is block -1, offset block_size - 1 in numpy, "
        "so a padding token overwrites the last slot of the cache (someone else's token)",
        caught_by="test_cache_write.py::test_padding_slots_are_skipped",
    ),
    Mutant(
        name="cache_write_into_a_copy",
        file=FILE,
        find="""
            key_cache[kept // block_size, kept % block_size] = key[valid]
            value_cache[kept // block_size, kept % block_size] = value[valid]
        """,
        replace="""
            flat_k = key_cache.reshape(-1, num_kv_heads, head_dim)
            flat_v = value_cache.reshape(-1, num_kv_heads, head_dim)
            flat_k[kept] = key[valid]
            flat_v[kept] = value[valid]
        """,
        why="writes through a flattened reshape: for a non-contiguous cache (K and V interleaved "
        "in one buffer) reshape returns a copy and the write is silently lost",
        caught_by="test_cache_write.py::test_writes_land_in_a_strided_cache",
    ),
    # -- _gather_sequence --------------------------------------------------------------------------
    Mutant(
        name="no_mask_past_seq_len",
        file=FILE,
        find="""
            k = key_cache[ids].reshape(used * block_size, num_kv_heads, head_dim)[:seq_len]
            v = value_cache[ids].reshape(used * block_size, num_kv_heads, head_dim)[:seq_len]
        """,
        replace="""
            k = key_cache[ids].reshape(used * block_size, num_kv_heads, head_dim)
            v = value_cache[ids].reshape(used * block_size, num_kv_heads, head_dim)
        """,
        why="attends to whole blocks: the slots of the last block past seq_len hold stale K/V of "
        "another request and get softmax weight",
        caught_by="test_paged_attention.py::test_decode_partial_last_block",
    ),
    Mutant(
        name="gather_blocks_in_id_order",
        file=FILE,
        find="ids = block_table[:used].astype(np.int64)",
        replace="ids = np.unique(block_table[:used]).astype(np.int64)",
        why="collects the sequence's blocks as a set (sorted by id) instead of in table order: "
        "with scattered blocks the tokens come back shuffled",
        caught_by="test_paged_attention.py::test_decode_partial_last_block",
    ),
    # -- paged_attention_decode ------------------------------------------------------------------
    Mutant(
        name="gqa_head_modulo",
        file=FILE,
        find="""
            k, v = _gather_sequence(key_cache, value_cache, block_tables[i], int(seq_lens[i]))
            out[i] = dense_attention(query[i : i + 1], k, v, scale)[0]
        """,
        replace="""
            k, v = _gather_sequence(key_cache, value_cache, block_tables[i], int(seq_lens[i]))
            group = num_heads // num_kv_heads
            k, v = np.tile(k, (1, group, 1)), np.tile(v, (1, group, 1))
            out[i] = dense_attention(query[i : i + 1], k, v, scale)[0]
        """,
        why="expands KV heads with np.tile (kv0, kv1, kv0, kv1, ...) instead of repeating each: "
        "query head h reads KV head h % num_kv_heads instead of h // group",
        caught_by="test_paged_attention.py::test_decode_single_sequence_equals_dense",
    ),
    Mutant(
        name="decode_forgets_the_new_token",
        file=FILE,
        find="block_tables[i], int(seq_lens[i]))",
        replace="block_tables[i], int(seq_lens[i]) - 1)",
        why="treats seq_lens as the tokens BEFORE the new one: the new token's own key, already "
        "written, is left out",
        caught_by="test_paged_attention.py::test_decode_single_sequence_equals_dense",
    ),
    Mutant(
        name="decode_uses_the_first_table",
        file=FILE,
        find="_gather_sequence(key_cache, value_cache, block_tables[i], int(seq_lens[i]))",
        replace="_gather_sequence(key_cache, value_cache, block_tables[0], int(seq_lens[i]))",
        why="every sequence of the batch reads sequence 0's block table",
        caught_by="test_paged_attention.py::test_decode_batches_with_random_tables",
    ),
    Mutant(
        name="decode_output_in_the_cache_dtype",
        file=FILE,
        find="""
            out = np.empty_like(query)
            for i in range(num_seqs):
                k, v = _gather_sequence(key_cache, value_cache, block_tables[i], int(seq_lens[i]))
        """,
        replace="""
            out = np.empty(query.shape, dtype=key_cache.dtype)
            for i in range(num_seqs):
                k, v = _gather_sequence(key_cache, value_cache, block_tables[i], int(seq_lens[i]))
        """,
        why="decode's output buffer takes the cache's dtype instead of the query's: a float32 "
        "query over a float64 cache comes back as float64",
        caught_by="test_paged_attention.py::test_decode_float32_inputs",
    ),
    # -- dense_attention (given, but a learner may write their own softmax) ------------------------
    Mutant(
        name="softmax_without_max_subtraction",
        file=FILE,
        find="scores = scores - scores.max(axis=-1, keepdims=True)",
        replace="",
        why="exp of raw scores: scores of a few hundred overflow to inf and the row becomes "
        "inf / inf = nan",
        caught_by="test_paged_attention.py::test_large_logits_do_not_overflow",
    ),
    Mutant(
        name="scale_applied_twice",
        file=FILE,
        find='scores = np.einsum("qhgd,shd->hgqs", q, k) * dtype.type(scale)',
        replace='scores = np.einsum("qhgd,shd->hgqs", q, k) * dtype.type(scale * scale)',
        why="multiplies by the scale twice (once on q, once on the scores): the softmax is too "
        "flat",
        caught_by="test_paged_attention.py::test_decode_single_sequence_equals_dense",
    ),
    Mutant(
        name="scale_not_applied",
        file=FILE,
        find='scores = np.einsum("qhgd,shd->hgqs", q, k) * dtype.type(scale)',
        replace='scores = np.einsum("qhgd,shd->hgqs", q, k)',
        why="forgets the 1/sqrt(head_dim) scale: the softmax is too sharp",
        caught_by="test_paged_attention.py::test_decode_single_sequence_equals_dense",
    ),
    Mutant(
        name="causal_mask_top_left",
        file=FILE,
        find="q_pos = np.arange(query_len)[:, None] + (kv_len - query_len)",
        replace="q_pos = np.arange(query_len)[:, None]",
        why="aligns the causal mask top-left: after a cached prefix, query i sees only keys 0..i "
        "instead of the whole prefix plus the chunk up to itself",
        caught_by="test_paged_attention.py::test_prefill_after_a_cached_prefix",
    ),
    # -- paged_attention_prefill -----------------------------------------------------------------
    Mutant(
        name="prefill_not_causal",
        file=FILE,
        find="return dense_attention(query, k, v, scale, causal=True)",
        replace="return dense_attention(query, k, v, scale, causal=False)",
        why="prefill without the causal mask: every token of the chunk sees the tokens after it",
        caught_by="test_paged_attention.py::test_prefill_without_prefix_is_causal",
    ),
    Mutant(
        name="prefill_ignores_the_prefix",
        file=FILE,
        find="""
            k, v = _gather_sequence(key_cache, value_cache, block_table, context_len + query_len)
            return dense_attention(query, k, v, scale, causal=True)
        """,
        replace="""
            k, v = _gather_sequence(key_cache, value_cache, block_table, context_len + query_len)
            k, v = k[context_len:], v[context_len:]
            return dense_attention(query, k, v, scale, causal=True)
        """,
        why="a chunk attends only to itself: the cached prefix (an earlier chunk, a prefix-cache "
        "hit) is never read",
        caught_by="test_paged_attention.py::test_prefill_after_a_cached_prefix",
    ),
    Mutant(
        name="decode_output_buffer_float64",
        file=FILE,
        find="""
            out = np.empty_like(query)
            for i in range(num_seqs):
                k, v = _gather_sequence(
        """,
        replace="""
            out = np.zeros(query.shape)
            for i in range(num_seqs):
                k, v = _gather_sequence(
        """,
        why="decode's output buffer is made with np.zeros(shape), float64 whatever the query's "
        "dtype: float32 (or float16) inputs come back in double precision",
        caught_by="test_paged_attention.py::test_decode_float32_inputs",
    ),
    Mutant(
        name="prefill_output_buffer_float64",
        file=FILE,
        find="""
            k, v = _gather_sequence(key_cache, value_cache, block_table, context_len + query_len)
            return dense_attention(query, k, v, scale, causal=True)
        """,
        replace="""
            k, v = _gather_sequence(key_cache, value_cache, block_table, context_len + query_len)
            out = np.zeros(query.shape)
            out[...] = dense_attention(query, k, v, scale, causal=True)
            return out
        """,
        why="prefill fills an output buffer made with np.zeros(shape): a float32 chunk comes "
        "back as float64, unlike decode's output",
        caught_by="test_paged_attention.py::test_prefill_float32_inputs",
    ),
    Mutant(
        name="slot_mapping_fails_on_no_positions",
        file=FILE,
        find="if valid.any() and int(logical[valid].max()) >= block_table.shape[0]:",
        replace="if int(positions.max()) // block_size >= block_table.shape[0]:",
        why="range-checks the positions with positions.max(), unguarded: an empty array of "
        "positions (no tokens) raises instead of giving an empty array of slots",
        caught_by="test_cache_write.py::test_slot_mapping_keeps_shape",
    ),
    Mutant(
        name="softmax_max_taken_before_the_causal_mask",
        file=FILE,
        find="""
            if causal:
                q_pos = np.arange(query_len)[:, None] + (kv_len - query_len)
                visible = np.arange(kv_len)[None, :] <= q_pos
                scores = np.where(visible, scores, -np.inf)
            scores = scores - scores.max(axis=-1, keepdims=True)
        """,
        replace="""
            scores = scores - scores.max(axis=-1, keepdims=True)
            if causal:
                q_pos = np.arange(query_len)[:, None] + (kv_len - query_len)
                visible = np.arange(kv_len)[None, :] <= q_pos
                scores = np.where(visible, scores, -np.inf)
        """,
        why="subtracts each row's maximum over ALL keys, then masks: when a later, hidden key "
        "scores thousands above the visible ones, every visible exp underflows to 0 and the "
        "row is 0 / 0 = nan (decode, with no mask, is unaffected)",
        caught_by="test_paged_attention.py::test_large_logits_do_not_overflow",
    ),
    Mutant(
        name="prefill_gqa_head_divided_by_num_kv_heads",
        file=FILE,
        find="""
            k, v = _gather_sequence(key_cache, value_cache, block_table, context_len + query_len)
            return dense_attention(query, k, v, scale, causal=True)
        """,
        replace="""
            k, v = _gather_sequence(key_cache, value_cache, block_table, context_len + query_len)
            kv_of = np.arange(num_heads) // num_kv_heads
            return dense_attention(query, k[:, kv_of], v[:, kv_of], scale, causal=True)
        """,
        why="prefill expands the KV heads itself, query head h taking KV head h // "
        "num_kv_heads instead of h // group: right by accident with 4 query heads over 2 "
        "KV heads, where num_kv_heads == group",
        caught_by="test_paged_attention.py::test_decode_gqa_head_mapping",
    ),
    # -- part 3: split-K decode ---------------------------------------------------------------
    Mutant(
        name="split_lse_without_the_max",
        file=FILE,
        find="lse = (m + np.log(total))[..., 0]",
        replace="lse = np.log(total)[..., 0]",
        why="attend_split returns log(sum exp(s - m)), forgetting to add the max m back: every "
        "split's lse is off by its own max, so the merge weighs the splits wrongly",
        caught_by="test_split_k.py::test_attend_split_output_and_lse",
    ),
    Mutant(
        name="split_lse_of_unscaled_scores",
        file=FILE,
        find="""
            m = scores.max(axis=-1, keepdims=True)
            p = np.exp(scores - m)
        """,
        replace="""
            m = scores.max(axis=-1, keepdims=True)
            p = np.exp(scores - m)
            m = m / dtype.type(scale)
        """,
        why="the lse is taken of the raw dot products q . k, without the scale that the "
        "softmax used: the partial output is right, the merge weights are not",
        caught_by="test_split_k.py::test_attend_split_output_and_lse",
    ),
    Mutant(
        name="split_max_over_all_heads",
        file=FILE,
        find="m = scores.max(axis=-1, keepdims=True)",
        replace="m = scores.max()",
        why="attend_split subtracts one maximum over all heads (max() without axis=-1): a head "
        "whose scores are far below another head's underflows to exp(...) = 0, giving 0 / 0 "
        "= nan and lse -inf",
        caught_by="test_split_k.py::test_attend_split_output_and_lse",
    ),
    Mutant(
        name="split_not_normalised",
        file=FILE,
        find='partial = np.einsum("hgs,shd->hgd", p / total, value.astype(dtype, copy=False))',
        replace='partial = np.einsum("hgs,shd->hgd", p, value.astype(dtype, copy=False))',
        why="attend_split returns the unnormalised accumulator sum exp(s - m) v instead of "
        "dividing by the piece's own sum, while the merge assumes normalised pieces",
        caught_by="test_split_k.py::test_attend_split_output_and_lse",
    ),
    Mutant(
        name="empty_split_is_nan",
        file=FILE,
        find="""
            if n == 0:
                return np.zeros((num_heads, head_dim), dtype), np.full(num_heads, -np.inf, dtype)
        """,
        replace="",
        why="no special case for a piece without keys: its max is taken of nothing (an error) "
        "or its sum is 0 and the output 0 / 0 = nan",
        caught_by="test_split_k.py::test_attend_split_of_no_keys",
    ),
    Mutant(
        name="split_gqa_head_divided_by_num_kv_heads",
        file=FILE,
        find="""
            q = query.astype(dtype, copy=False).reshape(num_kv_heads, group, head_dim)
            scores = np.einsum("hgd,shd->hgs", q, key.astype(dtype, copy=False)) * dtype.type(scale)
            m = scores.max(axis=-1, keepdims=True)
            p = np.exp(scores - m)
            total = p.sum(axis=-1, keepdims=True)
            partial = np.einsum("hgs,shd->hgd", p / total, value.astype(dtype, copy=False))
            lse = (m + np.log(total))[..., 0]
            return partial.reshape(num_heads, head_dim), lse.reshape(num_heads)
        """,
        replace="""
            kv_of = np.arange(num_heads) // num_kv_heads
            k = key.astype(dtype, copy=False)[:, kv_of]
            v = value.astype(dtype, copy=False)[:, kv_of]
            scores = np.einsum("hd,shd->hs", query.astype(dtype, copy=False), k) * dtype.type(scale)
            m = scores.max(axis=-1, keepdims=True)
            p = np.exp(scores - m)
            total = p.sum(axis=-1, keepdims=True)
            partial = np.einsum("hs,shd->hd", p / total, v)
            lse = (m + np.log(total))[..., 0]
            return partial, lse
        """,
        why="attend_split maps query head h to KV head h // num_kv_heads instead of h // group: "
        "right by accident with 4 query heads over 2 KV heads",
        caught_by="test_split_k.py::test_attend_split_output_and_lse",
    ),
    Mutant(
        name="empty_split_in_float64",
        file=FILE,
        find="return np.zeros((num_heads, head_dim), dtype), np.full(num_heads, -np.inf, dtype)",
        replace="return np.zeros((num_heads, head_dim)), np.full(num_heads, -np.inf)",
        why="the piece without keys is made with np.zeros(shape) and np.full(shape, -inf): "
        "float64 whatever the inputs, while every other piece of float16 or float32 inputs "
        "is float32",
        caught_by="test_split_k.py::test_attend_split_of_no_keys",
    ),
    Mutant(
        name="split_k_hard_codes_the_scale",
        file=FILE,
        find="""
                v[j * per_split : (j + 1) * per_split],
                scale,
            )
        """,
        replace="""
                v[j * per_split : (j + 1) * per_split],
                head_dim**-0.5,
            )
        """,
        why="split-K decode passes the textbook 1 / sqrt(head_dim) to attend_split instead of "
        "the scale it was given: right only when the caller's scale happens to be that",
        caught_by="test_split_k.py::test_split_k_decode_equals_dense",
    ),
    Mutant(
        name="merge_without_subtracting_the_max",
        file=FILE,
        find="weights = np.exp(lse - top)  # exp(-inf) = 0: an empty split has no weight",
        replace="weights = np.exp(lse)",
        why="the merge weighs the splits by exp(lse) directly: an lse of a few hundred overflows "
        "to inf and the result is nan",
        caught_by="test_split_k.py::test_merge_splits_large_lse_do_not_overflow",
    ),
    Mutant(
        name="merge_max_over_all_heads",
        file=FILE,
        find="top = lse.max(axis=0, keepdims=True)",
        replace="top = lse.max()",
        why="the merge subtracts one maximum lse over all heads and splits: a head whose lse "
        "are far below another head's gets weights exp(lse - max) = 0 and 0 / 0 = nan",
        caught_by="test_split_k.py::test_merge_splits_large_lse_do_not_overflow",
    ),
    Mutant(
        name="merge_averages_the_splits",
        file=FILE,
        find="weights = np.exp(lse - top)  # exp(-inf) = 0: an empty split has no weight",
        replace="weights = np.isfinite(lse).astype(partial.dtype)",
        why="the merge averages the non-empty splits' outputs, as if each held the same share "
        "of the softmax mass: right only when every split has the same lse",
        caught_by="test_split_k.py::test_merge_splits_equals_one_softmax",
    ),
    Mutant(
        name="merge_trusts_empty_partials",
        file=FILE,
        find="kept = np.where(np.isfinite(lse)[..., None], partial, 0.0)  # 0 * garbage must stay 0",
        replace="kept = partial",
        why="the merge multiplies an empty split's partial by its weight 0 without masking it: "
        "garbage like 1e30 (or nan) in an unwritten partial poisons the result",
        caught_by="test_split_k.py::test_merge_splits_ignores_empty_splits",
    ),
    Mutant(
        name="split_k_drops_the_remainder",
        file=FILE,
        find="per_split = cdiv(seq_len, num_splits)",
        replace="per_split = max(1, seq_len // num_splits)",
        why="ranges of seq_len // num_splits tokens: the last seq_len % num_splits tokens are "
        "in no split, so the newest tokens are never attended to",
        caught_by="test_split_k.py::test_split_k_decode_equals_dense",
    ),
    Mutant(
        name="gather_one_block_too_many",
        file=FILE,
        find="used = cdiv(seq_len, block_size)",
        replace="used = seq_len // block_size + 1",
        why="counts the blocks as seq_len // block_size + 1: a sequence that fills its last "
        "block exactly reads one table entry more, which is padding (-1, or an id outside "
        "the cache)",
        caught_by="test_paged_attention.py::test_decode_single_sequence_equals_dense",
    ),
    Mutant(
        name="slot_mapping_refuses_a_padded_table",
        file=FILE,
        find="    if np.any(valid & (block_ids < 0)):",
        replace="    if np.any(block_table < 0):",
        why="validates every block table entry instead of the ones the positions look up: a "
        "table padded with -1 past its used blocks (a row of the engine's rectangle) is "
        "refused",
        caught_by="test_cache_write.py::test_slot_mapping_through_a_padded_table",
    ),
    Mutant(
        name="split_computed_in_float16",
        file=FILE,
        find="""
            group = _check_gqa(num_heads, num_kv_heads)
            dtype = _compute_dtype(query, key, value)
            if n == 0:
        """,
        replace="""
            group = _check_gqa(num_heads, num_kv_heads)
            dtype = np.result_type(query, key, value)
            if n == 0:
        """,
        why="attend_split works in the inputs' own dtype: float16 pieces are summed in float16 "
        "(errors near 1e-3 in the lse and the output) instead of float32",
        caught_by="test_split_k.py::test_attend_split_compute_dtype",
    ),
    Mutant(
        name="split_computed_in_the_query_dtype",
        file=FILE,
        find="""
            group = _check_gqa(num_heads, num_kv_heads)
            dtype = _compute_dtype(query, key, value)
            if n == 0:
        """,
        replace="""
            group = _check_gqa(num_heads, num_kv_heads)
            dtype = query.dtype
            if n == 0:
        """,
        why="attend_split casts everything to the query's dtype (the dtype the OUTPUT takes): a "
        "float32 query over float64 keys is computed in float32",
        caught_by="test_split_k.py::test_attend_split_compute_dtype",
    ),
    Mutant(
        name="merge_returns_the_weights_dtype",
        file=FILE,
        find='return np.einsum("sh,shd->hd", weights, kept).astype(partial.dtype, copy=False)',
        replace='return np.einsum("sh,shd->hd", weights, kept)',
        why="merge_splits returns the einsum's dtype, the wider of partial's and lse's: float32 "
        "partials with float64 lse come back float64, unlike the split outputs they merge",
        caught_by="test_split_k.py::test_merge_splits_ignores_empty_splits",
    ),
    # -- red team, 2026-11-28: split-K without the splits ---------------------------------------
    Mutant(
        name="split_k_decode_without_splitting",
        file=FILE,
        find="""
            out = np.empty_like(query)
            for i in range(num_seqs):
                seq_len = int(seq_lens[i])
                k, v = _gather_sequence(key_cache, value_cache, block_tables[i], seq_len)
                per_split = cdiv(seq_len, num_splits)
        """,
        replace="""
            return paged_attention_decode(query, key_cache, value_cache, block_tables, seq_lens, scale)
            out = np.empty_like(query)
            for i in range(num_seqs):
                seq_len = int(seq_lens[i])
                k, v = _gather_sequence(key_cache, value_cache, block_tables[i], seq_len)
                per_split = cdiv(seq_len, num_splits)
        """,
        why="split-K decode answered by the dense decode: the same numbers (the merge is exact), "
        "no split and no merge; only the pieces attend_split is called on show it",
        caught_by="test_split_k.py::test_split_k_decode_equals_dense",
    ),
    Mutant(
        name="split_k_ranges_balanced_by_array_split",
        file=FILE,
        find="""
                        k[j * per_split : (j + 1) * per_split],
                        v[j * per_split : (j + 1) * per_split],
        """,
        replace="""
                        np.array_split(k, num_splits)[j],
                        np.array_split(v, num_splits)[j],
        """,
        why="ranges balanced by np.array_split (10 keys in 3 splits: 4, 3, 3) instead of "
        "cdiv-sized ones (4, 4, 2), which lab-04's kernel and its split count assume",
        caught_by="test_split_k.py::test_split_k_decode_equals_dense",
    ),
    # -- helper probe, 2026-11-28 (round 4) ------------------------------------------------------
    Mutant(
        name="merge_references_the_smallest_lse",
        file=FILE,
        find="top = lse.max(axis=0, keepdims=True)",
        replace="top = np.where(np.isfinite(lse), lse, np.inf).min(axis=0, keepdims=True)",
        why="merge_splits subtracts each head's smallest finite lse instead of its largest: fine "
        "while a head's lse are close, exp(5000) = inf once they are thousands apart",
        caught_by="test_split_k.py::test_merge_splits_large_lse_do_not_overflow",
    ),
    Mutant(
        name="cache_write_returns_the_caches",
        file=FILE,
        find="    value_cache[kept // block_size, kept % block_size] = value[valid]\n",
        replace="    value_cache[kept // block_size, kept % block_size] = value[valid]\n"
        "    return key_cache, value_cache\n",
        why="the write is right but the caches are also returned, against the stub's -> None "
        "and upstream's op (found by a blind implementation); it costs the one test about the "
        "return value, no longer the scatter's points as well",
        caught_by="test_cache_write.py::test_reshape_and_cache_returns_none",
    ),
    Mutant(
        name="attend_split_returns_the_querys_dtype",
        file=FILE,
        find="    return partial.reshape(num_heads, head_dim), lse.reshape(num_heads)\n",
        replace="    return (\n"
        "        partial.reshape(num_heads, head_dim).astype(query.dtype),\n"
        "        lse.reshape(num_heads).astype(query.dtype),\n"
        "    )\n",
        why="the piece computed in float32 but cast back to float16 on return: the merge then "
        "weighs float16 lse values (found by a blind implementation, which read 'return the "
        "query's dtype' as meant for every function)",
        caught_by="test_split_k.py::test_attend_split_compute_dtype",
    ),
    # -- probe, 2026-11-29: dtypes other than float32 / float64 alone, padded tables elsewhere ----
    Mutant(
        name="merge_returns_the_compute_dtype",
        file=FILE,
        find='return np.einsum("sh,shd->hd", weights, kept).astype(partial.dtype, copy=False)',
        replace='return np.einsum("sh,shd->hd", weights, kept).astype(_compute_dtype(partial))',
        why="the merge returns the compute dtype of its partials: the same as partial's for "
        "float32 and float64, float32 for float16 partials, which the README says keep their "
        "dtype (only float32 partials were ever merged)",
        caught_by="test_split_k.py::test_merge_splits_ignores_empty_splits",
    ),
    Mutant(
        name="attend_split_widened_to_float64",
        file=FILE,
        find="""
            if n == 0:
                return np.zeros((num_heads, head_dim), dtype), np.full(num_heads, -np.inf, dtype)
        """,
        replace="""
            if n == 0:
                return np.zeros((num_heads, head_dim), dtype), np.full(num_heads, -np.inf, dtype)
            dtype = np.dtype(np.float64)
        """,
        why="a piece with keys computed, and returned, in float64 whatever its inputs: the "
        "float16 test only refused a float16 result, and no float32 piece was ever checked",
        caught_by="test_split_k.py::test_attend_split_compute_dtype",
    ),
    Mutant(
        name="attend_split_lse_in_float64",
        file=FILE,
        find="    lse = (m + np.log(total))[..., 0]",
        replace="    lse = (m.astype(np.float64) + np.log(total.astype(np.float64)))[..., 0]",
        why="the lse widened to float64 for precision, the partial left in the compute dtype: "
        "the pair no longer shares the compute dtype the README asks of both",
        caught_by="test_split_k.py::test_attend_split_compute_dtype",
    ),
    Mutant(
        name="decode_output_in_the_compute_dtype",
        file=FILE,
        find="""
            out = np.empty_like(query)
            for i in range(num_seqs):
                k, v = _gather_sequence(key_cache, value_cache, block_tables[i], int(seq_lens[i]))
        """,
        replace="""
            out = np.empty(query.shape, _compute_dtype(query))
            for i in range(num_seqs):
                k, v = _gather_sequence(key_cache, value_cache, block_tables[i], int(seq_lens[i]))
        """,
        why="decode's output buffer in the compute dtype of the query: float32 queries are "
        "right, float16 queries get a float32 output instead of their own dtype",
        caught_by="test_paged_attention.py::test_decode_float32_inputs",
    ),
    Mutant(
        name="prefill_output_in_the_compute_dtype",
        file=FILE,
        find="    return dense_attention(query, k, v, scale, causal=True)",
        replace="    return dense_attention(query, k, v, scale, causal=True).astype(_compute_dtype(query))",
        why="prefill returns the compute dtype of the query: float16 chunks come back float32",
        caught_by="test_paged_attention.py::test_prefill_float32_inputs",
    ),
    Mutant(
        name="split_k_output_in_the_compute_dtype",
        file=FILE,
        find="""
            out = np.empty_like(query)
            for i in range(num_seqs):
                seq_len = int(seq_lens[i])
        """,
        replace="""
            out = np.empty(query.shape, _compute_dtype(query))
            for i in range(num_seqs):
                seq_len = int(seq_lens[i])
        """,
        why="split-K decode keeps the merge's compute dtype: float16 queries get float32 out, "
        "although this function alone casts back to the query's dtype",
        caught_by="test_split_k.py::test_split_k_decode_float32",
    ),
    Mutant(
        name="decode_cache_cast_to_the_query_dtype",
        file=FILE,
        find="        out[i] = dense_attention(query[i : i + 1], k, v, scale)[0]",
        replace="        out[i] = dense_attention(\n"
        "            query[i : i + 1], k.astype(query.dtype), v.astype(query.dtype), scale\n"
        "        )[0]",
        why="the keys cast to the query's dtype to 'match' it: a float32 query over a float64 "
        "cache is computed in float32, tens of ulps off the float64 answer rounded once (only "
        "the output's dtype was checked)",
        caught_by="test_paged_attention.py::test_decode_float32_inputs",
    ),
    Mutant(
        name="prefill_cache_cast_to_the_query_dtype",
        file=FILE,
        find="    return dense_attention(query, k, v, scale, causal=True)",
        replace="    return dense_attention(\n"
        "        query, k.astype(query.dtype), v.astype(query.dtype), scale, causal=True\n"
        "    )",
        why="prefill over a float64 cache computed in the float32 of its chunk (no mixed "
        "prefill was tried)",
        caught_by="test_paged_attention.py::test_prefill_float32_inputs",
    ),
    Mutant(
        name="split_k_cache_cast_to_the_query_dtype",
        file=FILE,
        find="        k, v = _gather_sequence(key_cache, value_cache, block_tables[i], seq_len)",
        replace="        k, v = _gather_sequence(key_cache, value_cache, block_tables[i], seq_len)\n"
        "        k, v = k.astype(query.dtype), v.astype(query.dtype)",
        why="split-K decode over a float64 cache computed in the float32 of its query (no mixed "
        "split-K decode was tried)",
        caught_by="test_split_k.py::test_split_k_decode_float32",
    ),
    Mutant(
        name="prefill_gathers_the_whole_table",
        file=FILE,
        find="    k, v = _gather_sequence(key_cache, value_cache, block_table, context_len + query_len)",
        replace="""
            ids = block_table.astype(np.int64)
            k = key_cache[ids].reshape(-1, num_kv_heads, head_dim)[: context_len + query_len]
            v = value_cache[ids].reshape(-1, num_kv_heads, head_dim)[: context_len + query_len]
        """,
        why="prefill gathers every table entry and cuts the rows afterwards: padding -1 reads "
        "cache[-1] harmlessly, an id far outside the cache raises (only decode was given such "
        "a table)",
        caught_by="test_paged_attention.py::test_decode_ignores_table_padding",
    ),
    Mutant(
        name="prefill_reads_one_table_entry_too_many",
        file=FILE,
        find="    k, v = _gather_sequence(key_cache, value_cache, block_table, context_len + query_len)",
        replace="""
            ids = block_table[: (context_len + query_len) // key_cache.shape[1] + 1].astype(np.int64)
            k = key_cache[ids].reshape(-1, num_kv_heads, head_dim)[: context_len + query_len]
            v = value_cache[ids].reshape(-1, num_kv_heads, head_dim)[: context_len + query_len]
        """,
        why="kv_len // block_size + 1 entries instead of cdiv: one entry past the used blocks "
        "whenever the keys fill their last block",
        caught_by="test_paged_attention.py::test_decode_ignores_table_padding",
    ),
    Mutant(
        name="split_k_gathers_the_whole_table",
        file=FILE,
        find="        k, v = _gather_sequence(key_cache, value_cache, block_tables[i], seq_len)",
        replace="""
            ids = block_tables[i].astype(np.int64)
            k = key_cache[ids].reshape(-1, num_kv_heads, head_dim)[:seq_len]
            v = value_cache[ids].reshape(-1, num_kv_heads, head_dim)[:seq_len]
        """,
        why="split-K decode gathers every table entry (its own gather, not _gather_sequence): "
        "the split-K tests' tables were padded with -1 only",
        caught_by="test_paged_attention.py::test_decode_ignores_table_padding",
    ),
    # -- probe of 2026-11-29 (2) ------------------------------------------------------------------
    Mutant(
        name="slots_multiplied_in_the_tables_int32",
        file=FILE,
        find="block_ids = block_table.astype(np.int64)[logical]",
        replace="block_ids = block_table[logical]",
        why="the slots are cast to int64 at the end, as the message said, but the int32 table's "
        "block id is multiplied by block_size before: past 2**31 it wraps (upstream's kernel "
        "widens the block ids first)",
        caught_by="test_cache_write.py::test_slot_mapping_keeps_shape",
    ),
    Mutant(
        name="decode_computed_in_the_inputs_dtype",
        file=FILE,
        find="        out[i] = dense_attention(query[i : i + 1], k, v, scale)[0]",
        replace="""
            group = num_heads // num_kv_heads
            q = query[i].reshape(num_kv_heads, group, head_dim)
            s = np.einsum("hgd,shd->hgs", q, k) * scale
            s = s - s.max(axis=-1, keepdims=True)
            p = np.exp(s)
            p /= p.sum(axis=-1, keepdims=True)
            out[i] = np.einsum("hgs,shd->hgd", p, v).reshape(num_heads, head_dim)
        """,
        why="decode's own softmax on the inputs as they come: float16 queries over a float16 "
        "cache are computed in float16, tens of ulps off (only the output's dtype was checked)",
        caught_by="test_paged_attention.py::test_decode_float32_inputs",
    ),
    Mutant(
        name="prefill_computed_in_the_inputs_dtype",
        file=FILE,
        find="    return dense_attention(query, k, v, scale, causal=True)",
        replace="""
            group = num_heads // num_kv_heads
            q = query.reshape(query_len, num_kv_heads, group, head_dim)
            s = np.einsum("qhgd,shd->hgqs", q, k) * scale
            pos = np.arange(query_len)[:, None] + context_len
            s = np.where(np.arange(k.shape[0])[None, :] <= pos, s, -np.inf)
            s = s - s.max(axis=-1, keepdims=True)
            p = np.exp(s)
            p /= p.sum(axis=-1, keepdims=True)
            out = np.einsum("hgqs,shd->qhgd", p, v)
            return out.reshape(query.shape).astype(query.dtype)
        """,
        why="prefill's own causal softmax in the inputs' dtype: a float16 chunk is computed in "
        "float16 (only the output's dtype was checked)",
        caught_by="test_paged_attention.py::test_prefill_float32_inputs",
    ),
    Mutant(
        name="split_k_query_scaled_in_its_dtype",
        file=FILE,
        find="                query[i],\n                k[j * per_split",
        replace="                query[i] * query.dtype.type(scale),\n                k[j * per_split",
        more=(
            (
                "                v[j * per_split : (j + 1) * per_split],\n                scale,",
                "                v[j * per_split : (j + 1) * per_split],\n                1.0,",
            ),
        ),
        why="the query scaled once, in its own float32, before the pieces: over a float64 cache "
        "every score is rounded to float32 first. The split-K test's scale was 0.5, which "
        "multiplies exactly; it is 0.35 now",
        caught_by="test_split_k.py::test_split_k_decode_float32",
    ),
    # -- helper probe, 2026-11-29 (s47) -----------------------------------------------------------
    Mutant(
        name="decode_reads_one_entry_past_a_full_block",
        file=FILE,
        find="""
            for i in range(num_seqs):
                k, v = _gather_sequence(key_cache, value_cache, block_tables[i], int(seq_lens[i]))
        """,
        replace="""
            for i in range(num_seqs):
                n, size = int(seq_lens[i]), key_cache.shape[1]
                ids = block_tables[i, : min(n // size + 1, block_tables.shape[1])].astype(np.int64)
                k = key_cache[ids].reshape(-1, num_kv_heads, head_dim)[:n]
                v = value_cache[ids].reshape(-1, num_kv_heads, head_dim)[:n]
        """,
        why="decode's own gather counts seq_len // block_size + 1 blocks, clamped to the table's "
        "width (so an exact-width table works): a sequence that fills its last block reads the "
        "next entry, padding, and an id far outside the cache raises",
        caught_by="test_paged_attention.py::test_decode_ignores_table_padding",
    ),
    Mutant(
        name="split_k_reads_one_entry_past_a_full_block",
        file=FILE,
        find="        k, v = _gather_sequence(key_cache, value_cache, block_tables[i], seq_len)",
        replace="""
            size = key_cache.shape[1]
            ids = block_tables[i, : min(seq_len // size + 1, block_tables.shape[1])].astype(np.int64)
            k = key_cache[ids].reshape(-1, num_kv_heads, head_dim)[:seq_len]
            v = value_cache[ids].reshape(-1, num_kv_heads, head_dim)[:seq_len]
        """,
        why="split-K decode's own gather, seq_len // block_size + 1 entries clamped to the "
        "width: the padding test's sequences (6 and 3 tokens) never filled a block, so the "
        "entry after a full last block was never an id outside the cache",
        caught_by="test_paged_attention.py::test_decode_ignores_table_padding",
    ),
    Mutant(
        name="merge_weights_in_partials_dtype",
        file=FILE,
        find="weights = np.exp(lse - top)  # exp(-inf) = 0: an empty split has no weight",
        replace="weights = np.exp(lse - top).astype(partial.dtype)",
        why="the merge's weights rounded to partial's dtype (\"the result in partial's dtype\" "
        'read as "computed in it"): float16 partials are summed in float16, several ulps off; '
        "every float16 merge tested had one real split, of weight exactly 1",
        caught_by="test_split_k.py::test_merge_splits_ignores_empty_splits",
    ),
    Mutant(
        name="merge_lse_cast_to_partials_dtype",
        file=FILE,
        find="top = lse.max(axis=0, keepdims=True)",
        replace="lse = lse.astype(partial.dtype)\ntop = lse.max(axis=0, keepdims=True)",
        why="the lse cast to partial's dtype before the merge: a float16 lse of 8 is only good "
        "to 1/128, so every float16 merge's weights are off by up to half a percent",
        caught_by="test_split_k.py::test_merge_splits_ignores_empty_splits",
    ),
    # -- mechanical sweep, 2026-11-29 (s49) -----------------------------------------------------
    Mutant(
        name="padding_positions_looked_up_at_entry_1",
        file=FILE,
        find="logical = np.where(valid, positions // block_size, 0)",
        replace="logical = np.where(valid, positions // block_size, 1)",
        why="parks padding positions on logical block 1 before the lookup, any stand-in being "
        "as good as another: through the one-entry table of a one-block sequence the lookup "
        "falls off the table (IndexError); every padded table tried had two entries or more",
        caught_by="test_cache_write.py::test_negative_positions_are_padding",
    ),
    Mutant(
        name="prefill_empty_chunk_returns_none",
        file=FILE,
        find="return np.empty_like(query)",
        replace="return None",
        why="a chunk of no tokens answered with None ('nothing to attend'): the output of "
        "[query_len, num_heads, head_dim] with query_len 0 is an empty array; no test sent an "
        "empty chunk",
        caught_by="test_paged_attention.py::test_prefill_after_a_cached_prefix",
    ),
]
