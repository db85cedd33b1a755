# lab-10: write the functions below that raise NotImplementedError.
# Grade your work: make lab-10   Guide: labs/lab-10-serving/README.md
"""The output processor, incremental detokenization, stop strings and aborts: the file of lab-10.

The engine core sends token ids; a client wants text. ``IncrementalDetokenizer`` turns a request's
growing list of token ids into text deltas that stay correct when a character is split across
tokens, and ``check_stop_strings`` finds stop strings that span tokens; ``OutputProcessor`` runs one
detokenizer per request, decides its finish reason, tells the caller which requests the core must
abort (``reqs_to_abort``) and forgets every request exactly once. You write ``_decode_next``,
``update``, ``flush``, ``get_next_output_text``, ``check_stop_strings``, ``abort_requests`` and
``process_outputs``; the rest is given (read ``IncrementalDetokenizer.__init__`` first). The engine
keeps these in two modules, ``mini_vllm/engine/detokenizer.py`` and
``mini_vllm/engine/output_processor.py``, as vLLM does; here they share one file so that you edit
one file.

``process_outputs`` works in four stages, one ``EngineCoreOutput`` at a time: (1) the request's new
token ids go through its detokenizer; (2) a stop string found in the new text finishes the request
here, with finish reason ``stop`` and the string as ``stop_reason``, and unless the core finished it
in the same step its id goes into ``reqs_to_abort``; then its logprob rows go to its
``LogprobsProcessor``; (3) a ``RequestOutput`` (a delta when streaming, the whole text so far
otherwise) is put on the request's queue; (4) a finished request is dropped from ``request_states``
(with ``iteration_stats``, ``_update_stats`` and ``_record_finished`` record the timing of its
tokens for the metrics). ``abort_requests`` and ``process_outputs`` both tolerate ids already gone:
a step's outputs may still be on the wire when an abort crosses them. The grader's oracle is a toy
tokenizer's decode of the whole sequence: however the tokens are cut into steps, your deltas must
add up to it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from mini_vllm.engine import EngineCoreEventType
from mini_vllm.engine.logprobs import LogprobsProcessor
from mini_vllm.metrics.stats import FinishedRequestStats, IterationStats, ParentRequestStats
from mini_vllm.outputs import CompletionOutput, RequestOutput

if TYPE_CHECKING:  # annotations only: the engine core's module needs the serve extra (pyzmq)
    from mini_vllm.engine.core import EngineCoreOutput, EngineCoreRequest

# How many prompt tokens seed the window: enough context for SentencePiece's leading-space
# rule and for a character split across the prompt/output boundary (upstream uses 5 too).
INITIAL_INCREMENTAL_DETOKENIZATION_OFFSET = 5
REPLACEMENT_CHAR = "\ufffd"


class IncrementalDetokenizer:
    """Turns a growing list of token ids into text deltas, correct across split characters.

    The prompt's last few tokens seed the window (the first output token decodes in context) and
    are never part of the output; ``tokenizer.decode`` is the only tokenizer call. The output is
    cut before the first stop string found (after it, with ``include_stop_str_in_output``); as
    upstream, none is looked for before ``min_tokens`` output tokens, nor in their text (what
    the finish flushes of it included).
    """

    def __init__(
        self,
        tokenizer: Any,
        prompt_token_ids: Sequence[int] = (),
        *,
        skip_special_tokens: bool = True,
        stop: Sequence[str] = (),
        include_stop_str_in_output: bool = False,
        min_tokens: int = 0,
    ) -> None:
        self.tokenizer = tokenizer
        self.min_tokens = min_tokens
        self.skip_special_tokens = skip_special_tokens
        self.stop = [s for s in stop if s]
        self.include_stop_str_in_output = include_stop_str_in_output
        # Hold back characters that may be the start of a stop string (streaming only).
        self.stop_buffer_length = (
            max((len(s) for s in self.stop), default=1) - 1 if not include_stop_str_in_output else 0
        )
        context = list(prompt_token_ids[-INITIAL_INCREMENTAL_DETOKENIZATION_OFFSET:])
        self.tokens: list[int] = context
        self.prefix_offset = 0
        self.read_offset = len(context)
        self.output_token_ids: list[int] = []
        self.output_text = ""
        self._num_sent_chars = 0  # of output_text already handed out as deltas (delta=True)

    def _decode(self, token_ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(token_ids), skip_special_tokens=self.skip_special_tokens)

    def _decode_next(self, flush: bool = False) -> str:
        """The text the tokens after ``read_offset`` add to the window, or "" if incomplete."""
        raise NotImplementedError(
            "lab-10: IncrementalDetokenizer._decode_next — decode the window without and with "
            "the new tokens; emit what they added unless it ends in U+FFFD (then hold it back), "
            "and slide the offsets"
        )

    def update(
        self, new_token_ids: Sequence[int], finished: bool = False, stop_terminated: bool = False
    ) -> str | None:
        """Add one step's tokens; return the stop string that ended the text, if any (then
        ``output_text`` is cut at it, and the caller must finish the request).

        ``stop_terminated``: the engine stopped on the last token (EOS or a stop token id); as
        upstream, that token's text is left out unless ``include_stop_str_in_output``.
        """
        raise NotImplementedError(
            "lab-10: IncrementalDetokenizer.update — decode one step's tokens one at a time "
            "(leave out a stop-terminated last token's text), flush at the end, then look for a "
            "stop string in the new text (none within the first min_tokens tokens' text) and "
            "cut there"
        )

    def flush(self) -> str:
        """Emit whatever is still held back (an incomplete character decodes as U+FFFD)."""
        raise NotImplementedError(
            "lab-10: IncrementalDetokenizer.flush — emit whatever is still held back, an "
            "incomplete character as U+FFFD"
        )

    def get_next_output_text(self, finished: bool, delta: bool) -> str:
        """The text to send now: new characters since the last call (``delta``) or all of it.

        While unfinished, the last ``stop_buffer_length`` characters are withheld: they may start
        a stop string, and text once streamed cannot be taken back.
        """
        raise NotImplementedError(
            "lab-10: IncrementalDetokenizer.get_next_output_text — the characters not handed "
            "out yet (or all of them), withholding the last stop_buffer_length while unfinished"
        )


def check_stop_strings(
    output_text: str, new_char_count: int, stop: Sequence[str], include_in_output: bool
) -> tuple[str, int] | None:
    """Find a stop string that the last ``new_char_count`` characters completed.

    Only a match ending in the new characters is new (an earlier one stopped the request a step
    ago), so the search starts ``len(stop_str) - 1`` characters before the new text; of several,
    the one that starts first wins. Returns ``(stop_str, truncate_to)``: cut the output to
    ``truncate_to`` characters (-1: nothing to cut); None when no stop string was found.
    """
    raise NotImplementedError(
        "lab-10: check_stop_strings — search only the tail the new characters could have "
        "completed; the match that starts first wins; say where to cut"
    )


@dataclass
class RequestState:
    """The front-end's record of one request between ``add_request`` and its last output."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    detokenizer: IncrementalDetokenizer
    logprobs_processor: LogprobsProcessor
    queue: asyncio.Queue[RequestOutput | BaseException]
    stream: bool
    arrival_time: float
    max_tokens_param: int | None = None
    parent: ParentRequestStats | None = None  # the prompt's n samples (None: n = 1)
    # The core's stamps (EngineCoreEvent), 0.0 until they arrive with the first output.
    queued_ts: float = 0.0
    scheduled_ts: float = 0.0
    first_token_time: float | None = None
    last_token_time: float | None = None
    num_generation_tokens: int = 0
    num_cached_tokens: int = 0
    # Output tokens already streamed: a step whose text is held back sends its tokens later.
    sent_tokens_offset: int = 0


