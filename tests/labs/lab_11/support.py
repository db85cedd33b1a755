"""Judge-side helpers of lab-11: run a table of the learner's calls, and the reference's answers.

The reference (``mini_vllm/distributed/sharding.py``, ``mini_vllm/worker/kv_sizing.py``) is the
oracle and runs here, in the judge; the learner's functions run in the learner process through
``learner_side.outcomes``. An outcome is ``["ok", value]`` or ``["error", type, message]``.
"""

from __future__ import annotations

import re
from typing import Any

from grading.suite import learner_module, load_impl
from mini_vllm.distributed import sharding as ref_sharding
from mini_vllm.worker import kv_sizing as ref_kv
from tests.labs.common import reading_only

DOC = "phases/07-tensor-parallel/README.md"
SHARES = f"{DOC}#2-column-then-row-one-all-reduce-per-pair"
KV_HEADS = f"{DOC}#3-kv-heads-per-rank-and-replication"
KV_BLOCKS = f"{DOC}#4-what-tp-does-to-kv-blocks-and-concurrency"


def side() -> Any:
    """``learner_side`` in the learner process, after importing the learner's file (so that
    an import error is reported as the learner's). Its functions must leave the weights they
    are given as they were: the tests compare the shards with those very tensors, which come
    back from the learner process after each call (``reading_only``)."""
    load_impl("sharding")
    return reading_only(learner_module("learner_side"))


def reference(name: str) -> Any:
    return getattr(ref_sharding, name, None) or getattr(ref_kv, name)


def expected(name: str, args: list[Any]) -> list[Any]:
    """The reference's outcome of ``name(*args)``."""
    try:
        value = reference(name)(*args)
    except ValueError as exc:
        return ["error", "ValueError", str(exc)]
    return ["ok", list(value) if isinstance(value, tuple) else value]


def call(name: str, args: list[Any]) -> str:
    return f"{name}({', '.join(repr(a) for a in args)})"


def show(outcome: Any) -> str:
    if isinstance(outcome, list) and outcome and outcome[0] == "error":
        return f"{outcome[1]}: {str(outcome[2])[:160]}"
    if isinstance(outcome, list) and outcome and outcome[0] == "ok":
        return repr(outcome[1])
    return repr(outcome)


def numbers(message: str) -> set[int]:
    """The integers a message names, written plainly or with thousands separators (4,097)."""
    plain = {int(n) for n in re.findall(r"\d+", message)}
    grouped = re.findall(r"\d{1,3}(?:[,_]\d{3})+", message)
    return plain | {int(n.replace(",", "").replace("_", "")) for n in grouped}


def check_table(name: str, cases: list[list[Any]], rule: str) -> list[list[Any]]:
    """The learner's outcomes of ``name`` on ``cases`` against the reference's: the same value,
    or a ValueError where the reference refuses (its message is not compared here)."""
    got_all = side().outcomes(name, cases)
    assert isinstance(got_all, list) and len(got_all) == len(cases), (
        f"{name}: expected one outcome per case"
    )
    for args, got in zip(cases, got_all, strict=True):
        want = expected(name, args)
        if want[0] == "error":
            assert got[0] == "error" and got[1] == "ValueError", (
                f"{rule}: {call(name, args)} must raise ValueError, got {show(got)}"
            )
        else:
            assert got[0] == "ok" and got[1] == want[1], (
                f"{rule}: {call(name, args)} should be {want[1]!r}, got {show(got)}"
            )
            assert type(got[1]) is type(want[1]), (
                f"{rule}: {call(name, args)} should be a plain {type(want[1]).__name__}, got "
                f"a {type(got[1]).__name__}"
            )
    return got_all


def plain_ints_hint(got: Any) -> str:
    """A hint when a range holds numbers that are not plain ``int``s (``3.0`` from ``/``, a
    numpy integer): equal to the right ints, they still break the slicing a range is for."""
    if isinstance(got, list) and any(type(n) is not int for n in got):
        kinds = ", ".join(sorted({type(n).__name__ for n in got}))
        return (
            f" (its numbers are {kinds}, not plain ints: use // or divide, never /, and no "
            "numpy; torch's narrow and Python's slices refuse a float)"
        )
    return ""


def value(outcome: Any, what: str) -> Any:
    """The value of an ``ok`` outcome; a refusal where a value was due fails the test."""
    assert outcome[0] == "ok", f"{what} should succeed, it raised {show(outcome)}"
    return outcome[1]


def rank_shards(full: Any, dim: int, tp_size: int) -> dict[str, Any]:
    """Every rank's ``shard_tensor(full, dim, rank, tp_size)``, and whether each is a view of
    ``full`` (shares its storage) rather than a copy: both from the same calls
    (``learner_side.outcomes``, the one path of every call)."""
    got = side().outcomes("shard_tensor", [[full, dim, rank, tp_size] for rank in range(tp_size)])
    what = "shard_tensor(weight of shape {}, {}, {}, {})"
    return {
        "shards": [
            value(o, what.format(tuple(full.shape), dim, r, tp_size)) for r, o in enumerate(got)
        ],
        "views": [o[2] is True for o in got],
    }


def qkv_shards(
    full: Any, shard_id: str, head_dim: int, heads: int, kv_heads: int, tp_size: int
) -> list[Any]:
    """Every rank's ``shard_qkv_weight`` of one projection (weight or bias), as outcomes whose
    note (``ok``) says whether the shard is a view of ``full``."""
    return side().outcomes(
        "shard_qkv_weight",
        [[full, shard_id, head_dim, heads, kv_heads, rank, tp_size] for rank in range(tp_size)],
    )


def qkv_views(
    full: Any, shard_id: str, head_dim: int, heads: int, kv_heads: int, tp_size: int
) -> list[bool]:
    """For every rank, whether its ``shard_qkv_weight`` of ``full`` is a view of it."""
    got = qkv_shards(full, shard_id, head_dim, heads, kv_heads, tp_size)
    return [o[0] == "ok" and o[2] is True for o in got]
