"""lab-11's helpers in the learner process: they call the learner's functions and never judge.

The grader copies this file into the learner's sandbox as the top-level module
``learner_side``; the tests reach it with ``learner_module("learner_side")``. The arithmetic
tests ask for a whole table of calls at once (one round trip, not one per case), and each
call's outcome comes back as plain data: ``["ok", value]`` or ``["error", builtin type
name, message]``. A config is built here from plain fields, and each rank's shard of a weight is cut
here, next to the learner's code, from the full tensor the judge sent; the shards come back by
value and the judge puts them back together.

``NotImplementedError`` is never turned into data: a task not written yet must reach the
grader as itself, so that its rows read NOT STARTED.
"""

from __future__ import annotations

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


def _outcome(call: Any) -> list[Any]:
    try:
        return ["ok", _plain(call())]
    except NotImplementedError:
        raise
    except Exception as exc:  # the refusal is what the judge checks
        return ["error", _builtin_name(exc), str(exc)]


def outcomes(name: str, cases: list[list[Any]]) -> list[list[Any]]:
    """``sharding.<name>(*args)`` for each ``args`` of ``cases``, each as an outcome."""
    fn = getattr(_learner(), name)
    return [_outcome(lambda args=args: fn(*args)) for args in cases]


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

    def call() -> dict[str, Any]:
        shapes = _learner().check_tensor_parallel_size(SimpleNamespace(**fields), tp_size)
        return {name: getattr(shapes, name, None) for name in names}

    return _outcome(call)


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


def rank_shards(full: Any, dim: int, tp_size: int) -> dict[str, Any]:
    """Every rank's ``shard_tensor(full, dim, rank, tp_size)``, and whether each is a view of
    ``full`` (shares its storage) rather than a copy."""
    mod = _learner()
    shards, views = [], []
    before = _storage_ptr(full)
    for rank in range(tp_size):
        shard = mod.shard_tensor(full, dim, rank, tp_size)
        shards.append(shard)
        views.append(_is_view(shard, full, before))
    return {"shards": shards, "views": views}


def qkv_shards(
    full: Any,
    shard_id: str,
    head_dim: int,
    total_num_heads: int,
    total_num_kv_heads: int,
    tp_size: int,
) -> list[Any]:
    """Every rank's ``shard_qkv_weight`` of one projection (weight or bias), as outcomes."""
    mod = _learner()
    return [
        _outcome(
            lambda rank=rank: mod.shard_qkv_weight(
                full, shard_id, head_dim, total_num_heads, total_num_kv_heads, rank, tp_size
            )
        )
        for rank in range(tp_size)
    ]


def qkv_views(
    full: Any,
    shard_id: str,
    head_dim: int,
    total_num_heads: int,
    total_num_kv_heads: int,
    tp_size: int,
) -> list[bool]:
    """For every rank, whether its ``shard_qkv_weight`` of ``full`` shares ``full``'s storage
    (a view) rather than being a copy."""
    mod = _learner()
    before = _storage_ptr(full)
    return [
        _is_view(
            mod.shard_qkv_weight(
                full, shard_id, head_dim, total_num_heads, total_num_kv_heads, rank, tp_size
            ),
            full,
            before,
        )
        for rank in range(tp_size)
    ]


def blocks_and_counts(counts: list[int]) -> list[Any]:
    """``num_gpu_blocks_across_ranks(counts)`` as an outcome, and the list ``counts`` as it is
    after the call (the executor reads it again, by rank)."""
    counts = list(counts)
    got = _outcome(lambda: _learner().num_gpu_blocks_across_ranks(counts))
    return [got, list(counts)]
