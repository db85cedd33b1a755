"""lab-07, part 4: random traces, run on the learner's manager and on upstream's (the reference).

Requests with shared prefixes arrive, are admitted in chunks, decode, are preempted or finish,
in random order, on a tiny pool; admissions and steps are often sized to the exact edge of what
fits, where capacity accounting matters. Every operation runs on both managers (the reference's
in the judge, the learner's in the learner process) and everything each one returns or holds
afterwards must be the same: hits, the blocks returned or None, block tables, the free queue's
order, ref counts, hashes, prefix-cache statistics, usage. The learner's state must also satisfy
the pool's invariants on its own.
"""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from grading.suite import graded
from tests.labs.common import GRADED_SETTINGS, STATEFUL_SETTINGS
from tests.labs.lab_07.checks import check_state, compare_states
from tests.labs.lab_07.helpers import BS, DOC, driver, oracle

MAX_MODEL_LEN = 40
#: Prompts start with a piece of this trunk, so that they share prefixes.
TRUNK = [11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22]


def cdiv(a: int, b: int) -> int:
    return -(a // -b)


def _display(exc: BaseException) -> str:
    return str(getattr(exc, "display", None) or f"{type(exc).__name__}: {exc}")


class Pair:
    """The learner's manager and the reference's, driven through the same operations."""

    def __init__(self, num_blocks: int, max_model_len: int = MAX_MODEL_LEN, **kwargs: Any):
        self.learner = driver(num_blocks, max_model_len, **kwargs)
        self.oracle = oracle(num_blocks, max_model_len, **kwargs)
        self.max_model_len = max_model_len
        self.log: list[str] = []

    # -- context for messages ---------------------------------------------------------------
    def note(self, text: str) -> None:
        self.log.append(text)

    def history(self) -> str:
        recent = self.log[-8:]
        head = "… " if len(self.log) > len(recent) else ""
        return head + "; ".join(recent) if recent else "the start"

    def fail(self, message: str) -> None:
        raise AssertionError(f"{message}\n  operations so far: {self.history()}")

    def call(self, what: str, method: str, *args: Any) -> Any:
        """A learner call; its exception (other than NOT STARTED) fails with context."""
        try:
            return getattr(self.learner, method)(*args)
        except NotImplementedError:
            raise
        except Exception as exc:  # noqa: BLE001 - a learner exception, reported as a failure
            ref = getattr(self.oracle, method)(*args)
            self.fail(f"{what}: your manager raised {_display(exc)}; the reference returned "
                      f"{ref!r}")

    # -- operations -----------------------------------------------------------------------
    def add(self, rid: str, tokens: list[int]) -> None:
        self.learner.add(rid, tokens)
        self.oracle.add(rid, tokens)
        self.note(f"{rid} arrives with {len(tokens)} tokens {tokens}")

    def lookup(self, rid: str) -> int:
        got = self.call(f"get_computed_blocks({rid})", "lookup", rid)
        want = self.oracle.lookup(rid)
        self.note(f"lookup {rid} -> hit {want[0]} ({want[1]} tokens)")
        if got != want:
            self.fail(f"get_computed_blocks({rid}): your manager found the hit {got[0]} "
                      f"({got[1]} tokens), the reference {want[0]} ({want[1]} tokens): the "
                      f"hit is the longest run of leading cached blocks, capped at num_tokens "
                      f"- 1 = {self.num_tokens(rid) - 1} tokens, in whole blocks")
        return int(want[1])

    def num_tokens(self, rid: str) -> int:
        return self.oracle.requests[rid].num_tokens

    def remaining(self, rid: str, num_hit: int = 0) -> int:
        req = self.oracle.requests[rid]
        return req.num_tokens - req.num_computed_tokens - num_hit

    def cost(self, rid: str, num_new: int, lookahead: int) -> tuple[int, str]:
        """What the reference counts for this allocation: blocks to allocate, and why."""
        mgr = self.oracle.mgr
        req = self.oracle.requests[rid]
        hits, num_hit = self.oracle.hits.get(rid, (None, 0))
        hit_blocks = list(hits.blocks[0]) if hits is not None else []
        slots = min(req.num_computed_tokens + num_hit + num_new + lookahead, self.max_model_len)
        need = mgr.get_num_blocks_to_allocate(rid, slots, hit_blocks)
        held = len(mgr.req_to_blocks.get(rid, []))
        fresh = max(cdiv(slots, BS) - held - len(hit_blocks), 0)
        free_hits = [b.block_id for b in hit_blocks if b.ref_cnt == 0]
        in_use = [b.block_id for b in hit_blocks if b.ref_cnt > 0]
        why = (f"{slots} slots = {cdiv(slots, BS)} blocks: {held} already held, hits in use "
               f"{in_use} (free of charge), free hits {free_hits} (1 free block each) and "
               f"{fresh} fresh: {need} free blocks needed, "
               f"{mgr.block_pool.get_num_free_blocks()} free")
        return need, why

    def max_fit(self, rid: str, lookahead: int) -> int:
        """The most new tokens (up to what is left) the reference would accept, 0 if none."""
        _, num_hit = self.oracle.hits.get(rid, (None, 0))
        free = self.oracle.mgr.block_pool.get_num_free_blocks()
        for k in range(self.remaining(rid, num_hit), 0, -1):
            if self.cost(rid, k, lookahead)[0] <= free:
                return k
        return 0

    def allocate(self, rid: str, num_new: int, lookahead: int = 0) -> bool:
        """Both allocate; the results must agree. Returns whether it succeeded."""
        _, why = self.cost(rid, num_new, lookahead)
        what = f"allocate_slots({rid}, {num_new} new tokens, {lookahead} lookahead)"
        before = self.learner.state()
        got = self.call(what, "allocate", rid, num_new, lookahead)
        want = self.oracle.allocate(rid, num_new, lookahead)
        self.note(f"{what} -> {want}")
        if (got is None) != (want is None):
            if got is None:
                self.fail(f"{what}: your manager returned None, but it fits: {why}")
            self.fail(f"{what}: your manager allocated {got}, but it does not fit: {why}; "
                      "allocate_slots must return None")
        if got != want:
            self.fail(f"{what}: your manager returned the new blocks {got}, the reference "
                      f"{want} (only the blocks added this call, from the front of the free "
                      "queue)")
        if got is None:
            after = self.learner.state()
            keys = ("forward", "ref_cnt", "hash", "tables", "num_cached_block", "progress")
            changed = [k for k in keys if before[k] != after[k]]
            if changed:
                self.fail(f"{what} returned None but changed {', '.join(changed)}: a refused "
                          "allocation must change nothing")
        return got is not None

    def free(self, rid: str, preempt: bool) -> None:
        self.call(f"free({rid})", "free", rid, preempt)
        self.oracle.free(rid, preempt)
        self.note(f"{'preempt' if preempt else 'free'} {rid}")

    def append(self, rid: str, token: int) -> None:
        self.learner.append(rid, token)
        self.oracle.append(rid, token)
        self.note(f"{rid} samples {token}")

    def stats(self) -> None:
        got = self.call("make_prefix_cache_stats()", "stats")
        want = self.oracle.stats()
        self.note("make_prefix_cache_stats()")
        if got != want:
            self.fail(f"make_prefix_cache_stats(): [requests, queries, hits, preempted_requests, "
                      f"preempted_queries, preempted_hits] are {got}, the reference's {want} "
                      "(one record per lookup since the last snapshot: queries = the request's "
                      "num_tokens, hits = the hit tokens; resumed requests counted apart)")

    def query(self, rid: str) -> None:
        got = self.call(f"get_block_ids({rid!r})", "get_block_ids", rid)
        want = self.oracle.get_block_ids(rid)
        if type(got) is not tuple or got != want:
            self.fail(f"get_block_ids({rid!r}) is {got!r}, the reference's {want!r}")
        got = self.call("usage", "usage")
        want = self.oracle.usage()
        if type(got) not in (float, int) or abs(got - want) > 1e-9:
            self.fail(f"usage is {got!r}, the reference's {want!r} (blocks held / usable blocks)")

    def check(self) -> None:
        state = self.learner.state()
        try:
            check_state(state)
        except AssertionError as exc:
            self.fail(f"after {self.history()}:\n  {exc}")
        compare_states(state, self.oracle.state(), self.history())


def _tokens(trunk_len: int, tail: list[int]) -> list[int]:
    return [*TRUNK[:trunk_len], *tail]


class Lockstep(RuleBasedStateMachine):
    """A scheduler's use of the manager, its decisions drawn at random, run on both managers."""

    def __init__(self) -> None:
        super().__init__()
        self.pair = Pair(9, log_stats=True)
        self.waiting: list[str] = []
        self.running: list[str] = []
        self.counter = 0

    @rule(trunk=st.sampled_from([0, 4, 6, 8, 12]),
          tail=st.lists(st.integers(0, 3), min_size=1, max_size=10))
    def arrive(self, trunk: int, tail: list[int]) -> None:
        self.counter += 1
        rid = f"r{self.counter}"
        self.pair.add(rid, _tokens(trunk, tail))
        self.waiting.append(rid)

    @precondition(lambda self: self.waiting)
    @rule(chunk=st.integers(1, 16), edge=st.sampled_from([None, 0, 1]),
          lookahead=st.sampled_from([0, 0, 0, 3]))
    def admit(self, chunk: int, edge: int | None, lookahead: int) -> None:
        """The first waiting request: its hit, then ``chunk`` tokens, or (``edge``) exactly the
        most that fits, or one token more."""
        rid = self.waiting[0]
        num_hit = self.pair.lookup(rid)
        left = self.pair.remaining(rid, num_hit)
        num_new = min(chunk, left)
        if edge is not None:
            num_new = min(max(self.pair.max_fit(rid, lookahead) + edge, 1), left)
        if self.pair.allocate(rid, num_new, lookahead):
            self.running.append(self.waiting.pop(0))

    @precondition(lambda self: self.running)
    @rule(which=st.integers(0, 7), chunk=st.integers(1, 8), token=st.integers(0, 3),
          edge=st.sampled_from([None, 0, 1]), lookahead=st.sampled_from([0, 0, 0, 2]))
    def step(self, which: int, chunk: int, token: int, edge: int | None,
             lookahead: int) -> None:
        """A running request computes a chunk of its prompt, or decodes one token."""
        rid = self.running[which % len(self.running)]
        if self.pair.remaining(rid) == 0:
            if self.pair.num_tokens(rid) >= MAX_MODEL_LEN:
                return
            self.pair.append(rid, token)
        left = self.pair.remaining(rid)
        num_new = min(chunk, left)
        if edge is not None:
            num_new = min(max(self.pair.max_fit(rid, lookahead) + edge, 1), left)
        self.pair.allocate(rid, num_new, lookahead)

    @precondition(lambda self: self.running)
    @rule(which=st.integers(0, 7), preempt=st.booleans())
    def release(self, which: int, preempt: bool) -> None:
        """A running request finishes, or is preempted (it goes back to the front of the queue
        and starts over)."""
        rid = self.running.pop(which % len(self.running))
        self.pair.free(rid, preempt)
        if preempt:
            self.waiting.insert(0, rid)

    @rule()
    def stats(self) -> None:
        self.pair.stats()

    @rule(which=st.integers(0, 9))
    def query(self, which: int) -> None:
        known = [*self.running, *self.waiting, "nobody"]
        self.pair.query(known[which % len(known)])

    @invariant()
    def same_state_as_the_reference(self) -> None:
        self.pair.check()


@graded(6, "Random traces against upstream (shared prefixes, chunks, decodes, lookahead, "
           "preemptions, frees on a 9-block pool, allocations sized to the edge of what fits): "
           "the same hits, the same blocks or None, the same tables, free-queue order, ref "
           "counts, hashes, stats and usage as the reference manager, and the pool's invariants",
        f"{DOC}#the-kv-cache-manager-lab-07")
def test_random_workload():
    """Hypothesis prints the shortest failing sequence of steps: replay it by hand."""
    run_state_machine_as_test(Lockstep, settings=STATEFUL_SETTINGS)


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
@settings(GRADED_SETTINGS)
@given(scenarios())
def test_capacity_at_the_edge(scenario: dict[str, Any]):
    """Built on both managers; then the probe is admitted with one token too many (refused),
    then with exactly the most that fits."""
    pair = Pair(scenario["num_blocks"])
    for i, spec in enumerate(scenario["requests"]):
        rid = f"r{i}"
        pair.add(rid, spec["tokens"])
        pair.lookup(rid)
        fits = pair.max_fit(rid, 0)
        if fits and pair.allocate(rid, fits, 0) and spec["then"] != "run":
            pair.free(rid, spec["then"] == "preempt")
    pair.check()
    pair.add("probe", scenario["probe"])
    lookahead = scenario["lookahead"]
    num_hit = pair.lookup("probe")
    most = pair.max_fit("probe", lookahead)
    if most < pair.remaining("probe", num_hit):
        pair.allocate("probe", most + 1, lookahead)     # one token too many: None
        pair.check()
        pair.lookup("probe")
    if most:
        pair.allocate("probe", most, lookahead)         # exactly what fits
    pair.check()
