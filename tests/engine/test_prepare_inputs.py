"""``prepare_inputs``: one step's requests flattened into the model's inputs (lab-09's task)."""

from __future__ import annotations

import pytest
import torch

from mini_vllm.worker.model_inputs import prepare_inputs


def test_mixed_prefix_hit_chunk_and_decode() -> None:
    block_size = 4
    inputs = prepare_inputs(
        token_ids=[
            [10, 11, 12, 13, 14, 15],  # prefix hit of 4 tokens: runs 14, 15
            [20, 21, 22, 23, 24, 25, 26, 27, 28],  # a chunk: tokens 0..2 of a long prompt
            [30, 31, 32, 33, 34],  # decode of its last token
        ],
        num_computed_tokens=[4, 0, 4],
        num_scheduled_tokens=[2, 3, 1],
        block_ids=[[7, 3], [5, 9, 2], [4, 8]],
        block_size=block_size,
    )
    assert inputs.input_ids.tolist() == [14, 15, 20, 21, 22, 34]
    assert inputs.positions.tolist() == [4, 5, 0, 1, 2, 4]
    # slot = block_ids[pos // 4] * 4 + pos % 4
    assert inputs.slot_mapping.tolist() == [3 * 4 + 0, 3 * 4 + 1, 20, 21, 22, 8 * 4 + 0]
    assert inputs.query_start_loc.tolist() == [0, 2, 5, 6]
    assert inputs.seq_lens.tolist() == [6, 3, 5]
    assert inputs.logits_indices.tolist() == [1, 4, 5]
    assert inputs.block_tables.tolist() == [[7, 3, 0], [5, 9, 2], [4, 8, 0]]
    assert inputs.max_query_len == 3 and inputs.max_seq_len == 6
    assert inputs.input_ids.dtype == torch.int64 and inputs.slot_mapping.dtype == torch.int64
    assert inputs.block_tables.dtype == torch.int32 and inputs.seq_lens.dtype == torch.int32


def test_fixed_block_table_width() -> None:
    inputs = prepare_inputs([[1, 2]], [0], [2], [[6]], block_size=16, max_num_blocks_per_req=5)
    assert inputs.block_tables.tolist() == [[6, 0, 0, 0, 0]]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(num_computed_tokens=[2], num_scheduled_tokens=[2]), "exceed"),
        (dict(num_computed_tokens=[0], num_scheduled_tokens=[0]), ">= 1 scheduled"),
        (dict(num_computed_tokens=[0], num_scheduled_tokens=[3], block_ids=[[1]]), "blocks"),
    ],
)
def test_inconsistent_steps_are_refused(kwargs: dict, message: str) -> None:
    args = dict(token_ids=[[1, 2, 3]], block_ids=[[1]], block_size=2) | kwargs
    with pytest.raises(ValueError, match=message):
        prepare_inputs(**args)
