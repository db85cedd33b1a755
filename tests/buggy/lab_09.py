"""Buggy implementations of lab-09 (the model runner's input preparation).

Each mutant is one mistake a learner plausibly makes, written as an edit of the solution
(``grading.mutants.Mutant``). ``python -m grading check-suites lab-09`` and
``tests/test_buggy_implementations.py`` check that the graded suite catches every one of them.
"""

from __future__ import annotations

from grading.mutants import Mutant

FILE = "model_inputs.py"

MUTANTS = [
    # -- helpers ---------------------------------------------------------------------------------
    Mutant(
        name="arange_not_restarted_per_request",
        file=FILE,
        find="return cu_num_tokens, np.arange(total, dtype=np.int64) - request_starts",
        replace="return cu_num_tokens, np.arange(total, dtype=np.int64)",
        why="the offsets run on across requests ([0 1 2 3 ...] instead of [0 1 0 1 2 ...]): "
        "every request after the first gets positions shifted by its neighbours' tokens",
        caught_by="test_prepare_inputs.py::test_get_cumsum_and_arange",
    ),
    Mutant(
        name="arange_from_a_fixed_size_table",
        file=FILE,
        find="return cu_num_tokens, np.arange(total, dtype=np.int64) - request_starts",
        replace="return cu_num_tokens, _ARANGE[:total] - request_starts",
        more=(
            (
                "def _get_cumsum_and_arange(",
                """
                _ARANGE = np.arange(8192, dtype=np.int64)  # made once, at import


                def _get_cumsum_and_arange(
                """,
            ),
        ),
        why="the offsets sliced from an arange made once at import (upstream sizes its own from "
        "the engine's limits): a step of more tokens than the table holds fails",
        caught_by="test_prepare_inputs.py::test_get_cumsum_and_arange",
    ),
    Mutant(
        name="block_table_padded_with_a_real_block",
        file=FILE,
        find="block_tables = np.zeros((len(block_ids), width), dtype=np.int32)",
        replace="block_tables = np.ones((len(block_ids), width), dtype=np.int32)",
        why="pads short rows with block 1, a real block that belongs to some request, instead "
        "of the null block 0",
        caught_by="test_prepare_inputs.py::test_make_block_tables_pads_with_the_null_block",
    ),
    Mutant(
        name="block_table_padded_with_minus_one",
        file=FILE,
        find="block_tables = np.zeros((len(block_ids), width), dtype=np.int32)",
        replace="block_tables = np.full((len(block_ids), width), -1, dtype=np.int32)",
        why="pads with -1: a kernel that loads a table entry before masking indexes out of bounds",
        caught_by="test_prepare_inputs.py::test_make_block_tables_pads_with_the_null_block",
    ),
    Mutant(
        name="block_table_int64",
        file=FILE,
        find="block_tables = np.zeros((len(block_ids), width), dtype=np.int32)",
        replace="block_tables = np.zeros((len(block_ids), width), dtype=np.int64)",
        why="int64 block tables: twice the bytes copied to the GPU each step, and not the dtype "
        "the kernels are written for",
        caught_by="test_prepare_inputs.py::test_make_block_tables_pads_with_the_null_block",
    ),
    Mutant(
        name="block_table_full_row_refused",
        file=FILE,
        find="if (lens > width).any():",
        replace="if (lens >= width).any():",
        why="refuses a row exactly as wide as the table (>= instead of >): the widest request "
        "of every step, whose row sets the default width, is refused",
        caught_by="test_prepare_inputs.py::test_make_block_tables_pads_with_the_null_block",
    ),
    Mutant(
        name="slot_block_index_and_offset_swapped",
        file=FILE,
        find="block_numbers = block_tables[req_indices, positions // block_size].astype(np.int64)",
        replace="block_numbers = block_tables[req_indices, positions % block_size].astype(np.int64)",
        why="looks the block up by the offset inside it instead of by pos // block_size",
        caught_by="test_prepare_inputs.py::test_compute_slot_mapping",
    ),
    Mutant(
        name="slot_without_block_size_factor",
        file=FILE,
        find="return block_numbers * block_size + positions % block_size",
        replace="return block_numbers + positions % block_size",
        why="adds the block id and the offset without scaling the block id to its first slot: "
        "blocks overlap",
        caught_by="test_prepare_inputs.py::test_compute_slot_mapping",
    ),
    Mutant(
        name="slot_multiplied_in_int32",
        file=FILE,
        find="block_numbers = block_tables[req_indices, positions // block_size].astype(np.int64)",
        replace="block_numbers = block_tables[req_indices, positions // block_size]",
        why="multiplies the int32 block ids before widening: the result is int64 (positions "
        "are), but block_id * block_size has already wrapped past 2**31",
        caught_by="test_prepare_inputs.py::test_compute_slot_mapping",
    ),
    # -- prepare_inputs --------------------------------------------------------------------------
    Mutant(
        name="query_start_loc_not_cumulative",
        file=FILE,
        find="query_start_loc = np.concatenate(([0], cu_num_tokens))",
        replace="query_start_loc = np.concatenate(([0], scheduled))",
        why="stores each request's token count instead of the running total: request i's "
        "tokens are not at qsl[i]:qsl[i+1]",
        caught_by="test_prepare_inputs.py::test_query_start_loc_and_logits_indices",
    ),
    Mutant(
        name="positions_off_by_one",
        file=FILE,
        find="positions = computed[req_indices] + query_pos",
        replace="positions = computed[req_indices] + query_pos + 1",
        why="counts positions from 1: every key is rotated (RoPE) one step too far and written "
        "one slot late",
        caught_by="test_prepare_inputs.py::test_positions_start_at_the_computed_offset",
    ),
    Mutant(
        name="prefix_hits_not_skipped",
        file=FILE,
        find="""
            positions = computed[req_indices] + query_pos

            # Each request's tokens [computed, seq_len) of its own list, read straight into one array.
            # The bounds are converted to Python ints once: slicing a list with numpy scalars is slower,
            # and so is making one small array per request to concatenate.
            starts, ends = computed.tolist(), seq_lens.tolist()
        """,
        replace="""
            start = np.where(scheduled > 1, 0, computed)  # a prompt runs from its first token
            positions = start[req_indices] + query_pos

            starts, ends = start.tolist(), (start + scheduled).tolist()
        """,
        why="treats every multi-token step as a fresh prompt from position 0: a prefix-cache "
        "hit or an earlier chunk is recomputed over (and its tail never runs)",
        caught_by="test_prepare_inputs.py::test_input_ids_skip_cached_tokens",
    ),
    Mutant(
        name="decode_token_taken_from_the_prompt",
        file=FILE,
        find="tokens[start:end] for tokens, start, end in zip(token_ids, starts, ends)",
        replace="tokens[: end - start] for tokens, start, end in zip(token_ids, starts, ends)",
        why="takes the first tokens of the sequence instead of those after the computed ones: "
        "a decode feeds the prompt's first token instead of the one sampled last",
        caught_by="test_prepare_inputs.py::test_input_ids_skip_cached_tokens",
    ),
    Mutant(
        name="slots_from_the_offset_in_the_step",
        file=FILE,
        find="slot_mapping = compute_slot_mapping(block_tables, req_indices, positions, block_size)",
        replace="slot_mapping = compute_slot_mapping(block_tables, req_indices, query_pos, block_size)",
        why="uses the token's index inside this step instead of its position: a decode writes "
        "its K/V over slot 0 of the request's first block",
        caught_by="test_prepare_inputs.py::test_slot_mapping_of_the_mixed_batch",
    ),
    Mutant(
        name="seq_lens_missing_the_context",
        file=FILE,
        find="seq_lens=torch.from_numpy(seq_lens.astype(np.int32)),",
        replace="seq_lens=torch.from_numpy(scheduled.astype(np.int32)),",
        why="reports only this step's tokens as the sequence length: attention never sees the "
        "cached context",
        caught_by="test_prepare_inputs.py::test_seq_lens_include_the_context",
    ),
    Mutant(
        name="logits_of_the_first_token",
        file=FILE,
        find="logits_indices=torch.from_numpy(cu_num_tokens - 1),",
        replace="logits_indices=torch.from_numpy(cu_num_tokens - scheduled),",
        why="samples from each request's first token of the step instead of its last",
        caught_by="test_prepare_inputs.py::test_query_start_loc_and_logits_indices",
    ),
    Mutant(
        name="slots_looked_up_in_the_first_row",
        file=FILE,
        find="block_numbers = block_tables[req_indices, positions // block_size].astype(np.int64)",
        replace="block_numbers = block_tables.ravel()[positions // block_size].astype(np.int64)",
        why="indexes the flattened table by the block index alone: every token looks its block "
        "up in request 0's row, whatever request it belongs to",
        caught_by="test_prepare_inputs.py::test_compute_slot_mapping",
    ),
    Mutant(
        name="max_query_len_is_the_step_total",
        file=FILE,
        find="max_query_len=int(scheduled.max()),",
        replace="max_query_len=int(scheduled.sum()),",
        why="the longest query is the largest scheduled count, not the step's token total (which "
        "is what query_start_loc[-1] already says)",
        caught_by="test_prepare_inputs.py::test_query_start_loc_and_logits_indices",
    ),
    Mutant(
        name="seq_lens_int64",
        file=FILE,
        find="seq_lens=torch.from_numpy(seq_lens.astype(np.int32)),",
        replace="seq_lens=torch.from_numpy(seq_lens),",
        why="seq_lens left int64 (the dtype of the arithmetic): the kernels and the CUDA-graph "
        "buffers read int32",
        caught_by="test_prepare_inputs.py::test_dtypes_and_shapes",
    ),
    Mutant(
        name="max_lens_left_numpy_scalars",
        file=FILE,
        find="""
            max_query_len=int(scheduled.max()),
            max_seq_len=int(seq_lens.max()),
        """,
        replace="""
            max_query_len=scheduled.max(),
            max_seq_len=seq_lens.max(),
        """,
        why="max_query_len and max_seq_len left as numpy scalars (np.int64), where ModelInputs "
        "declares plain ints: they compare equal to the right numbers, but are not ints",
        caught_by="test_prepare_inputs.py::test_dtypes_and_shapes",
    ),
    Mutant(
        name="block_table_width_ignores_max_num_blocks",
        file=FILE,
        find="width = max_num_blocks_per_req or int(num_blocks.max())",
        replace="width = int(num_blocks.max())",
        why="ignores the fixed width the CUDA-graph buffers need",
        caught_by="test_prepare_inputs.py::test_block_tables_of_the_mixed_batch",
    ),
    Mutant(
        name="block_table_width_from_needed_blocks",
        file=FILE,
        find="width = max_num_blocks_per_req or int(num_blocks.max())",
        replace="width = max_num_blocks_per_req or int(blocks_needed.max())",
        why="sizes the table by the blocks this step's tokens need instead of the widest table: "
        "a request holding a block allocated ahead is refused as too wide",
        caught_by="test_prepare_inputs.py::test_block_tables_of_the_mixed_batch",
    ),
    Mutant(
        name="block_table_must_match_exactly",
        file=FILE,
        find="too_few_blocks = blocks_needed > num_blocks",
        replace="too_few_blocks = blocks_needed != num_blocks",
        why="refuses a table with more blocks than the tokens need (!= instead of >): only a "
        "table too short is inconsistent",
        caught_by="test_prepare_inputs.py::test_block_tables_of_the_mixed_batch",
    ),
    Mutant(
        name="block_table_width_widened",
        file=FILE,
        find="width = max_num_blocks_per_req or int(num_blocks.max())",
        replace="width = max(max_num_blocks_per_req or 0, int(num_blocks.max()))",
        why="widens a fixed width that a table does not fit instead of refusing it: the "
        "CUDA-graph buffers sized by max_num_blocks_per_req get a wider table",
        caught_by="test_prepare_inputs.py::test_block_tables_of_the_mixed_batch",
    ),
    Mutant(
        name="short_block_table_not_refused",
        file=FILE,
        find="too_few_blocks = blocks_needed > num_blocks",
        replace="too_few_blocks = np.zeros(num_reqs, dtype=bool)",
        why="a block table too short for the scheduled tokens goes through and fails later as "
        "an index error, or writes a slot of the null block",
        caught_by="test_prepare_inputs.py::test_inconsistent_steps_are_refused",
    ),
    Mutant(
        name="step_refused_only_if_every_request_is_bad",
        file=FILE,
        find="if (too_many_tokens | too_few_blocks).any():",
        replace="if (too_many_tokens | too_few_blocks).all():",
        why=".all() instead of .any(): a batch with one bad request among good ones goes "
        "through, and its short table sends tokens to the null block's slots",
        caught_by="test_prepare_inputs.py::test_inconsistent_steps_are_refused",
    ),
    Mutant(
        name="zero_scheduled_refused_only_if_all",
        file=FILE,
        find="if (scheduled < 1).any():",
        replace="if (scheduled < 1).all():",
        why=".all() instead of .any(): a request with no scheduled token in a batch of others "
        "gets no logits row of its own (logits_indices points at its neighbour's last token)",
        caught_by="test_prepare_inputs.py::test_inconsistent_steps_are_refused",
    ),
    Mutant(
        name="list_lengths_not_checked",
        file=FILE,
        find="""
            if not (len(token_ids) == len(num_computed_tokens) == len(block_ids) == num_reqs):
                raise ValueError("prepare_inputs: per-request arguments must have the same length")
        """,
        replace="",
        why="per-request lists of different lengths are not refused: the extra requests are "
        "silently dropped or given a block table of their own",
        caught_by="test_prepare_inputs.py::test_inconsistent_steps_are_refused",
    ),
    Mutant(
        name="length_check_forgets_num_computed_tokens",
        file=FILE,
        find="if not (len(token_ids) == len(num_computed_tokens) == len(block_ids) == num_reqs):",
        replace="if not (len(token_ids) == len(block_ids) == num_reqs):",
        why="the length check leaves num_computed_tokens out: a list of the wrong length is "
        "broadcast into seq_lens, which then has a row per computed count, not per request",
        caught_by="test_prepare_inputs.py::test_inconsistent_steps_are_refused",
    ),
    Mutant(
        name="empty_batch_not_refused",
        file=FILE,
        find="""
            if num_reqs == 0:
                raise ValueError("prepare_inputs: empty batch")
        """,
        replace="",
        why="an empty batch is not refused: it fails later with an IndexError instead of the "
        "ValueError the contract promises",
        caught_by="test_prepare_inputs.py::test_inconsistent_steps_are_refused",
    ),
    Mutant(
        name="block_check_counts_only_the_step",
        file=FILE,
        find="blocks_needed = kv_sizing.cdiv(seq_lens, block_size)",
        replace="blocks_needed = kv_sizing.cdiv(scheduled, block_size)",
        why="checks that the table covers this step's token COUNT, not its positions: a decode "
        "or a chunk after cached tokens whose table lacks the block of its position is not "
        "refused, and reads the padding (the null block) as its block",
        caught_by="test_prepare_inputs.py::test_inconsistent_steps_are_refused",
    ),
    # -- purity ---------------------------------------------------------------------------------
    Mutant(
        name="block_tables_padded_in_the_callers_lists",
        file=FILE,
        find="""
            flat = np.fromiter(itertools.chain.from_iterable(block_ids), np.int32, count=int(lens.sum()))
            block_tables = np.zeros((len(block_ids), width), dtype=np.int32)
            block_tables[np.arange(width) < lens[:, None]] = flat
            return block_tables
        """,
        replace="""
            for row in block_ids:
                row.extend([0] * (width - len(row)))
            return np.array(block_ids, dtype=np.int32).reshape(len(block_ids), width)
        """,
        why="pads each request's block list in place before np.array: the tensors are right, "
        "but the caller's block lists (the scheduler's) grow by the padding",
        caught_by="test_prepare_inputs.py::test_arguments_are_left_unchanged",
    ),
    Mutant(
        name="seq_lens_added_up_in_the_callers_list",
        file=FILE,
        find="seq_lens = computed + scheduled",
        replace="""
            seq_list = num_computed_tokens
            for i in range(num_reqs):
                seq_list[i] += int(scheduled[i])
            seq_lens = np.asarray(seq_list, dtype=np.int64)
        """,
        why="seq_lens accumulated in num_computed_tokens itself (a name, not a copy): the "
        "tensors are right, but the caller's computed counts now include this step",
        caught_by="test_prepare_inputs.py::test_arguments_are_left_unchanged",
    ),
    Mutant(
        name="positions_kept_in_a_module_buffer",
        file=FILE,
        find="positions = computed[req_indices] + query_pos",
        replace="""
            positions = _POSITIONS[: len(req_indices)]  # no allocation per step
            np.add(computed[req_indices], query_pos, out=positions)
        """,
        more=(
            (
                "def prepare_inputs(",
                """
                _POSITIONS = np.zeros(1 << 16, dtype=np.int64)


                def prepare_inputs(
                """,
            ),
        ),
        why="positions written into a module-level buffer (a persistent CPU buffer, as "
        "upstream's runner keeps) and returned through torch.from_numpy, which shares it: the "
        "next call overwrites the positions of every step a caller still holds",
        caught_by="test_prepare_inputs.py::test_arguments_are_left_unchanged",
    ),
    Mutant(
        name="block_tables_kept_per_shape",
        file=FILE,
        find="""
            block_tables = np.zeros((len(block_ids), width), dtype=np.int32)
            block_tables[np.arange(width) < lens[:, None]] = flat
        """,
        replace="""
            shape = (len(block_ids), width)
            block_tables = _TABLES.setdefault(shape, np.zeros(shape, dtype=np.int32))
            block_tables.fill(0)  # one array per shape, cleared and reused: no allocation
            block_tables[np.arange(width) < lens[:, None]] = flat
        """,
        more=(
            (
                "def make_block_tables(",
                """
                _TABLES: dict = {}


                def make_block_tables(
                """,
            ),
        ),
        why="one block-table array kept per shape and refilled by every later step of that "
        "shape (decode steps mostly keep theirs): a caller still holding a step's inputs "
        "finds the next step's tables in them",
        caught_by="test_prepare_inputs.py::test_arguments_are_left_unchanged",
    ),
    Mutant(
        name="positions_kept_per_step_size",
        file=FILE,
        find="positions = computed[req_indices] + query_pos",
        replace="""
            positions = _POSITIONS.setdefault(len(req_indices), np.empty(len(req_indices), np.int64))
            np.add(computed[req_indices], query_pos, out=positions)
        """,
        more=(
            (
                "def prepare_inputs(",
                """
                _POSITIONS: dict = {}


                def prepare_inputs(
                """,
            ),
        ),
        why="positions written into a buffer kept per token count: the next step of the same "
        "size overwrites the positions of the step a caller still holds",
        caught_by="test_prepare_inputs.py::test_arguments_are_left_unchanged",
    ),
    # -- learner-bug probe, 2026-11-28 (a helper's 55 tries) --------------------------------------
    Mutant(
        name="table_kept_for_the_last_shape",
        file=FILE,
        find="""
            block_tables = np.zeros((len(block_ids), width), dtype=np.int32)
        """,
        replace="""
            global _LAST_TABLE
            if _LAST_TABLE is None or _LAST_TABLE.shape != (len(block_ids), width):
                _LAST_TABLE = np.zeros((len(block_ids), width), dtype=np.int32)
            block_tables = _LAST_TABLE
            block_tables.fill(0)
        """,
        more=(
            (
                "def make_block_tables(",
                """
                _LAST_TABLE = None


                def make_block_tables(
                """,
            ),
        ),
        why="one table kept for the last call's shape: the next step of the same shape (two "
        "decode steps of one batch) refills the table a caller still holds; a step of another "
        "shape in between hides it",
        caught_by="test_prepare_inputs.py::test_arguments_are_left_unchanged",
    ),
    Mutant(
        name="positions_kept_for_the_last_step_size",
        file=FILE,
        find="positions = computed[req_indices] + query_pos",
        replace="""
            global _LAST_POSITIONS
            if _LAST_POSITIONS is None or len(_LAST_POSITIONS) != len(req_indices):
                _LAST_POSITIONS = np.empty(len(req_indices), np.int64)
            positions = _LAST_POSITIONS
            np.add(computed[req_indices], query_pos, out=positions)
        """,
        more=(
            (
                "def prepare_inputs(",
                """
                _LAST_POSITIONS = None


                def prepare_inputs(
                """,
            ),
        ),
        why="positions written into a buffer kept for the last step's token count: the next "
        "step of the same size overwrites the positions of the step a caller still holds",
        caught_by="test_prepare_inputs.py::test_arguments_are_left_unchanged",
    ),
    Mutant(
        name="length_check_leaves_out_the_scheduled_counts",
        file=FILE,
        find="num_reqs = len(num_scheduled_tokens)",
        replace="num_reqs = len(token_ids)",
        more=(
            (
                "if not (len(token_ids) == len(num_computed_tokens) == len(block_ids) == num_reqs):",
                "if not (len(num_computed_tokens) == len(block_ids) == num_reqs):",
            ),
        ),
        why="num_scheduled_tokens left out of the length check: a shorter list builds a step "
        "for its requests only, with positions and seq_lens for all of them (a longer one "
        "fails anyway, in np.repeat)",
        caught_by="test_prepare_inputs.py::test_inconsistent_steps_are_refused",
    ),
    Mutant(
        name="scheduled_check_after_the_loop",
        file=FILE,
        find="""
            if (scheduled < 1).any():
        """,
        replace="""
            for i in range(num_reqs):
                bad = scheduled[i] < 1
            if bad:
        """,
        why="a check computed in a loop and tested after it: only the last request's count is "
        "left, so a request with no scheduled token before it goes through",
        caught_by="test_prepare_inputs.py::test_inconsistent_steps_are_refused",
    ),
    Mutant(
        name="block_check_after_the_loop",
        file=FILE,
        find="too_few_blocks = blocks_needed > num_blocks",
        replace="""
            too_few_blocks = np.zeros(num_reqs, dtype=bool)
            for i in range(num_reqs):
                short = blocks_needed[i] > num_blocks[i]
            too_few_blocks[-1] = short
        """,
        why="the table-length check of the last request only: an earlier request's short table "
        "goes through, and its last positions get the null block's slots",
        caught_by="test_prepare_inputs.py::test_inconsistent_steps_are_refused",
    ),
    Mutant(
        name="decode_shortcut_with_int64_query_start_loc",
        file=FILE,
        find="""
            # [2, 5, 3] -> cu_num_tokens [2, 7, 10], query_pos [0 1 0 1 2 3 4 0 1 2],
        """,
        replace="""
            if (scheduled == 1).all():  # a decode-only step: one token per request
                width = max_num_blocks_per_req or int(num_blocks.max())
                tables = make_block_tables(block_ids, width)
                rows = np.arange(num_reqs)
                return ModelInputs(
                    input_ids=torch.tensor([t[c] for t, c in zip(token_ids, computed.tolist())]),
                    positions=torch.from_numpy(computed.copy()),
                    slot_mapping=torch.from_numpy(
                        compute_slot_mapping(tables, rows, computed, block_size)
                    ),
                    block_tables=torch.from_numpy(tables),
                    query_start_loc=torch.from_numpy(np.arange(num_reqs + 1)),
                    seq_lens=torch.from_numpy(seq_lens.astype(np.int32)),
                    logits_indices=torch.from_numpy(rows),
                    max_query_len=1,
                    max_seq_len=int(seq_lens.max()),
                )
            # [2, 5, 3] -> cu_num_tokens [2, 7, 10], query_pos [0 1 0 1 2 3 4 0 1 2],
        """,
        why="a shortcut for decode-only steps whose query_start_loc is int64: right values, "
        "the wrong dtype for the kernels, in the most common step",
        caught_by="test_prepare_inputs.py::test_dtypes_and_shapes",
    ),
    Mutant(
        name="block_size_one_shortcut_with_int32_slots",
        file=FILE,
        find="""
            block_numbers = block_tables[req_indices, positions // block_size].astype(np.int64)
        """,
        replace="""
            if block_size == 1:  # every position is its own block
                return block_tables[req_indices, positions]
            block_numbers = block_tables[req_indices, positions // block_size].astype(np.int64)
        """,
        why="with blocks of one token the slot is the block id, returned straight from the "
        "int32 table: the slot mapping comes out int32",
        caught_by="test_prepare_inputs.py::test_dtypes_and_shapes",
    ),
    Mutant(
        name="rows_of_one_length_not_padded",
        file=FILE,
        find="""
            flat = np.fromiter(itertools.chain.from_iterable(block_ids), np.int32, count=int(lens.sum()))
        """,
        replace="""
            if (lens == lens.max()).all():  # every row as long: nothing to pad
                return np.array(block_ids, dtype=np.int32)
            flat = np.fromiter(itertools.chain.from_iterable(block_ids), np.int32, count=int(lens.sum()))
        """,
        why="rows of one length returned as they are, ignoring the width: the table comes out "
        "narrower than max_num_blocks_per_req",
        caught_by="test_prepare_inputs.py::test_make_block_tables_pads_with_the_null_block",
    ),
    Mutant(
        name="max_lengths_as_numpy_scalars",
        file=FILE,
        find="""        max_query_len=int(scheduled.max()),
        max_seq_len=int(seq_lens.max()),""",
        replace="""        max_query_len=scheduled.max(),
        max_seq_len=seq_lens.max(),""",
        why="the two lengths left as numpy.int64: ModelInputs declares them int, and code that "
        "checks for an int (or serializes the inputs) refuses them",
        caught_by="test_prepare_inputs.py::test_dtypes_and_shapes",
    ),
    Mutant(
        name="tables_longer_than_needed_refused",
        file=FILE,
        find="    too_few_blocks = blocks_needed > num_blocks\n",
        replace="    too_few_blocks = blocks_needed != num_blocks\n",
        why="a table must hold exactly the blocks its tokens need: a request whose table "
        "already holds the block for its next tokens (allocated ahead) is refused",
        caught_by="test_prepare_inputs.py::test_block_tables_of_the_mixed_batch",
    ),
    # -- helper probe, 2026-11-29 (lab-07/lab-09 round) ---------------------------------------
    Mutant(
        name="block_check_against_the_padded_width",
        file=FILE,
        find="    too_few_blocks = blocks_needed > num_blocks\n",
        replace="    too_few_blocks = blocks_needed > (max_num_blocks_per_req or num_blocks)\n",
        why="checks the blocks needed against the table's width when max_num_blocks_per_req is "
        "given, not against the request's own table: a table too short for its tokens is "
        "padded, and the tokens past it are written to the null block's slots",
        caught_by="test_prepare_inputs.py::test_inconsistent_steps_are_refused",
    ),
    # -- helper probe, 2026-11-29 (2) (lab-09/lab-11 round) -----------------------------------
    Mutant(
        name="decode_overrun_not_checked",
        file=FILE,
        find="    too_many_tokens = seq_lens > num_known\n",
        replace="    too_many_tokens = (seq_lens > num_known) & (scheduled > 1)\n",
        more=(
            (
                """
    input_ids = np.fromiter(
        itertools.chain.from_iterable(
            tokens[start:end] for tokens, start, end in zip(token_ids, starts, ends)
        ),
        np.int64,
        count=int(cu_num_tokens[-1]),
    )
""",
                """
    input_ids = np.concatenate(
        [np.asarray(t[start:end], dtype=np.int64) for t, start, end in zip(token_ids, starts, ends)]
    )
""",
            ),
        ),
        why='the known-tokens check exempts one-token steps ("a decode always has its token"): '
        "a decode whose sampled token was never appended runs with no input token, and the "
        "step comes out one token short. (The input ids are concatenated, as a learner may "
        "build them: the solution's np.fromiter with a count would refuse the short slice by "
        "accident.)",
        caught_by="test_prepare_inputs.py::test_inconsistent_steps_are_refused",
    ),
    # -- helper probe, 2026-11-29 (s47) -----------------------------------------------------------
    Mutant(
        name="positions_built_token_by_token",
        file=FILE,
        find="""
            cu_num_tokens, query_pos = _get_cumsum_and_arange(scheduled)
            req_indices = np.repeat(np.arange(num_reqs), scheduled)
        """,
        replace="""
            cu_num_tokens = np.cumsum(scheduled)
            req_list, pos_list = [], []
            for i in range(num_reqs):
                for p in range(int(computed[i]), int(seq_lens[i])):
                    req_list.append(i)
                    pos_list.append(p)
            req_indices = np.array(req_list, dtype=np.int64)
        """,
        more=(
            (
                "positions = computed[req_indices] + query_pos",
                "positions = np.array(pos_list, dtype=np.int64)",
            ),
        ),
        why="each token's request and position appended in a Python loop over the tokens: "
        "right values, and a step of 12,800 tokens costs 100x the Python of one of 128 (about "
        "2x the reference's time only, which a timing alone cannot tell from load)",
        caught_by="test_prepare_inputs.py::test_no_python_work_per_token",
    ),
    Mutant(
        name="slots_computed_token_by_token",
        file=FILE,
        find="slot_mapping = compute_slot_mapping(block_tables, req_indices, positions, block_size)",
        replace="""
            slot_mapping = np.array(
                [
                    int(block_tables[r, p // block_size]) * block_size + p % block_size
                    for r, p in zip(req_indices.tolist(), positions.tolist())
                ],
                dtype=np.int64,
            )
        """,
        why="the slot mapping as a comprehension over the tokens, by the README's formula: "
        "right values, Python work per token at every step",
        caught_by="test_prepare_inputs.py::test_no_python_work_per_token",
    ),
    Mutant(
        name="decode_shortcut_ignores_the_fixed_width",
        file=FILE,
        find="""
            # [2, 5, 3] -> cu_num_tokens [2, 7, 10], query_pos [0 1 0 1 2 3 4 0 1 2],
        """,
        replace="""
            if (scheduled == 1).all():  # a decode-only step: one token per request
                tables = make_block_tables(block_ids, int(num_blocks.max()))
                rows = np.arange(num_reqs)
                return ModelInputs(
                    input_ids=torch.tensor(
                        [t[c] for t, c in zip(token_ids, computed.tolist())], dtype=torch.int64
                    ),
                    positions=torch.from_numpy(computed.copy()),
                    slot_mapping=torch.from_numpy(
                        compute_slot_mapping(tables, rows, computed, block_size)
                    ),
                    block_tables=torch.from_numpy(tables),
                    query_start_loc=torch.from_numpy(np.arange(num_reqs + 1, dtype=np.int32)),
                    seq_lens=torch.from_numpy(seq_lens.astype(np.int32)),
                    logits_indices=torch.from_numpy(rows.astype(np.int64)),
                    max_query_len=1,
                    max_seq_len=int(seq_lens.max()),
                )
            # [2, 5, 3] -> cu_num_tokens [2, 7, 10], query_pos [0 1 0 1 2 3 4 0 1 2],
        """,
        why="a decode-only shortcut, right in values and dtypes, whose table is as wide as the "
        "widest row: max_num_blocks_per_req (the CUDA-graph width) is ignored in the most "
        "common step; only the mixed batch was given a fixed width",
        caught_by="test_prepare_inputs.py::test_block_tables_of_the_mixed_batch",
    ),
    Mutant(
        name="single_row_not_padded",
        file=FILE,
        find="""
            flat = np.fromiter(itertools.chain.from_iterable(block_ids), np.int32, count=int(lens.sum()))
        """,
        replace="""
            if len(block_ids) == 1:  # one request: no other row to pad against
                return np.asarray(block_ids, dtype=np.int32)
            flat = np.fromiter(itertools.chain.from_iterable(block_ids), np.int32, count=int(lens.sum()))
        """,
        why="a table of one row returned as it is, ignoring the width: a step of one request "
        "gets a table narrower than max_num_blocks_per_req",
        caught_by="test_prepare_inputs.py::test_make_block_tables_pads_with_the_null_block",
    ),
    Mutant(
        name="block_tables_memoized_by_contents",
        file=FILE,
        find="    lens = np.fromiter(map(len, block_ids), np.int64, count=len(block_ids))\n",
        replace="""
                key = (tuple(map(tuple, block_ids)), width)
                if key in _TABLES:  # decode steps mostly keep their tables: build each once
                    return _TABLES[key]
                lens = np.fromiter(map(len, block_ids), np.int64, count=len(block_ids))
        """,
        more=(
            (
                "    return block_tables\n",
                "    _TABLES[key] = block_tables\n    return block_tables\n",
            ),
            (
                "def make_block_tables(",
                """
                _TABLES: dict = {}


                def make_block_tables(
                """,
            ),
        ),
        why="tables memoized by their contents and returned again: never refilled, so no later "
        "step changes them, but two calls share one array, and a caller's write into one "
        "step's table shows in every later step of the same tables",
        caught_by="test_prepare_inputs.py::test_arguments_are_left_unchanged",
    ),
]
