"""Let upstream's own core tests import ``vllm.*`` and get mini_vllm instead.

vLLM's tests under ``tests/v1/core/`` import from a dozen ``vllm`` modules at module level,
most of which mini_vllm does not have (configs, multimodal inputs, LoRA, KV events...). The
shim serves every ``vllm.*`` name from a table while it is installed (:func:`installed`):

* a *mirrored* module is a proxy of its mini_vllm twin: attribute reads go to the live
  mini_vllm module (so ``kv_cache_utils.NONE_HASH`` sees ``init_none_hash`` rebind it, and
  ``importlib.reload`` works), with a few names replaced by the adapters below;
* every other ``vllm.*`` module, and any name a mirrored module lacks, is a *placeholder*: a
  class that imports fine, can appear in annotations and ``isinstance``, and raises
  :class:`UpstreamOnlyError` (a ``NotImplementedError``) saying why the moment a test uses it.
  A selected test that needs one fails loudly, and is listed as a known difference.

The shim is only live while a ported test is being imported or run (a meta-path finder and
``sys.modules`` entries, removed afterwards), so nothing else in the test session ever sees a
fake ``vllm``; mini_vllm's ``NONE_HASH`` is restored after each upstream test.

Adaptations (each keeps the semantics the tests check; every other name is mini_vllm's own):

* ``vllm.utils.hashing``: ``sha256`` is mini_vllm's ``sha256`` (SHA-256 of a block's fixed
  byte layout, the engine's hash: the selected tests hash only blocks with flat extra keys and
  seed strings, its whole domain); ``sha256_cbor`` needs ``cbor2``, not a dependency, so the
  second hash function the tests are parametrized over is SHA-256 of the pickled input
  (upstream's own ``sha256``). Both are deterministic, which is all the tests rely on.
* ``Request(..., pooling_params, mm_features, lora_request, prompt_embeds, priority, ...)``:
  a subclass of mini_vllm's ``Request`` taking upstream's keyword arguments;
  any feature mini-vLLM lacks must be left at its default (None/0/False) or it raises.
* ``SamplingParams``: mini_vllm's, accepting upstream-only keyword arguments at their defaults
  (``structured_outputs=None``...); a non-default value raises.
* ``BlockPool(..., enable_kv_cache_events)`` and ``take_events()`` (on the pool and the
  manager): upstream's KV-cache-event API, which the engine does not carry (it emits no
  events). The flag must be False, or it raises; ``take_events()`` returns ``[]``.
* ``KVCacheConfig``, ``KVCacheGroupSpec``, ``KVCacheTensor``, ``FullAttentionSpec``: plain
  records. ``KVCacheManager(kv_cache_config, max_model_len, hash_block_size, ...)`` becomes
  mini_vllm's ``KVCacheManager(num_gpu_blocks=config.num_blocks, block_size=spec.block_size,
  max_model_len, enable_caching, log_stats)`` for a config with exactly one full-attention
  group and ``hash_block_size == block_size``; anything else (hybrid groups, EAGLE, KV events,
  context parallelism, a metrics collector) raises. Upstream's three layers
  (manager -> coordinator -> single-type manager) are one class in mini_vllm, so the adapter
  adds ``manager.coordinator.single_type_managers[0]``, a live view of the manager's own
  ``req_to_blocks`` and ``num_cached_block``, for the tests that inspect them.
* Scheduler tests (``tests/upstream/shim_sched.py``): ``ModelConfig``, ``SchedulerConfig``,
  ``CacheConfig``, ``ParallelConfig``, ``VllmConfig`` are records; ``Scheduler(vllm_config,
  kv_cache_config, structured_output_manager, block_size, ...)`` builds the adapted
  ``KVCacheManager`` and mini_vllm's ``Scheduler(kv_cache_manager, max_num_batched_tokens,
  max_num_seqs, max_model_len, enable_chunked_prefill, long_prefill_token_threshold)``, with
  ``max_model_len`` taken from ``SchedulerConfig`` (upstream reads the model's Hugging Face
  config, which needs the hub). ``update_from_output(output, ModelRunnerOutput)`` passes
  ``{req_id: sampled_token_ids[index]}``, mini_vllm's form. ``SchedulerOutput`` accepts
  upstream's encoder/spec-decode fields when they are empty, and has upstream's
  ``num_common_prefix_blocks``, which the engine's scheduler does not count (no cascade
  attention) and the adapter's ``schedule()`` fills in. ``scheduler.encoder_cache_manager``
  is an always-empty stand-in (no encoder cache), ``connector``/``ec_connector`` are None.
  ``AsyncScheduler`` is mini_vllm's behind the same constructor adapter; ``vllm.v1.utils``'s
  ``ConstantList`` is mini_vllm's. ``VllmConfig`` fills in default scheduler, cache and
  parallel records, as upstream builds default configs.
* KV cache sizing (``tests/upstream/shim_sizing.py``): ``get_kv_cache_configs``,
  ``estimate_max_model_len`` and ``get_max_concurrency_for_kv_cache_config`` for one worker and
  one group of identical full-attention layers, computed by ``mini_vllm.worker.kv_sizing``.
  ``SlidingWindowSpec`` is a record that every adapter refuses, so a test mixing it with full
  attention runs its full-attention part first.
* ``Request`` also refuses, with ``UpstreamOnlyError``, an empty prompt (mini_vllm's ``Request``
  refuses one, where upstream's refuses it only in the input processor) and a
  ``structured_output_request``.
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import hashlib
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import pickle
import sys
import types
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, ClassVar

from mini_vllm import request as _request
from mini_vllm import sampling_params as _sampling_params
from mini_vllm.core import block_pool as _block_pool
from mini_vllm.core import kv_cache_manager as _kv_cache_manager
from mini_vllm.core import kv_cache_utils as _kv_cache_utils
from mini_vllm.engine.llm_engine import EngineKVCacheManager

# Synthetic package the upstream test modules are loaded under (``from .utils import ...``
# in test_scheduler.py resolves inside it). Never ``tests``: that is our own folder.
TEST_PACKAGE = "vllm_upstream_tests"


class UpstreamOnlyError(NotImplementedError):
    """A test used an upstream feature that mini_vllm does not mirror."""


# --------------------------------------------------------------------------------------------
# Placeholders
# --------------------------------------------------------------------------------------------

# Why whole upstream areas are absent; the first matching prefix gives a placeholder's reason.
_REASONS: list[tuple[str, str]] = [
    ("vllm.multimodal", "mini-vLLM has no multimodal inputs"),
    ("vllm.lora", "mini-vLLM has no LoRA adapters"),
    ("vllm.distributed.kv_events", "mini-vLLM emits no KV cache events"),
    ("vllm.config.kv_events", "mini-vLLM emits no KV cache events"),
    ("vllm.v1.kv_cache_interface", "mini-vLLM has one full-attention KV cache group"),
    ("vllm.v1.structured_output", "mini-vLLM has no structured outputs"),
    ("vllm.v1.core.encoder_cache_manager", "mini-vLLM has no encoder cache"),
    ("vllm.v1.metrics", "mini-vLLM keeps PrefixCacheStats only"),
    ("vllm.config", "mini-vLLM's constructors take plain arguments, not vLLM configs"),
    (
        "vllm.v1.core.kv_cache_utils",
        "KV cache config/sizing and multimodal/LoRA hash keys are not mirrored",
    ),
    ("tests.", "a helper from upstream's test tree that the selected tests do not need"),
]


def _reason(qualname: str) -> str:
    for prefix, reason in _REASONS:
        if qualname.startswith(prefix):
            return reason
    return "not mirrored by mini_vllm"


class _PlaceholderMeta(type):
    """Metaclass of placeholders: using one (call, attribute) raises with the reason."""

    _qualname: str
    _why: str

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        raise UpstreamOnlyError(f"{cls._qualname} is upstream-only: {cls._why}")

    def __getattr__(cls, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        raise AttributeError(
            f"{cls._qualname}.{name}: {cls._qualname} is upstream-only: {cls._why}"
        )

    def __repr__(cls) -> str:
        return f"<upstream-only placeholder {cls._qualname}>"


def placeholder(qualname: str, why: str | None = None) -> type:
    """A class standing for upstream's ``qualname``: importable, unusable.

    A class (not an object) so that ``X | None`` annotations and ``isinstance(x, X)`` in the
    test modules keep working at import time.
    """
    name = qualname.rpartition(".")[2]
    return _PlaceholderMeta(name, (), {"_qualname": qualname, "_why": why or _reason(qualname)})


def _is_default(value: Any) -> bool:
    """None, False, 0 or an empty tuple/list/dict: an upstream-only argument left unset.

    Decided by type, never by ``==`` on the value, which a tensor (prompt embeddings)
    cannot answer with one bool.
    """
    if value is None or value is False:
        return True
    if isinstance(value, int | float) and not isinstance(value, bool):
        return value == 0
    if isinstance(value, tuple | list | dict):
        return len(value) == 0
    return False


def reject_unsupported(what: str, **values: Any) -> None:
    """Raise :class:`UpstreamOnlyError` if any upstream-only argument is not at its default."""
    for name, value in values.items():
        if not _is_default(value):
            shown = repr(value) if len(repr(value)) <= 60 else f"<{type(value).__name__}>"
            raise UpstreamOnlyError(f"{what}({name}={shown}): {name} is not mirrored by mini_vllm")


# --------------------------------------------------------------------------------------------
# Adapters: hashing, requests, the KV cache manager
# --------------------------------------------------------------------------------------------


def sha256_pickle(value: Any) -> bytes:
    """Second hash function for the tests' ``hash_fn`` parametrization (stands for sha256_cbor).

    SHA-256 of the pickled value, i.e. what upstream's ``vllm.utils.hashing.sha256`` computes;
    the tests only need a deterministic function of the value different from the first one.
    """
    return hashlib.sha256(pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)).digest()


_SAMPLING_FIELDS = frozenset(f.name for f in dataclasses.fields(_sampling_params.SamplingParams))


class SamplingParams(_sampling_params.SamplingParams):
    """mini_vllm's ``SamplingParams``, accepting upstream-only keywords at their defaults."""

    def __init__(self, **kwargs: Any) -> None:
        extra = {k: kwargs.pop(k) for k in list(kwargs) if k not in _SAMPLING_FIELDS}
        reject_unsupported("SamplingParams", **extra)
        super().__init__(**kwargs)


