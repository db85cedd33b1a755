"""The front-end's handle on the engine-core process: start it, talk to it, notice its death.

Mirrors ``vllm/v1/engine/core_client.py`` (``AsyncMPClient``), for one engine: a core that fails
or is killed becomes ``EngineDeadError`` for every pending request instead of streams that hang.
The handshake and the two ways death is noticed: docs/upstream-fidelity.md (module notes).
"""

from __future__ import annotations

import asyncio
import atexit
import itertools
import logging
import multiprocessing
import multiprocessing.connection
import multiprocessing.util  # its exit handler must be registered before ours (atexit is LIFO)
import os
import shutil
import tempfile
import threading
from collections.abc import Awaitable
from dataclasses import asdict
from typing import Any

import msgspec
import zmq
import zmq.asyncio

from mini_vllm.engine.core import (
    ENGINE_CORE_DEAD,
    HANDSHAKE_CALL_ID,
    EngineCoreOutputs,
    EngineCoreRequest,
    EngineCoreRequestType,
    run_engine_core,
)

logger = logging.getLogger(__name__)


class EngineDeadError(RuntimeError):
    """The engine-core process is gone; no request can be served until a restart."""

    def __init__(self, message: str = "the engine core died; restart the server") -> None:
        super().__init__(message)


class EngineStartupError(RuntimeError):
    """The engine core could not start (bad checkpoint, KV cache too small, ...)."""


