"""``AsyncLLM``: the front-end half of the engine, for an asyncio server.

Mirrors ``vllm/v1/engine/async_llm.py``: one background task, the *output handler*, pulls the
core's messages and feeds each request's queue and the metrics; an HTTP handler only iterates
``generate()``, whose early close aborts the request (docs/upstream-fidelity.md, module notes).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncGenerator, Sequence
from typing import Any, Protocol

from mini_vllm.engine.core import EngineCoreRequest, EngineCoreSamplingParams
from mini_vllm.engine.core_client import AsyncMPClient, EngineDeadError
from mini_vllm.engine.output_processor import OutputProcessor
from mini_vllm.metrics.stats import IterationStats, ParentRequestStats, SchedulerStats
from mini_vllm.outputs import RequestOutput

logger = logging.getLogger(__name__)


class StatLogger(Protocol):
    """Receives the scheduler snapshot and the iteration stats after every engine message."""

    def record(
        self, scheduler_stats: SchedulerStats | None, iteration_stats: IterationStats | None
    ) -> None: ...


class AsyncLLM:
    """Tokenizer + engine-core client + output processor, behind ``generate`` and ``abort``.

    Build it with ``await AsyncLLM.create(args)`` in the event loop that will use it.
    """

    def __init__(self, engine_args: Any, stat_loggers: Sequence[StatLogger] = ()) -> None:
        from mini_vllm.model.loader import load_tokenizer, resolve_model

        self.engine_args = engine_args
        self.model_source = resolve_model(engine_args.model)
        # Start the core first: it loads the model while this process loads the tokenizer.
        self.engine_core = AsyncMPClient(engine_args)
        try:
            # The front-end tokenizes and detokenizes; the core only ever sees token ids.
            self.tokenizer = load_tokenizer(self.model_source)
        except BaseException:
            self.engine_core.shutdown()
            raise
        self.output_processor = OutputProcessor(self.tokenizer)
        self.stat_loggers = list(stat_loggers)
        self.config: dict[str, Any] = {}
        self._output_handler: asyncio.Task[None] | None = None
        self._dead_error: BaseException | None = None

    @classmethod
    async def create(
        cls,
        engine_args: Any,
        stat_loggers: Sequence[StatLogger] = (),
        startup_timeout_s: float = 600.0,
    ) -> AsyncLLM:
        llm = cls(engine_args, stat_loggers)
        try:
            llm.config = await llm.engine_core.wait_for_ready(startup_timeout_s)
        except BaseException:
            llm.shutdown()
            raise
        llm._output_handler = asyncio.create_task(llm._run_output_handler(), name="output-handler")
        return llm

    @property
    def max_model_len(self) -> int:
        return int(self.config["max_model_len"])

    @property
    def errored(self) -> bool:
        """True once the engine core is gone: every new request gets 503."""
        return self._dead_error is not None or self.engine_core.engine_dead

    @property
    def dead_error(self) -> BaseException:
        return self._dead_error or EngineDeadError()

    async def add_request(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: EngineCoreSamplingParams,
        *,
        prompt: str | None = None,
        stop: Sequence[str] = (),
        include_stop_str_in_output: bool = False,
        skip_special_tokens: bool = True,
        stream: bool = False,
        arrival_time: float | None = None,
        priority: int = 0,
        parent: ParentRequestStats | None = None,
        cache_salt: str | None = None,
    ) -> asyncio.Queue[RequestOutput | BaseException]:
        if self.errored:
            raise self.dead_error
        request = EngineCoreRequest(
            request_id=request_id,
            prompt_token_ids=list(prompt_token_ids),
            sampling_params=params,
            arrival_time=time.time(),
            eos_token_id=self.tokenizer.eos_token_id,
            priority=priority,
            cache_salt=cache_salt,
        )
        queue = self.output_processor.add_request(
            request,
            prompt,
            stop=stop,
            include_stop_str_in_output=include_stop_str_in_output,
            skip_special_tokens=skip_special_tokens,
            stream=stream,
            arrival_time=arrival_time,
            parent=parent,
        )
        try:
            await self.engine_core.add_request_async(request)
        except BaseException:
            self.output_processor.abort_requests([request_id])
            raise
        return queue

    async def generate(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: EngineCoreSamplingParams,
        **kwargs: Any,
    ) -> AsyncGenerator[RequestOutput, None]:
        """Yield the request's outputs until the finished one; abort it if closed early."""
        queue = await self.add_request(request_id, prompt_token_ids, params, **kwargs)
        finished = False
        try:
            while not finished:
                item = await queue.get()
                if isinstance(item, BaseException):
                    finished = True  # nothing left to abort
                    raise item
                finished = item.finished
                yield item
        finally:
            if not finished:
                self.abort_nowait([request_id])

    def abort_nowait(self, request_ids: Sequence[str]) -> None:
        """Drop requests here and tell the core, from any context (no await needed)."""
        ids = self.output_processor.abort_requests(list(request_ids))
        if ids:
            self.engine_core.abort_requests_nowait(ids)

    async def abort(self, request_ids: Sequence[str]) -> None:
        ids = self.output_processor.abort_requests(list(request_ids))
        await self.engine_core.abort_requests_async(ids)

    async def get_stats(self) -> dict[str, Any]:
        """The core's lifetime counters (``EngineCore.get_stats``)."""
        return await self.engine_core.call_utility_async("get_stats")

    async def reset_prefix_cache(self) -> bool:
        return await self.engine_core.call_utility_async("reset_prefix_cache")

    async def _run_output_handler(self) -> None:
        """Pull every core message, process it, feed the metrics; fail all on core death."""
        try:
            while True:
                outputs = await self.engine_core.get_output_async()
                iteration_stats = IterationStats() if self.stat_loggers else None
                processed = self.output_processor.process_outputs(
                    outputs.outputs, time.monotonic(), iteration_stats
                )
                if processed.reqs_to_abort:
                    await self.engine_core.abort_requests_async(processed.reqs_to_abort)
                for stat_logger in self.stat_loggers:
                    stat_logger.record(outputs.scheduler_stats, iteration_stats)
        except EngineDeadError as exc:
            self._dead_error = exc
            self.output_processor.propagate_error(exc)
        except Exception as exc:  # a bug here must not leave every stream hanging
            logger.exception("the output handler failed")
            self._dead_error = EngineDeadError(f"the output handler failed: {exc!r}")
            self.output_processor.propagate_error(self._dead_error)

    def shutdown(self) -> None:
        if self._output_handler is not None:
            self._output_handler.cancel()
        self.engine_core.shutdown()
