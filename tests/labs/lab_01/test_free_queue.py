"""lab-01, part 1: the free block queue (a sentinel-headed doubly linked list).

The queue and its blocks live in the learner process (``learner_side.make_queue`` builds them
there); the checks read them back as data (``tests/labs/common.py``) and decide here.
"""

from __future__ import annotations

import random

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
)

from grading.suite import graded, learner_module, load_impl
from tests.labs.common import (
    as_int,
    assert_constant_time,
    assert_error_names,
    block_ids,
    check_queue,
    int_list,
    run_machine,
    same_data,
    timed_call,
)

DOC = "phases/02-paged-attention/README.md"


def side():
    return learner_module("learner_side")


def make_queue(n: int):
    """``(blocks, queue)``: blocks 0 .. n-1 and a queue of them, built in the learner process."""
    load_impl("block_pool")  # a missing or broken file is reported as such
    blocks, q = side().make_queue(n)
    return blocks, q


@graded(
    2,
    "I2: a new queue links every block in id order between the two sentinels, and "
    "num_free_blocks counts them",
    f"{DOC}#the-free-block-queue",
)
def test_new_queue_links_blocks_in_order():
    """A fresh queue holds the blocks in the order given."""
    blocks, q = make_queue(5)
    assert check_queue(q) == [0, 1, 2, 3, 4], (
        "I2: the queue must start in the order the blocks were given"
    )
    assert blocks[0].prev_free_block is q.fake_free_list_head, (
        "I2: the first block's prev_free_block must be the head sentinel, not None"
    )
    assert blocks[-1].next_free_block is q.fake_free_list_tail, (
        "I2: the last block's next_free_block must be the tail sentinel, not None"
    )
    listed = block_ids(q.get_all_free_blocks())
    assert listed == [0, 1, 2, 3, 4], (
        f"get_all_free_blocks must list the free blocks front to back, without the sentinels: "
        f"got {listed}"
    )
    sentinels = [as_int(q.fake_free_list_head.block_id, "the head sentinel's block_id")]
    sentinels.append(as_int(q.fake_free_list_tail.block_id, "the tail sentinel's block_id"))
    assert sentinels == [-1, -1], (
        f"the two sentinels are KVCacheBlock(block_id=-1), an id no real block has (block 0 is "
        f"the pool's null block): got ids {sentinels}"
    )
    _, other = make_queue(2)  # a second pool has a queue of its own
    assert other.fake_free_list_head is not q.fake_free_list_head, (
        "I2: every queue needs its own two sentinels, made in __init__: two queues share "
        "fake_free_list_head (a class attribute is one object shared by every instance)"
    )
    assert check_queue(q) == [0, 1, 2, 3, 4], (
        "I2: building a second queue must leave the first one as it was"
    )


@graded(
    1,
    "I2: an empty queue links the head sentinel straight to the tail sentinel",
    f"{DOC}#the-free-block-queue",
)
def test_empty_queue():
    """An empty queue is valid and popping from it is an error."""
    _, q = make_queue(0)
    count = as_int(q.num_free_blocks, "num_free_blocks")
    assert count == 0, f"a queue of no blocks has num_free_blocks 0, got {count}"
    assert q.fake_free_list_head.next_free_block is q.fake_free_list_tail, (
        "I2: in an empty queue the head sentinel's next is the tail sentinel"
    )
    assert q.fake_free_list_tail.prev_free_block is q.fake_free_list_head, (
        "I2: in an empty queue the tail sentinel's prev is the head sentinel"
    )
    listed = q.get_all_free_blocks()
    assert listed == [], f"get_all_free_blocks of an empty queue must be [], got {listed!r}"
    with pytest.raises(ValueError) as raised:
        q.popleft()
    assert_error_names(raised.value, "popleft() on an empty queue")
    count = as_int(q.num_free_blocks, "num_free_blocks")
    assert count == 0, (
        f"a refused popleft must leave num_free_blocks at 0, got {count}: check that the queue "
        "is empty before changing the counter"
    )
    check_queue(q)
    # Nor does the refusal leave a change for later: the next call, an append, gives a queue
    # of one block (tests/hostile/undo_the_rollback_at_the_next_success.py).
    q.append(load_impl("block_pool").KVCacheBlock(7))
    count = as_int(q.num_free_blocks, "num_free_blocks")
    assert count == 1 and check_queue(q) == [7], (
        f"after the refused popleft, append(block 7) must give the queue [7] with num_free_blocks "
        f"1, got num_free_blocks {count}: a refused call changes nothing, then or later"
    )


