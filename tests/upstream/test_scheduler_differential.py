"""Scheduler differential: mini_vllm's ``Scheduler``/``AsyncScheduler`` against upstream's own.

Random traces (``sched_diff.random_trace``: shared prefixes with prefix caching mostly on,
prompts of every length up to ``max_model_len``, ``max_tokens``/``min_tokens``, EOS and stop
tokens, staggered arrivals, aborts before a step and while one runs, a pool barely larger than
one request so that preemption is frequent, chunked prefill under a token budget and
``long_prefill_token_threshold``, ``max_num_seqs``) run through both schedulers in upstream's
engine loop, compared after every call (``sched_diff.py`` says what is compared). Upstream's
``Scheduler`` is the real one, executed on CPU from the sdist (``upstream_sched.py``).

Every mode runs with upstream's admission gate (``scheduler_reserve_full_isl``) off on both
sides and, once mini_vllm's ``Scheduler`` takes the keyword, on.

How many traces: ``MINI_VLLM_SCHED_DIFF_TRACES`` per mode (default 200, about 3 s per mode on
one core; ``make test-upstream`` runs 5,000), from seed ``MINI_VLLM_SCHED_DIFF_SEED``
(default 0). A divergence is shrunk to a minimal trace, printed as Python (paste it after
``from tests.upstream.sched_diff import *`` and call ``run_trace``).

Deliberate differences neutralised by the traces or the driver, each at its place in
``sched_diff.py``: ``min_tokens`` never exceeds what ``max_model_len`` leaves (upstream's known
bug there, and our ``<= 0`` guard); the runner gives no token to a partial prefill (our
mid-prefill ``ValueError``); aborts are sent one id per ``finish_requests`` call (upstream frees
a batch in string-hash order); ``CachedRequestData.new_token_ids`` is not compared (upstream
fills it only under pipeline parallelism). Not reached by any trace: repetition detection
(never requested), the pause state (never set), ``max_num_scheduled_tokens`` (left unset, so
both budgets are ``max_num_batched_tokens``).
"""

from __future__ import annotations

import os
import random
from typing import Any

import pytest

from mini_vllm.core.sched.request_queue import FCFSRequestQueue
from mini_vllm.core.sched.scheduler import Scheduler as MiniScheduler

from . import sched_diff
from .sched_diff import (
    EOS,
    Config,
    Divergence,
    ReqSpec,
    Stats,
    Trace,
    mini_has_gate,
    random_trace,
    reproducer,
    run_trace,
    shrink,
)

NUM_TRACES = int(os.environ.get("MINI_VLLM_SCHED_DIFF_TRACES", "200"))
FIRST_SEED = int(os.environ.get("MINI_VLLM_SCHED_DIFF_SEED", "0"))


def _gate_or_skip(reserve_full_isl: bool) -> None:
    if reserve_full_isl and not mini_has_gate():
        pytest.skip("mini_vllm's Scheduler has no scheduler_reserve_full_isl keyword yet")


@pytest.mark.parametrize("reserve_full_isl", [False, True], ids=["gate-off", "gate-on"])
@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_matches_upstream_on_random_traces(
    async_scheduling: bool, reserve_full_isl: bool, capsys: pytest.CaptureFixture[str]
) -> None:
    """0 divergences on NUM_TRACES random traces, and the traces reach the hard cases."""
    _gate_or_skip(reserve_full_isl)
    total = Stats()
    for seed in range(FIRST_SEED, FIRST_SEED + NUM_TRACES):
        trace = random_trace(
            random.Random(seed),
            async_scheduling=async_scheduling,
            reserve_full_isl=reserve_full_isl,
        )
        try:
            total.add(run_trace(trace))
        except Divergence as exc:
            small = shrink(trace)
            pytest.fail(
                f"seed {seed} diverges from upstream: {exc}\n\nminimal reproducer "
                f"(from tests.upstream.sched_diff import *; run_trace(...)):\n"
                f"{reproducer(small)}\n\nits divergence: {sched_diff.divergence(small)}",
                pytrace=False,
            )
    # The generator must keep producing the cases the differential is for.
    assert total.preemptions > 0 and total.resumptions > 0, total
    assert total.prefix_hit_tokens > 0 and total.aborted > 0, total
    assert total.finished.get("STOP", 0) > total.stop_token_stops > 0, total
    assert total.finished.get("LENGTH", 0) > 0, total
    with capsys.disabled():
        print(f"\n  {'async' if async_scheduling else 'sync'} gate={reserve_full_isl}: {total}")


