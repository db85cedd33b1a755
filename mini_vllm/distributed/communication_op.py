"""The collectives the model calls, by upstream's names (``vllm/distributed/communication_op.py``).

Three are enough for a Megatron-style Llama:

* ``tensor_model_parallel_all_reduce`` after every row-parallel layer (``o_proj``,
  ``down_proj``) and after the vocab-parallel embedding: each rank holds a partial sum.
* ``tensor_model_parallel_all_gather`` of the LM head's vocabulary slices, so that every rank
  holds the full logits and samples the same token (upstream's default on GPUs: its
  ``LogitsProcessor`` all-gathers, since ``Platform.use_all_gather()`` is True).
* ``tensor_model_parallel_gather`` to one rank, the alternative that upstream keeps for
  platforms which prefer it; unused by our engine, kept for the lab and the exercises.
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