@graded(
    2,
    "I2: popleft returns the front block and unlinks it from both neighbours",
    f"{DOC}#the-free-block-queue",
)
def test_popleft_takes_the_front():
    """popleft pops in FIFO order and leaves the popped block unlinked."""
    blocks, q = make_queue(4)
    first = q.popleft()
    assert first is blocks[0], f"popleft must return the front block (0), got {first!r}"
    assert first.prev_free_block is None and first.next_free_block is None, (
        "I2: a popped block must not keep links into the queue"
    )
    assert blocks[1].prev_free_block is q.fake_free_list_head, (
        "I2: after popleft the new front block must point back at the head sentinel"
    )
    assert q.popleft() is blocks[1], "the second popleft must return block 1"
    assert check_queue(q) == [2, 3], "after two poplefts the queue holds [2, 3]"


@graded(
    2,
    "I2: popleft_n(n) pops the first n blocks in order; popleft_n(0) pops nothing",
    f"{DOC}#the-free-block-queue",
)
def test_popleft_n():
    """popleft_n pops a run of blocks from the front, in order."""
    _, q = make_queue(6)
    none = q.popleft_n(0)
    assert none == [], f"popleft_n(0) must return an empty list, got {none!r}"
    check_queue(q)
    got = q.popleft_n(4)
    assert block_ids(got) == [0, 1, 2, 3], (
        f"popleft_n(4) must return blocks 0..3 in order, got {block_ids(got)}"
    )
    assert all(b.prev_free_block is None and b.next_free_block is None for b in got), (
        "I2: every block popped by popleft_n must be unlinked"
    )
    assert check_queue(q) == [4, 5], "after popleft_n(4) the queue holds [4, 5]"
    rest = q.popleft_n(2)
    assert block_ids(rest) == [4, 5], f"popleft_n(2) must return [4, 5], got {block_ids(rest)}"
    assert check_queue(q) == [], "popleft_n of every block empties the queue"


@graded(
    1,
    "popleft_n must refuse (ValueError) to pop more blocks than are free or a negative "
    "number, and leave the queue as it was",
    f"{DOC}#misuse-errors",
)
def test_popleft_n_too_many_is_an_error():
    """Asking for more blocks than the queue holds, or fewer than none, is a clear error."""
    _, q = make_queue(3)
    with pytest.raises(ValueError) as raised:
        q.popleft_n(4)
    assert_error_names(raised.value, "popleft_n(4) on a queue of 3 blocks", 4)
    assert check_queue(q) == [0, 1, 2], "a refused popleft_n must not change the queue"
    with pytest.raises(ValueError) as raised:
        q.popleft_n(-1)
    assert_error_names(raised.value, "popleft_n(-1)")
    assert check_queue(q) == [0, 1, 2], (
        "popleft_n(-1) must be refused with ValueError and change nothing (not even "
        "num_free_blocks)"
    )
    # Nor do the refusals leave a change for later: the next call, which fits, pops the three
    # blocks and empties the queue (tests/hostile/lower_the_count_after_the_next_success.py).
    got = block_ids(q.popleft_n(3))
    left = check_queue(q)
    assert (got, left) == ([0, 1, 2], []), (
        f"after the refusals, popleft_n(3) of the 3 free blocks must return [0, 1, 2] and leave "
        f"the queue [] (num_free_blocks 0), got {got} and {left}: a refused call changes "
        "nothing, then or at a later call"
    )


