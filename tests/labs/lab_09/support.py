"""Helpers of the lab-09 suite: the learner's ``model_inputs``, after a judge-side look at which
functions are still stubs.

A function whose body (after its docstring) still begins with ``raise NotImplementedError(...)``
can do nothing else when called, so a test that needs it is NOT STARTED, with the stub's own
message, told from the file's text (``impl_dir()``: the judge reads the submitted file, never
imports it). That costs no learner process: a fresh stub otherwise starts one per test, since
a learner process is replaced after every test that does not pass.
"""

from __future__ import annotations

import ast
import functools
from typing import Any

from grading.remote import Remote
from grading.suite import impl_dir, learner_module, load_impl
from tests.labs.common import describe

MODULE = "model_inputs"


@functools.lru_cache(maxsize=4)
def _stub_messages(source: str) -> dict[str, str]:
    """``{function name: message}`` for the top-level functions that are still stubs."""
    tree = ast.parse(source)
    rebound = set()
    for node in tree.body:  # a name assigned or imported at top level may not be the def's
        targets = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, ast.AnnAssign | ast.AugAssign):
            targets = [node.target]
        rebound |= {t.id for t in targets if isinstance(t, ast.Name)}
        if isinstance(node, ast.Import | ast.ImportFrom):
            rebound |= {(a.asname or a.name).split(".")[0] for a in node.names}
    stubs: dict[str, str] = {}
    for node in tree.body:
        if not isinstance(node, ast.FunctionDef):
            continue
        stubs.pop(node.name, None)  # a later def replaces an earlier one
        body = node.body
        if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
            body = body[1:]  # the docstring
        first = body[0] if body else None
        if not isinstance(first, ast.Raise) or first.exc is None:
            continue
        exc = first.exc.func if isinstance(first.exc, ast.Call) else first.exc
        if isinstance(exc, ast.Name) and exc.id == "NotImplementedError":
            args = first.exc.args if isinstance(first.exc, ast.Call) else []
            parts = [str(a.value) for a in args if isinstance(a, ast.Constant)]
            stubs[node.name] = " ".join(parts) or f"lab-09: {node.name} is not written yet"
    return {name: message for name, message in stubs.items() if name not in rebound}


class Impl:
    """The learner's ``model_inputs``: its attributes are the module's (a proxy), but
    ``prepare_inputs`` runs through ``learner_side.prepare_inputs``, which also sends back the
    arguments as they are after the call (``last_arguments``: ``[args, kwargs]``).

    Every call goes that way, so the one whose arguments the purity test compares is like every
    other (a function that looked up its call stack for the helper would find it every time).
    """

    def __init__(self, module: Remote) -> None:
        self._module = module
        self.last_arguments: Any = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._module, name)

    def prepare_inputs(self, *args: Any, **kwargs: Any) -> Any:
        reply = learner_module("learner_side").prepare_inputs(*args, **kwargs)
        if type(reply) is not list or len(reply) != 3:
            raise AssertionError(f"prepare_inputs' call came back as {describe(reply)}")
        inputs, *self.last_arguments = reply
        return inputs


def runner(*needs: str) -> Impl:
    """The learner's ``model_inputs`` (:class:`Impl`); NOT STARTED if a function in ``needs`` is
    a stub.

    A function that is written but calls a stub helper still raises the helper's
    ``NotImplementedError`` when it runs, which is NOT STARTED too.
    """
    try:
        stubs = _stub_messages((impl_dir() / f"{MODULE}.py").read_text(errors="replace"))
    except (OSError, SyntaxError, ValueError, RecursionError, MemoryError):
        stubs = {}  # the import tells what is wrong with the file
    for name in needs:
        if name in stubs:
            raise NotImplementedError(stubs[name])
    return Impl(load_impl(MODULE))
