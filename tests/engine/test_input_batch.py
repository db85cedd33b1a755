"""The persistent ``InputBatch`` flattens a step exactly as the from-scratch ``prepare_inputs``.

A hypothesis state machine drives one batch through arbitrary sequences of what the scheduler's
diffs do to it (requests arrive, finish, get blocks, resume with a new table and their tokens
resent, make progress, get sampled tokens) while a plain model keeps each live request as
lists. At every step over a random subset of the requests, in random order, some of them
decoding a placeholder for a token still in flight, ``InputBatch.prepare_inputs`` must return
the same tensors as ``prepare_inputs`` on the lists. The batch starts with room for two rows,
so growing it is exercised too, and freed rows are reused.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    invariant,
    precondition,
    rule,
)

from mini_vllm.sampling_params import SamplingParams
from mini_vllm.utils.math_utils import cdiv
from mini_vllm.worker.input_batch import InputBatch
from mini_vllm.worker.model_inputs import prepare_inputs

BLOCK_SIZE = 4
MAX_MODEL_LEN = 48
MAX_BLOCKS = cdiv(MAX_MODEL_LEN, BLOCK_SIZE)
GREEDY = SamplingParams(temperature=0.0)
VOCAB = 1000  # the token ids drawn below are under it
FIELDS = ("input_ids", "positions", "slot_mapping", "block_tables", "query_start_loc", "seq_lens")


class InputBatchMachine(RuleBasedStateMachine):
    reqs = Bundle("reqs")

    def __init__(self) -> None:
        super().__init__()
        self.batch = InputBatch(2, MAX_MODEL_LEN, MAX_BLOCKS, BLOCK_SIZE, torch.device("cpu"))
        self.model: dict[str, dict] = {}  # req_id -> tokens, computed, blocks
        self.next_id = 0
        self.next_block = 1

    def _blocks(self, n: int) -> list[int]:
        self.next_block += n
        return list(range(self.next_block - n, self.next_block))

    @rule(
        target=reqs,
        prompt=st.lists(st.integers(0, 999), min_size=1, max_size=24),
        data=st.data(),
    )
    def add(self, prompt: list[int], data: st.DataObject) -> str:
        req_id = f"r{self.next_id}"
        self.next_id += 1
        computed = data.draw(st.integers(0, len(prompt) - 1), label="num_computed_tokens")
        blocks = self._blocks(cdiv(len(prompt), BLOCK_SIZE))
        self.batch.add_request(req_id, prompt, GREEDY, blocks, computed)
        self.model[req_id] = {
            "tokens": list(prompt), "computed": computed, "blocks": blocks, "prompt": list(prompt)
        }  # fmt: skip
        return req_id

    @rule(req=consumes(reqs))
    def finish(self, req: str) -> None:
        assert self.batch.remove_request(req) is not None
        del self.model[req]

    @rule(req=reqs, data=st.data())
    def progress(self, req: str, data: st.DataObject) -> None:
        """The scheduler's diff: new progress, maybe new blocks (as far as the table allows)."""
        if req not in self.model:
            return
        m = self.model[req]
        m["computed"] = data.draw(st.integers(0, len(m["tokens"])), label="num_computed_tokens")
        room = MAX_BLOCKS - len(m["blocks"])
        extra = self._blocks(data.draw(st.integers(0, min(room, 2)), label="new_blocks"))
        row = self.batch.req_id_to_index[req]
        self.batch.num_computed_tokens_cpu[row] = m["computed"]
        if extra:
            self.batch.block_table.append_row(extra, row)
            m["blocks"] += extra

    @rule(req=reqs, token=st.integers(0, 999))
    def sampled(self, req: str, token: int) -> None:
        if req not in self.model or len(self.model[req]["tokens"]) >= MAX_MODEL_LEN:
            return
        row = self.batch.req_id_to_index[req]
        self.batch.append_sampled(np.array([row]), np.array([token], np.int32))
        self.model[req]["tokens"].append(token)

    @rule(req=reqs, more=st.lists(st.integers(0, 999), max_size=6))
    def resumed(self, req: str, more: list[int]) -> None:
        """Preempted and back: a new block table, the tokens resent, recomputing from 0."""
        if req not in self.model:
            return
        m = self.model[req]
        tokens = (m["tokens"] + more)[:MAX_MODEL_LEN]
        blocks = self._blocks(cdiv(len(tokens), BLOCK_SIZE))
        row = self.batch.req_id_to_index[req]
        self.batch.block_table.add_row(blocks, row)
        self.batch.set_token_ids(row, tokens)
        self.batch.num_computed_tokens_cpu[row] = 0
        self.model[req] = {"tokens": tokens, "computed": 0, "blocks": blocks, "prompt": m["prompt"]}

    @precondition(lambda self: self.model)
    @rule(data=st.data())
    def step(self, data: st.DataObject) -> None:
        ids = data.draw(
            st.lists(st.sampled_from(sorted(self.model)), min_size=1, unique=True), label="step"
        )
        rows, sched, known, lists = [], [], [], []
        for req_id in ids:
            m = self.model[req_id]
            tokens, computed = list(m["tokens"]), m["computed"]
            row = self.batch.req_id_to_index[req_id]
            capacity = len(m["blocks"]) * BLOCK_SIZE
            if computed == len(tokens):
                # decode of the token in flight: a placeholder, as the runner writes it
                if len(tokens) >= min(MAX_MODEL_LEN, capacity):
                    continue
                self.batch.token_ids_cpu[row, len(tokens)] = 0
                tokens.append(0)
                n = 1
            else:
                top = min(len(tokens), capacity) - computed
                if top < 1:
                    continue
                n = data.draw(st.integers(1, top), label=f"scheduled[{req_id}]")
            rows.append(row)
            sched.append(n)
            known.append(len(tokens))
            lists.append((tokens, computed, n, m["blocks"]))
        if not rows:
            return
        got = self.batch.prepare_inputs(
            np.array(rows, np.int64), np.array(sched, np.int64), np.array(known, np.int64)
        )
        want = prepare_inputs(
            [t for t, _, _, _ in lists],
            [c for _, c, _, _ in lists],
            [n for _, _, n, _ in lists],
            [b for _, _, _, b in lists],
            BLOCK_SIZE,
        )
        for name in FIELDS:
            a, b = getattr(got, name), getattr(want, name)
            assert a.dtype == b.dtype and torch.equal(a, b), f"{name}: {a} != {b}"
        assert torch.equal(got.logits_indices, want.logits_indices)
        assert (got.max_query_len, got.max_seq_len) == (want.max_query_len, want.max_seq_len)

    @precondition(lambda self: self.model)
    @rule(data=st.data())
    def penalties_read(self, data: st.DataObject) -> None:
        """What a step's penalties read: each row's prompt as a mask (kept on the device from
        the first read; freed rows are reused, so a stale mask would show) and its outputs."""
        ids = data.draw(
            st.lists(st.sampled_from(sorted(self.model)), min_size=1, unique=True), label="rows"
        )
        rows = np.array([self.batch.req_id_to_index[r] for r in ids], np.int64)
        mask = self.batch.prompt_mask(rows, VOCAB, lambda tensor: tensor)
        want = torch.zeros(len(ids), VOCAB, dtype=torch.bool)
        for i, req_id in enumerate(ids):
            want[i, self.model[req_id]["prompt"]] = True
        assert torch.equal(mask, want), "a row's prompt mask is not its request's prompt"
        outputs = [self.model[r]["tokens"][len(self.model[r]["prompt"]) :] for r in ids]
        lengths = np.array([len(o) for o in outputs], np.int64)
        padded = self.batch.padded_output_ids(rows, lengths, VOCAB)
        for i, out in enumerate(outputs):
            assert padded[i, : len(out)].tolist() == out and (padded[i, len(out) :] == VOCAB).all()

    @invariant()
    def rows_are_consistent(self) -> None:
        batch = self.batch
        rows = list(batch.req_id_to_index.values())
        assert len(set(rows)) == len(rows), "two requests share a row"
        assert not set(rows) & set(batch._free_rows), "a live row is also free"
        table = batch.block_table
        for req_id, m in self.model.items():
            row = batch.req_id_to_index[req_id]
            n = len(m["blocks"])
            assert batch.token_ids(req_id) == m["tokens"]
            assert table.block_table_np[row, :n].tolist() == m["blocks"]
            assert not table.block_table_np[row, n:].any(), "a table's tail is not the null block"


