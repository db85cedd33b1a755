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

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from grading.suite import graded
from tests.labs.common import GRADED_SETTINGS
from tests.labs.lab_07.checks import check_state, compare_states
from tests.labs.lab_07.helpers import BS, DOC, driver, oracle

MAX_MODEL_LEN = 40
#: Prompts start with a piece of this trunk, so that they share prefixes.
TRUNK = [11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22]
TRACE_SETTINGS = settings(GRADED_SETTINGS, max_examples=80)
EDGE_SETTINGS = settings(GRADED_SETTINGS, max_examples=150)


def cdiv(a: int, b: int) -> int:
    return -(a // -b)


def describe(op: list[Any]) -> str:
    name, *args = op
    if name == "arrive":
        return f"{args[0]} arrives with tokens {args[1]}"
    if name == "lookup":
        return f"get_computed_blocks({args[0]})"
    if name == "allocate":
        return f"allocate_slots({args[0]}, {args[1]} new tokens, lookahead {args[2]})"
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

    def cost(self, rid: str, num_new: int, lookahead: int) -> tuple[int, str]:
        """What the reference counts for this allocation: blocks to allocate, and why."""
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
        why = (f"{slots} slots = {cdiv(slots, BS)} blocks: {held} already held, hits in use "
               f"{in_use} (free of charge), free hits {free_hits} (one free block each), "
               f"{fresh} fresh: {need} free blocks needed, "
               f"{mgr.block_pool.get_num_free_blocks()} free")
        return need, why

    def max_fit(self, rid: str, lookahead: int) -> int:
        """The most new tokens (up to what is left) the reference accepts, 0 if none."""
        _, num_hit = self.ref.hits.get(rid, (None, 0))
        free = self.ref.mgr.block_pool.get_num_free_blocks()
        for k in range(self.remaining(rid, num_hit), 0, -1):
            if self.cost(rid, k, lookahead)[0] <= free:
                return k
        return 0

    def allocate(self, rid: str, num_new: int, lookahead: int = 0) -> bool:
        _, why = self.cost(rid, num_new, lookahead)
        return self._do(["allocate", rid, num_new, lookahead], why) is not None

    def free(self, rid: str, preempt: bool) -> None:
        self._do(["free", rid, preempt])

    def append(self, rid: str, token: int) -> None:
        self._do(["append", rid, token])

    def query(self, name: str, *args: Any) -> None:
        self._do([name, *args])

    # -- the learner's replay -------------------------------------------------------------
    def verify(self) -> None:
        """Replay the trace on the learner's manager (one call) and compare, op by op."""
        num_blocks, max_model_len, kwargs = self.config
        got = driver(num_blocks, max_model_len, **kwargs).replay(self.plan)
        if type(got) is not list:
            raise AssertionError(f"the replay returned {type(got).__name__}, not a list")
        for k, op in enumerate(self.plan):
            if k >= len(got):
                self._fail(k, "the replay stopped before this operation")
            self._compare(k, op, got[k], self.seen[k])

    def _fail(self, k: int, message: str) -> None:
        start = max(0, k - 12)
        steps = [f"{i}. {describe(op)} -> {self.seen[i][1]!r}"
                 for i, op in enumerate(self.plan[start:k], start)]
        num_blocks, max_model_len, kwargs = self.config
        extra = "".join(f", {key}={value}" for key, value in kwargs.items())
        setup = (f"KVCacheManager({num_blocks} blocks, block_size {BS}, max_model_len "
                 f"{max_model_len}{extra})")
        raise AssertionError(
            f"operation {k}, {describe(self.plan[k])}: {message}\n  on {setup}, after:\n    "
            + ("… (earlier operations left out)\n    " if start else "")
            + ("\n    ".join(steps) if steps else "(nothing)"))

    def _compare(self, k: int, op: list[Any], got: Any, want: list[Any]) -> None:
        if not (type(got) is list and len(got) == 3 and got[0] in ("ok", "raised")):
            self._fail(k, f"the replay reported {got!r:.200}")
        if got[0] == "raised":
            self._fail(k, f"your manager raised {got[1]}: {got[2]}; the reference returned "
                          f"{want[1]!r}")
        name = op[0]
        result, ref_result = got[1], want[1]
        if name == "lookup" and result != ref_result:
            self._fail(k, f"your manager found the hit {result[0]} ({result[1]} tokens), the "
                          f"reference {ref_result[0]} ({ref_result[1]} tokens): the hit is the "
                          "longest run of leading cached blocks, capped at num_tokens - 1 "
                          "tokens, in whole blocks")
        if name == "allocate" and (result is None) != (ref_result is None):
            if result is None:
                self._fail(k, f"your manager returned None, but it fits: {self.why[k]}")
            self._fail(k, f"your manager allocated {result}, but it does not fit: "
                          f"{self.why[k]}; allocate_slots must return None")
        if name == "allocate" and result != ref_result:
            self._fail(k, f"your manager returned the new blocks {result}, the reference "
                          f"{ref_result} (only the blocks added by this call, from the front of "
                          "the free queue)")
        if name == "stats" and result != ref_result:
            self._fail(k, f"[requests, queries, hits, preempted_requests, preempted_queries, "
                          f"preempted_hits] are {result}, the reference's {ref_result} (one "
                          "record per lookup since the last snapshot: queries = the request's "
                          "num_tokens, hits = the hit tokens; resumed requests counted apart)")
        if name == "usage" and (type(result) not in (float, int)
                                or abs(result - ref_result) > 1e-9):
            self._fail(k, f"usage is {result!r}, the reference's {ref_result!r} (blocks held "
                          "by requests / usable blocks, the null block excluded)")
        if name == "get_block_ids" and (type(result) is not tuple or result != ref_result):
            self._fail(k, f"get_block_ids is {result!r}, the reference's {ref_result!r}")
        state, ref_state = got[2], want[2]
        try:
            check_state(state)
            if name == "allocate" and ref_result is None:
                before = self.seen[k - 1][2] if k else ref_state
                keys = ("forward", "ref_cnt", "hash", "tables", "num_cached_block", "progress")
                changed = [key for key in keys if state[key] != before[key]]
                if changed:
                    raise AssertionError(f"allocate_slots returned None but changed "
                                         f"{', '.join(changed)}: a refused allocation must "
                                         "change nothing")
            compare_states(state, ref_state, "it")
        except AssertionError as exc:
            self._fail(k, str(exc))


def _tokens(trunk_len: int, tail: list[int]) -> list[int]:
    return [*TRUNK[:trunk_len], *tail]


#: One scheduler decision: (kind, a, b, c), read by ``run_scheduler``.
decisions = st.one_of(
    st.tuples(st.just("arrive"), st.sampled_from([0, 4, 6, 8, 12]),
              st.lists(st.integers(0, 3), min_size=1, max_size=10)),
    st.tuples(st.just("admit"), st.integers(1, 16), st.sampled_from([None, 0, 1]),
              st.sampled_from([0, 0, 0, 3])),
    st.tuples(st.just("step"), st.integers(0, 7), st.integers(1, 8),
              st.sampled_from([None, 0, 1]), st.integers(0, 3), st.sampled_from([0, 0, 0, 2])),
    st.tuples(st.just("release"), st.integers(0, 7), st.booleans()),
    st.tuples(st.just("stats")),
    st.tuples(st.just("query"), st.integers(0, 9)),
)


def run_scheduler(trace: Trace, steps: list[tuple[Any, ...]]) -> None:
    """Turn random decisions into operations, as a scheduler would, on the reference."""
    waiting: list[str] = []
    running: list[str] = []
    counter = 0
    for kind, *args in steps:
        if kind == "arrive":
            counter += 1
            rid = f"r{counter}"
            trace.arrive(rid, _tokens(args[0], args[1]))
            waiting.append(rid)
        elif kind == "admit" and waiting:
            chunk, edge, lookahead = args
            rid = waiting[0]
            num_hit = trace.lookup(rid)
            left = trace.remaining(rid, num_hit)
            num_new = min(chunk, left)
            if edge is not None:       # exactly the most that fits, or one token more
                num_new = min(max(trace.max_fit(rid, lookahead) + edge, 1), left)
            if trace.allocate(rid, num_new, lookahead):
                running.append(waiting.pop(0))
        elif kind == "step" and running:
            which, chunk, edge, token, lookahead = args
            rid = running[which % len(running)]
            if trace.remaining(rid) == 0:
                if trace.ref.requests[rid].num_tokens >= MAX_MODEL_LEN:
                    continue
                trace.append(rid, token)
            left = trace.remaining(rid)
            num_new = min(chunk, left)
            if edge is not None:
                num_new = min(max(trace.max_fit(rid, lookahead) + edge, 1), left)
            trace.allocate(rid, num_new, lookahead)
        elif kind == "release" and running:
            rid = running.pop(args[0] % len(running))
            trace.free(rid, args[1])
            if args[1]:
                waiting.insert(0, rid)   # preempted: back to the front, to start over
        elif kind == "stats":
            trace.query("stats")
        elif kind == "query":
            known = [*running, *waiting, "nobody"]
            trace.query("get_block_ids", known[args[0] % len(known)])
            trace.query("usage")


@graded(6, "Random traces against upstream (shared prefixes, chunks, decodes, lookahead, "
           "preemptions, frees on a 9-block pool, allocations sized to the edge of what fits): "
           "the same hits, the same blocks or None, the same tables, free-queue order, ref "
           "counts, hashes, stats and usage as the reference manager, and the pool's invariants",
        f"{DOC}#the-kv-cache-manager-lab-07")
@TRACE_SETTINGS
@given(st.lists(decisions, min_size=1, max_size=50))
def test_random_workload(steps: list[tuple[Any, ...]]):
    """The message shows the first operation where your manager and the reference disagree,
    and the operations before it: replay them by hand."""
    trace = Trace(9, log_stats=True)
    run_scheduler(trace, steps)
    trace.verify()


@st.composite
def scenarios(draw: Any) -> dict[str, Any]:
    """A pool, requests sharing a trunk (some running, some finished and cached), a probe."""
    requests = []
    for _ in range(draw(st.integers(1, 4))):
        requests.append({
            "tokens": _tokens(draw(st.sampled_from([0, 4, 8, 12])),
                              draw(st.lists(st.integers(0, 2), min_size=1, max_size=6))),
            "then": draw(st.sampled_from(["run", "run", "free", "preempt"])),
        })
    probe = _tokens(draw(st.sampled_from([4, 8, 12])),
                    draw(st.lists(st.integers(0, 2), min_size=1, max_size=10)))
    return {"num_blocks": draw(st.integers(4, 12)), "requests": requests, "probe": probe,
            "lookahead": draw(st.sampled_from([0, 0, 2, 5]))}


@graded(5, "Capacity at the edge: for a new request whose prefix hits blocks that running "
           "requests hold (free of charge) and/or free cached blocks (one free block each), "
           "allocate_slots accepts exactly what upstream accepts: the most that fits succeeds, "
           "one token more returns None and changes nothing",
        f"{DOC}#hits-on-free-blocks-cost-capacity")
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
        trace.allocate("probe", most + 1, lookahead)     # one token too many: None
        trace.lookup("probe")
    if most:
        trace.allocate("probe", most, lookahead)         # exactly what fits
    trace.verify()
