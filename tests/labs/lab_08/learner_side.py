"""lab-08's helpers in the learner process: build a scheduler and requests, run one call, read.

The grader copies this file into the learner's sandbox as the top-level module ``learner_side``;
the tests reach it with ``learner_module("learner_side")``. Nothing here decides anything: each
helper builds an object the learner's scheduler must receive, makes the one call the judge names
(``schedule``, ``update_from_output``, ``finish_requests``) and returns what it then reads as
plain data: the ``SchedulerOutput``, the ``EngineCoreOutput`` list, the queues, every request's
counters, the block tables and the block pool. The judge checks all of it (types included) and
runs the fake model itself.

The judge also imports this module and runs the same readers on the reference scheduler (its
oracle), so both sides are described by the same code. The KV cache manager is looked up when a
scheduler is built, so that ``--chain`` puts the learner's own lab-07 manager under it; the
scheduler is the learner's ``scheduler`` module.
"""

from __future__ import annotations

import collections
import contextlib
from typing import Any

from mini_vllm.core.sched.request_queue import PriorityRequestQueue as _PriorityQueue
from mini_vllm.request import ConstantList as _Tokens
from mini_vllm.teaching.invariants import pool_snapshot


# -- building ---------------------------------------------------------------------------------
def make_manager(num_blocks: int, block_size: int, max_model_len: int, caching: bool = True) -> Any:
    """The KV cache manager in use (the reference's, or the learner's lab-07 under --chain)."""
    import mini_vllm.core.kv_cache_manager as managers

    manager = managers.KVCacheManager(
        num_blocks, block_size, max_model_len, enable_caching=caching, log_stats=True
    )
    _count_lookups(manager)
    return manager


def _count_lookups(manager: Any) -> None:
    """Count ``manager.get_computed_blocks`` calls per request, with caching on (each is a
    lookup the prefix-cache statistics record), by wrapping the method on this one object: the
    count does not depend on how the manager keeps its statistics (``--chain``). The counts
    ride on the wrapper (``lookups``), where ``state`` reads them."""
    counts: dict[str, int] = {}
    lookup = manager.get_computed_blocks

    def get_computed_blocks(request: Any) -> Any:
        if manager.enable_caching:
            counts[request.request_id] = counts.get(request.request_id, 0) + 1
        return lookup(request)

    get_computed_blocks.lookups = counts  # type: ignore[attr-defined]
    # A manager that refuses the wrapper is reported by _lookups as uncounted, which the judge
    # fails, like one that lost the wrapper later (tests/hostile/drop_the_lookup_counter.py):
    # the course's KVCacheManager (the reference, or lab-07's with its given __init__) takes it,
    # and a manager's class is in the learner process, where the code under test can make it
    # refuse (tests/hostile/refuse_the_counter_and_hide_the_statistics.py).
    with contextlib.suppress(AttributeError, TypeError):
        manager.get_computed_blocks = get_computed_blocks


#: The counters of the manager's ``prefix_cache_stats`` that ``state`` reads.
STATISTICS = (
    "requests",
    "queries",
    "hits",
    "preempted_requests",
    "preempted_queries",
    "preempted_hits",
)


def make_scheduler(
    num_blocks: int,
    block_size: int,
    max_model_len: int,
    budget: int,
    max_num_seqs: int,
    caching: bool = True,
    scheduler_cls: Any = None,
    **kwargs: Any,
) -> Any:
    """``Scheduler(manager, budget, max_num_seqs, max_model_len, **kwargs)``: the learner's
    class unless ``scheduler_cls`` is given (the judge passes the reference's)."""
    if scheduler_cls is None:
        import scheduler

        scheduler_cls = scheduler.Scheduler
    manager = make_manager(num_blocks, block_size, max_model_len, caching)
    return scheduler_cls(manager, budget, max_num_seqs, max_model_len, **kwargs)


def make_request(
    request_id: str,
    prompt: list[int],
    block_size: int,
    max_tokens: Any = 8,
    eos: int | None = None,
    generation_eos: int | None = None,
    priority: int = 0,
    arrival_time: float | None = None,
    repetition: tuple[int, int, int] | None = None,
    **sampling: Any,
) -> Any:
    """A greedy request whose full blocks are hashed (chained) as its tokens arrive.

    ``generation_eos`` records the model's EOS in the sampling parameters, as the engine does
    (``update_from_generation_config``). ``priority`` and ``arrival_time`` order it under the
    priority policy. ``repetition`` is ``(max_pattern_size, min_pattern_size, min_count)`` of
    ``SamplingParams.repetition_detection``.
    """
    from mini_vllm.core.kv_cache_utils import get_request_block_hasher, sha256
    from mini_vllm.request import Request
    from mini_vllm.sampling_params import RepetitionDetectionParams, SamplingParams

    if repetition is not None:
        sampling["repetition_detection"] = RepetitionDetectionParams(*repetition)
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, **sampling)
    if generation_eos is not None:
        params.update_from_generation_config({}, eos_token_id=generation_eos)
    return Request(
        request_id,
        list(prompt),
        params,
        eos_token_id=eos,
        arrival_time=arrival_time,
        priority=priority,
        block_hasher=get_request_block_hasher(block_size, sha256),
    )


