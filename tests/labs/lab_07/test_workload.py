"""lab-07, part 4: random traces, run on the learner's manager and on upstream's (the reference).

Requests with shared prefixes arrive, are admitted in chunks, decode, are preempted or finish,
in random order, on a tiny pool; admissions and steps are often sized to the exact edge of what
fits, where the capacity accounting of prefix hits matters. The trace is first run on the
reference manager here in the judge, which decides every step as a scheduler would and records
what the reference returned and held after each operation; then the learner process replays the
same operations on the learner's manager in one call and reports the same observations. They
must agree, operation by operation: hits, the blocks returned or None, block tables, the free
queue's order, ref counts, hashes, prefix-cache statistics, usage, block ids; and the learner's
state must satisfy the pool's invariants on its own.
"""

from __future__ import annotations

import random
import time
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from grading.suite import graded
from tests.labs.common import GRADED_SETTINGS, close_to
from tests.labs.lab_07.checks import check_state, compare_states
from tests.labs.lab_07.helpers import BS, DOC, changed_keys, driver, oracle
from tests.labs.lab_07.learner_side import expand

MAX_MODEL_LEN = 40
#: Prompts start with a piece of this trunk, so that they share prefixes.
TRUNK = [11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22]
#: Random traces (seeds 0, 1, ...) of TRACE_LENGTH scheduler decisions each.
NUM_TRACES = 80
TRACE_LENGTH = 40
#: Characters of a failure message (the grader shows about 1,500).
MESSAGE_ROOM = 1400
#: At most this long is spent shortening a failing trace.
SHRINK_SECONDS = 3.0
EDGE_SETTINGS = settings(GRADED_SETTINGS, max_examples=100)


