"""Turn the engine core's per-step token ids into per-request text deltas, in the front-end.

Mirrors ``vllm/v1/engine/output_processor.py`` (``OutputProcessor``, ``RequestState``), much
smaller: the core knows only token ids, everything textual happens here. The steps per message
and the bookkeeping rule for request ids: docs/upstream-fidelity.md (module notes).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from mini_vllm.engine import EngineCoreEventType
from mini_vllm.engine.core import EngineCoreOutput, EngineCoreRequest
from mini_vllm.engine.detokenizer import IncrementalDetokenizer
from mini_vllm.engine.logprobs import LogprobsProcessor
from mini_vllm.metrics.stats import FinishedRequestStats, IterationStats, ParentRequestStats
from mini_vllm.outputs import CompletionOutput, RequestOutput


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
        return [rid for rid in request_ids if self.request_states.pop(rid, None) is not None]

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
        now = time.monotonic() if now is None else now
        result = OutputProcessorOutput()
        for out in engine_core_outputs:
            state = self.request_states.get(out.request_id)
            if state is None:
                continue  # aborted (or stopped by a stop string) while this step ran
            if out.error is not None:
                del self.request_states[out.request_id]
                state.queue.put_nowait(ValueError(out.error))
                continue
            if iteration_stats is not None and out.new_token_ids:
                self._update_stats(state, out, now, iteration_stats)
            finish_reason = out.finish_reason
            stop_reason = out.stop_reason
            stop_str = state.detokenizer.update(
                out.new_token_ids,
                finished=out.finished,
                stop_terminated=out.finish_reason == "stop",
            )
            if stop_str is not None:
                finish_reason, stop_reason = "stop", stop_str
                if not out.finished:
                    result.reqs_to_abort.append(out.request_id)
            state.logprobs_processor.update_from_output(out)
            finished = finish_reason is not None
            request_output = self._make_request_output(state, finish_reason, stop_reason, finished)
            if request_output is not None:
                state.queue.put_nowait(request_output)
            if finished:
                del self.request_states[out.request_id]
                if iteration_stats is not None:
                    self._record_finished(state, finish_reason, now, iteration_stats)
        return result

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
