"""lab-01, part 1: the free block queue (a sentinel-headed doubly linked list)."""

from __future__ import annotations

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from grading.suite import graded, load_impl
from tests.labs.common import STATEFUL_SETTINGS, assert_constant_time, check_queue, free_ids

DOC = "phases/02-paged-attention/README.md"


def make_queue(n: int):
    bp = load_impl("block_pool")
    blocks = [bp.KVCacheBlock(i) for i in range(n)]
    return bp, blocks, bp.FreeKVCacheBlockQueue(blocks)


@graded(2, "I2: a new queue links every block in id order between the two sentinels, and "
           "num_free_blocks counts them", f"{DOC}#the-free-block-queue")
def test_new_queue_links_blocks_in_order():
    """A fresh queue holds the blocks in the order given."""
    _, blocks, q = make_queue(5)
    forward = check_queue(q)
    assert [b.block_id for b in forward] == [0, 1, 2, 3, 4], (
        "I2: the queue must start in the order the blocks were given")
    assert blocks[0].prev_free_block is q.fake_free_list_head, (
        "I2: the first block's prev_free_block must be the head sentinel, not None")
    assert blocks[-1].next_free_block is q.fake_free_list_tail, (
        "I2: the last block's next_free_block must be the tail sentinel, not None")
    assert [b.block_id for b in q.get_all_free_blocks()] == [0, 1, 2, 3, 4], (
        "get_all_free_blocks must list the free blocks front to back, without the sentinels")


@graded(1, "I2: an empty queue links the head sentinel straight to the tail sentinel",
        f"{DOC}#the-free-block-queue")
def test_empty_queue():
    """An empty queue is valid and popping from it is an error."""
    _, _, q = make_queue(0)
    assert q.num_free_blocks == 0
    assert q.fake_free_list_head.next_free_block is q.fake_free_list_tail, (
        "I2: in an empty queue the head sentinel's next is the tail sentinel")
    assert q.fake_free_list_tail.prev_free_block is q.fake_free_list_head
    assert q.get_all_free_blocks() == []
    with pytest.raises(ValueError):
        q.popleft()


@graded(2, "I2: popleft returns the front block and unlinks it from both neighbours",
        f"{DOC}#the-free-block-queue")
def test_popleft_takes_the_front():
    """popleft pops in FIFO order and leaves the popped block unlinked."""
    _, blocks, q = make_queue(4)
    first = q.popleft()
    assert first is blocks[0], f"popleft must return the front block (0), got {first.block_id}"
    assert first.prev_free_block is None and first.next_free_block is None, (
        "I2: a popped block must not keep links into the queue")
    assert blocks[1].prev_free_block is q.fake_free_list_head, (
        "I2: after popleft the new front block must point back at the head sentinel")
    assert q.popleft() is blocks[1]
    check_queue(q)
    assert free_ids(q) == [2, 3]


@graded(2, "I2: popleft_n(n) pops the first n blocks in order; popleft_n(0) pops nothing",
        f"{DOC}#the-free-block-queue")
def test_popleft_n():
    """popleft_n pops a run of blocks from the front, in order."""
    _, _, q = make_queue(6)
    assert q.popleft_n(0) == [], "popleft_n(0) must return an empty list"
    check_queue(q)
    got = q.popleft_n(4)
    assert [b.block_id for b in got] == [0, 1, 2, 3], (
        f"popleft_n(4) must return blocks 0..3 in order, got {[b.block_id for b in got]}")
    assert all(b.prev_free_block is None and b.next_free_block is None for b in got), (
        "I2: every block popped by popleft_n must be unlinked")
    check_queue(q)
    assert free_ids(q) == [4, 5]
    rest = q.popleft_n(2)
    assert [b.block_id for b in rest] == [4, 5]
    check_queue(q)
    assert q.num_free_blocks == 0


@graded(1, "popleft_n must refuse to pop more blocks than are free, and leave the queue as it "
           "was", f"{DOC}#misuse-errors")
def test_popleft_n_too_many_is_an_error():
    """Asking for more blocks than the queue holds is a clear error."""
    _, _, q = make_queue(3)
    with pytest.raises((ValueError, RuntimeError, AssertionError)):
        q.popleft_n(4)
    check_queue(q)
    assert free_ids(q) == [0, 1, 2], "a refused popleft_n must not change the queue"


@graded(3, "I2: remove unlinks a block from anywhere in the queue by relinking its neighbours",
        f"{DOC}#the-free-block-queue")
def test_remove_from_middle_head_and_tail():
    """remove works in the middle, at the front and at the back."""
    _, blocks, q = make_queue(6)
    q.remove(blocks[3])
    assert blocks[3].prev_free_block is None and blocks[3].next_free_block is None, (
        "I2: a removed block must not keep links into the queue")
    assert blocks[2].next_free_block is blocks[4] and blocks[4].prev_free_block is blocks[2], (
        "I2: remove must link the removed block's neighbours to each other")
    check_queue(q)
    q.remove(blocks[0])
    q.remove(blocks[5])
    check_queue(q)
    assert free_ids(q) == [1, 2, 4]
    assert q.num_free_blocks == 3


@graded(2, "I2/misuse: removing a block that is not in the queue must raise, not corrupt the "
           "list", f"{DOC}#misuse-errors")