class AsyncMPClient:
    """Owns the engine-core process and the two sockets to it, for an asyncio front-end.

    All coroutines run on one event loop; ``get_output_async`` has a single consumer, the output
    handler, which also resolves the futures of utility calls.
    """

    def __init__(self, engine_args: Any) -> None:
        self._ipc_dir = tempfile.mkdtemp(prefix="mini-vllm-ipc-")
        self.input_address = f"ipc://{os.path.join(self._ipc_dir, 'input')}"
        self.output_address = f"ipc://{os.path.join(self._ipc_dir, 'output')}"
        self.ctx = zmq.asyncio.Context()
        self.input_socket = self.ctx.socket(zmq.PUSH)
        self.input_socket.setsockopt(zmq.LINGER, 0)
        self.input_socket.bind(self.input_address)
        self.output_socket = self.ctx.socket(zmq.PULL)
        self.output_socket.setsockopt(zmq.LINGER, 0)
        self.output_socket.bind(self.output_address)
        self.encoder = msgspec.msgpack.Encoder()
        self.decoder = msgspec.msgpack.Decoder(EngineCoreOutputs)

        self.engine_dead = False
        self._shutting_down = False
        self._call_ids = itertools.count(HANDSHAKE_CALL_ID + 1)
        self._utility_futures: dict[int, asyncio.Future[Any]] = {}
        self.config: dict[str, Any] = {}

        context = multiprocessing.get_context("spawn")
        self.proc = context.Process(
            target=run_engine_core,
            args=(asdict(engine_args), self.input_address, self.output_address),
            name="MiniVllmEngineCore",
            # Not daemonic, as upstream's: a daemonic process may not start the workers of
            # tensor_parallel_size > 1. The atexit hook below (run before multiprocessing joins
            # its children) and the core's watch on its parent pid stop it instead.
        )
        try:
            self.proc.start()
            atexit.register(self.shutdown)
        except BaseException:
            self._close_sockets()
            raise
        self._monitor = threading.Thread(
            target=self._monitor_engine_core, name="EngineCoreMonitor", daemon=True
        )
        self._monitor.start()

    async def wait_for_ready(self, timeout_s: float = 600.0) -> dict[str, Any]:
        """Wait for the core's handshake; return its configuration or raise why it failed."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            if await self.output_socket.poll(200):
                frame = await self.output_socket.recv()
                if frame == ENGINE_CORE_DEAD:
                    raise EngineStartupError(
                        f"the engine core (pid {self.proc.pid}) exited during startup, with "
                        f"status {self.proc.exitcode}; its log is above"
                    )
                outputs = self.decoder.decode(frame)
                reply = outputs.utility_output
                if reply is None or reply.call_id != HANDSHAKE_CALL_ID:
                    raise EngineStartupError(f"unexpected first message from the core: {outputs}")
                if reply.failure is not None:
                    raise EngineStartupError(f"the engine core failed to start: {reply.failure}")
                self.config = dict(reply.result)
                return self.config
            if loop.time() > deadline:
                raise EngineStartupError(f"the engine core was not ready after {timeout_s:.0f} s")

    def _monitor_engine_core(self) -> None:
        """Runs in a thread: when the core process ends unasked, tell the output loop."""
        multiprocessing.connection.wait([self.proc.sentinel])
        if self._shutting_down:
            return
        self.engine_dead = True
        logger.error(
            "the engine core (pid %s) died with exit code %s", self.proc.pid, self.proc.exitcode
        )
        ctx = zmq.Context()
        try:
            sock = ctx.socket(zmq.PUSH)
            sock.setsockopt(zmq.LINGER, 1000)
            sock.connect(self.output_address)
            sock.send(ENGINE_CORE_DEAD)
            sock.close()
        finally:
            ctx.term()

    async def get_output_async(self) -> EngineCoreOutputs:
        """The next message from the core; raises ``EngineDeadError`` once it is gone."""
        if self.engine_dead and self._shutting_down:
            raise EngineDeadError("the engine core was shut down")
        frame = await self.output_socket.recv()
        if frame == ENGINE_CORE_DEAD:
            self.engine_dead = True
            error = EngineDeadError()
            for waiter in self._utility_futures.values():
                if not waiter.done():
                    waiter.set_exception(error)
            self._utility_futures.clear()
            raise error
        outputs = self.decoder.decode(frame)
        reply = outputs.utility_output
        if reply is not None:
            future = self._utility_futures.pop(reply.call_id, None)
            if future is not None and not future.done():
                if reply.failure is not None:
                    future.set_exception(RuntimeError(reply.failure))
                else:
                    future.set_result(reply.result)
        return outputs

    def _ensure_alive(self) -> None:
        if self.engine_dead:
            raise EngineDeadError()

    async def add_request_async(self, request: EngineCoreRequest) -> None:
        self._ensure_alive()
        await self.input_socket.send_multipart(
            (EngineCoreRequestType.ADD.value, self.encoder.encode(request))
        )

    def abort_requests_nowait(self, request_ids: list[str]) -> Awaitable[Any] | None:
        """Send an abort from a ``finally`` of a cancelled task: a PUSH socket below its
        high-water mark queues the frame at once, so the future returned needs no awaiting."""
        if not request_ids or self.engine_dead or self._shutting_down:
            return None
        return self.input_socket.send_multipart(
            (EngineCoreRequestType.ABORT.value, self.encoder.encode(list(request_ids)))
        )

    async def abort_requests_async(self, request_ids: list[str]) -> None:
        sent = self.abort_requests_nowait(request_ids)
        if sent is not None:
            await sent

    async def call_utility_async(self, method: str, *args: Any, timeout_s: float = 30.0) -> Any:
        """Run ``EngineCore.<method>(*args)`` in the core; its reply comes via the output loop."""
        self._ensure_alive()
        call_id = next(self._call_ids)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._utility_futures[call_id] = future
        await self.input_socket.send_multipart(
            (EngineCoreRequestType.UTILITY.value, self.encoder.encode((call_id, method, args)))
        )
        try:
            return await asyncio.wait_for(future, timeout_s)
        finally:
            self._utility_futures.pop(call_id, None)

    def shutdown(self, timeout_s: float = 5.0) -> None:
        """Stop the core (SIGTERM, then SIGKILL after ``timeout_s``) and release the sockets."""
        if self._shutting_down:
            return
        self._shutting_down = True
        atexit.unregister(self.shutdown)
        if self.proc.is_alive():
            self.proc.terminate()
            self.proc.join(timeout_s)
            if self.proc.is_alive():
                logger.warning("the engine core ignored SIGTERM; killing it")
                self.proc.kill()
                self.proc.join(timeout_s)
        self._close_sockets()

    def _close_sockets(self) -> None:
        self.input_socket.close()
        self.output_socket.close()
        self.ctx.term()
        shutil.rmtree(self._ipc_dir, ignore_errors=True)
