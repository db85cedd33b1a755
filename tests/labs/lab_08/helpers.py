"""The lab-08 suite's engine loop, run from the judge: the learner's scheduler, the fake model here.

The learner's ``Scheduler`` lives in the learner process, over a KV cache manager built there
(the reference's, or the learner's own lab-07 one under ``--chain``); so do the requests it
receives (``learner_side.make_request``). The judge drives the engine loop one call at a time,
as ``EngineCore.step`` does:

1. ``schedule()`` runs in the learner process; the ``SchedulerOutput`` comes back as data
   (``learner_side.output_data``), with the state it left: queues, every request's counters,
   block tables and a snapshot of the block pool (after the other calls, its ref counts);
2. the judge checks that data (token budget, ``max_num_seqs``, the pool's invariants, block
   tables covering the computed tokens, waiting requests holding nothing, no leaked block) and
   executes the output with the fake model's runner
   (``mini_vllm.teaching.sim.FakeModelRunner``), here in the judge: it learns about requests
   only through the output and checks it as a real runner would (a wrong block table or
   ``num_computed_tokens`` reads back the wrong tokens);
3. ``update_from_output`` runs in the learner process with the tokens the runner sampled; the
   ``EngineCoreOutput``s and the state come back as data and are checked again.

With ``reference=True`` the judge also runs the reference scheduler (upstream's semantics, v0.22.1)
over a reference KV cache manager, here, on the very same calls: after every call both sides'
outputs and states must agree (the batch, admissions, preemptions, finished ids, the outputs,
the queues, every request's counters, the block counts, the prefix-cache lookups made for
each request). Nothing the learner process reports is trusted beyond its value: every verdict
is taken here, on plain data whose types are checked.
"""

from __future__ import annotations

import contextlib
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from hypothesis import Phase, settings

from grading.remote import LearnerError, Remote
from grading.suite import SESSION, learner_module, load_impl
from mini_vllm.core.sched.output import (
    CachedRequestData,
    EngineCoreOutput,
    NewRequestData,
    SchedulerOutput,
)
from mini_vllm.core.sched.scheduler import Scheduler as ReferenceScheduler
from mini_vllm.request import FinishReason, RequestStatus
from mini_vllm.sampling_params import SamplingParams
from mini_vllm.teaching.sim import FakeModelRunner, expected_output, fake_next_token
from mini_vllm.teaching.sim.simulator import StepRecord
from tests.labs.common import GRADED_SETTINGS, check_pool_snapshot, describe
from tests.labs.lab_08 import learner_side as reader

DOC = "phases/03-prefix-caching-and-scheduling/README.md"
BS = 4
SEED = 0
VOCAB = 64
_WAITING = (RequestStatus.WAITING, RequestStatus.PREEMPTED)
#: At most this long is spent shortening a failing random example.
SHRINK_SECONDS = 3.0
#: Random tests: reproducible, and no ``explain`` phase (more replays of a failing example).
RANDOM_SETTINGS = settings(
    GRADED_SETTINGS, phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink]
)


def scheduler_module() -> Any:
    """The learner's ``scheduler`` module (a proxy)."""
    return load_impl("scheduler")


@contextlib.contextmanager
def bounded_shrinking(seconds: float = SHRINK_SECONDS) -> Iterator[None]:
    """Hypothesis shortens a failing example for at most ``seconds`` (and never past the test's
    deadline): each try replays a whole workload through the learner process."""
    from hypothesis.internal.conjecture import engine

    saved = engine.MAX_SHRINKING_SECONDS
    if SESSION.deadline is not None:
        seconds = max(0.5, min(seconds, SESSION.deadline - time.monotonic() - 4.0))
    engine.MAX_SHRINKING_SECONDS = seconds
    try:
        yield
    finally:
        engine.MAX_SHRINKING_SECONDS = saved


def model_token(rid: str, position: int, seed: int = SEED, vocab: int = VOCAB) -> int:
    """The token the fake model emits at ``position`` of ``rid``."""
    return fake_next_token(seed, rid, position, vocab)


# -- reading data from the learner process ------------------------------------------------------
def _fail(message: str) -> None:
    raise AssertionError(message)


def _int(value: Any, what: str) -> int:
    if type(value) is not int:
        _fail(f"{what} must be a plain int, got {describe(value)}")
    return value


def _str(value: Any, what: str) -> str:
    if type(value) is not str:
        _fail(f"{what} must be a str (a request id), got {describe(value)}")
    return value


def _list(value: Any, what: str) -> list[Any]:
    if type(value) is not list:
        _fail(f"{what} must be a list (or set) of values, got {describe(value)}")
    return value


def _ints(value: Any, what: str) -> list[int]:
    return [_int(v, f"each of {what}") for v in _list(value, what)]


def _strs(value: Any, what: str, unique: bool = True) -> list[str]:
    ids = [_str(v, f"each of {what}") for v in _list(value, what)]
    if unique and len(set(ids)) != len(ids):
        _fail(f"{what} lists a request twice: {ids}")
    return ids


def _groups(value: Any, what: str) -> tuple[list[int], ...]:
    groups = _list(value, what)
    if len(groups) != 1:
        _fail(
            f"{what} must hold one list of block ids per KV cache group (1 here), got {len(groups)}"
        )
    return tuple(_ints(g, f"{what}[0]") for g in groups)


def _dict(value: Any, what: str) -> dict[Any, Any]:
    if type(value) is not dict:
        _fail(f"{what} must be a dict, got {describe(value)}")
    return value


def _status(value: Any, what: str) -> RequestStatus:
    if type(value) is not RequestStatus:
        _fail(f"{what} must be a RequestStatus, got {describe(value)}")
    return value


def _reason(value: Any, what: str) -> FinishReason | None:
    if value is not None and type(value) is not FinishReason:
        _fail(f"{what} must be a FinishReason or None, got {describe(value)}")
    return value


