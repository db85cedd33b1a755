"""What the engine needs of whatever runs the model, as one type (``Executor``).

Upstream's engine core always talks to an ``Executor`` subclass (``vllm/v1/executor/abstract.py``),
which reaches the model runners through workers even for one GPU. Here the engine drives a
``ModelRunner`` directly when there is one rank, and a ``MultiprocExecutor`` (one worker
process per rank) when there are more; neither inherits from the other, so the common surface is
a ``typing.Protocol`` that both satisfy structurally, and the type checker holds them to it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from mini_vllm.core.sched.output import SchedulerOutput
    from mini_vllm.worker.model_runner import ModelRunnerOutput


class Executor(Protocol):
    """The calls the engine makes, startup to step; ``ModelRunner`` and ``MultiprocExecutor``.

    A step is ``prepare_step``, ``launch_step``, then ``get_output`` (``execute_model`` runs
    the three in a row). They pass handles the engine never looks into: a prepared step and a
    pending one, whose types differ per implementation (device tensors in-process, a sequence
    number across processes). They are typed ``Any`` here for that reason: the engine only
    hands each one back to the object that made it.
    """

    @property
    def kv_cache_block_bytes(self) -> int:
        """Bytes of one KV block across all layers (per rank)."""
        ...

    def set_max_model_len(self, max_model_len: int) -> None:
        """The engine fitted ``max_model_len`` to the KV cache (before allocating it)."""

    def determine_available_memory(
        self, gpu_memory_utilization: float, kv_cache_memory_bytes: int | None
    ) -> int: ...

    def initialize_kv_cache(self, num_gpu_blocks: int) -> None: ...

    def warm_up_model(self) -> None: ...

    def capture_model(self) -> None: ...

    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput: ...

    def prepare_step(self, scheduler_output: SchedulerOutput, in_flight: Any = None) -> Any: ...

    def launch_step(self, prepared: Any) -> Any: ...

    def get_output(self, pending: Any) -> ModelRunnerOutput: ...
