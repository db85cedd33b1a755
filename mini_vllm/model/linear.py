"""Megatron-style parallel linear layers (upstream: ``vllm/model_executor/layers/linear.py``).

Tensor parallelism splits the first matmul of each pair of a block by output (column-parallel)
and the second by input (row-parallel), so that a pair needs one all-reduce; each layer cuts its
own shard out of a full checkpoint tensor (``weight_loader``). On one rank
(``tensor_parallel_size=1``) every class here is ``nn.Linear`` with the same weight shape and the
same ``F.linear`` call, so the single-process engine runs exactly as before. The constructors
keep upstream's parameter order and defaults (``bias=True``, as ``nn.Linear`` too), so a layer
declared as in a vLLM model file gets the same parameters here. The pairs, the loading, and what
differs (``forward`` returns the output alone, not upstream's ``(output, output_bias)``):
docs/upstream-fidelity.md (module notes).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from mini_vllm.distributed import sharding
from mini_vllm.distributed.communication_op import (
    tensor_model_parallel_all_gather,
    tensor_model_parallel_all_reduce,
)
from mini_vllm.distributed.parallel_state import (
    check_tensor_model_parallel_world_size,
    get_tensor_model_parallel_rank,
    get_tensor_model_parallel_world_size,
)


def _copy_checked(param: torch.Tensor, loaded: torch.Tensor, what: str) -> None:
    if param.shape != loaded.shape:
        raise ValueError(
            f"{what}: checkpoint shard shape {tuple(loaded.shape)} != {tuple(param.shape)}"
        )
    with torch.no_grad():
        param.copy_(loaded)


class ColumnParallelLinear(nn.Linear):
    """``Y = X W^T + b`` with ``W``'s output rows split across ranks: rank ``r`` computes
    ``Y[:, r*n/tp : (r+1)*n/tp]``. The input is the full ``X`` (replicated on every rank).

    ``gather_output=True`` all-gathers the slices into the full ``Y`` on every rank; the model
    never needs it (a column layer always feeds a row layer), upstream keeps it and so do we.
    """

    def __init__(
        self, input_size: int, output_size: int, bias: bool = True, gather_output: bool = False
    ) -> None:
        self.tp_rank = get_tensor_model_parallel_rank()
        self.tp_size = get_tensor_model_parallel_world_size()
        self.input_size = input_size
        self.output_size = output_size
        self.output_size_per_partition = sharding.divide(output_size, self.tp_size)
        super().__init__(input_size, self.output_size_per_partition, bias=bias)
        self.gather_output = gather_output

    def weight_loader(self, param: nn.Parameter, loaded_weight: torch.Tensor) -> None:
        """Keep this rank's output rows (weight and bias alike: both are cut along dim 0)."""
        shard = sharding.shard_tensor(loaded_weight, 0, self.tp_rank, self.tp_size)
        _copy_checked(param, shard, type(self).__name__)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        output = F.linear(x, self.weight, self.bias)
        if self.gather_output and self.tp_size > 1:
            check_tensor_model_parallel_world_size(self.tp_size)
            output = tensor_model_parallel_all_gather(output)
        return output


class MergedColumnParallelLinear(ColumnParallelLinear):
    """Several column-parallel projections of one input stored as one matrix (``gate_up_proj``).

    Each rank holds its slice *of each* projection, stacked: ``[gate_r; up_r]``, not a slice of
    ``[gate; up]``. That is what lets ``SiluAndMul`` still split the output in two halves on
    every rank.
    """

    def __init__(self, input_size: int, output_sizes: list[int], bias: bool = True) -> None:
        self.output_sizes = list(output_sizes)
        super().__init__(input_size, sum(output_sizes), bias=bias)

    def weight_loader(  # type: ignore[override]
        self, param: nn.Parameter, loaded_weight: torch.Tensor, shard_id: int
    ) -> None:
        """Load projection ``shard_id`` (0 = gate, 1 = up): its rank slice into its place."""
        tp = self.tp_size
        offset = sum(self.output_sizes[:shard_id]) // tp
        size = self.output_sizes[shard_id] // tp
        shard = sharding.shard_tensor(loaded_weight, 0, self.tp_rank, tp)
        _copy_checked(param.narrow(0, offset, size), shard, f"{type(self).__name__}[{shard_id}]")


