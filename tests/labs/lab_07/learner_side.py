"""lab-07's helpers in the learner process: build requests, drive a manager, read its state.

The grader copies this file into the learner's sandbox as the top-level module ``learner_side``.
The judge also imports it itself and runs the same :class:`Driver` on the reference manager, as
an oracle: both sides then perform exactly the same operations and report what they saw as plain
data (lists of block ids, ref counts, hashes), which the judge compares.

Nothing here decides anything: no assertion, no expected value. Each helper builds an object,
runs the operations the judge names, or extracts data. It imports only ``mini_vllm`` pieces that
lab-07 does not grade (the request, hashing, the invariants' link walker), never the reference
manager.
"""

from __future__ import annotations

from typing import Any

from mini_vllm.core.kv_cache_utils import hash_block_tokens, sha256
from mini_vllm.request import Request
from mini_vllm.sampling_params import SamplingParams
from mini_vllm.teaching.invariants import walk_links

BS = 4
#: The parent hash of every request's first block. Fixed (instead of ``NONE_HASH``, which is
#: random unless PYTHONHASHSEED is set), so the judge and the learner process agree on hashes.
ROOT = sha256("mini-vllm lab-07 root")


def block_hasher(block_size: int = BS) -> Any:
    """Upstream's request block hasher (chained sha256 of full blocks), chained from ``ROOT``."""

    def hasher(request: Request) -> list[bytes]:
        start = len(request.block_hashes) * block_size
        parent = request.block_hashes[-1] if request.block_hashes else ROOT
        new: list[bytes] = []
        while start + block_size <= request.num_tokens:
            parent = hash_block_tokens(
                sha256, parent, request.all_token_ids[start : start + block_size]
            )
            new.append(parent)
            start += block_size
        return new

    return hasher


def make_request(request_id: str, tokens: list[int], block_size: int = BS) -> Request:
    """A request whose full blocks are hashed (chained) as its tokens arrive."""
    return Request(
        request_id,
        list(tokens),
        SamplingParams(max_tokens=1000),
        block_hasher=block_hasher(block_size),
    )


def block_ids(kv_blocks: Any) -> list[Any] | None:
    """The ids in a ``KVCacheBlocks`` (its first group); None for None."""
    if kv_blocks is None:
        return None
    return [blk.block_id for blk in kv_blocks.blocks[0]]


#: The fields of a state snapshot, in the order ``snapshot`` lists them.
STATE_KEYS = (
    "num_gpu_blocks",
    "block_id",
    "ref_cnt",
    "hash",
    "is_null",
    "linked",
    "null",
    "head_prev",
    "tail_next",
    "forward",
    "forward_end",
    "backward",
    "backward_end",
    "num_free_blocks",
    "get_num_free_blocks",
    "cache_map",
    "tables",
    "num_cached_block",
)


def _pairs(mapping: Any) -> list[tuple[Any, Any]]:
    """A mapping's ``(key, value)`` pairs, read by ``dict``'s own ``items`` (any ``dict``,
    ``defaultdict`` included); anything else comes back as one pair naming its type, which no
    state of the reference has. A subclass answers ``items`` as it likes: one that left out a
    refused request's empty table hid the refusal's trace from every state read
    (tests/hostile/hide_the_empty_tables_from_items.py)."""
    if isinstance(mapping, dict):
        return list(dict.items(mapping))
    return [(f"a {type(mapping).__name__}, not a dict", [])]


def _elements(seq: Any) -> list[Any]:
    """A list's elements, read by ``list``'s own iteration (any other sequence by its own)."""
    return list(list.__iter__(seq)) if isinstance(seq, list) else list(seq)


def snapshot(mgr: Any) -> list[Any]:
    """The manager and its pool as data, a list in the order of ``STATE_KEYS`` (plain lists
    cross to the judge fastest; ``expand`` names the fields). Blocks are named by their position
    in ``pool.blocks``, found by identity (-1 for an object that is not one of the pool's
    blocks); mappings are lists of ``[key, value]`` pairs."""
    pool = mgr.block_pool
    blocks = _elements(pool.blocks)
    where = {id(blk): i for i, blk in enumerate(blocks)}
    queue = pool.free_block_queue
    head, tail = queue.fake_free_list_head, queue.fake_free_list_tail
    forward, forward_end = walk_links(head, tail, "next_free_block", len(blocks) + 2)
    backward, backward_end = walk_links(tail, head, "prev_free_block", len(blocks) + 2)
    cache_map = getattr(getattr(pool, "cached_block_hash_to_block", None), "_cache", None)
    entries = None
    if cache_map is not None:
        entries = []
        for key, value in _pairs(cache_map):
            filed = _pairs(value) if isinstance(value, dict) else [(None, value)]
            for block_id, blk in filed:
                entries.append([key, block_id, where.get(id(blk), -1)])
    return [
        pool.num_gpu_blocks,
        [blk.block_id for blk in blocks],
        [blk.ref_cnt for blk in blocks],
        [blk.block_hash for blk in blocks],
        [blk.is_null for blk in blocks],
        [blk.prev_free_block is not None or blk.next_free_block is not None for blk in blocks],
        where.get(id(pool.null_block), -1),
        head.prev_free_block is not None,
        tail.next_free_block is not None,
        [where.get(id(blk), -1) for blk in forward],
        forward_end,
        [where.get(id(blk), -1) for blk in reversed(backward)],
        backward_end,
        queue.num_free_blocks,
        pool.get_num_free_blocks(),
        entries,
        [
            [rid, [where.get(id(blk), -1) for blk in _elements(blocks)]]
            for rid, blocks in _pairs(mgr.req_to_blocks)
        ],
        [[rid, n] for rid, n in _pairs(mgr.num_cached_block)],
    ]


