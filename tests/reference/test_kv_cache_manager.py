"""Reference tests of ``KVCacheManager`` and ``KVCacheBlocks`` (upstream v0.22.1 semantics).

Unit tests pin each rule (hit capped at num_tokens - 1, None on OOM with nothing
changed, tail-first freeing, ...); a hypothesis state machine then drives random
admissions, decodes, preemptions and frees over a tiny pool and checks the block
pool invariants and the manager's bookkeeping after every step.
"""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from mini_vllm.core.kv_cache_manager import KVCacheBlocks, KVCacheManager
from mini_vllm.core.kv_cache_utils import get_request_block_hasher, sha256
from mini_vllm.request import Request
from mini_vllm.sampling_params import SamplingParams
from mini_vllm.teaching.invariants import check_block_pool
from mini_vllm.utils.math_utils import cdiv

BS = 4
HASHER = get_request_block_hasher(BS, sha256)


def make_request(request_id: str, tokens: list[int], hasher=HASHER) -> Request:
    return Request(request_id, tokens, SamplingParams(max_tokens=100), block_hasher=hasher)


def make_manager(num_blocks: int = 10, **kwargs) -> KVCacheManager:
    kwargs.setdefault("max_model_len", 64)
    return KVCacheManager(num_blocks, BS, **kwargs)


def admit(mgr: KVCacheManager, req: Request, num_new_tokens: int | None = None):
    """Prefill ``req`` like the scheduler does; return (new blocks, hit tokens)."""
    hit_blocks, num_hit = mgr.get_computed_blocks(req)
    if num_new_tokens is None:
        num_new_tokens = req.num_tokens - num_hit
    new = mgr.allocate_slots(req, num_new_tokens, num_hit, hit_blocks)
    if new is not None:
        req.num_computed_tokens = num_hit + num_new_tokens
    return new, num_hit


def decode(mgr: KVCacheManager, req: Request, token: int):
    """Append a sampled token and give it a slot (one decode step)."""
    req.append_output_token_ids(token)
    new = mgr.allocate_slots(req, 1)
    if new is not None:
        req.num_computed_tokens += 1
    return new


def snapshot(mgr: KVCacheManager):
    """Everything an allocation may change."""
    pool = mgr.block_pool
    return (
        [b.block_id for b in pool.free_block_queue.get_all_free_blocks()],
        [(b.ref_cnt, b.block_hash) for b in pool.blocks],
        {rid: [b.block_id for b in blocks] for rid, blocks in mgr.req_to_blocks.items()},
        dict(mgr.num_cached_block),
    )


# ------------------------------------------------------------------ KVCacheBlocks


def test_kv_cache_blocks_helpers() -> None:
    mgr = make_manager()
    req = make_request("a", list(range(6)))
    new, _ = admit(mgr, req)
    assert new is not None
    assert new.get_block_ids() == ([1, 2],)
    assert new.get_unhashed_block_ids() == [2]  # block 1 is full and cached, block 2 is not
    combined = new + mgr.empty_kv_cache_blocks
    assert combined.get_block_ids() == ([1, 2],)
    assert mgr.empty_kv_cache_blocks.get_block_ids() == ([],)
    assert mgr.empty_kv_cache_blocks.get_block_ids(allow_none=True) is None
    assert new.new_empty().get_block_ids() == ([],)
    with pytest.raises(ValueError):
        KVCacheBlocks(([], [])).get_unhashed_block_ids()


# ------------------------------------------------------------------ construction


@pytest.mark.parametrize("args", [(1, BS, 64), (0, BS, 64), (8, 0, 64), (8, BS, 0), (8.0, BS, 64)])
def test_constructor_validates(args: tuple) -> None:
    with pytest.raises(ValueError):
        KVCacheManager(*args)


def test_fresh_manager_is_empty() -> None:
    mgr = make_manager(10)
    assert mgr.usage == 0.0
    assert mgr.block_pool.get_num_free_blocks() == 9
    check_block_pool(mgr.block_pool)


# ------------------------------------------------------------------ allocation


