"""What the scheduler tells the model runner each step, and what it reports back.

Mirrors ``vllm/v1/core/sched/output.py`` at v0.22.1 (``NewRequestData``, ``CachedRequestData``,
``SchedulerOutput``) and the per-request ``EngineCoreOutput`` of ``vllm/v1/engine/__init__.py``,
with upstream's contract: a request's prompt and sampling parameters travel once, in
``NewRequestData``, and afterwards only the diff (new block ids, the computed-token count), in
``CachedRequestData``, so that the model runner reads like upstream's.
"""

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
    """A request the runner has not seen: scheduled for the first time.

    ``num_computed_tokens`` is the prefix already in the KV cache (a prefix-cache
    hit), so the runner feeds tokens from there on. ``block_ids`` is the whole
    block table, hits included.
    """

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
    """The requests the runner already knows, as parallel lists (one entry each).

    Two kinds share these lists. A *running* request continues: its
    ``new_block_ids`` (None when no block was added) are appended to the runner's
    copy of its table. A *resumed* request (in ``resumed_req_ids``) was preempted
    and is being recomputed from scratch: its ``new_block_ids`` replace the old
    table, and ``all_token_ids`` carries its full token list, outputs included.
    """

    req_ids: list[str]
    resumed_req_ids: set[str]
    # The tokens each request feeds to the model this step. Upstream fills this
    # only under pipeline parallelism; mini-vLLM always does, so a simple runner
    # need not keep its own token cache.
    new_token_ids: list[list[int]]
    # Full token lists of requests not scheduled in the previous step.
    all_token_ids: dict[str, list[int]]
    new_block_ids: list[tuple[list[int], ...] | None]
    # Computed-token counts as scheduled (before this step's tokens are added).
    num_computed_tokens: list[int]
    num_output_tokens: list[int]

    @property
    def num_reqs(self) -> int:
        """Number of requests described."""
        return len(self.req_ids)

    @classmethod
    def make_empty(cls) -> CachedRequestData:
        """No cached requests."""
        return cls(
            req_ids=[],
            resumed_req_ids=set(),
            new_token_ids=[],
            all_token_ids={},
            new_block_ids=[],
            num_computed_tokens=[],
            num_output_tokens=[],
        )


@dataclass
class SchedulerOutput:
    """Everything the model runner needs to execute one step.

    ``num_scheduled_tokens`` is the batch: request id -> how many tokens of it
    to run this step (a prefill chunk, a whole prompt, or 1 for a decode).
    Requests that finished or were preempted since the last step are listed so
    the runner can drop their state. Upstream's ``num_common_prefix_blocks``
    (the prefix every request shares, for cascade attention) is left out: no
    runner here does cascade attention, so no step should pay to count it.
    """

    scheduled_new_reqs: list[NewRequestData]
    scheduled_cached_reqs: CachedRequestData
    num_scheduled_tokens: dict[str, int]
    # Equal to sum(num_scheduled_tokens.values()); never above the token budget.
    total_num_scheduled_tokens: int
    # Requests finished between the previous step and this one.
    finished_req_ids: set[str]
    # Requests preempted (blocks freed, back to waiting) in this step.
    preempted_req_ids: set[str] = field(default_factory=set)
    # Always empty: mini-vLLM has no speculative decoding.
    scheduled_spec_decode_tokens: dict[str, list[int]] = field(default_factory=dict)

    @classmethod
    def make_empty(cls) -> SchedulerOutput:
        """A step with nothing scheduled."""
        return cls(
            scheduled_new_reqs=[],
            scheduled_cached_reqs=CachedRequestData.make_empty(),
            num_scheduled_tokens={},
            total_num_scheduled_tokens=0,
            finished_req_ids=set(),
        )


@dataclass(slots=True)
class EngineCoreOutput:
    """What one request produced in one step, for the client side.

    Emitted when a request got new tokens or finished; a request in the middle
    of its prefill produces nothing. ``new_token_ids`` is trimmed at the token
    that stopped the request. One is built per running request per step, hence
    ``slots`` (cheaper to create; upstream's is a msgspec struct).
    """

    request_id: str
    new_token_ids: list[int]
    finish_reason: FinishReason | None = None
    # The stop token id that ended the request, when one did.
    stop_reason: int | str | None = None
    # The logprob rows of new_token_ids (added by the engine when the request asked for them).
    new_logprobs: LogprobsLists | None = None

    @property
    def finished(self) -> bool:
        """Whether this is the request's last output."""
        return self.finish_reason is not None
