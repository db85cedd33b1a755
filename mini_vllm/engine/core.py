"""The engine core: the scheduler and the model in a busy loop, in a process of its own.

Mirrors ``vllm/v1/engine/core.py`` (``EngineCore``, ``EngineCoreProc``) and the wire messages of
``vllm/v1/engine/__init__.py``, much smaller. Why a process, and the frames on the wire:
docs/upstream-fidelity.md (module notes).
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import logging
import os
import signal
import time
import traceback
from typing import TYPE_CHECKING, Any

import msgspec
import zmq

from mini_vllm.engine import EngineCoreEvent, EngineCoreEventType
from mini_vllm.logprobs import LogprobsLists
from mini_vllm.metrics.stats import SchedulerStats
from mini_vllm.sampling_params import RepetitionDetectionParams

if TYPE_CHECKING:
    from mini_vllm.engine.llm_engine import TokensPrompt

logger = logging.getLogger(__name__)

# Sent instead of an EngineCoreOutputs when the core dies: the front-end fails every request.
ENGINE_CORE_DEAD = b"ENGINE_CORE_DEAD"
# The call id of the startup handshake (the core's first message: ready, with its config).
HANDSHAKE_CALL_ID = 0
# How often an idle core wakes up to check that its parent (the front-end) is still alive.
_IDLE_POLL_MS = 500


class EngineCoreRequestType(enum.Enum):
    """First frame of an input message (the values are upstream's)."""

    ADD = b"\x00"
    ABORT = b"\x01"
    UTILITY = b"\x03"


class EngineCoreSamplingParams(msgspec.Struct, omit_defaults=True):
    """The engine's ``SamplingParams`` on the wire (``n``, stop strings: the front-end's)."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: dict[int, float] | None = None
    allowed_token_ids: list[int] | None = None
    bad_words_token_ids: list[list[int]] | None = None  # the front-end tokenizes bad_words
    seed: int | None = None
    max_tokens: int | None = 16
    min_tokens: int = 0
    stop_token_ids: list[int] = []
    ignore_eos: bool = False
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    repetition_detection: RepetitionDetectionParams | None = None

    def to_sampling_params(self) -> Any:
        from mini_vllm.sampling_params import SamplingParams

        fields = msgspec.structs.asdict(self)  # the fields share their names, but one:
        bad_words_token_ids = fields.pop("bad_words_token_ids")
        return SamplingParams(**fields, _bad_words_token_ids=bad_words_token_ids)


class EngineCoreRequest(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    """One request, already tokenized and validated by the front-end.

    ``eos_token_id`` is the front-end tokenizer's (the core loads no tokenizer); None leaves the
    checkpoint config's. ``priority`` orders admission under the priority policy (smaller
    first) and is ignored under FCFS, as upstream's. ``cache_salt`` enters the first block's
    hash (``generate_block_hash_extra_keys``).
    """

    request_id: str
    prompt_token_ids: list[int]
    sampling_params: EngineCoreSamplingParams
    arrival_time: float = 0.0
    eos_token_id: int | None = None
    priority: int = 0
    cache_salt: str | None = None


class EngineCoreOutput(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    """One request's share of one step: its new tokens, and why it finished if it did.

    ``finish_reason`` is ``"stop"``, ``"length"``, ``"abort"`` or ``"error"`` (see ``error``).
    ``events`` are the request's events since its last output (its first output carries QUEUED
    and SCHEDULED), and that output also ``num_cached_tokens``, the prompt tokens its first
    schedule found in the prefix cache: both only feed the front-end's metrics.
    """

    request_id: str
    new_token_ids: list[int]
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    error: str | None = None
    # Rows of (sampled token first, then the top ones), one per new token; see mini_vllm/logprobs.
    new_logprobs: LogprobsLists | None = None
    # The whole prompt's rows (its second token on), with the request's first token; upstream
    # sends them as tensors (``new_prompt_logprobs_tensors``).
    new_prompt_logprobs: LogprobsLists | None = None
    events: list[EngineCoreEvent] | None = None
    num_cached_tokens: int = 0

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


class UtilityOutput(msgspec.Struct, omit_defaults=True):
    """The answer to a UTILITY call: a result, or the failure's message."""

    call_id: int
    result: Any = None
    failure: str | None = None


