"""Contiguous versus paged KV-cache allocation, replayed over a request trace: the file of lab-02.

You write ``ensure`` and ``free`` of both allocators (``ContiguousAllocator``: first fit, reserving
``max_len`` slots, and coalescing on free; ``PagedAllocator``: whole blocks, all or nothing, with
its ``tokens_to_hold``), ``split_held``, the simulation loop ``simulate`` and ``summarize``. The
dataclasses, the constructors, ``held`` / ``num_free_tokens`` / ``largest_free_range``,
``_validate`` and ``compare`` are given. The model the grader holds you to (what a request holds at
each step, the order of events within a step, what each metric divides by) is in this lab's
``README.md``, with a worked example to check your numbers against by hand.

The grader checks the allocators on their own first, then whole simulations step by step, then the
report's ratios and counts, so do the tasks in that order. The file needs only the standard library.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class TraceRequest:
    """One request of a trace.

    Args:
        request_id: Unique name of the request.
        arrival_step: First step at which the request may be admitted.
        prompt_len: Prompt tokens (at least 1).
        output_len: Tokens the request will generate before it stops (at least 1); unknown to
            the allocators, which is the whole problem.
        max_len: Tokens a contiguous allocator reserves for the request (its maximum total
            length); ``None`` means the simulation's ``max_model_len``.
    """

    request_id: str
    arrival_step: int
    prompt_len: int
    output_len: int
    max_len: int | None = None

    @property
    def final_len(self) -> int:
        """The request's length when it finishes: prompt plus every output token."""
        return self.prompt_len + self.output_len


class Allocator(Protocol):
    """What :func:`simulate` needs from an allocator; both allocators below provide it."""

    capacity_tokens: int

    def tokens_to_hold(self, length: int, max_len: int) -> int: ...

    def ensure(self, request_id: str, length: int, max_len: int) -> bool: ...

    def free(self, request_id: str) -> None: ...

    def held(self, request_id: str) -> int: ...

    def num_free_tokens(self) -> int: ...

    def largest_free_range(self) -> int: ...


class ContiguousAllocator:
    """One address space of ``capacity_tokens`` KV slots; each request gets one range.

    A request's range is reserved whole at admission, ``max_len`` slots long, because the
    request may grow up to that and its range cannot move. The range is chosen *first fit*: the
    free range with the lowest start that is long enough. Free ranges are kept sorted by start
    and *coalesced* (no two free ranges touch), so a freed range merges with free neighbours and
    the largest free range is as large as the memory layout allows.

    Attributes:
        free_ranges: ``(start, length)`` of each free range, sorted by start, never touching.
        ranges: ``request_id -> (start, length)`` of each reserved range.
    """

    def __init__(self, capacity_tokens: int) -> None:
        if capacity_tokens < 1:
            raise ValueError(f"capacity_tokens must be positive, got {capacity_tokens}")
        self.capacity_tokens = capacity_tokens
        self.free_ranges: list[tuple[int, int]] = [(0, capacity_tokens)]
        self.ranges: dict[str, tuple[int, int]] = {}

    def tokens_to_hold(self, length: int, max_len: int) -> int:
        """Slots a request of ``length`` tokens holds: its whole maximum, from the start."""
        return max_len

    def ensure(self, request_id: str, length: int, max_len: int) -> bool:
        """Make sure ``request_id`` holds room for ``length`` tokens; False if memory is short.

        The first call reserves ``max_len`` slots in the first free range long enough (the
        range's front part; the rest stays free). Later calls find the range already there.
        Returns False, changing nothing, when no free range is long enough, even if the free
        ranges together would be.

        Raises:
            ValueError: if ``length`` exceeds ``max_len`` (the reservation cannot grow).
        """
        if length > max_len:
            raise ValueError(
                f"request {request_id} needs {length} tokens but reserves only {max_len}"
            )
        if request_id in self.ranges:
            return True
        for i, (start, size) in enumerate(self.free_ranges):
            if size >= max_len:
                self.ranges[request_id] = (start, max_len)
                if size == max_len:
                    del self.free_ranges[i]
                else:
                    self.free_ranges[i] = (start + max_len, size - max_len)
                return True
        return False

    def free(self, request_id: str) -> None:
        """Return the request's range, merging it with the free ranges it touches.

        Raises:
            ValueError: if the request holds no range.
        """
        if request_id not in self.ranges:
            raise ValueError(f"request {request_id} holds no range")
        start, size = self.ranges.pop(request_id)
        i = 0
        while i < len(self.free_ranges) and self.free_ranges[i][0] < start:
            i += 1
        if i < len(self.free_ranges) and start + size == self.free_ranges[i][0]:
            size += self.free_ranges.pop(i)[1]
        if i > 0 and sum(self.free_ranges[i - 1]) == start:
            start, size = self.free_ranges[i - 1][0], self.free_ranges[i - 1][1] + size
            i -= 1
            del self.free_ranges[i]
        self.free_ranges.insert(i, (start, size))

    def held(self, request_id: str) -> int:
        """Slots the request holds (0 if none)."""
        return self.ranges[request_id][1] if request_id in self.ranges else 0

    def num_free_tokens(self) -> int:
        """Free slots in total, whatever their layout."""
        return sum(size for _, size in self.free_ranges)

    def largest_free_range(self) -> int:
        """The longest reservation that could be made now."""
        return max((size for _, size in self.free_ranges), default=0)


