"""One generation request, the unit the scheduler and KV cache share: mirrors
``vllm/v1/request.py`` (v0.22.1) and ``FinishReason`` of ``vllm/v1/engine/__init__.py``."""

from __future__ import annotations

import enum
import time
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, overload

from mini_vllm.sampling_params import SamplingParams

if TYPE_CHECKING:
    from mini_vllm.core.kv_cache_utils import BlockHash


class ConstantList(Sequence[int]):
    """A read-only view of a ``Request``'s token list: the token lists and block hashes must
    grow together, through ``Request.append_output_token_ids``. Slicing returns a list copy."""

    __slots__ = ("_x",)

    def __init__(self, x: list[int]) -> None:
        self._x = x

    @overload
    def __getitem__(self, item: int) -> int: ...

    @overload
    def __getitem__(self, item: slice) -> list[int]: ...

    def __getitem__(self, item: int | slice) -> int | list[int]:
        return self._x[item]

    def __len__(self) -> int:
        return len(self._x)

    def __iter__(self) -> Iterator[int]:
        return iter(self._x)

    def __contains__(self, item: object) -> bool:
        return item in self._x

    def __eq__(self, other: object) -> bool:
        if isinstance(other, ConstantList):
            return self._x == other._x
        if isinstance(other, list):
            return self._x == other
        return NotImplemented

    def __repr__(self) -> str:
        return f"ConstantList({self._x})"

    def copy(self) -> list[int]:
        return self._x.copy()

    def _refuse(self, *args: Any, **kwargs: Any) -> None:
        raise TypeError("a Request's token lists are read-only: use append_output_token_ids")

    append = extend = insert = pop = remove = clear = __setitem__ = __delitem__ = _refuse


class FinishReason(enum.IntEnum):
    """Why a request finished, as reported to the client. ``stop``: EOS or a stop token;
    ``length``: ``max_tokens`` or the model's length limit (or a prompt that could never fit)."""

    STOP = 0
    LENGTH = 1
    ABORT = 2
    ERROR = 3
    REPETITION = 4

    def __str__(self) -> str:
        return self.name.lower()


class RequestStatus(enum.IntEnum):
    """Where a request is in its life cycle; every status after ``PREEMPTED`` is finished."""

    WAITING = enum.auto()
    RUNNING = enum.auto()
    PREEMPTED = enum.auto()
    FINISHED_STOPPED = enum.auto()
    FINISHED_LENGTH_CAPPED = enum.auto()
    FINISHED_ABORTED = enum.auto()
    FINISHED_IGNORED = enum.auto()
    FINISHED_ERROR = enum.auto()
    FINISHED_REPETITION = enum.auto()

    def __str__(self) -> str:
        return self.name

    @staticmethod
    def is_finished(status: RequestStatus) -> bool:
        return status > _LAST_UNFINISHED_STATUS

    @staticmethod
    def get_finished_reason(status: RequestStatus) -> FinishReason | None:
        return _FINISHED_REASON_MAP.get(status)


# Bound once (per request per step): before Python 3.12 an Enum member read costs ~0.1 µs.
_LAST_UNFINISHED_STATUS = RequestStatus.PREEMPTED

# An ignored request's prompt was too long: "length", like upstream (and the OpenAI API).
_FINISHED_REASON_MAP = {
    RequestStatus.FINISHED_STOPPED: FinishReason.STOP,
    RequestStatus.FINISHED_LENGTH_CAPPED: FinishReason.LENGTH,
    RequestStatus.FINISHED_ABORTED: FinishReason.ABORT,
    RequestStatus.FINISHED_IGNORED: FinishReason.LENGTH,
    RequestStatus.FINISHED_ERROR: FinishReason.ERROR,
    RequestStatus.FINISHED_REPETITION: FinishReason.REPETITION,
}


