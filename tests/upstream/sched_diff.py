"""The scheduler differential: one random trace, run through mini_vllm's and upstream's scheduler.

A :class:`Trace` is a scheduler configuration and a list of :class:`ReqSpec`: each request's
prompt, sampling limits, the tokens "the model" samples for it, when it arrives and when (if
ever) it is aborted. :func:`run_trace` drives mini_vllm's ``Scheduler`` (or ``AsyncScheduler``)
and upstream's real one (``upstream_sched.py``) through the same engine loop, feeding both the
same sampled tokens, and compares after every call everything a runner or a client could see:

- each ``SchedulerOutput``: the scheduled token counts in order, the new requests (ids, block
  ids, computed tokens, prompts), the cached ones (ids, resumed ids, new block ids, computed
  tokens, output counts, the full token lists sent for requests the runner lost), the
  preempted and finished ids, the common prefix blocks (which mini_vllm's scheduler leaves out
  of its output: its side asks the manager right after ``schedule()``);
- after every call: the waiting and running queues in order, every live request's status,
  computed tokens, placeholders, output tokens, preemption count and prefill-chunk flag, the
  block ids of every running request, and the block pool (free queue front to back, ref
  counts, hashes, prefix-cache map);
- every ``update_from_output``: the emitted tokens, finish reasons and stop reasons, and every
  abort's result.

The engine loop is upstream's. Synchronous (``EngineCore.step``
(vllm/v1/engine/core.py:428)): schedule, execute, update. Asynchronous
(``EngineCore.step_with_batch_queue`` (vllm/v1/engine/core.py:469), a batch queue of 2 as
``UniProcExecutor.max_concurrent_batches`` (vllm/v1/executor/uniproc_executor.py:77) gives
with async scheduling): step N+1 is scheduled before step N's output is processed, and aborts
that arrive while a step runs are applied just before its output
(``_process_aborts_queue``). The model is never faster than the scheduler (a queued step is
never "done" early), which makes the interleaving deterministic.

Which requests sample a token is read from each side right after ``schedule()`` (every
scheduled request that is not in the middle of its prefill, ``is_prefill_chunk``; upstream's
runner discards the token of a partial prefill) and must agree. The k-th token sampled for a
request is ``ReqSpec.outputs[k]``, whatever happens to it (it may be discarded because the
request finished meanwhile), so both sides always get the same ids.
"""

from __future__ import annotations

import dataclasses
import inspect
import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import cache
from typing import Any

import torch

from mini_vllm.core import kv_cache_utils as mini_kv_cache_utils
from mini_vllm.core.kv_cache_manager import KVCacheManager as MiniKVCacheManager
from mini_vllm.core.sched.async_scheduler import AsyncScheduler as MiniAsyncScheduler
from mini_vllm.core.sched.scheduler import Scheduler as MiniScheduler
from mini_vllm.request import Request as MiniRequest
from mini_vllm.request import RequestStatus as MiniRequestStatus
from mini_vllm.sampling_params import SamplingParams as MiniSamplingParams
from tools.fetch_upstream import ensure_upstream

from .shim_sched import num_common_prefix_blocks as common_prefix_blocks
from .upstream_sched import NoStructuredOutputs, fake_vllm_config, load_upstream_scheduler

HASH_FN = mini_kv_cache_utils.sha256
EOS = 0
# Output tokens are drawn from here; stop tokens too, so that they are actually sampled.
OUTPUT_VOCAB = range(1, 24)

# The two divergences this differential found (issue #21: CachedRequestData.num_output_tokens
# without the async placeholders, and the placeholder zeroed on a stop before cache_blocks) are
# fixed in mini_vllm; their reproducers are regression tests in test_scheduler_differential.py.


def mini_has_gate() -> bool:
    """Whether mini_vllm's ``Scheduler`` has upstream's admission gate (issue #21, part 2)."""
    return "scheduler_reserve_full_isl" in inspect.signature(MiniScheduler).parameters


