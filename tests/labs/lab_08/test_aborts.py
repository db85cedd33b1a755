"""lab-08, part 5: requests finished from outside (aborts), and what the runner hands back.

A client may abort a request at any moment: while it waits, while it runs, after it was
preempted, and while the model runs the very step it is scheduled in (between ``schedule()`` and
``update_from_output()``); ids may repeat, be unknown or already finished. And the model runner's
sampled tokens are input to check: tokens for a request that is not in the step, or no longer
unfinished, are ignored; tokens for a request in the middle of its prefill are a runner bug.

The last test replays random traces of all of these, on your scheduler and on the reference
scheduler (upstream's semantics, v0.22.1) side by side in the judge, and compares them after
every call.
"""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from grading.remote import LearnerError
from grading.suite import graded, learner_module
from mini_vllm.request import RequestStatus
from tests.labs.common import assert_cost_does_not_grow, best_time, same_data, timed_call
from tests.labs.lab_08.helpers import DOC, RANDOM_SETTINGS, Engine, batch, bounded_shrinking

ABORTED = RequestStatus.FINISHED_ABORTED
#: What a client's finish_requests may pass (aborts mostly).
FINISHED = [ABORTED, ABORTED, RequestStatus.FINISHED_STOPPED, RequestStatus.FINISHED_LENGTH_CAPPED]
TRACE_SETTINGS = settings(RANDOM_SETTINGS, max_examples=80)


def preempted_b() -> Engine:
    """4 usable blocks: a and b (8 tokens each) fill them; in step 2 b is preempted."""
    engine = Engine(num_blocks=5, budget=16, max_model_len=32)
    engine.add("a", 8, base=0)
    engine.add("b", 8, base=50)
    engine.step()
    out, _ = engine.step()
    assert out.preempted_req_ids == {"b"}, (
        f"set-up: b is preempted in step 2, got {sorted(out.preempted_req_ids)}"
    )
    return engine


