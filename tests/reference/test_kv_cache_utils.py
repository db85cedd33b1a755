"""Tests of mini_vllm.core.kv_cache_utils: hashing, KVCacheBlock and FreeKVCacheBlockQueue."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from mini_vllm.core import kv_cache_utils
from mini_vllm.core.kv_cache_utils import (
    BlockHash,
    FreeKVCacheBlockQueue,
    KVCacheBlock,
    get_block_hash,
    get_group_id,
    get_request_block_hasher,
    hash_block_tokens,
    init_none_hash,
    make_block_hash_with_group_id,
    sha256,
)
from mini_vllm.teaching.invariants import check_free_queue

REPO_ROOT = Path(__file__).resolve().parents[2]


def make_queue(num_blocks: int) -> tuple[list[KVCacheBlock], FreeKVCacheBlockQueue]:
    blocks = [KVCacheBlock(i) for i in range(num_blocks)]
    return blocks, FreeKVCacheBlockQueue(blocks)


def ids(blocks: list[KVCacheBlock]) -> list[int]:
    return [block.block_id for block in blocks]


def queue_ids(queue: FreeKVCacheBlockQueue) -> list[int]:
    return check_free_queue(queue)


# ------------------------------------------------------------------------------------------
# Block hash keys
# ------------------------------------------------------------------------------------------


def test_block_hash_with_group_id_round_trip() -> None:
    block_hash = BlockHash(b"\x01" * 32)
    key = make_block_hash_with_group_id(block_hash, 7)
    assert isinstance(key, bytes)
    assert key == block_hash + b"\x00\x00\x00\x07"
    assert get_block_hash(key) == block_hash
    assert get_group_id(key) == 7
    assert make_block_hash_with_group_id(block_hash, 0) != key
    assert get_group_id(make_block_hash_with_group_id(block_hash, 2**32 - 1)) == 2**32 - 1


# ------------------------------------------------------------------------------------------
# sha256 and its fixed layout (tests/reference/test_block_hash_layout.py proves that it hashes
# every block as the former general encoder did)
# ------------------------------------------------------------------------------------------


def _sized(tag: bytes, payload: bytes) -> bytes:
    return tag + len(payload).to_bytes(8, "big") + payload


def test_sha256_hashes_the_documented_layout() -> None:
    # Spelled out by hand from sha256's docstring: the layout is a format, not a detail.
    parent = b"\x07" * 32
    header = b"t" + (3).to_bytes(8, "big") + _sized(b"b", parent)
    tokens = (
        b"q"
        + (2).to_bytes(8, "big")
        + (5).to_bytes(8, "big")
        + (-1).to_bytes(8, "big", signed=True)
    )
    block = (parent, (5, -1), None)
    assert sha256(block) == hashlib.sha256(header + tokens + b"N").digest()
    assert len(sha256(block)) == 32 and sha256(block) == sha256(block)
    salt = (
        b"t" + (2).to_bytes(8, "big") + _sized(b"s", "sé".encode()) + b"i" + (3).to_bytes(8, "big")
    )
    assert sha256((parent, (5, -1), ("sé", 3))) == hashlib.sha256(header + tokens + salt).digest()
    ints = b"q" + (1).to_bytes(8, "big") + (3).to_bytes(8, "big")
    assert sha256((parent, (5, -1), (3,))) == hashlib.sha256(header + tokens + ints).digest()
    assert sha256("123") == hashlib.sha256(_sized(b"s", b"123")).digest()


P = b"\x01" * 32


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ((P, (1, 23), None), (P, (12, 3), None)),
        ((P, (0,), None), (P, (0, 0), None)),
        ((P, (), None), (P, (), ())),
        ((P, (1,), ("a",)), (P, (1,), ("b",))),
        ((P, (1,), (1,)), (P, (1,), ("1",))),
        ((P, (1,), ("a", "b")), (P, (1,), ("ab",))),
        ((P, (1, 2), None), (P + b"\x00", (1, 2), None)),
        ((P, (2**63 - 1,), None), (P, (-(2**63),), None)),
        ((P, (1,), None), P.hex()),
    ],
)
def test_sha256_distinguishes_values(a: object, b: object) -> None:
    assert sha256(a) != sha256(b)


def test_sha256_depends_only_on_value() -> None:
    # Token ids hash alike whatever sequence or integer type holds them.
    assert sha256((P, [1, 2, 3], None)) == sha256((P, (1, 2, 3), None))
    assert sha256((P, (1,), ["x", 2])) == sha256((P, (1,), ("x", 2)))
    assert sha256((P, range(4), None)) == sha256((P, (0, 1, 2, 3), None))
    numpy = pytest.importorskip("numpy")
    tokens = numpy.array([5, 6, 2**40], dtype=numpy.int64)
    assert sha256((P, tuple(tokens), None)) == sha256((P, (5, 6, 2**40), None))
    assert sha256((P, tokens.astype(numpy.int32)[:2], None)) == sha256((P, (5, 6), None))


@pytest.mark.parametrize(
    ("value", "error", "match"),
    [
        (None, TypeError, "a block .* or a seed string, got NoneType"),
        (b"bytes", TypeError, "got bytes"),
        (("just a string",), TypeError, "got tuple"),
        ((None, (), None), TypeError, "got tuple"),
        ((P, (), None, None), TypeError, "got tuple"),
        ((P, (1, 2.0), None), TypeError, "token ids must be integers, got float 2.0"),
        ((P, (1, "2"), None), TypeError, "token ids must be integers, got str"),
        ((P, (2**63,), None), OverflowError, "token ids must fit in 64 signed bits"),
        ((P, (1,), (2**64,)), OverflowError, "integer extra keys must fit in 64 signed bits"),
        ((P, (1,), ("a", 2**64)), OverflowError, "too big"),
        ((P, (1,), "salt"), TypeError, "extra_keys must be a tuple or None, got str"),
        ((P, (1,), (("mm-hash", 0),)), TypeError, "extra key must be a str or an int, got tuple"),
        ((P, (1,), ("a", b"b")), TypeError, "got bytes"),
        ((P, (1,), ("a", True)), TypeError, "got bool"),
        ((P, (1,), ("a", 1.5)), TypeError, "got float"),
    ],
)
def test_sha256_refuses_other_shapes(value: object, error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        sha256(value)


# ------------------------------------------------------------------------------------------
# NONE_HASH
# ------------------------------------------------------------------------------------------


@pytest.fixture
def restore_none_hash() -> Iterator[None]:
    saved = kv_cache_utils.NONE_HASH
    yield
    kv_cache_utils.NONE_HASH = saved


@pytest.mark.usefixtures("restore_none_hash")
def test_none_hash_follows_pythonhashseed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONHASHSEED", "123")
    init_none_hash(sha256)
    seeded = kv_cache_utils.NONE_HASH
    assert seeded == sha256("123")
    monkeypatch.delenv("PYTHONHASHSEED")
    init_none_hash(sha256)
    first = kv_cache_utils.NONE_HASH
    init_none_hash(sha256)
    second = kv_cache_utils.NONE_HASH
    assert first != second
    assert len(first) == len(second) == 32


def _none_hash_in_subprocess(seed: str | None) -> str:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONHASHSEED"}
    if seed is not None:
        env["PYTHONHASHSEED"] = seed
    code = "from mini_vllm.core import kv_cache_utils as k; print(k.NONE_HASH.hex())"
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return result.stdout.strip()


def test_none_hash_is_shared_by_processes_with_the_same_seed() -> None:
    assert _none_hash_in_subprocess("7") == _none_hash_in_subprocess("7") == sha256("7").hex()
    assert _none_hash_in_subprocess(None) != _none_hash_in_subprocess(None)


# ------------------------------------------------------------------------------------------
# hash_block_tokens and the request block hasher
# ------------------------------------------------------------------------------------------


def test_hash_block_tokens_chains_from_none_hash() -> None:
    first = hash_block_tokens(sha256, None, [1, 2])
    assert first == hash_block_tokens(sha256, kv_cache_utils.NONE_HASH, (1, 2))
    assert first == sha256((kv_cache_utils.NONE_HASH, (1, 2), None))
    second = hash_block_tokens(sha256, first, [3, 4])
    assert second == sha256((first, (3, 4), None))


def test_hash_block_tokens_depends_on_parent_tokens_and_extra_keys() -> None:
    base = hash_block_tokens(sha256, None, [1, 2])
    other_parent = hash_block_tokens(sha256, None, [9, 9])
    child = hash_block_tokens(sha256, base, [3, 4])
    assert child != hash_block_tokens(sha256, other_parent, [3, 4])
    assert hash_block_tokens(sha256, None, [2, 1]) != base
    assert hash_block_tokens(sha256, None, [1, 2], ("lora-a",)) != base
    assert hash_block_tokens(sha256, None, range(1, 3)) == base


class FakeRequest:
    """The slice of upstream's Request that the block hasher reads."""

    def __init__(self, token_ids: list[int], block_hasher: Callable) -> None:
        self.all_token_ids = list(token_ids)
        self.cache_salt: str | None = None
        self.block_hashes: list[BlockHash] = []
        self._block_hasher = block_hasher
        self.block_hashes.extend(block_hasher(self))

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)

    def append_output_token_ids(self, token_ids: list[int]) -> None:
        self.all_token_ids.extend(token_ids)
        self.block_hashes.extend(self._block_hasher(self))


