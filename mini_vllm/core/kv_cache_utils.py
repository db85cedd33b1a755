"""Building blocks of the paged KV cache: block metadata, the free queue and block hashing.

Mirrors ``vllm/v1/core/kv_cache_utils.py`` at v0.22.1, restricted to what one full-attention
KV cache group needs. Everything here is pure Python on purpose: the allocator is bookkeeping
about *which* GPU pages hold *which* tokens, and never touches the pages themselves.

Prefix caching identifies a full block by a *chained* hash: the hash of a block covers its own
token ids and the hash of the block before it, so equal hashes mean equal whole prefixes, not
merely equal blocks. Two requests that share a system prompt therefore produce the same hashes for
the shared blocks and can share their KV pages.

Its deliberate differences from upstream (each makes misuse loud instead of silent) are listed
in docs/upstream-fidelity.md (module notes).
"""

from __future__ import annotations

import hashlib
import numbers
import os
import struct
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NewType

if TYPE_CHECKING:
    from mini_vllm.request import Request

# A block's prefix-cache identity. A distinct type (rather than plain ``bytes``) lets a type
# checker catch a raw byte string passed where a block hash is expected.
BlockHash = NewType("BlockHash", bytes)

# A block hash plus the KV cache group it belongs to, packed into one ``bytes`` object: the cache
# map is keyed by it, and a flat bytes key is cheaper to hash and to keep than a tuple.
BlockHashWithGroupId = NewType("BlockHashWithGroupId", bytes)

_GROUP_ID_BYTES = 4


def make_block_hash_with_group_id(block_hash: BlockHash, group_id: int) -> BlockHashWithGroupId:
    """Append ``group_id`` to ``block_hash`` as 4 unsigned big-endian bytes.

    Different KV cache groups (e.g. full and sliding-window layers) cache different pages for the
    same tokens, so the group id is part of the cache key; packing it into the bytes keeps the key
    a single immutable object.
    """
    return BlockHashWithGroupId(
        block_hash + group_id.to_bytes(_GROUP_ID_BYTES, "big", signed=False)
    )


def get_block_hash(key: BlockHashWithGroupId) -> BlockHash:
    """Return the block-hash part of a key made by :func:`make_block_hash_with_group_id`."""
    return BlockHash(key[:-_GROUP_ID_BYTES])


def get_group_id(key: BlockHashWithGroupId) -> int:
    """Return the group-id part of a key made by :func:`make_block_hash_with_group_id`."""
    return int.from_bytes(key[-_GROUP_ID_BYTES:], "big", signed=False)


# --------------------------------------------------------------------------------------------
# Hashing
# --------------------------------------------------------------------------------------------

# The block header: tag b"t" (a tuple) and its 3 fields (parent hash, token ids, extra keys).
_BLOCK_HEADER = b"t" + (3).to_bytes(8, "big")


def _sized(tag: bytes, payload: bytes) -> bytes:
    """``tag``, ``payload``'s length as 8 unsigned big-endian bytes, then ``payload``."""
    return tag + len(payload).to_bytes(8, "big") + payload


def _int64s(values: Sequence[int], what: str) -> bytes:
    """``b"q"``, the count (8 bytes), then each value as 8 signed big-endian bytes."""
    try:
        return b"q" + len(values).to_bytes(8, "big") + struct.pack(f">{len(values)}q", *values)
    except struct.error:
        pass
    for value in values:  # the slow path, only to say what is wrong
        if not isinstance(value, numbers.Integral):
            raise TypeError(f"{what} must be integers, got {type(value).__name__} {value!r}")
    raise OverflowError(f"{what} must fit in 64 signed bits, got {list(values)!r}")