@dataclass(frozen=True)
class Config:
    """The scheduler configuration of a trace (the same on both sides)."""

    block_size: int
    num_gpu_blocks: int  # the null block included, as upstream counts
    max_model_len: int
    max_num_batched_tokens: int
    max_num_seqs: int
    long_prefill_token_threshold: int
    enable_prefix_caching: bool
    scheduler_reserve_full_isl: bool
    async_scheduling: bool
    enable_chunked_prefill: bool = True


@dataclass(frozen=True)
class ReqSpec:
    """One request of a trace."""

    req_id: str
    prompt: tuple[int, ...]
    max_tokens: int
    min_tokens: int
    stop_token_ids: tuple[int, ...]
    # The k-th token sampled for the request (EOS and stop tokens included where drawn).
    outputs: tuple[int, ...]
    arrival: int  # added before engine step `arrival`
    abort: int | None = None  # aborted at engine step `abort` (None: never)
    abort_in_flight: bool = False  # ... before that step's update instead of before its schedule

    def token(self, k: int) -> int:
        """The k-th sampled token (past the script: a fixed non-stop filler)."""
        return self.outputs[k] if k < len(self.outputs) else OUTPUT_VOCAB[-1] + 1


@dataclass(frozen=True)
class Trace:
    """A configuration and its requests; ``repr`` is a runnable reproducer."""

    config: Config
    requests: tuple[ReqSpec, ...]


class Divergence(AssertionError):
    """mini_vllm and upstream disagree; carries where and what."""

    def __init__(self, step: int, what: str, mini: Any, upstream: Any) -> None:
        self.step, self.what, self.mini, self.upstream = step, what, mini, upstream
        super().__init__(
            f"engine step {step}, {what}:{_where(mini, upstream)}\n"
            f"  mini_vllm: {mini!r}\n  upstream:  {upstream!r}"
        )


def _where(mini: Any, upstream: Any) -> str:
    """Where two long values differ (indices or keys), to read before the values."""
    if isinstance(mini, list) and isinstance(upstream, list) and len(mini) == len(upstream):
        keys: Iterable[Any] = range(len(mini))
    elif isinstance(mini, dict) and isinstance(upstream, dict):
        keys = sorted(set(mini) | set(upstream), key=repr)
    else:
        return ""
    get = (lambda c, k: c.get(k, "<missing>")) if isinstance(mini, dict) else (lambda c, k: c[k])
    diffs = [
        f"{k!r}: {get(mini, k)!r} != {get(upstream, k)!r}"
        for k in keys
        if get(mini, k) != get(upstream, k)
    ]
    return "\n  differs at " + "; ".join(diffs[:4])


# ---------------------------------------------------------------- trace generation