# -- one call, then what it left ----------------------------------------------------------------
def schedule(sched: Any, requests: list[Any]) -> list[Any]:
    """``sched.schedule()``: [the output itself, the output as data, the state after it]."""
    out = sched.schedule()
    return [out, output_data(out), state(sched, requests, pool=True)]


def update(sched: Any, out: Any, sampled: dict[str, list[int]], requests: list[Any]) -> list[Any]:
    """``sched.update_from_output(out, sampled)``: [the outputs as data, the state after]."""
    results = sched.update_from_output(out, sampled)
    return [outputs_data(results), state(sched, requests, pool=False)]


def finish(sched: Any, request_ids: Any, status: Any, requests: list[Any]) -> list[Any]:
    """``sched.finish_requests(request_ids, status)``: [what it returned, the state after]."""
    done = sched.finish_requests(request_ids, status)
    return [done, state(sched, requests, pool=False)]


def check_stop(module: Any, request: Any, tokens: list[int], max_model_len: int) -> list[Any]:
    """Append ``tokens`` one at a time; after each, ``module.check_stop(request, max_model_len)``.

    Returns [the answers, then the request's status, stop_reason, output tokens and finish
    reason]."""
    answers = []
    for token in tokens:
        request.append_output_token_ids(token)
        answers.append(module.check_stop(request, max_model_len))
    return [answers, request_data(request)]


# -- reading ------------------------------------------------------------------------------------
def _plain(values: Any) -> list[Any]:
    """The elements of a ``dict`` (its keys), ``list``, ``tuple``, ``set``, ``frozenset`` or
    ``deque`` (the FCFS waiting queue), read by that type's own iteration, whatever subclass
    holds them; a priority queue by ``PriorityRequestQueue``'s own ``__iter__``, a request's
    token list by ``ConstantList``'s. A subclass answers ``__iter__`` as it likes: a scheduler's
    ``requests`` that left the finished ones out of its iteration hid a leak from every state
    read (tests/hostile/hide_the_finished_from_the_schedulers_requests.py), and a waiting queue
    that did the same hid an aborted request that ``len`` still counted
    (tests/hostile/lab_08_hide_the_aborted_from_the_waiting_walk.py). Anything else is read as
    the name of its type, which no test takes for a right answer: a waiting queue of the
    submission's own class answered its own iteration the same way
    (tests/hostile/lab_08_hide_the_aborted_in_a_queue_of_its_own.py)."""
    for base in (dict, list, tuple, set, frozenset, collections.deque, _PriorityQueue, _Tokens):
        if isinstance(values, base):
            return list(base.__iter__(values))
    return [f"<a {type(values).__name__}, not one of the course's containers>"]


def _pairs(mapping: Any) -> list[tuple[Any, Any]]:
    """A ``dict``'s ``(key, value)`` pairs, read by ``dict``'s own ``items`` (as :func:`_plain`);
    anything else by its own ``items``."""
    return list(dict.items(mapping) if isinstance(mapping, dict) else mapping.items())


def _ids(values: Any) -> list[Any]:
    return _plain(values) if values is not None else None


def output_data(out: Any) -> dict[str, Any]:
    """A ``SchedulerOutput`` as data, as the model runner reads it."""
    cached = out.scheduled_cached_reqs
    return {
        "batch": [[rid, n] for rid, n in _pairs(out.num_scheduled_tokens)],
        "total": out.total_num_scheduled_tokens,
        "new": [
            [
                new.req_id,
                _ids(new.prompt_token_ids),
                [_ids(group) for group in new.block_ids],
                new.num_computed_tokens,
            ]
            for new in out.scheduled_new_reqs
        ],
        "cached": {
            "req_ids": _ids(cached.req_ids),
            "resumed": _ids(cached.resumed_req_ids),
            "new_token_ids": [_ids(t) for t in cached.new_token_ids],
            "all_token_ids": {rid: _ids(t) for rid, t in cached.all_token_ids.items()},
            "new_block_ids": [
                None if ids is None else [_ids(group) for group in ids]
                for ids in cached.new_block_ids
            ],
            "num_computed_tokens": _ids(cached.num_computed_tokens),
            "num_output_tokens": _ids(cached.num_output_tokens),
        },
        "finished": _ids(out.finished_req_ids),
        "preempted": _ids(out.preempted_req_ids),
    }


def outputs_data(results: Any) -> list[list[Any]]:
    """``EngineCoreOutput``s as [request_id, new_token_ids, finish_reason, stop_reason]."""
    return [
        [res.request_id, _ids(res.new_token_ids), res.finish_reason, res.stop_reason]
        for res in results
    ]