@graded(
    3,
    "finish_requests (abort) finishes running, waiting and preempted requests: they leave "
    "their queue, their blocks are freed, their status is the one given (one that is not "
    "a finished status: ValueError, nothing changed); unknown, finished and repeated ids "
    "are ignored, one id may come as a str; it returns the ids it finished, each once",
    f"{DOC}#finishing-and-freeing",
)
def test_finish_requests_aborts():
    """b (preempted) and cc, dd (waiting) wait behind a (running); each kind is aborted."""
    engine = preempted_b()
    for status in (RequestStatus.RUNNING, RequestStatus.WAITING):
        try:
            engine.sched.finish_requests(["a"], status)
        except ValueError:
            pass
        except LearnerError as exc:
            raise AssertionError(
                f"finish_requests(['a'], {status.name}) must raise ValueError ({status.name} is "
                f"not a finished status), before changing anything; it raised "
                f"{getattr(exc, 'display', exc)}"
            ) from None
        else:
            raise AssertionError(
                f"finish_requests(['a'], {status.name}) must raise ValueError: {status.name} "
                "is not a finished status"
            )
    engine.refresh()
    assert engine.running == ["a"] and engine.info("a")["status"] == RequestStatus.RUNNING, (
        f"the refused finish_requests changed a: running {engine.running}, a's status "
        f"{engine.info('a')['status'].name}"
    )
    engine.add("cc", 2, base=90)
    engine.add("dd", 2, base=95)
    engine.refresh()
    assert engine.waiting == ["b", "cc", "dd"], f"set-up: waiting is {engine.waiting}"

    done = engine.abort(["b", "b", "zzz"])
    assert done == ["b"], (
        f"finish_requests(['b', 'b', 'zzz']) finishes the preempted b once and ignores the "
        f"unknown id: it must return ['b'], returned {done}"
    )
    assert engine.waiting == ["cc", "dd"], (
        f"b (preempted, first in the waiting queue) must leave it: waiting is {engine.waiting}"
    )
    assert engine.info("b")["status"] == ABORTED, f"b's status is {engine.info('b')['status']}"

    done = engine.abort("cc")
    assert done == ["cc"], (
        f"finish_requests('cc') (one id, as a str) must return ['cc'], got {done}"
    )
    assert engine.waiting == ["dd"], f"cc must leave the waiting queue: waiting is {engine.waiting}"

    done = engine.abort(["a", "dd", "a", "b"])
    assert sorted(done) == ["a", "dd"], (
        f"a (running) and dd (waiting) are finished, once each; b is already finished: expected "
        f"['a', 'dd'], got {done}"
    )
    assert engine.running == [] and engine.waiting == [] and engine.num_free() == 4, (
        f"running {engine.running}, waiting {engine.waiting}, {engine.num_free()} of 4 blocks free"
    )
    assert engine.abort(["a"]) == [], "a finished request cannot be finished again"

    out = engine.schedule()
    assert out.finished_req_ids == {"a", "b", "cc", "dd"}, (
        f"the next output tells the runner about every request finished since the last one: "
        f"expected [a, b, cc, dd], got {sorted(out.finished_req_ids)}"
    )
    engine.update({})
    engine.add("e", 3, base=20)
    engine.add("f", 3, base=30)
    engine.step()
    done = engine.abort(None)
    assert sorted(done) == ["e", "f"], f"finish_requests(None) finishes everyone, got {done}"
    assert engine.num_free() == 4 and engine.schedule().finished_req_ids == {"e", "f"}
    engine.update({})
    # Any finished status, not only FINISHED_ABORTED (Engine.abort checks the status set).
    for rid, status in (
        ("g", RequestStatus.FINISHED_STOPPED),
        ("h", RequestStatus.FINISHED_LENGTH_CAPPED),
    ):
        engine.add(rid, 3, base=60)
        engine.step()
        done = engine.abort([rid], status)
        assert done == [rid], (
            f"finish_requests([{rid!r}], {status.name}) must finish {rid} with that status, "
            f"got {done}"
        )
    # None finishes the requests in the order they were added (self.requests', as upstream),
    # the order their blocks join the free queue: a's block 1, then b's block 2. The blocks a
    # newcomer gets show it (never-used 3 and 4 first, then 1).
    engine = Engine(num_blocks=5, budget=16, max_model_len=32)
    engine.add("a", 4, base=0)
    engine.add("b", 4, base=50)
    engine.step()
    assert engine.table("a") == [1] and engine.table("b") == [2], (
        f"set-up: a holds [1], b [2]; got {engine.table('a')}, {engine.table('b')}"
    )
    engine.abort(None)
    engine.add("c", 12, base=100)
    engine.step()
    assert engine.table("c") == [3, 4, 1], (
        f"finish_requests(None) frees a, then b (the order they were added in, as upstream "
        f"walks self.requests), so the free queue is [3, 4, 1, 2] and c's three blocks are "
        f"[3, 4, 1]; got {engine.table('c')}"
    )


@graded(
    2,
    "An abort while the step runs (between schedule() and update_from_output()): "
    "update_from_output skips the aborted request (no token appended, no output, its blocks "
    "already freed), the others go on, and the next output lists it as finished",
    f"{DOC}#finishing-and-freeing",
)
def test_abort_between_schedule_and_update():
    """Step 2: a decodes, b finishes its prompt, c is admitted; a and c are aborted mid-step."""
    engine = Engine(budget=12)
    engine.add("a", 4, base=0)
    engine.add("b", 10, base=20)
    engine.step()
    engine.add("c", 3, base=40)
    out = engine.schedule()
    assert batch(out) == [("a", 1), ("b", 2), ("c", 3)], f"set-up: got {batch(out)}"
    a_before = engine.info("a")["output_token_ids"]
    done = engine.abort(["a", "c"])
    assert sorted(done) == ["a", "c"], f"a and c are running: both are finished, got {done}"
    sampled = engine.execute(out)  # the runner ran the step as scheduled: a and c sampled too
    assert set(sampled) == {"a", "b", "c"}
    results = engine.update(sampled)
    assert [r.request_id for r in results] == ["b"], (
        f"a and c were aborted while the step ran: only b gets an output, got "
        f"{[r.request_id for r in results]}"
    )
    assert engine.info("a")["output_token_ids"] == a_before, (
        f"a was aborted: its sampled token is dropped; its outputs went from {a_before} to "
        f"{engine.info('a')['output_token_ids']}"
    )
    assert engine.info("c")["output_token_ids"] == [], "c was aborted: no token is appended"
    assert engine.running == ["b"], f"running is {engine.running}"
    out, _ = engine.step()
    assert out.finished_req_ids == {"a", "c"}, (
        f"a and c were finished after the last schedule(): this output must list them, got "
        f"{sorted(out.finished_req_ids)}"
    )
    engine.run()
    engine.check_drained()


