"""lab-11's helpers in the learner process: they call the learner's functions and never judge.

The grader copies this file into the learner's sandbox as the top-level module
``learner_side``; the tests reach it with ``learner_module("learner_side")``. The arithmetic
tests ask for a whole table of calls at once (one round trip, not one per case), and each
call's outcome comes back as plain data: ``["ok", value, note]`` or ``["error", builtin
type name, message]``. A config is built here from plain fields, and each rank's shard of a
weight is cut here, next to the learner's code, from the full tensor the judge sent; the shards
come back by value and the judge puts them back together.

Every call of a graded function goes through :func:`outcomes` (``check_tp`` is the only path to
``check_tensor_parallel_size``): a function that reads its call stack finds the same callers
whether a test looks at its values, its refusals, whether its shard is a view or whether it
left its list alone (tests/hostile/views_only_for_the_view_check.py).

``NotImplementedError`` is never turned into data: a task not written yet must reach the
grader as itself, so that its rows read NOT STARTED.
"""

from __future__ import annotations

import sys
from typing import Any


def _learner() -> Any:
    import sharding

    return sharding


def _plain(value: Any) -> Any:
    if isinstance(value, tuple | list):
        return [_plain(v) for v in value]
    return value


def _builtin_name(exc: BaseException) -> str:
    """The nearest builtin exception class ``exc`` is an instance of, by its real type, never by
    the name the learner's class gives itself: the host's own reading (``wire``, beside it in
    the learner process, where alone this runs)."""
    import wire

    return str(wire.builtin_exception_names(exc)[0])


def _outcome(call: Any, read: Any = _plain) -> list[Any]:
    """``call()`` as ``["ok", read(value)]`` or ``["error", builtin type name, message]``.

    Only the call is inside the ``try`` that takes an exception for a refusal: what it returned
    is read after it, and an exception raised by that read (an object whose attributes raise
    the ValueError the call should have raised) comes back as ``["unreadable", ...]``, which no
    test takes for a refusal (tests/hostile/refuse_when_the_shapes_are_read.py)."""
    try:
        value = call()
    except NotImplementedError:
        raise
    except Exception as exc:  # the refusal is what the judge checks
        return ["error", _builtin_name(exc), str(exc)]
    try:
        return ["ok", read(value)]
    except NotImplementedError:
        raise
    except Exception as exc:
        return ["unreadable", _builtin_name(exc), f"reading what the call returned: {exc}"]


def check_tp(fields: dict[str, Any], tp_size: Any) -> list[Any]:
    """``check_tensor_parallel_size`` of a config with exactly ``fields`` as attributes; an
    accepted size comes back as the fields of the returned shapes."""
    from types import SimpleNamespace

    names = (
        "tp_size",
        "num_heads",
        "num_kv_heads",
        "num_kv_head_replicas",
        "intermediate_size",
        "vocab_size_padded",
    )

    def fields_of(shapes: Any) -> dict[str, Any]:
        return {name: getattr(shapes, name, None) for name in names}

    return _outcome(
        lambda: _learner().check_tensor_parallel_size(SimpleNamespace(**fields), tp_size),
        fields_of,
    )


def _storage_ptr(t: Any) -> int:
    """Where ``t``'s storage starts, read with torch's C methods, torch functions disabled."""
    import torch

    with torch._C.DisableTorchFunction():
        return torch._C.StorageBase.data_ptr(torch._C.TensorBase.untyped_storage(t))


def _is_view(part: Any, full: Any, before: int) -> bool:
    """Whether ``part`` shares ``full``'s storage (a view such as ``narrow``), not a copy.

    Read with torch's own methods (of its C base classes, which no code can replace), never
    the shard's: a copy in a subclass of ``torch.Tensor`` could answer with the weight's
    storage. Those methods still hand a subclass to its ``__torch_function__`` (and any tensor
    to a ``TorchFunctionMode`` left entered), which can answer just the same, so they run with
    torch functions disabled; the type is the shard's real one, not its ``__class__``
    (tests/hostile/copy_views_through_torch_function.py)."""
    import torch

    if not issubclass(type(part), torch._C.TensorBase):
        return False
    # ``before``: where the weight's storage was before the learner's call, which may re-point
    # the caller's tensor (``set_``) at a buffer holding its copy
    # (tests/hostile/repoint_the_weight_at_the_copy.py).
    return _storage_ptr(part) == before and _storage_ptr(full) == before


def _noted(fn: Any, args: list[Any]) -> list[Any]:
    """``fn(*args)`` as an outcome; after a value, what the call did with its first argument:
    for a tensor, whether the value is a view of it (:func:`_is_view`); for a list, the list as
    it is after the call (the executor reads the ranks' counts again, by rank); else ``None``."""
    torch = sys.modules.get("torch")  # a tensor argument has imported it; else not needed
    first = args[0] if args else None
    is_tensor = torch is not None and issubclass(type(first), torch._C.TensorBase)
    before = _storage_ptr(first) if is_tensor else None
    got = _outcome(lambda: fn(*args))
    if got[0] == "ok":
        if before is not None:
            got.append(_is_view(got[1], first, before))
        else:
            got.append(list(first) if type(first) is list else None)
    return got


def outcomes(name: str, cases: list[list[Any]]) -> list[list[Any]]:
    """``sharding.<name>(*args)`` for each ``args`` of ``cases``, each as ``["ok", value,
    note]`` (:func:`_noted`) or ``["error", builtin type name, message]``."""
    fn = getattr(_learner(), name)
    return [_noted(fn, list(args)) for args in cases]