class EngineCoreOutputs(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    """Everything the core sends after a step (or after handling input between steps)."""

    outputs: list[EngineCoreOutput] = []
    scheduler_stats: SchedulerStats | None = None
    utility_output: UtilityOutput | None = None
    timestamp: float = 0.0


class EngineCore:
    """An ``LLMEngine`` driven one step at a time, reporting every request's new tokens
    (not just the finished ones), a scheduler snapshot, and a few utility methods.

    Without a tokenizer: text is the front-end's, and so is the EOS id (on each request).
    """

    def __init__(self, engine_args: Any) -> None:
        from mini_vllm.engine.llm_engine import LLMEngine

        engine_args = dataclasses.replace(engine_args, skip_tokenizer_init=True)
        self.engine = LLMEngine.from_engine_args(engine_args)
        self._last_counts = (0, 0, 0)  # prefix-cache queries and hits, preemptions
        # Events waiting for their request's next output, and the prefix hits of its schedule.
        self._events: dict[str, list[EngineCoreEvent]] = {}
        self._num_cached_tokens: dict[str, int] = {}
        self.engine.on_schedule = self._stamp_schedule

    def add_request(self, request: EngineCoreRequest) -> EngineCoreOutput | None:
        """Queue a request; if the engine refuses it, the error output to send back."""
        try:
            prompt: TokensPrompt = {"prompt_token_ids": request.prompt_token_ids}
            if request.cache_salt is not None:
                prompt["cache_salt"] = request.cache_salt
            self.engine.add_request(
                request.request_id,
                prompt,
                request.sampling_params.to_sampling_params(),
                arrival_time=request.arrival_time or None,
                priority=request.priority,
                eos_token_id=request.eos_token_id,
            )
        except (ValueError, TypeError) as exc:
            return EngineCoreOutput(request.request_id, [], finish_reason="error", error=str(exc))
        self._stamp(request.request_id, EngineCoreEventType.QUEUED, time.monotonic())
        return None

    def _stamp(self, request_id: str, event_type: EngineCoreEventType, now: float) -> None:
        self._events.setdefault(request_id, []).append(EngineCoreEvent(event_type, now))

    def _stamp_schedule(self, scheduler_output: Any) -> None:
        """SCHEDULED for each request scheduled for the first time, PREEMPTED for each request
        preempted: what upstream's scheduler records itself, read here from its output so
        that lab-08's scheduler stays free of metrics."""
        now = time.monotonic()
        for new_req in scheduler_output.scheduled_new_reqs:
            self._stamp(new_req.req_id, EngineCoreEventType.SCHEDULED, now)
            self._num_cached_tokens[new_req.req_id] = new_req.num_computed_tokens
        for request_id in scheduler_output.preempted_req_ids:
            self._stamp(request_id, EngineCoreEventType.PREEMPTED, now)

    def abort_requests(self, request_ids: list[str]) -> None:
        """Finish the requests wherever they are; their blocks are free when this returns."""
        self.engine.abort_request(request_ids)
        for request_id in request_ids:
            self._events.pop(request_id, None)
            self._num_cached_tokens.pop(request_id, None)

    def has_unfinished_requests(self) -> bool:
        return self.engine.has_unfinished_requests()

    def step(self) -> list[EngineCoreOutput]:
        """One scheduler step; every request that got tokens or finished in it."""
        self.engine.step()
        outputs = [
            EngineCoreOutput(
                out.request_id,
                list(out.new_token_ids),
                finish_reason=str(out.finish_reason) if out.finish_reason is not None else None,
                stop_reason=out.stop_reason,
                new_logprobs=out.new_logprobs,
            )
            for out in self.engine.last_core_outputs
        ]
        if self.engine.last_prompt_logprobs:
            prompt_logprobs = self.engine.last_prompt_logprobs
            for out in outputs:
                out.new_prompt_logprobs = prompt_logprobs.get(out.request_id)
        if self._events:  # none in a steady decode with nothing waiting: no lookup per output
            for out in outputs:
                out.events = self._events.pop(out.request_id, None)
                if out.events is not None:
                    out.num_cached_tokens = self._num_cached_tokens.pop(out.request_id, 0)
        return outputs

    def make_stats(self) -> SchedulerStats:
        """A snapshot of the gauges, and the counters' increments since the last one."""
        running, waiting = self.engine.scheduler.get_request_counts()
        stats = self.engine.stats
        counts = (stats.prefix_cache_queries, stats.prefix_cache_hits, stats.num_preemptions)
        queries, hits, preemptions = (now - last for now, last in zip(counts, self._last_counts))
        self._last_counts = counts
        return SchedulerStats(
            num_running_reqs=running,
            num_waiting_reqs=waiting,
            kv_cache_usage=float(self.engine.kv_cache_manager.usage),
            prefix_cache_queries=queries,
            prefix_cache_hits=hits,
            num_preemptions=preemptions,
        )

    def get_config(self) -> dict[str, Any]:
        engine = self.engine
        return {
            "model": str(engine.model_source),
            "max_model_len": engine.max_model_len,
            "num_gpu_blocks": engine.num_gpu_blocks,
            "block_size": engine.block_size,
            "eos_token_id": engine.eos_token_id,
            "vocab_size": engine.vocab_size,
            "pid": os.getpid(),
        }

    def get_stats(self) -> dict[str, Any]:
        """The engine's lifetime counters, plus the free-block count (leak checks read it)."""
        out = dataclasses.asdict(self.engine.stats)
        out["num_free_blocks"] = self.engine.kv_cache_manager.block_pool.get_num_free_blocks()
        out["num_unfinished_requests"] = self.engine.get_num_unfinished_requests()
        return out

    def reset_prefix_cache(self) -> bool:
        return self.engine.reset_prefix_cache()

    UTILITY_METHODS = ("get_config", "get_stats", "reset_prefix_cache")


class EngineCoreProc(EngineCore):
    """``EngineCore`` behind two ZeroMQ sockets, running the busy loop until told to stop.

    Each turn drains the input socket (blocking only when nothing can run), then takes one step:
    requests that arrive during a step wait for the next, aborts apply before its ``schedule()``.
    """

    def __init__(self, engine_args: Any, input_address: str, output_address: str) -> None:
        self._zmq_ctx = zmq.Context()
        # Connect the output socket first, so that a startup failure can be reported.
        self.output_socket = self._zmq_ctx.socket(zmq.PUSH)
        self.output_socket.setsockopt(zmq.LINGER, 2000)
        self.output_socket.connect(output_address)
        self.input_socket = self._zmq_ctx.socket(zmq.PULL)
        self.input_socket.setsockopt(zmq.LINGER, 0)
        self.input_socket.connect(input_address)
        self.encoder = msgspec.msgpack.Encoder()
        self.request_decoder = msgspec.msgpack.Decoder(EngineCoreRequest)
        self.generic_decoder = msgspec.msgpack.Decoder()
        self._parent_pid = os.getppid()
        self._running = True
        try:
            super().__init__(engine_args)
        except BaseException as exc:
            failed = UtilityOutput(HANDSHAKE_CALL_ID, None, f"{type(exc).__name__}: {exc}")
            self._send(EngineCoreOutputs(utility_output=failed))
            self.close()  # flushes the failure (LINGER) before the process exits
            raise
        ready = UtilityOutput(HANDSHAKE_CALL_ID, self.get_config())
        self._send(EngineCoreOutputs(utility_output=ready, scheduler_stats=self.make_stats()))

    def _send(self, outputs: EngineCoreOutputs) -> None:
        outputs.timestamp = time.monotonic()
        self.output_socket.send(self.encoder.encode(outputs), copy=False)

    def run_busy_loop(self) -> None:
        while self._running:
            self._process_input_socket(block=not self.has_unfinished_requests())
            if self._running and self.has_unfinished_requests():
                outputs = self.step()
                self._send(EngineCoreOutputs(outputs=outputs, scheduler_stats=self.make_stats()))

    def _process_input_socket(self, block: bool) -> None:
        """Handle every message waiting; if ``block``, wait for at least one first."""
        if block:
            while self._running and not self.input_socket.poll(_IDLE_POLL_MS):
                if os.getppid() != self._parent_pid:
                    logger.warning("the front-end process is gone; the engine core exits")
                    self._running = False
                    return
        replies: list[EngineCoreOutput] = []
        state_changed = False
        while self._running:
            try:
                frames = self.input_socket.recv_multipart(flags=zmq.NOBLOCK, copy=False)
            except zmq.Again:
                break
            request_type = EngineCoreRequestType(bytes(frames[0].buffer))
            payload = frames[1].buffer if len(frames) > 1 else b""
            if request_type is EngineCoreRequestType.ADD:
                error = self.add_request(self.request_decoder.decode(payload))
                if error is not None:
                    replies.append(error)
                state_changed = True
            elif request_type is EngineCoreRequestType.ABORT:
                self.abort_requests(list(self.generic_decoder.decode(payload)))
                state_changed = True
            else:
                self._handle_utility(self.generic_decoder.decode(payload))
        if replies or state_changed:
            # A fresh snapshot even when nothing will run: after the last abort the gauges must
            # read 0 running and 0 blocks used, although no step follows to report it.
            self._send(EngineCoreOutputs(outputs=replies, scheduler_stats=self.make_stats()))

    def _handle_utility(self, message: Any) -> None:
        call_id, method, args = message
        if method == "shutdown":
            self._running = False
            self._send(EngineCoreOutputs(utility_output=UtilityOutput(call_id, True)))
            return
        try:
            if method not in self.UTILITY_METHODS:
                raise ValueError(f"unknown utility method {method!r}")
            result = getattr(self, method)(*args)
            reply = UtilityOutput(call_id, result)
        except Exception as exc:
            reply = UtilityOutput(call_id, None, f"{type(exc).__name__}: {exc}")
        self._send(EngineCoreOutputs(utility_output=reply))

    def send_engine_dead(self) -> None:
        with contextlib.suppress(zmq.ZMQError):
            self.output_socket.send(ENGINE_CORE_DEAD)

    def close(self) -> None:
        self.input_socket.close()
        self.output_socket.close()
        self._zmq_ctx.term()


def run_engine_core(engine_args: dict[str, Any], input_address: str, output_address: str) -> None:
    """Entry point of the engine-core process (``spawn``): SIGTERM ends it with status 0; any
    other failure is reported as ``ENGINE_CORE_DEAD`` and exits with status 1."""
    from mini_vllm.engine.llm_engine import EngineArgs

    def _terminate(signum: int, frame: Any) -> None:
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, _terminate)
    # Ctrl-C in a terminal reaches the whole process group: the front-end decides when we stop.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s engine-core: %(message)s")
    proc: EngineCoreProc | None = None
    try:
        proc = EngineCoreProc(EngineArgs(**engine_args), input_address, output_address)
        proc.run_busy_loop()
    except SystemExit:
        pass
    except BaseException:
        logger.error("engine core failed:\n%s", traceback.format_exc())
        if proc is not None:
            proc.send_engine_dead()
        raise SystemExit(1) from None
    finally:
        if proc is not None:
            proc.close()
