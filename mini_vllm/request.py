"""The scheduler's view of one generation request, the unit the scheduler and KV cache share.

Mirrors ``vllm/v1/request.py`` at v0.22.1 (``Request``, ``RequestStatus``) and the
``FinishReason`` of ``vllm/v1/engine/__init__.py``, without the features the course does not
build (pooling, multi-modal inputs, LoRA, structured output, KV transfer, streaming sessions,
speculative decoding beyond an empty ``spec_token_ids``). The scheduler moves
``num_computed_tokens`` forward; the KV cache manager keys the request's blocks by ``request_id``
and reads ``block_hashes`` to find and publish prefix-cache hits.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, overload

from mini_vllm.sampling_params import SamplingParams

if TYPE_CHECKING:
    from mini_vllm.core.kv_cache_utils import BlockHash


class ConstantList(Sequence[int]):
    """A read-only view of a token list owned by a ``Request``.

    ``all_token_ids`` and ``output_token_ids`` must grow together (and the block
    hashes with them), so callers get a view that reads like a list but refuses
    to be mutated; every change goes through ``Request.append_output_token_ids``.
    Slicing returns a plain list copy, which is what hashing a block needs.
    """

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

    __hash__ = None  # type: ignore[assignment]  # mutable underneath: not hashable

    def __repr__(self) -> str:
        return f"ConstantList({self._x})"

    def copy(self) -> list[int]:
        """A mutable copy of the tokens."""
        return self._x.copy()

    def _refuse(self, *args: Any, **kwargs: Any) -> None:
        raise TypeError(
            "token lists of a Request are read-only; use Request.append_output_token_ids"
        )

    append = extend = insert = pop = remove = clear = __setitem__ = __delitem__ = _refuse


class FinishReason(enum.IntEnum):
    """Why a request finished, as reported to the client.

    ``stop``: EOS or a stop token was generated. ``length``: ``max_tokens`` or
    the model's length limit was reached (also for prompts that could never
    fit). ``abort``: the client gave up. ``error``: the engine failed the request.
    ``repetition``: the output ended in a pattern repeated often enough
    (``SamplingParams.repetition_detection``), the usual sign of a model stuck
    in a loop.
    """

    STOP = 0
    LENGTH = 1
    ABORT = 2
    ERROR = 3
    REPETITION = 4

    def __str__(self) -> str:
        return self.name.lower()


class RequestStatus(enum.IntEnum):
    """Where a request is in its life cycle.

    The order matters: every status after ``PREEMPTED`` is a finished one, so
    ``is_finished`` is a single comparison on the hot path of the scheduler.
    """

    WAITING = enum.auto()
    RUNNING = enum.auto()
    PREEMPTED = enum.auto()
    # Everything below is a finished status.
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
        """True for the terminal statuses (those after PREEMPTED)."""
        return status > _LAST_UNFINISHED_STATUS

    @staticmethod
    def get_finished_reason(status: RequestStatus) -> FinishReason | None:
        """The client-facing reason for a terminal status, None otherwise."""
        return _FINISHED_REASON_MAP.get(status)


# Every status after this one is finished. Bound once because the check runs for every request
# of every step, and before Python 3.12 reading a member off an Enum class costs ~0.1 µs (the
# class's metaclass defines __getattr__, which slows every attribute read on it).
_LAST_UNFINISHED_STATUS = RequestStatus.PREEMPTED

# An ignored request had a prompt too long for the model: like upstream (and the
# OpenAI API), that is reported as "length".
_FINISHED_REASON_MAP = {
    RequestStatus.FINISHED_STOPPED: FinishReason.STOP,
    RequestStatus.FINISHED_LENGTH_CAPPED: FinishReason.LENGTH,
    RequestStatus.FINISHED_ABORTED: FinishReason.ABORT,
    RequestStatus.FINISHED_IGNORED: FinishReason.LENGTH,
    RequestStatus.FINISHED_ERROR: FinishReason.ERROR,
    RequestStatus.FINISHED_REPETITION: FinishReason.REPETITION,
}


class Request:
    """One prompt being generated, with the counters the scheduler steers by.

    There is no "prefill phase" or "decode phase" field: a request has
    ``num_tokens`` (prompt plus generated tokens) and ``num_computed_tokens``
    (tokens whose KV is in the cache), and every step the scheduler tries to
    close the gap. A long prompt closes it in several chunks, a decode step
    closes a gap of one, a prefix-cache hit jumps ``num_computed_tokens``
    forward, and a preemption by recompute resets it to zero.

    ``block_hashes`` holds the chained hash of every *full* block of
    ``all_token_ids``. It is extended incrementally (by ``block_hasher``) when
    the request is created and whenever tokens are appended, so that looking up
    and publishing prefix-cache blocks never rehashes the whole sequence.

    Args:
        request_id: Unique id; the KV cache manager keys blocks by it.
        prompt_token_ids: The tokenized prompt (must not be empty).
        sampling_params: How to sample; its ``max_tokens`` may be None, in which
            case the scheduler fills it in from ``max_model_len`` on admission.
        eos_token_id: The model's end-of-sequence token. When None, the
            ``sampling_params.eos_token_id`` set by the engine (if any) is used.
            Ignored under ``sampling_params.ignore_eos``.
        arrival_time: Wall-clock arrival time; defaults to now.
        block_hasher: ``get_request_block_hasher(block_size, hash_fn)``; returns
            the hashes of the full blocks not hashed yet. Needed for prefix
            caching; without it the request never hits nor publishes blocks.
        priority: Under the priority policy, smaller runs first (and is
            preempted last); ignored under FCFS. Any int, negatives included.
    """

    def __init__(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        sampling_params: SamplingParams,
        eos_token_id: int | None = None,
        arrival_time: float | None = None,
        block_hasher: Callable[[Request], list[BlockHash]] | None = None,
        priority: int = 0,
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

        if sampling_params.ignore_eos:
            self.eos_token_id: int | None = None
        elif eos_token_id is not None:
            self.eos_token_id = eos_token_id
        else:
            self.eos_token_id = sampling_params.eos_token_id

        self.status = RequestStatus.WAITING
        # The stop token id that ended the request (None for EOS or length).
        self.stop_reason: int | str | None = None
        # None until the scheduler resolves it against max_model_len.
        self.max_tokens: int | None = sampling_params.max_tokens

        self.prompt_token_ids: list[int] = list(prompt_token_ids)
        self.num_prompt_tokens = len(self.prompt_token_ids)
        self._output_token_ids: list[int] = []
        self._all_token_ids: list[int] = self.prompt_token_ids.copy()
        # Read-only views: the two lists must grow together, see ConstantList.
        self.output_token_ids = ConstantList(self._output_token_ids)
        self.all_token_ids = ConstantList(self._all_token_ids)

        # Draft tokens of speculative decoding; always empty in mini-vLLM but
        # kept so that num_tokens_with_spec reads as upstream's scheduler does.
        self.spec_token_ids: list[int] = []
        # Tokens being sampled by a step still on the GPU (async scheduling only): the
        # scheduler plans the next step as if they were known, see AsyncScheduler.
        self.num_output_placeholders = 0
        self.num_computed_tokens = 0
        # True while the request is scheduled for a non-final prefill chunk: the
        # model runner must not sample a token for it in that step.
        self.is_prefill_chunk = False
        self.num_preemptions = 0

        self.block_hashes: list[BlockHash] = []
        # Stored unbound (not as a bound method) so the request does not hold a
        # reference cycle through its own hasher.
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
        """The priority policy's order: lower ``priority``, then earlier arrival.

        Ties fall back to the request id (and, for one id seen twice, object
        identity) so that the waiting heap never has to compare two requests as
        equal: its order is then total and deterministic.
        """
        if self.priority != other.priority:
            return self.priority < other.priority
        if self.arrival_time != other.arrival_time:
            return self.arrival_time < other.arrival_time
        if self.request_id != other.request_id:
            return self.request_id < other.request_id
        return id(self) < id(other)

    @property
    def num_tokens(self) -> int:
        """Prompt plus generated tokens."""
        return len(self._all_token_ids)

    @property
    def num_tokens_with_spec(self) -> int:
        """``num_tokens`` plus draft tokens (there are none in mini-vLLM)."""
        return len(self._all_token_ids) + len(self.spec_token_ids)

    @property
    def num_output_tokens(self) -> int:
        """Tokens generated so far."""
        return len(self._output_token_ids)

    def is_finished(self) -> bool:
        """True once the request reached a terminal status."""
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
