"""Shared set-up of the lab-07 suite (judge side): drivers, the oracle, expected hashes.

The manager under test is the learner's ``KVCacheManager``, built in the learner process; the
requests it serves and the block pool inside it are the reference's (or, under ``--chain``, the
learner's own lab-05 pool), built there too. A test drives it through a
``learner_side.Driver`` (one call per operation, results as plain data) and reads its whole
state as one snapshot (``Driver.state()``), checked here by ``checks.py``: through upstream's
attribute names (``block_pool``, ``req_to_blocks``, ``num_cached_block``, ``ref_cnt``,
``block_hash``, the free queue's links), never through the methods being graded, so that a
broken method cannot vouch for itself.

The oracle is the same ``Driver`` running the reference manager in the judge: the trace tests
perform every operation on both and compare what they saw.
"""

from __future__ import annotations

from typing import Any

from grading.suite import learner_module, load_impl
from mini_vllm.core.kv_cache_manager import KVCacheManager as ReferenceManager
from mini_vllm.core.kv_cache_utils import hash_block_tokens, make_block_hash_with_group_id, sha256
from tests.labs.lab_07 import learner_side as oracle_side
from tests.labs.lab_07.checks import (
    check_state,
    compare_states,
    free_queue,
    num_free,
    table,
    visible,
)

__all__ = [
    "BS",
    "DOC",
    "cache_key",
    "check_state",
    "driver",
    "free_queue",
    "make_manager",
    "num_free",
    "oracle",
    "table",
    "twin",
]

DOC = "phases/03-prefix-caching-and-scheduling/README.md"
BS = oracle_side.BS


def make_manager(num_blocks: int = 10, max_model_len: int = 64, **kwargs: Any) -> Any:
    """The learner's manager over ``num_blocks`` blocks of ``BS`` tokens (block 0 is null)."""
    mod = load_impl("kv_cache_manager")
    return mod.KVCacheManager(num_blocks, BS, max_model_len, **kwargs)


def driver(num_blocks: int = 10, max_model_len: int = 64, **kwargs: Any) -> Any:
    """A ``learner_side.Driver`` (in the learner process) around the learner's manager."""
    return learner_module("learner_side").Driver(make_manager(num_blocks, max_model_len, **kwargs))


def oracle(num_blocks: int = 10, max_model_len: int = 64, **kwargs: Any) -> Any:
    """The same driver around the reference manager, here in the judge."""
    return oracle_side.Driver(ReferenceManager(num_blocks, BS, max_model_len, **kwargs))


class Twin:
    """The learner's manager and the reference's (:func:`driver`, :func:`oracle`), given the
    same operations (``add``, ``admit``, ``allocate``, ``decode``, ``free``, ``lookup``,
    ``append``, ``get_block_ids``). What an operation returns is the learner's, for the test
    to check as it pleases; the learner's whole state is compared with the reference's when
    the next operation is made, and by :meth:`close`. So a refused allocation that leaves its change
    for a later call (after the test has read the state once) is caught at that call
    (tests/hostile/leave_the_refusals_trace_one_call_later.py)."""

    OPERATIONS = frozenset(
        {"add", "admit", "allocate", "decode", "free", "lookup", "append", "get_block_ids"}
    )

    def __init__(self, num_blocks: int = 10, max_model_len: int = 64, **kwargs: Any) -> None:
        self.mine = driver(num_blocks, max_model_len, **kwargs)
        self.ref = oracle(num_blocks, max_model_len, **kwargs)
        self.last = "the manager was built"

    def state(self) -> dict[str, Any]:
        """The learner's state (``Driver.state``)."""
        return self.mine.state()

    def __getattr__(self, name: str) -> Any:
        if name not in self.OPERATIONS:
            raise AttributeError(name)

        def run(*args: Any, **kwargs: Any) -> Any:
            self.agree()
            got = getattr(self.mine, name)(*args, **kwargs)
            getattr(self.ref, name)(*args, **kwargs)
            shown = [*map(repr, args), *(f"{k}={v!r}" for k, v in kwargs.items())]
            self.last = f"{name}({', '.join(shown)})"
            return got

        return run

    def agree(self) -> None:
        """The learner's state is the reference's, after the last operation."""
        compare_states(self.mine.state(), self.ref.state(), self.last)

    def close(self) -> None:
        """Admit a new request (a lookup, an allocation, fitting or not), then free every
        request, comparing the states after each call: what the test's last call changed shows
        at the calls after it, before any of them concerns the requests it changed."""
        self.add("closing", [97, 98, 99, 96, 95])
        self.admit("closing")
        for request_id in list(self.ref.requests):
            self.free(request_id)
        self.agree()


def twin(num_blocks: int = 10, max_model_len: int = 64, **kwargs: Any) -> Twin:
    """A :class:`Twin`: the learner's manager, checked against the reference's."""
    return Twin(num_blocks, max_model_len, **kwargs)


def cache_key(tokens: Any, index: int) -> bytes:
    """The key block ``index`` of a request with ``tokens`` is cached under: its chained hash
    (from ``learner_side.ROOT``) with group id 0, computed here."""
    tokens = list(tokens)
    parent = oracle_side.ROOT
    for i in range(index + 1):
        parent = hash_block_tokens(sha256, parent, tokens[i * BS : (i + 1) * BS])
    return make_block_hash_with_group_id(parent, 0)


def describe_change(before: dict[str, Any], after: dict[str, Any]) -> str:
    """Say which part of the state a refused allocation changed."""
    parts = []
    if before["forward"] != after["forward"]:
        parts.append(f"the free queue {before['forward']} -> {after['forward']}")
    if before["ref_cnt"] != after["ref_cnt"]:
        parts.append(f"ref counts {before['ref_cnt']} -> {after['ref_cnt']}")
    if before["hash"] != after["hash"]:
        parts.append("block hashes")
    if before["tables"] != after["tables"]:
        parts.append(f"the block tables {before['tables']} -> {after['tables']}")
    if visible(before, "num_cached_block") != visible(after, "num_cached_block"):
        parts.append(
            f"num_cached_block {before['num_cached_block']} -> {after['num_cached_block']}"
        )
    if before["progress"] != after["progress"]:
        parts.append("the request's progress")
    return ", ".join(parts) or "nothing visible"


COMPARED_KEYS = ("forward", "ref_cnt", "hash", "tables", "num_cached_block", "progress")


def changed_keys(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    """The parts of the state that differ, as the contract sees them (:func:`visible`)."""
    return [k for k in COMPARED_KEYS if visible(before, k) != visible(after, k)]


def unchanged(before: dict[str, Any], after: dict[str, Any]) -> bool:
    return not changed_keys(before, after)