def test_allocate_slots_gives_cdiv_blocks_and_tracks_the_table() -> None:
    mgr = make_manager(10)
    req = make_request("a", list(range(10)))
    new, num_hit = admit(mgr, req)
    assert num_hit == 0
    assert new is not None and len(new.blocks[0]) == cdiv(10, BS) == 3
    assert mgr.get_block_ids("a") == ([1, 2, 3],)
    assert mgr.usage == pytest.approx(3 / 9)
    check_block_pool(mgr.block_pool, expected_ref_cnts={1: 1, 2: 1, 3: 1})


def test_allocate_slots_returns_only_new_blocks() -> None:
    mgr = make_manager(10)
    req = make_request("a", list(range(6)))
    admit(mgr, req)
    # Slot for token 7 fits in block 2: nothing new, the shared empty instance.
    assert decode(mgr, req, 100) is mgr.empty_kv_cache_blocks
    assert decode(mgr, req, 101).get_block_ids() == ([],)  # 8 slots: still 2 blocks
    new = decode(mgr, req, 102)  # 9th slot: a third block
    assert new is not None and new.get_block_ids() == ([3],)
    assert mgr.get_block_ids("a") == ([1, 2, 3],)


def test_newly_full_blocks_are_cached_and_partial_ones_are_not() -> None:
    mgr = make_manager(10)
    req = make_request("a", list(range(7)))
    admit(mgr, req)
    blocks = mgr.req_to_blocks["a"]
    assert blocks[0].block_hash is not None and blocks[1].block_hash is None
    assert mgr.num_cached_block["a"] == 1
    decode(mgr, req, 7)  # fills block 2 (tokens 4..7) once its 8th token is scheduled
    assert blocks[1].block_hash is not None
    assert mgr.num_cached_block["a"] == 2
    check_block_pool(mgr.block_pool)


def test_lookahead_slots_are_allocated_but_not_cached() -> None:
    mgr = make_manager(10)
    req = make_request("a", list(range(4)))
    new = mgr.allocate_slots(req, 4, num_lookahead_tokens=5)
    assert new is not None and len(new.blocks[0]) == cdiv(9, BS)
    assert mgr.num_cached_block["a"] == 1  # only the 4 real tokens are published


def test_slots_are_capped_at_max_model_len() -> None:
    mgr = make_manager(10, max_model_len=8)
    req = make_request("a", list(range(6)))
    new = mgr.allocate_slots(req, 6, num_lookahead_tokens=10)
    assert new is not None and len(new.blocks[0]) == 2


def test_empty_hits_are_no_hits_even_for_a_running_request() -> None:
    mgr = make_manager()
    req = make_request("a", list(range(6)))
    admit(mgr, req)
    assert mgr.allocate_slots(req, 1, 0, KVCacheBlocks(([],))) is not None
    with pytest.raises(ValueError, match="first allocation"):
        other = make_request("b", list(range(6)))
        hits, num_hit = mgr.get_computed_blocks(other)
        mgr.allocate_slots(req, 1, num_hit, hits)  # a's table is not new: hits rejected


def test_zero_new_tokens_and_mismatched_hits_are_rejected() -> None:
    mgr = make_manager()
    req = make_request("a", list(range(6)))
    with pytest.raises(ValueError):
        mgr.allocate_slots(req, 0)
    with pytest.raises(ValueError):
        mgr.allocate_slots(req, 2, num_new_computed_tokens=4)  # claims hits without blocks


def test_none_on_oom_changes_nothing() -> None:
    mgr = make_manager(5)  # 4 usable blocks
    a = make_request("a", list(range(12)))
    admit(mgr, a)  # 3 blocks
    b = make_request("b", [50 + i for i in range(8)])
    before = snapshot(mgr)
    free_before = mgr.block_pool.get_num_free_blocks()
    assert mgr.allocate_slots(b, 8) is None  # needs 2, 1 free
    assert mgr.block_pool.get_num_free_blocks() == free_before
    assert snapshot(mgr) == before
    assert "b" not in mgr.req_to_blocks
    check_block_pool(mgr.block_pool)


