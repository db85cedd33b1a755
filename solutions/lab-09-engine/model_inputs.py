"""One scheduler step flattened into the model's inputs: the file of lab-09.

``ModelInputs`` is given; you write ``prepare_inputs`` and its three helpers. The step arrives
as plain lists (per request: its known tokens, how many are already cached, how many run now,
its block table) and leaves as the tensors the model and the attention backend read.

Your function is judged twice: on hand-made batches, tensor by tensor, and by running the
engine on it (the grader sets the runner's ``prepare_inputs_fn`` to yours) and generating the
same tokens as Hugging Face ``generate`` on a small model. The engine itself flattens from its
persistent input batch, with the same two helpers; phase 05 explains the difference.

Shapes: ``T`` tokens in the step (the sum of the scheduled counts), ``R`` requests. Work in numpy
(``np.repeat``, ``np.cumsum``, fancy indexing, ``np.fromiter`` to read the ragged lists in one
pass) and convert once at the end with ``torch.from_numpy``: the engine calls this every step, so
a Python loop per token, or even per request at a few hundred requests, would show in the step
time.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from mini_vllm.worker import kv_sizing


@dataclass
class ModelInputs:
    """One step flattened: every tensor the model and the attention backend read.

    Shapes: ``T`` tokens in the step (the sum of the scheduled counts), ``R`` requests.
    """

    input_ids: torch.Tensor  # [T] int64
    positions: torch.Tensor  # [T] int64: position of each token in its own sequence
    slot_mapping: torch.Tensor  # [T] int64: cache slot where each token's K/V is written
    block_tables: torch.Tensor  # [R, max_blocks] int32, padded with 0 (the null block)
    query_start_loc: torch.Tensor  # [R + 1] int32: request i owns tokens [qsl[i], qsl[i+1])
    seq_lens: torch.Tensor  # [R] int32: num_computed_tokens + num_scheduled_tokens
    logits_indices: torch.Tensor  # [R] int64: the last token of each request
    max_query_len: int
    max_seq_len: int


def _get_cumsum_and_arange(num_tokens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Cumulative token counts, and each token's offset inside its own request.

    ``[2, 5, 3]`` -> ``([2, 7, 10], [0, 1, 0, 1, 2, 3, 4, 0, 1, 2])`` (upstream's helper of the
    same name). The second array is what turns per-request numbers into per-token ones without a
    Python loop over tokens: subtract from a flat ``arange`` the start of each token's request,
    spread over that request's tokens with ``np.repeat``.
    """
    num_tokens = np.asarray(num_tokens, dtype=np.int64)
    cu_num_tokens = np.cumsum(num_tokens)
    total = int(cu_num_tokens[-1]) if cu_num_tokens.size else 0
    request_starts = np.repeat(cu_num_tokens - num_tokens, num_tokens)
    return cu_num_tokens, np.arange(total, dtype=np.int64) - request_starts


def make_block_tables(block_ids: Sequence[Sequence[int]], width: int) -> np.ndarray:
    """The requests' block tables as one ``[num_reqs, width]`` int32 array, padded with 0.

    Kernels index a rectangle, but requests hold different numbers of blocks, so short rows are
    padded, with block 0, the null block, as upstream's block table is. No kernel here reads an
    entry past a request's ``seq_len``; the padding still has to be harmless if one did (a
    kernel that loads a tile of entries before masking them, a CUDA-graph row that pads the
    batch and reads one token through an all-padding row): the null block is always in bounds
    and holds nobody's data, where a real block id would alias another request's K/V and -1
    would index out of bounds.

    Built without a Python loop over rows (this runs every step, for every request): all the
    lists are read once into one flat array, then scattered through a mask that is True on the
    first ``len(ids)`` cells of each row. A boolean mask assigns in row-major order, the order
    of the concatenated lists, so ``[[7, 3], [5, 9, 2]]`` fills ``[[7, 3, 0], [5, 9, 2]]``.
    """
    lens = np.fromiter(map(len, block_ids), np.int64, count=len(block_ids))
    if (lens > width).any():
        raise ValueError(f"a block table of {int(lens.max())} blocks does not fit width {width}")
    flat = np.fromiter(itertools.chain.from_iterable(block_ids), np.int32, count=int(lens.sum()))
    block_tables = np.zeros((len(block_ids), width), dtype=np.int32)
    block_tables[np.arange(width) < lens[:, None]] = flat
    return block_tables