@dataclass
class OutputProcessorOutput:
    """``reqs_to_abort``: finished here by a stop string, still running in the core."""

    reqs_to_abort: list[str] = field(default_factory=list)


class OutputProcessor:
    """Per-request detokenization, stop strings, finish reasons and abort bookkeeping."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.request_states: dict[str, RequestState] = {}

    def get_num_unfinished_requests(self) -> int:
        return len(self.request_states)

    def has_unfinished_requests(self) -> bool:
        return bool(self.request_states)

    def add_request(
        self,
        request: EngineCoreRequest,
        prompt: str | None,
        *,
        stop: Sequence[str] = (),
        include_stop_str_in_output: bool = False,
        skip_special_tokens: bool = True,
        stream: bool = False,
        arrival_time: float | None = None,
        parent: ParentRequestStats | None = None,
    ) -> asyncio.Queue[RequestOutput | BaseException]:
        """Track a request about to be sent to the core; return the queue its outputs go to.
        ``parent`` groups the samples of one prompt for the metrics (the server's ``n``)."""
        if request.request_id in self.request_states:
            raise ValueError(f"request id {request.request_id!r} is already in use")
        queue: asyncio.Queue[RequestOutput | BaseException] = asyncio.Queue()
        self.request_states[request.request_id] = RequestState(
            request_id=request.request_id,
            prompt=prompt,
            prompt_token_ids=list(request.prompt_token_ids),
            detokenizer=IncrementalDetokenizer(
                self.tokenizer,
                request.prompt_token_ids,
                skip_special_tokens=skip_special_tokens,
                stop=stop,
                include_stop_str_in_output=include_stop_str_in_output,
                min_tokens=request.sampling_params.min_tokens,
            ),
            logprobs_processor=LogprobsProcessor(
                self.tokenizer,
                request.sampling_params.logprobs,
                request.sampling_params.prompt_logprobs,
            ),
            queue=queue,
            stream=stream,
            arrival_time=arrival_time if arrival_time is not None else time.monotonic(),
            max_tokens_param=request.sampling_params.max_tokens,
            parent=parent,
        )
        return queue

    def abort_requests(self, request_ids: Sequence[str]) -> list[str]:
        """Forget the requests (client gone); return the ids that were still tracked."""
        raise NotImplementedError(
            "lab-10: OutputProcessor.abort_requests — forget the tracked ids, ignore the "
            "others, return the ones that were tracked"
        )

    def propagate_error(self, error: BaseException) -> None:
        """Fail every tracked request with ``error`` (the engine core died)."""
        for state in self.request_states.values():
            state.queue.put_nowait(error)
        self.request_states.clear()

    def process_outputs(
        self,
        engine_core_outputs: Sequence[EngineCoreOutput],
        now: float | None = None,
        iteration_stats: IterationStats | None = None,
    ) -> OutputProcessorOutput:
        """Apply one step's outputs, in order, to the requests still tracked (others are skipped).

        Each is detokenized; a stop string finishes it (listed in ``reqs_to_abort`` if the core
        still runs it); its logprob rows are added; its ``RequestOutput`` is queued (streaming:
        only once there is text to show); a finished request is forgotten. An ``error`` output
        puts a ``ValueError`` on the queue instead.
        """
        raise NotImplementedError(
            "lab-10: OutputProcessor.process_outputs — for each output of a tracked request: "
            "detokenize, let a stop string finish it (and ask the core to abort it if still "
            "running), hand its logprob rows to its LogprobsProcessor, queue its RequestOutput, "
            "forget it once finished"
        )

    def _make_request_output(
        self,
        state: RequestState,
        finish_reason: str | None,
        stop_reason: int | str | None,
        finished: bool,
    ) -> RequestOutput | None:
        detok = state.detokenizer
        text = detok.get_next_output_text(finished, delta=state.stream)
        if state.stream and not text and not finished:
            return None  # nothing a client could see yet (half a character, or a stop prefix)
        token_ids = list(detok.output_token_ids[state.sent_tokens_offset if state.stream else 0 :])
        processor = state.logprobs_processor
        logprobs = processor.logprobs
        if state.stream and logprobs is not None:
            logprobs = logprobs[state.sent_tokens_offset :]
        state.sent_tokens_offset = len(detok.output_token_ids)
        completion = CompletionOutput(
            index=0,
            text=text,
            token_ids=token_ids,
            cumulative_logprob=processor.cumulative_logprob,
            logprobs=logprobs,
            finish_reason=finish_reason,
            stop_reason=stop_reason,
        )
        return RequestOutput(
            request_id=state.request_id,
            prompt=state.prompt,
            prompt_token_ids=state.prompt_token_ids,
            outputs=[completion],
            finished=finished,
            # A stream sends the prompt's once, with its first output (upstream's DELTA kind).
            prompt_logprobs=processor.pop_prompt_logprobs()
            if state.stream
            else processor.prompt_logprobs,
            num_cached_tokens=state.num_cached_tokens,
        )

    @staticmethod
    def _update_stats(
        state: RequestState, out: EngineCoreOutput, now: float, stats: IterationStats
    ) -> None:
        for event in out.events or ():
            if event.type == EngineCoreEventType.QUEUED:
                state.queued_ts = event.timestamp
            elif event.type == EngineCoreEventType.SCHEDULED and not state.scheduled_ts:
                state.scheduled_ts = event.timestamp  # the first one: a resume is not a start
        stats.num_generation_tokens += len(out.new_token_ids)
        if state.first_token_time is None:
            state.first_token_time = now
            state.num_cached_tokens = out.num_cached_tokens
            stats.num_prompt_tokens += len(state.prompt_token_ids)
            stats.num_cached_tokens += out.num_cached_tokens
            stats.time_to_first_tokens_iter.append(now - state.arrival_time)
        else:
            assert state.last_token_time is not None
            stats.inter_token_latencies_iter.append(now - state.last_token_time)
        state.last_token_time = now
        state.num_generation_tokens += len(out.new_token_ids)

    @staticmethod
    def _record_finished(
        state: RequestState, finish_reason: str | None, now: float, stats: IterationStats
    ) -> None:
        decode_tokens = state.num_generation_tokens - 1
        tpot = 0.0
        if decode_tokens > 0 and state.first_token_time is not None:
            assert state.last_token_time is not None
            tpot = (state.last_token_time - state.first_token_time) / decode_tokens
        finished = FinishedRequestStats(
            finish_reason=str(finish_reason),
            e2e_latency=now - state.arrival_time,
            num_prompt_tokens=len(state.prompt_token_ids),
            num_generation_tokens=state.num_generation_tokens,
            mean_time_per_output_token=tpot,
            max_tokens_param=state.max_tokens_param,
            num_cached_tokens=state.num_cached_tokens,
        )
        if state.scheduled_ts and state.first_token_time is not None:
            # Upstream's phases: waiting (queued to first scheduled), prefill (to the first
            # token), decode (first to last token), inference (scheduled to the last token).
            assert state.last_token_time is not None
            finished.queued_time = state.scheduled_ts - state.queued_ts
            finished.prefill_time = state.first_token_time - state.scheduled_ts
            finished.decode_time = state.last_token_time - state.first_token_time
            finished.inference_time = state.last_token_time - state.scheduled_ts
        stats.finished_requests.append(finished)
        (state.parent or ParentRequestStats()).observe_finished(state.num_generation_tokens, stats)
