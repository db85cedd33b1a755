"""Every live request's block table, kept in one persistent array (upstream's ``BlockTable``).

The scheduler sends a request's blocks once and then only the blocks it appends, so the runner
keeps the tables itself. Rebuilding a ``[num_reqs, width]`` array from per-request lists every
step reads every block id of every request, at every step; here a row is written when its
request arrives, extended when it gets new blocks, replaced when it resumes after preemption,
and a step reads its rows with one fancy index. Entries past a row's length hold 0, the null
block, as the from-scratch ``make_block_tables`` pads them (lab-09 explains why).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


class BlockTable:
    """Row ``r`` holds ``block_table_np[r, :num_blocks_per_row[r]]``, its request's blocks."""

    def __init__(self, max_num_reqs: int, max_num_blocks_per_req: int) -> None:
        self.max_num_blocks_per_req = max_num_blocks_per_req
        self.block_table_np = np.zeros((max_num_reqs, max_num_blocks_per_req), dtype=np.int32)
        self.num_blocks_per_row = np.zeros(max_num_reqs, dtype=np.int64)

    def append_row(self, block_ids: Sequence[int], row_idx: int) -> None:
        """Add ``block_ids`` after the row's current blocks."""
        start = int(self.num_blocks_per_row[row_idx])
        end = start + len(block_ids)
        if end > self.max_num_blocks_per_req:
            raise ValueError(
                f"row {row_idx}: {end} blocks do not fit a table of "
                f"{self.max_num_blocks_per_req} (max_model_len / block_size)"
            )
        self.block_table_np[row_idx, start:end] = block_ids
        self.num_blocks_per_row[row_idx] = end

    def add_row(self, block_ids: Sequence[int], row_idx: int) -> None:
        """Replace the row's blocks with ``block_ids`` (a new or resumed request)."""
        self.clear_row(row_idx)
        self.append_row(block_ids, row_idx)

    def clear_row(self, row_idx: int) -> None:
        self.block_table_np[row_idx, : self.num_blocks_per_row[row_idx]] = 0
        self.num_blocks_per_row[row_idx] = 0

    def grow(self, max_num_reqs: int) -> None:
        """Make room for ``max_num_reqs`` rows, keeping the existing ones."""
        self.block_table_np = grow_rows(self.block_table_np, max_num_reqs)
        self.num_blocks_per_row = grow_rows(self.num_blocks_per_row, max_num_reqs)


def grow_rows(array: np.ndarray, num_rows: int) -> np.ndarray:
    """``array`` with ``num_rows`` rows: the existing ones copied, the new ones zero.

    A fresh ``np.zeros`` and a copy of the old rows, not a concatenation: the operating system
    hands out zeroed pages lazily, so rows no request has used yet cost no memory (the token
    array has ``max_model_len`` columns, over 100 MiB at 256 rows for a 128k-token model).
    """
    if num_rows <= len(array):
        return array
    grown = np.zeros((num_rows, *array.shape[1:]), dtype=array.dtype)
    grown[: len(array)] = array
    return grown