def test_none_on_oom_leaves_prefix_hits_untouched() -> None:
    mgr = make_manager(5)  # 4 usable blocks
    a = make_request("a", list(range(9)))
    admit(mgr, a)
    mgr.free(a)  # 3 free blocks, 2 of them cached
    # b shares a's first 8 tokens and has 9 more: hit 2 blocks, 17 slots = 5 blocks.
    b = make_request("b", list(range(8)) + [90 + i for i in range(9)])
    hit_blocks, num_hit = mgr.get_computed_blocks(b)
    assert num_hit == 8
    before = snapshot(mgr)
    # 3 fresh blocks + the 2 free hit blocks it would claim = 5 > 4 free.
    assert mgr.allocate_slots(b, 9, num_hit, hit_blocks) is None
    assert snapshot(mgr) == before
    assert all(blk.ref_cnt == 0 for blk in hit_blocks.blocks[0])
    # One token fewer fits: 2 hits + 2 fresh blocks = 4.
    assert mgr.allocate_slots(b, 8, num_hit, hit_blocks) is not None
    check_block_pool(mgr.block_pool)


def test_free_hit_blocks_count_against_capacity() -> None:
    """Claiming a free cached block consumes a free block, exactly like a fresh one."""
    mgr = make_manager(4)  # 3 usable blocks
    a = make_request("a", list(range(8)))
    admit(mgr, a)
    mgr.free(a)
    b = make_request("b", [*range(8), 99, 98, 97, 96, 95])
    hit_blocks, num_hit = mgr.get_computed_blocks(b)
    assert num_hit == 8
    # 13 slots = 4 blocks > 3 usable, although only 2 blocks are "new".
    assert mgr.allocate_slots(b, 5, num_hit, hit_blocks) is None
    check_block_pool(mgr.block_pool, expected_ref_cnts={1: 0, 2: 0, 3: 0})


# ------------------------------------------------------------------ prefix cache


def test_hit_is_capped_at_num_tokens_minus_one() -> None:
    mgr = make_manager(10)
    a = make_request("a", list(range(8)))
    admit(mgr, a)
    same = make_request("b", list(range(8)))
    blocks, num_hit = mgr.get_computed_blocks(same)
    # All 8 tokens are cached, but the last must be recomputed: whole blocks only,
    # so the hit drops to 4 tokens (the last block is recomputed entirely).
    assert num_hit == 4 and blocks.get_block_ids() == ([1],)
    longer = make_request("c", list(range(9)))
    assert mgr.get_computed_blocks(longer)[1] == 8


def test_hit_follows_the_hash_chain() -> None:
    mgr = make_manager(10)
    admit(mgr, make_request("a", list(range(12))))
    # Second block equal, first block different: chained hashes differ, no hit.
    other_first = make_request("b", [9, 9, 9, 9, *range(4, 12), 0])
    assert mgr.get_computed_blocks(other_first)[1] == 0
    diverging = make_request("c", [*range(6), 77, 77, 77, 77, 77, 77, 0])
    assert mgr.get_computed_blocks(diverging)[1] == 4


def test_hits_are_shared_and_touched() -> None:
    mgr = make_manager(10)
    a = make_request("a", list(range(9)))
    admit(mgr, a)
    b = make_request("b", [*range(8), 55, 56])
    _, num_hit = admit(mgr, b)
    assert num_hit == 8
    assert mgr.get_block_ids("b")[0][:2] == mgr.get_block_ids("a")[0][:2]
    check_block_pool(mgr.block_pool, expected_ref_cnts={1: 2, 2: 2, 3: 1, 4: 1})
    assert mgr.get_num_common_prefix_blocks("a") == [2]


def test_free_cached_blocks_can_be_revived() -> None:
    mgr = make_manager(10)
    a = make_request("a", list(range(9)))
    admit(mgr, a)
    mgr.free(a)
    assert mgr.usage == 0.0
    b = make_request("b", list(range(9)))
    _, num_hit = admit(mgr, b)
    assert num_hit == 8
    assert mgr.get_block_ids("b")[0][:2] == [1, 2]
    check_block_pool(mgr.block_pool, expected_ref_cnts={1: 1, 2: 1})


def test_caching_disabled_never_hits_nor_hashes() -> None:
    mgr = make_manager(10, enable_caching=False, log_stats=True)
    a = make_request("a", list(range(9)))
    admit(mgr, a)
    assert all(b.block_hash is None for b in mgr.req_to_blocks["a"])
    assert mgr.get_computed_blocks(make_request("b", list(range(9)))) == (
        mgr.empty_kv_cache_blocks,
        0,
    )
    stats = mgr.make_prefix_cache_stats()
    assert stats is not None and stats.requests == 0


