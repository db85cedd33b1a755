"""One worker process per tensor-parallel rank, driven from the engine process.

Mirrors ``vllm/v1/executor/multiproc_executor.py`` (``MultiprocExecutor`` and ``WorkerProc``) in a
much smaller form: each step the engine process sends the same ``SchedulerOutput`` to every
worker, the workers run it on their shards, and rank 0 answers with the sampled tokens. A worker
that dies or hangs is detected, named and cleaned up, never waited out. The transport, how it
differs from upstream's, and the fault handling: docs/upstream-fidelity.md (module notes).
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing.connection
import os
import pickle
import queue
import signal
import socket
import threading
import time
import traceback
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any, NoReturn

import torch
import torch.multiprocessing

from mini_vllm.worker import kv_sizing
from mini_vllm.worker.worker import Worker, WorkerConfig

if TYPE_CHECKING:
    from mini_vllm.core.sched.output import SchedulerOutput
    from mini_vllm.worker.model_runner import ModelRunnerOutput

logger = logging.getLogger(__name__)

EXECUTE_MODEL_TIMEOUT_ENV = "MINI_VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS"
DEFAULT_EXECUTE_MODEL_TIMEOUT_S = 300.0
DEFAULT_STARTUP_TIMEOUT_S = 600.0

_OK, _FAILED = "ok", "failed"
_SHUTDOWN = "__shutdown__"


class WorkerFailedError(RuntimeError):
    """A tensor-parallel worker died, failed or hung; ``ranks`` are the ones at fault."""

    def __init__(self, message: str, ranks: Sequence[int]) -> None:
        super().__init__(message)
        self.ranks = list(ranks)


def get_open_port() -> int:
    """A free TCP port on the loopback interface, for the process group's rendezvous."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def plain_config(hf_config: Any) -> SimpleNamespace:
    """The config's attributes in a plain namespace, for the workers.

    Unpickling a transformers config imports transformers in every worker (seconds of CPU per
    rank at startup); the model only reads attributes, which a namespace of the same values
    answers identically.
    """
    return SimpleNamespace(**vars(hf_config))


def execute_model_timeout_s() -> float:
    """The per-step deadline: ``MINI_VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS`` or 300 s."""
    value = os.environ.get(EXECUTE_MODEL_TIMEOUT_ENV)
    if value is None:
        return DEFAULT_EXECUTE_MODEL_TIMEOUT_S
    timeout = float(value)
    if timeout <= 0:
        raise ValueError(f"{EXECUTE_MODEL_TIMEOUT_ENV} must be positive, got {value!r}")
    return timeout


@dataclass
class _WorkerHandle:
    rank: int
    proc: Any  # multiprocessing.Process (spawn context)
    requests: Any  # multiprocessing.Queue of pickled calls
    responses: multiprocessing.connection.Connection
    death_writer: multiprocessing.connection.Connection | None


@dataclass
class PendingStep:
    """A step sent to the workers whose answer has not been read yet (see ``get_output``)."""

    seq: int
    deadline: float


