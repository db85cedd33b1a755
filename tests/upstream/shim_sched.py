"""Scheduler-side adapters of the upstream-test shim (see ``shim.py``'s docstring).

Kept apart from ``shim.py`` and imported only when a test module imports a scheduler name, so
that the allocator tests keep running whatever state the scheduler is in.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from mini_vllm.core.sched import async_scheduler as _async_scheduler
from mini_vllm.core.sched import output as _output
from mini_vllm.core.sched import scheduler as _scheduler

from .shim import (
    KVCacheConfig,
    KVCacheManager,
    UpstreamOnlyError,
    placeholder,
    reject_unsupported,
)


class _Record:
    """A config record: keyword arguments become attributes over class-level defaults.

    Upstream's config classes validate and derive dozens of fields (and read the model's
    Hugging Face config); the tests only pass values through to the scheduler.
    """

    def __init__(self, **kwargs: Any) -> None:
        self.__dict__.update(kwargs)

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}={v!r}" for k, v in self.__dict__.items())
        return f"{type(self).__name__}({fields})"


class ModelConfig(_Record):
    """Record; the model name is never loaded (no hub access, no model in the scheduler).

    ``original_max_model_len`` is the length as given (upstream keeps it to know that ``-1``,
    fit to the KV cache, was asked for); ``max_model_len`` must be given where it is read,
    since upstream's default comes from the model's Hugging Face config.
    """

    model: str = "facebook/opt-125m"
    max_model_len: int | None = None
    is_encoder_decoder: bool = False

    def __init__(self, model: str = "facebook/opt-125m", **kwargs: Any) -> None:
        kwargs.setdefault("original_max_model_len", kwargs.get("max_model_len"))
        super().__init__(model=model, **kwargs)


class SchedulerConfig(_Record):
    """Record of the scheduling knobs mini_vllm's ``Scheduler`` takes as arguments."""

    max_num_seqs: int = 128
    max_num_batched_tokens: int = 2048
    max_model_len: int = 2048
    long_prefill_token_threshold: int = 0
    enable_chunked_prefill: bool = True
    scheduler_reserve_full_isl: bool = True
    policy: str = "fcfs"
    disable_chunked_mm_input: bool = False
    async_scheduling: bool = False
    is_encoder_decoder: bool = False
    disable_hybrid_kv_cache_manager: bool = False


class CacheConfig(_Record):
    """Record: block size and whether prefix caching is on."""

    block_size: int = 16
    enable_prefix_caching: bool = False
    num_gpu_blocks: int | None = None
    num_gpu_blocks_override: int | None = None


class ParallelConfig(_Record):
    """Record: mini-vLLM runs on one device, so only the default is accepted."""

    pipeline_parallel_size: int = 1


class VllmConfig(_Record):
    """Record holding the other configs; unsupported features must be None.

    The scheduler, cache and parallel configs left out are default records, as upstream
    builds default configs (the sizing tests set ``vllm_config.cache_config`` fields).
    """

    model_config: ModelConfig | None = None
    scheduler_config: SchedulerConfig | None = None
    cache_config: CacheConfig | None = None
    parallel_config: ParallelConfig | None = None
    kv_transfer_config: Any = None
    speculative_config: Any = None
    ec_transfer_config: Any = None
    lora_config: Any = None

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("scheduler_config", SchedulerConfig())
        kwargs.setdefault("cache_config", CacheConfig())
        kwargs.setdefault("parallel_config", ParallelConfig())
        super().__init__(**kwargs)


class StructuredOutputManager:
    """Accepted and ignored: mini-vLLM has no structured outputs (no request uses one)."""

    def __init__(self, vllm_config: Any) -> None:
        self.vllm_config = vllm_config


@dataclasses.dataclass
class ModelRunnerOutput:
    """Record of what the model runner returns; the scheduler reads the sampled tokens."""

    req_ids: list[str]
    req_id_to_index: dict[str, int]
    sampled_token_ids: list[list[int]] = dataclasses.field(default_factory=list)
    logprobs: Any = None
    prompt_logprobs_dict: dict[str, Any] = dataclasses.field(default_factory=dict)
    pooler_output: Any = None
    kv_connector_output: Any = None
    ec_connector_output: Any = None
    num_nans_in_logits: Any = None


@dataclasses.dataclass
class SchedulerOutput(_output.SchedulerOutput):
    """mini_vllm's ``SchedulerOutput`` with upstream's fields that the engine does not carry.

    ``num_common_prefix_blocks`` is upstream's (cascade attention's shared prefix, per group);
    the engine's runner does no cascade attention, so its scheduler does not count it every
    step, and the :class:`Scheduler` adapter fills it in here. The encoder fields must be empty.
    """

    num_common_prefix_blocks: list[int] = dataclasses.field(default_factory=list)
    scheduled_encoder_inputs: Any = None
    free_encoder_mm_hashes: Any = None

    def __post_init__(self) -> None:
        reject_unsupported(
            "SchedulerOutput",
            scheduled_encoder_inputs=self.scheduled_encoder_inputs,
            free_encoder_mm_hashes=self.free_encoder_mm_hashes,
        )


def num_common_prefix_blocks(scheduler: _scheduler.Scheduler) -> list[int]:
    """What upstream's ``schedule()`` puts in ``num_common_prefix_blocks``, asked of ours.

    The leading blocks of the first running request that every request holding blocks shares,
    per KV cache group; zeros when nothing runs (``Scheduler.schedule``
    (vllm/v1/core/sched/scheduler.py:838-846)). Upstream counts them before
    ``_update_after_schedule``, which changes no block, so asking after ``schedule()`` returns
    gives the same figure.
    """
    manager = scheduler.kv_cache_manager
    if not scheduler.running:
        return [0] * manager.num_kv_cache_groups
    return manager.get_num_common_prefix_blocks(scheduler.running[0].request_id)