class Request(_request.Request):
    """mini_vllm's ``Request`` with upstream's constructor signature.

    Upstream's extra inputs (pooling, multimodal features, LoRA, prompt embeddings...) must be
    left unset: mini-vLLM has none of those features; the cache salt passes through. ``priority``
    passes through (the priority policy is mirrored).
    """

    def __init__(
        self,
        request_id: str,
        prompt_token_ids: list[int] | None,
        sampling_params: _sampling_params.SamplingParams | None,
        pooling_params: Any = None,
        client_index: int = 0,
        arrival_time: float | None = None,
        prompt_embeds: Any = None,
        prompt_is_token_ids: list[bool] | None = None,
        mm_features: list[Any] | None = None,
        lora_request: Any = None,
        cache_salt: str | None = None,
        priority: int = 0,
        trace_headers: Mapping[str, str] | None = None,
        block_hasher: Callable[[_request.Request], list[Any]] | None = None,
        resumable: bool = False,
        reasoning_ended: bool | None = None,
        reasoning_parser_kwargs: dict[str, Any] | None = None,
        abort_immediately: bool = False,
    ) -> None:
        reject_unsupported(
            "Request",
            pooling_params=pooling_params,
            client_index=client_index,
            prompt_embeds=prompt_embeds,
            prompt_is_token_ids=prompt_is_token_ids,
            mm_features=mm_features,
            lora_request=lora_request,
            trace_headers=trace_headers,
            resumable=resumable,
            reasoning_ended=reasoning_ended,
            reasoning_parser_kwargs=reasoning_parser_kwargs,
            abort_immediately=abort_immediately,
        )
        assert sampling_params is not None, "mini-vLLM requests always sample"
        if not prompt_token_ids:
            raise UpstreamOnlyError(
                f"Request({request_id!r}, prompt_token_ids={prompt_token_ids!r}): mini_vllm's "
                "Request refuses an empty prompt. Upstream's accepts one at this layer and "
                "refuses it one layer up, in the input processor, where mini_vllm's "
                "LLMEngine.add_request refuses it too."
            )
        super().__init__(
            request_id,
            list(prompt_token_ids or []),
            sampling_params,
            arrival_time=arrival_time,
            block_hasher=block_hasher,
            priority=priority,
            cache_salt=cache_salt,
        )

    @property
    def structured_output_request(self) -> None:
        """Always None: mini-vLLM has no structured outputs (no grammar to advance)."""
        return None

    @structured_output_request.setter
    def structured_output_request(self, value: Any) -> None:
        reject_unsupported("Request", structured_output_request=value)