class QKVParallelLinear(ColumnParallelLinear):
    """The fused Q/K/V projection, split by attention head.

    Rank ``r`` holds ``num_heads = total_num_heads / tp`` query heads and ``num_kv_heads`` KV
    heads: an even share, or one replicated KV head when there are fewer KV heads than ranks
    (``sharding.kv_head_range``). Its output is ``[q_r | k_r | v_r]``, ``(num_heads +
    2 * num_kv_heads) * head_size`` wide, which is what ``LlamaAttention`` splits.
    """

    def __init__(
        self,
        hidden_size: int,
        head_size: int,
        total_num_heads: int,
        total_num_kv_heads: int | None = None,
        bias: bool = True,
    ) -> None:
        tp_size = get_tensor_model_parallel_world_size()
        self.head_size = head_size
        self.total_num_heads = total_num_heads
        self.total_num_kv_heads = total_num_kv_heads or total_num_heads
        self.num_heads = sharding.num_heads_per_rank(total_num_heads, tp_size)
        self.num_kv_heads = sharding.num_kv_heads_per_rank(self.total_num_kv_heads, tp_size)
        self.num_kv_head_replicas = sharding.num_kv_head_replicas(self.total_num_kv_heads, tp_size)
        # As upstream: the "full" output counts replicated KV heads once per rank, so that it
        # divides evenly into the per-rank width.
        output_size = (self.num_heads + 2 * self.num_kv_heads) * head_size * tp_size
        super().__init__(hidden_size, output_size, bias=bias)

    def weight_loader(  # type: ignore[override]
        self, param: nn.Parameter, loaded_weight: torch.Tensor, shard_id: str
    ) -> None:
        """Load the checkpoint's ``q_proj``/``k_proj``/``v_proj`` (``shard_id`` q, k or v)."""
        q_size = self.num_heads * self.head_size
        kv_size = self.num_kv_heads * self.head_size
        offset, size = {"q": (0, q_size), "k": (q_size, kv_size), "v": (q_size + kv_size, kv_size)}[
            shard_id
        ]
        shard = sharding.shard_qkv_weight(
            loaded_weight,
            shard_id,
            self.head_size,
            self.total_num_heads,
            self.total_num_kv_heads,
            self.tp_rank,
            self.tp_size,
        )
        _copy_checked(param.narrow(0, offset, size), shard, f"{type(self).__name__}[{shard_id}]")


class RowParallelLinear(nn.Linear):
    """``Y = X W^T + b`` with ``W``'s input columns split across ranks, then an all-reduce.

    The input arrives already split (it is a column-parallel layer's output): rank ``r``
    multiplies its slice ``X_r`` by ``W_r^T`` and holds a partial sum; ``all_reduce`` adds them,
    and every rank has the full ``Y``. The bias is added once, by rank 0 before the reduction
    (as upstream does), not once per rank. ``reduce_results`` is keyword-only: upstream's fourth
    parameter is ``input_is_parallel`` (absent here: the input always arrives split), and a
    positional ``False`` meant for it must not silently turn the all-reduce off.
    """

    def __init__(
        self, input_size: int, output_size: int, bias: bool = True, *, reduce_results: bool = True
    ) -> None:
        self.tp_rank = get_tensor_model_parallel_rank()
        self.tp_size = get_tensor_model_parallel_world_size()
        self.input_size = input_size
        self.output_size = output_size
        self.input_size_per_partition = sharding.divide(input_size, self.tp_size)
        super().__init__(self.input_size_per_partition, output_size, bias=bias)
        self.reduce_results = reduce_results

    def weight_loader(self, param: nn.Parameter, loaded_weight: torch.Tensor) -> None:
        """Keep this rank's input columns of the weight; the bias is whole on every rank."""
        if loaded_weight.dim() == 2:
            loaded_weight = sharding.shard_tensor(loaded_weight, 1, self.tp_rank, self.tp_size)
        _copy_checked(param, loaded_weight, type(self).__name__)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.tp_size == 1:
            return F.linear(x, self.weight, self.bias)
        output = F.linear(x, self.weight, self.bias if self.tp_rank == 0 else None)
        if self.reduce_results:
            check_tensor_model_parallel_world_size(self.tp_size)
            output = tensor_model_parallel_all_reduce(output)
        return output