class MultiprocExecutor:
    """Starts the workers, sends them calls, collects answers, and stops them.

    It offers the engine the same calls as a ``ModelRunner`` (``determine_available_memory``,
    ``initialize_kv_cache``, ``execute_model``, the async ``prepare_step``/``launch_step``/
    ``get_output`` trio, ...), so the engine drives one rank in-process or many through this
    class alike; with one rank no process is started at all (the engine uses the runner).
    """

    def __init__(
        self,
        config: WorkerConfig,
        hf_config: Any,
        weights: dict[str, torch.Tensor],
        execute_timeout_s: float | None = None,
        startup_timeout_s: float = DEFAULT_STARTUP_TIMEOUT_S,
    ) -> None:
        self.config = config
        self.world_size = config.world_size
        self.output_rank = 0  # every rank samples the same tokens; rank 0 answers
        self.execute_timeout_s = execute_timeout_s or execute_model_timeout_s()
        self.is_failed = False
        self.shutting_down = False
        self._seq = 0
        self._stash: dict[tuple[int, int], Any] = {}
        self._method_of: dict[int, str] = {}
        self.workers: list[_WorkerHandle] = []
        self.cudagraph_batch_sizes: list[int] = []  # set by warm_up_model

        ctx = torch.multiprocessing.get_context("spawn")
        # Per rank: [seq of the last call picked up, seq of the last call finished].
        self._progress = ctx.Array("q", 2 * self.world_size, lock=False)
        # The full tensors go to the workers through shared memory (torch's pickler moves each
        # storage there once and passes a handle); each worker copies out only its shards.
        for tensor in weights.values():
            tensor.share_memory_()
        model_config = plain_config(hf_config)
        try:
            for rank in range(self.world_size):
                self.workers.append(self._start_worker(ctx, rank, model_config, weights))
            self._finalizer = weakref.finalize(
                self, _stop_workers, [w.proc for w in self.workers], self._death_writers()
            )
            deadline = time.monotonic() + startup_timeout_s
            infos = self._wait(0, list(range(self.world_size)), deadline, "startup")
        except BaseException:
            self.shutdown()
            raise
        self.worker_info = [infos[r] for r in range(self.world_size)]
        block_bytes = {info["kv_cache_block_bytes"] for info in self.worker_info}
        if len(block_bytes) != 1:
            self.shutdown()
            raise RuntimeError(f"ranks disagree on the bytes of a KV block: {self.worker_info}")
        self.kv_cache_block_bytes: int = block_bytes.pop()
        info = self.worker_info[0]
        logger.info(
            "tensor parallel: %d ranks (%s), each with %d query and %d KV heads, "
            "%.1f KiB per KV block per rank",
            self.world_size,
            ", ".join(f"rank {i['rank']} pid {i['pid']} on {i['device']}" for i in infos.values()),
            info["num_heads"],
            info["num_kv_heads"],
            self.kv_cache_block_bytes / 2**10,
        )

    # ------------------------------------------------------------------ processes

    def _start_worker(self, ctx: Any, rank: int, hf_config: Any, weights: Any) -> _WorkerHandle:
        requests = ctx.Queue()
        # The weights travel in a list that each side empties once they are across: a process
        # keeps its target's arguments for its whole life, and the full model must not stay
        # mapped in every worker (or in the engine) after the shards are copied out.
        weights_box = [weights]
        response_reader, response_writer = ctx.Pipe(duplex=False)
        death_reader, death_writer = ctx.Pipe(duplex=False)
        proc = ctx.Process(
            target=worker_main,
            name=f"TPWorker_rank{rank}",
            kwargs=dict(
                rank=rank,
                config=self.config,
                hf_config=hf_config,
                weights_box=weights_box,
                requests=requests,
                responses=response_writer,
                death_pipe=death_reader,
                progress=self._progress,
            ),
            daemon=True,
        )
        proc.start()  # spawn: the arguments are pickled here, the tensors as shared memory
        weights_box.clear()
        # Keep only our ends: the worker's copies must be the last ones for EOF to work.
        response_writer.close()
        death_reader.close()
        return _WorkerHandle(rank, proc, requests, response_reader, death_writer)

    def _death_writers(self) -> list[Any]:
        return [w.death_writer for w in self.workers]

    @property
    def worker_pids(self) -> list[int]:
        return [w.proc.pid for w in self.workers]

    # ------------------------------------------------------------------ calls

    def collective_rpc(
        self,
        method: str,
        timeout: float | None = None,
        args: tuple = (),
        kwargs: dict[str, Any] | None = None,
        non_block: bool = False,
        unique_reply_rank: int | None = None,
    ) -> Any:
        """Call ``Worker.<method>`` on every rank; return rank ``unique_reply_rank``'s result,
        or every rank's as a list when it is None (upstream's ``collective_rpc``).

        The parameters come in upstream's order (``timeout`` second, before ``args``), so a
        call written against vLLM's executor means the same here. Unlike upstream, a None
        ``timeout`` is not "wait forever": it is the step deadline (a hung worker must fail).
        """
        if self.is_failed:
            raise RuntimeError("the tensor-parallel executor has failed; start a new LLM")
        self._seq += 1
        seq = self._seq
        self._method_of[seq] = method
        payload = pickle.dumps(
            (seq, method, args, kwargs or {}, unique_reply_rank), protocol=pickle.HIGHEST_PROTOCOL
        )
        for worker in self.workers:
            worker.requests.put(payload)
        deadline = time.monotonic() + (timeout or self.execute_timeout_s)
        pending = PendingStep(seq, deadline)
        if non_block:
            return pending
        return self._collect(pending, unique_reply_rank)

    def _collect(self, pending: PendingStep, unique_reply_rank: int | None) -> Any:
        ranks = list(range(self.world_size)) if unique_reply_rank is None else [unique_reply_rank]
        method = self._method_of.get(pending.seq, "?")
        results = self._wait(pending.seq, ranks, pending.deadline, method)
        self._method_of.pop(pending.seq, None)
        if unique_reply_rank is not None:
            return results[unique_reply_rank]
        return [results[r] for r in ranks]

    def _wait(self, seq: int, ranks: list[int], deadline: float, method: str) -> dict[int, Any]:
        """Read answers until ``ranks`` answered call ``seq``; raise on a death, error or timeout.

        Answers to other calls (a later step's, read early) are kept for their own ``_wait``.
        """
        results: dict[int, Any] = {}
        for rank in ranks:
            if (seq, rank) in self._stash:
                results[rank] = self._stash.pop((seq, rank))
        # Keyed by object: `wait` hands back whichever of its waitables are ready, untyped.
        by_conn: dict[object, _WorkerHandle] = {w.responses: w for w in self.workers}
        by_sentinel = {w.proc.sentinel: w for w in self.workers}
        while len(results) < len(ranks):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                self._fail_hang(seq, method, [r for r in ranks if r not in results])
            ready = multiprocessing.connection.wait(
                list(by_sentinel) + list(by_conn), timeout=remaining
            )
            for obj in ready:
                if obj in by_sentinel:
                    self._fail_death(by_sentinel[obj], method)
            for obj in ready:
                worker = by_conn[obj]
                try:
                    msg_seq, status, value = worker.responses.recv()
                except (EOFError, OSError):
                    self._fail_death(worker, method)
                if status == _FAILED:
                    self._fail_error(worker, self._method_of.get(msg_seq, method), value)
                if msg_seq == seq and worker.rank in ranks:
                    results[worker.rank] = value
                else:
                    self._stash[(msg_seq, worker.rank)] = value
        return results

    # ------------------------------------------------------------------ faults

    def _fail(self, message: str, ranks: Sequence[int]) -> NoReturn:
        self.is_failed = True
        logger.error("%s", message)
        self.shutdown()
        raise WorkerFailedError(message, ranks)

    def _fail_death(self, worker: _WorkerHandle, method: str) -> NoReturn:
        worker.proc.join(timeout=1.0)
        code = worker.proc.exitcode
        self._fail(
            f"tensor-parallel worker rank {worker.rank} (pid {worker.proc.pid}) died "
            f"unexpectedly during {method} (exit code {code}); all workers were stopped",
            [worker.rank],
        )

    def _fail_error(self, worker: _WorkerHandle, method: str, error: str) -> NoReturn:
        """A rank raised. A peer's death makes the others' collectives fail too, so look for a
        dead rank first: that one is the cause, the errors are its consequence."""
        sentinels = {w.proc.sentinel: w for w in self.workers}
        dead = multiprocessing.connection.wait(list(sentinels), timeout=1.0)
        if dead:
            self._fail_death(sentinels[dead[0]], method)
        message = f"tensor-parallel worker rank {worker.rank} failed in {method}:\n{error}"
        self._fail(message, [worker.rank])

    def _fail_hang(self, seq: int, method: str, unanswered: list[int]) -> NoReturn:
        progress = self._progress
        never = [r for r in range(self.world_size) if progress[2 * r] < seq]
        stuck = [r for r in range(self.world_size) if progress[2 * r] >= seq > progress[2 * r + 1]]
        if seq == 0:  # startup: no progress is recorded before a worker is ready
            detail = f"rank(s) {unanswered} did not report ready"
            culprits = unanswered
        elif never:
            detail = f"rank(s) {never} never picked it up (hung, or stuck in an earlier call)"
            if stuck:
                detail += f"; rank(s) {stuck} started it and are waiting, likely in a collective"
            culprits = never
        else:
            detail = f"rank(s) {stuck} started it and did not finish (hung inside the step)"
            culprits = stuck
        self._fail(
            f"tensor-parallel workers did not finish {method} within "
            f"{self.execute_timeout_s:.0f} s: {detail}; all workers were stopped "
            f"(raise {EXECUTE_MODEL_TIMEOUT_ENV} for legitimately slow steps)",
            culprits,
        )

    def shutdown(self) -> None:
        """Stop every worker: ask politely, close the death pipes, then SIGTERM, then SIGKILL."""
        if self.shutting_down:
            return
        self.shutting_down = True
        if not self.is_failed:
            payload = pickle.dumps((-1, _SHUTDOWN, (), {}, None))
            for worker in self.workers:
                if worker.proc.is_alive():
                    with contextlib.suppress(OSError, ValueError):
                        worker.requests.put(payload)
        finalizer = getattr(self, "_finalizer", None)
        if finalizer is not None:
            finalizer()
        else:
            _stop_workers([w.proc for w in self.workers], self._death_writers())
        for worker in self.workers:
            worker.responses.close()
            # A queue's feeder thread may be blocked writing to a worker that was killed:
            # never wait for it (the data is moot).
            worker.requests.cancel_join_thread()
            worker.requests.close()

    # ------------------------------------------------------------------ the runner's API

    def determine_available_memory(
        self, gpu_memory_utilization: float, kv_cache_memory_bytes: int | None
    ) -> int:
        """The budget of the rank that can hold the fewest blocks.

        Every rank measures its own budget; all blocks cost the same on every rank (same KV
        heads per rank), so the rank with the smallest budget decides the block count for all
        (``kv_sizing.num_gpu_blocks_across_ranks``, upstream's minimum over workers).
        """
        budgets = self.collective_rpc(
            "determine_available_memory",
            args=(gpu_memory_utilization, kv_cache_memory_bytes),
            timeout=max(self.execute_timeout_s, DEFAULT_STARTUP_TIMEOUT_S),
        )
        blocks = [
            kv_sizing.num_gpu_blocks_from_budget(b, self.kv_cache_block_bytes) for b in budgets
        ]
        num_blocks = kv_sizing.num_gpu_blocks_across_ranks(blocks)
        logger.info("KV blocks each rank can hold: %s -> %d for every rank", blocks, num_blocks)
        return budgets[blocks.index(num_blocks)]

    def initialize_kv_cache(self, num_gpu_blocks: int) -> None:
        self.collective_rpc("initialize_kv_cache", args=(num_gpu_blocks,))

    def warm_up_model(self) -> None:
        """Warm up and capture on every rank; keep rank 0's captured sizes (all ranks capture
        the same ones, or their collectives would not pair up)."""
        self.cudagraph_batch_sizes = self.collective_rpc(
            "compile_or_warm_up_model",
            timeout=max(self.execute_timeout_s, 600.0),
            unique_reply_rank=self.output_rank,
        )

    def capture_model(self) -> None:
        """Done by ``warm_up_model`` on each rank (``compile_or_warm_up_model``)."""

    def set_max_model_len(self, max_model_len: int) -> None:
        self.collective_rpc("set_max_model_len", args=(max_model_len,))

    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        return self.get_output(self.launch_step(scheduler_output))

    def prepare_step(
        self, scheduler_output: SchedulerOutput, in_flight: PendingStep | None = None
    ) -> SchedulerOutput:
        """Nothing to flatten here: each rank's runner prepares its own inputs.

        A rank runs its steps in order, so when it starts this one it has already appended the
        tokens of ``in_flight``: no placeholders are needed across processes.
        """
        return scheduler_output

    def launch_step(self, prepared: SchedulerOutput) -> PendingStep:
        """Send a step to every rank and return at once (the engine schedules meanwhile)."""
        return self.collective_rpc(
            "execute_model", args=(prepared,), unique_reply_rank=self.output_rank, non_block=True
        )

    def get_output(self, pending: PendingStep) -> ModelRunnerOutput:
        """Wait (up to the step's deadline) for rank 0's tokens of a launched step."""
        return self._collect(pending, self.output_rank)