def full_chain(token_ids: list[int], block_size: int) -> list[BlockHash]:
    hashes: list[BlockHash] = []
    parent = None
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        parent = hash_block_tokens(sha256, parent, token_ids[start : start + block_size])
        hashes.append(parent)
    return hashes


def test_request_block_hasher_hashes_full_blocks_only() -> None:
    hasher = get_request_block_hasher(4, sha256)
    request = FakeRequest(list(range(10)), hasher)
    assert request.block_hashes == full_chain(list(range(10)), 4)
    assert len(request.block_hashes) == 2
    assert hasher(request) == []  # nothing new until the third block fills


def test_request_block_hasher_is_incremental() -> None:
    hasher = get_request_block_hasher(3, sha256)
    request = FakeRequest([5, 5], hasher)
    assert request.block_hashes == []
    tokens = [5, 5]
    for token in [1, 2, 3, 4, 5, 6, 7]:
        request.append_output_token_ids([token])
        tokens.append(token)
        assert request.block_hashes == full_chain(tokens, 3)
    request.append_output_token_ids([8, 9, 10, 11, 12, 13, 14])  # several blocks at once
    tokens.extend([8, 9, 10, 11, 12, 13, 14])
    assert request.block_hashes == full_chain(tokens, 3)
    assert len(request.block_hashes) == len(tokens) // 3