def expand(snap: list[Any]) -> dict[str, Any]:
    """A snapshot (from ``snapshot`` plus the requests' progress) as a dict of named fields."""
    state = dict(zip((*STATE_KEYS, "progress"), snap, strict=True))
    state["tables"] = {rid: ids for rid, ids in state["tables"]}
    state["num_cached_block"] = {rid: n for rid, n in state["num_cached_block"]}
    state["progress"] = {rid: p for rid, p in state["progress"]}
    return state


class Driver:
    """One manager and the requests it serves, driven the way the judge says.

    Every method performs the named calls on the manager and returns what came back as data.
    After an allocation that succeeded, the request's ``num_computed_tokens`` moves forward as
    the scheduler would move it; nothing else is decided here.
    """

    def __init__(self, mgr: Any, block_size: int = BS) -> None:
        self.mgr = mgr
        self.block_size = block_size
        self.requests: dict[str, Request] = {}
        self.hits: dict[str, tuple[Any, int]] = {}

    # -- requests ---------------------------------------------------------------------------
    def add(self, request_id: str, tokens: list[int]) -> Request:
        req = make_request(request_id, tokens, self.block_size)
        self.requests[request_id] = req
        return req

    def add_unhashed(self, request_id: str, tokens: list[int]) -> None:
        """A request built without a ``block_hasher``: it has no ``block_hashes``."""
        self.requests[request_id] = Request(
            request_id, list(tokens), SamplingParams(max_tokens=1000)
        )

    def arrive(self, request_id: str, tokens: list[int]) -> None:
        """``add``, returning nothing (a replayed operation)."""
        self.add(request_id, tokens)

    def progress(self) -> list[list[Any]]:
        """Per request: [request id, [num_tokens, num_computed_tokens, num_preemptions]]."""
        return [
            [rid, [req.num_tokens, req.num_computed_tokens, req.num_preemptions]]
            for rid, req in self.requests.items()
        ]

    # -- the scheduler's calls ----------------------------------------------------------------
    def lookup(self, request_id: str) -> list[Any]:
        """``get_computed_blocks``: [hit block ids, hit tokens]; the hits are kept for the next
        ``allocate`` of this request."""
        hits, num_hit = self.mgr.get_computed_blocks(self.requests[request_id])
        self.hits[request_id] = (hits, num_hit)
        return [block_ids(hits), num_hit]

    def allocate(
        self, request_id: str, num_new: int, lookahead: int = 0, gate: bool = False
    ) -> list[Any] | None:
        """``allocate_slots`` with the hits of the last ``lookup`` (if any): the new block ids,
        or None. ``gate`` passes ``full_sequence_must_fit=True`` (the admission gate)."""
        req = self.requests[request_id]
        hits, num_hit = self.hits.pop(request_id, (None, 0))
        extra = {"full_sequence_must_fit": True} if gate else {}
        if hits is None:
            new = self.mgr.allocate_slots(req, num_new, num_lookahead_tokens=lookahead, **extra)
        else:
            new = self.mgr.allocate_slots(req, num_new, num_hit, hits, lookahead, **extra)
        if new is not None:
            req.num_computed_tokens = req.num_computed_tokens + num_hit + num_new
        return block_ids(new)

    def admit(
        self, request_id: str, num_new: int | None = None, lookahead: int = 0, gate: bool = False
    ) -> dict[str, Any]:
        """``lookup`` then ``allocate`` of ``num_new`` tokens (default: all the rest), through
        the admission gate if ``gate``. The allocation is not attempted when nothing is left
        to compute."""
        hit, num_hit = self.lookup(request_id)
        if num_new is None:
            num_new = self.requests[request_id].num_tokens - num_hit
        if num_new <= 0:
            self.hits.pop(request_id, None)
            return {"hit": hit, "num_hit": num_hit, "new": None, "tried": False}
        new = self.allocate(request_id, num_new, lookahead, gate)
        return {"hit": hit, "num_hit": num_hit, "new": new, "tried": True}

    def publish(self, request_id: str, num_computed_tokens: int) -> None:
        """``cache_blocks`` called directly, as the async scheduler does."""
        self.mgr.cache_blocks(self.requests[request_id], num_computed_tokens)

    def append(self, request_id: str, token: int) -> None:
        self.requests[request_id].append_output_token_ids(token)

    def decode_many(self, request_id: str, tokens: list[int]) -> list[Any]:
        """One :meth:`decode` per token, in one request (the judge times it): the new block
        ids of each step."""
        return [self.decode(request_id, token) for token in tokens]

    def counted_lookup(self, request_id: str) -> list[Any]:
        """:meth:`lookup`, with the pool's lookups it made counted: [hit block ids, hit tokens,
        calls]. Counted on the classes, of the pool (``get_cached_block``) and of its hash map
        (``get_one_block``, which each ``get_cached_block`` of one group calls once), the larger
        count: a wrapper on the pool object is skipped by a call through its class
        (tests/hostile/look_the_hashes_up_through_the_pools_class.py). Every class of the
        object's method resolution order that defines the method gets the wrapper, the type's
        bases too: on the type alone, a pool or map of an empty subclass whose search called
        the base class's function went uncounted
        (tests/hostile/lab_07_look_up_through_the_base_class.py). A call made inside a counted
        one (a subclass's method calling its base's) counts once; and every call of the course's
        own function (the last definition in the order) is counted apart, nested or not, the
        larger count kept: a subclass whose first lookup made all the others through the base
        class's function, inside the one call counted, went uncounted
        (tests/hostile/lab_07_look_up_inside_one_counted_call.py)."""
        pool = self.mgr.block_pool
        counts: list[int] = []
        patched: list[tuple[type, str, Any]] = []
        for owner, name in (
            (pool, "get_cached_block"),
            (getattr(pool, "cached_block_hash_to_block", None), "get_one_block"),
        ):
            if owner is None:
                continue
            counts.extend((0, 0))  # outermost calls, calls of the course's own function
            index = len(counts) - 2
            depth = [0]
            defining = [
                c for c in type(owner).__mro__ if c is not object and callable(c.__dict__.get(name))
            ]
            for cls in defining:
                original = cls.__dict__[name]

                def counting(
                    *args: Any,
                    _f: Any = original,
                    _i: int = index,
                    _d: list[int] = depth,
                    _own: bool = cls is defining[-1],
                    **kwargs: Any,
                ) -> Any:
                    if _d[0] == 0:
                        counts[_i] += 1
                    if _own:
                        counts[_i + 1] += 1
                    _d[0] += 1
                    try:
                        return _f(*args, **kwargs)
                    finally:
                        _d[0] -= 1

                patched.append((cls, name, original))
                setattr(cls, name, counting)
        try:
            hit, num_hit = self.lookup(request_id)
        finally:
            for cls, name, own in reversed(patched):
                setattr(cls, name, own)
        return [hit, num_hit, max(counts, default=0)]

    def decode(self, request_id: str, token: int) -> list[Any] | None:
        """Append a sampled token and give it a slot: one decode step."""
        self.append(request_id, token)
        return self.allocate(request_id, 1)

    def free(self, request_id: str, preempt: bool = False) -> None:
        """``free``; with ``preempt`` the request then starts over (recompute), as the scheduler
        resets a preempted request."""
        req = self.requests[request_id]
        self.hits.pop(request_id, None)
        self.mgr.free(req)
        if preempt:
            req.num_computed_tokens = 0
            req.num_preemptions += 1

    def stats(self) -> list[Any] | None:
        """``make_prefix_cache_stats`` as its counters, or None."""
        stats = self.mgr.make_prefix_cache_stats()
        if stats is None:
            return None
        return [
            stats.requests,
            stats.queries,
            stats.hits,
            stats.preempted_requests,
            stats.preempted_queries,
            stats.preempted_hits,
        ]

    def usage(self) -> Any:
        return self.mgr.usage

    def get_block_ids(self, request_id: str) -> Any:
        return self.mgr.get_block_ids(request_id)

    # -- reading ---------------------------------------------------------------------------
    def snapshot(self) -> list[Any]:
        """The manager's state and the requests' progress, as ``expand`` reads it."""
        return [*snapshot(self.mgr), self.progress()]

    def state(self) -> dict[str, Any]:
        """The same, as a dict of named fields."""
        return expand(self.snapshot())

    def replay(self, plan: list[list[Any]]) -> list[list[Any]]:
        """Run the operations of ``plan`` (``[name, *args]``, names from ``REPLAYABLE``) in
        order. For each: ``["ok", what it returned, the snapshot after it]``. At the first
        exception the list ends with ``["raised", type name, message]``; NotImplementedError
        (a method not written yet) propagates."""
        seen: list[list[Any]] = []
        for name, *args in plan:
            if name not in REPLAYABLE:
                seen.append(["raised", "KeyError", f"no operation {name!r}"])
                break
            try:
                result = getattr(self, name)(*args)
            except NotImplementedError:
                raise
            except Exception as exc:
                seen.append(["raised", type(exc).__name__, _message(exc)])
                break
            seen.append(["ok", result, self.snapshot()])
        return seen


REPLAYABLE = frozenset(
    {"arrive", "lookup", "allocate", "append", "free", "stats", "usage", "get_block_ids"}
)


def _message(exc: BaseException) -> str:
    try:
        return str(exc)[:500]
    except Exception:
        return "<no readable message>"
