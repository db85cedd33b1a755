"""The runner's persistent batch: every live request in a row of preallocated arrays.

Upstream's ``InputBatch`` (``vllm/v1/worker/gpu_input_batch.py``). The scheduler sends a
request's prompt, parameters and blocks once, then only what changed; the runner applies those
diffs to arrays it keeps from step to step (token ids, progress, block table, sampling
parameters), so that flattening a step is a few numpy gathers over the scheduled rows instead of
rebuilding per-request lists. ``model_inputs.prepare_inputs`` (lab-09) computes the same
``ModelInputs`` from such lists, from scratch; the two are held equal by a property test. How rows
are owned and reused: docs/upstream-fidelity.md (module notes).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch

from mini_vllm.sample.sampler import token_counts
from mini_vllm.sampling_params import SamplingParams, SamplingType
from mini_vllm.worker import kv_sizing
from mini_vllm.worker.block_table import BlockTable, grow_rows
from mini_vllm.worker.model_inputs import ModelInputs, _get_cumsum_and_arange, compute_slot_mapping


class InputBatch:
    """Token ids, progress, blocks and sampling parameters of every live request, by row."""

    def __init__(
        self,
        max_num_reqs: int,
        max_model_len: int,
        max_num_blocks_per_req: int,
        block_size: int,
        device: torch.device,
    ) -> None:
        self.block_size = block_size
        self.device = device
        self.req_id_to_index: dict[str, int] = {}
        self._free_rows: list[int] = []
        self._capacity = 0
        # One more column than max_model_len: a request's next sampled token is written at
        # index num_tokens, also when the request has just reached the limit.
        self.token_ids_cpu = np.zeros((0, max_model_len + 1), dtype=np.int32)
        self.num_tokens = np.zeros(0, dtype=np.int64)  # known tokens: prompt + sampled
        self.num_prompt_tokens = np.zeros(0, dtype=np.int64)
        self.num_computed_tokens_cpu = np.zeros(0, dtype=np.int64)
        self.temperature = np.zeros(0, dtype=np.float32)
        self.top_p = np.zeros(0, dtype=np.float32)
        self.top_k = np.zeros(0, dtype=np.int64)
        self.min_p = np.zeros(0, dtype=np.float32)
        self.presence_penalty = np.zeros(0, dtype=np.float32)
        self.frequency_penalty = np.zeros(0, dtype=np.float32)
        self.repetition_penalty = np.zeros(0, dtype=np.float32)
        self.is_greedy = np.zeros(0, dtype=bool)
        self.block_table = BlockTable(0, max_num_blocks_per_req)
        self.sampling_params: list[SamplingParams | None] = []
        # Sparse per-row state: only the rows that need it.
        self.generators: dict[int, torch.Generator] = {}  # seeded requests
        self.min_tokens_rows: set[int] = set()  # min_tokens > 0 with stop tokens to mask
        self.penalty_rows: set[int] = set()  # a penalty other than the neutral one
        self.logit_bias: dict[int, dict[int, float]] = {}  # rows with a logit_bias
        self.allowed_token_ids: dict[int, list[int]] = {}  # rows limited to some tokens
        self.bad_words_token_ids: dict[int, list[list[int]]] = {}  # rows with bad_words
        self.num_logprobs: dict[int, int] = {}  # rows that asked for logprobs
        self.num_prompt_logprobs: dict[int, int] = {}  # rows that asked for prompt logprobs
        # Which tokens each penalty row's prompt holds, [capacity, vocab] on the device: written
        # once per request (a prompt never changes), gathered by every step with a penalty.
        self._prompt_masks: torch.Tensor | None = None
        self._masked_rows: set[int] = set()
        self._grow(max_num_reqs)

    def _grow(self, capacity: int) -> None:
        """Room for ``capacity`` rows. Rows outnumber ``max_num_seqs`` only while preempted
        requests wait to resume, so this is rare and doubles the arrays."""
        old = self._capacity
        if capacity <= old:
            return
        self.token_ids_cpu = grow_rows(self.token_ids_cpu, capacity)
        for name in (
            "num_tokens",
            "num_prompt_tokens",
            "num_computed_tokens_cpu",
            "temperature",
            "top_p",
            "top_k",
            "min_p",
            "presence_penalty",
            "frequency_penalty",
            "repetition_penalty",
            "is_greedy",
        ):
            setattr(self, name, grow_rows(getattr(self, name), capacity))
        self.block_table.grow(capacity)
        self.sampling_params.extend([None] * (capacity - old))
        self._free_rows.extend(range(capacity - 1, old - 1, -1))  # pop() gives the lowest
        self._capacity = capacity

    # ---------------------------------------------------------------- the scheduler's diffs

    def add_request(
        self,
        req_id: str,
        prompt_token_ids: Sequence[int],
        sampling_params: SamplingParams,
        block_ids: Sequence[int],
        num_computed_tokens: int,
    ) -> int:
        """Give a new request a row; its own generator when seeded, so that its randomness
        never depends on its batch neighbours."""
        if req_id in self.req_id_to_index:
            raise ValueError(f"request {req_id!r} is already in the batch")
        if not self._free_rows:
            self._grow(2 * self._capacity)
        row = self._free_rows.pop()
        self.req_id_to_index[req_id] = row
        n = len(prompt_token_ids)
        self.token_ids_cpu[row, :n] = prompt_token_ids
        self.num_tokens[row] = n
        self.num_prompt_tokens[row] = n
        self.num_computed_tokens_cpu[row] = num_computed_tokens
        self.block_table.add_row(block_ids, row)
        params = sampling_params
        self.sampling_params[row] = params
        self.is_greedy[row] = params.sampling_type == SamplingType.GREEDY
        self.temperature[row] = params.temperature
        self.top_p[row] = params.top_p
        self.top_k[row] = params.top_k
        self.min_p[row] = params.min_p
        self.presence_penalty[row] = params.presence_penalty
        self.frequency_penalty[row] = params.frequency_penalty
        self.repetition_penalty[row] = params.repetition_penalty
        if params.has_penalties:
            self.penalty_rows.add(row)
        if params.logit_bias:
            self.logit_bias[row] = params.logit_bias
        if params.allowed_token_ids is not None:
            self.allowed_token_ids[row] = params.allowed_token_ids
        if params.bad_words_token_ids:
            self.bad_words_token_ids[row] = params.bad_words_token_ids
        if params.sampling_type == SamplingType.RANDOM_SEED:
            assert params.seed is not None  # what makes the type RANDOM_SEED
            generator = torch.Generator(device=self.device)
            generator.manual_seed(params.seed)
            self.generators[row] = generator
        if params.min_tokens and params.all_stop_token_ids:
            self.min_tokens_rows.add(row)
        if params.logprobs is not None:
            self.num_logprobs[row] = params.logprobs
        if params.prompt_logprobs is not None:
            self.num_prompt_logprobs[row] = params.prompt_logprobs
        return row

    def remove_request(self, req_id: str) -> int | None:
        """Free a finished request's row; None if it was not here (finished before it ran)."""
        row = self.req_id_to_index.pop(req_id, None)
        if row is None:
            return None
        self.block_table.clear_row(row)
        self.sampling_params[row] = None
        self.generators.pop(row, None)
        self.min_tokens_rows.discard(row)
        self.penalty_rows.discard(row)
        self.logit_bias.pop(row, None)
        self.allowed_token_ids.pop(row, None)
        self.bad_words_token_ids.pop(row, None)
        self.num_logprobs.pop(row, None)
        self.num_prompt_logprobs.pop(row, None)
        self._masked_rows.discard(row)
        self._free_rows.append(row)
        return row

    def set_token_ids(self, row: int, token_ids: Sequence[int]) -> None:
        """Overwrite a row's known tokens (a resumed request: the scheduler resends them all)."""
        self.token_ids_cpu[row, : len(token_ids)] = token_ids
        self.num_tokens[row] = len(token_ids)

    def append_sampled(self, rows: np.ndarray, token_ids: np.ndarray) -> None:
        """Record each row's newly sampled token after its known ones."""
        self.token_ids_cpu[rows, self.num_tokens[rows]] = token_ids
        self.num_tokens[rows] += 1

    def token_ids(self, req_id: str) -> list[int]:
        """A request's known tokens, as a list (tests and debugging; not the hot path)."""
        row = self.req_id_to_index[req_id]
        return self.token_ids_cpu[row, : self.num_tokens[row]].tolist()

    def padded_output_ids(
        self, rows: np.ndarray, num_output_tokens: np.ndarray, pad: int
    ) -> np.ndarray:
        """Each row's output tokens, padded with ``pad`` to the longest: what the frequency and
        presence penalties count. ``num_output_tokens`` may count a placeholder still in flight
        as a row's last output token (the caller writes its real id over it on the device)."""
        return self._padded(rows, self.num_prompt_tokens[rows], num_output_tokens, pad)

    def prompt_mask(
        self, rows: np.ndarray, vocab_size: int, upload: Callable[[torch.Tensor], torch.Tensor]
    ) -> torch.Tensor:
        """``[len(rows), vocab_size]`` bool: which tokens each row's prompt holds (what the
        repetition penalty reads). A request's row is padded and uploaded once, the first time
        a step asks for it; later steps only gather rows of the mask kept on the device."""
        if self._prompt_masks is None or self._prompt_masks.shape[0] < self._capacity:
            grown = torch.zeros(self._capacity, vocab_size, dtype=torch.bool, device=self.device)
            if self._prompt_masks is not None:
                grown[: self._prompt_masks.shape[0]] = self._prompt_masks
            self._prompt_masks = grown
        new = np.array([r for r in rows.tolist() if r not in self._masked_rows], dtype=np.int64)
        if new.size:
            prompt = self._padded(new, np.zeros_like(new), self.num_prompt_tokens[new], vocab_size)
            counts = token_counts(upload(torch.from_numpy(prompt)), vocab_size)
            self._prompt_masks[upload(torch.from_numpy(new))] = counts > 0
            self._masked_rows.update(new.tolist())
        return self._prompt_masks[upload(torch.from_numpy(rows))]

    def _padded(
        self, rows: np.ndarray, start: np.ndarray, length: np.ndarray, pad: int
    ) -> np.ndarray:
        """``length[i]`` tokens of row ``rows[i]`` from column ``start[i]``, padded with ``pad``."""
        offsets = np.arange(max(int(length.max()), 1))
        columns = np.minimum(start[:, None] + offsets, self.token_ids_cpu.shape[1] - 1)
        tokens = self.token_ids_cpu[rows[:, None], columns].astype(np.int64)
        return np.where(offsets < length[:, None], tokens, pad)

    # ---------------------------------------------------------------- one step

    def prepare_inputs(
        self, rows: np.ndarray, num_scheduled: np.ndarray, num_known: np.ndarray
    ) -> ModelInputs:
        """The step's ``ModelInputs``, gathered from the rows (``prepare_inputs``' contract).

        ``rows[i]`` is the row of the step's request ``i``, which runs ``num_scheduled[i]``
        tokens from its ``num_computed_tokens`` on; ``num_known[i]`` counts its known tokens,
        a placeholder for a token still being sampled included.
        """
        computed = self.num_computed_tokens_cpu[rows]
        seq_lens = computed + num_scheduled
        num_blocks = self.block_table.num_blocks_per_row[rows]
        bad = (
            (num_scheduled < 1)
            | (seq_lens > num_known)
            | (kv_sizing.cdiv(seq_lens, self.block_size) > num_blocks)
        )
        if bad.any():
            i = int(np.argmax(bad))
            raise RuntimeError(
                f"step row {i}: {computed[i]} computed + {num_scheduled[i]} scheduled tokens, "
                f"{num_known[i]} known, {num_blocks[i]} blocks: the scheduler's diff and the "
                "runner's batch disagree"
            )
        cu_num_tokens, query_pos = _get_cumsum_and_arange(num_scheduled)
        req_indices = np.repeat(np.arange(len(rows)), num_scheduled)
        positions = computed[req_indices] + query_pos
        # One gather for every token of the step: row-major offsets into the token array.
        flat = rows[req_indices] * self.token_ids_cpu.shape[1] + positions
        input_ids = self.token_ids_cpu.ravel().take(flat).astype(np.int64)
        width = int(num_blocks.max())
        block_tables = self.block_table.block_table_np[rows, :width]
        slot_mapping = compute_slot_mapping(block_tables, req_indices, positions, self.block_size)
        return ModelInputs(
            input_ids=torch.from_numpy(input_ids),
            positions=torch.from_numpy(positions),
            slot_mapping=torch.from_numpy(slot_mapping),
            block_tables=torch.from_numpy(block_tables),
            query_start_loc=torch.from_numpy(np.concatenate(([0], cu_num_tokens)).astype(np.int32)),
            seq_lens=torch.from_numpy(seq_lens.astype(np.int32)),
            logits_indices=torch.from_numpy(cu_num_tokens - 1),
            max_query_len=int(num_scheduled.max()),
            max_seq_len=int(seq_lens.max()),
        )