def _extra_keys(extra_keys: Sequence[str | int] | None) -> bytes:
    """``b"N"`` for no keys; integers only as one int64 array; else each key with its tag."""
    if extra_keys is None:
        return b"N"
    if not isinstance(extra_keys, tuple | list):
        raise TypeError(f"extra_keys must be a tuple or None, got {type(extra_keys).__name__}")
    if all(type(key) is int for key in extra_keys):
        return _int64s(extra_keys, "integer extra keys")
    parts = [b"t" + len(extra_keys).to_bytes(8, "big")]
    for key in extra_keys:
        if type(key) is str:
            parts.append(_sized(b"s", key.encode("utf-8")))
        elif type(key) is int:
            parts.append(b"i" + key.to_bytes(8, "big", signed=True))
        else:
            raise TypeError(
                f"an extra key must be a str or an int, got {type(key).__name__} {key!r} "
                "(mini-vLLM has no multimodal inputs or prompt embeddings)"
            )
    return b"".join(parts)


def sha256(input: tuple[bytes, Sequence[int], tuple[str | int, ...] | None] | str) -> bytes:
    """SHA-256 of a block ``(parent_hash, token_ids, extra_keys)``, or of a seed string.

    These are the only two things the engine hashes: :func:`hash_block_tokens` passes a block,
    :func:`init_none_hash` the value of ``PYTHONHASHSEED``. Processes that share a prefix cache
    must agree on every hash whatever their Python version or platform, so the bytes hashed
    are a fixed layout, not a pickle (upstream's ``sha256``, whose bytes Python does not
    promise to keep):

    * block: ``b"t"`` + 3, then the parent hash as ``b"b"`` + length + its bytes, the token
      ids as ``b"q"`` + count + one int64 each, and the extra keys: ``b"N"`` for ``None``,
      ``b"q"`` + count + int64s when all are integers, otherwise ``b"t"`` + count and per key
      ``b"s"`` + length + UTF-8 (a string) or ``b"i"`` + int64 (an integer);
    * seed: ``b"s"`` + length + UTF-8.

    Lengths and counts are 8 unsigned big-endian bytes, integers 8 signed big-endian bytes, with
    ``struct``'s standard sizes, never the platform's. Every field is tagged and
    length-prefixed, so different inputs never share bytes: tokens ``(1, 23)`` are not
    ``(12, 3)``. The layout is byte for byte what the engine's former general encoder produced
    for these shapes (``tests/reference/general_hash.py`` keeps it, and a property test compares
    the two), so no hash changed with it. A token id is any integer that fits in 64 bits
    (``struct`` packs a ``bool`` as 0 or 1).

    Raises:
        TypeError: ``input`` has another shape, or a token id or an extra key another type.
        OverflowError: a token id or an integer extra key does not fit in 64 signed bits.
    """
    if type(input) is tuple and len(input) == 3 and type(input[0]) is bytes:
        parent, token_ids, extra_keys = input
        data = b"".join(
            (
                _BLOCK_HEADER,
                _sized(b"b", parent),
                _int64s(token_ids, "token ids"),
                _extra_keys(extra_keys),
            )
        )
    elif type(input) is str:
        data = _sized(b"s", input.encode("utf-8"))
    else:
        raise TypeError(
            "sha256 hashes a block (parent_hash: bytes, token_ids, extra_keys: tuple | None) "
            f"or a seed string, got {type(input).__name__} {input!r:.100}"
        )
    return hashlib.sha256(data).digest()


# The parent hash of the first block of every request. Starting every chain from a seed (instead
# of from nothing) makes it possible for processes to agree on hashes: when PYTHONHASHSEED is set,
# the seed is derived from it, so every process started with the same value computes the same
# block hashes; otherwise it is random, like Python's own ``hash()``, so hashes from unrelated
# processes never match by accident. Read it as ``kv_cache_utils.NONE_HASH``: ``init_none_hash``
# rebinds it, which a name imported with ``from ... import NONE_HASH`` would not see.
NONE_HASH: BlockHash


def init_none_hash(hash_fn: Callable[[Any], bytes]) -> None:
    """(Re)initialise :data:`NONE_HASH` for the hash function the engine will use."""
    global NONE_HASH
    hash_seed = os.getenv("PYTHONHASHSEED")
    if hash_seed is None:
        NONE_HASH = BlockHash(os.urandom(32))
    else:
        NONE_HASH = BlockHash(hash_fn(hash_seed))


init_none_hash(sha256)