@graded(
    2,
    "update_from_output checks what the runner hands back: tokens count only for requests "
    "scheduled in this step and still unfinished (unknown, finished or unscheduled decoding "
    "ones are ignored, an empty list is no token); tokens for a request mid-prefill, "
    "scheduled or not, are a runner bug: ValueError, and nothing is applied",
    f"{DOC}#chunked-prefill",
)
def test_update_from_output_checks_the_runner():
    """Budget 8: a finishes in step 1; in step 2 b decodes, c runs a chunk and d waits."""
    engine = Engine(budget=8)
    engine.add("a", 4, max_tokens=1, base=0)
    engine.add("b", 4, base=20)
    engine.step()
    assert "a" in engine.finished, "set-up: a finishes in step 1 (max_tokens 1)"
    engine.add("c", 12, base=40)
    engine.add("d", 3, base=60)
    out = engine.schedule()
    assert batch(out) == [("b", 1), ("c", 7)], f"set-up: got {batch(out)}"
    sampled = engine.execute(out)
    assert set(sampled) == {"b"}
    b_before = engine.info("b")["output_token_ids"]

    engine.update({**sampled, "c": [5]}, raises=ValueError)
    assert engine.info("b")["output_token_ids"] == b_before, (
        "update_from_output raised, so nothing may have been applied: b got a token anyway "
        "(check every entry before appending any)"
    )
    assert engine.info("c")["output_token_ids"] == [], "c is mid-prefill: it gets no token"

    results = engine.update({**sampled, "c": [], "a": [1], "d": [2], "ghost": [3]})
    assert [(r.request_id, r.new_token_ids) for r in results] == [("b", sampled["b"])], (
        f"only b's token counts: c got an empty list (a prefill chunk samples nothing), a is "
        f"finished, d was not scheduled, ghost is unknown; got "
        f"{[(r.request_id, r.new_token_ids) for r in results]}"
    )
    outputs = {rid: engine.info(rid)["output_token_ids"] for rid in "acd"}
    assert outputs == {"a": engine.outputs["a"], "c": [], "d": []}, (
        f"a (finished), c (mid-prefill, empty list) and d (waiting) get no token: their "
        f"outputs are {outputs}"
    )
    engine.run()
    engine.check_drained()
    # Preempted while its non-final chunk is in flight: a token for that chunk is still a bug.
    engine = Engine(
        num_blocks=3,
        budget=16,
        max_model_len=32,
        long_prefill_token_threshold=4,
        scheduler_reserve_full_isl=False,
    )
    engine.add("a", 8, base=0)
    engine.add("b", 8, base=50)
    out1 = engine.schedule()
    sampled1 = engine.execute(out1)
    out2 = engine.schedule(ahead=True)  # step 1 still runs; a needs b's block
    assert batch(out1) == [("a", 4), ("b", 4)] and out2.preempted_req_ids == {"b"}, (
        f"set-up: step 1 runs a's and b's first chunks, step 2 (planned while step 1 runs) "
        f"preempts b; got {batch(out1)} and preempted {sorted(out2.preempted_req_ids)}"
    )
    engine.update({**sampled1, "b": [7]}, raises=ValueError)
    assert engine.info("b")["output_token_ids"] == [], (
        "b's step-1 chunk was not its last, so the runner's token for it is a runner bug "
        "(ValueError), also after b was preempted: preemption resets b's progress, not "
        "is_prefill_chunk"
    )
    engine.update(sampled1)
    engine.update(engine.execute(out2))
    engine.abort(None)  # two usable blocks cannot hold a's 16 tokens: stop here
    # A resumed request recomputes its outputs as well as its prompt: it stays mid-prefill until
    # num_computed_tokens reaches num_tokens, not the prompt's length (threshold 4, caching off:
    # b, a 1-token prompt, is preempted with 8 outputs and resumes in chunks of 4).
    engine = Engine(
        num_blocks=5, budget=8, max_model_len=32, caching=False, long_prefill_token_threshold=4
    )
    engine.add("a", 1, base=0, max_tokens=9)
    engine.add("b", 1, base=50, max_tokens=12)
    for _ in range(9):
        out, _ = engine.step()
    b_before = engine.info("b")["output_token_ids"]
    assert out.preempted_req_ids == {"b"} and len(b_before) == 8, (
        f"set-up: b is preempted in step 9 with 8 outputs; preempted "
        f"{sorted(out.preempted_req_ids)}, b has {len(b_before)} outputs"
    )
    out = engine.schedule()
    assert batch(out) == [("b", 4)], f"set-up: b resumes with a chunk of 4; got {batch(out)}"
    b = engine.info("b")
    assert b["is_prefill_chunk"] is True, (
        f"after b's resumed chunk, {b['num_computed_tokens']} of its {b['num_tokens']} tokens "
        f"are computed (its prompt is 1 token): is_prefill_chunk must be True, got "
        f"{b['is_prefill_chunk']!r}. It compares num_computed_tokens with num_tokens, outputs "
        f"included: a resumed request samples nothing until it has recomputed them all (README, "
        f"task 5; phase 03, advancing the computed-token count)"
    )
    sampled = engine.execute(out)
    engine.update({**sampled, "b": [7]}, raises=ValueError)
    assert engine.info("b")["output_token_ids"] == b_before, (
        "b is recomputing its outputs (4 of 9 tokens computed): a token for it is a runner bug"
    )
    engine.update(sampled)
    engine.run()
    engine.check_drained()


