"""What a graded test imports: the ``graded`` marker and ``load_impl``.

Graded tests load the learner's module *inside* the test (never at import time), so an
import error or a ``NotImplementedError`` costs the tests that need it, and collecting the
suite never runs learner code: the grader trusts the test list, the points and the hints
because it reads them from a process the graded code has not touched.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any, TypeVar

import pytest

IMPL_ENV = "MINI_VLLM_IMPL"
CHAIN_ENV = "MINI_VLLM_CHAIN"
F = TypeVar("F", bound=Callable[..., Any])

_REPO_ROOT = Path(__file__).resolve().parent.parent


def graded(
    points: int,
    hint: str,
    doc: str,
    *,
    visibility: str = "visible",
    gpu: bool = False,
) -> Callable[[F], F]:
    """Mark a test as graded.

    Args:
        points: what the test is worth.
        hint: what broke when it fails, naming the invariant (``"I2: ..."``).
        doc: the doc section that teaches it, ``path/to/page.md#anchor`` from the repo root.
        visibility: Gradescope visibility (``visible``, ``hidden``, ``after_due_date``,
            ``after_published``); hidden tests still count, their output is withheld.
        gpu: the test needs a CUDA device; without one it is left out of the total.
    """

    def decorate(fn: F) -> F:
        return pytest.mark.graded(
            points=points, hint=hint, doc=doc, visibility=visibility, gpu=gpu
        )(fn)

    return decorate


def impl_dir() -> Path:
    """The folder being graded, which the grader sets; graded suites never run without it."""
    configured = os.environ.get(IMPL_ENV)
    if configured:
        return Path(configured)
    raise RuntimeError(
        f"{IMPL_ENV} is not set: graded suites run through the grader, "
        "`python -m grading lab-NN --impl DIR`"
    )


def load_impl(module: str) -> ModuleType:
    """Import the graded implementation of ``module`` (a file name without ``.py``).

    The folder is put first on ``sys.path`` so that a learner's files can import each
    other; the module is cached like any import, so a failed import is retried (and fails
    again, with the same message) in every test that needs it.
    """
    folder = str(impl_dir())
    if folder not in sys.path:
        sys.path.insert(0, folder)
    _apply_chain()
    path = Path(folder) / f"{module}.py"
    if not path.exists():
        raise ImportError(f"{module}.py is missing from {folder}")
    return importlib.import_module(module)


_chain_applied = False


def _apply_chain() -> None:
    """With ``--chain``, swap the reference symbols for the learner's earlier labs.

    ``MINI_VLLM_CHAIN`` holds ``[[folder, file, {reference_module: [names]}], ...]`` in
    course order; each earlier lab's file is imported and its symbols are set on the
    reference modules before the graded module imports them.
    """
    global _chain_applied
    spec = os.environ.get(CHAIN_ENV)
    if _chain_applied or not spec:
        return
    _chain_applied = True
    for folder, filename, provides in json.loads(spec):
        name = f"_chain_{Path(folder).name.replace('-', '_')}_{filename[:-3]}"
        loader = importlib.util.spec_from_file_location(name, Path(folder) / filename)
        assert loader is not None and loader.loader is not None
        learner = importlib.util.module_from_spec(loader)
        sys.modules[name] = learner
        loader.loader.exec_module(learner)
        for ref_module, names in provides.items():
            target = importlib.import_module(ref_module)
            for symbol in names:
                setattr(target, symbol, getattr(learner, symbol))