def test_remove_block_not_in_queue_is_an_error():
    """remove of a popped block raises and leaves the queue intact."""
    _, _, q = make_queue(4)
    popped = q.popleft()
    with pytest.raises((RuntimeError, ValueError)) as excinfo:
        q.remove(popped)
    assert str(excinfo.value), "the error must say what was wrong"
    check_queue(q)
    assert free_ids(q) == [1, 2, 3] and q.num_free_blocks == 3, (
        "a refused remove must not change the queue or its count")


@graded(2, "I2: append puts a block at the back (the tail sentinel's prev)",
        f"{DOC}#the-free-block-queue")
def test_append_goes_to_the_back():
    """append adds at the tail, also to an emptied queue."""
    _, _, q = make_queue(3)
    a, b, c = q.popleft(), q.popleft(), q.popleft()
    check_queue(q)
    q.append(b)
    check_queue(q)
    assert free_ids(q) == [1]
    q.append(a)
    q.append(c)
    check_queue(q)
    assert free_ids(q) == [1, 0, 2], "append must add at the back, in call order"
    assert q.fake_free_list_tail.prev_free_block is c


@graded(2, "I2: append_n adds blocks at the back in the order given",
        f"{DOC}#the-free-block-queue")
def test_append_n_keeps_order():
    """append_n appends a run of blocks in order; append_n([]) changes nothing."""
    _, _, q = make_queue(5)
    popped = q.popleft_n(5)
    q.append_n([])
    check_queue(q)
    assert q.num_free_blocks == 0
    q.append_n([popped[3], popped[1]])
    check_queue(q)
    q.append_n([popped[4], popped[0], popped[2]])
    check_queue(q)
    assert free_ids(q) == [3, 1, 4, 0, 2], "append_n must keep the order of its argument"


class QueueMachine(RuleBasedStateMachine):
    """Random pops, removes and appends, compared with a Python list after every step."""

    def __init__(self) -> None:
        super().__init__()
        self.bp, self.blocks, self.q = make_queue(12)
        self.model = list(range(12))
        self.out: list[int] = []

    @precondition(lambda self: self.model)
    @rule()
    def popleft(self) -> None:
        got = self.q.popleft()
        want = self.model.pop(0)
        assert got.block_id == want, f"popleft returned {got.block_id}, expected {want}"
        self.out.append(want)

    @precondition(lambda self: self.model)
    @rule(data=st.data())
    def popleft_n(self, data) -> None:
        n = data.draw(st.integers(0, len(self.model)))
        got = [b.block_id for b in self.q.popleft_n(n)]
        want, self.model = self.model[:n], self.model[n:]
        assert got == want, f"popleft_n({n}) returned {got}, expected {want}"
        self.out.extend(want)

    @precondition(lambda self: self.model)
    @rule(data=st.data())
    def remove(self, data) -> None:
        victim = data.draw(st.sampled_from(self.model))
        self.q.remove(self.blocks[victim])
        self.model.remove(victim)
        self.out.append(victim)

    @precondition(lambda self: self.out)
    @rule(data=st.data())
    def append(self, data) -> None:
        idx = data.draw(st.integers(0, len(self.out) - 1))
        block_id = self.out.pop(idx)
        self.q.append(self.blocks[block_id])
        self.model.append(block_id)

    @precondition(lambda self: self.out)
    @rule(data=st.data())
    def append_n(self, data) -> None:
        chosen = data.draw(st.permutations(self.out))[: data.draw(st.integers(1, len(self.out)))]
        for block_id in chosen:
            self.out.remove(block_id)
        self.q.append_n([self.blocks[i] for i in chosen])
        self.model.extend(chosen)

    @invariant()
    def matches_model(self) -> None:
        check_queue(self.q)
        assert free_ids(self.q) == self.model, (
            f"I2: the queue holds {free_ids(self.q)} but should hold {self.model}")
        assert [b.block_id for b in self.q.get_all_free_blocks()] == self.model, (
            "get_all_free_blocks disagrees with the links")


@graded(4, "I2: after any sequence of popleft / popleft_n / remove / append / append_n the "
           "queue must equal a plain list doing the same", f"{DOC}#the-free-block-queue")
def test_random_operations_match_a_list():
    """Property test: the queue behaves like a list under random operation sequences."""
    run_state_machine_as_test(QueueMachine, settings=STATEFUL_SETTINGS)


def _queue_ops(op: str):
    def build(n: int):
        _, blocks, q = make_queue(n)
        middle = blocks[n // 4: n // 4 + 500]

        def run() -> None:
            if op == "remove":
                for b in middle:
                    q.remove(b)
                for b in middle:
                    q.append(b)
            elif op == "popleft":
                popped = [q.popleft() for _ in range(500)]
                for b in popped:
                    q.append(b)
            elif op == "popleft_n":
                for _ in range(500):
                    q.append_n(q.popleft_n(1))
            elif op == "num_free_blocks":
                for _ in range(500):
                    _ = q.num_free_blocks
        return run
    return build


@graded(4, "I2: remove, popleft, popleft_n, append, append_n and num_free_blocks are O(1) "
           "per block (relink neighbours; keep a counter; never walk or copy the list)",
        f"{DOC}#why-a-hand-written-linked-list")
def test_operations_are_constant_time():
    """The same 500 operations cost the same on 2,000 and on 200,000 blocks."""
    for op in ("remove", "popleft", "popleft_n", "num_free_blocks"):
        assert_constant_time(f"FreeKVCacheBlockQueue.{op}", _queue_ops(op))