def scheduler_output(data: Any) -> SchedulerOutput:
    """The judge's own ``SchedulerOutput`` from the data read in the learner process."""
    data = _dict(data, "the SchedulerOutput")
    batch = _list(data["batch"], "num_scheduled_tokens")
    num_scheduled: dict[str, int] = {}
    for pair in batch:
        rid = _str(pair[0], "a key of num_scheduled_tokens")
        if rid in num_scheduled:
            _fail(f"num_scheduled_tokens lists {rid!r} twice")
        num_scheduled[rid] = _int(pair[1], f"num_scheduled_tokens[{rid!r}]")
        if num_scheduled[rid] <= 0:
            _fail(
                f"num_scheduled_tokens[{rid!r}] is {num_scheduled[rid]}: a scheduled request "
                "gets at least one token"
            )
    new = []
    for entry in _list(data["new"], "scheduled_new_reqs"):
        rid = _str(entry[0], "NewRequestData.req_id")
        new.append(
            NewRequestData(
                req_id=rid,
                prompt_token_ids=_ints(entry[1], f"{rid}'s prompt_token_ids"),
                sampling_params=SamplingParams(),
                block_ids=_groups(entry[2], f"NewRequestData.block_ids of {rid!r}"),
                num_computed_tokens=_int(
                    entry[3], f"NewRequestData.num_computed_tokens of {rid!r}"
                ),
            )
        )
    c = _dict(data["cached"], "scheduled_cached_reqs")
    req_ids = _strs(c["req_ids"], "scheduled_cached_reqs.req_ids")
    n = len(req_ids)
    columns = {}
    for name in ("new_token_ids", "new_block_ids", "num_computed_tokens", "num_output_tokens"):
        columns[name] = _list(c[name], f"scheduled_cached_reqs.{name}")
        if len(columns[name]) != n:
            _fail(
                f"scheduled_cached_reqs.{name} has {len(columns[name])} entries for {n} "
                f"req_ids: the lists are parallel, one entry per request"
            )
    all_token_ids = {
        _str(rid, "a key of scheduled_cached_reqs.all_token_ids"): _ints(
            tokens, f"scheduled_cached_reqs.all_token_ids[{rid!r}]"
        )
        for rid, tokens in _dict(c["all_token_ids"], "scheduled_cached_reqs.all_token_ids").items()
    }
    cached = CachedRequestData(
        req_ids=req_ids,
        resumed_req_ids=set(_strs(c["resumed"], "scheduled_cached_reqs.resumed_req_ids")),
        new_token_ids=[
            _ints(t, f"new_token_ids of {rid!r}")
            for rid, t in zip(req_ids, columns["new_token_ids"])
        ],
        all_token_ids=all_token_ids,
        new_block_ids=[
            None if b is None else _groups(b, f"new_block_ids of {rid!r}")
            for rid, b in zip(req_ids, columns["new_block_ids"])
        ],
        num_computed_tokens=[
            _int(v, f"num_computed_tokens of {rid!r}")
            for rid, v in zip(req_ids, columns["num_computed_tokens"])
        ],
        num_output_tokens=[
            _int(v, f"num_output_tokens of {rid!r}")
            for rid, v in zip(req_ids, columns["num_output_tokens"])
        ],
    )
    return SchedulerOutput(
        scheduled_new_reqs=new,
        scheduled_cached_reqs=cached,
        num_scheduled_tokens=num_scheduled,
        total_num_scheduled_tokens=_int(data["total"], "total_num_scheduled_tokens"),
        finished_req_ids=set(_strs(data["finished"], "finished_req_ids")),
        preempted_req_ids=set(_strs(data["preempted"], "preempted_req_ids")),
    )


def engine_outputs(data: Any) -> list[EngineCoreOutput]:
    """The judge's own ``EngineCoreOutput``s from the data read in the learner process."""
    results = []
    for entry in _list(data, "update_from_output's result"):
        rid = _str(entry[0], "EngineCoreOutput.request_id")
        stop = entry[3]
        if stop is not None and type(stop) not in (int, str):
            _fail(
                f"EngineCoreOutput.stop_reason of {rid!r} must be a token id or None, got "
                f"{describe(stop)}"
            )
        results.append(
            EngineCoreOutput(
                request_id=rid,
                new_token_ids=_ints(entry[1], f"new_token_ids of {rid!r}"),
                finish_reason=_reason(entry[2], f"finish_reason of {rid!r}"),
                stop_reason=stop,
            )
        )
    return results


def batch(out: SchedulerOutput) -> list[tuple[str, int]]:
    """The step's batch in scheduling order: [(request id, tokens), ...]."""
    return list(out.num_scheduled_tokens.items())


def _batch_text(out: SchedulerOutput) -> str:
    return " ".join(f"{rid}:{n}" for rid, n in out.num_scheduled_tokens.items()) or "nothing"


def _ids_text(ids: Iterable[str]) -> str:
    return "[" + ", ".join(sorted(ids)) + "]"


@dataclass
class Spec:
    """What the judge knows of a request it sent: enough to compute its expected output."""

    prompt: list[int]
    max_tokens: int | None
    eos: int | None
    sampling: dict[str, Any]
    generation_eos: int | None

    def params(self) -> SamplingParams:
        params = SamplingParams(temperature=0.0, max_tokens=self.max_tokens, **self.sampling)
        if self.generation_eos is not None:
            params.update_from_generation_config({}, eos_token_id=self.generation_eos)
        return params