class PagedAllocator:
    """The same memory cut into blocks of ``block_size`` slots, handed out as requests grow.

    A request of ``length`` tokens holds ``ceil(length / block_size)`` blocks, anywhere in
    memory: its block table maps its token positions to them, so it never needs one long range
    and never reserves for tokens it has not produced yet. Free blocks are handed out in the order
    they were freed (first in, first out), like vLLM's free block queue.

    Attributes:
        num_blocks: ``capacity_tokens // block_size``.
        free_block_ids: Free blocks, next to hand out first.
        block_tables: ``request_id -> [block ids]`` in token order.
    """

    def __init__(self, capacity_tokens: int, block_size: int) -> None:
        if block_size < 1:
            raise ValueError(f"block_size must be positive, got {block_size}")
        if capacity_tokens < block_size or capacity_tokens % block_size:
            raise ValueError(
                f"capacity_tokens ({capacity_tokens}) must be a positive multiple of "
                f"block_size ({block_size}): both allocators must manage the same memory"
            )
        self.capacity_tokens = capacity_tokens
        self.block_size = block_size
        self.num_blocks = capacity_tokens // block_size
        self.free_block_ids: deque[int] = deque(range(self.num_blocks))
        self.block_tables: dict[str, list[int]] = {}

    def tokens_to_hold(self, length: int, max_len: int) -> int:
        """Slots a request of ``length`` tokens holds: whole blocks covering its tokens."""
        return -(-length // self.block_size) * self.block_size

    def ensure(self, request_id: str, length: int, max_len: int) -> bool:
        """Grow the request's block table to cover ``length`` tokens; False if blocks are short.

        All or nothing: when fewer blocks are free than the request needs, it gets none of them
        (a partial table is useless to it and would starve the others). ``max_len`` is ignored:
        paging never reserves ahead.
        """
        table = self.block_tables.get(request_id, [])
        needed = -(-length // self.block_size) - len(table)
        if needed > len(self.free_block_ids):
            return False
        table = self.block_tables.setdefault(request_id, table)
        for _ in range(needed):
            table.append(self.free_block_ids.popleft())
        return True

    def free(self, request_id: str) -> None:
        """Return every block of the request to the free list.

        Raises:
            ValueError: if the request holds no blocks.
        """
        if request_id not in self.block_tables:
            raise ValueError(f"request {request_id} holds no blocks")
        self.free_block_ids.extend(self.block_tables.pop(request_id))

    def held(self, request_id: str) -> int:
        """Slots the request holds: its blocks times the block size (0 if none)."""
        return len(self.block_tables.get(request_id, ())) * self.block_size

    def num_free_tokens(self) -> int:
        """Free slots: free blocks times the block size."""
        return len(self.free_block_ids) * self.block_size

    def largest_free_range(self) -> int:
        """Any free block serves any request, so all free memory is usable at once."""
        return self.num_free_tokens()


def split_held(current_len: int, final_len: int, held: int) -> tuple[int, int, int]:
    """Split the slots a request holds into ``(used, reserved, internal)``.

    ``used`` slots hold its tokens now; ``reserved`` slots will hold tokens it produces later;
    ``internal`` slots (internal fragmentation) will never hold a token of this request, because
    it finishes at ``final_len`` before filling them. The three add up to ``held``.

    Raises:
        ValueError: if the request holds fewer slots than it has tokens.
    """
    if held < current_len:
        raise ValueError(f"a request of {current_len} tokens cannot live in {held} slots")
    will_fill = min(final_len, held)
    return current_len, will_fill - current_len, held - will_fill


@dataclass(frozen=True)
class StepStats:
    """The memory at one step, measured after growth and admission, before tokens are produced.

    Attributes:
        step: The step index.
        running: Running request ids, in admission order.
        used_tokens: Slots holding tokens (sum of running requests' lengths).
        reserved_tokens: Held slots that running requests will fill later.
        internal_tokens: Held slots that running requests will never fill.
        free_tokens: Slots held by no request.
        largest_free_range: The largest request (in slots) that could be placed now.
        waiting: Requests that had arrived and were still waiting after admission.
        blocked: The waiting request refused this step although ``free_tokens`` was enough for
            it (external fragmentation), else ``None``.
        external_tokens: ``free_tokens`` when ``blocked`` is set, else 0.
        preempted: Requests preempted this step (paged only), in the order they were
            preempted: the most recently admitted first.
    """

    step: int
    running: tuple[str, ...]
    used_tokens: int
    reserved_tokens: int
    internal_tokens: int
    free_tokens: int
    largest_free_range: int
    waiting: int
    blocked: str | None = None
    external_tokens: int = 0
    preempted: tuple[str, ...] = ()

    @property
    def held_tokens(self) -> int:
        """Slots held by running requests: used + reserved + internal."""
        return self.used_tokens + self.reserved_tokens + self.internal_tokens


@dataclass
class Simulation:
    """The outcome of :func:`simulate`: one :class:`StepStats` per step, and when things happened.

    Attributes:
        capacity_tokens: KV slots of the memory simulated.
        steps: Step 0 up to the step the last request finished, idle steps included.
        admitted: ``request_id -> step`` of its first admission.
        finished: ``request_id -> step`` that produced its last token.
        num_preemptions: Preemptions over the whole run.
    """

    capacity_tokens: int
    steps: list[StepStats]
    admitted: dict[str, int]
    finished: dict[str, int]
    num_preemptions: int = 0


def _validate(
    trace: Sequence[TraceRequest], allocator: Allocator, max_model_len: int | None
) -> dict[str, int]:
    """Check the trace; return each request's reservation limit (its ``max_len``)."""
    limits: dict[str, int] = {}
    for req in trace:
        if req.request_id in limits:
            raise ValueError(f"request id {req.request_id!r} appears twice in the trace")
        if req.arrival_step < 0 or req.prompt_len < 1 or req.output_len < 1:
            raise ValueError(
                f"request {req.request_id}: arrival_step must be >= 0, prompt_len "
                "and output_len >= 1"
            )
        limit = req.max_len if req.max_len is not None else max_model_len
        if limit is None:
            raise ValueError(
                f"request {req.request_id} has no max_len and no max_model_len was given"
            )
        if limit < req.final_len:
            raise ValueError(
                f"request {req.request_id} reaches {req.final_len} tokens but its "
                f"maximum length is {limit}"
            )
        if allocator.tokens_to_hold(req.final_len, limit) > allocator.capacity_tokens:
            raise ValueError(
                f"request {req.request_id} could never run: it needs more than the "
                f"{allocator.capacity_tokens} slots of memory"
            )
        limits[req.request_id] = limit
    return limits


def simulate(
    trace: Iterable[TraceRequest], allocator: Allocator, max_model_len: int | None = None
) -> Simulation:
    """Replay ``trace`` step by step on ``allocator``, measuring the memory at every step.

    The order of events within a step is the model of the module docstring (and of lab-02's
    README). Requests that arrive at the same step queue in trace order. The simulation ends
    after the step in which the last request finishes.

    Raises:
        ValueError: for a malformed trace, or a request that could not run even alone.
    """
    trace = list(trace)
    limits = _validate(trace, allocator, max_model_len)
    pending = deque(sorted(trace, key=lambda r: r.arrival_step))
    waiting: deque[TraceRequest] = deque()
    running: list[TraceRequest] = []
    generated = {req.request_id: 0 for req in trace}
    sim = Simulation(allocator.capacity_tokens, [], {}, {})

    def length(req: TraceRequest) -> int:
        return req.prompt_len + generated[req.request_id] + 1

    step = 0
    while pending or waiting or running:
        while pending and pending[0].arrival_step <= step:
            waiting.append(pending.popleft())
        # Running requests grow first; one that cannot preempts the newest (maybe itself).
        preempted: list[str] = []
        i = 0
        while i < len(running):
            req = running[i]
            while not allocator.ensure(req.request_id, length(req), limits[req.request_id]):
                victim = running.pop()
                allocator.free(victim.request_id)
                waiting.appendleft(victim)
                preempted.append(victim.request_id)
                if victim is req:
                    break
            else:
                i += 1
        # Then admission, first come first served, unless memory just ran short.
        blocked = None
        if not preempted:
            while waiting:
                req = waiting[0]
                limit = limits[req.request_id]
                if allocator.ensure(req.request_id, length(req), limit):
                    running.append(waiting.popleft())
                    sim.admitted.setdefault(req.request_id, step)
                    continue
                if allocator.num_free_tokens() >= allocator.tokens_to_hold(length(req), limit):
                    blocked = req.request_id
                if not running:
                    # _validate checked it fits alone: the allocator has lost memory.
                    raise RuntimeError(
                        f"step {step}: request {req.request_id} does not fit in memory that no "
                        f"request holds ({allocator.num_free_tokens()} slots free, largest range "
                        f"{allocator.largest_free_range()}): the allocator lost memory"
                    )
                break
        used = reserved = internal = 0
        for req in running:
            u, r, n = split_held(length(req), req.final_len, allocator.held(req.request_id))
            used, reserved, internal = used + u, reserved + r, internal + n
        free = allocator.num_free_tokens()
        sim.steps.append(
            StepStats(
                step=step,
                running=tuple(r.request_id for r in running),
                used_tokens=used,
                reserved_tokens=reserved,
                internal_tokens=internal,
                free_tokens=free,
                largest_free_range=allocator.largest_free_range(),
                waiting=len(waiting),
                blocked=blocked,
                external_tokens=free if blocked is not None else 0,
                preempted=tuple(preempted),
            )
        )
        sim.num_preemptions += len(preempted)
        # Every running request produces one token; finished ones free their memory.
        for req in list(running):
            generated[req.request_id] += 1
            if generated[req.request_id] == req.output_len:
                running.remove(req)
                allocator.free(req.request_id)
                sim.finished[req.request_id] = step
        step += 1
    return sim


@dataclass(frozen=True)
class FragmentationReport:
    """What a simulation says about memory efficiency, as exact ratios of token-step sums.

    Shares of *held* memory are summed over all steps before dividing, so a step holding twice
    the memory weighs twice as much (a time average of slots, not of per-step percentages).

    Attributes:
        num_steps: Steps simulated.
        token_share: Share of held slot-steps holding tokens (time-averaged).
        token_share_at_peak: ``used / held`` at the first step holding the most memory.
        reserved_share: Share of held slot-steps reserved for tokens produced later.
        internal_fragmentation: Share of held slot-steps that were never filled.
        external_fragmentation: Share of all slot-steps (``capacity * num_steps``) that were
            free while the next request was refused for want of one range long enough.
        max_running: Most requests running in one step.
        mean_running: Mean of running requests over the steps where at least one ran.
        blocked_steps: Steps with a refusal although enough memory was free in total.
        delayed_with_enough_free: Requests refused at least once although enough memory was
            free in total.
        num_preemptions: Preemptions over the run.
    """

    num_steps: int
    token_share: float
    token_share_at_peak: float
    reserved_share: float
    internal_fragmentation: float
    external_fragmentation: float
    max_running: int
    mean_running: float
    blocked_steps: int
    delayed_with_enough_free: int
    num_preemptions: int


def summarize(sim: Simulation) -> FragmentationReport:
    """Reduce a simulation's steps to the numbers of :class:`FragmentationReport`.

    Ratios whose denominator is 0 (nothing ever held, no step) are 0.0.
    """
    steps = sim.steps
    held = sum(s.held_tokens for s in steps)

    def share(part: int, whole: int) -> float:
        return part / whole if whole else 0.0

    peak = max(steps, key=lambda s: s.held_tokens, default=None)
    busy = [len(s.running) for s in steps if s.running]
    return FragmentationReport(
        num_steps=len(steps),
        token_share=share(sum(s.used_tokens for s in steps), held),
        token_share_at_peak=share(peak.used_tokens, peak.held_tokens) if peak else 0.0,
        reserved_share=share(sum(s.reserved_tokens for s in steps), held),
        internal_fragmentation=share(sum(s.internal_tokens for s in steps), held),
        external_fragmentation=share(
            sum(s.external_tokens for s in steps), sim.capacity_tokens * len(steps)
        ),
        max_running=max(busy, default=0),
        mean_running=share(sum(busy), len(busy)),
        blocked_steps=sum(s.blocked is not None for s in steps),
        delayed_with_enough_free=len({s.blocked for s in steps if s.blocked is not None}),
        num_preemptions=sim.num_preemptions,
    )


def compare(
    trace: Iterable[TraceRequest],
    capacity_tokens: int,
    block_size: int,
    max_model_len: int | None = None,
) -> dict[str, FragmentationReport]:
    """Run one trace on both allocators over the same memory.

    Returns ``{"contiguous": report, "paged": report}``.
    """
    trace = list(trace)
    return {
        "contiguous": summarize(
            simulate(trace, ContiguousAllocator(capacity_tokens), max_model_len)
        ),
        "paged": summarize(
            simulate(trace, PagedAllocator(capacity_tokens, block_size), max_model_len)
        ),
    }