class _NoEncoderCache:
    """Stand-in for ``EncoderCacheManager``: mini-vLLM caches no encoder outputs."""

    freed: tuple[str, ...] = ()
    cached: dict[str, Any] = {}  # noqa: RUF012 (read-only, always empty)


class Scheduler(_scheduler.Scheduler):
    """mini_vllm's ``Scheduler`` behind upstream's constructor (see ``shim.py``'s docstring)."""

    def __init__(
        self,
        vllm_config: VllmConfig,
        kv_cache_config: KVCacheConfig,
        structured_output_manager: Any,
        block_size: int,
        hash_block_size: int | None = None,
        mm_registry: Any = None,
        include_finished_set: bool = False,
        log_stats: bool = False,
    ) -> None:
        reject_unsupported(
            "VllmConfig",
            kv_transfer_config=vllm_config.kv_transfer_config,
            speculative_config=vllm_config.speculative_config,
            ec_transfer_config=vllm_config.ec_transfer_config,
            lora_config=vllm_config.lora_config,
        )
        scheduler_config = vllm_config.scheduler_config
        cache_config = vllm_config.cache_config
        parallel_config = vllm_config.parallel_config
        assert scheduler_config is not None and cache_config is not None
        if parallel_config is not None and parallel_config.pipeline_parallel_size != 1:
            raise UpstreamOnlyError("mini-vLLM has no pipeline parallelism")
        reject_unsupported("Scheduler", include_finished_set=include_finished_set)
        max_model_len = scheduler_config.max_model_len
        manager = KVCacheManager(
            kv_cache_config,
            max_model_len=max_model_len,
            hash_block_size=hash_block_size or block_size,
            enable_caching=bool(cache_config.enable_prefix_caching),
            log_stats=log_stats,
        )
        super().__init__(
            manager,
            max_num_batched_tokens=scheduler_config.max_num_batched_tokens,
            max_num_seqs=scheduler_config.max_num_seqs,
            max_model_len=max_model_len,
            enable_chunked_prefill=scheduler_config.enable_chunked_prefill,
            long_prefill_token_threshold=scheduler_config.long_prefill_token_threshold,
            scheduler_reserve_full_isl=scheduler_config.scheduler_reserve_full_isl,
            policy=scheduler_config.policy,
        )
        self.vllm_config = vllm_config
        self.structured_output_manager = structured_output_manager
        self.encoder_cache_manager = _NoEncoderCache()
        self.connector = None
        self.ec_connector = None

    def schedule(self) -> SchedulerOutput:
        """mini_vllm's step, as upstream's output: ``num_common_prefix_blocks`` filled in."""
        output = super().schedule()
        fields = {f.name: getattr(output, f.name) for f in dataclasses.fields(output)}
        return SchedulerOutput(**fields, num_common_prefix_blocks=num_common_prefix_blocks(self))

    def update_from_output(  # type: ignore[override]
        self, scheduler_output: _output.SchedulerOutput, model_runner_output: Any
    ) -> Any:
        """Upstream's signature: take the sampled tokens out of a ``ModelRunnerOutput``."""
        if isinstance(model_runner_output, ModelRunnerOutput):
            reject_unsupported(
                "ModelRunnerOutput",
                logprobs=model_runner_output.logprobs,
                kv_connector_output=model_runner_output.kv_connector_output,
                ec_connector_output=model_runner_output.ec_connector_output,
            )
            sampled = {
                req_id: list(model_runner_output.sampled_token_ids[index])
                for req_id, index in model_runner_output.req_id_to_index.items()
            }
        else:
            sampled = model_runner_output
        return super().update_from_output(scheduler_output, sampled)


class AsyncScheduler(Scheduler, _async_scheduler.AsyncScheduler):
    """mini_vllm's ``AsyncScheduler`` behind upstream's constructor.

    The method resolution order is this adapter, the ``Scheduler`` adapter, mini_vllm's
    ``AsyncScheduler``, mini_vllm's ``Scheduler``: the adapter's ``__init__`` and
    ``update_from_output`` translate upstream's arguments, the placeholders are mini_vllm's.
    """


# Names each shim module gets, on top of its mini_vllm twin (keys used by shim.TABLE).
OVERRIDES: dict[str, dict[str, Any]] = {
    "vllm.config": {
        "ModelConfig": ModelConfig,
        "SchedulerConfig": SchedulerConfig,
        "CacheConfig": CacheConfig,
        "ParallelConfig": ParallelConfig,
        "VllmConfig": VllmConfig,
        "KVTransferConfig": placeholder("vllm.config.KVTransferConfig", "no KV connectors"),
        "ECTransferConfig": placeholder("vllm.config.ECTransferConfig", "no encoder cache"),
        "SpeculativeConfig": placeholder(
            "vllm.config.SpeculativeConfig", "no speculative decoding"
        ),
    },
    "scheduler": {"Scheduler": Scheduler},
    "async_scheduler": {"AsyncScheduler": AsyncScheduler},
    "output": {"SchedulerOutput": SchedulerOutput},
    "utils": {
        "check_stop": _scheduler.check_stop,
        "check_sequence_repetition": _scheduler.check_sequence_repetition,
    },
    "outputs": {"ModelRunnerOutput": ModelRunnerOutput},
    "structured_output": {"StructuredOutputManager": StructuredOutputManager},
}