# -- random traces against the reference -----------------------------------------------------
VOCAB = 16
KINDS = ["step", "step", "step", "step ahead", "arrive", "arrive", "abort", "abort mid-step"]


@st.composite
def trace_configs(draw: Any) -> dict[str, Any]:
    """A tiny pool (a few blocks more than the longest request needs alone), a budget, a
    policy, and the requests to come: (prompt length, max_tokens, priority)."""
    block_size = draw(st.sampled_from([2, 4]))
    max_model_len = draw(st.integers(8, 24))
    min_blocks = -(-(max_model_len - 1) // block_size) + 1
    chunked = draw(st.booleans())
    max_num_seqs = draw(st.sampled_from([2, 3, 4, 1]))
    low = max(max_num_seqs, 2) if chunked else max_model_len
    return {
        "engine": {
            "num_blocks": min_blocks + draw(st.integers(0, 1)),
            "block_size": block_size,
            "budget": draw(st.integers(low, low + 12)),
            "max_num_seqs": max_num_seqs,
            "max_model_len": max_model_len,
            "caching": draw(st.booleans()),
            "enable_chunked_prefill": chunked,
            "long_prefill_token_threshold": draw(st.sampled_from([0, 3, 5])),
            "seed": draw(st.integers(0, 3)),
            "policy": draw(st.sampled_from(["fcfs", "priority"])),
        },
        "eos": draw(st.sampled_from([None, 3])),
        "shared": draw(st.integers(0, max_model_len // 2)),
        "requests": draw(
            st.lists(
                st.tuples(
                    st.integers(max_model_len // 3, max_model_len - 1),
                    st.integers(2, max_model_len),
                    st.integers(0, 2),  # the priority (read under the priority policy only)
                ),
                min_size=3,
                max_size=7,
            )
        ),
    }


def _prompt(i: int, length: int, shared: int) -> list[int]:
    """Prompts share their first ``shared`` tokens (prefix-cache hits), then differ."""
    common = [(3 * j + 1) % VOCAB for j in range(min(shared, length - 1))]
    return common + [(5 * i + 7 * j + 2) % VOCAB for j in range(length - len(common))]


class Trace:
    """One random trace, drawn call by call from the reference's state, run on both sides."""

    def __init__(self, config: dict[str, Any], data: Any) -> None:
        options = dict(config["engine"])
        self.engine = Engine(
            options.pop("num_blocks"),
            options.pop("budget"),
            options.pop("max_num_seqs"),
            options.pop("max_model_len"),
            options.pop("caching"),
            block_size=options.pop("block_size"),
            seed=options.pop("seed"),
            vocab=VOCAB,
            reference=True,
            **options,
        )
        self.ref = self.engine.ref
        self.data = data
        self.eos = config["eos"]
        self.arrivals = [
            (f"r{i}", _prompt(i, length, config["shared"]), max_tokens, priority)
            for i, (length, max_tokens, priority) in enumerate(config["requests"])
        ]

    def draw(self, strategy: Any) -> Any:
        return self.data.draw(strategy)

    def finished_ids(self) -> list[str]:
        return sorted(set(self.engine.specs) - set(self.ref.requests))

    def arrive(self) -> None:
        rid, prompt, max_tokens, priority = self.arrivals.pop(0)
        self.engine.add(rid, prompt=prompt, max_tokens=max_tokens, eos=self.eos, priority=priority)

    def abort_ids(self) -> Any:
        """Running, preempted, waiting, finished and unknown ids, maybe one repeated; as a list,
        or one id as a str, or None (everyone). At most one running request per call: the
        order in which several are freed is left open (upstream iterates a set), and it decides
        which cached blocks are evicted first."""
        waiting = list(self.ref.waiting)
        groups = {
            "running": [req.request_id for req in self.ref.running],
            "preempted": [
                req.request_id for req in waiting if req.status == RequestStatus.PREEMPTED
            ],
            "waiting": [req.request_id for req in waiting if req.status == RequestStatus.WAITING],
            "finished": self.finished_ids()[-2:],
            "unknown": ["ghost"],
        }
        kinds = [kind for kind, ids in groups.items() if ids]
        picked = []
        for _ in range(self.draw(st.integers(1, 3))):
            kind = self.draw(st.sampled_from(kinds))
            rid = self.draw(st.sampled_from(groups[kind]))
            if kind != "running" or all(r not in groups["running"] for r in picked):
                picked.append(rid)
        if self.draw(st.booleans()):
            picked.append(picked[0])
        form = self.draw(st.sampled_from(["list", "list", "str", "None"]))
        if form == "None" and len(groups["running"]) <= 1:
            return None
        return picked[0] if form == "str" else picked

    def junk(self, out: Any) -> dict[str, list[int]]:
        """What a sloppy runner adds to the sampled tokens, all to be ignored: nothing, tokens
        for an unknown, a finished or an unscheduled request, or an empty list for a prefill
        chunk (no token). (Tokens for a prefill chunk, a runner bug, are the subject of
        test_update_from_output_checks_the_runner.)"""
        chunks = [
            rid
            for rid in out.num_scheduled_tokens
            if rid in self.ref.requests and self.ref.requests[rid].is_prefill_chunk
        ]
        idle = [
            rid
            for rid, req in self.ref.requests.items()
            if rid not in out.num_scheduled_tokens and not req.is_prefill_chunk
        ]
        options = {"ghost": {"ghost": [1]}}
        if self.finished_ids():
            options["finished"] = {self.finished_ids()[-1]: [1]}
        if idle:
            options["unscheduled"] = {self.draw(st.sampled_from(idle)): [1]}
        if chunks:
            options["empty"] = {chunks[0]: []}
        kind = self.draw(st.sampled_from(["none", *options]))
        return options.get(kind, {})

    def step(self, abort_mid_step: bool = False, sloppy: bool = True) -> None:
        engine = self.engine
        out = engine.schedule()
        if abort_mid_step:
            engine.abort(self.abort_ids())
        sampled = engine.execute(out)
        extra = self.junk(out) if sloppy else {}
        handed_back = {**sampled, **extra}
        if self.draw(st.booleans()):  # the runner's dict in another order than the batch
            handed_back = dict(reversed(handed_back.items()))
        engine.update(handed_back)
        waiting = [req.request_id for req in self.ref.waiting]
        if waiting and self.draw(st.sampled_from([False, False, True])):
            # A client gives up on a request that waits (just preempted, often), twice.
            self.engine.abort([self.draw(st.sampled_from(waiting))] * 2)

    def step_ahead(self) -> None:
        """Two steps, the second planned while the first runs (async scheduling's order)."""
        engine = self.engine
        first = engine.schedule()
        sampled = engine.execute(first)
        second = engine.schedule(ahead=True)
        engine.update(sampled)
        engine.update(engine.execute(second))

    def run(self) -> None:
        for _ in range(self.draw(st.integers(5, 40))):
            kind = self.draw(st.sampled_from(KINDS))
            if kind == "arrive" and self.arrivals:
                self.arrive()
            elif kind == "abort":
                self.engine.abort(self.abort_ids(), self.draw(st.sampled_from(FINISHED)))
            elif kind == "step ahead":
                self.step_ahead()
            elif kind.startswith("step") or kind == "abort mid-step":
                self.step(abort_mid_step=kind == "abort mid-step")
        while self.arrivals:
            self.arrive()
        if self.draw(st.booleans()):
            self.engine.abort(None)
        for _ in range(300):
            if not self.engine.unfinished():
                break
            self.step(sloppy=False)
        self.engine.check_drained()


@settings(TRACE_SETTINGS)
@given(trace_configs(), st.data())
def _random_traces(config: dict[str, Any], data: Any) -> None:
    Trace(config, data).run()


@graded(
    5,
    "Random traces with aborts (running, waiting, preempted, mid-step, repeated, unknown "
    "and finished ids, finish_requests(None)), steps planned while the last one runs, both "
    "policies, and a sloppy runner (tokens for unknown, finished or unscheduled requests, "
    "empty lists, any order): after every call, your scheduler agrees with the reference "
    "(batch, outputs, queues, counters, blocks)",
    f"{DOC}#finishing-and-freeing",
    timeout=45,
)
def test_random_traces_with_aborts_match_the_reference():
    """Hypothesis prints the smallest failing trace it found; the message shows its last calls."""
    with bounded_shrinking():
        _random_traces()


@graded(
    1,
    "Cost: finish_requests takes the requests out of their queues in one pass, not one search "
    "of the queue per id",
    f"{DOC}#finishing-and-freeing",
    timeout=30,
)
def test_aborting_many_costs_each_the_same():
    """Aborting every other waiting request, the last first, costs about the same per request
    with 200 and with 8,000 waiting. A client may drop thousands of requests at once (a
    disconnecting load balancer, a shutdown); removing each with ``waiting.remove_request``
    (``deque.remove``, a search from the front) makes that O(waiting x aborted)."""
    side = learner_module("learner_side")
    per_request = {}
    for waiting in (200, 8_000):
        aborted = waiting // 2

        def one_run(waiting=waiting, aborted=aborted) -> float:
            sched = side.crowded_scheduler(waiting)
            seconds, got = timed_call(side.abort_every_other_waiting, sched)
            assert same_data(got, [aborted, 4, waiting - aborted]), (
                f"with r0..r3 running and {waiting:,} waiting, finish_requests of every other "
                f"waiting id must finish {aborted:,} and leave 4 running and "
                f"{waiting - aborted:,} waiting: got [finished, running, waiting] = {got}"
            )
            return seconds

        per_request[waiting] = best_time(one_run) / aborted
    small, big = per_request[200], per_request[8_000]
    assert_cost_does_not_grow(
        small * 4_000,
        big * 4_000,
        lambda ratio, ceiling: (
            f"aborting 4,000 of 8,000 waiting requests took {big * 4e6:.1f} ms, "
            f"{big * 1e6:.1f} us per request, against {small * 1e6:.1f} us per request for 100 "
            f"of 200 ({ratio:.0f}x; at most 12x, and {ceiling * 1e3:.0f} ms on this machine): "
            "finish_requests must collect the requests to remove and take them out of running "
            "and waiting in one pass each (waiting.remove_requests), not search the queue once "
            "per id (README, after the task table)"
        ),
    )
