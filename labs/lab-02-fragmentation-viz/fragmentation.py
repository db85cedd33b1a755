# lab-02: write the functions below that raise NotImplementedError.
# Grade your work: make lab-02   Guide: labs/lab-02-fragmentation-viz/README.md
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
        raise NotImplementedError(
            "lab-02: ContiguousAllocator.ensure — first fit: reserve max_len slots at the start "
            "of the lowest free range long enough"
        )

    def free(self, request_id: str) -> None:
        """Return the request's range, merging it with the free ranges it touches.

        Raises:
            ValueError: if the request holds no range.
        """
        raise NotImplementedError(
            "lab-02: ContiguousAllocator.free — give the range back, merging it with the free "
            "ranges it touches"
        )

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
        raise NotImplementedError(
            "lab-02: PagedAllocator.tokens_to_hold — the slots of the whole blocks covering "
            "length tokens"
        )

    def ensure(self, request_id: str, length: int, max_len: int) -> bool:
        """Grow the request's block table to cover ``length`` tokens; False if blocks are short.

        All or nothing: when fewer blocks are free than the request needs, it gets none of them
        (a partial table is useless to it and would starve the others). ``max_len`` is ignored:
        paging never reserves ahead.
        """
        raise NotImplementedError(
            "lab-02: PagedAllocator.ensure — grow the block table to ceil(length / block_size) "
            "blocks, all or nothing"
        )

    def free(self, request_id: str) -> None:
        """Return every block of the request to the free list.

        Raises:
            ValueError: if the request holds no blocks.
        """
        raise NotImplementedError(
            "lab-02: PagedAllocator.free — give every block of the request back to the free "
            "list"
        )

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
    raise NotImplementedError(
        "lab-02: split_held — split the slots a request holds into (used, reserved, internal)"
    )


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
    raise NotImplementedError(
        "lab-02: simulate — replay the trace step by step: arrive, grow (preempt), admit FCFS, "
        "measure, produce, finish"
    )


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
    raise NotImplementedError(
        "lab-02: summarize — reduce the steps to the report's ratios and counts"
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