class BlockPool(_block_pool.BlockPool):
    """mini_vllm's ``BlockPool`` with upstream's KV-cache-event API (see the module docstring).

    The engine emits no KV cache events, so its pool has neither the flag nor ``take_events``:
    they would sit in the allocator for the tests alone. Here ``enable_kv_cache_events=True``
    raises :class:`UpstreamOnlyError` (the strict xfail of ``test_kv_cache_events``) and
    ``take_events`` is always empty, as upstream's is with events off.
    """

    def __init__(
        self,
        num_gpu_blocks: int,
        enable_caching: bool,
        hash_block_size: int,
        enable_kv_cache_events: bool = False,
        metrics_collector: Any = None,
    ) -> None:
        reject_unsupported("BlockPool", enable_kv_cache_events=enable_kv_cache_events)
        super().__init__(
            num_gpu_blocks, enable_caching, hash_block_size, metrics_collector=metrics_collector
        )
        self.enable_kv_cache_events = False

    def take_events(self) -> list[Any]:
        """Upstream drains its event queue here; with events off it is always empty."""
        return []


@dataclasses.dataclass
class FullAttentionSpec:
    """Record of upstream's full-attention layer spec; only ``block_size`` matters here."""

    block_size: int
    num_kv_heads: int = 1
    head_size: int = 1
    dtype: Any = None
    page_size_padded: int | None = None
    sliding_window: int | None = None
    attention_chunk_size: int | None = None


