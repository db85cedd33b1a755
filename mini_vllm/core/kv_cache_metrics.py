"""Prefix-cache hit statistics collected by the KV cache manager.

Mirrors ``PrefixCacheStats`` of ``vllm/v1/metrics/stats.py`` at v0.22.1 (upstream's
own ``vllm/v1/core/kv_cache_metrics.py`` tracks block residency, which the course
does not build). The manager records one entry per prefix-cache lookup and hands
the accumulated counters out (and starts afresh) through
``KVCacheManager.make_prefix_cache_stats()``, once per engine step, so a logger
can turn them into a hit rate over a sliding window of requests.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class PrefixCacheStats:
    """Counters of prefix-cache lookups since the last snapshot.

    ``queries`` and ``hits`` count *tokens* (prompt tokens looked up, tokens
    found in the cache), ``requests`` counts lookups. Requests resuming after
    a preemption are counted apart: they mostly hit their own blocks freed a
    moment ago, and mixing them in would flatter the hit rate of new traffic.
    """

    reset: bool = False
    """Whether ``reset_prefix_cache`` was called since the last snapshot."""
    requests: int = 0
    """Lookups made for new requests."""
    queries: int = 0
    """Tokens looked up for new requests."""
    hits: int = 0
    """Tokens found in the cache for new requests."""
    preempted_requests: int = 0
    """Lookups made for requests resuming after a preemption."""
    preempted_queries: int = 0
    """Tokens looked up for resumed requests."""
    preempted_hits: int = 0
    """Tokens found in the cache for resumed requests."""

    def record(self, num_tokens: int, num_hits: int, preempted: bool) -> None:
        """Add one lookup of ``num_tokens`` tokens that found ``num_hits``."""
        if preempted:
            self.preempted_requests += 1
            self.preempted_queries += num_tokens
            self.preempted_hits += num_hits
        else:
            self.requests += 1
            self.queries += num_tokens
            self.hits += num_hits

    @property
    def hit_rate(self) -> float:
        """Share of queried tokens (new requests only) found in the cache."""
        return self.hits / self.queries if self.queries else 0.0