REQUEST_FIELDS = (
    "status",
    "num_computed_tokens",
    "num_tokens",
    "output_token_ids",
    "num_preemptions",
    "is_prefill_chunk",
    "stop_reason",
    "max_tokens",
)


def request_data(req: Any) -> dict[str, Any]:
    """One request's counters as found."""
    return dict(zip(REQUEST_FIELDS, _request_row(req)))


def _request_row(req: Any) -> list[Any]:
    return [
        req.status,
        req.num_computed_tokens,
        req.num_tokens,
        _ids(req.output_token_ids),
        req.num_preemptions,
        req.is_prefill_chunk,
        req.stop_reason,
        req.max_tokens,
    ]


def _lookups(manager: Any) -> list[list[Any]] | str:
    """``[[request_id, lookups], ...]`` counted by ``_count_lookups``; ``"uncounted"`` if the
    manager the scheduler holds has no wrapper (it refused it, the wrapper was taken off, or
    the scheduler put another manager in place of the one it was given), which the judge
    fails."""
    counts = getattr(manager.get_computed_blocks, "lookups", None)
    if counts is not None:
        return [[rid, n] for rid, n in sorted(counts.items())]
    return "uncounted"


def _statistics(manager: Any) -> list[Any]:
    """The counters of the manager's own ``prefix_cache_stats``, as found (None for each that
    is missing, which the judge fails: every manager here is built with ``log_stats=True``).
    They are what a lookup leaves however it is made: the wrapper of ``_count_lookups``
    misses a call made through the class, ``KVCacheManager.get_computed_blocks(manager,
    request)``, which the statistics record all the same
    (tests/hostile/look_up_through_the_class.py)."""
    stats = getattr(manager, "prefix_cache_stats", None)
    return [getattr(stats, name, None) for name in STATISTICS]


def state(sched: Any, requests: list[Any], pool: bool = True) -> dict[str, Any]:
    """The scheduler's queues, the KV cache's block tables and pool, and the given requests
    (one row each, ``[request_id, *REQUEST_FIELDS]``). The pool is read whole (a snapshot of
    every block and of the free queue) with ``pool``, else only its blocks' ref counts."""
    manager = sched.kv_cache_manager
    block_pool = manager.block_pool
    return {
        "running": [req.request_id for req in _plain(sched.running)],
        "waiting": [req.request_id for req in _plain(sched.waiting)],
        "requests": _plain(sched.requests),
        "pending_finished": _plain(sched.finished_req_ids),
        "tables": [
            [rid, [blk.block_id for blk in _plain(blocks)]]
            for rid, blocks in _pairs(manager.req_to_blocks)
        ],
        "free": block_pool.get_num_free_blocks(),
        "pool": pool_snapshot(block_pool) if pool else None,
        "ref_cnts": [getattr(b, "ref_cnt", None) for b in block_pool.blocks],
        "lookups": _lookups(manager),
        "statistics": _statistics(manager),
        "reqs": [[req.request_id, *_request_row(req)] for req in requests],
    }


# -- cost ---------------------------------------------------------------------------------------
def crowded_scheduler(num_waiting: int, scheduler_cls: Any = None) -> Any:
    """A scheduler (``max_num_seqs`` 4, budget 64, 1,024 blocks of 4) with ``4 + num_waiting``
    requests of 3 tokens (no full block, nothing to hash) added, and one step run: r0..r3 run
    (their prompts done, each holding its first sampled token), the rest wait behind them."""
    sched = make_scheduler(1024, 4, 4096, 64, 4, scheduler_cls=scheduler_cls)
    for i in range(4 + num_waiting):
        sched.add_request(make_request(f"r{i}", [1 + i % 50, 2, 3], 4, max_tokens=4000))
    out = sched.schedule()
    sched.update_from_output(out, {rid: [7] for rid in out.num_scheduled_tokens})
    return sched


def decode_steps(sched: Any, steps: int) -> list[list[Any]]:
    """``steps`` decode steps (``schedule`` and ``update_from_output``, one token 7 for each
    scheduled request), in one request the judge times: the ids scheduled at each step."""
    scheduled = []
    for _ in range(steps):
        out = sched.schedule()
        ids = sorted(out.num_scheduled_tokens)
        sched.update_from_output(out, {rid: [7] for rid in ids})
        scheduled.append(ids)
    return scheduled


def abort_every_other_waiting(sched: Any) -> list[Any]:
    """``finish_requests`` (abort) of every other waiting request of a ``crowded_scheduler``,
    the last first, in one request the judge times: [how many ids it returned, then the running
    and waiting counts after]."""
    from mini_vllm.request import RequestStatus

    waiting = [request.request_id for request in sched.waiting]
    done = sched.finish_requests(waiting[::-2], RequestStatus.FINISHED_ABORTED)
    return [len(done), len(sched.running), len(sched.waiting)]