def cdiv(a: int, b: int) -> int:
    return -(a // -b)


def describe(op: list[Any]) -> str:
    name, *args = op
    if name == "arrive":
        return f"{args[0]} arrives with tokens {args[1]}"
    if name == "lookup":
        return f"get_computed_blocks({args[0]})"
    if name == "allocate":
        gate = ", full_sequence_must_fit=True" if args[3:] and args[3] else ""
        return f"allocate_slots({args[0]}, {args[1]} new tokens, lookahead {args[2]}{gate})"
    if name == "append":
        return f"{args[0]} samples token {args[1]}"
    if name == "free":
        return f"free({args[0]}){' as a preemption' if args[1] else ''}"
    if name == "stats":
        return "make_prefix_cache_stats()"
    if name == "usage":
        return "usage"
    return f"get_block_ids({args[0]!r})"


class Trace:
    """A trace run on the reference manager (here), recorded for the learner to replay."""

    def __init__(self, num_blocks: int, max_model_len: int = MAX_MODEL_LEN, **kwargs: Any):
        self.config = (num_blocks, max_model_len, kwargs)
        self.ref = oracle(num_blocks, max_model_len, **kwargs)
        self.max_model_len = max_model_len
        self.plan: list[list[Any]] = []
        self.seen: list[list[Any]] = []
        self.why: list[str] = []

    def _do(self, op: list[Any], why: str = "") -> Any:
        result = getattr(self.ref, op[0])(*op[1:])
        self.plan.append(op)
        self.seen.append(["ok", result, self.ref.state()])
        self.why.append(why)
        return result

    # -- operations, decided as a scheduler would ------------------------------------------
    def arrive(self, rid: str, tokens: list[int]) -> None:
        self._do(["arrive", rid, list(tokens)])

    def lookup(self, rid: str) -> int:
        return int(self._do(["lookup", rid])[1])

    def remaining(self, rid: str, num_hit: int = 0) -> int:
        req = self.ref.requests[rid]
        return req.num_tokens - req.num_computed_tokens - num_hit

    def cost(self, rid: str, num_new: int, lookahead: int, gate: bool = False) -> tuple[int, str]:
        """What the reference counts for this allocation: blocks to allocate, and why (with
        the admission gate, the whole sequence is counted first)."""
        mgr = self.ref.mgr
        req = self.ref.requests[rid]
        hits, num_hit = self.ref.hits.get(rid, (None, 0))
        hit_blocks = list(hits.blocks[0]) if hits is not None else []
        slots = min(req.num_computed_tokens + num_hit + num_new + lookahead, self.max_model_len)
        need = mgr.get_num_blocks_to_allocate(rid, slots, hit_blocks)
        held = len(mgr.req_to_blocks.get(rid, []))
        fresh = max(cdiv(slots, BS) - held - len(hit_blocks), 0)
        free_hits = [b.block_id for b in hit_blocks if b.ref_cnt == 0]
        in_use = [b.block_id for b in hit_blocks if b.ref_cnt > 0]
        why = (
            f"{slots} slots = {cdiv(slots, BS)} blocks: {held} already held, hits in use "
            f"{in_use} (free of charge), free hits {free_hits} (one free block each), "
            f"{fresh} fresh: {need} free blocks needed, "
            f"{mgr.block_pool.get_num_free_blocks()} free"
        )
        if gate:
            whole = min(req.num_tokens, self.max_model_len)
            need_whole = mgr.get_num_blocks_to_allocate(rid, whole, hit_blocks)
            why = (
                f"the admission gate: the whole sequence ({whole} tokens, num_tokens capped "
                f"at max_model_len) needs {need_whole} free blocks; then {why}"
            )
            need = max(need, need_whole)
        return need, why

    def max_fit(self, rid: str, lookahead: int) -> int:
        """The most new tokens (up to what is left) the reference accepts, 0 if none."""
        _, num_hit = self.ref.hits.get(rid, (None, 0))
        free = self.ref.mgr.block_pool.get_num_free_blocks()
        for k in range(self.remaining(rid, num_hit), 0, -1):
            if self.cost(rid, k, lookahead)[0] <= free:
                return k
        return 0

    def allocate(self, rid: str, num_new: int, lookahead: int = 0, gate: bool = False) -> bool:
        _, why = self.cost(rid, num_new, lookahead, gate)
        return self._do(["allocate", rid, num_new, lookahead, gate], why) is not None

    def free(self, rid: str, preempt: bool) -> None:
        self._do(["free", rid, preempt])

    def append(self, rid: str, token: int) -> None:
        self._do(["append", rid, token])

    def query(self, name: str, *args: Any) -> None:
        self._do([name, *args])

    def close(self) -> None:
        """A new request arrives and asks for all its tokens (fitting or not), then every
        request is freed: what the trace's last call changed shows at the calls after it,
        before any of them concerns the request it changed (``Twin.close``)."""
        self.arrive("closing", [97, 98, 99, 96, 95])
        self.lookup("closing")
        self.allocate("closing", self.remaining("closing"), 0)
        for rid in list(self.ref.requests):
            self.free(rid, False)

    # -- the learner's replay -------------------------------------------------------------
    def verify(self) -> None:
        """Replay the trace on the learner's manager and compare, op by op: one operation a
        request. The plan's later operations were chosen from the reference's answers to the
        earlier ones, so sending them ahead would show the learner those answers (a refused
        allocation is followed by a lookup of the same request: tests/hostile/
        read_the_answers_in_the_plan.py)."""
        num_blocks, max_model_len, kwargs = self.config
        manager = driver(num_blocks, max_model_len, **kwargs)
        for k, op in enumerate(self.plan):
            got = manager.replay([op])
            if type(got) is not list:
                raise AssertionError(f"the replay returned {type(got).__name__}, not a list")
            if not got:
                self._fail(k, "the replay stopped before this operation")
            self._compare(k, op, got[0], self.seen[k])

    def _fail(self, k: int, message: str) -> None:
        """Fail at operation ``k``, showing as many of the operations before it as the report
        has room for (the grader shows about 1,500 characters)."""
        num_blocks, max_model_len, kwargs = self.config
        extra = "".join(f", {key}={value}" for key, value in kwargs.items())
        head = (
            f"operation {k}, {describe(self.plan[k])}: {message}\n  on KVCacheManager("
            f"{num_blocks} blocks, block_size {BS}, max_model_len {max_model_len}{extra}), "
            "after:"
        )
        room = MESSAGE_ROOM - len(head)
        steps: list[str] = []
        for i in range(k - 1, -1, -1):
            result = self.seen[i][1]
            shown = "" if result is None and self.plan[i][0] != "allocate" else f" -> {result!r}"
            line = f"\n    {i}. {describe(self.plan[i])}{shown}"
            if len(line) + 40 > room:
                steps.append("\n    … (earlier operations left out)")
                break
            steps.append(line)
            room -= len(line)
        raise AssertionError(head + ("".join(reversed(steps)) or " nothing"))

    def _compare(self, k: int, op: list[Any], got: Any, want: list[Any]) -> None:
        if not (type(got) is list and len(got) == 3 and got[0] in ("ok", "raised")):
            self._fail(k, f"the replay reported {got!r:.200}")
        if got[0] == "raised":
            why = f" ({self.why[k]})" if self.why[k] else ""
            self._fail(
                k,
                f"your manager raised {got[1]}: {got[2]}; the reference returned {want[1]!r}{why}",
            )
        name = op[0]
        result, ref_result = got[1], want[1]
        if name == "lookup" and result != ref_result:
            self._fail(
                k,
                f"your manager found the hit {result!r}, the reference "
                f"{ref_result!r} ([hit block ids, hit tokens]): the hit is the longest "
                "run of leading cached blocks, capped at num_tokens - 1 tokens, in "
                "whole blocks",
            )
        if name == "allocate" and (result is None) != (ref_result is None):
            if result is None:
                self._fail(k, f"your manager returned None, but it fits: {self.why[k]}")
            self._fail(
                k,
                f"your manager allocated {result}, but it does not fit: "
                f"{self.why[k]}; allocate_slots must return None",
            )
        if name == "allocate" and result != ref_result:
            self._fail(
                k,
                f"your manager returned the new blocks {result}, the reference "
                f"{ref_result} (only the blocks added by this call, from the front of "
                "the free queue)",
            )
        if name == "stats" and result != ref_result:
            self._fail(
                k,
                f"[requests, queries, hits, preempted_requests, preempted_queries, "
                f"preempted_hits] are {result}, the reference's {ref_result} (one "
                "record per lookup since the last snapshot: queries = the request's "
                "num_tokens, hits = the hit tokens; resumed requests counted apart)",
            )
        if name == "usage" and (
            type(result) not in (float, int) or not close_to(result, ref_result, rel=0, abs=1e-9)
        ):
            self._fail(
                k,
                f"usage is {result!r}, the reference's {ref_result!r} (blocks held "
                "by requests / usable blocks, the null block excluded)",
            )
        if name == "get_block_ids" and (type(result) is not tuple or result != ref_result):
            self._fail(k, f"get_block_ids is {result!r}, the reference's {ref_result!r}")
        ref_state = want[2]
        try:
            state = expand(got[2])
        except (TypeError, ValueError) as exc:
            self._fail(k, f"the replay reported a state of the wrong shape ({exc})")
        try:
            check_state(state)
            if name == "allocate" and ref_result is None:
                before = self.seen[k - 1][2] if k else ref_state
                changed = changed_keys(before, state)
                if changed:
                    raise AssertionError(
                        f"allocate_slots returned None but changed "
                        f"{', '.join(changed)}: a refused allocation must "
                        "change nothing"
                    )
            compare_states(state, ref_state, "it")
        except AssertionError as exc:
            self._fail(k, str(exc))


def _tokens(trunk_len: int, tail: list[int]) -> list[int]:
    return [*TRUNK[:trunk_len], *tail]


def random_decisions(rng: random.Random, count: int) -> list[tuple[Any, ...]]:
    """``count`` scheduler decisions, read by ``run_scheduler``."""
    out: list[tuple[Any, ...]] = []
    for _ in range(count):
        kind = rng.choices(
            ["arrive", "admit", "step", "release", "stats", "query"], [18, 25, 33, 12, 4, 8]
        )[0]
        edge = rng.choice([None, None, 0, 0, 1])
        if kind == "arrive":
            out.append(
                (
                    kind,
                    rng.choice([0, 4, 6, 8, 12]),
                    [rng.randrange(4) for _ in range(rng.randint(1, 10))],
                )
            )
        elif kind == "admit":
            out.append(
                (kind, rng.randint(1, 16), edge, rng.choice([0, 0, 0, 3]), rng.random() < 0.5)
            )
        elif kind == "step":
            out.append(
                (
                    kind,
                    rng.randrange(8),
                    rng.randint(1, 8),
                    edge,
                    [rng.randrange(4) for _ in range(rng.randint(1, 6))],
                    rng.choice([0, 0, 0, 2]),
                )
            )
        elif kind == "release":
            out.append((kind, rng.randrange(8), rng.random() < 0.5))
        elif kind == "stats":
            out.append((kind,))
        else:
            out.append((kind, rng.randrange(10)))
    return out


def run_scheduler(trace: Trace, steps: list[tuple[Any, ...]]) -> None:
    """Turn decisions into operations on the reference, as a scheduler would. A decision that
    does not apply (no request waiting, none running) admits or makes one arrive instead."""
    waiting: list[str] = []
    running: list[str] = []
    counter = 0

    def arrive(trunk: int, tail: list[int]) -> None:
        nonlocal counter
        counter += 1
        trace.arrive(f"r{counter}", _tokens(trunk, tail))
        waiting.append(f"r{counter}")

    def sized(rid: str, chunk: int, edge: int | None, lookahead: int, left: int) -> int:
        """``chunk`` tokens, or (``edge``) exactly the most that fits, or one token more."""
        if edge is None:
            return min(chunk, left)
        return min(max(trace.max_fit(rid, lookahead) + edge, 1), left)

    def admit(chunk: int, edge: int | None, lookahead: int, gate: bool = False) -> None:
        if not waiting:
            arrive(8, [chunk % 4] * (chunk % 7 + 1))
        rid = waiting[0]
        num_hit = trace.lookup(rid)
        num_new = sized(rid, chunk, edge, lookahead, trace.remaining(rid, num_hit))
        if trace.allocate(rid, num_new, lookahead, gate):
            running.append(waiting.pop(0))

    def step(which: int, chunk: int, edge: int | None, tokens: list[int], lookahead: int) -> None:
        rid = running[which % len(running)]
        if trace.remaining(rid):  # a chunk of its prompt
            trace.allocate(rid, sized(rid, chunk, edge, lookahead, trace.remaining(rid)), lookahead)
            return
        for token in tokens:  # decoding: one token per step
            if trace.ref.requests[rid].num_tokens >= trace.max_model_len:
                return
            trace.append(rid, token)
            if not trace.allocate(rid, sized(rid, 1, edge, lookahead, 1), lookahead):
                return

    for kind, *args in steps:
        if kind == "arrive":
            arrive(*args)
        elif kind == "admit":
            admit(*args)
        elif kind in ("step", "release") and not running:
            admit(5, None, 0)
        elif kind == "step":
            step(*args)
        elif kind == "release":
            rid = running.pop(args[0] % len(running))
            trace.free(rid, args[1])
            if args[1]:
                waiting.insert(0, rid)  # preempted: back to the front, to start over
        elif kind == "stats":
            trace.query("stats")
        elif kind == "query":
            known = [*running, *waiting, "nobody"]
            trace.query("get_block_ids", known[args[0] % len(known)])
            trace.query("usage")


def first_failure(config: dict[str, Any], steps: list[tuple[Any, ...]]) -> AssertionError | None:
    """Run the decisions on the reference, replay them on the learner's manager: the first
    disagreement, or None."""
    trace = Trace(**config)
    run_scheduler(trace, steps)
    try:
        trace.verify()
    except AssertionError as exc:
        return exc
    return None


def _simpler(decision: tuple[Any, ...]) -> list[tuple[Any, ...]]:
    """Versions of one decision with a shorter list argument (a prompt tail, decode tokens)."""
    out = []
    for j, arg in enumerate(decision):
        if isinstance(arg, list) and len(arg) > 1:
            for shorter in (arg[:1], arg[: len(arg) // 2], arg[:-1]):
                out.append((*decision[:j], shorter, *decision[j + 1 :]))
    return out


def shrink(
    config: dict[str, Any], steps: list[tuple[Any, ...]], error: AssertionError, budget: float
) -> AssertionError:
    """A shorter list of decisions that still fails (chunks removed greedily, then lists in
    decisions shortened, for at most ``budget`` seconds): easier to replay by hand."""
    end = time.monotonic() + budget
    size = len(steps) // 2
    while size >= 1 and time.monotonic() < end:
        i = 0
        while i < len(steps) and time.monotonic() < end:
            candidate = steps[:i] + steps[i + size :]
            found = first_failure(config, candidate) if candidate else None
            if found is not None:
                steps, error = candidate, found
            else:
                i += size
        size //= 2
    for i in range(len(steps)):
        for simpler in _simpler(steps[i]):
            if time.monotonic() >= end:
                return error
            candidate = [*steps[:i], simpler, *steps[i + 1 :]]
            found = first_failure(config, candidate)
            if found is not None:
                steps, error = candidate, found
                break
    return error


@graded(
    6,
    "Random traces against upstream (shared prefixes, chunks, decodes, lookahead, "
    "preemptions, frees on 6- to 12-block pools, allocations sized to the edge of what "
    "fits): the same hits, the same blocks or None, the same tables, free-queue order, "
    "ref counts, hashes, stats and usage as the reference manager, and the pool's "
    "invariants",
    f"{DOC}#the-kv-cache-manager-lab-07",
    timeout=30,
)
def test_random_workload():
    """The message shows the first operation where your manager and the reference disagree,
    in a failing trace shortened as far as a few seconds allow, and the operations before it:
    replay them by hand."""
    for seed in range(NUM_TRACES):
        rng = random.Random(seed)
        config = {
            "num_blocks": rng.randint(6, 12),
            "max_model_len": rng.choice([24, 40]),
            "log_stats": True,
            "enable_caching": seed % 10 != 9,
        }
        steps = random_decisions(rng, TRACE_LENGTH)
        error = first_failure(config, steps)
        if error is not None:
            raise shrink(config, steps, error, SHRINK_SECONDS) from None


@st.composite
def scenarios(draw: Any) -> dict[str, Any]:
    """A pool, requests sharing a trunk (some running, some finished and cached), a probe."""

    def prompt(trunks: list[int], longest: int) -> list[int]:
        trunk = draw(st.sampled_from(trunks))
        return _tokens(trunk, [draw(st.integers(0, 1))] * draw(st.integers(1, longest)))

    requests = [
        {
            "tokens": prompt([0, 4, 8, 12], 6),
            "then": draw(st.sampled_from(["run", "run", "free", "preempt"])),
        }
        for _ in range(draw(st.integers(1, 4)))
    ]
    return {
        "num_blocks": draw(st.integers(4, 12)),
        "requests": requests,
        "probe": prompt([4, 8, 12], 10),
        "lookahead": draw(st.sampled_from([0, 0, 2, 5])),
    }


@graded(
    5,
    "Capacity at the edge: for a new request whose prefix hits blocks that running "
    "requests hold (free of charge) and/or free cached blocks (one free block each), "
    "allocate_slots accepts exactly what upstream accepts: the most that fits succeeds, "
    "one token more returns None and changes nothing",
    f"{DOC}#hits-on-free-blocks-cost-capacity",
)
@EDGE_SETTINGS
@given(scenarios())
def test_capacity_at_the_edge(scenario: dict[str, Any]):
    """Built on both managers; then the probe is admitted with one token too many (refused),
    then with exactly the most that fits."""
    trace = Trace(scenario["num_blocks"])
    for i, spec in enumerate(scenario["requests"]):
        rid = f"r{i}"
        trace.arrive(rid, spec["tokens"])
        trace.lookup(rid)
        fits = trace.max_fit(rid, 0)
        if fits and trace.allocate(rid, fits, 0) and spec["then"] != "run":
            trace.free(rid, spec["then"] == "preempt")
    trace.arrive("probe", scenario["probe"])
    lookahead = scenario["lookahead"]
    num_hit = trace.lookup("probe")
    most = trace.max_fit("probe", lookahead)
    if most < trace.remaining("probe", num_hit):
        trace.allocate("probe", most + 1, lookahead)  # one token too many: None
        trace.lookup("probe")
    if most:
        trace.allocate("probe", most, lookahead)  # exactly what fits
    trace.close()  # the calls after the last one: a refusal's change left for later shows
    trace.verify()