def compute_slot_mapping(
    block_tables: np.ndarray, req_indices: np.ndarray, positions: np.ndarray, block_size: int
) -> np.ndarray:
    """The KV cache slot of every token of the step (upstream: ``BlockTable.compute_slot_mapping``).

    Token ``t`` of request ``r = req_indices[t]`` at position ``p = positions[t]`` goes to
    ``block_tables[r, p // block_size] * block_size + p % block_size``: the block its position
    falls in, looked up in *its own* request's table, then the offset inside that block. (lab-06
    writes the same rule for one sequence; this is the whole flattened batch at once.)
    """
    block_numbers = block_tables[req_indices, positions // block_size].astype(np.int64)
    return block_numbers * block_size + positions % block_size


def prepare_inputs(
    token_ids: Sequence[Sequence[int]],
    num_computed_tokens: Sequence[int],
    num_scheduled_tokens: Sequence[int],
    block_ids: Sequence[Sequence[int]],
    block_size: int,
    max_num_blocks_per_req: int | None = None,
) -> ModelInputs:
    """Flatten one step's requests into the model's inputs (upstream: ``_prepare_inputs``).

    Request ``i`` runs its tokens ``num_computed_tokens[i] .. + num_scheduled_tokens[i]``: the
    tokens before are already in the KV cache (earlier steps, or a prefix-cache hit), so a
    prefill starts mid-prompt after a hit, a chunk continues where the last one stopped, and a
    decode is the case of one token. Positions restart at each request's own offset, and each
    token's cache slot comes from its request's block table:
    ``slot = block_ids[pos // block_size] * block_size + pos % block_size``.

    Pure: plain lists in, CPU tensors out, no runner state. Vectorised as upstream does it:
    ``np.repeat`` spreads per-request values over their tokens instead of a Python loop per token.

    Args:
        token_ids: per request, every token known so far (prompt + sampled).
        num_computed_tokens: per request, tokens whose K/V is already cached.
        num_scheduled_tokens: per request, tokens to run this step (>= 1).
        block_ids: per request, its block table (must cover the scheduled tokens).
        block_size: tokens per KV cache block.
        max_num_blocks_per_req: width of ``block_tables``; default: the widest table in the batch.
    """
    num_reqs = len(num_scheduled_tokens)
    if not (len(token_ids) == len(num_computed_tokens) == len(block_ids) == num_reqs):
        raise ValueError("prepare_inputs: per-request arguments must have the same length")
    if num_reqs == 0:
        raise ValueError("prepare_inputs: empty batch")
    computed = np.asarray(num_computed_tokens, dtype=np.int64)
    scheduled = np.asarray(num_scheduled_tokens, dtype=np.int64)
    if (scheduled < 1).any():
        raise ValueError(f"every request needs >= 1 scheduled token, got {scheduled.tolist()}")
    seq_lens = computed + scheduled
    # Both checks on whole arrays, not in a loop over requests (at hundreds of requests a step,
    # the loop cost more than the rest of the function); the error names the first bad request.
    num_known = np.fromiter(map(len, token_ids), np.int64, count=num_reqs)
    num_blocks = np.fromiter(map(len, block_ids), np.int64, count=num_reqs)
    blocks_needed = kv_sizing.cdiv(seq_lens, block_size)  # elementwise on an array
    too_many_tokens = seq_lens > num_known
    too_few_blocks = blocks_needed > num_blocks
    if (too_many_tokens | too_few_blocks).any():
        i = int(np.argmax(too_many_tokens | too_few_blocks))
        if too_many_tokens[i]:
            raise ValueError(
                f"request {i}: {computed[i]} computed + {scheduled[i]} scheduled tokens exceed "
                f"its {num_known[i]} known tokens"
            )
        raise ValueError(
            f"request {i}: {seq_lens[i]} tokens need {blocks_needed[i]} blocks, its table has "
            f"{num_blocks[i]}"
        )

    # [2, 5, 3] -> cu_num_tokens [2, 7, 10], query_pos [0 1 0 1 2 3 4 0 1 2],
    # req_indices [0 0 1 1 1 1 1 2 2 2], query_start_loc [0, 2, 7, 10]
    cu_num_tokens, query_pos = _get_cumsum_and_arange(scheduled)
    req_indices = np.repeat(np.arange(num_reqs), scheduled)
    query_start_loc = np.concatenate(([0], cu_num_tokens))
    # A token's position counts the tokens cached before it: the step starts at the offset.
    positions = computed[req_indices] + query_pos

    # Each request's tokens [computed, seq_len) of its own list, read straight into one array.
    # The bounds are converted to Python ints once: slicing a list with numpy scalars is slower,
    # and so is making one small array per request to concatenate.
    starts, ends = computed.tolist(), seq_lens.tolist()
    input_ids = np.fromiter(
        itertools.chain.from_iterable(
            tokens[start:end] for tokens, start, end in zip(token_ids, starts, ends)
        ),
        np.int64,
        count=int(cu_num_tokens[-1]),
    )

    width = max_num_blocks_per_req or int(num_blocks.max())
    block_tables = make_block_tables(block_ids, width)
    slot_mapping = compute_slot_mapping(block_tables, req_indices, positions, block_size)

    return ModelInputs(
        input_ids=torch.from_numpy(input_ids),
        positions=torch.from_numpy(positions),
        slot_mapping=torch.from_numpy(slot_mapping),
        block_tables=torch.from_numpy(block_tables),
        query_start_loc=torch.from_numpy(query_start_loc.astype(np.int32)),
        seq_lens=torch.from_numpy(seq_lens.astype(np.int32)),
        logits_indices=torch.from_numpy(cu_num_tokens - 1),
        max_query_len=int(scheduled.max()),
        max_seq_len=int(seq_lens.max()),
    )