def test_request_without_hasher_publishes_nothing() -> None:
    mgr = make_manager(10)
    a = make_request("a", list(range(9)), hasher=None)
    admit(mgr, a)
    assert all(b.block_hash is None for b in mgr.req_to_blocks["a"])
    assert mgr.get_computed_blocks(make_request("b", list(range(9))))[1] == 0


def test_prefix_cache_stats() -> None:
    mgr = make_manager(10, log_stats=True)
    admit(mgr, make_request("a", list(range(9))))
    admit(mgr, make_request("b", list(range(9))))
    resumed = make_request("c", list(range(9)))
    resumed.num_preemptions = 1
    mgr.get_computed_blocks(resumed)
    stats = mgr.make_prefix_cache_stats()
    assert stats is not None
    assert (stats.requests, stats.queries, stats.hits) == (2, 18, 8)
    assert (stats.preempted_requests, stats.preempted_queries, stats.preempted_hits) == (1, 9, 8)
    assert stats.hit_rate == pytest.approx(8 / 18)
    fresh = mgr.make_prefix_cache_stats()
    assert fresh is not None and fresh.requests == 0 and not fresh.reset
    assert make_manager().make_prefix_cache_stats() is None


def test_reset_prefix_cache() -> None:
    mgr = make_manager(10, log_stats=True)
    a = make_request("a", list(range(9)))
    admit(mgr, a)
    assert not mgr.reset_prefix_cache()  # a still holds blocks
    mgr.free(a)
    assert mgr.reset_prefix_cache()
    assert mgr.get_computed_blocks(make_request("b", list(range(9))))[1] == 0
    stats = mgr.make_prefix_cache_stats()
    assert stats is not None and stats.reset
    check_block_pool(mgr.block_pool)


# ------------------------------------------------------------------ freeing


def test_free_returns_blocks_tail_first() -> None:
    mgr = make_manager(6)  # 5 usable blocks
    a = make_request("a", list(range(12)))
    admit(mgr, a)
    assert mgr.get_block_ids("a") == ([1, 2, 3],)
    mgr.free(a)
    # Never-used blocks 4, 5 stay in front; a's blocks follow tail first.
    check_block_pool(mgr.block_pool, expected_free_order=[4, 5, 3, 2, 1])
    assert "a" not in mgr.req_to_blocks and "a" not in mgr.num_cached_block
    # So eviction reuses the tail of a's chain before its prefix.
    c = make_request("c", [70 + i for i in range(13)])
    admit(mgr, c)
    assert mgr.get_block_ids("c") == ([4, 5, 3, 2],)
    assert mgr.get_computed_blocks(make_request("d", list(range(5))))[1] == 4  # block 1 survived


def test_free_keeps_shared_blocks_held() -> None:
    mgr = make_manager(10)
    a = make_request("a", list(range(9)))
    b = make_request("b", list(range(9)))
    admit(mgr, a)
    admit(mgr, b)
    mgr.free(a)
    check_block_pool(mgr.block_pool, expected_ref_cnts={1: 1, 2: 1})
    mgr.free(b)
    check_block_pool(mgr.block_pool, expected_ref_cnts={1: 0, 2: 0})
    assert mgr.block_pool.get_num_free_blocks() == 9


def test_free_unknown_request_is_a_no_op() -> None:
    mgr = make_manager()
    mgr.free(make_request("ghost", [1, 2, 3]))
    assert mgr.block_pool.get_num_free_blocks() == 9


def test_get_block_ids_of_unknown_request_is_empty() -> None:
    assert make_manager().get_block_ids("nobody") == ([],)


# ------------------------------------------------------------------ state machine