@dataclasses.dataclass(kw_only=True)
class SlidingWindowSpec:
    """Record of upstream's sliding-window layer spec: it can be built and compared, but every
    adapter that would size or allocate for it raises (mini-vLLM has one full-attention group).

    A record, not a placeholder, so that a test which builds one next to a full-attention spec
    still runs its full-attention part against mini_vllm before it fails on the window.
    """

    block_size: int
    num_kv_heads: int
    head_size: int
    dtype: Any
    sliding_window: int
    page_size_padded: int | None = None


@dataclasses.dataclass
class KVCacheGroupSpec:
    """Record: the layers of one KV cache group and their spec."""

    layer_names: list[str]
    kv_cache_spec: Any


@dataclasses.dataclass
class KVCacheTensor:
    """Record: one KV cache tensor and the layers sharing it (unused by the allocator)."""

    size: int
    shared_by: list[str]


@dataclasses.dataclass
class KVCacheConfig:
    """Record of upstream's ``KVCacheConfig``: the pool size and the groups."""

    num_blocks: int
    kv_cache_tensors: list[KVCacheTensor]
    kv_cache_groups: list[KVCacheGroupSpec]


def single_group_block_size(kv_cache_config: KVCacheConfig) -> int:
    """The block size of a one-group, full-attention config; raise for anything else."""
    groups = kv_cache_config.kv_cache_groups
    if len(groups) != 1 or not isinstance(groups[0].kv_cache_spec, FullAttentionSpec):
        kinds = [type(g.kv_cache_spec).__name__ for g in groups]
        raise UpstreamOnlyError(
            f"KV cache groups {kinds}: mini-vLLM has exactly one full-attention group "
            "(no hybrid models)"
        )
    return groups[0].kv_cache_spec.block_size


