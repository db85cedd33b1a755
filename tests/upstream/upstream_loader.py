"""Import upstream's own allocator modules from the sdist, without importing vLLM.

``vllm/v1/core/block_pool.py`` and friends are plain Python, but their module-level imports
reach into the whole of vLLM (configs, CUDA platform detection, the logger, KV events...).
:func:`load_upstream` executes the real files, unmodified, under their real names
(``vllm.v1.core.block_pool``), while a meta-path finder answers every other ``vllm.*`` import
with a stand-in module: a few small functions the allocator really calls (``init_logger``,
``cdiv``, ``get_dtype_size``...) and, for everything else, placeholder classes that fail if used.

The fake ``vllm`` exists only during the import: afterwards ``sys.modules`` is restored, and
the loaded modules live on through the references returned (their functions keep their own
globals). Nothing here is shared with the test shim (``shim.py``), which maps the same names
onto mini_vllm instead; the two are never installed at the same time.
"""

from __future__ import annotations

import contextlib
import enum
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import logging
import sys
import types
from collections.abc import Callable, Iterator
from functools import cache
from pathlib import Path
from typing import Any

from .shim import placeholder

# The upstream modules executed from the sdist, in no particular order (imports sort it out).
REAL_MODULES: tuple[str, ...] = (
    "vllm.v1.core.kv_cache_utils",
    "vllm.v1.core.block_pool",
    "vllm.v1.kv_cache_interface",
    "vllm.v1.core.single_type_kv_cache_manager",
    "vllm.v1.core.kv_cache_coordinator",
    "vllm.v1.core.kv_cache_manager",
)


def _cdiv(a: int, b: int) -> int:
    return -(a // -b)


def _round_up(x: int, multiple: int) -> int:
    return _cdiv(x, multiple) * multiple


def _get_dtype_size(dtype: Any) -> int:
    import torch

    return torch.tensor([], dtype=dtype).element_size()


class _Envs(types.ModuleType):
    """``vllm.envs``: the one flag the allocator reads, at its default."""

    VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES = False


def _stand_ins() -> dict[str, dict[str, Any]]:
    """Module name -> the attributes it needs (besides placeholders)."""
    return {
        "vllm.logger": {"init_logger": logging.getLogger},
        "vllm.utils.math_utils": {"cdiv": _cdiv, "round_up": _round_up},
        "vllm.utils.torch_utils": {"get_dtype_size": _get_dtype_size},
        # A dataclass default in kv_cache_interface.MambaSpec reads a member at import time.
        "vllm.v1.attention.backends.registry": {
            "MambaAttentionBackendEnum": enum.Enum("MambaAttentionBackendEnum", ["MAMBA2"])
        },
    }


class _StandInModule(types.ModuleType):
    """A ``vllm.*`` module that is not executed: known attributes, else placeholders."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        value = placeholder(f"{self.__name__}.{name}", "not loaded by the differential test")
        setattr(self, name, value)
        return value


class _UpstreamFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Real files for :data:`REAL_MODULES`, stand-ins for every other ``vllm`` module."""

    def __init__(self, tree: Path) -> None:
        self.tree = tree
        self.stand_ins = _stand_ins()

    def find_spec(
        self, fullname: str, path: Any = None, target: types.ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != "vllm" and not fullname.startswith("vllm."):
            return None
        if fullname in REAL_MODULES:
            location = self.tree / (fullname.replace(".", "/") + ".py")
            return importlib.util.spec_from_file_location(fullname, location)
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        if spec.name == "vllm.envs":
            return _Envs(spec.name)
        return _StandInModule(spec.name)

    def exec_module(self, module: types.ModuleType) -> None:
        module.__path__ = []
        for name, value in self.stand_ins.get(module.__name__, {}).items():
            setattr(module, name, value)


@contextlib.contextmanager
def _private_vllm(tree: Path) -> Iterator[None]:
    """A fake ``vllm`` for the duration of the block; ``sys.modules`` restored afterwards."""
    is_vllm: Callable[[str], bool] = lambda n: n == "vllm" or n.startswith("vllm.")  # noqa: E731
    saved = {name: sys.modules.pop(name) for name in [n for n in sys.modules if is_vllm(n)]}
    finder = _UpstreamFinder(tree)
    sys.meta_path.insert(0, finder)
    try:
        yield
    finally:
        sys.meta_path.remove(finder)
        for name in [n for n in sys.modules if is_vllm(n)]:
            del sys.modules[name]
        sys.modules.update(saved)


@cache
def load_upstream(tree: Path) -> types.SimpleNamespace:
    """Upstream's allocator modules, executed from ``tree`` (cached per tree).

    Returns a namespace with one attribute per module, by its last name:
    ``kv_cache_utils``, ``block_pool``, ``kv_cache_interface``, ``kv_cache_manager``...
    """
    modules: dict[str, types.ModuleType] = {}
    with _private_vllm(tree):
        for name in REAL_MODULES:
            modules[name.rpartition(".")[2]] = importlib.import_module(name)
    return types.SimpleNamespace(**modules)