# -- the engine -------------------------------------------------------------------------------
class Engine:
    """The learner's scheduler (and, with ``reference``, the reference one) driven call by call.

    ``step()`` is ``schedule()``, the fake model, ``update_from_output()``; ``abort()`` is
    ``finish_requests``. After every call ``self.state`` holds the learner's state as data,
    already checked; ``self.out`` is the last ``SchedulerOutput`` (the judge's copy).

    ``schedule(ahead=True)`` plans a step while the previous one is still in flight (its
    ``update_from_output`` not yet called), as async scheduling does; ``update()`` then applies
    the oldest step in flight first.
    """

    def __init__(
        self,
        num_blocks: int = 20,
        budget: int = 16,
        max_num_seqs: int = 4,
        max_model_len: int = 64,
        caching: bool = True,
        *,
        block_size: int = BS,
        seed: int = SEED,
        vocab: int = VOCAB,
        reference: bool = False,
        **kwargs: Any,
    ) -> None:
        scheduler_module()  # the learner's module: a missing file or an import error stops here
        self.side = learner_module("learner_side")
        self.num_blocks, self.block_size, self.budget = num_blocks, block_size, budget
        self.max_num_seqs, self.max_model_len = max_num_seqs, max_model_len
        self.seed, self.vocab = seed, vocab
        args = (num_blocks, block_size, max_model_len, budget, max_num_seqs, caching)
        self.sched = self.side.make_scheduler(*args, **kwargs)
        # The helpers, looked up once (each lookup is a request to the learner process).
        self._schedule, self._update, self._finish, self._state, self._make_request = (
            self.side.schedule,
            self.side.update,
            self.side.finish,
            self.side.state,
            self.side.make_request,
        )
        self.ref = (
            reader.make_scheduler(*args, scheduler_cls=ReferenceScheduler, **kwargs)
            if reference
            else None
        )
        self.runner = FakeModelRunner(block_size, seed, vocab)
        self.handles: dict[str, Remote] = {}
        self.ref_reqs: dict[str, Any] = {}
        self.specs: dict[str, Spec] = {}
        self.outputs: dict[str, list[int]] = {}
        self.finished: dict[str, FinishReason] = {}
        self.aborted: set[str] = set()
        self.admission_order: list[str] = []
        self.rows: list[tuple[str, str, str, str]] = []
        self.log: list[str] = []
        self.state: dict[str, Any] | None = None
        self.out: SchedulerOutput | None = None
        self.num_steps = 0
        #: The steps in flight, oldest first: (the learner's output, the reference's, the
        #: judge's copy, the step's number).
        self._pending: list[tuple[Any, Any, SchedulerOutput, int]] = []

    # -- context for messages ---------------------------------------------------------------
    def recent(self, n: int = 10) -> str:
        lines = self.log[-n:]
        more = len(self.log) - len(lines)
        head = f"  ({more} earlier operations)\n" if more else ""
        return "what happened so far:\n" + head + "\n".join(f"  {line}" for line in lines)

    def fail(self, message: str) -> None:
        _fail(f"{message}\n{self.recent()}")

    def _learner(self, what: str, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` in the learner process; its exception becomes a failure with context."""
        try:
            return fn(*args)
        except LearnerError as exc:
            self.fail(f"{what} raised {getattr(exc, 'display', exc)}")

    def _handle_list(self) -> list[Remote]:
        return list(self.handles.values())

    # -- requests -------------------------------------------------------------------------
    def add(
        self,
        rid: str,
        num_prompt: int | None = None,
        *,
        prompt: Iterable[int] | None = None,
        max_tokens: int | None = 8,
        base: int = 0,
        eos: int | None = None,
        generation_eos: int | None = None,
        priority: int = 0,
        arrival: float | None = None,
        **sampling: Any,
    ) -> Remote:
        """Create request ``rid`` in the learner process (prompt ``base, base + 1, ...`` unless
        given) and ``add_request`` it; returns the learner's request (a proxy). Requests arrive
        at times 0, 1, 2, ... in the order they are added (ties under the priority policy),
        unless ``arrival`` gives the time (a request that reaches the scheduler late)."""
        tokens = list(prompt) if prompt is not None else [base + i for i in range(num_prompt or 0)]
        if arrival is None:
            arrival = float(len(self.specs))
        req = self._make_request(
            rid,
            tokens,
            self.block_size,
            max_tokens,
            eos,
            generation_eos,
            priority,
            arrival,
            **sampling,
        )
        self._learner(f"add_request({rid})", self.sched.add_request, req)
        self.handles[rid] = req
        if self.ref is not None:
            ref_req = reader.make_request(
                rid,
                tokens,
                self.block_size,
                max_tokens,
                eos,
                generation_eos,
                priority,
                arrival,
                **sampling,
            )
            self.ref.add_request(ref_req)
            self.ref_reqs[rid] = ref_req
        self.specs[rid] = Spec(tokens, max_tokens, eos, dict(sampling), generation_eos)
        self.outputs[rid] = []
        self.log.append(
            f"{rid} arrives: a {len(tokens)}-token prompt, max_tokens {max_tokens}"
            + (f", eos {eos}" if eos is not None else "")
        )
        self.state = None
        return req

    def refresh(self) -> dict[str, Any]:
        """Read the learner's state again (after a call made outside the engine)."""
        self.state = self.check_state(self._state(self.sched, self._handle_list()), "now")
        return self.state

    def current(self) -> dict[str, Any]:
        return self.state if self.state is not None else self.refresh()

    @property
    def running(self) -> list[str]:
        return list(self.current()["running"])

    @property
    def waiting(self) -> list[str]:
        return list(self.current()["waiting"])

    def info(self, rid: str) -> dict[str, Any]:
        """A request's counters (status, num_computed_tokens, output_token_ids...) as data."""
        return self.current()["reqs"][rid]

    def table(self, rid: str) -> list[int]:
        return list(self.current()["tables"].get(rid, []))

    def num_free(self) -> int:
        return self.current()["free"]

    def unfinished(self) -> bool:
        state = self.current()
        return bool(state["running"] or state["waiting"])

    def unfinished_counts(self) -> tuple[int, bool]:
        """The scheduler's own answers: ``get_num_unfinished_requests()`` and
        ``has_unfinished_requests()`` (given code, which counts the queues)."""
        count = self._learner(
            "get_num_unfinished_requests()", self.sched.get_num_unfinished_requests
        )
        has = self._learner("has_unfinished_requests()", self.sched.has_unfinished_requests)
        count = _int(count, "get_num_unfinished_requests()")
        if type(has) is not bool:
            self.fail(f"has_unfinished_requests() must return a bool, got {describe(has)}")
        return count, has

    # -- the engine loop ---------------------------------------------------------------------
    def schedule(self, ahead: bool = False) -> SchedulerOutput:
        """``schedule()`` in the learner process; checked, and compared with the reference.

        With ``ahead`` the steps already scheduled may still be in flight (no
        ``update_from_output`` yet): the order of async scheduling, or of any caller that plans
        the next step before the last one's tokens are in."""
        if self._pending and not ahead:
            raise RuntimeError("test bug: the previous step's update_from_output is missing")
        in_flight = [step for *_, step in self._pending]
        self.num_steps += 1
        where = f"step {self.num_steps}: schedule()"
        if in_flight:
            where += f" (step {', '.join(map(str, in_flight))} still in flight)"
        handle, data, state = self._learner(where, self._schedule, self.sched, self._handle_list())
        out = scheduler_output(data)
        self.log.append(
            f"{where} -> batch {_batch_text(out)}"
            + (f", preempted {_ids_text(out.preempted_req_ids)}" if out.preempted_req_ids else "")
            + (
                f", finished_req_ids {_ids_text(out.finished_req_ids)}"
                if out.finished_req_ids
                else ""
            )
        )
        self.state = self.check_state(state, f"after {where}")
        self._check_output(out, where)
        ref_out = None
        if self.ref is not None:
            ref_out = self.ref.schedule()
            self._compare_output(data, reader.output_data(ref_out), where)
            self._compare_state(where)
        self._pending.append((handle, ref_out, out, self.num_steps))
        self.out = out
        self.admission_order += [new.req_id for new in out.scheduled_new_reqs]
        return out

    def execute(self, out: SchedulerOutput) -> dict[str, list[int]]:
        """The fake model runs ``out`` here, in the judge; returns the sampled tokens."""
        step = next((n for *_, o, n in self._pending if o is out), self.num_steps)
        try:
            return self.runner.execute_model(out)
        except Exception as exc:  # RunnerContractError, or data the runner cannot use
            self.fail(f"step {step}: the model runner cannot execute your SchedulerOutput: {exc}")
            raise  # unreachable

    def update(
        self, sampled: dict[str, list[int]], raises: type[Exception] | None = None
    ) -> list[EngineCoreOutput] | None:
        """``update_from_output(out, sampled)`` for the oldest ``schedule()`` in flight.

        With a reference, the learner must raise where the reference raises (a ``ValueError``
        for a runner bug) and return where it returns; without one, ``raises`` says which.
        A call that raised leaves the step pending (it may be retried); the state after it is
        read and checked all the same.
        """
        if not self._pending:
            raise RuntimeError("test bug: update() without schedule()")
        handle, ref_out, out, step = self._pending[0]
        where = f"step {step}: update_from_output({_sampled_text(sampled)})"
        ref_results = None
        if self.ref is not None:
            try:
                ref_results = self.ref.update_from_output(
                    ref_out, {rid: list(t) for rid, t in sampled.items()}
                )
                raises = None
            except ValueError:
                raises = ValueError
        try:
            results_data, state = self._update(self.sched, handle, sampled, self._handle_list())
        except LearnerError as exc:
            if raises is None or not isinstance(exc, raises):
                self.fail(f"{where} raised {getattr(exc, 'display', exc)}")
            self.log.append(f"{where} -> raised {raises.__name__}, as it must")
            self.state = self.check_state(
                self._state(self.sched, self._handle_list(), False), f"after {where} raised"
            )
            if self.ref is not None:
                self._compare_state(f"{where} (which raised; nothing may have changed)")
            return None
        if raises is not None:
            self.log.append(f"{where} -> returned")
            self.fail(
                f"{where} must raise {raises.__name__}: the runner handed back sampled "
                f"tokens for a request in the middle of its prefill (a non-final chunk "
                f"samples nothing), so the runner is broken and nothing may be applied"
            )
        results = engine_outputs(results_data)
        self.log.append(
            f"{where} -> " + (", ".join(_result_text(r) for r in results) or "no output")
        )
        self._pending.pop(0)
        self.state = self.check_state(state, f"after {where}")
        self._check_results(results, out, where)
        if self.ref is not None:
            self._compare_results(results_data, reader.outputs_data(ref_results), where)
            self._compare_state(where)
        for res in results:
            self.outputs.setdefault(res.request_id, []).extend(res.new_token_ids)
            if res.finish_reason is not None:
                self.finished[res.request_id] = res.finish_reason
        return results

    def step(self) -> tuple[SchedulerOutput, list[EngineCoreOutput]]:
        """One engine step; returns the SchedulerOutput and the EngineCoreOutputs."""
        out = self.schedule()
        sampled = self.execute(out)
        results = self.update(sampled)
        assert results is not None
        self.rows.append(self._row(out, results))
        return out, results

    def run(self, max_steps: int = 300) -> int:
        """Step until no request is left; return the number of steps."""
        for n in range(max_steps):
            if not self.unfinished():
                return n
            self.step()
        self.fail(
            f"requests still unfinished after {max_steps} steps (running {self.running}, "
            f"waiting {self.waiting}): the scheduler makes no progress"
        )
        return max_steps

    def abort(
        self, request_ids: Any, status: RequestStatus = RequestStatus.FINISHED_ABORTED
    ) -> list[str]:
        """``finish_requests(request_ids, status)``; returns the ids it says it finished."""
        where = f"finish_requests({request_ids!r}, {status.name})"
        if self._pending:
            where += f" between step {self._pending[0][3]}'s schedule() and update_from_output()"
        done, state = self._learner(
            where, self._finish, self.sched, request_ids, status, self._handle_list()
        )
        done = _strs(done, f"what {where} returned", unique=False)
        self.log.append(f"{where} -> {done}")
        self.state = self.check_state(state, f"after {where}")
        if len(set(done)) != len(done):
            self.fail(f"{where} returned {done}: each request finished is listed once")
        for rid in done:
            info = self.state["reqs"].get(rid)
            if info is None:
                self.fail(f"{where} returned {rid!r}, which is no request of this test")
            if info["status"] != status:
                self.fail(
                    f"{where}: {rid} was finished, so its status must be {status.name}, "
                    f"is {info['status'].name}"
                )
        self.aborted.update(done)
        if self.ref is not None:
            ref_done = self.ref.finish_requests(request_ids, status)
            if sorted(done) != sorted(ref_done):
                self.fail(
                    f"{where} returned {sorted(done)}; it must return the requests it "
                    f"finished, each once: {sorted(ref_done)} (unknown, already finished "
                    f"and repeated ids are ignored)"
                )
            self._compare_state(where)
        return done

    def reset_prefix_cache(self, reset_running_requests: bool = False) -> Any:
        """``reset_prefix_cache(reset_running_requests)``, the given code that (with ``True``)
        preempts every running request through ``_preempt_request``; returns its answer."""
        where = f"reset_prefix_cache(reset_running_requests={reset_running_requests})"
        reset = self._learner(where, self.sched.reset_prefix_cache, reset_running_requests)
        self.log.append(f"{where} -> {reset!r}")
        self.refresh()
        return reset

    # -- checks on the learner's data alone ---------------------------------------------------
    def check_state(self, state: Any, when: str) -> dict[str, Any]:
        """Types, then what holds after every call, whatever the schedule."""
        state = _dict(state, "the scheduler's state")
        running = _strs(state["running"], "running (request ids, in order)")
        waiting = _strs(state["waiting"], "waiting (request ids, in order)")
        requests = _strs(state["requests"], "the keys of requests")
        pending = _strs(state["pending_finished"], "finished_req_ids")
        tables: dict[str, list[int]] = {}
        for rid, blocks in _list(state["tables"], "req_to_blocks"):
            tables[_str(rid, "a key of req_to_blocks")] = _ints(blocks, f"{rid}'s block table")
        free = _int(state["free"], "get_num_free_blocks()")
        refs = _ints(state["ref_cnts"], "the blocks' ref_cnt")
        reqs = {}
        for row in _list(state["reqs"], "the requests' counters"):
            rid = _str(row[0], "a request id")
            info = dict(zip(reader.REQUEST_FIELDS, row[1:]))
            reqs[rid] = {
                **info,
                "status": _status(info["status"], f"{rid}.status"),
                "num_computed_tokens": _int(
                    info["num_computed_tokens"], f"{rid}.num_computed_tokens"
                ),
                "num_tokens": _int(info["num_tokens"], f"{rid}.num_tokens"),
                "output_token_ids": _ints(info["output_token_ids"], f"{rid}.output_token_ids"),
                "num_preemptions": _int(info["num_preemptions"], f"{rid}.num_preemptions"),
            }
        # Both are read from every manager, chained or not: the course's KVCacheManager (the
        # reference, or lab-07's with its given __init__) takes the counting wrapper and has a
        # prefix_cache_stats, and an exemption for one that does not is one the code under test
        # can claim (tests/hostile/refuse_the_counter_and_hide_the_statistics.py).
        if state["lookups"] == "uncounted":
            raise AssertionError(
                "the scheduler's kv_cache_manager does not count its get_computed_blocks "
                "calls: keep the manager the scheduler was given, as it was given, and its "
                "class as lab-07 gives it (the suite wraps that object's get_computed_blocks "
                "to count the prefix-cache lookups)"
            )
        lookups = {
            _str(rid, "a request id"): _int(n, f"{rid}'s lookups")
            for rid, n in _list(state["lookups"], "the prefix-cache lookups")
        }
        statistics = _ints(
            state["statistics"],
            "the counters of kv_cache_manager.prefix_cache_stats (the manager is built with "
            "log_stats=True, so it keeps them from its __init__ on)",
        )
        checked = {
            "lookups": lookups,
            "statistics": statistics,
            "running": running,
            "waiting": waiting,
            "requests": requests,
            "pending_finished": pending,
            "tables": tables,
            "free": free,
            "reqs": reqs,
        }

        def bad(message: str) -> None:
            self.fail(f"{when}: {message}")

        # The block pool on its own (I1, I2), when it was read whole; then against the tables.
        if state["pool"] is not None:
            try:
                free_ids = check_pool_snapshot(_dict(state["pool"], "the pool snapshot"))
            except AssertionError as exc:
                bad(f"the block pool is broken: {exc}")
            if free != len(free_ids):
                bad(
                    f"get_num_free_blocks() is {free} but the free queue links {len(free_ids)} "
                    "blocks"
                )
        if len(refs) != self.num_blocks:
            bad(f"the pool has {len(refs)} blocks, {self.num_blocks} were asked for")
        held = Counter(b for blocks in tables.values() for b in blocks)
        strange = sorted(b for b in held if not 0 < b < self.num_blocks)
        if strange:
            bad(
                f"block tables hold block ids {strange}: only 1 .. {self.num_blocks - 1} exist "
                "(block 0 is the null block)"
            )
        for block_id in range(1, len(refs)):
            if refs[block_id] != held[block_id]:
                owners = sorted(rid for rid, blocks in tables.items() if block_id in blocks)
                bad(
                    f"block {block_id} has ref_cnt {refs[block_id]} but {held[block_id]} block "
                    f"table(s) hold it ({owners}): a block is freed once per holder, and only "
                    "by a request that holds it"
                )
        if len(held) + free != self.num_blocks - 1:
            bad(
                f"{len(held)} blocks are held and {free} are free, out of {self.num_blocks - 1} "
                "usable: blocks leaked"
            )
        # The queues.
        for rid, info in reqs.items():
            if not RequestStatus.is_finished(info["status"]):
                continue
            where = (
                "running"
                if rid in running
                else "the waiting queue"
                if rid in waiting
                else "requests"
                if rid in requests
                else None
            )
            if where is not None:
                why = (
                    " (a request that finishes while PREEMPTED, aborted or stopped by a "
                    "token that was in flight when it was preempted, is in the waiting "
                    "queue: take it out of there)"
                    if where == "the waiting queue" and info["num_preemptions"]
                    else ""
                )
                bad(
                    f"{rid} is finished ({info['status'].name}) but still in {where}: a "
                    f"finished request leaves its queue, and requests (_free_request){why}"
                )
        if set(running) & set(waiting):
            bad(f"{sorted(set(running) & set(waiting))} are both running and waiting")
        if set(running) | set(waiting) != set(requests):
            bad(
                f"requests holds {sorted(requests)} but running + waiting are "
                f"{sorted(set(running) | set(waiting))}: every unfinished request is in exactly "
                "one queue, and a finished one in none (nor in requests)"
            )
        if len(running) > self.max_num_seqs:
            bad(
                f"{len(running)} requests are running ({running}), max_num_seqs is "
                f"{self.max_num_seqs}"
            )
        for rid, blocks in tables.items():
            if blocks and rid not in running:
                what = "waits" if rid in waiting else "is finished"
                bad(f"{rid} {what} but holds blocks {blocks}: only running requests hold blocks")
        for rid, info in reqs.items():
            status = info["status"]
            if rid in running:
                if status != RequestStatus.RUNNING:
                    bad(f"{rid} is in running with status {status.name}")
                slots = len(tables.get(rid, [])) * self.block_size
                if slots < info["num_computed_tokens"]:
                    bad(
                        f"{rid} counts {info['num_computed_tokens']} computed tokens but its "
                        f"block table has {slots} slots"
                    )
            elif rid in waiting:
                if status not in _WAITING:
                    bad(f"{rid} is in the waiting queue with status {status.name}")
                if info["num_computed_tokens"] != 0:
                    bad(
                        f"{rid} waits with num_computed_tokens {info['num_computed_tokens']}: "
                        "a waiting request has no KV (it starts from 0, or from a prefix hit "
                        "found when it is admitted)"
                    )
            elif not RequestStatus.is_finished(status):
                bad(f"{rid} has status {status.name} but is in no queue: it is lost")
        return checked

    def _check_output(self, out: SchedulerOutput, where: str) -> None:
        state = self.state
        assert state is not None
        scheduled = list(out.num_scheduled_tokens)
        total = sum(out.num_scheduled_tokens.values())
        if total > self.budget:
            self.fail(
                f"{where}: token budget: {total} tokens scheduled ({_batch_text(out)}) "
                f"but max_num_batched_tokens is {self.budget}"
            )
        if out.total_num_scheduled_tokens != total:
            self.fail(
                f"{where}: total_num_scheduled_tokens is {out.total_num_scheduled_tokens}, "
                f"the batch sums to {total}"
            )
        new_ids = [new.req_id for new in out.scheduled_new_reqs]
        cached_ids = out.scheduled_cached_reqs.req_ids
        if sorted(new_ids + cached_ids) != sorted(scheduled):
            self.fail(
                f"{where}: the batch is {scheduled} but scheduled_new_reqs {new_ids} and "
                f"scheduled_cached_reqs {cached_ids} describe other requests (each "
                "scheduled request once, in one of them)"
            )
        if not out.scheduled_cached_reqs.resumed_req_ids <= set(cached_ids):
            self.fail(
                f"{where}: resumed_req_ids {out.scheduled_cached_reqs.resumed_req_ids} are "
                f"not all among scheduled_cached_reqs.req_ids {cached_ids}"
            )
        not_running = [rid for rid in scheduled if rid not in state["running"]]
        if not_running:
            self.fail(f"{where}: {not_running} are scheduled but not in running {state['running']}")
        if out.preempted_req_ids & set(scheduled):
            self.fail(
                f"{where}: {sorted(out.preempted_req_ids & set(scheduled))} are both "
                "preempted and scheduled"
            )
        lost = [rid for rid in out.preempted_req_ids if rid not in state["waiting"]]
        if lost:
            self.fail(f"{where}: {lost} were preempted but are not back in the waiting queue")
        alive = set(state["requests"]) & out.finished_req_ids
        if alive:
            self.fail(f"{where}: finished_req_ids lists {sorted(alive)}, which are not finished")

    def _check_results(
        self, results: list[EngineCoreOutput], out: SchedulerOutput, where: str
    ) -> None:
        state = self.state
        assert state is not None
        ids = [res.request_id for res in results]
        if len(set(ids)) != len(ids):
            self.fail(f"{where}: one output per request and step, got outputs for {ids}")
        for res in results:
            rid = res.request_id
            if rid not in out.num_scheduled_tokens:
                self.fail(f"{where}: an output for {rid}, which was not scheduled in this step")
            if not res.new_token_ids and res.finish_reason is None:
                self.fail(
                    f"{where}: an output for {rid} with no token and no finish: a request "
                    "that got no token (a prefill chunk) produces no output"
                )
            status = state["reqs"][rid]["status"] if rid in state["reqs"] else None
            if res.finish_reason is not None:
                if rid in state["running"] or rid in state["requests"]:
                    self.fail(
                        f"{where}: {rid} finished ({res.finish_reason}) but is still in "
                        "running / requests"
                    )
                if (
                    status is not None
                    and status.name.startswith("FINISHED")
                    and (RequestStatus.get_finished_reason(status) != res.finish_reason)
                ):
                    self.fail(
                        f"{where}: {rid}'s output says {res.finish_reason} but its status "
                        f"is {status.name}"
                    )

    # -- against the reference ------------------------------------------------------------------
    def _compare_output(self, mine: dict[str, Any], ref: dict[str, Any], where: str) -> None:
        def shape(data: dict[str, Any]) -> dict[str, Any]:
            c = data["cached"]
            return {
                "batch (request: tokens, in order)": [tuple(p) for p in data["batch"]],
                "admitted (scheduled_new_reqs: id, prompt, prefix hit in tokens, blocks)": [
                    (e[0], list(e[1]), e[3], len(e[2][0])) for e in data["new"]
                ],
                "scheduled_cached_reqs.req_ids": list(c["req_ids"]),
                "resumed_req_ids": sorted(c["resumed"]),
                "scheduled_cached_reqs.new_token_ids": [list(t) for t in c["new_token_ids"]],
                "requests sent their whole token list again (scheduled_cached_reqs.all_token_ids:"
                " resumed, or not scheduled in the previous step)": sorted(c["all_token_ids"]),
                "scheduled_cached_reqs.num_computed_tokens": list(c["num_computed_tokens"]),
                "scheduled_cached_reqs.num_output_tokens": list(c["num_output_tokens"]),
                "number of new blocks (None: none added) of each cached request": [
                    None if b is None else len(b[0]) for b in c["new_block_ids"]
                ],
                "preempted_req_ids": sorted(data["preempted"]),
                "finished_req_ids": sorted(data["finished"]),
            }

        a, b = shape(mine), shape(ref)
        for key in b:
            if a[key] != b[key]:
                self.fail(
                    f"{where}: {key} differs from the reference scheduler's:\n"
                    f"  yours:     {a[key]}\n  reference: {b[key]}"
                )

    def _compare_results(self, mine: list[Any], ref: list[Any], where: str) -> None:
        a = [(r[0], list(r[1]), r[2], r[3]) for r in mine]
        b = [(r[0], list(r[1]), r[2], r[3]) for r in ref]
        if a != b:
            self.fail(
                f"{where}: the outputs (request, new tokens, finish reason, stop reason) "
                f"differ from the reference scheduler's:\n  yours:     {a}\n"
                f"  reference: {b}"
            )

    def _compare_state(self, where: str) -> None:
        assert self.ref is not None and self.state is not None
        raw = reader.state(self.ref, list(self.ref_reqs.values()), pool=False)
        ref = {
            **raw,
            "tables": dict(raw["tables"]),
            "reqs": {row[0]: dict(zip(reader.REQUEST_FIELDS, row[1:])) for row in raw["reqs"]},
        }
        mine = self.state
        simple = {
            "running": (mine["running"], ref["running"]),
            "the waiting queue": (mine["waiting"], ref["waiting"]),
            "requests (unfinished)": (sorted(mine["requests"]), sorted(ref["requests"])),
            "finished_req_ids (to report next step)": (
                sorted(mine["pending_finished"]),
                sorted(ref["pending_finished"]),
            ),
            "free blocks": (mine["free"], ref["free"]),
            "blocks held per request": (
                {r: len(t) for r, t in mine["tables"].items() if t},
                {r: len(t) for r, t in ref["tables"].items() if t},
            ),
        }
        for what, (a, b) in simple.items():
            if a != b:
                self.fail(
                    f"after {where}: {what} differs from the reference scheduler's:\n"
                    f"  yours:     {a}\n  reference: {b}"
                )
        theirs = dict(raw["lookups"])
        if mine["lookups"] != theirs:
            self.fail(
                f"after {where}: the prefix-cache lookups (get_computed_blocks calls per "
                "request, each one counted in the prefix-cache statistics) differ from the "
                f"reference scheduler's:\n  yours:     {mine['lookups']}\n  reference: {theirs}\n"
                "The waiting pass looks up only the request it is about to try, once the while "
                "condition (a waiting request, budget left, len(running) < max_num_seqs) holds, "
                "and running requests are never looked up (README, the shape of schedule())"
            )
        if mine["statistics"] != raw["statistics"]:
            self.fail(
                f"after {where}: the prefix-cache statistics (kv_cache_manager."
                f"prefix_cache_stats: {', '.join(reader.STATISTICS)}) differ from the reference "
                f"scheduler's:\n  yours:     {mine['statistics']}\n  reference: "
                f"{raw['statistics']}\nEvery get_computed_blocks call is a lookup the statistics "
                "record, however it is made: look up only the request the waiting pass is "
                "about to try (README, the shape of schedule())"
            )
        fields = (
            "status",
            "num_computed_tokens",
            "num_tokens",
            "output_token_ids",
            "num_preemptions",
            "stop_reason",
            "max_tokens",
        )
        for rid, theirs in ref["reqs"].items():
            ours = mine["reqs"][rid]
            for name in fields:
                if ours[name] != theirs[name] or type(ours[name]) is not type(theirs[name]):
                    self.fail(
                        f"after {where}: {rid}.{name} is {describe(ours[name])}, the "
                        f"reference scheduler's is {describe(theirs[name])}"
                    )
            if rid in ref["running"] and ours["is_prefill_chunk"] is not theirs["is_prefill_chunk"]:
                self.fail(
                    f"after {where}: {rid}.is_prefill_chunk is "
                    f"{describe(ours['is_prefill_chunk'])}, the reference scheduler's is "
                    f"{theirs['is_prefill_chunk']}"
                )

    # -- the end ---------------------------------------------------------------------------------
    def expected(self, rid: str) -> tuple[list[int], FinishReason]:
        spec = self.specs[rid]
        return expected_output(
            rid,
            len(spec.prompt),
            spec.params(),
            spec.eos,
            self.max_model_len,
            self.seed,
            self.vocab,
        )

    def mismatches(self) -> list[str]:
        """Requests (not aborted) whose output or finish reason is not the fake model's."""
        bad = []
        for rid in self.specs:
            if rid in self.aborted:
                continue
            tokens, reason = self.expected(rid)
            if self.outputs.get(rid) != tokens or self.finished.get(rid) != reason:
                bad.append(rid)
        return bad

    def check_drained(self) -> None:
        """Everyone finished: nothing queued, no block held, every output the model's."""
        state = self.refresh()
        if state["running"] or state["waiting"] or state["requests"]:
            self.fail(
                f"after the last step: running {state['running']}, waiting "
                f"{state['waiting']}, requests {state['requests']}: all must be empty"
            )
        if any(state["tables"].values()) or state["free"] != self.num_blocks - 1:
            self.fail(
                f"after the last step {state['free']} of {self.num_blocks - 1} usable "
                f"blocks are free and tables {state['tables']} remain: blocks leaked"
            )
        for rid in self.specs:
            tokens, reason = self.expected(rid)
            got = self.outputs.get(rid, [])
            if rid in self.aborted:
                if got != tokens[: len(got)]:
                    self.fail(
                        f"{rid} (aborted) produced {got}, which is not the start of the "
                        f"fake model's output {tokens}"
                    )
            elif got != tokens or self.finished.get(rid) != reason:
                self.fail(
                    f"{rid} produced {got} and finished {self.finished.get(rid)}; the fake "
                    f"model's output is {tokens}, finished {reason}"
                )

    def _row(
        self, out: SchedulerOutput, results: list[EngineCoreOutput]
    ) -> tuple[str, str, str, str]:
        """The step as ``python -m mini_vllm.teaching.sim`` prints it: batch, admitted, preempted,
        finished."""
        from mini_vllm.teaching.sim.render import step_row

        start = {new.req_id: new.num_computed_tokens for new in out.scheduled_new_reqs}
        cached = out.scheduled_cached_reqs
        start.update(zip(cached.req_ids, cached.num_computed_tokens))
        scheduled = []
        for rid, n in out.num_scheduled_tokens.items():
            new_outputs = next((len(r.new_token_ids) for r in results if r.request_id == rid), 0)
            num_outputs = len(self.outputs.get(rid, [])) - new_outputs
            num_tokens = len(self.specs[rid].prompt) + num_outputs
            if start[rid] + n < num_tokens:
                kind = "chunk"
            elif n == 1 and num_outputs > 0:
                kind = "decode"
            else:
                kind = "prefill"
            scheduled.append((rid, n, kind))
        hits = {
            new.req_id: new.num_computed_tokens
            for new in out.scheduled_new_reqs
            if new.num_computed_tokens
        }
        for i, rid in enumerate(cached.req_ids):
            if rid in cached.resumed_req_ids and cached.num_computed_tokens[i]:
                hits[rid] = cached.num_computed_tokens[i]
        record = StepRecord(
            step=self.num_steps,
            scheduled=scheduled,
            num_scheduled_tokens=out.total_num_scheduled_tokens,
            admitted=[new.req_id for new in out.scheduled_new_reqs],
            resumed=sorted(cached.resumed_req_ids, key=cached.req_ids.index),
            prefix_hits=hits,
            preempted=sorted(out.preempted_req_ids, key=_id_order),
            finished=[
                (r.request_id, r.finish_reason) for r in results if r.finish_reason is not None
            ],
            block_tables={},
            num_free_blocks=0,
            kv_usage=0.0,
            waiting=[],
        )
        row = step_row(record)
        return (row[1], row[3], row[4], row[5])


def x_and_y_fill_the_pool(x_arrival: float, **options: Any) -> Engine:
    """Two usable blocks of 4: x (3 tokens, arriving at ``x_arrival``) is admitted, then y (3
    tokens, arriving at 0.0), each holding one block, so that x's next token needs a block and
    none is free: the set-up of the victim tests, which vary the policy (``options``) and x's
    arrival against y's."""
    engine = Engine(num_blocks=3, budget=8, **options)
    engine.add("x", 3, base=0, max_tokens=3, arrival=x_arrival)
    engine.step()
    engine.add("y", 3, base=40, max_tokens=2, arrival=0.0)
    engine.step()
    assert engine.running == ["x", "y"] and engine.num_free() == 0, (
        f"set-up: x and y run and hold the 2 usable blocks; running {engine.running}, "
        f"{engine.num_free()} free"
    )
    return engine


def _id_order(request_id: str) -> tuple[int, str]:
    digits = "".join(ch for ch in request_id if ch.isdigit())
    return (int(digits) if digits else -1, request_id)


def _sampled_text(sampled: dict[str, list[int]]) -> str:
    return "{" + ", ".join(f"{rid}: {tokens}" for rid, tokens in sampled.items()) + "}"


def _result_text(res: EngineCoreOutput) -> str:
    end = f" finished ({res.finish_reason})" if res.finish_reason is not None else ""
    return f"{res.request_id} +{res.new_token_ids}{end}"


def simulate(config: Any, workload: list[Any], reference: bool = False) -> Engine:
    """Replay a ``mini_vllm.teaching.sim`` workload as its simulator does, on the learner's
    scheduler: requests are added at their arrival step (idle gaps skipped), then one engine
    step. The caller ends with ``engine.check_drained()``."""
    engine = Engine(
        config.num_gpu_blocks,
        config.max_num_batched_tokens,
        config.max_num_seqs,
        config.max_model_len,
        config.enable_caching,
        block_size=config.block_size,
        seed=config.seed,
        vocab=config.vocab_size,
        reference=reference,
        enable_chunked_prefill=config.enable_chunked_prefill,
        long_prefill_token_threshold=config.long_prefill_token_threshold,
    )
    pending = sorted(workload, key=lambda spec: spec.arrival_step)
    step = 0
    while pending or engine.unfinished():
        if not engine.unfinished() and pending[0].arrival_step > step:
            step = pending[0].arrival_step  # skip idle steps
        while pending and pending[0].arrival_step <= step:
            spec = pending.pop(0)
            params = spec.sampling_params
            engine.add(
                spec.request_id,
                prompt=spec.prompt_token_ids,
                max_tokens=params.max_tokens,
                eos=config.eos_token_id,
                ignore_eos=params.ignore_eos,
            )
        if engine.num_steps >= config.max_steps:
            engine.fail(
                f"requests still unfinished after {config.max_steps} steps: the "
                "scheduler makes no progress"
            )
        engine.step()
        step += 1
    return engine