def random_trace(rng: random.Random, *, async_scheduling: bool, reserve_full_isl: bool) -> Trace:
    """A random trace, biased towards the hard cases.

    Small blocks and a pool of a few to a few dozen blocks (so preemption is common), a token
    budget below the longest prompt (chunked prefill), prompts built from a few shared
    prefixes (prefix hits, with caching on most of the time), EOS and stop tokens in the
    outputs, ``min_tokens``, staggered arrivals and aborts.
    """
    block_size = rng.choice((1, 2, 4, 4, 8, 16))
    max_model_len = rng.choice((8, 16, 32, 48, 64, 128))
    max_model_len = max(max_model_len, 2 * block_size)
    blocks_per_seq = -(-max_model_len // block_size)
    # From just the blocks one longest request needs (upstream's start-up check,
    # `_check_enough_kv_cache_memory`, refuses less; less would livelock) to a few more.
    num_gpu_blocks = (
        1 + blocks_per_seq + rng.choice((0, 0, 1, 2, blocks_per_seq, 2 * blocks_per_seq))
    )
    max_num_seqs = rng.choice((1, 2, 3, 4, 8, 16))
    max_num_batched_tokens = max(
        max_num_seqs, rng.choice((max_num_seqs, 4, 8, 16, 32, 64, max_model_len))
    )
    threshold = rng.choice((0, 0, 0, 2, 5, block_size))
    # Without chunked prefill a whole prompt must fit the budget (both sides refuse less).
    chunked = rng.random() < 0.85
    if not chunked:
        max_num_batched_tokens = max(max_num_batched_tokens, max_model_len)
    config = Config(
        block_size=block_size,
        num_gpu_blocks=num_gpu_blocks,
        max_model_len=max_model_len,
        max_num_batched_tokens=max_num_batched_tokens,
        max_num_seqs=max_num_seqs,
        long_prefill_token_threshold=threshold,
        enable_prefix_caching=rng.random() < 0.8,
        scheduler_reserve_full_isl=reserve_full_isl,
        async_scheduling=async_scheduling,
        enable_chunked_prefill=chunked,
    )
    prefixes = [
        [rng.randint(1, 3) for _ in range(rng.randint(1, max_model_len - 1))]
        for _ in range(rng.randint(1, 3))
    ]
    p_eos = rng.choice((0.0, 0.02, 0.1, 0.3))
    num_requests = rng.randint(1, 10)
    horizon = rng.choice((0, 2, 6, 20))
    requests = []
    for i in range(num_requests):
        prompt_len = rng.randint(1, max_model_len - 1)
        if rng.random() < 0.7:
            prefix = rng.choice(prefixes)[:prompt_len]
        else:
            prefix = []
        prompt = prefix + [rng.randint(1, 3) for _ in range(prompt_len - len(prefix))]
        room = max_model_len - prompt_len
        # Mostly within max_model_len; sometimes beyond it, so the length cap of
        # max_model_len stops the request rather than max_tokens.
        max_tokens = rng.randint(1, room) if rng.random() < 0.85 else room + rng.randint(1, 8)
        # min_tokens never exceeds what max_model_len leaves: beyond it is upstream's known
        # bug (a negative token count after a preemption, where mini_vllm's `<= 0` guard
        # skips the request; docs/upstream-fidelity.md). Neutralised here, on purpose.
        min_tokens = rng.choice((0, 0, 0, rng.randint(0, min(max_tokens, room))))
        stop_token_ids = tuple(rng.sample(OUTPUT_VOCAB, rng.choice((0, 0, 1, 2))))
        outputs = tuple(
            EOS if rng.random() < p_eos else rng.choice(OUTPUT_VOCAB) for _ in range(max_tokens + 4)
        )
        arrival = rng.randint(0, horizon)
        abort = None
        if rng.random() < 0.15:
            abort = arrival + rng.randint(0, 12)
        requests.append(
            ReqSpec(
                req_id=f"r{i}",
                prompt=tuple(prompt),
                max_tokens=max_tokens,
                min_tokens=min_tokens,
                stop_token_ids=stop_token_ids,
                outputs=outputs,
                arrival=arrival,
                abort=abort,
                abort_in_flight=abort is not None and rng.random() < 0.5,
            )
        )
    return Trace(config, tuple(requests))


# ---------------------------------------------------------------- the two sides


def _blocks(block_ids: Any) -> Any:
    """Block ids as nested lists (None stays None)."""
    return None if block_ids is None else [list(group) for group in block_ids]


class Side:
    """One scheduler behind the calls the engine loop makes, with comparable views."""

    name: str
    sched: Any

    def add(self, spec: ReqSpec) -> None:
        raise NotImplementedError

    def abort(self, req_ids: list[str]) -> list[str]:
        """Abort ``req_ids``, one ``finish_requests`` call each; the ids actually finished.

        One call per id, on purpose: upstream's ``finish_requests`` iterates over
        ``set(request_ids)``, so with several ids it frees their blocks in string-hash order
        (randomised per process), while mini_vllm keeps the caller's order. The order decides
        the free queue, hence later block ids; with one id per call both are deterministic.
        """
        finished: list[str] = []
        for req_id in req_ids:
            finished += self._finish(req_id)
        return finished

    def _finish(self, req_id: str) -> list[str]:
        raise NotImplementedError

    def update(self, output: Any, sampled: dict[str, int]) -> list[tuple[Any, ...]]:
        raise NotImplementedError

    def has_requests(self) -> bool:
        return self.sched.has_unfinished_requests() or self.sched.has_finished_requests()

    def schedule(self) -> tuple[Any, dict[str, Any], list[str]]:
        """Schedule a step: the output, its comparable view, the requests that sample."""
        out = self.sched.schedule()
        cached = out.scheduled_cached_reqs
        num_output_tokens = list(cached.num_output_tokens)
        view = {
            "num_scheduled_tokens (in order)": list(out.num_scheduled_tokens.items()),
            "total_num_scheduled_tokens": out.total_num_scheduled_tokens,
            "scheduled_new_reqs": [
                (r.req_id, list(r.prompt_token_ids), _blocks(r.block_ids), r.num_computed_tokens)
                for r in out.scheduled_new_reqs
            ],
            "cached req_ids": list(cached.req_ids),
            "cached resumed_req_ids": sorted(cached.resumed_req_ids),
            "cached new_block_ids": [_blocks(b) for b in cached.new_block_ids],
            "cached num_computed_tokens": list(cached.num_computed_tokens),
            "cached num_output_tokens": num_output_tokens,
            "cached all_token_ids": {k: list(v) for k, v in cached.all_token_ids.items()},
            # Not compared: cached.new_token_ids. Upstream fills it only under pipeline
            # parallelism (Scheduler._make_cached_request_data); mini_vllm's runner reads it,
            # so mini_vllm always fills it (a deliberate difference of the payload only).
            "preempted_req_ids": sorted(out.preempted_req_ids or ()),
            "finished_req_ids": sorted(out.finished_req_ids),
            "num_common_prefix_blocks": self.num_common_prefix_blocks(out),
        }
        samplers = [
            req_id
            for req_id in out.num_scheduled_tokens
            if not self.sched.requests[req_id].is_prefill_chunk
        ]
        return out, view, samplers

    def num_common_prefix_blocks(self, out: Any) -> list[int]:
        """Upstream's ``schedule()`` counts the prefix all requests share; read it off ``out``."""
        return list(out.num_common_prefix_blocks)

    def state(self) -> dict[str, Any]:
        sched = self.sched
        manager = sched.kv_cache_manager
        pool = manager.block_pool
        cache_map: dict[Any, list[int]] = {}
        for key, value in pool.cached_block_hash_to_block._cache.items():
            blocks = [value] if not isinstance(value, dict) else list(value.values())
            cache_map[key] = sorted(b.block_id for b in blocks)
        return {
            "waiting (front first)": [r.request_id for r in sched.waiting],
            "running": [r.request_id for r in sched.running],
            "requests": {
                req_id: {
                    "status": r.status.name,
                    "num_computed_tokens": r.num_computed_tokens,
                    "num_output_placeholders": r.num_output_placeholders,
                    "output_token_ids": list(r.output_token_ids),
                    "num_preemptions": r.num_preemptions,
                    "is_prefill_chunk": r.is_prefill_chunk,
                }
                for req_id, r in sorted(sched.requests.items())
            },
            "block ids of running requests": {
                r.request_id: _blocks(manager.get_block_ids(r.request_id)) for r in sched.running
            },
            "free queue (front first)": [
                b.block_id for b in pool.free_block_queue.get_all_free_blocks()
            ],
            "num_free_blocks": pool.get_num_free_blocks(),
            "ref_cnt": [b.ref_cnt for b in pool.blocks],
            "block_hash": [b.block_hash for b in pool.blocks],
            "prefix-cache map": cache_map,
            "num_unfinished_requests": sched.get_num_unfinished_requests(),
        }


class MiniSide(Side):
    name = "mini_vllm"

    def __init__(self, config: Config) -> None:
        manager = MiniKVCacheManager(
            num_gpu_blocks=config.num_gpu_blocks,
            block_size=config.block_size,
            max_model_len=config.max_model_len,
            enable_caching=config.enable_prefix_caching,
        )
        kwargs: dict[str, Any] = {}
        if mini_has_gate():
            kwargs["scheduler_reserve_full_isl"] = config.scheduler_reserve_full_isl
        elif config.scheduler_reserve_full_isl:
            raise ValueError("mini_vllm's Scheduler has no scheduler_reserve_full_isl yet")
        cls = MiniAsyncScheduler if config.async_scheduling else MiniScheduler
        self.sched = cls(
            manager,
            max_num_batched_tokens=config.max_num_batched_tokens,
            max_num_seqs=config.max_num_seqs,
            max_model_len=config.max_model_len,
            enable_chunked_prefill=config.enable_chunked_prefill,
            long_prefill_token_threshold=config.long_prefill_token_threshold,
            **kwargs,
        )
        self.hasher = mini_kv_cache_utils.get_request_block_hasher(config.block_size, HASH_FN)

    def add(self, spec: ReqSpec) -> None:
        params = MiniSamplingParams(
            max_tokens=spec.max_tokens,
            min_tokens=spec.min_tokens,
            stop_token_ids=list(spec.stop_token_ids),
        )
        self.sched.add_request(
            MiniRequest(
                spec.req_id,
                list(spec.prompt),
                params,
                eos_token_id=EOS,
                arrival_time=0.0,
                block_hasher=self.hasher,
            )
        )

    def _finish(self, req_id: str) -> list[str]:
        return self.sched.finish_requests([req_id], MiniRequestStatus.FINISHED_ABORTED)

    def num_common_prefix_blocks(self, out: Any) -> list[int]:
        """Ours does not count it (no cascade attention): ask the manager, as upstream does."""
        return common_prefix_blocks(self.sched)

    def update(self, output: Any, sampled: dict[str, int]) -> list[tuple[Any, ...]]:
        outs = self.sched.update_from_output(
            output, {req_id: [tok] for req_id, tok in sampled.items()}
        )
        return [
            (o.request_id, list(o.new_token_ids), _reason(o.finish_reason), o.stop_reason)
            for o in outs
        ]


def _reason(reason: Any) -> str | None:
    return None if reason is None else reason.name


class UpstreamSide(Side):
    name = "upstream"

    def __init__(self, config: Config) -> None:
        up = upstream_modules()
        self.up = up
        spec = up.kv_cache_interface.FullAttentionSpec(
            block_size=config.block_size, num_kv_heads=1, head_size=1, dtype=torch.float32
        )
        kv_cache_config = up.kv_cache_interface.KVCacheConfig(
            num_blocks=config.num_gpu_blocks,
            kv_cache_tensors=[],
            kv_cache_groups=[up.kv_cache_interface.KVCacheGroupSpec(["layer"], spec)],
        )
        vllm_config = fake_vllm_config(
            num_gpu_blocks=config.num_gpu_blocks,
            block_size=config.block_size,
            max_model_len=config.max_model_len,
            max_num_batched_tokens=config.max_num_batched_tokens,
            max_num_seqs=config.max_num_seqs,
            enable_prefix_caching=config.enable_prefix_caching,
            enable_chunked_prefill=config.enable_chunked_prefill,
            long_prefill_token_threshold=config.long_prefill_token_threshold,
            scheduler_reserve_full_isl=config.scheduler_reserve_full_isl,
            async_scheduling=config.async_scheduling,
        )
        module = up.async_scheduler if config.async_scheduling else up.scheduler
        cls = module.AsyncScheduler if config.async_scheduling else module.Scheduler
        self.sched = cls(
            vllm_config=vllm_config,
            kv_cache_config=kv_cache_config,
            structured_output_manager=NoStructuredOutputs(),
            block_size=config.block_size,
            log_stats=False,
        )
        self.hasher = up.kv_cache_utils.get_request_block_hasher(config.block_size, HASH_FN)

    def add(self, spec: ReqSpec) -> None:
        params = self.up.sampling_params.SamplingParams(
            max_tokens=spec.max_tokens,
            min_tokens=spec.min_tokens,
            stop_token_ids=list(spec.stop_token_ids),
        )
        params.update_from_generation_config({}, eos_token_id=EOS)
        self.sched.add_request(
            self.up.request.Request(
                spec.req_id,
                list(spec.prompt),
                params,
                None,
                arrival_time=0.0,
                block_hasher=self.hasher,
            )
        )

    def _finish(self, req_id: str) -> list[str]:
        finished = self.sched.finish_requests(
            [req_id], self.up.request.RequestStatus.FINISHED_ABORTED
        )
        return [finished_id for finished_id, _client in finished]

    def update(self, output: Any, sampled: dict[str, int]) -> list[tuple[Any, ...]]:
        req_ids = list(output.num_scheduled_tokens)
        runner_output = self.up.outputs.ModelRunnerOutput(
            req_ids=req_ids,
            req_id_to_index={req_id: i for i, req_id in enumerate(req_ids)},
            # A partial prefill samples nothing (the runner discards its token).
            sampled_token_ids=[[sampled[r]] if r in sampled else [] for r in req_ids],
        )
        outs = self.sched.update_from_output(output, runner_output)
        assert set(outs) <= {0}, outs  # one client
        return [
            (o.request_id, list(o.new_token_ids), _reason(o.finish_reason), o.stop_reason)
            for o in (outs[0].outputs if 0 in outs else [])
        ]


@cache
def upstream_modules() -> Any:
    """Upstream's scheduler modules (sdist fetched on first use, modules cached)."""
    return load_upstream_scheduler(ensure_upstream())


# ---------------------------------------------------------------- the engine loop


class _Pair:
    """Both sides in lockstep: every call made on both, every result and state compared."""

    def __init__(self, trace: Trace) -> None:
        self.mini = MiniSide(trace.config)
        self.upstream = UpstreamSide(trace.config)
        self.step = 0

    def both(self, what: str, call: Callable[[Side], Any]) -> tuple[Any, Any]:
        results = []
        for side in (self.mini, self.upstream):
            try:
                results.append(call(side))
            except Exception as exc:  # a crash on one side is a divergence too
                results.append(("raised", f"{type(exc).__name__}: {exc}"))
        if results[0] != results[1]:
            raise Divergence(self.step, what, results[0], results[1])
        return results[0], results[1]

    def check_state(self, after: str) -> None:
        mini, upstream = self.mini.state(), self.upstream.state()
        for key in mini:
            if mini[key] != upstream[key]:
                raise Divergence(self.step, f"state after {after}: {key}", mini[key], upstream[key])


@dataclass
class Stats:
    """What a run exercised (summed over traces to show the traces reach the hard cases)."""

    traces: int = 0
    steps: int = 0
    preemptions: int = 0
    resumptions: int = 0
    prefix_hit_tokens: int = 0
    aborted: int = 0
    finished: dict[str, int] = dataclasses.field(default_factory=dict)
    stop_token_stops: int = 0

    def add(self, other: Stats) -> None:
        for field in ("traces", "steps", "preemptions", "resumptions", "prefix_hit_tokens"):
            setattr(self, field, getattr(self, field) + getattr(other, field))
        self.aborted += other.aborted
        self.stop_token_stops += other.stop_token_stops
        for reason, n in other.finished.items():
            self.finished[reason] = self.finished.get(reason, 0) + n


def run_trace(trace: Trace, max_steps: int | None = None) -> Stats:
    """Run ``trace`` on both sides; raise :class:`Divergence` at the first difference.

    A trace that has not drained after ``max_steps`` steps on both sides (a livelock; by
    default ten steps per token of the trace, far more than any preemption storm needs) fails
    too.
    """
    if max_steps is None:
        max_steps = 100 + 10 * sum(len(s.prompt) + s.max_tokens for s in trace.requests)
    config = trace.config
    pair = _Pair(trace)
    stats = Stats(traces=1)
    # Upstream's engine: EngineCore.step is step_with_batch_queue with a queue of one.
    queue_size = 2 if config.async_scheduling else 1
    arrivals: dict[int, list[ReqSpec]] = {}
    aborts: dict[tuple[int, bool], list[str]] = {}
    for spec in trace.requests:
        arrivals.setdefault(spec.arrival, []).append(spec)
        if spec.abort is not None:
            # Only the batch queue has aborts land between a step's schedule and its
            # output (_process_aborts_queue); the synchronous loop takes them before a step.
            in_flight = spec.abort_in_flight and queue_size > 1
            aborts.setdefault((spec.abort, in_flight), []).append(spec.req_id)
    last_event = max([*arrivals, *(step for step, _ in aborts), 0])
    specs = {spec.req_id: spec for spec in trace.requests}
    num_sampled: dict[str, int] = dict.fromkeys(specs, 0)
    # (mini output, upstream output, requests that sample), newest first (upstream's deque).
    batch_queue: list[tuple[Any, Any, list[str]]] = []
    # Aborts that arrived while a step ran, applied before the next output is processed.
    pending_aborts: list[str] = []

    def execute(samplers: list[str]) -> dict[str, int]:
        """What the model samples for a step: the next scripted token of each sampler."""
        sampled = {}
        for req_id in samplers:
            sampled[req_id] = specs[req_id].token(num_sampled[req_id])
            num_sampled[req_id] += 1
        return sampled

    def abort(req_ids: list[str], what: str) -> None:
        finished, _ = pair.both(f"{what} {req_ids}", lambda s: s.abort(req_ids))
        stats.aborted += len(finished)
        pair.check_state(what)

    def schedule() -> bool:
        """Schedule on both sides and queue the step; whether it runs any token."""
        (mini_out, mini_view, mini_samplers), (up_out, up_view, up_samplers) = (
            pair.mini.schedule(),
            pair.upstream.schedule(),
        )
        for key in mini_view:
            if mini_view[key] != up_view[key]:
                raise Divergence(pair.step, f"schedule(): {key}", mini_view[key], up_view[key])
        if mini_samplers != up_samplers:
            raise Divergence(pair.step, "requests that sample a token", mini_samplers, up_samplers)
        pair.check_state("schedule()")
        stats.preemptions += len(mini_view["preempted_req_ids"])
        stats.resumptions += len(mini_view["cached resumed_req_ids"])
        stats.prefix_hit_tokens += sum(n for *_, n in mini_view["scheduled_new_reqs"])
        batch_queue.insert(0, (mini_out, up_out, mini_samplers))
        return mini_view["total_num_scheduled_tokens"] > 0

    def process_oldest() -> None:
        mini_out, up_out, samplers = batch_queue.pop()
        if pending_aborts:
            in_flight = list(pending_aborts)
            pending_aborts.clear()
            abort(in_flight, "abort in flight")
        sampled = execute(samplers)
        outputs, _ = pair.both(
            f"update_from_output (sampled {sampled})",
            lambda s: s.update(mini_out if s is pair.mini else up_out, sampled),
        )
        pair.check_state("update_from_output")
        for _req_id, _tokens, reason, stop_reason in outputs:
            if reason is not None:
                stats.finished[reason] = stats.finished.get(reason, 0) + 1
                stats.stop_token_stops += stop_reason is not None

    for step in range(max_steps):
        pair.step = stats.steps = step
        for spec in arrivals.get(step, []):
            pair.both(f"add_request({spec.req_id})", lambda s, spec=spec: s.add(spec))
        if arrivals.get(step):
            pair.check_state("add_request")
        if aborts.get((step, False)):
            abort(aborts[(step, False)], "abort")
        pending_aborts.extend(aborts.get((step, True), []))
        # One call of EngineCore.step_with_batch_queue (the model never finishes early).
        has_requests, _ = pair.both("has_requests()", lambda s: s.has_requests())
        if has_requests:
            if schedule() and len(batch_queue) < queue_size:
                continue  # the step runs; schedule the next one before reading its output
        elif not batch_queue:
            if step > last_event:
                return stats
            continue
        process_oldest()
    raise Divergence(max_steps, "the trace did not drain (livelock on both sides)", None, None)


# ---------------------------------------------------------------- shrinking


def divergence(trace: Trace) -> Divergence | None:
    """The first divergence of ``trace``, or None."""
    try:
        run_trace(trace)
    except Divergence as exc:
        return exc
    return None


def shrink(trace: Trace, diverges: Callable[[Trace], bool] | None = None) -> Trace:
    """A smaller trace that still diverges: greedily drop requests, events, tokens, blocks.

    By default a candidate must diverge in the same place (``Divergence.what``, the values
    aside) as ``trace``, so that shrinking does not wander off to another difference (or to a
    livelock of a pool made too small).
    """
    if diverges is None:
        first = divergence(trace)
        assert first is not None, "the trace does not diverge"
        kind = first.what.partition(" (")[0]

        def diverges(candidate: Trace) -> bool:
            found = divergence(candidate)
            return found is not None and found.what.partition(" (")[0] == kind

    changed = True
    while changed:
        changed = False
        for candidate in _smaller(trace):
            if diverges(candidate):
                trace, changed = candidate, True
                break
    return trace


def _smaller(trace: Trace) -> Iterable[Trace]:
    requests = trace.requests
    for i in range(len(requests)):  # drop a request
        if len(requests) > 1:
            yield dataclasses.replace(trace, requests=requests[:i] + requests[i + 1 :])
    for i, spec in enumerate(requests):  # simplify one request
        simpler = []
        if spec.abort is not None:
            simpler.append(dataclasses.replace(spec, abort=None, abort_in_flight=False))
        if spec.arrival > 0:
            simpler.append(dataclasses.replace(spec, arrival=0))
            simpler.append(dataclasses.replace(spec, arrival=spec.arrival - 1))
        if spec.stop_token_ids:
            simpler.append(dataclasses.replace(spec, stop_token_ids=()))
        if spec.min_tokens:
            simpler.append(dataclasses.replace(spec, min_tokens=0))
        if len(spec.outputs) > 1:
            simpler.append(dataclasses.replace(spec, outputs=spec.outputs[:-1]))
        if len(spec.prompt) > 1:
            half = len(spec.prompt) // 2
            simpler.append(dataclasses.replace(spec, prompt=spec.prompt[half:]))
            simpler.append(dataclasses.replace(spec, prompt=spec.prompt[1:]))
            simpler.append(dataclasses.replace(spec, prompt=spec.prompt[:-1]))
        if spec.max_tokens > 1:
            simpler.append(
                dataclasses.replace(
                    spec,
                    max_tokens=spec.max_tokens - 1,
                    min_tokens=min(spec.min_tokens, spec.max_tokens - 1),
                )
            )
        for candidate in simpler:
            yield dataclasses.replace(
                trace, requests=(*requests[:i], candidate, *requests[i + 1 :])
            )
    config = trace.config
    for field, floor in (("num_gpu_blocks", 2), ("max_num_seqs", 1), ("max_num_batched_tokens", 1)):
        value = getattr(config, field)
        if value > floor:
            smaller = dataclasses.replace(config, **{field: value - 1})
            if smaller.max_num_batched_tokens >= smaller.max_num_seqs and (
                smaller.enable_chunked_prefill
                or smaller.max_num_batched_tokens >= smaller.max_model_len
            ):
                yield dataclasses.replace(trace, config=smaller)
    if config.long_prefill_token_threshold:
        yield dataclasses.replace(
            trace, config=dataclasses.replace(config, long_prefill_token_threshold=0)
        )


def reproducer(trace: Trace) -> str:
    """The trace as Python: paste after ``from tests.upstream.sched_diff import *``."""
    lines = [f"Trace(\n    {trace.config!r},\n    ("]
    lines += [f"        {spec!r}," for spec in trace.requests]
    lines.append("    ),\n)")
    return "\n".join(lines)
