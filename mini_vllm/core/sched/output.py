"""What the scheduler tells the model runner each step, and what it reports back: mirrors
``vllm/v1/core/sched/output.py`` (v0.22.1) and ``EngineCoreOutput`` (``vllm/v1/engine``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from mini_vllm.request import FinishReason

if TYPE_CHECKING:
    from mini_vllm.logprobs import LogprobsLists
    from mini_vllm.request import Request
    from mini_vllm.sampling_params import SamplingParams


@dataclass
class NewRequestData:
    """A request scheduled for the first time, sent whole once. ``block_ids`` includes its
    prefix-cache hits; the runner feeds tokens from ``num_computed_tokens`` (the hit) on."""

    req_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    block_ids: tuple[list[int], ...]
    num_computed_tokens: int

    @classmethod
    def from_request(cls, request: Request, block_ids: tuple[list[int], ...]) -> NewRequestData:
        """Snapshot ``request`` as it is scheduled (before its counters advance)."""
        return cls(
            req_id=request.request_id,
            prompt_token_ids=request.prompt_token_ids,
            sampling_params=request.sampling_params,
            block_ids=block_ids,
            num_computed_tokens=request.num_computed_tokens,
        )


@dataclass
class CachedRequestData:
    """The requests the runner already knows, only the diff, as parallel lists. A running
    request's ``new_block_ids`` (None: none) extend its table; a resumed one's replace it."""

    req_ids: list[str]
    resumed_req_ids: set[str]
    # Tokens fed this step: always filled (upstream: only under pipeline parallelism).
    new_token_ids: list[list[int]]
    # Full token lists of requests not scheduled in the previous step, or resumed.
    all_token_ids: dict[str, list[int]]
    new_block_ids: list[tuple[list[int], ...] | None]
    num_computed_tokens: list[int]  # as scheduled, before this step's tokens are added
    num_output_tokens: list[int]

    @property
    def num_reqs(self) -> int:
        return len(self.req_ids)

    @classmethod
    def make_empty(cls) -> CachedRequestData:
        return cls([], set(), [], {}, [], [], [])


@dataclass
class SchedulerOutput:
    """Everything the model runner needs to execute one step. ``num_scheduled_tokens`` is the
    batch: request id -> tokens to run. Upstream's ``num_common_prefix_blocks`` is left out: no
    runner here does cascade attention."""

    scheduled_new_reqs: list[NewRequestData]
    scheduled_cached_reqs: CachedRequestData
    num_scheduled_tokens: dict[str, int]
    total_num_scheduled_tokens: int
    # Finished since the previous step, and preempted in this one: the runner drops their state.
    finished_req_ids: set[str]
    preempted_req_ids: set[str] = field(default_factory=set)
    scheduled_spec_decode_tokens: dict[str, list[int]] = field(default_factory=dict)  # always {}

    @classmethod
    def make_empty(cls) -> SchedulerOutput:
        return cls([], CachedRequestData.make_empty(), {}, 0, set())


@dataclass(slots=True)
class EngineCoreOutput:
    """What one request produced in one step (new tokens, trimmed at a stop, or its finish);
    one per running request per step, hence ``slots`` (upstream's is a msgspec struct)."""

    request_id: str
    new_token_ids: list[int]
    finish_reason: FinishReason | None = None
    stop_reason: int | str | None = None
    new_logprobs: LogprobsLists | None = None  # set by the engine if the request asked

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None
