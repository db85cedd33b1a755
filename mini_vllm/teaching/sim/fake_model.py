"""A fake model whose output is known in advance, and a runner that checks the scheduler.

The token generated at position ``p`` of request ``r`` is a hash of
``(seed, r, p)``: it ignores the context, so the complete output of any request
can be computed without running anything (``expected_output``). Yet the runner
honours the contract of a real one: it learns about requests only through
``SchedulerOutput`` (new, cached, resumed, finished, preempted), samples only
after a request's last prompt chunk, and keeps a simulated paged KV cache in
which it writes every computed token into the slot its block table says. Before
"attending", it checks that the whole context of every scheduled request reads
back correctly through its block table, so a prefix-cache hit on the wrong block,
a block evicted while in use, or a block table that is too short shows up as a
wrong token rather than passing silently.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

from mini_vllm.core.sched.output import SchedulerOutput
from mini_vllm.request import FinishReason
from mini_vllm.sampling_params import SamplingParams


def fake_next_token(seed: int, request_id: str, position: int, vocab_size: int) -> int:
    """The token the fake model emits at ``position`` (0-based) of ``request_id``.

    A keyed hash (not Python's ``hash``, which is salted per process) so traces
    are reproducible across runs and machines.
    """
    digest = hashlib.blake2b(f"{seed}/{request_id}/{position}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") % vocab_size


def expected_output(
    request_id: str,
    num_prompt_tokens: int,
    sampling_params: SamplingParams,
    eos_token_id: int | None,
    max_model_len: int,
    seed: int,
    vocab_size: int,
) -> tuple[list[int], FinishReason]:
    """The tokens a request must end with, and why it must stop, without running it.

    Restates the stop rules independently of the scheduler (it is the oracle the
    tests compare against): nothing stops before ``min_tokens``; then EOS
    (unless ``ignore_eos``), a stop token, ``max_tokens`` or ``max_model_len``.
    """
    if sampling_params.ignore_eos:
        eos_token_id = None
    max_tokens = sampling_params.max_tokens
    if max_tokens is None:
        max_tokens = max_model_len - num_prompt_tokens
    stop_ids = set(sampling_params.stop_token_ids or ())
    out: list[int] = []
    while True:
        token = fake_next_token(seed, request_id, num_prompt_tokens + len(out), vocab_size)
        out.append(token)
        if len(out) < sampling_params.min_tokens:
            continue
        if token == eos_token_id or token in stop_ids:
            return out, FinishReason.STOP
        if num_prompt_tokens + len(out) >= max_model_len or len(out) >= max_tokens:
            return out, FinishReason.LENGTH


class RunnerContractError(AssertionError):
    """The scheduler's output broke what a model runner relies on."""


@dataclass
class _CachedState:
    """What the runner remembers about one request between steps."""

    token_ids: list[int]
    block_ids: list[int]
    num_computed_tokens: int


@dataclass
class FakeModelRunner:
    """Executes ``SchedulerOutput``s with the fake model, checking them as it goes.

    Args:
        block_size: Tokens per KV cache block.
        seed: Seed of the fake model (see ``fake_next_token``).
        vocab_size: Size of the fake vocabulary.
        verify_kv: Whether to keep the simulated KV cache and check every
            scheduled request's context against it.
    """

    block_size: int
    seed: int
    vocab_size: int
    verify_kv: bool = True
    requests: dict[str, _CachedState] = field(default_factory=dict)
    # block id -> the token written at each slot (None: never written).
    kv_cache: dict[int, list[int | None]] = field(default_factory=dict)

    def execute_model(self, scheduler_output: SchedulerOutput) -> dict[str, list[int]]:
        """Run one step; return the sampled token of each request that completed its prompt."""
        self._update_states(scheduler_output)
        steps: list[tuple[str, _CachedState, int, int]] = []
        for req_id, num_tokens in scheduler_output.num_scheduled_tokens.items():
            state = self.requests.get(req_id)
            if state is None:
                raise RunnerContractError(f"{req_id!r} is scheduled but the runner never saw it")
            start = state.num_computed_tokens
            end = start + num_tokens
            if num_tokens <= 0 or end > len(state.token_ids):
                raise RunnerContractError(
                    f"{req_id!r}: scheduled positions {start}..{end - 1} but only "
                    f"{len(state.token_ids)} tokens exist"
                )
            if len(state.block_ids) * self.block_size < end:
                raise RunnerContractError(
                    f"{req_id!r}: block table {state.block_ids} has no slot for position {end - 1}"
                )
            if 0 in state.block_ids[: -(-end // self.block_size)]:
                raise RunnerContractError(f"{req_id!r}: block table {state.block_ids} uses block 0")
            steps.append((req_id, state, start, end))

        # Like a real forward pass, every layer writes the whole batch's KV before
        # attending, so a request may read a block another request fills this step.
        if self.verify_kv:
            for _, state, start, end in steps:
                for pos in range(start, end):
                    self._slot(state, pos)[0][self._offset(pos)] = state.token_ids[pos]
            for req_id, state, _, end in steps:
                self._check_context(req_id, state, end)

        sampled: dict[str, list[int]] = {}
        for req_id, state, _, end in steps:
            state.num_computed_tokens = end
            if end == len(state.token_ids):
                token = fake_next_token(self.seed, req_id, len(state.token_ids), self.vocab_size)
                state.token_ids.append(token)
                sampled[req_id] = [token]
        return sampled

    def _update_states(self, out: SchedulerOutput) -> None:
        """Apply the diff in ``out`` to the runner's per-request state."""
        for req_id in out.finished_req_ids | out.preempted_req_ids:
            self.requests.pop(req_id, None)
        for new in out.scheduled_new_reqs:
            if new.req_id in self.requests:
                raise RunnerContractError(f"{new.req_id!r} is sent as new but is already known")
            self.requests[new.req_id] = _CachedState(
                token_ids=list(new.prompt_token_ids),
                block_ids=list(new.block_ids[0]),
                num_computed_tokens=new.num_computed_tokens,
            )
        cached = out.scheduled_cached_reqs
        for i, req_id in enumerate(cached.req_ids):
            new_block_ids = cached.new_block_ids[i]
            if req_id in cached.resumed_req_ids:
                if req_id not in cached.all_token_ids or new_block_ids is None:
                    raise RunnerContractError(
                        f"{req_id!r} resumes without its tokens or its block table"
                    )
                self.requests[req_id] = _CachedState(
                    token_ids=list(cached.all_token_ids[req_id]),
                    block_ids=list(new_block_ids[0]),
                    num_computed_tokens=cached.num_computed_tokens[i],
                )
            else:
                state = self.requests.get(req_id)
                if state is None:
                    raise RunnerContractError(f"{req_id!r} is sent as cached but is unknown")
                if state.num_computed_tokens != cached.num_computed_tokens[i]:
                    raise RunnerContractError(
                        f"{req_id!r}: scheduler says {cached.num_computed_tokens[i]} tokens "
                        f"computed, runner has {state.num_computed_tokens}"
                    )
                if req_id in cached.all_token_ids and cached.all_token_ids[req_id] != (
                    state.token_ids
                ):
                    raise RunnerContractError(f"{req_id!r}: token lists disagree")
                if new_block_ids is not None:
                    state.block_ids.extend(new_block_ids[0])
            state = self.requests[req_id]
            start = cached.num_computed_tokens[i]
            n = out.num_scheduled_tokens[req_id]
            if cached.new_token_ids[i] != state.token_ids[start : start + n]:
                raise RunnerContractError(
                    f"{req_id!r}: new_token_ids {cached.new_token_ids[i]} != "
                    f"{state.token_ids[start : start + n]}"
                )

    def _offset(self, pos: int) -> int:
        return pos % self.block_size

    def _slot(self, state: _CachedState, pos: int) -> tuple[list[int | None], int]:
        block_id = state.block_ids[pos // self.block_size]
        block = self.kv_cache.get(block_id)
        if block is None:
            block = self.kv_cache[block_id] = [None] * self.block_size
        return block, block_id

    def _check_context(self, req_id: str, state: _CachedState, end: int) -> None:
        """Every position the request attends to must read back its own token."""
        for pos in range(end):
            block, block_id = self._slot(state, pos)
            found = block[self._offset(pos)]
            if found != state.token_ids[pos]:
                raise RunnerContractError(
                    f"{req_id!r}: position {pos} reads token {found} from block {block_id}, "
                    f"expected {state.token_ids[pos]} (wrong prefix hit or block reused "
                    f"while in use?)"
                )
