"""What a graded test imports: the ``graded`` marker, ``load_impl`` and ``learner_module``.

Graded tests run in the judge process, which never imports learner code: ``load_impl`` returns
a proxy to the module as imported in a separate, sandboxed learner process
(``grading/remote.py``). Tests load it *inside* the test (never at import time), so an import
error or a ``NotImplementedError`` costs the tests that need it.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest

from grading.remote import Connection, Remote
from grading.sandbox import Staging

IMPL_ENV = "MINI_VLLM_IMPL"
CHAIN_ENV = "MINI_VLLM_CHAIN"
F = TypeVar("F", bound=Callable[..., Any])


def graded(
    points: int,
    hint: str,
    doc: str,
    *,
    visibility: str = "visible",
    gpu: bool = False,
    timeout: float | None = None,
) -> Callable[[F], F]:
    """Mark a test as graded.

    Args:
        points: what the test is worth.
        hint: what broke when it fails, naming the invariant (``"I2: ..."``).
        doc: the doc section that teaches it, ``path/to/page.md#anchor`` from the repo root.
        visibility: Gradescope visibility (``visible``, ``hidden``, ``after_due_date``,
            ``after_published``); hidden tests still count, their output is withheld.
        gpu: the test needs a CUDA device; without one it is left out of the total.
        timeout: seconds this test may run, for the few that need more than the lab's
            per-test ``timeout`` (a random workload of hundreds of operations); the lab's stays
            short, so that a learner's infinite loop in every other test is reported quickly.
            At least five times the solution's time (``check-suites`` prints both).
    """

    def decorate(fn: F) -> F:
        return pytest.mark.graded(
            points=points, hint=hint, doc=doc, visibility=visibility, gpu=gpu, timeout=timeout
        )(fn)

    return decorate


def impl_dir() -> Path:
    """The folder being graded, which the grader sets; graded suites never run without it.

    The judge may read the submitted files as text (to find a stub's task message); it never
    imports them: see :func:`load_impl`.
    """
    configured = os.environ.get(IMPL_ENV)
    if configured:
        return Path(configured)
    raise RuntimeError(
        f"{IMPL_ENV} is not set: graded suites run through the grader, "
        "`python -m grading lab-NN --impl DIR`"
    )


class _Session:
    """The learner process of the running test: started on first use, replaced after a fault.

    A learner process serves consecutive tests as long as they pass; after any other outcome
    (or a timeout, a crash, a ``BaseException``) the next test gets a fresh one, so one broken
    test never leaves state behind for the next.
    """

    def __init__(self) -> None:
        self.staging: Staging | None = None
        self.gpu = False
        self.preload: tuple[str, ...] = ()
        self.conn: Connection | None = None
        self.deadline: float | None = None

    def connection(self) -> Connection:
        if self.staging is None:
            raise RuntimeError("no learner sandbox: graded suites run through the grader")
        if self.conn is None or self.conn.dead is not None:
            if self.conn is not None:
                self.conn.close()
            started = time.monotonic()
            self.conn = Connection(self.staging, gpu=self.gpu, preload=self.preload)
            if self.deadline is not None:  # starting a sandbox is not the test's time
                self.deadline += time.monotonic() - started
        self.conn.deadline = self.deadline
        return self.conn

    def end_test(self, passed: bool) -> None:
        conn, self.conn = self.conn, None
        self.deadline = None
        if conn is None:
            return
        if passed and conn.dead is None and not conn.tainted:
            conn.deadline = time.monotonic() + 10
            try:
                conn.request("reset")
                conn.deadline = None
                self.conn = conn
                return
            except BaseException:
                pass
        conn.close()


SESSION = _Session()


def load_impl(module: str) -> Remote:
    """The graded implementation of ``module`` (a file name without ``.py``), as a proxy.

    The module is imported in the learner process, never here; what the test gets is a
    :class:`grading.remote.Remote` through which it reads and calls the learner's code.
    """
    path = impl_dir() / f"{module}.py"
    if not path.exists():
        raise ImportError(f"{module}.py is missing from {impl_dir()}")
    return SESSION.connection().request("import", module)


def learner_module(name: str) -> Remote:
    """Another module in the learner process: the reference (``mini_vllm.request``) or the
    suite's ``learner_side`` helpers. Objects the learner's code must receive (requests, a
    KV cache manager) are built there, through this."""
    return SESSION.connection().request("import", name)