class Request:
    """One prompt being generated, with the counters the scheduler steers by: no phase field,
    each step closes the gap between ``num_tokens`` (prompt plus output) and
    ``num_computed_tokens`` (KV in the cache). ``block_hashes`` (of full blocks) grow through
    ``block_hasher`` (none: no prefix caching) as tokens are appended, so prefix lookups never
    rehash the sequence. ``eos_token_id`` defaults to ``sampling_params``'."""

    def __init__(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        sampling_params: SamplingParams,
        eos_token_id: int | None = None,
        arrival_time: float | None = None,
        block_hasher: Callable[[Request], list[BlockHash]] | None = None,
        priority: int = 0,
        cache_salt: str | None = None,
    ) -> None:
        if sampling_params is None:
            raise ValueError(f"request {request_id!r}: sampling_params must be set")
        if not prompt_token_ids:
            raise ValueError(f"request {request_id!r}: the prompt cannot be empty")
        self.request_id = request_id
        self.sampling_params = sampling_params
        self.arrival_time = arrival_time if arrival_time is not None else time.time()
        if isinstance(priority, bool) or not isinstance(priority, int):
            raise TypeError(f"request {request_id!r}: priority must be an int, got {priority!r}")
        self.priority = priority
        # Mixed into the first block's hash, so only requests with the same salt share blocks.
        self.cache_salt = cache_salt
        # Prompt logprobs need every prompt token computed: no prefix-cache hits (upstream's).
        self.skip_reading_prefix_cache = sampling_params.prompt_logprobs is not None

        if eos_token_id is None:
            eos_token_id = sampling_params.eos_token_id
        self.eos_token_id = None if sampling_params.ignore_eos else eos_token_id

        self.status = RequestStatus.WAITING
        # The stop token id (or "repetition_detected") that ended the request.
        self.stop_reason: int | str | None = None
        # None until the scheduler resolves it against max_model_len.
        self.max_tokens: int | None = sampling_params.max_tokens

        self.prompt_token_ids: list[int] = list(prompt_token_ids)
        self.num_prompt_tokens = len(self.prompt_token_ids)
        self._output_token_ids: list[int] = []
        self._all_token_ids: list[int] = self.prompt_token_ids.copy()
        self.output_token_ids = ConstantList(self._output_token_ids)
        self.all_token_ids = ConstantList(self._all_token_ids)

        # Always empty (no speculative decoding); kept so the scheduler reads as upstream's.
        self.spec_token_ids: list[int] = []
        # Tokens a step still on the GPU is sampling (async scheduling), see AsyncScheduler.
        self.num_output_placeholders = 0
        self.num_computed_tokens = 0
        # Scheduled for a non-final prefill chunk: the runner samples no token for it.
        self.is_prefill_chunk = False
        self.num_preemptions = 0

        self.block_hashes: list[BlockHash] = []
        self._block_hasher = block_hasher
        self.update_block_hashes()

    def append_output_token_ids(self, token_ids: int | list[int]) -> None:
        """Append generated token(s) and hash any block they completed."""
        if isinstance(token_ids, int):
            self._output_token_ids.append(token_ids)
            self._all_token_ids.append(token_ids)
        else:
            self._output_token_ids.extend(token_ids)
            self._all_token_ids.extend(token_ids)
        self.update_block_hashes()

    def update_block_hashes(self) -> None:
        """Extend ``block_hashes`` with the hashes of newly completed full blocks."""
        if self._block_hasher is not None:
            self.block_hashes.extend(self._block_hasher(self))

    def __lt__(self, other: Request) -> bool:
        """The priority policy's order: lower ``priority``, earlier arrival, then the request id
        and object identity, so that the heap's order is total."""
        if self.priority != other.priority:
            return self.priority < other.priority
        if self.arrival_time != other.arrival_time:
            return self.arrival_time < other.arrival_time
        if self.request_id != other.request_id:
            return self.request_id < other.request_id
        return id(self) < id(other)

    @property
    def num_tokens(self) -> int:
        return len(self._all_token_ids)

    @property
    def num_tokens_with_spec(self) -> int:
        """``num_tokens`` plus draft tokens (there are none in mini-vLLM)."""
        return len(self._all_token_ids) + len(self.spec_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self._output_token_ids)

    def is_finished(self) -> bool:
        return self.status > _LAST_UNFINISHED_STATUS

    def get_finished_reason(self) -> FinishReason | None:
        """The client-facing finish reason, None while unfinished."""
        return RequestStatus.get_finished_reason(self.status)

    def __repr__(self) -> str:
        return (
            f"Request(id={self.request_id!r}, status={self.status}, "
            f"num_tokens={self.num_tokens}, num_computed_tokens={self.num_computed_tokens}, "
            f"num_output_tokens={self.num_output_tokens})"
        )
