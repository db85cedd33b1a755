"""Upstream's real ``Scheduler`` and ``AsyncScheduler``, built on CPU from the sdist.

``upstream_loader.py`` executes upstream's allocator files; this module executes, on top of
them, the scheduler's own files unmodified (``vllm/v1/core/sched/*.py``, ``vllm/v1/request.py``,
``vllm/v1/engine/__init__.py``, ``vllm/v1/outputs.py``, ``vllm/v1/metrics/stats.py``,
``vllm/sampling_params.py``, ``vllm/envs.py``, ``vllm/v1/utils.py``...), under their real names,
while every other ``vllm.*`` import gets a stand-in. Nothing needs installing: the modules read
only numpy, torch, msgspec and pydantic, which the dev environment has.

The stand-ins are the parts of vLLM that a one-model, one-GPU scheduler never reaches, and
each answers the one call the scheduler makes at construction:

- ``MULTIMODAL_REGISTRY.supports_multimodal_inputs`` -> False (text-only model);
- ``EventPublisherFactory.create`` -> None (no KV cache events: the scheduler publishes only
  when the KV cache manager has events, and it has none with events off);
- ``PydanticMsgspecMixin``: an empty mixin (it only teaches pydantic to validate the struct);
- ``UsageContext``: an enum (a default argument of a function in ``vllm/v1/utils.py``);
- ``uvloop``: an empty module (imported by ``vllm/v1/utils.py``, never called);
- the ``StructuredOutputManager`` passed to the scheduler (:class:`NoStructuredOutputs`):
  no request asks for a grammar, so it never advances one.

The configuration is the one thing faked on purpose: :class:`Record` objects carry exactly the
fields upstream's ``Scheduler`` reads, at upstream's defaults where the trace does not set
them, and a read of any other field fails loudly (so a new field read at a new pin is seen,
not silently defaulted). ``KVCacheConfig`` and the specs are upstream's own.

As in ``upstream_loader.py``, the fake ``vllm`` exists only while the modules are imported;
the loaded modules live on through the namespace returned. If upstream imported a ``vllm``
module lazily inside a function the traces reach, that import would fail loudly.
"""

from __future__ import annotations

import contextlib
import enum
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

from mini_vllm.core import kv_cache_utils as mini_kv_cache_utils

from . import upstream_loader

# Executed from the sdist, besides upstream_loader.REAL_MODULES.
SCHED_MODULES: tuple[str, ...] = (
    "vllm.envs",
    "vllm.utils",
    "vllm.sampling_params",
    "vllm.v1.utils",
    "vllm.v1.outputs",
    "vllm.v1.engine",
    "vllm.v1.metrics.stats",
    "vllm.v1.structured_output.request",
    "vllm.v1.request",
    "vllm.v1.core.encoder_cache_manager",
    "vllm.v1.core.sched.interface",
    "vllm.v1.core.sched.output",
    "vllm.v1.core.sched.request_queue",
    "vllm.v1.core.sched.utils",
    "vllm.v1.core.sched.scheduler",
    "vllm.v1.core.sched.async_scheduler",
)
REAL_MODULES = frozenset(upstream_loader.REAL_MODULES) | frozenset(SCHED_MODULES)


class _TextOnlyRegistry:
    """``MULTIMODAL_REGISTRY``: the model takes text only."""

    def supports_multimodal_inputs(self, model_config: Any) -> bool:
        return False


class _NoEventPublisher:
    """``EventPublisherFactory``: KV cache events are off, so there is no publisher."""

    @staticmethod
    def create(config: Any, data_parallel_index: int = 0) -> None:
        return None


class _PydanticMsgspecMixin:
    """``PydanticMsgspecMixin``: pydantic validation of ``SamplingParams`` is not needed."""


_UsageContext = enum.Enum(
    "UsageContext",
    ["UNKNOWN_CONTEXT", "LLM_CLASS", "API_SERVER", "OPENAI_API_SERVER", "ENGINE_CONTEXT"],
)


def _stand_ins() -> dict[str, dict[str, Any]]:
    """Module name -> attributes, on top of ``upstream_loader``'s."""
    stand_ins = upstream_loader._stand_ins()
    stand_ins.update(
        {
            "vllm.multimodal": {"MULTIMODAL_REGISTRY": _TextOnlyRegistry()},
            "vllm.distributed.kv_events": {"EventPublisherFactory": _NoEventPublisher},
            "vllm.v1.serial_utils": {"PydanticMsgspecMixin": _PydanticMsgspecMixin},
            "vllm.usage.usage_lib": {"UsageContext": _UsageContext},
        }
    )
    return stand_ins