class _SingleTypeManagerView:
    """Upstream's per-group manager, as a live view of mini_vllm's folded manager."""

    def __init__(self, manager: _kv_cache_manager.KVCacheManager) -> None:
        self._manager = manager

    @property
    def req_to_blocks(self) -> dict[str, list[Any]]:
        return self._manager.req_to_blocks

    @property
    def num_cached_block(self) -> dict[str, int]:
        return self._manager.num_cached_block

    @property
    def block_pool(self) -> Any:
        return self._manager.block_pool

    @property
    def block_size(self) -> int:
        return self._manager.block_size


class _CoordinatorView:
    """Upstream's coordinator: one single-type manager (the full-attention group)."""

    def __init__(self, manager: _kv_cache_manager.KVCacheManager) -> None:
        self.single_type_managers = (_SingleTypeManagerView(manager),)
        self.block_pool = manager.block_pool


class KVCacheManager(EngineKVCacheManager):
    """The engine's ``KVCacheManager`` (lab-07's, plus upstream's ``skip_reading_prefix_cache``
    for prompt logprobs) behind upstream's constructor (see the module docstring)."""

    def __init__(
        self,
        kv_cache_config: KVCacheConfig,
        max_model_len: int,
        hash_block_size: int,
        max_num_batched_tokens: int | None = None,
        enable_caching: bool = True,
        use_eagle: bool = False,
        log_stats: bool = False,
        enable_kv_cache_events: bool = False,
        dcp_world_size: int = 1,
        pcp_world_size: int = 1,
        metrics_collector: Any = None,
    ) -> None:
        reject_unsupported(
            "KVCacheManager",
            use_eagle=use_eagle,
            enable_kv_cache_events=enable_kv_cache_events,
            metrics_collector=metrics_collector,
        )
        if (dcp_world_size, pcp_world_size) != (1, 1):
            raise UpstreamOnlyError("mini-vLLM has no context parallelism")
        block_size = single_group_block_size(kv_cache_config)
        if hash_block_size != block_size:
            raise UpstreamOnlyError(
                f"hash_block_size={hash_block_size} != block_size={block_size}: mini-vLLM "
                "hashes at the block size of its single group"
            )
        super().__init__(
            num_gpu_blocks=kv_cache_config.num_blocks,
            block_size=block_size,
            max_model_len=max_model_len,
            enable_caching=enable_caching,
            log_stats=log_stats,
        )
        self.kv_cache_config = kv_cache_config
        self.coordinator = _CoordinatorView(self)

    def take_events(self) -> list[Any]:
        """Upstream drains the pool's KV cache events here; events are refused above."""
        return []


# --------------------------------------------------------------------------------------------
# The module table
# --------------------------------------------------------------------------------------------


def _lazy(shim_module: str, name: str) -> Callable[[], dict[str, Any]]:
    """Overrides from a sibling adapter module, imported on first use (the allocator tests
    must not depend on the scheduler or the sizing code importing)."""

    def overrides() -> dict[str, Any]:
        module = importlib.import_module(_sibling(shim_module))
        return dict(module.OVERRIDES[name])

    return overrides


def _sched(name: str) -> Callable[[], dict[str, Any]]:
    """Overrides from ``shim_sched``."""
    return _lazy("shim_sched", name)


def _sibling(module: str) -> str:
    package = __name__.rpartition(".")[0]
    return f"{package}.{module}" if package else module


def _static(**names: Any) -> Callable[[], dict[str, Any]]:
    return lambda: dict(names)