@graded(
    3,
    "I2: remove unlinks a block from anywhere in the queue by relinking its neighbours",
    f"{DOC}#the-free-block-queue",
)
def test_remove_from_middle_head_and_tail():
    """remove works in the middle, at the front and at the back."""
    blocks, q = make_queue(6)
    q.remove(blocks[3])
    assert blocks[3].prev_free_block is None and blocks[3].next_free_block is None, (
        "I2: a removed block must not keep links into the queue"
    )
    assert blocks[2].next_free_block is blocks[4] and blocks[4].prev_free_block is blocks[2], (
        "I2: remove must link the removed block's neighbours to each other"
    )
    assert check_queue(q) == [0, 1, 2, 4, 5], "remove(block 3) leaves [0, 1, 2, 4, 5]"
    q.remove(blocks[0])
    q.remove(blocks[5])
    assert check_queue(q) == [1, 2, 4], "removing the front and the back block leaves [1, 2, 4]"


@graded(
    2,
    "I2/misuse: removing a block that is not in the queue must raise RuntimeError (a broken "
    "state), not corrupt the list",
    f"{DOC}#misuse-errors",
)
def test_remove_block_not_in_queue_is_an_error():
    """remove of a popped block raises and leaves the queue intact."""
    blocks, q = make_queue(4)
    popped = q.popleft()
    with pytest.raises(RuntimeError) as excinfo:
        q.remove(popped)
    assert_error_names(excinfo.value, "remove(block 0) of a popped block", 0)
    assert check_queue(q) == [1, 2, 3], "a refused remove must not change the queue or its count"
    # The sentinels are not in the queue either: removing one must not unlink a real block.
    for sentinel in ("fake_free_list_head", "fake_free_list_tail"):
        end = getattr(q, sentinel)  # read before: only remove itself may raise
        with pytest.raises(RuntimeError):
            q.remove(end)
        assert check_queue(q) == [1, 2, 3], (
            f"remove({sentinel}) must be refused with RuntimeError (a sentinel is not a free "
            "block: one of its links is None) and leave the queue as it was"
        )
    # Nor do the refusals leave a change for later: the next calls, which succeed, give the
    # queue [1, 3, 0].
    q.append(popped)
    q.remove(blocks[2])
    left = check_queue(q)
    assert left == [1, 3, 0], (
        f"after the refused removes, append(block 0) then remove(block 2) must leave the queue "
        f"[1, 3, 0], got {left}: a refused call changes nothing, then or at a later call"
    )


@graded(
    2,
    "I2: append puts a block at the back (the tail sentinel's prev)",
    f"{DOC}#the-free-block-queue",
)
def test_append_goes_to_the_back():
    """append adds at the tail, also to an emptied queue."""
    _, q = make_queue(3)
    a, b, c = q.popleft(), q.popleft(), q.popleft()
    check_queue(q)
    q.append(b)
    assert check_queue(q) == [1], "append to an empty queue gives a queue of that block"
    q.append(a)
    q.append(c)
    assert check_queue(q) == [1, 0, 2], "append must add at the back, in call order"
    assert q.fake_free_list_tail.prev_free_block is c, (
        "I2: the tail sentinel's prev_free_block must be the block appended last"
    )


@graded(2, "I2: append_n adds blocks at the back in the order given", f"{DOC}#the-free-block-queue")
def test_append_n_keeps_order():
    """append_n appends a run of blocks in order; append_n([]) changes nothing."""
    _, q = make_queue(5)
    popped = q.popleft_n(5)
    q.append_n([])
    assert check_queue(q) == [], "append_n([]) must leave an empty queue empty"
    q.append_n([popped[3], popped[1]])
    assert check_queue(q) == [3, 1], "append_n([3, 1]) must give the queue [3, 1]"
    q.append_n([popped[4], popped[0], popped[2]])
    assert check_queue(q) == [3, 1, 4, 0, 2], "append_n must keep the order of its argument"
    bench = side().make_queue_bench(4)
    side().run_queue_ops(bench, [["popleft_n", 4], ["append_n_iter", [2, 0, 3]]])
    got = check_queue(bench.queue, 6)
    assert got == [2, 0, 3], (
        f"append_n(iter([2, 0, 3])) on an empty queue must give [2, 0, 3], got {got}: blocks "
        "may be any iterable, which can be walked only once (no len, no second pass)"
    )


