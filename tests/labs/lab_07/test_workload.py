"""lab-07, part 4: a random workload (hypothesis, stateful) on a tiny pool.

Requests with shared prefixes arrive, are admitted in chunks, decode, are preempted or finish,
in random order. After every step the block pool must satisfy its invariants and the manager's
bookkeeping must match what the requests hold; every hit must be the longest cached prefix and
every refused allocation must change nothing.
"""

from __future__ import annotations

from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from grading.suite import graded
from mini_vllm.core.invariants import check_block_pool
from mini_vllm.request import Request
from tests.labs.common import STATEFUL_SETTINGS
from tests.labs.lab_07.helpers import (
    BS,
    DOC,
    block_ids,
    cache_key,
    describe_change,
    free_queue,
    make_manager,
    make_request,
    snapshot,
)

NUM_BLOCKS = 9
MAX_MODEL_LEN = 48


def cdiv(a: int, b: int) -> int:
    return -(a // -b)


class ManagerWorkload(RuleBasedStateMachine):
    """A scheduler's use of the manager, with the scheduler's decisions drawn at random."""

    def __init__(self) -> None:
        super().__init__()
        self.mgr = make_manager(NUM_BLOCKS, max_model_len=MAX_MODEL_LEN, log_stats=True)
        self.running: dict[str, Request] = {}
        self.waiting: list[Request] = []
        self.counter = 0

    @rule(prefix=st.sampled_from([(), (1, 2, 3, 4), (1, 2, 3, 4, 5, 6, 7, 8)]),
          tail=st.lists(st.integers(0, 3), min_size=1, max_size=12))
    def arrive(self, prefix: tuple[int, ...], tail: list[int]) -> None:
        self.counter += 1
        self.waiting.append(make_request(f"r{self.counter}", [*prefix, *tail]))

    @precondition(lambda self: self.waiting)
    @rule(chunk=st.integers(1, 16))
    def admit_first_waiting(self, chunk: int) -> None:
        req = self.waiting[0]
        pool = self.mgr.block_pool
        hits, num_hit = self.mgr.get_computed_blocks(req)
        hit_ids = block_ids(hits)
        assert num_hit == len(hit_ids) * BS, (
            f"{req.request_id}: {num_hit} hit tokens but {len(hit_ids)} hit blocks of {BS}")
        assert num_hit <= req.num_tokens - 1, (
            f"{req.request_id}: a hit of {num_hit} tokens on {req.num_tokens} leaves no token to "
            f"recompute (the hit is capped at num_tokens - 1)")
        for i, blk in enumerate(hits.blocks[0]):
            assert blk.block_hash == cache_key(req, i), (
                f"{req.request_id}: hit block {i} (block {blk.block_id}) is not cached under the "
                f"request's own chained hash of block {i}")
        n = len(hit_ids)
        if n < (req.num_tokens - 1) // BS and n < len(req.block_hashes):
            assert pool.get_cached_block(req.block_hashes[n], [0]) is None, (
                f"{req.request_id}: block {n} of its prefix is cached too, but the hit stopped "
                f"at {n} blocks: the hit must be the longest cached prefix")
        num_new = min(chunk, req.num_tokens - num_hit)
        before = snapshot(self.mgr)
        new = self.mgr.allocate_slots(req, num_new, num_hit, hits)
        if new is None:
            after = snapshot(self.mgr)
            assert after == before, (
                f"{req.request_id}: a refused admission changed {describe_change(before, after)}")
            return
        held = [b.block_id for b in self.mgr.req_to_blocks[req.request_id]]
        assert held[:n] == hit_ids, f"{req.request_id}: its table {held} must start with its hits"
        assert block_ids(new) == held[n:], (
            f"{req.request_id}: allocate_slots returned {block_ids(new)}, but the blocks it added "
            f"after the hits are {held[n:]}")
        req.num_computed_tokens = num_hit + num_new
        self.running[req.request_id] = self.waiting.pop(0)

    @precondition(lambda self: self.running)
    @rule(data=st.data())
    def step_running(self, data: st.DataObject) -> None:
        rid = data.draw(st.sampled_from(sorted(self.running)))
        req = self.running[rid]
        if req.num_computed_tokens == req.num_tokens:
            if req.num_tokens >= MAX_MODEL_LEN - 1:
                return
            req.append_output_token_ids(data.draw(st.integers(0, 3)))
        num_new = min(data.draw(st.integers(1, 8)), req.num_tokens - req.num_computed_tokens)
        before = snapshot(self.mgr)
        num_before = len(self.mgr.req_to_blocks[rid])
        new = self.mgr.allocate_slots(req, num_new)
        if new is None:
            after = snapshot(self.mgr)
            assert after == before, (
                f"{rid}: a refused allocation changed {describe_change(before, after)}")
            return
        added = [b.block_id for b in self.mgr.req_to_blocks[rid][num_before:]]
        assert block_ids(new) == added, (
            f"{rid}: allocate_slots must return exactly the blocks it added ({added}), got "
            f"{block_ids(new)}")
        req.num_computed_tokens += num_new

    @precondition(lambda self: self.running)
    @rule(data=st.data(), preempt=st.booleans())
    def release(self, data: st.DataObject, preempt: bool) -> None:
        rid = data.draw(st.sampled_from(sorted(self.running)))
        req = self.running.pop(rid)
        blocks = list(self.mgr.req_to_blocks[rid])
        self.mgr.free(req)
        freed = [b.block_id for b in reversed(blocks) if b.ref_cnt == 0]
        queue = free_queue(self.mgr)
        assert queue[len(queue) - len(freed):] == freed, (
            f"{rid} held {[b.block_id for b in blocks]}; the blocks it freed must join the back "
            f"of the free queue tail first ({freed}), but the queue ends with "
            f"{queue[len(queue) - len(freed):]}")
        if preempt:
            req.num_computed_tokens = 0
            req.num_preemptions += 1
            self.waiting.insert(0, req)

    @invariant()
    def pool_is_consistent(self) -> None:
        check_block_pool(self.mgr.block_pool)

    @invariant()
    def bookkeeping_matches_the_requests(self) -> None:
        mgr = self.mgr
        assert set(mgr.req_to_blocks) == set(self.running), (
            f"req_to_blocks has tables for {sorted(mgr.req_to_blocks)} but the requests holding "
            f"blocks are {sorted(self.running)}")
        held: set[int] = set()
        for rid, req in self.running.items():
            blocks = mgr.req_to_blocks[rid]
            assert len(blocks) == cdiv(req.num_computed_tokens, BS), (
                f"{rid} computed {req.num_computed_tokens} tokens: it needs "
                f"{cdiv(req.num_computed_tokens, BS)} blocks, holds {len(blocks)}")
            num_full = min(req.num_computed_tokens // BS, len(req.block_hashes))
            for i, blk in enumerate(blocks):
                assert blk.ref_cnt >= 1, f"{rid} holds block {blk.block_id} with ref_cnt 0"
                if i < num_full:
                    assert blk.block_hash == cache_key(req, i), (
                        f"{rid}: its full block {i} (block {blk.block_id}) must be cached under "
                        f"its chained hash")
                else:
                    assert blk.block_hash is None, (
                        f"{rid}: block {i} (block {blk.block_id}) is not full of computed "
                        f"tokens, yet it is cached")
            held.update(blk.block_id for blk in blocks)
        assert 0 not in held, "a request holds the null block"
        num_free = mgr.block_pool.get_num_free_blocks()
        assert len(held) + num_free == NUM_BLOCKS - 1, (
            f"{len(held)} blocks held + {num_free} free != {NUM_BLOCKS - 1} usable blocks: a "
            f"block leaked or is counted twice")

    def teardown(self) -> None:
        for req in list(self.running.values()):
            self.mgr.free(req)
        check_block_pool(self.mgr.block_pool)
        assert self.mgr.block_pool.get_num_free_blocks() == NUM_BLOCKS - 1, (
            "after every request is freed, every usable block must be free")


@graded(6, "Invariants under a random workload (shared prefixes, chunks, decodes, preemptions, "
           "frees on a 9-block pool): longest capped hits, all-or-nothing allocation, exact "
           "returned blocks, tail-first freeing, published full blocks, no leaks",
        f"{DOC}#the-kv-cache-manager-lab-07")
def test_random_workload():
    """Hypothesis prints the shortest failing sequence of steps: replay it by hand."""
    run_state_machine_as_test(ManagerWorkload, settings=STATEFUL_SETTINGS)