def _stop_workers(procs: list[Any], death_writers: list[Any]) -> None:
    """Close the death pipes (workers exit on EOF), then SIGTERM, then SIGKILL what is left.

    Also the finalizer of the executor: runs when it is collected or the interpreter exits.
    """
    for writer in death_writers:
        if writer is not None:
            with contextlib.suppress(OSError):
                writer.close()
    for signal_step in ("wait", "terminate", "kill"):
        alive = [p for p in procs if p.is_alive()]
        if not alive:
            break
        for p in alive:
            if signal_step == "terminate":
                p.terminate()
                # A stopped process (SIGSTOP, a debugger) keeps a SIGTERM pending until it
                # runs again: let it run, so that it can die.
                with contextlib.suppress(ProcessLookupError):
                    os.kill(p.pid, signal.SIGCONT)
            elif signal_step == "kill":
                p.kill()
        end = time.monotonic() + 2.0
        for p in alive:
            p.join(timeout=max(0.0, end - time.monotonic()))
    for p in procs:
        if p.is_alive():
            p.join(timeout=1.0)


# ---------------------------------------------------------------------- the worker process


def worker_main(
    rank: int,
    config: WorkerConfig,
    hf_config: Any,
    weights_box: list[dict[str, torch.Tensor]],
    requests: Any,
    responses: multiprocessing.connection.Connection,
    death_pipe: multiprocessing.connection.Connection,
    progress: Any,
) -> None:
    """Entry point of a worker process (upstream: ``WorkerProc.worker_main``).

    Starts a thread that exits the process when the engine's end of the death pipe closes
    (the engine shut down, or died), builds the ``Worker``, answers the startup call (seq 0)
    with its description, then serves calls until told to stop.
    """

    def watch_death_pipe() -> None:
        with contextlib.suppress(EOFError, OSError):
            death_pipe.recv()
        os._exit(0)

    threading.Thread(target=watch_death_pipe, daemon=True, name="death-pipe").start()
    logging.basicConfig(
        level=logging.WARNING, format=f"%(levelname)s [TP rank {rank}] %(name)s: %(message)s"
    )
    worker = Worker(rank, config)
    try:
        worker.init_device()
        weights = weights_box.pop()
        worker.load_model(hf_config, weights.items())
        del weights
        responses.send((0, _OK, worker.describe()))
    except BaseException:
        responses.send((0, _FAILED, traceback.format_exc()))
        return
    _busy_loop(worker, rank, requests, responses, progress)


def _busy_loop(
    worker: Worker,
    rank: int,
    requests: Any,
    responses: multiprocessing.connection.Connection,
    progress: Any,
) -> None:
    """Serve calls in order: record progress, run, answer if asked to (or if it failed)."""
    while True:
        try:
            payload = requests.get()
        except (EOFError, OSError, queue.Empty):
            return
        seq, method, args, kwargs, reply_rank = pickle.loads(payload)
        if method == _SHUTDOWN:
            worker.shutdown()
            return
        progress[2 * rank] = seq
        try:
            output = getattr(worker, method)(*args, **kwargs)
        except BaseException:
            responses.send((seq, _FAILED, traceback.format_exc()))
            continue
        progress[2 * rank + 1] = seq
        if reply_rank is None or reply_rank == rank:
            responses.send((seq, _OK, output))