TestInputBatch = InputBatchMachine.TestCase
TestInputBatch.settings = settings(
    max_examples=150,
    stateful_step_count=30,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)


def test_a_request_cannot_join_twice() -> None:
    batch = InputBatch(1, 16, 4, 4, torch.device("cpu"))
    batch.add_request("a", [1, 2], GREEDY, [1], 0)
    with pytest.raises(ValueError, match="already in the batch"):
        batch.add_request("a", [1, 2], GREEDY, [2], 0)


def test_a_table_refuses_more_blocks_than_max_model_len_needs() -> None:
    batch = InputBatch(1, 16, 4, 4, torch.device("cpu"))
    batch.add_request("a", [1, 2], GREEDY, [1, 2, 3, 4], 0)
    with pytest.raises(ValueError, match="do not fit a table of 4"):
        batch.block_table.append_row([5], batch.req_id_to_index["a"])


def test_freed_rows_are_reused_and_cleared() -> None:
    batch = InputBatch(2, 16, 4, 4, torch.device("cpu"))
    batch.add_request("a", [1, 2, 3], SamplingParams(temperature=1.0, seed=3), [7, 8], 0)
    row = batch.req_id_to_index["a"]
    assert row in batch.generators
    batch.remove_request("a")
    assert batch.remove_request("a") is None
    batch.add_request("b", [4], GREEDY, [9], 0)
    assert batch.req_id_to_index["b"] == row
    assert row not in batch.generators
    assert batch.block_table.block_table_np[row].tolist() == [9, 0, 0, 0]
