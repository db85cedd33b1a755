"""Run one scheduler step on the model: flatten the batch, attend through the paged cache, sample.

Mirrors ``vllm/v1/worker/gpu_model_runner.py`` (``GPUModelRunner``): the runner keeps every live
request in a persistent ``InputBatch`` (tokens, progress, block table, sampling parameters),
updated from each ``SchedulerOutput`` by diff (``_update_states``); gathers the step's rows into
one flat token batch (``ModelInputs``, upstream's ``_prepare_inputs``); runs the model once for all
requests, prefill chunks and decodes mixed; and samples one token for each request whose known
tokens are now all computed (a request in the middle of a chunked prefill gets nothing). It also
owns the KV cache tensors (sized from a memory budget at startup by ``kv_sizing``, allocated once)
and, on a GPU, replays decode steps from CUDA graphs.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import torch

from mini_vllm.logprobs import LogprobsLists, LogprobsTensors
from mini_vllm.model.attention import AttentionMetadata
from mini_vllm.sample.sampler import Sampler, SamplerOutput, SamplingMetadata
from mini_vllm.worker import kv_sizing
from mini_vllm.worker.cuda_graphs import CudaGraphManager
from mini_vllm.worker.input_batch import InputBatch
from mini_vllm.worker.model_inputs import ModelInputs
from mini_vllm.worker.prompt_logprobs import (
    PromptLogprobsChunk,
    prompt_chunks,
    score_prompt_chunks,
    split_by_request,
)
from mini_vllm.worker.sampling_metadata import make_sampling_metadata

if TYPE_CHECKING:
    from mini_vllm.core.sched.output import SchedulerOutput
    from mini_vllm.model.llama import LlamaForCausalLM

logger = logging.getLogger(__name__)

# KV cache budget on CPU, where there is no device memory to profile.
DEFAULT_CPU_KV_CACHE_BYTES = 512 * 1024**2


@dataclass
class ModelRunnerOutput:
    """One step's result: the tokens sampled per request (empty for a partial prefill).

    ``logprobs`` (when any request asked for them) has one row per sampled token; its
    ``cu_num_generated_tokens[i]`` is request ``i``'s first row.
    """

    req_ids: list[str]
    req_id_to_index: dict[str, int]
    sampled_token_ids: list[list[int]]
    logprobs: LogprobsLists | None = None
    # Per request that asked: (its first prompt position scored, one row per position).
    prompt_logprobs_dict: dict[str, tuple[int, LogprobsLists]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, list[int]]:
        """``request id -> sampled tokens``, the form ``Scheduler.update_from_output`` takes."""
        return dict(zip(self.req_ids, self.sampled_token_ids))


@dataclass
class PendingOutput:
    """A launched step whose sampled tokens may still be on the GPU (see ``get_output``).

    ``sampled`` stays on the device, where the next step's launch reads its input ids from it;
    ``sampled_host`` is the pinned copy that ``get_output`` reads once ``ready`` has fired (on a
    CPU both are the same tensor and ``ready`` is None). ``sampled_index`` maps each request that
    gets a token to its index in ``sampled``: the next step looks its placeholders up there
    (upstream's ``prev_req_id_to_index``).
    """

    req_ids: list[str]
    sample_rows: list[int]  # indices into req_ids
    sampled: torch.Tensor | None  # [len(sample_rows)] token ids, on the device
    sampled_host: torch.Tensor | None = None
    ready: torch.cuda.Event | None = None
    logprobs_host: LogprobsTensors | None = None  # read, like sampled_host, once ready fired
    sampled_index: dict[str, int] = field(default_factory=dict)
    prompt_chunks: list[PromptLogprobsChunk] = field(default_factory=list)
    prompt_logprobs_host: LogprobsTensors | None = None  # one row per chunk position, in order


@dataclass
class PreparedStep:
    """A step flattened on the host and not launched yet (see ``ModelRunner.prepare_step``)."""

    req_ids: list[str]
    rows: np.ndarray  # each request's row in the input batch
    inputs: ModelInputs | None  # None for an empty step
    sample_rows: list[int]  # indices into req_ids of the requests that get a token
    # Requests whose one input token is being sampled by the step still in flight (indices
    # into req_ids), and for each the index of that token in ``in_flight_sampled``.
    late_rows: list[int] = field(default_factory=list)
    late_sources: list[int] = field(default_factory=list)
    in_flight_sampled: torch.Tensor | None = None
    # Output tokens of each sampled request, the one in flight included (min_tokens).
    num_output_tokens: np.ndarray | None = None
    prompt_chunks: list[PromptLogprobsChunk] = field(default_factory=list)


def triton_available(device: torch.device) -> bool:
    """Whether the Triton attention kernels can run: a CUDA device and an importable module."""
    if device.type != "cuda":
        return False
    try:
        from mini_vllm.attention import triton_paged_attention  # noqa: F401
    except Exception:  # a missing triton, or a kernel module that fails to import
        return False
    return True


class ModelRunner:
    """Owns the model, the KV cache and the per-request state; executes scheduler steps.

    Upstream's ``GPUModelRunner`` with the single-GPU, single-KV-group, no-speculation subset.
    Named without "GPU" because the same runner serves the CPU, where the course proves it
    against Hugging Face.
    """

    def __init__(
        self,
        model: LlamaForCausalLM,
        device: torch.device,
        block_size: int,
        max_model_len: int,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        enforce_eager: bool = False,
        seed: int = 0,
    ) -> None:
        self.model = model
        self.device = device
        self.dtype = next(model.parameters()).dtype
        self.block_size = block_size
        self.max_model_len = max_model_len
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_num_blocks_per_req = kv_sizing.cdiv(max_model_len, block_size)
        # The Triton kernels tile by powers of two; other block sizes stay on the torch path.
        self.use_triton = triton_available(device) and block_size & (block_size - 1) == 0
        self.use_cuda_graph = device.type == "cuda" and not enforce_eager and self.use_triton
        self.sampler = Sampler()
        # Built by initialize_kv_cache, once max_model_len is final (the engine may fit it to the
        # cache first).
        self.input_batch: InputBatch | None = None
        # lab-09: a from-scratch ``prepare_inputs`` (plain lists in) to flatten each step with
        # instead of the batch's own gather; None in the engine.
        self.prepare_inputs_fn: Callable[..., ModelInputs] | None = None
        self.generator = torch.Generator(device=device)
        self.generator.manual_seed(seed)
        self.kv_cache: torch.Tensor | None = None
        self.kv_caches: list[torch.Tensor] = []
        self.num_gpu_blocks = 0
        self.cuda_graphs: CudaGraphManager | None = None  # set by capture_model

    # ---------------------------------------------------------------- sizing and allocation

    def set_max_model_len(self, max_model_len: int) -> None:
        """Follow the engine's auto-fit of ``max_model_len``, before the cache is allocated
        (the input batch's block-table width is derived from it)."""
        self.max_model_len = max_model_len
        self.max_num_blocks_per_req = kv_sizing.cdiv(max_model_len, self.block_size)

    @property
    def kv_cache_block_bytes(self) -> int:
        """Bytes of one block across all layers (keys and values)."""
        return kv_sizing.bytes_per_block(
            self.block_size,
            self.model.num_layers,
            self.model.num_kv_heads,
            self.model.head_dim,
            self.dtype.itemsize,
        )

    @torch.inference_mode()
    def profile_run(self) -> None:
        """Run the largest batch the scheduler may send, without a cache, to measure its peak.

        Upstream's ``profile_run``: ``max_num_batched_tokens`` tokens through every layer, then
        logits and sampling for ``max_num_seqs`` rows. Attention runs densely over the batch as
        one sequence (``attn_metadata=None``), which is the activation footprint of a prefill.
        """
        num_tokens = self.max_num_batched_tokens
        input_ids = torch.zeros(num_tokens, dtype=torch.long, device=self.device)
        positions = torch.arange(num_tokens, device=self.device) % self.max_model_len
        hidden_states = self.model(input_ids, positions, None, None)
        num_reqs = min(self.max_num_seqs, num_tokens)
        logits = self.model.compute_logits(hidden_states[-num_reqs:])
        metadata = SamplingMetadata(
            temperature=torch.ones(num_reqs, device=self.device),
            all_greedy=False,
            all_random=True,
            top_p=torch.full((num_reqs,), 0.9, device=self.device),
            top_k=torch.full((num_reqs,), 50, device=self.device, dtype=torch.long),
        )
        self.sampler(logits, metadata)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def determine_available_memory(
        self, gpu_memory_utilization: float, kv_cache_memory_bytes: int | None
    ) -> int:
        """Bytes the KV cache may take (upstream: ``Worker.determine_available_memory``).

        An explicit ``kv_cache_memory_bytes`` wins. On CUDA the budget is the allowed share of
        the device minus the measured peak of a profiling run (weights, activations, and the
        memory outside torch's allocator such as the CUDA context). On CPU there is nothing to
        measure against, so a fixed default is used, capped at what ``max_num_seqs`` requests of
        ``max_model_len`` tokens could ever occupy: a tiny model should not zero 512 MiB of
        host memory for blocks no schedule can reach.
        """
        if kv_cache_memory_bytes is not None:
            return int(kv_cache_memory_bytes)
        if self.device.type != "cuda":
            reachable_blocks = kv_sizing.min_num_gpu_blocks(
                self.max_model_len, self.block_size, self.max_num_seqs
            )
            return min(DEFAULT_CPU_KV_CACHE_BYTES, reachable_blocks * self.kv_cache_block_bytes)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(self.device)
        self.profile_run()
        peak = torch.cuda.max_memory_allocated(self.device)
        free, total = torch.cuda.mem_get_info(self.device)
        non_torch = max((total - free) - torch.cuda.memory_reserved(self.device), 0)
        budget = kv_sizing.available_kv_cache_memory(
            total, gpu_memory_utilization, peak + non_torch
        )
        logger.info(
            "memory profile: total %.2f GiB x %.2f, peak torch %.2f GiB, non-torch %.2f GiB "
            "-> KV cache budget %.2f GiB",
            total / 2**30,
            gpu_memory_utilization,
            peak / 2**30,
            non_torch / 2**30,
            budget / 2**30,
        )
        torch.cuda.empty_cache()
        return budget

    def initialize_kv_cache(self, num_gpu_blocks: int) -> None:
        """Allocate every layer's cache in one tensor, zeroed.

        Layout ``[num_layers, 2, num_blocks, block_size, num_kv_heads, head_dim]``: block ``b``
        names the same slots in every layer, which is why one block id in a block table is
        enough for the whole model. Zeros rather than ``empty``: a never-written slot may be
        read (then masked) by a kernel, and stale NaNs would survive a zero softmax weight.
        """
        self.num_gpu_blocks = num_gpu_blocks
        self.kv_cache = torch.zeros(
            self.model.num_layers,
            2,
            num_gpu_blocks,
            self.block_size,
            self.model.num_kv_heads,
            self.model.head_dim,
            dtype=self.dtype,
            device=self.device,
        )
        self.kv_caches = list(self.kv_cache.unbind(0))
        self.input_batch = InputBatch(
            max_num_reqs=self.max_num_seqs,
            max_model_len=self.max_model_len,
            max_num_blocks_per_req=self.max_num_blocks_per_req,
            block_size=self.block_size,
            device=self.device,
        )

    @torch.inference_mode()
    def warm_up_model(self) -> None:
        """Run one mixed step (a 3-token prefill beside a decode) on the real cache, writing
        nothing to it.

        Triton compiles a kernel on its first launch: the varlen attention kernel, which only a
        step holding a prefill uses, takes about half a second on an H100, and without this the
        first request would wait for it. Upstream warms up the same way before capturing its
        graphs (``compile_or_warm_up_model``). Every token's slot is -1 (written nowhere) and
        both block tables are all the null block, so no request's K/V is read or touched.
        """
        if self.kv_cache is None:
            return
        device = self.device
        attn_metadata = AttentionMetadata(
            slot_mapping=torch.full((4,), -1, dtype=torch.long, device=device),
            block_tables=torch.zeros(
                (2, kv_sizing.cdiv(3, self.block_size)), dtype=torch.int32, device=device
            ),
            query_start_loc=torch.tensor([0, 3, 4], dtype=torch.int32, device=device),
            seq_lens=torch.tensor([3, 1], dtype=torch.int32, device=device),
            max_query_len=3,
            max_seq_len=3,
            use_triton=self.use_triton,
        )
        positions = torch.tensor([0, 1, 2, 0], dtype=torch.long, device=device)
        input_ids = torch.zeros(4, dtype=torch.long, device=device)
        self.model(input_ids, positions, self.kv_caches, attn_metadata)
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    # ---------------------------------------------------------------- per-step state

    def _update_states(self, scheduler_output: SchedulerOutput) -> None:
        """Apply the scheduler's diff to the input batch.

        Finished requests free their rows; new ones get a row; running ones get their new
        blocks appended and their progress set; resumed ones (preempted, now recomputing) get
        their table replaced, since their old blocks were freed, and their tokens resent.
        """
        batch = self.input_batch
        if batch is None:
            raise RuntimeError("initialize_kv_cache must run before the first step")
        for req_id in scheduler_output.finished_req_ids:
            batch.remove_request(req_id)
        for new_req in scheduler_output.scheduled_new_reqs:
            batch.add_request(
                new_req.req_id,
                new_req.prompt_token_ids,
                new_req.sampling_params,
                new_req.block_ids[0],
                new_req.num_computed_tokens,
            )
        cached = scheduler_output.scheduled_cached_reqs
        if not cached.req_ids:
            return
        index = batch.req_id_to_index
        rows = [index[req_id] for req_id in cached.req_ids]
        batch.num_computed_tokens_cpu[rows] = cached.num_computed_tokens
        resumed = cached.resumed_req_ids
        for req_id, row, new_block_ids in zip(cached.req_ids, rows, cached.new_block_ids):
            if new_block_ids is None:
                continue  # the common decode step: nothing else changed
            if req_id in resumed:
                batch.block_table.add_row(new_block_ids[0], row)
            else:
                batch.block_table.append_row(new_block_ids[0], row)
        for req_id, all_token_ids in cached.all_token_ids.items():
            row = index[req_id]
            if len(all_token_ids) > batch.num_tokens[row]:
                batch.set_token_ids(row, all_token_ids)

    # ---------------------------------------------------------------- execution

    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        """Run one step start to end (the serial loop): prepare, launch, wait for its tokens."""
        return self.get_output(self.launch_step(self.prepare_step(scheduler_output)))

    def prepare_step(
        self, scheduler_output: SchedulerOutput, in_flight: PendingOutput | None = None
    ) -> PreparedStep:
        """Apply the scheduler's diff and flatten the step, possibly before the last step ended.

        With async scheduling the engine calls this while ``in_flight`` (the previous step) is
        still on the GPU, so that the host's input preparation overlaps the GPU too. A request
        that ``in_flight`` samples a token for then decodes that very token, whose id is not
        known yet: a placeholder stands in for it here, and ``launch_step`` has the GPU copy the
        real id over it from ``in_flight``'s sampled tokens, so the launch waits for nothing.
        """
        self._update_states(scheduler_output)
        return self._flatten_step(scheduler_output, in_flight)

    def _flatten_step(
        self, scheduler_output: SchedulerOutput, in_flight: PendingOutput | None
    ) -> PreparedStep:
        """The flattening half of ``prepare_step``: the batch is already up to date."""
        req_ids = list(scheduler_output.num_scheduled_tokens)
        if not req_ids:
            return PreparedStep([], np.zeros(0, np.int64), None, [])
        batch = self.input_batch
        assert batch is not None
        n = len(req_ids)
        index = batch.req_id_to_index
        rows = np.fromiter(map(index.__getitem__, req_ids), np.int64, count=n)
        num_scheduled = np.fromiter(scheduler_output.num_scheduled_tokens.values(), np.int64, n)
        num_known = batch.num_tokens[rows]
        # Requests whose input is the token the step in flight samples: always a one-token
        # decode of it. Its id is not known yet, so a placeholder (0) stands in the token
        # array at the request's next index; the launch copies the real id over it on the GPU.
        late_rows: list[int] = []
        late_sources: list[int] = []
        if in_flight is not None and in_flight.sampled is not None:
            awaited = in_flight.sampled_index
            late_rows = [i for i, req_id in enumerate(req_ids) if req_id in awaited]
            late_sources = [awaited[req_ids[i]] for i in late_rows]
        if late_rows:
            late = rows[late_rows]
            batch.token_ids_cpu[late, batch.num_tokens[late]] = 0
            num_known[late_rows] += 1
        if self.prepare_inputs_fn is None:
            inputs = batch.prepare_inputs(rows, num_scheduled, num_known)
        else:
            inputs = self._prepare_inputs_from_lists(rows, num_scheduled, num_known)
        # Only requests whose every known token is now computed get a token: the logits of a
        # partial prefill predict a prompt token we already know, so they are not computed.
        # (From the batch, not from inputs.seq_lens: under lab-09 the inputs are the learner's.)
        complete = batch.num_computed_tokens_cpu[rows] + num_scheduled == num_known
        sample_rows = np.flatnonzero(complete).tolist()
        return PreparedStep(
            req_ids,
            rows,
            inputs,
            sample_rows,
            late_rows,
            late_sources,
            in_flight.sampled if in_flight is not None and late_rows else None,
            num_known[complete] - batch.num_prompt_tokens[rows[complete]],
            prompt_chunks(batch, req_ids, rows, num_scheduled, inputs),
        )

    def _prepare_inputs_from_lists(
        self, rows: np.ndarray, num_scheduled: np.ndarray, num_known: np.ndarray
    ) -> ModelInputs:
        """Flatten the step with ``prepare_inputs_fn`` (lab-09's from-scratch contract: one
        list per request of its known tokens and of its blocks)."""
        batch = self.input_batch
        assert batch is not None and self.prepare_inputs_fn is not None
        table = batch.block_table
        return self.prepare_inputs_fn(
            [batch.token_ids_cpu[r, :k].tolist() for r, k in zip(rows, num_known)],
            batch.num_computed_tokens_cpu[rows].tolist(),
            num_scheduled.tolist(),
            [table.block_table_np[r, : table.num_blocks_per_row[r]].tolist() for r in rows],
            self.block_size,
        )

    @torch.inference_mode()
    def launch_step(self, prepared: PreparedStep) -> PendingOutput:
        """Queue a prepared step on the device and return without waiting for anything.

        The sampled ids stay on the device (the next step's inputs are copied from there) and
        are copied to pinned host memory behind the step, for ``get_output`` to read.
        """
        inputs, req_ids, sample_rows = prepared.inputs, prepared.req_ids, prepared.sample_rows
        if inputs is None:
            return PendingOutput([], [], None)
        chunks = prepared.prompt_chunks
        hidden_states = self._run_model(inputs, self._late_input_ids(prepared), every=bool(chunks))
        pending = PendingOutput(req_ids, sample_rows, None, prompt_chunks=chunks)
        prompt_logprobs = None
        if chunks:  # scored before the hidden states are cut to each request's last token
            prompt_logprobs = score_prompt_chunks(self.model, hidden_states, chunks, self._upload)
            hidden_states = hidden_states[self._upload(inputs.logits_indices)]
        sampled = logprobs = None
        if sample_rows:
            if len(sample_rows) < len(req_ids):
                hidden_states = hidden_states[self._upload(torch.tensor(sample_rows))]
            logits = self.model.compute_logits(hidden_states)
            assert prepared.num_output_tokens is not None
            output = self._sample(logits, prepared, sample_rows)
            sampled, logprobs = output.sampled_token_ids, output.logprobs_tensors
            pending.sampled = sampled
            pending.sampled_index = {req_ids[i]: k for k, i in enumerate(sample_rows)}
        if self.device.type != "cuda" or (sampled is None and prompt_logprobs is None):
            pending.sampled_host, pending.logprobs_host = sampled, logprobs
            pending.prompt_logprobs_host = prompt_logprobs
            return pending
        if sampled is not None:
            pending.sampled_host = torch.empty(sampled.shape, dtype=sampled.dtype, pin_memory=True)
            pending.sampled_host.copy_(sampled, non_blocking=True)
        pending.logprobs_host = None if logprobs is None else logprobs.to_cpu_nonblocking()
        if prompt_logprobs is not None:
            pending.prompt_logprobs_host = prompt_logprobs.to_cpu_nonblocking()
        pending.ready = torch.cuda.Event()
        pending.ready.record()
        return pending

    def get_output(self, pending: PendingOutput) -> ModelRunnerOutput:
        """Wait for a launched step's tokens (the one device-to-host read of a step) and record
        each in the input batch, where later steps' inputs come from.

        It waits for that step only: steps launched after it keep the GPU busy meanwhile. A
        request that finished (was aborted) since the launch has left the batch and its token
        is dropped here; it is still reported, as the scheduler ignores tokens of finished
        requests itself.
        """
        req_ids = pending.req_ids
        sampled_token_ids: list[list[int]] = [[] for _ in req_ids]
        if pending.ready is not None:
            pending.ready.synchronize()
        if pending.sampled_host is not None:
            tokens = pending.sampled_host.tolist()
            for i, token_id in zip(pending.sample_rows, tokens):
                sampled_token_ids[i] = [token_id]
            batch = self.input_batch
            assert batch is not None
            live: list[int] = []  # indices into tokens of the requests still in the batch
            rows: list[int] = []
            for k, i in enumerate(pending.sample_rows):
                row = batch.req_id_to_index.get(req_ids[i])
                if row is not None:
                    live.append(k)
                    rows.append(row)
            batch.append_sampled(np.array(rows, np.int64), np.asarray(tokens, np.int32)[live])
        logprobs = None
        if pending.logprobs_host is not None:
            first_rows = np.cumsum([0] + [len(t) for t in sampled_token_ids[:-1]]).tolist()
            logprobs = pending.logprobs_host.tolists(first_rows)
        prompt_logprobs = {}
        if pending.prompt_logprobs_host is not None:
            prompt_logprobs = split_by_request(pending.prompt_logprobs_host, pending.prompt_chunks)
        return ModelRunnerOutput(
            req_ids=req_ids,
            req_id_to_index={r: i for i, r in enumerate(req_ids)},
            sampled_token_ids=sampled_token_ids,
            logprobs=logprobs,
            prompt_logprobs_dict=prompt_logprobs,
        )

    def _upload(self, tensor: torch.Tensor) -> torch.Tensor:
        """Copy a host tensor to the device without making the host wait for the GPU.

        A copy from pageable memory would block until the stream drained, i.e. until the step
        in flight ended; from pinned memory it is queued like a kernel.
        """
        if self.device.type != "cuda":
            return tensor.to(self.device)
        return tensor.pin_memory().to(self.device, non_blocking=True)

    def _late_input_ids(
        self, prepared: PreparedStep
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
        """``(positions in input_ids, indices into the in-flight sampled ids, those ids)`` for
        the rows whose input token the step in flight is still sampling, or None."""
        if not prepared.late_rows:
            return None
        assert prepared.inputs is not None and prepared.in_flight_sampled is not None
        rows = torch.tensor(prepared.late_rows, dtype=torch.long)
        # Each placeholder is its row's only token, the last one: at logits_indices[row].
        positions = prepared.inputs.logits_indices[rows]
        sources = torch.tensor(prepared.late_sources, dtype=torch.long)
        return positions, sources, prepared.in_flight_sampled

    def _forward_late_tokens(
        self,
        input_ids: torch.Tensor,
        late: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None,
    ) -> None:
        """Overwrite the placeholders in ``input_ids`` (on the device) with the sampled ids.

        Queued behind the step that samples them, so it reads them once they exist. The common
        case, an unchanged decode batch, is one contiguous device-to-device copy.
        """
        if late is None:
            return
        positions, sources, sampled = late
        n = positions.shape[0]
        identity = torch.arange(n)
        if torch.equal(positions, identity) and torch.equal(sources, identity):
            input_ids[:n].copy_(sampled[:n])
        else:
            input_ids[self._upload(positions)] = sampled[self._upload(sources)]

    def _run_model(
        self,
        inputs: ModelInputs,
        late: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
        every: bool = False,
    ) -> torch.Tensor:
        """Hidden states of each request's last token, ``[num_reqs, hidden_size]``; of every
        token with ``every`` (prompt logprobs), eagerly: a graph keeps only the last ones."""
        graphs = self.cuda_graphs
        if graphs is not None and not every and graphs.can_replay(inputs):
            return graphs.replay(
                inputs, lambda input_ids: self._forward_late_tokens(input_ids, late)
            )
        upload = self._upload
        attn_metadata = AttentionMetadata(
            slot_mapping=upload(inputs.slot_mapping),
            block_tables=upload(inputs.block_tables),
            query_start_loc=upload(inputs.query_start_loc),
            seq_lens=upload(inputs.seq_lens),
            max_query_len=inputs.max_query_len,
            max_seq_len=inputs.max_seq_len,
            use_triton=self.use_triton,
        )
        input_ids = upload(inputs.input_ids)
        self._forward_late_tokens(input_ids, late)
        hidden_states = self.model(
            input_ids,
            upload(inputs.positions),
            self.kv_caches,
            attn_metadata,
        )
        return hidden_states if every else hidden_states[upload(inputs.logits_indices)]

    def _sample(
        self, logits: torch.Tensor, prepared: PreparedStep, sample_rows: list[int]
    ) -> SamplerOutput:
        """Draw one token per sampled request, left on the device (``get_output`` reads them
        back), with the batch's ``SamplingMetadata`` (``sampling_metadata.py``)."""
        batch = self.input_batch
        assert batch is not None and prepared.num_output_tokens is not None
        output_lens = prepared.num_output_tokens

        def late_tokens() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
            """Where the step in flight's tokens go among the sampled requests' outputs: late
            requests are decodes, so they are sampled, their token their last output."""
            if not prepared.late_rows:
                return None
            assert prepared.in_flight_sampled is not None
            k = np.searchsorted(sample_rows, prepared.late_rows)
            sources = self._upload(torch.tensor(prepared.late_sources))
            return (
                self._upload(torch.from_numpy(k)),
                self._upload(torch.from_numpy(output_lens[k] - 1)),
                prepared.in_flight_sampled[sources],
            )

        metadata = make_sampling_metadata(
            batch,
            prepared.rows[sample_rows],
            output_lens,
            logits.shape[-1],
            self._upload,
            self.generator,
            late_tokens,
        )
        return self.sampler(logits, metadata)

    # ---------------------------------------------------------------- CUDA graphs

    @torch.inference_mode()
    def capture_model(self) -> None:
        """Capture decode steps in CUDA graphs (upstream's name; ``cuda_graphs.py`` says how)."""
        if not self.use_cuda_graph or self.kv_cache is None:
            return
        graphs = CudaGraphManager(
            self.model,
            self.kv_caches,
            self.device,
            max_batch_size=min(self.max_num_seqs, 256),
            max_num_blocks_per_req=self.max_num_blocks_per_req,
            max_model_len=self.max_model_len,
        )
        if graphs.capture():
            self.cuda_graphs = graphs

    @property
    def cudagraph_batch_sizes(self) -> list[int]:
        """The decode batch sizes captured in graphs (empty when none are)."""
        return self.cuda_graphs.batch_sizes if self.cuda_graphs is not None else []


# Upstream's name, for reading the two side by side.
GPUModelRunner = ModelRunner
