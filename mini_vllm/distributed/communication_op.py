"""The collectives the model calls, by upstream's names (``vllm/distributed/communication_op.py``).

Three are enough for a Megatron-style Llama: an all-reduce after every row-parallel layer and the
vocab-parallel embedding, an all-gather of the LM head's vocabulary slices, and a gather to one
rank that our engine does not use (kept for the lab and the exercises); where each is called and
why: docs/upstream-fidelity.md (module notes).
"""

from __future__ import annotations

import torch

from mini_vllm.distributed.parallel_state import get_tp_group


def tensor_model_parallel_all_reduce(input_: torch.Tensor) -> torch.Tensor:
    """Sum over the tensor-parallel group (in place; the input itself on a group of one)."""
    return get_tp_group().all_reduce(input_)


def tensor_model_parallel_all_gather(input_: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Concatenate every rank's tensor along ``dim``, in rank order, on every rank."""
    return get_tp_group().all_gather(input_, dim)


def tensor_model_parallel_gather(
    input_: torch.Tensor, dst: int = 0, dim: int = -1
) -> torch.Tensor | None:
    """Concatenate every rank's tensor along ``dim`` on rank ``dst``; None on the others."""
    return get_tp_group().gather(input_, dst, dim)
