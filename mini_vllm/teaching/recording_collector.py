"""A block-pool metrics collector that only records what the pool tells it.

Upstream's ``BlockPool`` reports block residency to an optional ``KVCacheMetricsCollector``
(``mini_vllm/core/block_pool.py``): each block handed out, each prefix-cache hit (``touch``),
each eviction, each reset. Nothing in the engine collects those metrics, so the graded suites of
lab-01 and lab-05 give a learner's pool this recorder instead and read back what it saw. It runs
beside the learner's code (their ``learner_side`` imports it) and decides nothing.
"""

from __future__ import annotations

from typing import Any


class RecordingCollector:
    """Keeps every call as ``[event, block_id]``: ``allocated``, ``accessed``, ``evicted``, or
    ``["reset", None]``."""

    def __init__(self) -> None:
        self.events: list[list[Any]] = []

    def _record(self, event: str, block: Any) -> None:
        self.events.append([event, getattr(block, "block_id", None)])

    def on_block_allocated(self, block: Any) -> None:
        self._record("allocated", block)

    def on_block_accessed(self, block: Any) -> None:
        self._record("accessed", block)

    def on_block_evicted(self, block: Any) -> None:
        self._record("evicted", block)

    def reset(self) -> None:
        self.events.append(["reset", None])