def test_request_block_hasher_rejects_bad_block_size() -> None:
    with pytest.raises(ValueError, match="block_size"):
        get_request_block_hasher(0, sha256)


# ------------------------------------------------------------------------------------------
# KVCacheBlock
# ------------------------------------------------------------------------------------------


def test_kv_cache_block_defaults_and_slots() -> None:
    block = KVCacheBlock(3)
    assert (block.block_id, block.ref_cnt, block.block_hash, block.is_null) == (3, 0, None, False)
    assert block.prev_free_block is None and block.next_free_block is None
    assert not hasattr(block, "__dict__")
    with pytest.raises(AttributeError):
        block.some_new_attribute = 1  # type: ignore[attr-defined]


def test_kv_cache_block_hash_is_set_once() -> None:
    block = KVCacheBlock(4)
    key = make_block_hash_with_group_id(hash_block_tokens(sha256, None, [1]), 0)
    block.block_hash = key
    assert block.block_hash == key
    with pytest.raises(RuntimeError, match="Block 4 already has a hash"):
        block.block_hash = key
    assert block.block_hash == key
    block.reset_hash()
    assert block.block_hash is None
    block.block_hash = key
    assert block.block_hash == key


def test_kv_cache_block_identity_and_repr() -> None:
    blocks, _ = make_queue(3)
    twin = KVCacheBlock(1)
    assert blocks[1] != twin and blocks[1] == blocks[1]
    assert len({blocks[0], blocks[1], twin}) == 3
    text = repr(blocks[1])  # linked both ways: a recursive repr would never end
    assert "block_id=1" in text and "prev_free_block=0" in text and "next_free_block=2" in text


# ------------------------------------------------------------------------------------------
# FreeKVCacheBlockQueue
# ------------------------------------------------------------------------------------------


