"""Which tensor-parallel group this process belongs to, and its rank in it.

Mirrors upstream's ``vllm/distributed/parallel_state.py`` for tensor parallelism only, so the
tensor-parallel group is the whole world. Nothing is initialised in the single-process engine
(``tensor_parallel_size=1``): the getters then answer rank 0 of 1 and every collective returns its
input, so the model code needs no ``if distributed`` branch and the single-process path starts no
process group at all (upstream's layout: docs/upstream-fidelity.md, module notes).
"""

from __future__ import annotations

import contextlib
import datetime
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass
class GroupCoordinator:
    """A process group plus this process's place in it, and the collectives the model uses.

    ``device_group`` is None for the trivial group of one (no ``torch.distributed`` at all) and
    for a group that only pretends to be rank ``r`` of ``n`` (``model_parallel_state``: building
    a rank's shard of a model in one process, for tests and the lab); calling a collective on the
    latter is a bug, and raises.
    """

    rank_in_group: int = 0
    world_size: int = 1
    device_group: dist.ProcessGroup | None = None

    def _group(self) -> dist.ProcessGroup:
        if self.device_group is None:
            raise RuntimeError(
                f"a collective was called on rank {self.rank_in_group} of {self.world_size} "
                "without a process group (model_parallel_state() only sizes layers)"
            )
        return self.device_group

    def all_reduce(self, input_: torch.Tensor) -> torch.Tensor:
        """Sum ``input_`` over the group, in place; every rank gets the sum."""
        if self.world_size == 1:
            return input_
        dist.all_reduce(input_, group=self._group())
        return input_

    def all_gather(self, input_: torch.Tensor, dim: int = -1) -> torch.Tensor:
        """Every rank's ``input_`` concatenated along ``dim``, in rank order, on every rank."""
        if self.world_size == 1:
            return input_
        input_ = input_.contiguous()
        parts = [torch.empty_like(input_) for _ in range(self.world_size)]
        dist.all_gather(parts, input_, group=self._group())
        return torch.cat(parts, dim=dim)

    def gather(self, input_: torch.Tensor, dst: int = 0, dim: int = -1) -> torch.Tensor | None:
        """Every rank's ``input_`` concatenated along ``dim`` on rank ``dst``; None elsewhere."""
        if self.world_size == 1:
            return input_
        input_ = input_.contiguous()
        parts = (
            [torch.empty_like(input_) for _ in range(self.world_size)]
            if self.rank_in_group == dst
            else None
        )
        dist.gather(input_, parts, dst=dst, group=self._group())
        return torch.cat(parts, dim=dim) if parts is not None else None


_TP: GroupCoordinator | None = None
_SINGLE = GroupCoordinator()


def get_tp_group() -> GroupCoordinator:
    """The tensor-parallel group; the trivial group of one when none was initialised."""
    return _TP if _TP is not None else _SINGLE


def get_tensor_model_parallel_world_size() -> int:
    return get_tp_group().world_size


def get_tensor_model_parallel_rank() -> int:
    return get_tp_group().rank_in_group


def check_tensor_model_parallel_world_size(expected: int) -> None:
    """Raise unless this process is in a tensor-parallel group of ``expected`` ranks.

    A layer built as a shard of ``expected`` ranks and run outside such a group would skip its
    collectives (the trivial group's are no-ops) and compute a fraction of the answer without
    an error; the parallel layers call this before each collective.
    """
    world_size = get_tp_group().world_size
    if world_size != expected:
        raise RuntimeError(
            f"a layer built for {expected} tensor-parallel ranks is running in a group of "
            f"{world_size}"
        )


def model_parallel_is_initialized() -> bool:
    return _TP is not None


def default_backend(device: torch.device) -> str:
    """NCCL between GPUs, gloo between CPU processes (torch.distributed's own backends)."""
    return "nccl" if device.type == "cuda" else "gloo"


def init_distributed_environment(
    world_size: int,
    rank: int,
    distributed_init_method: str,
    backend: str,
    timeout_s: float = 600.0,
    device: torch.device | None = None,
) -> None:
    """Join the world's process group (each worker process calls this once, at startup).

    ``timeout_s`` bounds every collective: a rank whose peer died raises instead of waiting
    forever (the executor also watches the processes, and usually reports the death first).
    """
    if dist.is_initialized():
        raise RuntimeError("torch.distributed is already initialised in this process")
    dist.init_process_group(
        backend=backend,
        init_method=distributed_init_method,
        world_size=world_size,
        rank=rank,
        timeout=datetime.timedelta(seconds=timeout_s),
        # NCCL: bind the communicator to this rank's GPU up front (None: the default, unbound).
        device_id=device if backend == "nccl" else None,
    )


def initialize_model_parallel(tensor_model_parallel_size: int) -> None:
    """Make the tensor-parallel group: with no other kind of parallelism, the whole world."""
    global _TP
    world_size = dist.get_world_size()
    if world_size != tensor_model_parallel_size:
        raise ValueError(
            f"world size {world_size} != tensor_parallel_size {tensor_model_parallel_size} "
            "(mini-vLLM has tensor parallelism only)"
        )
    _TP = GroupCoordinator(dist.get_rank(), world_size, dist.group.WORLD)


def destroy_model_parallel() -> None:
    """Forget the group and leave the process group (a worker's last act)."""
    global _TP
    _TP = None
    if dist.is_initialized():
        dist.destroy_process_group()


@contextlib.contextmanager
def model_parallel_state(rank: int, world_size: int) -> Iterator[None]:
    """Build layers as rank ``rank`` of ``world_size`` would, in this one process.

    Layers read the group only to size themselves and to pick their weight shards, so a model
    built inside this block is exactly the shard that rank holds: that is how the tests check
    that the shards concatenate back to the full weights, without starting processes. Its
    forward would need the collectives, and raises.
    """
    global _TP
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is not in a group of size {world_size}")
    previous = _TP
    _TP = GroupCoordinator(rank, world_size, None)
    try:
        yield
    finally:
        _TP = previous