@graded(
    2,
    "Misuse: append / append_n of a block that is already in the queue (or listed twice) "
    "raises RuntimeError and leaves the queue as it was",
    f"{DOC}#misuse-errors",
)
def test_appending_a_queued_block_is_an_error():
    """Linking a block in twice would corrupt the list: it is refused, all or nothing."""
    blocks, q = make_queue(4)
    out = q.popleft()  # block 0 leaves; 1 2 3 stay
    with pytest.raises(RuntimeError) as raised:
        q.append(blocks[2])
    assert_error_names(raised.value, "append(block 2) of a queued block", 2)
    assert check_queue(q) == [1, 2, 3], "a refused append must not change the queue"
    with pytest.raises(RuntimeError) as raised:
        q.append_n([out, blocks[3]])
    assert_error_names(raised.value, "append_n([block 0, block 3]) of a queued block 3", 3)
    assert check_queue(q) == [1, 2, 3], (
        "a refused append_n must not change the queue, not even link the blocks before the bad one"
    )
    assert out.prev_free_block is None and out.next_free_block is None, (
        "I2: after a refused append_n, the blocks it had linked must be unlinked again"
    )
    with pytest.raises(RuntimeError):
        q.append_n([out, out])
    assert check_queue(q) == [1, 2, 3], "append_n of a block listed twice must be refused"
    q.append(out)
    assert check_queue(q) == [1, 2, 3, 0], "after the refusals, append still works"
    front = q.popleft_n(2)  # blocks 1 and 2
    q.append_n(front)
    assert check_queue(q) == [3, 0, 1, 2], (
        "after the refusals, append_n of blocks that are not queued still works (refuse only "
        "a block already in the queue or listed twice)"
    )