def test_queue_starts_in_block_id_order() -> None:
    blocks, queue = make_queue(5)
    assert queue.num_free_blocks == 5
    assert queue_ids(queue) == [0, 1, 2, 3, 4]
    assert queue.get_all_free_blocks() == blocks
    empty = FreeKVCacheBlockQueue([])
    assert empty.num_free_blocks == 0 and empty.get_all_free_blocks() == []
    check_free_queue(empty)


def test_popleft() -> None:
    blocks, queue = make_queue(2)
    assert queue.popleft() is blocks[0]
    assert blocks[0].prev_free_block is None and blocks[0].next_free_block is None
    assert queue_ids(queue) == [1]
    assert queue.popleft() is blocks[1]
    assert queue.num_free_blocks == 0
    with pytest.raises(ValueError, match="No free blocks"):
        queue.popleft()
    check_free_queue(queue)


def test_popleft_n() -> None:
    blocks, queue = make_queue(6)
    assert queue.popleft_n(0) == []
    assert queue.popleft_n(2) == blocks[:2]
    assert all(b.prev_free_block is None and b.next_free_block is None for b in blocks[:2])
    assert queue_ids(queue) == [2, 3, 4, 5]
    with pytest.raises(ValueError, match="Cannot pop 5 blocks from the free queue: only 4"):
        queue.popleft_n(5)
    with pytest.raises(ValueError, match="negative"):
        queue.popleft_n(-1)
    assert queue_ids(queue) == [2, 3, 4, 5]
    assert queue.popleft_n(4) == blocks[2:]
    assert queue_ids(queue) == []


def test_remove_from_anywhere() -> None:
    blocks, queue = make_queue(5)
    queue.remove(blocks[2])
    queue.remove(blocks[0])
    queue.remove(blocks[4])
    assert queue_ids(queue) == [1, 3]
    assert blocks[2].prev_free_block is None and blocks[2].next_free_block is None


def test_remove_of_block_not_in_queue_raises() -> None:
    blocks, queue = make_queue(3)
    queue.remove(blocks[1])
    with pytest.raises(RuntimeError, match="Cannot remove block 1 from the free queue"):
        queue.remove(blocks[1])
    with pytest.raises(RuntimeError, match="not in it"):
        queue.remove(KVCacheBlock(9))
    with pytest.raises(RuntimeError):
        queue.remove(queue.fake_free_list_head)
    assert queue_ids(queue) == [0, 2]


def test_append_and_append_n_keep_order() -> None:
    _, queue = make_queue(6)
    popped = queue.popleft_n(6)
    queue.append(popped[3])
    queue.append_n([popped[5], popped[0]])
    queue.append_n([])
    queue.append_n(iter([popped[1]]))
    assert queue_ids(queue) == [3, 5, 0, 1]
    assert queue.num_free_blocks == 4
    empty_blocks, empty = make_queue(0)
    assert empty_blocks == []
    empty.append_n(popped[2:3])
    assert queue_ids(empty) == [2]


def test_append_of_queued_block_raises_and_keeps_queue() -> None:
    blocks, queue = make_queue(4)
    with pytest.raises(RuntimeError, match="Cannot append block 2 to the free queue"):
        queue.append(blocks[2])
    assert queue_ids(queue) == [0, 1, 2, 3]


def test_append_n_is_all_or_nothing() -> None:
    blocks, queue = make_queue(5)
    a, b, c = queue.popleft_n(3)
    # A block already in the queue, listed after two valid ones.
    with pytest.raises(RuntimeError, match="Cannot append block 4"):
        queue.append_n([a, b, blocks[4]])
    # The same block listed twice.
    with pytest.raises(RuntimeError, match="listed twice"):
        queue.append_n([c, a, c])
    assert queue_ids(queue) == [3, 4]
    for block in (a, b, c):
        assert block.prev_free_block is None and block.next_free_block is None
    queue.append_n([c, b, a])
    assert queue_ids(queue) == [3, 4, 2, 1, 0]


# ------------------------------------------------------------------------------------------
# check_free_queue catches broken lists
# ------------------------------------------------------------------------------------------