class KVCacheManagerMachine(RuleBasedStateMachine):
    """Random admissions (with shared prefixes), decodes, preemptions and frees."""

    def __init__(self) -> None:
        super().__init__()
        self.num_blocks = 9
        self.mgr = KVCacheManager(self.num_blocks, BS, max_model_len=48, log_stats=True)
        self.running: dict[str, Request] = {}
        self.waiting: list[Request] = []
        self.counter = 0

    @rule(
        prefix=st.sampled_from([(), (1, 2, 3, 4), (1, 2, 3, 4, 5, 6, 7, 8)]),
        tail=st.lists(st.integers(0, 3), min_size=1, max_size=12),
    )
    def arrive(self, prefix: tuple[int, ...], tail: list[int]) -> None:
        self.counter += 1
        self.waiting.append(make_request(f"r{self.counter}", [*prefix, *tail]))

    @precondition(lambda self: self.waiting)
    @rule(chunk=st.integers(1, 16))
    def admit_head(self, chunk: int) -> None:
        req = self.waiting[0]
        hit_blocks, num_hit = self.mgr.get_computed_blocks(req)
        assert num_hit % BS == 0 and num_hit <= req.num_tokens - 1
        num_new = min(chunk, req.num_tokens - num_hit)
        before = snapshot(self.mgr)
        new = self.mgr.allocate_slots(req, num_new, num_hit, hit_blocks)
        if new is None:
            assert snapshot(self.mgr) == before
            return
        req.num_computed_tokens = num_hit + num_new
        self.running[req.request_id] = self.waiting.pop(0)

    @precondition(lambda self: self.running)
    @rule(data=st.data())
    def step_running(self, data: st.DataObject) -> None:
        rid = data.draw(st.sampled_from(sorted(self.running)))
        req = self.running[rid]
        if req.num_computed_tokens == req.num_tokens:
            if req.num_tokens >= 47:
                return
            req.append_output_token_ids(data.draw(st.integers(0, 3)))
        num_new = min(data.draw(st.integers(1, 8)), req.num_tokens - req.num_computed_tokens)
        before = snapshot(self.mgr)
        if self.mgr.allocate_slots(req, num_new) is None:
            assert snapshot(self.mgr) == before
            return
        req.num_computed_tokens += num_new

    @precondition(lambda self: self.running)
    @rule(data=st.data(), preempt=st.booleans())
    def release(self, data: st.DataObject, preempt: bool) -> None:
        rid = data.draw(st.sampled_from(sorted(self.running)))
        req = self.running.pop(rid)
        blocks = list(self.mgr.req_to_blocks[rid])
        self.mgr.free(req)
        freed = [b for b in reversed(blocks) if b.ref_cnt == 0]
        queue = self.mgr.block_pool.free_block_queue.get_all_free_blocks()
        # The blocks that became free went to the back of the queue, tail first.
        assert queue[len(queue) - len(freed) :] == freed
        if preempt:
            req.num_computed_tokens = 0
            req.num_preemptions += 1
            self.waiting.insert(0, req)

    @invariant()
    def pool_is_consistent(self) -> None:
        check_block_pool(self.mgr.block_pool)

    @invariant()
    def bookkeeping_matches_requests(self) -> None:
        mgr = self.mgr
        assert set(mgr.req_to_blocks) == set(self.running)
        held: set[int] = set()
        for rid, req in self.running.items():
            blocks = mgr.req_to_blocks[rid]
            assert len(blocks) == cdiv(req.num_computed_tokens, BS)
            held.update(b.block_id for b in blocks)
            num_cached = mgr.num_cached_block.get(rid, 0)
            assert num_cached == min(req.num_computed_tokens // BS, len(req.block_hashes))
            for i, block in enumerate(blocks):
                assert block.ref_cnt >= 1
                if i < num_cached:
                    # The block is filed under the request's own chained hash.
                    assert block.block_hash is not None
                    assert block.block_hash[: len(req.block_hashes[i])] == req.block_hashes[i]
        assert 0 not in held
        assert len(held) + mgr.block_pool.get_num_free_blocks() == self.num_blocks - 1
        for req in self.waiting:
            assert req.request_id not in mgr.req_to_blocks

    def teardown(self) -> None:
        for req in list(self.running.values()):
            self.mgr.free(req)
        check_block_pool(self.mgr.block_pool)
        assert self.mgr.block_pool.get_num_free_blocks() == self.num_blocks - 1
        assert all(b.ref_cnt == 0 for b in self.mgr.block_pool.blocks[1:])


TestKVCacheManagerMachine = KVCacheManagerMachine.TestCase
TestKVCacheManagerMachine.settings = settings(
    max_examples=60, stateful_step_count=30, deadline=None
)