class QueueMachine(RuleBasedStateMachine):
    """Random pops, removes and appends, compared with a Python list after every step."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks, self.q = make_queue(12)
        self.side = side()
        self.model = list(range(12))
        self.out: list[int] = []

    @precondition(lambda self: self.model)
    @rule()
    def popleft(self) -> None:
        got = as_int(self.q.popleft().block_id, "the popped block's block_id")
        want = self.model.pop(0)
        assert got == want, f"popleft returned block {got}, expected {want}"
        self.out.append(want)

    @precondition(lambda self: self.model)
    @rule(data=st.data())
    def popleft_n(self, data) -> None:
        n = data.draw(st.integers(0, len(self.model)), label="n")
        got = int_list(self.side.block_ids(self.q.popleft_n(n)), "the popped blocks' ids")
        want, self.model = self.model[:n], self.model[n:]
        assert got == want, f"popleft_n({n}) returned {got}, expected {want}"
        self.out.extend(want)

    @precondition(lambda self: self.model)
    @rule(data=st.data())
    def remove(self, data) -> None:
        victim = data.draw(st.sampled_from(self.model), label="block")
        self.q.remove(self.blocks[victim])
        self.model.remove(victim)
        self.out.append(victim)

    @precondition(lambda self: self.out)
    @rule(data=st.data())
    def append(self, data) -> None:
        block_id = data.draw(st.sampled_from(self.out), label="block")
        self.out.remove(block_id)
        self.q.append(self.blocks[block_id])
        self.model.append(block_id)

    @precondition(lambda self: self.out)
    @rule(data=st.data())
    def append_n(self, data) -> None:
        chosen = data.draw(
            st.lists(st.sampled_from(self.out), min_size=1, unique=True), label="blocks"
        )
        for block_id in chosen:
            self.out.remove(block_id)
        self.q.append_n([self.blocks[i] for i in chosen])
        self.model.extend(chosen)

    @invariant()
    def matches_model(self) -> None:
        queue = check_queue(self.q, limit=14)
        assert queue == self.model, f"I2: the queue holds {queue} but should hold {self.model}"
        listed = int_list(
            self.side.block_ids(self.q.get_all_free_blocks()), "get_all_free_blocks' block ids"
        )
        assert listed == self.model, (
            f"get_all_free_blocks gives {listed}, but the links give {self.model}"
        )


@graded(
    4,
    "I2: after any sequence of popleft / popleft_n / remove / append / append_n the "
    "queue must equal a plain list doing the same",
    f"{DOC}#the-free-block-queue",
    timeout=30,
)
def test_random_operations_match_a_list():
    """Property test: the queue behaves like a list under random operation sequences."""
    run_machine(QueueMachine)


class QueueBench:
    """A queue of ``n`` blocks in the learner process, and the list it should equal.

    Each step sends one batch of operations (one request, timed here), then checks what the
    batch returned against the list, which the judge updates doing the same. Which blocks a
    batch removes, and in what order, is drawn afresh for every batch (seeded: the grade is
    reproducible), and the counter is read between changes: a batch whose pattern could be
    guessed (a run removed from one place, the count asked again and again with nothing in
    between) would let a search that starts where the last one ended, or a count cached until
    the next change, pass for O(1).
    """

    BATCH = 500

    def __init__(self, n: int) -> None:
        self.n = n
        self.bench = side().make_queue_bench(n)
        self.run_ops = side().run_queue_ops
        self.model = list(range(n))
        self.rng = random.Random(n)

    def plan(self, op: str) -> tuple[list[list], list]:
        """A batch exercising ``op`` that puts every block back, and what it must return."""
        k, model = self.BATCH, self.model
        if op == "remove":  # blocks from anywhere, in any order, then back at the end
            picked = self.rng.sample(model, k)
            taken = set(picked)
            self.model = [i for i in model if i not in taken] + picked
            return [["remove", i] for i in picked] + [["append", i] for i in picked], []
        if op == "num_free_blocks":  # read after every change
            front = model[:k]
            self.model = model[k:] + front
            ops = [x for i in front for x in (["popleft"], ["num_free_blocks"], ["append", i])]
            want = [x for i in front for x in (i, self.n - 1)]
            return [*ops, ["num_free_blocks"]], [*want, self.n]
        if op == "append_n":  # a quarter of the queue at once: a long run costs O(k) too
            k = self.n // 4
        front = model[:k]
        self.model = model[k:] + front
        if op == "popleft":
            return [["popleft"]] * k + [["append", i] for i in front], front
        if op == "popleft_n":  # one block at a time
            return [x for i in front for x in (["popleft_n", 1], ["append_n", [i]])], [
                [i] for i in front
            ]
        assert op == "append_n"
        return [["popleft_n", k], ["append_n", front]], [front]

    def step(self, op: str) -> float:
        """Seconds per ``BATCH`` blocks (``append_n`` moves ``n / 4`` blocks in one run)."""
        ops, want = self.plan(op)
        seconds, got = timed_call(self.run_ops, self.bench, ops)
        if not same_data(got, want):
            raise AssertionError(
                f"{op} on a queue of {self.n:,} blocks returned the wrong blocks or counts "
                f"(first differences: {_first_difference(got, want)}); the timing only counts "
                "for correct results"
            )
        if op == "append_n":
            return seconds * self.BATCH / (self.n // 4)
        return seconds

    def verify(self) -> None:
        queue = check_queue(self.bench.queue, self.n + 2)
        if queue != self.model:
            raise AssertionError(
                f"I2: after the timed batches the queue of {self.n:,} blocks is not in the "
                f"expected order (first difference: {_first_difference(queue, self.model)})"
            )


def _first_difference(got, want) -> str:
    if type(got) is not list:
        return f"got {got!r:.80}"
    for i, (a, b) in enumerate(zip(got, want)):
        if a != b:
            return f"at position {i}: got {a!r:.60}, expected {b!r:.60}"
    return f"got {len(got)} results, expected {len(want)}"


@graded(
    4,
    "I2: remove, popleft, popleft_n, append, append_n and num_free_blocks are O(1) "
    "per block (relink neighbours; keep a counter; never walk or copy the list)",
    f"{DOC}#why-a-hand-written-linked-list",
)
def test_operations_are_constant_time():
    """The same 500 operations cost the same on 2,000 and on 200,000 blocks, and are right;
    popleft_n and append_n of a quarter of the queue (500 and 50,000 blocks) cost the same per
    block."""
    benches = {n: QueueBench(n) for n in (2_000, 200_000)}
    for op in ("remove", "popleft", "popleft_n", "append_n", "num_free_blocks"):
        assert_constant_time(
            f"FreeKVCacheBlockQueue.{op}", lambda n, op=op: lambda: benches[n].step(op)
        )
    for bench in benches.values():
        bench.verify()
