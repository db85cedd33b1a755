"""``/metrics``: the engine's state and every request's latencies, under vLLM's metric names.

Mirrors ``PrometheusStatLogger`` of ``vllm/v1/metrics/loggers.py`` at the pin: the same names, the
same ``model_name`` and ``engine`` labels and the same kinds (gauges for the scheduler's state,
counters for tokens and prefix-cache lookups, histograms for latencies), so that a Grafana
dashboard or an alert written for vLLM reads a mini-vLLM server unchanged. Where each number is
measured: docs/upstream-fidelity.md (module notes).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from mini_vllm.metrics.stats import IterationStats, SchedulerStats

# Seconds, upstream's bucket bounds at the pin: a dashboard that reads one bucket (`le="0.1"`)
# or compares quantiles across servers needs the same edges, not merely the same names.
_TTFT_BUCKETS = [
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
    1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
]  # fmt: skip
_ITL_BUCKETS = [
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75,
    1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
]  # fmt: skip
_E2E_BUCKETS = [
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0,
    50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0,
]  # fmt: skip
# Tokens per engine step (upstream's edges).
_ITERATION_TOKEN_BUCKETS: list[float] = [
    1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384,
]  # fmt: skip
# Upstream's FinishReason values, every one a series from the start (a dashboard summing them
# sees 0, not "no data"), "repetition" included although the server takes no repetition settings.
_FINISH_REASONS = ("stop", "length", "abort", "error", "repetition")


def _token_buckets(max_model_len: int) -> list[float]:
    """1, 2, 5, 10, 20, 50, ... up to ``max_model_len`` (request sizes in tokens)."""
    buckets: list[float] = []
    scale = 1
    while True:
        for mantissa in (1, 2, 5):
            value = mantissa * scale
            if value > max_model_len:
                return buckets
            buckets.append(value)
        scale *= 10


class PrometheusStatLogger:
    """Owns one registry with vLLM's metrics; ``record`` is called after every core message."""

    def __init__(self, model_name: str, max_model_len: int, engine_index: int = 0) -> None:
        self.registry = CollectorRegistry()
        labelnames = ["model_name", "engine"]
        labels = [model_name, str(engine_index)]
        reg = self.registry

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(name, doc, labelnames, registry=reg).labels(*labels)

        def counter(name: str, doc: str) -> Counter:
            return Counter(name, doc, labelnames, registry=reg).labels(*labels)

        def histogram(name: str, doc: str, buckets: list[float]) -> Histogram:
            return Histogram(name, doc, labelnames, buckets=buckets, registry=reg).labels(*labels)

        self.gauge_scheduler_running = gauge(
            "vllm:num_requests_running", "Number of requests in model execution batches."
        )
        self.gauge_scheduler_waiting = gauge(
            "vllm:num_requests_waiting", "Number of requests waiting to be processed."
        )
        waiting_by_reason = Gauge(
            "vllm:num_requests_waiting_by_reason",
            "Waiting requests by reason: 'capacity' (the batch or the KV cache is full), "
            "'deferred' (held back by a transient constraint; none here).",
            [*labelnames, "reason"],
            registry=reg,
        )
        # Nothing defers a request here (no LoRA budget, no KV transfer): every waiting one waits
        # for capacity, and the 'deferred' series reads 0, as upstream's does for such a server.
        self.gauge_waiting_for_capacity = waiting_by_reason.labels(*labels, "capacity")
        waiting_by_reason.labels(*labels, "deferred").set(0)
        self.gauge_kv_cache_usage = gauge(
            "vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage."
        )
        self.counter_prefix_cache_queries = counter(
            "vllm:prefix_cache_queries", "Prefix cache queries, in number of queried tokens."
        )
        self.counter_prefix_cache_hits = counter(
            "vllm:prefix_cache_hits", "Prefix cache hits, in number of cached tokens."
        )
        self.counter_num_preempted_reqs = counter(
            "vllm:num_preemptions", "Cumulative number of preemptions from the engine."
        )
        self.counter_prompt_tokens = counter(
            "vllm:prompt_tokens", "Number of prefill tokens processed."
        )
        self.counter_generation_tokens = counter(
            "vllm:generation_tokens", "Number of generation tokens processed."
        )
        self.counter_prompt_tokens_cached = counter(
            "vllm:prompt_tokens_cached", "Prompt tokens found in the prefix cache, not computed."
        )
        self.histogram_iteration_tokens = histogram(
            "vllm:iteration_tokens_total",
            "Tokens (prompt and generated) reported by one engine step.",
            _ITERATION_TOKEN_BUCKETS,
        )
        success = Counter(
            "vllm:request_success",
            "Count of successfully processed requests.",
            [*labelnames, "finished_reason"],
            registry=reg,
        )
        self.counter_request_success = {
            reason: success.labels(*labels, reason) for reason in _FINISH_REASONS
        }
        token_buckets = _token_buckets(max_model_len)
        self.histogram_num_prompt_tokens_request = histogram(
            "vllm:request_prompt_tokens", "Number of prefill tokens processed.", token_buckets
        )
        self.histogram_num_generation_tokens_request = histogram(
            "vllm:request_generation_tokens",
            "Number of generation tokens processed.",
            token_buckets,
        )
        self.histogram_time_to_first_token = histogram(
            "vllm:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            _TTFT_BUCKETS,
        )
        self.histogram_inter_token_latency = histogram(
            "vllm:inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds.",
            _ITL_BUCKETS,
        )
        self.histogram_time_per_output_token_request = histogram(
            "vllm:request_time_per_output_token_seconds",
            "Histogram of time_per_output_token_seconds per request.",
            _ITL_BUCKETS,
        )
        self.histogram_e2e_time_request = histogram(
            "vllm:e2e_request_latency_seconds",
            "Histogram of e2e request latency in seconds.",
            _E2E_BUCKETS,
        )
        # A request's phases, from the core's QUEUED and SCHEDULED stamps and its token times.
        self.histograms_phase = {
            "queued_time": histogram(
                "vllm:request_queue_time_seconds",
                "Seconds a request waited, from queued to first scheduled.",
                _E2E_BUCKETS,
            ),
            "prefill_time": histogram(
                "vllm:request_prefill_time_seconds",
                "Seconds from a request's first schedule to its first token.",
                _E2E_BUCKETS,
            ),
            "decode_time": histogram(
                "vllm:request_decode_time_seconds",
                "Seconds from a request's first token to its last.",
                _E2E_BUCKETS,
            ),
            "inference_time": histogram(
                "vllm:request_inference_time_seconds",
                "Seconds from a request's first schedule to its last token.",
                _E2E_BUCKETS,
            ),
        }
        self.histogram_prefill_kv_computed_request = histogram(
            "vllm:request_prefill_kv_computed_tokens",
            "Prompt tokens whose KV a request computed (the prefix cache's hits left out).",
            token_buckets,
        )
        self.histogram_max_tokens_request = histogram(
            "vllm:request_params_max_tokens", "A request's max_tokens.", token_buckets
        )
        self.histogram_n_request = histogram(
            "vllm:request_params_n", "A prompt's n (samples asked for).", [1, 2, 5, 10, 20]
        )
        self.histogram_max_num_generation_tokens_request = histogram(
            "vllm:request_max_num_generation_tokens",
            "The most tokens one of a prompt's samples generated.",
            token_buckets,
        )

    def record(
        self, scheduler_stats: SchedulerStats | None, iteration_stats: IterationStats | None
    ) -> None:
        if scheduler_stats is not None:
            self.gauge_scheduler_running.set(scheduler_stats.num_running_reqs)
            self.gauge_scheduler_waiting.set(scheduler_stats.num_waiting_reqs)
            self.gauge_waiting_for_capacity.set(scheduler_stats.num_waiting_reqs)
            self.gauge_kv_cache_usage.set(scheduler_stats.kv_cache_usage)
            self.counter_prefix_cache_queries.inc(scheduler_stats.prefix_cache_queries)
            self.counter_prefix_cache_hits.inc(scheduler_stats.prefix_cache_hits)
            self.counter_num_preempted_reqs.inc(scheduler_stats.num_preemptions)
        if iteration_stats is None:
            return
        self.counter_prompt_tokens.inc(iteration_stats.num_prompt_tokens)
        self.counter_generation_tokens.inc(iteration_stats.num_generation_tokens)
        self.counter_prompt_tokens_cached.inc(iteration_stats.num_cached_tokens)
        self.histogram_iteration_tokens.observe(
            iteration_stats.num_prompt_tokens + iteration_stats.num_generation_tokens
        )
        for n in iteration_stats.n_params_iter:
            self.histogram_n_request.observe(n)
        for num_tokens in iteration_stats.max_num_generation_tokens_iter:
            self.histogram_max_num_generation_tokens_request.observe(num_tokens)
        for ttft in iteration_stats.time_to_first_tokens_iter:
            self.histogram_time_to_first_token.observe(ttft)
        for itl in iteration_stats.inter_token_latencies_iter:
            self.histogram_inter_token_latency.observe(itl)
        for finished in iteration_stats.finished_requests:
            counter = self.counter_request_success.get(finished.finish_reason)
            if counter is not None:
                counter.inc()
            self.histogram_e2e_time_request.observe(finished.e2e_latency)
            for phase, phase_histogram in self.histograms_phase.items():
                seconds = getattr(finished, phase)
                if seconds is not None:
                    phase_histogram.observe(seconds)
            self.histogram_prefill_kv_computed_request.observe(
                finished.num_prompt_tokens - finished.num_cached_tokens
            )
            if finished.max_tokens_param:
                self.histogram_max_tokens_request.observe(finished.max_tokens_param)
            self.histogram_num_prompt_tokens_request.observe(finished.num_prompt_tokens)
            self.histogram_num_generation_tokens_request.observe(finished.num_generation_tokens)
            # Every finished request, as upstream: one token (no decode step) observes 0, so the
            # count equals e2e's and a dashboard's sum/count means the same on both servers.
            self.histogram_time_per_output_token_request.observe(
                finished.mean_time_per_output_token
            )