def hash_block_tokens(
    hash_function: Callable[[Any], bytes],
    parent_block_hash: BlockHash | None,
    curr_block_token_ids: Sequence[int],
    extra_keys: tuple[Any, ...] | None = None,
) -> BlockHash:
    """Return the chained hash of one full block: its parent's hash, its tokens, its extra keys.

    Chaining is what makes a hit on block ``i`` imply a hit on the whole prefix ``0..i``: the
    same tokens after a different prefix attend to different keys and values, so they must hash
    differently. ``parent_block_hash`` is ``None`` for the first block of a request, which then
    chains from :data:`NONE_HASH`.

    Args:
        hash_function: Maps ``(parent_hash, token_ids, extra_keys)`` to bytes, e.g. :func:`sha256`.
        parent_block_hash: Hash of the previous block, or ``None`` for the first block.
        curr_block_token_ids: The block's token ids; the block is assumed full.
        extra_keys: Anything else that changes the block's KV (adapter, salt, ...), or ``None``.
    """
    if parent_block_hash is None:
        parent_block_hash = NONE_HASH
    return BlockHash(hash_function((parent_block_hash, tuple(curr_block_token_ids), extra_keys)))


def generate_block_hash_extra_keys(
    request: Request, start_token_idx: int, end_token_idx: int, start_mm_idx: int
) -> tuple[tuple[Any, ...] | None, int]:
    """The extra keys of the block ``[start_token_idx, end_token_idx)`` and the next multimodal
    index (always ``start_mm_idx``: mini-vLLM has no multimodal inputs, LoRA adapters or prompt
    embeddings, upstream's other keys).

    The cache salt enters the first block only: every later hash chains through it, so a
    request shares no block with a request of another salt (or none), while the rest of the
    chain costs nothing extra. That is what lets a multi-tenant server stop one tenant from
    timing whether another's prompt is cached.
    """
    if start_token_idx == 0 and request.cache_salt:
        return (request.cache_salt,), start_mm_idx
    return None, start_mm_idx


def get_request_block_hasher(
    block_size: int,
    caching_hash_fn: Callable[[Any], bytes],
) -> Callable[[Request], list[BlockHash]]:
    """Return a function computing a request's not-yet-hashed full-block hashes.

    A request keeps ``block_hashes`` for its full blocks and extends it whenever tokens are
    appended, so each block is hashed exactly once in the request's lifetime, however many
    decode steps it runs. The returned callable reads ``request.all_token_ids``,
    ``request.num_tokens``, ``request.block_hashes`` and ``request.cache_salt`` and returns the
    hashes of the full blocks beyond ``len(request.block_hashes)`` (an empty list when no new
    block is full); the caller appends them.
    """
    if block_size <= 0:
        raise ValueError(f"block_size must be positive, got {block_size}")

    def request_block_hasher(request: Request) -> list[BlockHash]:
        start = len(request.block_hashes) * block_size
        num_tokens = request.num_tokens
        if start + block_size > num_tokens:
            # No new full block: the case of every decode step but one in block_size.
            return []
        parent: BlockHash | None = request.block_hashes[-1] if request.block_hashes else None
        new_hashes: list[BlockHash] = []
        while start + block_size <= num_tokens:
            extra_keys, _ = generate_block_hash_extra_keys(request, start, start + block_size, 0)
            tokens = request.all_token_ids[start : start + block_size]
            parent = hash_block_tokens(caching_hash_fn, parent, tokens, extra_keys)
            new_hashes.append(parent)
            start += block_size
        return new_hashes

    return request_block_hasher


# --------------------------------------------------------------------------------------------
# Block metadata and the free queue
# --------------------------------------------------------------------------------------------