def test_check_free_queue_reports_count_mismatch() -> None:
    _, queue = make_queue(5)
    queue.num_free_blocks = 6
    message = "I2 violated: num_free_blocks is 6 but the queue links 5 blocks"
    with pytest.raises(AssertionError, match=message):
        check_free_queue(queue)


def test_check_free_queue_reports_broken_back_link() -> None:
    blocks, queue = make_queue(4)
    blocks[2].prev_free_block = blocks[0]
    message = (
        r"I2 violated: .* pair disagrees \(block 2's prev_free_block is block 0, but "
        "walking forward block 1 comes before it"
    )
    with pytest.raises(AssertionError, match=message):
        check_free_queue(queue)


def test_check_free_queue_reports_cycle_and_break() -> None:
    blocks, queue = make_queue(4)
    blocks[3].next_free_block = blocks[1]
    blocks[1].prev_free_block = blocks[3]
    with pytest.raises(AssertionError, match="I2 violated"):
        check_free_queue(queue)
    blocks, queue = make_queue(3)
    blocks[1].next_free_block = None
    message = (
        r"I2 violated: walking forward from the head sentinel hit None before the tail "
        r"sentinel \(a block's next_free_block was not linked: the walk reached block 1, "
        "whose next_free_block is None"
    )
    with pytest.raises(AssertionError, match=message):
        check_free_queue(queue)


# ------------------------------------------------------------------------------------------
# O(1) per operation
# ------------------------------------------------------------------------------------------


class _AccessCounter:
    count = 0


class CountingBlock(KVCacheBlock):
    """A block that counts every attribute read or write made on it."""

    __slots__ = ()

    def __getattribute__(self, name: str) -> object:
        _AccessCounter.count += 1
        return object.__getattribute__(self, name)

    def __setattr__(self, name: str, value: object) -> None:
        _AccessCounter.count += 1
        object.__setattr__(self, name, value)