class _SchedFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Real files for :data:`REAL_MODULES`, stand-ins for other ``vllm`` modules and uvloop."""

    def __init__(self, tree: Path) -> None:
        self.tree = tree
        self.stand_ins = _stand_ins()

    def find_spec(
        self, fullname: str, path: Any = None, target: types.ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname == "uvloop":
            return importlib.machinery.ModuleSpec(fullname, self)
        if fullname != "vllm" and not fullname.startswith("vllm."):
            return None
        if fullname in REAL_MODULES:
            base = self.tree / fullname.replace(".", "/")
            if (base / "__init__.py").is_file():  # a package (vllm.utils, vllm.v1.engine)
                return importlib.util.spec_from_file_location(
                    fullname, base / "__init__.py", submodule_search_locations=[]
                )
            return importlib.util.spec_from_file_location(fullname, f"{base}.py")
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        if spec.name == "uvloop":
            return types.ModuleType(spec.name)
        return upstream_loader._StandInModule(spec.name)

    def exec_module(self, module: types.ModuleType) -> None:
        if module.__name__ == "uvloop":
            return
        module.__path__ = []
        for name, value in self.stand_ins.get(module.__name__, {}).items():
            setattr(module, name, value)


@contextlib.contextmanager
def _private_vllm(tree: Path) -> Iterator[None]:
    """A fake ``vllm`` for the duration of the block; ``sys.modules`` restored afterwards."""

    def ours(name: str) -> bool:
        return name in ("vllm", "uvloop") or name.startswith("vllm.")

    saved = {name: sys.modules.pop(name) for name in [n for n in sys.modules if ours(n)]}
    finder = _SchedFinder(tree)
    sys.meta_path.insert(0, finder)
    try:
        yield
    finally:
        sys.meta_path.remove(finder)
        for name in [n for n in sys.modules if ours(n)]:
            del sys.modules[name]
        sys.modules.update(saved)


@cache
def load_upstream_scheduler(tree: Path) -> types.SimpleNamespace:
    """Upstream's scheduler modules and their allocator, executed from ``tree`` (cached).

    Attributes by last name: ``scheduler``, ``async_scheduler``, ``request``,
    ``sampling_params``, ``kv_cache_interface``, ``kv_cache_utils``, ``engine``...
    """
    modules: dict[str, types.ModuleType] = {}
    with _private_vllm(tree):
        for name in (*upstream_loader.REAL_MODULES, *SCHED_MODULES):
            modules[name.rpartition(".")[2]] = importlib.import_module(name)
    # Upstream seeds NONE_HASH at engine start-up (init_none_hash); both sides chain from
    # mini_vllm's seed so that equal tokens give equal hashes.
    modules["kv_cache_utils"].NONE_HASH = mini_kv_cache_utils.NONE_HASH
    return types.SimpleNamespace(**modules)


class NoStructuredOutputs:
    """The scheduler's ``structured_output_manager``: no request has a grammar."""

    def should_advance(self, request: Any) -> bool:
        return False


class Record:
    """A fake config: the given fields, and a loud error for any other.

    Upstream's config classes validate and derive many fields from a Hugging Face model; the
    scheduler only reads a few. Reading a field not given names it, so that a field upstream
    starts reading at a new pin is added here on purpose, with its upstream default.
    """

    def __init__(self, _name: str, **fields: Any) -> None:
        self.__dict__["_name"] = _name
        self.__dict__.update(fields)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        raise AttributeError(
            f"the differential's fake {self._name} has no field {name!r}: upstream's "
            f"Scheduler reads it; add it to tests/upstream/upstream_sched.py with upstream's "
            f"default"
        )

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}={v!r}" for k, v in self.__dict__.items() if k != "_name")
        return f"{self._name}({fields})"


def fake_vllm_config(
    *,
    num_gpu_blocks: int,
    block_size: int,
    max_model_len: int,
    max_num_batched_tokens: int,
    max_num_seqs: int,
    enable_prefix_caching: bool,
    enable_chunked_prefill: bool,
    long_prefill_token_threshold: int,
    scheduler_reserve_full_isl: bool,
    async_scheduling: bool,
) -> Record:
    """The ``VllmConfig`` upstream's ``Scheduler`` reads, for one full-attention model.

    Every value not passed in is upstream's default at the pin (``vllm/config/*.py``) for a
    decoder-only text model on one GPU with no connector, no LoRA and no speculative decoding.
    """
    model_config = Record(
        "ModelConfig",
        max_model_len=max_model_len,
        is_encoder_decoder=False,
        enable_return_routed_experts=False,
        runner_type="generate",
    )
    scheduler_config = Record(
        "SchedulerConfig",
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        max_num_scheduled_tokens=None,  # falls back to max_num_batched_tokens
        max_model_len=max_model_len,
        enable_chunked_prefill=enable_chunked_prefill,
        long_prefill_token_threshold=long_prefill_token_threshold,
        scheduler_reserve_full_isl=scheduler_reserve_full_isl,
        async_scheduling=async_scheduling,
        policy="fcfs",
        disable_chunked_mm_input=False,
        max_num_partial_prefills=1,
        max_long_partial_prefills=1,
        is_encoder_decoder=False,
    )
    cache_config = Record(
        "CacheConfig",
        block_size=block_size,
        num_gpu_blocks=num_gpu_blocks,
        enable_prefix_caching=enable_prefix_caching,
        mamba_cache_mode="none",
    )
    parallel_config = Record(
        "ParallelConfig",
        pipeline_parallel_size=1,
        data_parallel_index=0,
        decode_context_parallel_size=1,
        prefill_context_parallel_size=1,
    )
    observability_config = Record(
        "ObservabilityConfig", kv_cache_metrics=False, enable_mfu_metrics=False
    )
    return Record(
        "VllmConfig",
        model_config=model_config,
        scheduler_config=scheduler_config,
        cache_config=cache_config,
        parallel_config=parallel_config,
        observability_config=observability_config,
        lora_config=None,
        kv_events_config=None,
        kv_transfer_config=None,
        ec_transfer_config=None,
        speculative_config=None,
        use_v2_model_runner=False,
    )