@dataclass(slots=True, eq=False)
class KVCacheBlock:
    """Bookkeeping for one physical KV-cache page (``block_size`` token slots on the GPU).

    One object exists per page for the whole life of the pool, so a request's block table can hold
    the objects themselves and ids never change under a running request. The free-list links live
    on the block (rather than in separate list nodes) so that the free queue can unlink any block
    in O(1) without allocating anything.

    Blocks compare by identity: two block objects are the same block only if they are the same
    object (upstream compares fields).
    """

    # Index of the page in the KV cache tensors, 0 .. num_gpu_blocks - 1.
    block_id: int
    # Number of requests currently using the block; 0 means it is in the free queue.
    ref_cnt: int = 0
    # Cache key (block hash + group id); set only while the block is full and in the prefix cache.
    _block_hash: BlockHashWithGroupId | None = None
    # Free-list links, owned by FreeKVCacheBlockQueue; both None while the block is not queued.
    prev_free_block: KVCacheBlock | None = None
    next_free_block: KVCacheBlock | None = None
    # True only for the pool's null block, a placeholder that is never cached nor handed out.
    is_null: bool = False

    @property
    def block_hash(self) -> BlockHashWithGroupId | None:
        """The cache key of the block, or ``None`` while it is not in the prefix cache."""
        return self._block_hash

    @block_hash.setter
    def block_hash(self, block_hash: BlockHashWithGroupId) -> None:
        # A block's contents only change after it is evicted (reset_hash), so re-hashing a block
        # that still has a hash means two cache entries would describe one page.
        if self._block_hash is not None:
            raise RuntimeError(
                f"Block {self.block_id} already has a hash; call reset_hash() (evict it) before "
                "caching it again"
            )
        self._block_hash = block_hash

    def reset_hash(self) -> None:
        """Forget the block's hash: called when the block leaves the prefix cache."""
        self._block_hash = None

    def __repr__(self) -> str:
        # Show neighbours by id: the default repr would recurse along the whole free list.
        prev_id = self.prev_free_block.block_id if self.prev_free_block is not None else None
        next_id = self.next_free_block.block_id if self.next_free_block is not None else None
        return (
            f"KVCacheBlock(block_id={self.block_id}, ref_cnt={self.ref_cnt}, "
            f"_block_hash={self._block_hash!r}, prev_free_block={prev_id}, "
            f"next_free_block={next_id}, is_null={self.is_null})"
        )