def _one_request(async_scheduling: bool, outputs: tuple[int, ...]) -> Trace:
    config = Config(
        block_size=4,
        num_gpu_blocks=9,
        max_model_len=16,
        max_num_batched_tokens=8,
        max_num_seqs=2,
        long_prefill_token_threshold=0,
        enable_prefix_caching=True,
        scheduler_reserve_full_isl=False,
        async_scheduling=async_scheduling,
    )
    request = ReqSpec(
        req_id="a",
        prompt=(1, 2),
        max_tokens=4,
        min_tokens=0,
        stop_token_ids=(),
        outputs=outputs,
        arrival=0,
    )
    return Trace(config, (request,))


# The minimal reproducers of the divergences this differential found (issue #21), now fixed.
FIXED_REPRODUCERS = {
    # Step 1 is scheduled while step 0 (the prefill) samples: CachedRequestData's
    # num_output_tokens counts that placeholder (1), as upstream's does.
    "async-num-output-tokens": _one_request(True, outputs=(7, 8)),
    # The second token is EOS; the step that computes its KV (positions 0-3 = 1, 2, 7, EOS:
    # one full block) is in flight when it arrives: that block must not be cached yet.
    "async-stop-keeps-placeholders": _one_request(True, outputs=(7, EOS)),
}


@pytest.mark.parametrize("name", sorted(FIXED_REPRODUCERS))
def test_fixed_divergences_stay_fixed(name: str) -> None:
    """Each reproducer agrees step for step with upstream."""
    run_trace(FIXED_REPRODUCERS[name])


def _requeue_preempted_at_back(monkeypatch: pytest.MonkeyPatch) -> None:
    """A preempted request goes to the back of the waiting queue instead of the front."""
    original = MiniScheduler._preempt_request

    def requeue_at_back(self: MiniScheduler, request: Any) -> None:
        original(self, request)
        self.waiting.remove_request(request)
        self.waiting.add_request(request)

    monkeypatch.setattr(MiniScheduler, "_preempt_request", requeue_at_back)


def _keep_stopped_preempted_waiting(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue #21's async bug: a request that stops while preempted stays in the waiting queue.

    ``update_from_output`` is the only caller that removes requests already finished.
    """
    original = FCFSRequestQueue.remove_requests

    def remove_unless_finished(self: FCFSRequestQueue, requests: Any) -> None:
        requests = list(requests)
        if requests and all(r.is_finished() for r in requests):
            return
        original(self, requests)

    monkeypatch.setattr(FCFSRequestQueue, "remove_requests", remove_unless_finished)


@pytest.mark.parametrize(
    ("plant", "async_scheduling"),
    [(_requeue_preempted_at_back, False), (_keep_stopped_preempted_waiting, True)],
    ids=["preempted-requeued-at-back", "stopped-while-preempted-kept-waiting"],
)
def test_a_planted_scheduler_bug_is_caught(
    plant: Any, async_scheduling: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The differential sees a one-line scheduler bug within the fast subset's traces."""
    plant(monkeypatch)
    for seed in range(200):
        trace = random_trace(
            random.Random(seed), async_scheduling=async_scheduling, reserve_full_isl=False
        )
        try:
            run_trace(trace)
        except Divergence:
            return
    pytest.fail(f"200 traces did not catch the planted bug: {plant.__doc__}")