# vllm module -> (mini_vllm module it proxies, or None; overrides, built on first use)
TABLE: dict[str, tuple[str | None, Callable[[], dict[str, Any]]]] = {
    "vllm.v1.core.kv_cache_utils": (
        "mini_vllm.core.kv_cache_utils",
        _lazy("shim_sizing", "kv_cache_utils"),
    ),
    "vllm.v1.core.block_pool": ("mini_vllm.core.block_pool", _static(BlockPool=BlockPool)),
    "vllm.v1.core.kv_cache_manager": (
        "mini_vllm.core.kv_cache_manager",
        _static(KVCacheManager=KVCacheManager, Request=Request),
    ),
    "vllm.v1.request": ("mini_vllm.request", _static(Request=Request)),
    "vllm.sampling_params": ("mini_vllm.sampling_params", _static(SamplingParams=SamplingParams)),
    "vllm.utils.mem_constants": (None, _static(GiB_bytes=1 << 30)),
    "vllm.utils.hashing": (
        None,
        _static(sha256=_kv_cache_utils.sha256, sha256_cbor=sha256_pickle),
    ),
    "vllm.v1.kv_cache_interface": (
        None,
        _static(
            FullAttentionSpec=FullAttentionSpec,
            SlidingWindowSpec=SlidingWindowSpec,
            KVCacheConfig=KVCacheConfig,
            KVCacheGroupSpec=KVCacheGroupSpec,
            KVCacheTensor=KVCacheTensor,
        ),
    ),
    "vllm.v1.metrics.stats": ("mini_vllm.metrics.stats", _static()),
    "vllm.v1.engine": ("mini_vllm.request", _static()),
    "vllm.v1.utils": (None, _static(ConstantList=_request.ConstantList)),
    "vllm.config": (None, _sched("vllm.config")),
    "vllm.v1.core.sched.scheduler": ("mini_vllm.core.sched.scheduler", _sched("scheduler")),
    "vllm.v1.core.sched.async_scheduler": (
        "mini_vllm.core.sched.async_scheduler",
        _sched("async_scheduler"),
    ),
    "vllm.v1.core.sched.output": ("mini_vllm.core.sched.output", _sched("output")),
    "vllm.v1.core.sched.request_queue": ("mini_vllm.core.sched.request_queue", _static()),
    "vllm.v1.core.sched.utils": (None, _sched("utils")),
    "vllm.v1.outputs": (None, _sched("outputs")),
    "vllm.v1.structured_output": (None, _sched("structured_output")),
}
# Modules outside ``vllm`` that upstream's test helpers import; served only by exact name.
EXTRA_MODULES: tuple[str, ...] = ("tests.v1.kv_connector.unit.utils",)