def _accesses_per_operation(num_blocks: int) -> list[int]:
    blocks = [CountingBlock(i) for i in range(num_blocks)]
    queue = FreeKVCacheBlockQueue(blocks)
    middle = blocks[num_blocks // 2]
    operations = [
        lambda: queue.remove(middle),
        lambda: queue.append(middle),
        lambda: queue.popleft(),
        lambda: queue.popleft_n(3),
        lambda: queue.append_n([blocks[0], blocks[1], blocks[2]]),
        lambda: queue.remove(blocks[num_blocks // 3]),
    ]
    counts = []
    for operation in operations:
        _AccessCounter.count = 0
        operation()
        counts.append(_AccessCounter.count)
    return counts


def test_queue_operations_touch_a_constant_number_of_blocks() -> None:
    # Counting attribute accesses is exact and immune to machine load: an operation that walks
    # the list would touch more blocks in a bigger queue.
    assert _accesses_per_operation(16) == _accesses_per_operation(4096)


def _best_time_per_op(num_blocks: int, num_ops: int = 2000, repeats: int = 5) -> float:
    blocks = [KVCacheBlock(i) for i in range(num_blocks)]
    queue = FreeKVCacheBlockQueue(blocks)
    targets = [blocks[(i * 7919) % num_blocks] for i in range(num_ops)]
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for block in targets:
            queue.remove(block)
            queue.append(block)
        best = min(best, time.perf_counter() - start)
    return best / num_ops


def test_remove_and_append_time_does_not_grow_with_queue_size() -> None:
    small = _best_time_per_op(100)
    large = _best_time_per_op(100_000)
    # An O(n) removal would be ~1000x slower on the large queue; allow 10x for cache misses and
    # a loaded machine (the best of several repeats filters out most interference).
    assert large < 10 * small + 2e-6, (small, large)


# ------------------------------------------------------------------------------------------
# Stateful test: random operation sequences against a Python list
# ------------------------------------------------------------------------------------------


class FreeQueueMachine(RuleBasedStateMachine):
    """Drives a queue with random operations, mirroring each on a list of block ids."""

    @initialize(num_blocks=st.integers(min_value=0, max_value=10))
    def setup(self, num_blocks: int) -> None:
        self.blocks, self.queue = make_queue(num_blocks)
        self.model: list[int] = list(range(num_blocks))

    def outside(self) -> list[int]:
        return [b.block_id for b in self.blocks if b.block_id not in self.model]

    @rule()
    def popleft(self) -> None:
        if not self.model:
            with pytest.raises(ValueError):
                self.queue.popleft()
            return
        assert self.queue.popleft().block_id == self.model.pop(0)

    @rule(data=st.data())
    def popleft_n(self, data: st.DataObject) -> None:
        n = data.draw(st.integers(min_value=0, max_value=len(self.model) + 1))
        if n > len(self.model):
            with pytest.raises(ValueError):
                self.queue.popleft_n(n)
            return
        assert ids(self.queue.popleft_n(n)) == self.model[:n]
        del self.model[:n]

    @precondition(lambda self: self.model)
    @rule(data=st.data())
    def remove(self, data: st.DataObject) -> None:
        block_id = data.draw(st.sampled_from(self.model))
        self.queue.remove(self.blocks[block_id])
        self.model.remove(block_id)

    @precondition(lambda self: len(self.model) < len(self.blocks))
    @rule(data=st.data())
    def remove_missing(self, data: st.DataObject) -> None:
        block_id = data.draw(st.sampled_from(self.outside()))
        with pytest.raises(RuntimeError):
            self.queue.remove(self.blocks[block_id])

    @precondition(lambda self: len(self.model) < len(self.blocks))
    @rule(data=st.data())
    def append(self, data: st.DataObject) -> None:
        block_id = data.draw(st.sampled_from(self.outside()))
        self.queue.append(self.blocks[block_id])
        self.model.append(block_id)

    @rule(data=st.data())
    def append_n(self, data: st.DataObject) -> None:
        chosen = data.draw(st.permutations(self.outside()))
        chosen = chosen[: data.draw(st.integers(min_value=0, max_value=len(chosen)))]
        self.queue.append_n([self.blocks[i] for i in chosen])
        self.model.extend(chosen)

    @precondition(lambda self: self.model)
    @rule(data=st.data())
    def append_queued_block(self, data: st.DataObject) -> None:
        queued = data.draw(st.sampled_from(self.model))
        batch = [self.blocks[i] for i in self.outside()] + [self.blocks[queued]]
        with pytest.raises(RuntimeError):
            self.queue.append_n(batch)
        with pytest.raises(RuntimeError):
            self.queue.append(self.blocks[queued])

    @invariant()
    def matches_model(self) -> None:
        assert queue_ids(self.queue) == self.model
        assert ids(self.queue.get_all_free_blocks()) == self.model
        for block in self.blocks:
            if block.block_id not in self.model:
                assert block.prev_free_block is None and block.next_free_block is None


FreeQueueMachine.TestCase.settings = settings(
    max_examples=150, stateful_step_count=30, deadline=None, database=None
)
TestFreeQueueMachine = FreeQueueMachine.TestCase


# Digests of block hashes, pinned: a prefix-cache hash must not change with the Python version,
# the platform or a rewrite of the encoder (processes sharing a cache must agree), so any change
# to these is a format change, to be made on purpose and documented. All four are digests of the
# former general encoder, the first three pinned while it was the engine's (its pins of values
# outside the block layout are in test_block_hash_layout.py).
PINNED_SHA256 = [
    ((b"\x00" * 32, tuple(range(16)), None),
     "90dc92bff6494ed310f6e7f17c6418eb2a06c4eea2dc62a163fe799f924c4ce8"),
    ((b"\x01" * 32, (0, 1, 2**40, -5), ("lora", 3)),
     "cff7c0483d0dcd276a180b2e670bc6a2c89d45d31f54f653c5a640ca2f9799da"),
    ("seed-0", "c89768f391c2f49bc29179437b1f4776ba0f7cc5bfe6d0ab5e6c2aed832dce4b"),
    ((bytes(range(32)), (128000, 0, 2**63 - 1, -(2**63)), ("lora-a", "salt-\u00e9", 7)),
     "9f992c8274dfc4d01db73f45df997c8516f6adb8f999d38449a42f58e64d1970"),
]  # fmt: skip


@pytest.mark.parametrize("value, digest", PINNED_SHA256)
def test_sha256_digests_are_pinned(value, digest):
    assert kv_cache_utils.sha256(value).hex() == digest
