"""The numbers the metrics are made of, one snapshot type per source (upstream's layout).

Mirrors ``vllm/v1/metrics/stats.py`` at v0.22.1: ``PrefixCacheStats`` (counted by the KV cache
manager per lookup), ``SchedulerStats`` (the scheduler's state after a step, measured in the
engine core and sent with the step's outputs), and ``IterationStats`` with its
``FinishedRequestStats`` (token counts and latencies, measured in the front-end when outputs
arrive, which is what a client experiences). ``mini_vllm/metrics/loggers.py`` turns them into
Prometheus metrics. (Upstream's ``vllm/v1/core/kv_cache_metrics.py`` tracks block residency,
which the course does not build.)
"""

from __future__ import annotations

from dataclasses import dataclass, field

import msgspec


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


class SchedulerStats(msgspec.Struct, omit_defaults=True, gc=False):
    """What the scheduler looked like after a step (a wire type: it travels over ZMQ).

    Gauges are snapshots; the prefix-cache and preemption figures are increments since the
    previous snapshot, so the front-end adds them to its counters.
    """

    num_running_reqs: int = 0
    num_waiting_reqs: int = 0
    kv_cache_usage: float = 0.0
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0
    num_preemptions: int = 0


@dataclass
class FinishedRequestStats:
    """One finished request, as the request-level histograms see it."""

    finish_reason: str
    e2e_latency: float
    num_prompt_tokens: int
    num_generation_tokens: int
    mean_time_per_output_token: float
    max_tokens_param: int | None = None
    num_cached_tokens: int = 0
    # The phases, from the core's request events (None if they never arrived).
    queued_time: float | None = None
    prefill_time: float | None = None
    decode_time: float | None = None
    inference_time: float | None = None


@dataclass
class IterationStats:
    """What one batch of engine-core outputs contributed to the metrics."""

    num_prompt_tokens: int = 0
    num_generation_tokens: int = 0
    num_cached_tokens: int = 0
    # One entry per prompt whose every sample finished: its n, and its longest sample.
    n_params_iter: list[int] = field(default_factory=list)
    max_num_generation_tokens_iter: list[int] = field(default_factory=list)
    time_to_first_tokens_iter: list[float] = field(default_factory=list)
    inter_token_latencies_iter: list[float] = field(default_factory=list)
    finished_requests: list[FinishedRequestStats] = field(default_factory=list)


@dataclass
class ParentRequestStats:
    """The ``n`` samples of one prompt, as the metrics see them (what upstream's
    ``ParentRequest`` observes): recorded once, when the last sample finishes, as ``n`` and the
    most tokens a sample generated. A request without one counts as its own ``n = 1`` parent."""

    n: int = 1
    max_num_generation_tokens: int = 0
    num_finished: int = 0

    def observe_finished(self, num_generation_tokens: int, stats: IterationStats) -> None:
        self.max_num_generation_tokens = max(self.max_num_generation_tokens, num_generation_tokens)
        self.num_finished += 1
        if self.num_finished == self.n:
            stats.n_params_iter.append(self.n)
            stats.max_num_generation_tokens_iter.append(self.max_num_generation_tokens)
