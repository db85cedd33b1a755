"""Buggy implementations of lab-04 (the Triton cache-write, decode and merge kernels).

Each mutant is one mistake a learner plausibly makes, written as an edit of the solution
(``grading.mutants.Mutant``). They are edits of ``@triton.jit`` code, so without a GPU they run
in Triton's interpreter like the learner's kernels do. ``python -m grading check-suites lab-04``
and ``tests/test_buggy_implementations.py`` check that the graded suite catches every one.
"""

from __future__ import annotations

from grading.mutants import Mutant

FILE = "triton_paged_attention.py"

MUTANTS = [
    # -- _reshape_and_cache_kernel ---------------------------------------------------------------
    Mutant(
        name="padding_slot_written",
        file=FILE,
        find="""
            if slot < 0:
                return  # padding token: leave the cache untouched
        """,
        replace="",
        why="no early return for padding: slot -1 is block -1 // 16 == 0, row -1 % 16 == -1 in "
        "Triton's C-style arithmetic, so a padding token is stored just before the cache",
        caught_by="test_cache_write.py::test_padding_slots_write_nothing",
    ),
    Mutant(
        name="cache_block_and_row_swapped",
        file=FILE,
        find="""
            block = slot // BLOCK_SIZE
            offset = slot % BLOCK_SIZE
        """,
        replace="""
            block = slot % BLOCK_SIZE
            offset = slot // BLOCK_SIZE
        """,
        why="slot // block_size and slot % block_size swapped: rows land in the wrong block at "
        "the wrong offset",
        caught_by="test_cache_write.py::test_cache_write_scatters_rows",
    ),
    Mutant(
        name="cache_write_ignores_the_tile_axis",
        file=FILE,
        find="idx = tl.program_id(1) * TILE + tl.arange(0, TILE)",
        replace="idx = tl.arange(0, TILE)",
        why="every program along grid axis 1 copies the first tile: rows wider than one tile "
        "(many KV heads x a large head_dim) are written only in part",
        caught_by="test_cache_write.py::test_cache_write_rows_wider_than_a_tile",
    ),
    Mutant(
        name="cache_write_slot_in_int32",
        file=FILE,
        find="slot = tl.load(slot_mapping_ptr + token).to(tl.int64)",
        replace="slot = tl.load(slot_mapping_ptr + token).to(tl.int32)",
        why="keeps the slot in int32: block * stride_kc_blk wraps past 2**31 elements (a cache of "
        "4 GiB of fp16) and the row is stored far before the cache",
        caught_by="test_decode.py::test_write_then_decode",
    ),
    Mutant(
        name="slot_zero_taken_for_padding",
        file=FILE,
        find="""
            if slot < 0:
                return  # padding token: leave the cache untouched
        """,
        replace="""
            if slot <= 0:
                return  # padding token: leave the cache untouched
        """,
        why="off-by-one in the padding test: slot 0 (block 0, row 0) is a real slot, but its "
        "token is skipped and the cache keeps what was there",
        caught_by="test_cache_write.py::test_cache_write_scatters_rows",
    ),
    Mutant(
        name="key_read_as_contiguous",
        file=FILE,
        find="k = tl.load(key_ptr + token * stride_key_tok + head * stride_key_head + dim, mask=mask)",
        replace="k = tl.load(key_ptr + token * NUM_KV_HEADS * HEAD_DIM + idx, mask=mask)",
        why="addresses the key as a contiguous [tokens, kv_heads, head_dim] tensor instead of "
        "through its strides: keys sliced out of a fused QKV projection are read from the "
        "wrong columns (the launcher keeps such views as they are)",
        caught_by="test_cache_write.py::test_cache_write_bf16_from_a_fused_projection",
    ),
    Mutant(
        name="key_stored_into_value_cache",
        file=FILE,
        find="tl.store(v_dst + dim, v, mask=mask)",
        replace="tl.store(v_dst + dim, k, mask=mask)",
        why="copy-paste slip: the key row is stored into both caches",
        caught_by="test_cache_write.py::test_cache_write_scatters_rows",
    ),
    Mutant(
        name="value_read_with_key_strides",
        file=FILE,
        find="v = tl.load(value_ptr + token * stride_value_tok + head * stride_value_head + dim, mask=mask)",
        replace="v = tl.load(value_ptr + token * stride_key_tok + head * stride_key_head + dim, mask=mask)",
        why="copy-paste slip: the value rows are addressed through the key's strides; right only "
        "while key and value happen to share a layout (a head-major value tensor does not)",
        caught_by="test_cache_write.py::test_cache_write_bf16_from_a_fused_projection",
    ),
    Mutant(
        name="value_cache_with_key_cache_strides",
        file=FILE,
        find="v_dst = value_cache_ptr + block * stride_vc_blk + offset * stride_vc_tok + head * stride_vc_head",
        replace="v_dst = value_cache_ptr + block * stride_kc_blk + offset * stride_kc_tok + head * stride_kc_head",
        why="copy-paste slip: the value cache is addressed through the key cache's strides, so a "
        "value cache with its own layout (a head slice of a wider cache) gets rows in wrong slots",
        caught_by="test_cache_write.py::test_cache_write_bf16_from_a_fused_projection",
    ),
    Mutant(
        name="cache_block_stride_from_the_token_stride",
        file=FILE,
        find="""
            k_dst = key_cache_ptr + block * stride_kc_blk + offset * stride_kc_tok + head * stride_kc_head
            v_dst = value_cache_ptr + block * stride_vc_blk + offset * stride_vc_tok + head * stride_vc_head
        """,
        replace="""
            k_dst = key_cache_ptr + (block * BLOCK_SIZE + offset) * stride_kc_tok + head * stride_kc_head
            v_dst = value_cache_ptr + (block * BLOCK_SIZE + offset) * stride_vc_tok + head * stride_vc_head
        """,
        why="the cache addressed as a flat [slots, heads, dim] array, slot * the token stride: "
        "right for a contiguous cache, wrong for one sliced out of a larger tensor (the K half "
        "of a [blocks, 2, ...] cache), whose blocks are stride_kc_blk apart",
        caught_by="test_cache_write.py::test_cache_write_bf16_from_a_fused_projection",
    ),
    # -- _paged_decode_kernel: addressing ----------------------------------------------------------
    Mutant(
        name="gqa_head_modulo",
        file=FILE,
        find="heads = kv_head * QUERIES_PER_KV + offs_g",
        replace="heads = offs_g * tl.num_programs(1) + kv_head",
        why="the program of KV head j serves query heads j, j + num_kv_heads, ...: query head h "
        "reads KV head h % num_kv_heads instead of h // group",
        caught_by="test_decode.py::test_decode_one_sequence",
    ),
    Mutant(
        name="block_table_row_stride_ignored",
        file=FILE,
        find="table = block_tables_ptr + seq.to(tl.int64) * stride_bt_seq",
        replace="table = block_tables_ptr + seq.to(tl.int64)",
        why="forgets the table's row stride: sequence i reads its block ids from row 0, "
        "starting i entries in, i.e. another sequence's blocks",
        caught_by="test_decode.py::test_decode_blocks_smaller_than_a_tile",
    ),
    Mutant(
        name="tile_row_off_by_one",
        file=FILE,
        find="in_block = start % BLOCK_SIZE + offs_t",
        replace="in_block = start % BLOCK_SIZE + offs_t + 1",
        why="off-by-one in the block offset when a tile lies inside one block: every token reads "
        "the next token's K/V row",
        caught_by="test_decode.py::test_decode_blocks_larger_than_a_tile",
    ),
    Mutant(
        name="token_row_off_by_one",
        file=FILE,
        find="in_block = offs_n % BLOCK_SIZE",
        replace="in_block = (offs_n + 1) % BLOCK_SIZE",
        why="off-by-one in the block offset when a tile spans blocks: positions counted from 1",
        caught_by="test_decode.py::test_decode_one_sequence",
    ),
    Mutant(
        name="tile_assumed_inside_one_block",
        file=FILE,
        find="if BLOCK_SIZE >= BLOCK_N:",
        replace="if True:",
        why="always one table entry per tile: with blocks smaller than the tile, the tile's "
        "later tokens are read from whatever physical blocks follow the first one",
        caught_by="test_decode.py::test_decode_one_sequence",
    ),
    Mutant(
        name="no_mask_past_seq_len",
        file=FILE,
        find='s = tl.where(n_mask[None, :], s * qk_scale, float("-inf"))',
        replace="s = s * qk_scale",
        why="positions past seq_len keep score 0 (their K loads are masked to 0) instead of -inf: "
        "they take softmax weight and dilute the output",
        caught_by="test_decode.py::test_decode_one_sequence",
    ),
    Mutant(
        name="mask_fill_finite_minus_1e4",
        file=FILE,
        find='s = tl.where(n_mask[None, :], s * qk_scale, float("-inf"))',
        replace="s = tl.where(n_mask[None, :], s * qk_scale, -10000.0)",
        why="masked_fill(-10000) borrowed from attention-mask code (or fp16's -65504): right "
        "while real scores are larger, but where every real score is below it the positions "
        "past seq_len take all the weight",
        caught_by="test_decode.py::test_decode_masks_past_seq_len",
    ),
    Mutant(
        name="table_indexed_by_tile",
        file=FILE,
        find="block = tl.load(table + start // BLOCK_SIZE).to(tl.int64)",
        replace="block = tl.load(table + tile).to(tl.int64)",
        why="the table is indexed by the tile number instead of the block number: right only when "
        "tiles and blocks have the same size; with blocks of 64 and tiles of 32 the second tile "
        "reads the next block",
        caught_by="test_decode.py::test_decode_blocks_larger_than_a_tile",
    ),
    Mutant(
        name="value_rows_with_key_strides",
        file=FILE,
        find="v_rows = block * stride_v_blk + in_block * stride_v_tok",
        replace="v_rows = block * stride_k_blk + in_block * stride_k_tok",
        why="copy-paste slip: V rows addressed through the key cache's strides; right only while "
        "both caches share a layout",
        caught_by="test_decode.py::test_decode_random_batches",
    ),
    Mutant(
        name="head_dim_mask_against_padded_width",
        file=FILE,
        find="""
            d_mask = offs_d < HEAD_DIM
            heads = kv_head * QUERIES_PER_KV + offs_g
        """,
        replace="""
            d_mask = offs_d < HEAD_DIM_PAD
            heads = kv_head * QUERIES_PER_KV + offs_g
        """,
        why="the head_dim mask compares against the padded width: with a head_dim that is not a "
        "power of two the program reads the next head's columns and stores past each row",
        caught_by="test_decode.py::test_decode_random_batches",
    ),
    Mutant(
        name="output_store_not_masked_to_the_group",
        file=FILE,
        find="o_mask = g_mask[:, None] & d_mask[None, :]",
        replace="o_mask = d_mask[None, :]",
        why="all GROUP_PAD rows are stored: the padded rows overwrite the next group's (or the next "
        "sequence's) outputs, a race on a GPU",
        caught_by="test_decode.py::test_decode_gqa_groups",
    ),
    Mutant(
        name="value_loaded_past_seq_len",
        file=FILE,
        find="v = tl.load(v_base + v_rows[:, None], mask=kv_mask, other=0.0)",
        replace="v = tl.load(v_base + v_rows[:, None], mask=d_mask[None, :], other=0.0)",
        why="V rows past seq_len are loaded since their p is 0 anyway; but a cache's unused slots "
        "hold whatever was there, and 0 * inf (or nan) is nan",
        caught_by="test_decode.py::test_decode_masks_past_seq_len",
    ),
    Mutant(
        name="decode_block_stride_from_the_token_stride",
        file=FILE,
        find="""
            k_rows = block * stride_k_blk + in_block * stride_k_tok
            v_rows = block * stride_v_blk + in_block * stride_v_tok
        """,
        replace="""
            k_rows = (block * BLOCK_SIZE + in_block) * stride_k_tok
            v_rows = (block * BLOCK_SIZE + in_block) * stride_v_tok
        """,
        why="blocks taken as block_size token rows apart (the tile-in-one-block path): right "
        "for a contiguous cache only; a cache sliced out of a larger one has its own block stride",
        caught_by="test_decode.py::test_decode_random_batches",
    ),
    Mutant(
        name="decode_block_stride_from_the_token_stride_per_token",
        file=FILE,
        find="""
            k_rows = blocks * stride_k_blk + in_block * stride_k_tok
            v_rows = blocks * stride_v_blk + in_block * stride_v_tok
        """,
        replace="""
            k_rows = (blocks * BLOCK_SIZE + in_block) * stride_k_tok
            v_rows = (blocks * BLOCK_SIZE + in_block) * stride_v_tok
        """,
        why="the same in the per-token path (blocks smaller than a tile): blocks taken as "
        "block_size token rows apart instead of stride_k_blk / stride_v_blk",
        caught_by="test_decode.py::test_decode_random_batches",
    ),
    Mutant(
        name="query_assumed_contiguous",
        file=FILE,
        find="q_ptr + seq.to(tl.int64) * stride_q_seq + heads[:, None] * stride_q_head + offs_d[None, :],",
        replace="q_ptr + seq.to(tl.int64) * (tl.num_programs(1) * QUERIES_PER_KV * HEAD_DIM) + heads[:, None] * stride_q_head + offs_d[None, :],",
        why="the query's sequence stride computed as num_heads * head_dim: the engine's query is "
        "a view of its fused QKV projection (rows of (heads + 2 * kv_heads) * head_dim), so "
        "every sequence after the first reads another token's values",
        caught_by="test_decode.py::test_decode_random_batches",
    ),
    Mutant(
        name="merge_output_assumed_contiguous",
        file=FILE,
        find="out_ptr + seq * stride_o_seq + head * stride_o_head + offs_d,",
        replace="out_ptr + (seq * tl.num_programs(1) + head) * HEAD_DIM + offs_d,",
        why="the merge addresses out as a contiguous [seqs, heads, head_dim] tensor instead of "
        "through stride_o_seq / stride_o_head: an out= view with wider rows is written in the "
        "wrong places",
        caught_by="test_decode.py::test_decode_random_batches",
    ),
    # -- _paged_decode_kernel: split boundaries ----------------------------------------------------
    Mutant(
        name="split_share_counted_in_tokens",
        file=FILE,
        find="""
            num_tiles = tl.cdiv(seq_len, BLOCK_N)
            tiles_per_split = tl.cdiv(num_tiles, num_splits)
            tile_lo = split * tiles_per_split
            tile_hi = tl.minimum(tile_lo + tiles_per_split, num_tiles)
        """,
        replace="""
            per_split = tl.cdiv(seq_len, num_splits)
            tok_lo = split * per_split
            tok_hi = tl.minimum(tok_lo + per_split, seq_len)
        """,
        more=(
            (
                """
                for tile in range(tile_lo, tile_hi):
                    start = tile * BLOCK_N
                    offs_n = start + offs_t
                    n_mask = offs_n < seq_len
                """,
                """
                for start in range(tok_lo, tok_hi, BLOCK_N):
                    offs_n = start + offs_t
                    n_mask = offs_n < tok_hi
                """,
            ),
        ),
        why="each split takes cdiv(seq_len, num_splits) tokens, as flash-decoding ports do: "
        "exact with one table entry per token, but with blocks as large as the tile a split "
        "starts mid-tile and its tiles run past their block into the next one in memory",
        caught_by="test_decode.py::test_decode_split_k_is_exact",
    ),
    Mutant(
        name="split_share_rounded_down",
        file=FILE,
        find="tiles_per_split = tl.cdiv(num_tiles, num_splits)",
        replace="tiles_per_split = num_tiles // num_splits",
        why="each split's share is rounded down: the last num_tiles % num_splits tiles belong to "
        "no split (and with more splits than tiles nothing is read)",
        caught_by="test_decode.py::test_decode_split_k_is_exact",
    ),
    Mutant(
        name="split_end_off_by_one",
        file=FILE,
        find="tile_hi = tl.minimum(tile_lo + tiles_per_split, num_tiles)",
        replace="tile_hi = tl.minimum(tile_lo + tiles_per_split - 1, num_tiles)",
        why="inclusive/exclusive confusion in the split's range: its last tile is skipped",
        caught_by="test_decode.py::test_decode_one_sequence",
    ),
    # -- _paged_decode_kernel: online softmax ------------------------------------------------------
    Mutant(
        name="softmax_without_max_subtraction",
        file=FILE,
        find="m_new = tl.maximum(m_i, tl.max(s, 1))",
        replace="m_new = tl.zeros([GROUP_PAD], dtype=tl.float32)",
        why="exp2 of raw scores: scores of a few hundred (log2 units above 128) overflow float32 "
        "to inf, and inf / inf = nan",
        caught_by="test_decode.py::test_decode_large_logits_fp16",
    ),
    Mutant(
        name="exp_instead_of_exp2",
        file=FILE,
        find="p = tl.exp2(s - m_new[:, None])",
        replace="p = tl.exp(s - m_new[:, None])",
        why="qk_scale already holds log2(e): using exp on base-2 scores applies the wrong "
        "temperature (and disagrees with the exp2 rescaling of acc and l)",
        caught_by="test_decode.py::test_decode_one_sequence",
    ),
    Mutant(
        name="accumulator_not_rescaled",
        file=FILE,
        find="acc = acc * alpha[:, None] + pv",
        replace="acc = acc + pv",
        why="when a tile raises the running max, the old accumulator keeps its old scale: earlier "
        "tiles are overweighted",
        caught_by="test_decode.py::test_decode_blocks_larger_than_a_tile",
    ),
    Mutant(
        name="sum_not_rescaled",
        file=FILE,
        find="l_i = l_i * alpha + tl.sum(p, 1)",
        replace="l_i = l_i + tl.sum(p, 1)",
        why="the running softmax sum is not rescaled when the max grows: the normaliser is wrong",
        caught_by="test_decode.py::test_decode_blocks_larger_than_a_tile",
    ),
    Mutant(
        name="running_max_starts_at_zero",
        file=FILE,
        find='m_i = tl.full([GROUP_PAD], float("-inf"), dtype=tl.float32)',
        replace="m_i = tl.zeros([GROUP_PAD], dtype=tl.float32)",
        why="the running max starts at 0 instead of -inf: when every score of a row is far below "
        "0, exp2(score - 0) underflows to 0 everywhere and the output is 0",
        caught_by="test_decode.py::test_decode_large_logits_fp16",
    ),
    Mutant(
        name="empty_split_divides_by_zero",
        file=FILE,
        find="out = acc / l_safe[:, None]",
        replace="out = acc / l_i[:, None]",
        why="an empty split (more splits than tiles) computes 0 / 0 = nan, which the merge "
        "multiplies by weight 0 and still gets nan",
        caught_by="test_decode.py::test_decode_split_k_is_exact",
    ),
    Mutant(
        name="lse_without_running_max",
        file=FILE,
        find='lse = tl.where(nonempty, m_i + tl.log2(l_safe), float("-inf"))',
        replace='lse = tl.where(nonempty, tl.log2(l_safe), float("-inf"))',
        why="the split's log-sum-exp forgets the max its sum was shifted by: splits are weighted "
        "as if all had the same maximum score",
        caught_by="test_decode.py::test_decode_split_k_is_exact",
    ),
    Mutant(
        name="decode_block_ids_times_stride_in_int32",
        file=FILE,
        find="blocks = tl.load(table + offs_n // BLOCK_SIZE, mask=n_mask, other=0).to(tl.int64)",
        replace="blocks = tl.load(table + offs_n // BLOCK_SIZE, mask=n_mask, other=0)",
        why="multiplies the block ids of an int32 table by the block stride in int32: the "
        "offset wraps past 2**31 elements (a cache of 4 GiB of fp16), and the load reads far "
        "before the cache",
        caught_by="test_decode.py::test_write_then_decode",
    ),
    Mutant(
        name="decode_tile_block_id_times_stride_in_int32",
        file=FILE,
        find="block = tl.load(table + start // BLOCK_SIZE).to(tl.int64)",
        replace="block = tl.load(table + start // BLOCK_SIZE)",
        why="the same int32 wrap on the one-entry-per-tile path (blocks as large as a tile)",
        caught_by="test_decode.py::test_write_then_decode",
    ),
    # -- _merge_splits_kernel ------------------------------------------------------------------------
    Mutant(
        name="merge_max_of_the_first_split",
        file=FILE,
        find="lse_max = tl.max(lse, 0)\n",
        replace='lse_max = tl.max(tl.where(offs_s == 0, lse, float("-inf")), 0)\n',
        why="shifts every weight by the first split's lse, not the largest: a later split whose "
        "scores are hundreds higher overflows 2**(lse - lse_0) to inf",
        caught_by="test_decode.py::test_decode_large_logits_fp16",
    ),
    Mutant(
        name="merge_without_max_subtraction",
        file=FILE,
        find="weight = tl.exp2(lse - lse_max)",
        replace="weight = tl.exp2(lse)",
        why="merge weights 2**lse without subtracting the largest lse: overflows to inf when "
        "scores are large (inf / inf = nan)",
        caught_by="test_decode.py::test_decode_large_logits_fp16",
    ),
    Mutant(
        name="merge_plain_average",
        file=FILE,
        find="weight = tl.exp2(lse - lse_max)",
        replace='weight = tl.where(lse > float("-inf"), 1.0, 0.0)',
        why="averages the non-empty splits' partial outputs: a split's weight must be its share "
        "of the softmax sum, 2**lse_i / sum 2**lse_j",
        caught_by="test_decode.py::test_decode_split_k_is_exact",
    ),
    Mutant(
        name="merge_store_not_masked_to_head_dim",
        file=FILE,
        find="""
                out.to(out_ptr.dtype.element_ty),
                mask=d_mask,
            )
        """,
        replace="""
                out.to(out_ptr.dtype.element_ty),
            )
        """,
        why="the merge stores all HEAD_DIM_PAD columns: with a head_dim that is not a power of two "
        "they spill into the next head's output (a race on a GPU) and past the output's end",
        caught_by="test_decode.py::test_decode_random_batches",
    ),
    Mutant(
        name="merge_head_dim_mask_against_padded_width",
        file=FILE,
        find="""
            d_mask = offs_d < HEAD_DIM
            lse = tl.load(
        """,
        replace="""
            d_mask = offs_d < HEAD_DIM_PAD
            lse = tl.load(
        """,
        why="the merge's head_dim mask compares against the padded width: it reads the next "
        "split's columns and stores past each head's row",
        caught_by="test_decode.py::test_decode_random_batches",
    ),
    Mutant(
        name="cache_write_heads_assumed_contiguous",
        file=FILE,
        find="""
            k_dst = key_cache_ptr + block * stride_kc_blk + offset * stride_kc_tok + head * stride_kc_head
            v_dst = value_cache_ptr + block * stride_vc_blk + offset * stride_vc_tok + head * stride_vc_head
            tl.store(k_dst + dim, k, mask=mask)
            tl.store(v_dst + dim, v, mask=mask)
        """,
        replace="""
            k_dst = key_cache_ptr + block * stride_kc_blk + offset * stride_kc_tok
            v_dst = value_cache_ptr + block * stride_vc_blk + offset * stride_vc_tok
            tl.store(k_dst + idx, k, mask=mask)
            tl.store(v_dst + idx, v, mask=mask)
        """,
        why="the cache write addresses a token's heads as one contiguous row (idx = head * "
        "head_dim + dim), ignoring stride_kc_head: a cache whose heads are wider than head_dim "
        "in memory (a slice of a larger one) gets its rows in the wrong columns",
        caught_by="test_cache_write.py::test_cache_write_bf16_from_a_fused_projection",
    ),
    Mutant(
        name="decode_key_head_stride_assumed",
        file=FILE,
        find="k_base = k_cache_ptr + kv_head * stride_k_head + offs_d[None, :]",
        replace="k_base = k_cache_ptr + kv_head * HEAD_DIM + offs_d[None, :]",
        why="the decode steps between the key cache's heads by head_dim instead of "
        "stride_k_head: right for a contiguous cache, wrong for a key cache sliced out of a "
        "wider one",
        caught_by="test_decode.py::test_decode_random_batches",
    ),
    # (The launchers are given and never graded: the suite runs the kernels through its own.)
    Mutant(
        name="cache_write_key_read_as_one_row",
        file=FILE,
        find="    k = tl.load(key_ptr + token * stride_key_tok + head * stride_key_head + dim, "
        "mask=mask)\n",
        replace="    k = tl.load(key_ptr + token * stride_key_tok + idx, mask=mask)\n",
        why="reads a token's keys as one contiguous row: keys sliced from a fused projection "
        "whose heads are wider than head_dim are read from the wrong columns",
        caught_by="test_cache_write.py::test_cache_write_bf16_from_a_fused_projection",
    ),
    Mutant(
        name="cache_write_value_heads_head_dim_apart",
        file=FILE,
        find="    v_dst = value_cache_ptr + block * stride_vc_blk + offset * stride_vc_tok + "
        "head * stride_vc_head\n",
        replace="    v_dst = value_cache_ptr + block * stride_vc_blk + offset * stride_vc_tok + "
        "head * HEAD_DIM\n",
        why="places the value cache's heads head_dim apart: a value cache whose heads are "
        "wider in memory gets its second head written over the first one's padding",
        caught_by="test_cache_write.py::test_cache_write_bf16_from_a_fused_projection",
    ),
    Mutant(
        name="cache_write_value_slot_with_the_values_token_stride",
        file=FILE,
        find="    v_dst = value_cache_ptr + block * stride_vc_blk + offset * stride_vc_tok + "
        "head * stride_vc_head\n",
        replace="    v_dst = value_cache_ptr + block * stride_vc_blk + offset * stride_value_tok + "
        "head * stride_vc_head\n",
        why="steps through the value cache's rows with the values' token stride: right only "
        "while the two happen to be equal",
        caught_by="test_cache_write.py::test_cache_write_bf16_from_a_fused_projection",
    ),
    Mutant(
        name="output_heads_at_the_querys_head_stride",
        file=FILE,
        find="        tl.store(o_ptrs + offs_d[None, :], out.to(out_ptr.dtype.element_ty), "
        "mask=o_mask)\n",
        replace="        tl.store(\n"
        "            out_ptr + seq.to(tl.int64) * stride_o_seq + heads[:, None] * stride_q_head\n"
        "            + offs_d[None, :],\n"
        "            out.to(out_ptr.dtype.element_ty),\n"
        "            mask=o_mask,\n"
        "        )\n",
        why="addresses the output's heads with the query's head stride: an out= whose rows "
        "are laid out differently from the query's gets its heads in the wrong places",
        caught_by="test_decode.py::test_decode_random_batches",
    ),
    Mutant(
        name="output_stored_through_the_cache_dtype",
        file=FILE,
        find="        tl.store(o_ptrs + offs_d[None, :], out.to(out_ptr.dtype.element_ty), "
        "mask=o_mask)\n",
        replace="        tl.store(o_ptrs + offs_d[None, :], out.to(k_cache_ptr.dtype.element_ty), "
        "mask=o_mask)\n",
        why="rounds the output to the cache dtype before storing it: a float32 query over "
        "fp16 caches gets an fp16-rounded float32 output",
        caught_by="test_decode.py::test_decode_half_precision",
    ),
    Mutant(
        name="partial_stored_in_the_cache_dtype",
        file=FILE,
        find="        tl.store(o_ptrs + split * stride_o_split + offs_d[None, :], out, "
        "mask=o_mask)\n",
        replace="        tl.store(\n"
        "            o_ptrs + split * stride_o_split + offs_d[None, :],\n"
        "            out.to(k_cache_ptr.dtype.element_ty),\n"
        "            mask=o_mask,\n"
        "        )\n",
        why="rounds each split's partial to the cache dtype: the partials are float32, and "
        "the merge of rounded partials loses that precision",
        caught_by="test_decode.py::test_decode_half_precision",
    ),
    Mutant(
        name="kv_columns_past_head_dim_loaded",
        file=FILE,
        find="        kv_mask = n_mask[:, None] & d_mask[None, :]\n",
        replace="        kv_mask = n_mask[:, None]\n",
        why="loads K and V rows past head_dim: whatever lies beside a narrower head (an inf "
        "in a wider cache's padding) reaches the dot as 0 x inf = nan",
        caught_by="test_decode.py::test_decode_random_batches",
    ),
    Mutant(
        name="query_columns_past_head_dim_loaded",
        file=FILE,
        find="""
                mask=g_mask[:, None] & d_mask[None, :],
                other=0.0,
            ).to(k_cache_ptr.dtype.element_ty)
        """,
        replace="""
                mask=g_mask[:, None],
                other=0.0,
            ).to(k_cache_ptr.dtype.element_ty)
        """,
        why="loads the query's columns past head_dim: a query sliced from a wider projection "
        "brings its neighbours' values (an inf there makes the scores nan)",
        caught_by="test_decode.py::test_decode_random_batches",
    ),
    Mutant(
        name="ieee_dot_without_the_float32_cast",
        file=FILE,
        find='s = tl.dot(q.to(tl.float32), tl.trans(k.to(tl.float32)), input_precision="ieee")',
        replace='s = tl.dot(q, tl.trans(k), input_precision="ieee")',
        why="IEEE_DOT read as the precision flag alone: the operands stay bf16, which the "
        "interpreter's tl.dot gets wrong by orders of magnitude (found by a blind "
        "implementation; on a GPU the flag is only set for fp32 caches, where it is harmless)",
        caught_by="test_decode.py::test_decode_half_precision",
    ),
    Mutant(
        name="table_load_not_masked_past_seq_len",
        file=FILE,
        find="blocks = tl.load(table + offs_n // BLOCK_SIZE, mask=n_mask, other=0).to(tl.int64)",
        replace="blocks = tl.load(table + offs_n // BLOCK_SIZE).to(tl.int64)",
        why="the per-token table load is left unmasked because the K/V loads are masked: the "
        "last tile reads table entries past the sequence's blocks, past the table's end for the "
        "last sequence (no number changes; the read is out of bounds: caught in the interpreter, "
        "as a GPU does not trap a read just past an allocation)",
        caught_by="test_decode.py::test_decode_reads_nothing_past_its_inputs",
    ),
    Mutant(
        name="query_rows_past_the_group_loaded",
        file=FILE,
        find="""
                mask=g_mask[:, None] & d_mask[None, :],
                other=0.0,
            ).to(k_cache_ptr.dtype.element_ty)
        """,
        replace="""
                mask=d_mask[None, :],
                other=0.0,
            ).to(k_cache_ptr.dtype.element_ty)
        """,
        why="only the columns are masked in the query load: the padded rows past the group read "
        "the next group's queries, and past the query's end for the last KV head (their outputs "
        "are masked, so no number changes; caught in the interpreter, not on a GPU)",
        caught_by="test_decode.py::test_decode_reads_nothing_past_its_inputs",
    ),
    Mutant(
        name="cache_write_loads_not_masked",
        file=FILE,
        find="k = tl.load(key_ptr + token * stride_key_tok + head * stride_key_head + dim, mask=mask)",
        replace="k = tl.load(key_ptr + token * stride_key_tok + head * stride_key_head + dim)",
        more=[
            (
                "v = tl.load(value_ptr + token * stride_value_tok + head * stride_value_head + dim, mask=mask)",
                "v = tl.load(value_ptr + token * stride_value_tok + head * stride_value_head + dim)",
            )
        ],
        why="only the stores are masked: a tile wider than the token's row (3 heads of 16 in a "
        "tile of 64) loads past it, past the keys' end for the last token (caught in the "
        "interpreter, not on a GPU)",
        caught_by="test_cache_write.py::test_cache_write_reads_nothing_past_its_inputs",
    ),
]
