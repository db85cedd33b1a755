"""One tensor-parallel rank: its device, its process group, its shard of the model, its KV cache.

Mirrors ``vllm/v1/worker/gpu_worker.py`` (``Worker``): the object a worker process builds and the
executor calls methods on by name (``init_device``, ``load_model``,
``determine_available_memory``, ``initialize_kv_cache``, ``compile_or_warm_up_model``,
``execute_model``). The per-step work is the single-process ``ModelRunner``'s, unaware of the
shard, and every rank samples the same tokens (docs/upstream-fidelity.md, module notes).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from mini_vllm.distributed import parallel_state
from mini_vllm.model.loader import build_model
from mini_vllm.worker.model_runner import ModelRunner, ModelRunnerOutput
from mini_vllm.worker.profiler import KernelProfiler

if TYPE_CHECKING:
    from mini_vllm.core.sched.output import SchedulerOutput

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class WorkerConfig:
    """What every rank is told at startup (picklable: it crosses the process boundary)."""

    world_size: int
    distributed_init_method: str
    device_type: str  # "cpu" or "cuda"; rank r uses cuda:r (one host)
    dtype: str
    block_size: int
    max_model_len: int
    max_num_seqs: int
    max_num_batched_tokens: int
    seed: int = 0
    enforce_eager: bool = False
    collective_timeout_s: float = 600.0


class Worker:
    """A rank's state, built in its own process; the executor calls its methods by name."""

    def __init__(self, rank: int, config: WorkerConfig) -> None:
        self.rank = rank
        self.local_rank = rank  # one host: local rank == global rank
        self.config = config
        self.device = torch.device("cpu")
        self.model_runner: ModelRunner | None = None
        self.profiler = KernelProfiler()

    def init_device(self) -> None:
        """Pick this rank's device, join the process group, make the tensor-parallel group.

        CUDA: ``cuda:<local rank>`` and NCCL. CPU: gloo, and this process's share of the cores
        (N ranks each using every core would spend their time contending for them).
        """
        config = self.config
        os.environ.setdefault("RANK", str(self.rank))
        os.environ.setdefault("LOCAL_RANK", str(self.local_rank))
        os.environ.setdefault("WORLD_SIZE", str(config.world_size))
        if config.device_type == "cuda":
            self.device = torch.device("cuda", self.local_rank)
            torch.cuda.set_device(self.device)
        else:
            torch.set_num_threads(max(1, (os.cpu_count() or 1) // config.world_size))
        parallel_state.init_distributed_environment(
            world_size=config.world_size,
            rank=self.rank,
            distributed_init_method=config.distributed_init_method,
            backend=parallel_state.default_backend(self.device),
            timeout_s=config.collective_timeout_s,
            device=self.device if self.device.type == "cuda" else None,
        )
        parallel_state.initialize_model_parallel(config.world_size)

    def load_model(self, hf_config: Any, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Build this rank's shard from the full tensors and the runner around it.

        CUDA graphs capture the NCCL all-reduces with the rest of a decode step: every rank
        captures the same batch sizes in the same order, so their collectives pair up on replay.
        """
        config = self.config
        model = build_model(hf_config, weights, self.device, config.dtype)
        self.model_runner = ModelRunner(
            model,
            self.device,
            block_size=config.block_size,
            max_model_len=config.max_model_len,
            max_num_seqs=config.max_num_seqs,
            max_num_batched_tokens=config.max_num_batched_tokens,
            enforce_eager=config.enforce_eager,
            seed=config.seed,
        )

    @property
    def runner(self) -> ModelRunner:
        if self.model_runner is None:
            raise RuntimeError(f"rank {self.rank}: load_model was not called")
        return self.model_runner

    def describe(self) -> dict[str, Any]:
        """Who we are and what one block costs here (the executor asks once, at startup).

        Asked again later, it also says which decode batch sizes were captured in CUDA graphs.
        """
        model = self.runner.model
        return {
            "rank": self.rank,
            "pid": os.getpid(),
            "device": str(self.device),
            "num_heads": model.num_heads,
            "num_kv_heads": model.num_kv_heads,
            "kv_cache_block_bytes": self.runner.kv_cache_block_bytes,
            "dtype": str(self.runner.dtype).removeprefix("torch."),
            "backend": torch.distributed.get_backend(),
            "cudagraph_batch_sizes": list(self.runner.cudagraph_batch_sizes),
        }

    def determine_available_memory(
        self, gpu_memory_utilization: float, kv_cache_memory_bytes: int | None
    ) -> int:
        """This rank's KV cache budget in bytes (every rank profiles together: collectives)."""
        return self.runner.determine_available_memory(gpu_memory_utilization, kv_cache_memory_bytes)

    def initialize_kv_cache(self, num_gpu_blocks: int) -> None:
        """Allocate this rank's cache: ``num_gpu_blocks`` blocks of its own KV heads."""
        self.runner.initialize_kv_cache(num_gpu_blocks)

    def compile_or_warm_up_model(self) -> list[int]:
        """Warm up, capture the decode graphs; return the captured batch sizes."""
        self.runner.warm_up_model()
        self.runner.capture_model()
        return self.runner.cudagraph_batch_sizes

    def set_max_model_len(self, max_model_len: int) -> None:
        self.runner.set_max_model_len(max_model_len)

    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        return self.runner.execute_model(scheduler_output)

    def profile(self, is_start: bool = True) -> dict[str, tuple[int, float]] | None:
        """Start, or stop and report, this rank's kernel profile (upstream's ``profile``).

        Upstream writes a trace file per rank; this returns ``{kernel: (calls, device µs)}``
        instead, which is what a benchmark divides (``bench/bench_tp.py``).
        """
        if is_start:
            self.profiler.start()
            return None
        return self.profiler.stop()

    def shutdown(self) -> None:
        parallel_state.destroy_model_parallel()