class FreeKVCacheBlockQueue:
    """The free blocks, as a doubly linked list threaded through the blocks themselves.

    Why not ``collections.deque``? A prefix-cache hit revives a free block that may sit anywhere in
    the queue, and a deque can only remove from the middle in O(n). Linking the blocks through
    their own ``prev_free_block``/``next_free_block`` fields makes every operation O(1) per block,
    and, since no node objects are created, the operations allocate no Python objects (apart from
    the list that ``popleft_n`` returns), which keeps them close to deque speed.

    Two sentinel blocks (id -1) bound the list, so every real block always has both neighbours and
    linking code needs no empty-list or end-of-list branches. The sentinels are never returned.

    The order is the eviction order. It starts as block-id order; freed blocks are appended, so
    the least recently used block is at the front. Within one request the caller frees the tail
    of its block chain first (it passes the blocks reversed), so among blocks freed together the
    one covering the longest prefix, the least likely to be shared again, is evicted first. The
    queue itself only keeps the order it is given.

    Args:
        blocks: The initially free blocks, in queue order; they must not be linked anywhere.
    """

    def __init__(self, blocks: list[KVCacheBlock]) -> None:
        self.num_free_blocks = len(blocks)
        self.fake_free_list_head = KVCacheBlock(block_id=-1)
        self.fake_free_list_tail = KVCacheBlock(block_id=-1)
        prev = self.fake_free_list_head
        for block in blocks:
            prev.next_free_block = block
            block.prev_free_block = prev
            prev = block
        prev.next_free_block = self.fake_free_list_tail
        self.fake_free_list_tail.prev_free_block = prev

    def popleft(self) -> KVCacheBlock:
        """Unlink and return the first (next to evict) free block.

        Raises:
            ValueError: if the queue is empty.
        """
        first = self.fake_free_list_head.next_free_block
        if first is None or first is self.fake_free_list_tail:
            raise ValueError("No free blocks available")
        second = first.next_free_block
        if second is None:
            raise RuntimeError(f"Free queue is corrupted: block {first.block_id} has no successor")
        self.fake_free_list_head.next_free_block = second
        second.prev_free_block = self.fake_free_list_head
        first.prev_free_block = first.next_free_block = None
        self.num_free_blocks -= 1
        return first

    def popleft_n(self, n: int) -> list[KVCacheBlock]:
        """Unlink and return the first ``n`` free blocks, in queue order.

        Raises:
            ValueError: if ``n`` is negative or larger than ``num_free_blocks``.
        """
        if n < 0:
            raise ValueError(f"Cannot pop a negative number of blocks ({n})")
        if n > self.num_free_blocks:
            raise ValueError(
                f"Cannot pop {n} blocks from the free queue: only {self.num_free_blocks} are free"
            )
        if n == 0:
            return []
        popped: list[KVCacheBlock] = []
        block = self.fake_free_list_head.next_free_block
        for _ in range(n):
            assert block is not None  # guaranteed by the count check above
            popped.append(block)
            following = block.next_free_block
            block.prev_free_block = block.next_free_block = None
            block = following
        assert block is not None
        self.fake_free_list_head.next_free_block = block
        block.prev_free_block = self.fake_free_list_head
        self.num_free_blocks -= n
        return popped

    def remove(self, block: KVCacheBlock) -> None:
        """Unlink ``block`` from wherever it is in the queue, in O(1).

        Raises:
            RuntimeError: if ``block`` is not linked into a free queue (or is a sentinel).
        """
        prev, following = block.prev_free_block, block.next_free_block
        if prev is None or following is None:
            raise RuntimeError(
                f"Cannot remove block {block.block_id} from the free queue: it is not in it "
                f"(ref_cnt={block.ref_cnt})"
            )
        prev.next_free_block = following
        following.prev_free_block = prev
        block.prev_free_block = block.next_free_block = None
        self.num_free_blocks -= 1

    def append(self, block: KVCacheBlock) -> None:
        """Link ``block`` at the back of the queue (it becomes the last to evict).

        Raises:
            RuntimeError: if ``block`` is already linked into a free queue.
        """
        if block.prev_free_block is not None or block.next_free_block is not None:
            raise RuntimeError(
                f"Cannot append block {block.block_id} to the free queue: it is already in it"
            )
        tail = self.fake_free_list_tail
        last = tail.prev_free_block
        assert last is not None  # the tail sentinel always has a predecessor
        last.next_free_block = block
        block.prev_free_block = last
        block.next_free_block = tail
        tail.prev_free_block = block
        self.num_free_blocks += 1

    def append_n(self, blocks: Iterable[KVCacheBlock]) -> None:
        """Link ``blocks`` at the back of the queue, keeping their order.

        Raises:
            RuntimeError: if a block is already in a free queue or appears twice in ``blocks``;
                the queue is then left as it was.
        """
        tail = self.fake_free_list_tail
        anchor = tail.prev_free_block
        assert anchor is not None  # the tail sentinel always has a predecessor
        last = anchor
        count = 0
        for block in blocks:
            if block.prev_free_block is not None or block.next_free_block is not None:
                self._unlink_after(anchor, count)
                raise RuntimeError(
                    f"Cannot append block {block.block_id} to the free queue: it is already in "
                    "it (or listed twice)"
                )
            last.next_free_block = block
            block.prev_free_block = last
            last = block
            count += 1
        last.next_free_block = tail
        tail.prev_free_block = last
        self.num_free_blocks += count

    def _unlink_after(self, anchor: KVCacheBlock, count: int) -> None:
        """Undo a partial ``append_n``: unlink the ``count`` blocks chained after ``anchor``."""
        block = anchor.next_free_block
        for _ in range(count):
            assert block is not None
            following = block.next_free_block
            block.prev_free_block = block.next_free_block = None
            block = following
        anchor.next_free_block = self.fake_free_list_tail

    def get_all_free_blocks(self) -> list[KVCacheBlock]:
        """Return the free blocks front to back. O(n): meant for tests and debugging."""
        blocks: list[KVCacheBlock] = []
        block = self.fake_free_list_head.next_free_block
        while block is not None and block is not self.fake_free_list_tail:
            blocks.append(block)
            block = block.next_free_block
        return blocks