class ShimModule(types.ModuleType):
    """A ``vllm.*`` module: its overrides, then its mini_vllm twin (live), then placeholders."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        target, overrides = TABLE.get(name, (None, _static()))
        self.__dict__["_shim_target"] = importlib.import_module(target) if target else None
        self.__dict__["__path__"] = []  # every shim module may have submodules
        self.__dict__.update(overrides())

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        target = self.__dict__.get("_shim_target")
        if target is not None and hasattr(target, name):
            return getattr(target, name)
        stand_in = placeholder(f"{self.__name__}.{name}")
        self.__dict__[name] = stand_in  # one placeholder per name: identity stays stable
        return stand_in


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Serves ``vllm``, ``vllm.*`` and :data:`EXTRA_MODULES` while the shim is installed."""

    def __init__(self, registry: dict[str, types.ModuleType]) -> None:
        self.registry = registry

    @staticmethod
    def serves(name: str) -> bool:
        return name == "vllm" or name.startswith("vllm.") or name in EXTRA_MODULES

    def find_spec(
        self, fullname: str, path: Any = None, target: types.ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if not self.serves(fullname):
            return None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = self.registry.get(spec.name)
        if module is None:
            module = self.registry[spec.name] = ShimModule(spec.name)
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        """Nothing to run: a shim module is complete when created (reload is a no-op)."""


class Shim:
    """Installs and removes the fake ``vllm`` package; the same module objects every time."""

    _instance: ClassVar[Shim | None] = None

    def __init__(self) -> None:
        self.registry: dict[str, types.ModuleType] = {}
        self.finder = _Finder(self.registry)
        self.depth = 0
        self._saved: dict[str, types.ModuleType | None] = {}
        self._none_hash: bytes | None = None

    @classmethod
    def get(cls) -> Shim:
        """The process-wide shim (module identity must survive between install and run)."""
        if cls._instance is None:
            cls._instance = Shim()
        return cls._instance

    def _ours(self) -> list[str]:
        return [name for name in sys.modules if self.finder.serves(name)]

    def install(self) -> None:
        """Make ``import vllm...`` resolve to the shim (re-entrant)."""
        self.depth += 1
        if self.depth > 1:
            return
        self._saved = {name: sys.modules.pop(name) for name in self._ours()}
        for name in EXTRA_MODULES:
            # Served by exact name: their parents (``tests.v1``...) exist in no import path.
            if name not in self.registry:
                self.registry[name] = ShimModule(name)
        sys.modules.update(self.registry)
        sys.meta_path.insert(0, self.finder)
        self._none_hash = _kv_cache_utils.NONE_HASH

    def uninstall(self) -> None:
        """Remove every trace of the shim from ``sys.modules`` and ``sys.meta_path``."""
        self.depth -= 1
        if self.depth > 0:
            return
        with contextlib.suppress(ValueError):
            sys.meta_path.remove(self.finder)
        for name in self._ours():
            self.registry[name] = sys.modules.pop(name)
        sys.modules.update({k: v for k, v in self._saved.items() if v is not None})
        self._saved = {}
        if self._none_hash is not None:
            # Upstream tests re-seed NONE_HASH (init_none_hash); give the rest of the session
            # the value it had.
            _kv_cache_utils.NONE_HASH = self._none_hash  # type: ignore[misc]


@contextlib.contextmanager
def installed() -> Iterator[Shim]:
    """``with installed(): ...``: the shim is live inside the block only."""
    shim = Shim.get()
    shim.install()
    try:
        yield shim
    finally:
        shim.uninstall()


# --------------------------------------------------------------------------------------------
# Loading upstream test modules
# --------------------------------------------------------------------------------------------


def _ensure_package(name: str) -> None:
    """Create the empty synthetic packages above ``name`` (``vllm_upstream_tests.v1.core``)."""
    parts = name.split(".")
    for i in range(1, len(parts)):
        package = ".".join(parts[:i])
        if package not in sys.modules:
            module = types.ModuleType(package)
            module.__path__ = []
            sys.modules[package] = module


def module_name(relpath: str) -> str:
    """``tests/v1/core/test_scheduler.py`` -> ``vllm_upstream_tests.v1.core.test_scheduler``."""
    parts = Path(relpath).with_suffix("").parts
    if parts and parts[0] == "tests":
        parts = parts[1:]
    return ".".join((TEST_PACKAGE, *parts))


def load_test_module(tree: Path, relpath: str, config: Any = None) -> types.ModuleType:
    """Import one upstream test file from the sdist under :data:`TEST_PACKAGE`.

    Call it with the shim installed. Asserts are rewritten the way pytest rewrites test
    modules (when ``config`` is given), so failures show the compared values. The siblings it
    imports relatively (``from .utils import ...``, ``from .test_scheduler import ...``) are
    loaded first, the same way.
    """
    path = tree / relpath
    name = module_name(relpath)
    if name in sys.modules:
        return sys.modules[name]
    _ensure_package(name)
    source = path.read_bytes()
    tree_ast = ast.parse(source, filename=str(path))
    for node in tree_ast.body:
        if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module:
            sibling = Path(relpath).with_name(f"{node.module}.py")
            if (tree / sibling).is_file():
                load_test_module(tree, str(sibling), config)
    if config is not None:
        from _pytest.assertion.rewrite import rewrite_asserts

        rewrite_asserts(tree_ast, source, str(path), config)
    code = compile(tree_ast, str(path), "exec", dont_inherit=True)
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        exec(code, module.__dict__)
    except BaseException:
        del sys.modules[name]
        raise
    return module
