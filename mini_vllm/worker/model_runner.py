"""Run one scheduler step on the model: flatten the batch, attend through the paged cache, sample.

Mirrors ``vllm/v1/worker/gpu_model_runner.py`` (``GPUModelRunner``): the runner keeps its own
copy of every live request (``CachedRequestState``: tokens, block table, progress), updated from
each ``SchedulerOutput`` by diff (``_update_states``); turns the step into one flat token batch
(``prepare_inputs``, upstream's ``_prepare_inputs``); runs the model once for all requests,
prefill chunks and decodes mixed; and samples one token for each request whose known tokens are
now all computed (a request in the middle of a chunked prefill gets nothing).

It also owns the KV cache tensors: sizes them from a memory budget at startup (the arithmetic is
in ``kv_sizing``), allocates them once, and on a GPU captures decode steps in CUDA graphs.

``prepare_inputs`` and its helpers are module-level functions that ``execute_model`` looks up by
name at every step. That is lab-09's seam: its graded suite replaces
``mini_vllm.worker.model_runner.prepare_inputs`` with the learner's and runs the whole engine on
it, so a learner writes the input preparation without touching (or copying) the runner.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import torch

from mini_vllm.logprobs import LogprobsLists, LogprobsTensors
from mini_vllm.model.attention import AttentionMetadata
from mini_vllm.sample.sampler import Sampler, SamplerOutput, SamplingMetadata
from mini_vllm.sampling_params import SamplingParams, SamplingType
from mini_vllm.worker import kv_sizing

if TYPE_CHECKING:
    from mini_vllm.core.sched.output import SchedulerOutput
    from mini_vllm.model.llama import LlamaForCausalLM

logger = logging.getLogger(__name__)

# KV cache budget on CPU, where there is no device memory to profile.
DEFAULT_CPU_KV_CACHE_BYTES = 512 * 1024**2


@dataclass
class CachedRequestState:
    """The runner's own record of one live request (upstream: ``gpu_input_batch.py``).

    The scheduler sends a request's prompt and sampling parameters once, then only diffs; this
    record is what makes the diffs enough. ``token_ids`` is prompt plus every sampled token: the
    runner appends what it samples, so a decode step's input token is already here. With a
    single KV cache group, ``block_ids`` is one list (upstream: a tuple of lists, one per group).
    """

    req_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    generator: torch.Generator | None
    block_ids: list[int]
    num_computed_tokens: int
    token_ids: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.token_ids:
            self.token_ids = list(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[len(self.prompt_token_ids) :]


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

    def to_dict(self) -> dict[str, list[int]]:
        """``request id -> sampled tokens``, the form ``Scheduler.update_from_output`` takes."""
        return dict(zip(self.req_ids, self.sampled_token_ids))


@dataclass
class PendingOutput:
    """A launched step whose sampled tokens may still be on the GPU (see ``get_output``).

    ``sampled`` stays on the device, where the next step's launch reads its input ids from it;
    ``sampled_host`` is the pinned copy that ``get_output`` reads once ``ready`` has fired (on a
    CPU both are the same tensor and ``ready`` is None).
    """

    req_ids: list[str]
    states: list[CachedRequestState]
    sample_rows: list[int]
    sampled: torch.Tensor | None  # [len(sample_rows)] token ids, on the device
    sampled_host: torch.Tensor | None = None
    ready: torch.cuda.Event | None = None
    logprobs_host: LogprobsTensors | None = None  # read, like sampled_host, once ready fired


@dataclass
class PreparedStep:
    """A step flattened on the host and not launched yet (see ``ModelRunner.prepare_step``)."""

    req_ids: list[str]
    states: list[CachedRequestState]
    inputs: ModelInputs | None  # None for an empty step
    sample_rows: list[int]
    # Rows whose one input token is being sampled by the step still in flight, and for each the
    # index of that token in the in-flight step's ``sampled`` tensor (``in_flight_sampled``).
    late_rows: list[int] = field(default_factory=list)
    late_sources: list[int] = field(default_factory=list)
    in_flight_sampled: torch.Tensor | None = None
    # Output tokens of each sampled row's request, the one in flight included (min_tokens).
    num_output_tokens: list[int] = field(default_factory=list)


@dataclass
class ModelInputs:
    """One step flattened: every tensor the model and the attention backend read.

    Shapes: ``T`` tokens in the step (the sum of the scheduled counts), ``R`` requests.
    """

    input_ids: torch.Tensor  # [T] int64
    positions: torch.Tensor  # [T] int64: position of each token in its own sequence
    slot_mapping: torch.Tensor  # [T] int64: cache slot where each token's K/V is written
    block_tables: torch.Tensor  # [R, max_blocks] int32, padded with 0 (the null block)
    query_start_loc: torch.Tensor  # [R + 1] int32: request i owns tokens [qsl[i], qsl[i+1])
    seq_lens: torch.Tensor  # [R] int32: num_computed_tokens + num_scheduled_tokens
    logits_indices: torch.Tensor  # [R] int64: the last token of each request
    max_query_len: int
    max_seq_len: int


def _get_cumsum_and_arange(num_tokens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Cumulative token counts, and each token's offset inside its own request.

    ``[2, 5, 3]`` -> ``([2, 7, 10], [0, 1, 0, 1, 2, 3, 4, 0, 1, 2])`` (upstream's helper of the
    same name). The second array is what turns per-request numbers into per-token ones without a
    Python loop over tokens: subtract from a flat ``arange`` the start of each token's request,
    spread over that request's tokens with ``np.repeat``.
    """
    num_tokens = np.asarray(num_tokens, dtype=np.int64)
    cu_num_tokens = np.cumsum(num_tokens)
    total = int(cu_num_tokens[-1]) if cu_num_tokens.size else 0
    request_starts = np.repeat(cu_num_tokens - num_tokens, num_tokens)
    return cu_num_tokens, np.arange(total, dtype=np.int64) - request_starts


def make_block_tables(block_ids: Sequence[Sequence[int]], width: int) -> np.ndarray:
    """The requests' block tables as one ``[num_reqs, width]`` int32 array, padded with 0.

    Kernels index a rectangle, but requests hold different numbers of blocks, so short rows are
    padded, with block 0, the null block, as upstream's block table is. No kernel here reads an
    entry past a request's ``seq_len``; the padding still has to be harmless if one did (a
    kernel that loads a tile of entries before masking them, a CUDA-graph row that pads the
    batch and reads one token through an all-padding row): the null block is always in bounds
    and holds nobody's data, where a real block id would alias another request's K/V and -1
    would index out of bounds.

    Built without a Python loop over rows (this runs every step, for every request): all the
    lists are read once into one flat array, then scattered through a mask that is True on the
    first ``len(ids)`` cells of each row. A boolean mask assigns in row-major order, the order
    of the concatenated lists, so ``[[7, 3], [5, 9, 2]]`` fills ``[[7, 3, 0], [5, 9, 2]]``.
    """
    lens = np.fromiter(map(len, block_ids), np.int64, count=len(block_ids))
    if (lens > width).any():
        raise ValueError(f"a block table of {int(lens.max())} blocks does not fit width {width}")
    flat = np.fromiter(itertools.chain.from_iterable(block_ids), np.int32, count=int(lens.sum()))
    block_tables = np.zeros((len(block_ids), width), dtype=np.int32)
    block_tables[np.arange(width) < lens[:, None]] = flat
    return block_tables


def compute_slot_mapping(
    block_tables: np.ndarray, req_indices: np.ndarray, positions: np.ndarray, block_size: int
) -> np.ndarray:
    """The KV cache slot of every token of the step (upstream: ``BlockTable.compute_slot_mapping``).

    Token ``t`` of request ``r = req_indices[t]`` at position ``p = positions[t]`` goes to
    ``block_tables[r, p // block_size] * block_size + p % block_size``: the block its position
    falls in, looked up in *its own* request's table, then the offset inside that block. (lab-06
    writes the same rule for one sequence; this is the whole flattened batch at once.)
    """
    block_numbers = block_tables[req_indices, positions // block_size].astype(np.int64)
    return block_numbers * block_size + positions % block_size


def prepare_inputs(
    token_ids: Sequence[Sequence[int]],
    num_computed_tokens: Sequence[int],
    num_scheduled_tokens: Sequence[int],
    block_ids: Sequence[Sequence[int]],
    block_size: int,
    max_num_blocks_per_req: int | None = None,
) -> ModelInputs:
    """Flatten one step's requests into the model's inputs (upstream: ``_prepare_inputs``).

    Request ``i`` runs its tokens ``num_computed_tokens[i] .. + num_scheduled_tokens[i]``: the
    tokens before are already in the KV cache (earlier steps, or a prefix-cache hit), so a
    prefill starts mid-prompt after a hit, a chunk continues where the last one stopped, and a
    decode is the case of one token. Positions restart at each request's own offset, and each
    token's cache slot comes from its request's block table:
    ``slot = block_ids[pos // block_size] * block_size + pos % block_size``.

    Pure: plain lists in, CPU tensors out, no runner state. Vectorised as upstream does it:
    ``np.repeat`` spreads per-request values over their tokens instead of a Python loop per token.

    Args:
        token_ids: per request, every token known so far (prompt + sampled).
        num_computed_tokens: per request, tokens whose K/V is already cached.
        num_scheduled_tokens: per request, tokens to run this step (>= 1).
        block_ids: per request, its block table (must cover the scheduled tokens).
        block_size: tokens per KV cache block.
        max_num_blocks_per_req: width of ``block_tables``; default: the widest table in the batch.
    """
    num_reqs = len(num_scheduled_tokens)
    if not (len(token_ids) == len(num_computed_tokens) == len(block_ids) == num_reqs):
        raise ValueError("prepare_inputs: per-request arguments must have the same length")
    if num_reqs == 0:
        raise ValueError("prepare_inputs: empty batch")
    computed = np.asarray(num_computed_tokens, dtype=np.int64)
    scheduled = np.asarray(num_scheduled_tokens, dtype=np.int64)
    if (scheduled < 1).any():
        raise ValueError(f"every request needs >= 1 scheduled token, got {scheduled.tolist()}")
    seq_lens = computed + scheduled
    # Both checks on whole arrays, not in a loop over requests (at hundreds of requests a step,
    # the loop cost more than the rest of the function); the error names the first bad request.
    num_known = np.fromiter(map(len, token_ids), np.int64, count=num_reqs)
    num_blocks = np.fromiter(map(len, block_ids), np.int64, count=num_reqs)
    blocks_needed = kv_sizing.cdiv(seq_lens, block_size)  # elementwise on an array
    too_many_tokens = seq_lens > num_known
    too_few_blocks = blocks_needed > num_blocks
    if (too_many_tokens | too_few_blocks).any():
        i = int(np.argmax(too_many_tokens | too_few_blocks))
        if too_many_tokens[i]:
            raise ValueError(
                f"request {i}: {computed[i]} computed + {scheduled[i]} scheduled tokens exceed "
                f"its {num_known[i]} known tokens"
            )
        raise ValueError(
            f"request {i}: {seq_lens[i]} tokens need {blocks_needed[i]} blocks, its table has "
            f"{num_blocks[i]}"
        )

    # [2, 5, 3] -> cu_num_tokens [2, 7, 10], query_pos [0 1 0 1 2 3 4 0 1 2],
    # req_indices [0 0 1 1 1 1 1 2 2 2], query_start_loc [0, 2, 7, 10]
    cu_num_tokens, query_pos = _get_cumsum_and_arange(scheduled)
    req_indices = np.repeat(np.arange(num_reqs), scheduled)
    query_start_loc = np.concatenate(([0], cu_num_tokens))
    # A token's position counts the tokens cached before it: the step starts at the offset.
    positions = computed[req_indices] + query_pos

    # Each request's tokens [computed, seq_len) of its own list, read straight into one array.
    # The bounds are converted to Python ints once: slicing a list with numpy scalars is slower,
    # and so is making one small array per request to concatenate.
    starts, ends = computed.tolist(), seq_lens.tolist()
    input_ids = np.fromiter(
        itertools.chain.from_iterable(
            tokens[start:end] for tokens, start, end in zip(token_ids, starts, ends)
        ),
        np.int64,
        count=int(cu_num_tokens[-1]),
    )

    width = max_num_blocks_per_req or int(num_blocks.max())
    block_tables = make_block_tables(block_ids, width)
    slot_mapping = compute_slot_mapping(block_tables, req_indices, positions, block_size)

    return ModelInputs(
        input_ids=torch.from_numpy(input_ids),
        positions=torch.from_numpy(positions),
        slot_mapping=torch.from_numpy(slot_mapping),
        block_tables=torch.from_numpy(block_tables),
        query_start_loc=torch.from_numpy(query_start_loc.astype(np.int32)),
        seq_lens=torch.from_numpy(seq_lens.astype(np.int32)),
        logits_indices=torch.from_numpy(cu_num_tokens - 1),
        max_query_len=int(scheduled.max()),
        max_seq_len=int(seq_lens.max()),
    )


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
        self.requests: dict[str, CachedRequestState] = {}
        self.generator = torch.Generator(device=device)
        self.generator.manual_seed(seed)
        self.kv_cache: torch.Tensor | None = None
        self.kv_caches: list[torch.Tensor] = []
        self.num_gpu_blocks = 0
        self.cudagraph_batch_sizes: list[int] = []
        self._graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self._graph_outputs: dict[int, torch.Tensor] = {}

    # ---------------------------------------------------------------- sizing and allocation

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
        """Apply the scheduler's diff to the cached request states.

        Finished requests are dropped; new ones are recorded (with their own generator when
        seeded, so their randomness never depends on batch neighbours); running ones get their
        new blocks appended; resumed ones (preempted, now recomputing) get their table replaced,
        since their old blocks were freed.
        """
        for req_id in scheduler_output.finished_req_ids:
            self.requests.pop(req_id, None)

        for new_req in scheduler_output.scheduled_new_reqs:
            params = new_req.sampling_params
            generator = None
            if params.sampling_type == SamplingType.RANDOM_SEED:
                generator = torch.Generator(device=self.device)
                generator.manual_seed(params.seed)
            self.requests[new_req.req_id] = CachedRequestState(
                req_id=new_req.req_id,
                prompt_token_ids=list(new_req.prompt_token_ids),
                sampling_params=params,
                generator=generator,
                block_ids=list(new_req.block_ids[0]),
                num_computed_tokens=new_req.num_computed_tokens,
            )

        cached = scheduler_output.scheduled_cached_reqs
        for i, req_id in enumerate(cached.req_ids):
            state = self.requests[req_id]
            state.num_computed_tokens = cached.num_computed_tokens[i]
            new_block_ids = cached.new_block_ids[i]
            if req_id in cached.resumed_req_ids:
                assert new_block_ids is not None
                state.block_ids = list(new_block_ids[0])
            elif new_block_ids is not None:
                state.block_ids.extend(new_block_ids[0])
            all_token_ids = cached.all_token_ids.get(req_id)
            if all_token_ids is not None and len(all_token_ids) > state.num_tokens:
                state.token_ids = list(all_token_ids)

    # ---------------------------------------------------------------- execution

    @torch.inference_mode()
    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        """Run one step; return a sampled token for every request whose prompt is complete."""
        return self.get_output(self.execute_model_async(scheduler_output))

    @torch.inference_mode()
    def execute_model_async(self, scheduler_output: SchedulerOutput) -> PendingOutput:
        """Prepare and launch one step; return without waiting for the GPU."""
        return self.launch_step(self.prepare_step(scheduler_output))

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
        return self.flatten_step(scheduler_output, in_flight)

    def flatten_step(
        self, scheduler_output: SchedulerOutput, in_flight: PendingOutput | None = None
    ) -> PreparedStep:
        """The ``prepare_inputs`` half of ``prepare_step``: the states are already up to date."""
        req_ids = list(scheduler_output.num_scheduled_tokens)
        if not req_ids:
            return PreparedStep([], [], None, [])
        requests = self.requests
        states = [requests[r] for r in req_ids]
        num_scheduled = list(scheduler_output.num_scheduled_tokens.values())
        awaited: dict[int, int] = {}
        if in_flight is not None and in_flight.sampled is not None:
            awaited = {id(in_flight.states[row]): k for k, row in enumerate(in_flight.sample_rows)}
        # Rows whose input is the token in flight: always a one-token decode of it.
        late_rows = [i for i, st in enumerate(states) if id(st) in awaited] if awaited else []
        for i in late_rows:
            states[i].token_ids.append(0)
        try:
            inputs = prepare_inputs(
                [st.token_ids for st in states],
                [st.num_computed_tokens for st in states],
                num_scheduled,
                [st.block_ids for st in states],
                self.block_size,
            )
            # Only requests whose every known token is now computed get a token: the logits
            # of a partial prefill predict a prompt token we already know, so they are not
            # even computed.
            sample_rows: list[int] = []
            num_output_tokens: list[int] = []
            for i, (st, n) in enumerate(zip(states, num_scheduled)):
                num_tokens = len(st.token_ids)
                if st.num_computed_tokens + n == num_tokens:
                    sample_rows.append(i)
                    num_output_tokens.append(num_tokens - len(st.prompt_token_ids))
        finally:
            for i in late_rows:
                states[i].token_ids.pop()
        return PreparedStep(
            req_ids,
            states,
            inputs,
            sample_rows,
            late_rows,
            [awaited[id(states[i])] for i in late_rows],
            in_flight.sampled if late_rows else None,
            num_output_tokens,
        )

    @torch.inference_mode()
    def launch_step(self, prepared: PreparedStep) -> PendingOutput:
        """Queue a prepared step on the device and return without waiting for anything.

        The sampled ids stay on the device (the next step's inputs are copied from there) and
        are copied to pinned host memory behind the step, for ``get_output`` to read.
        """
        inputs, states = prepared.inputs, prepared.states
        if inputs is None:
            return PendingOutput([], [], [], None)
        hidden_states = self._run_model(inputs, self._late_input_ids(prepared))
        sample_rows = prepared.sample_rows
        if not sample_rows:
            return PendingOutput(prepared.req_ids, states, sample_rows, None)
        if len(sample_rows) < len(states):
            rows = torch.tensor(sample_rows, dtype=torch.long)
            hidden_states = hidden_states[self._upload(rows)]
        logits = self.model.compute_logits(hidden_states)
        output = self._sample(logits, [states[i] for i in sample_rows], prepared.num_output_tokens)
        sampled, logprobs = output.sampled_token_ids, output.logprobs_tensors
        if self.device.type != "cuda":
            return PendingOutput(
                prepared.req_ids, states, sample_rows, sampled, sampled, logprobs_host=logprobs
            )
        sampled_host = torch.empty(sampled.shape, dtype=sampled.dtype, pin_memory=True)
        sampled_host.copy_(sampled, non_blocking=True)
        logprobs_host = None if logprobs is None else logprobs.to_cpu_nonblocking()
        ready = torch.cuda.Event()
        ready.record()
        return PendingOutput(
            prepared.req_ids, states, sample_rows, sampled, sampled_host, ready, logprobs_host
        )

    def get_output(self, pending: PendingOutput) -> ModelRunnerOutput:
        """Wait for a launched step's tokens (the one device-to-host read of a step) and record
        each in its request's state, where later steps' inputs come from.

        It waits for that step only: steps launched after it keep the GPU busy meanwhile.
        """
        sampled_token_ids: list[list[int]] = [[] for _ in pending.req_ids]
        if pending.sampled_host is not None:
            if pending.ready is not None:
                pending.ready.synchronize()
            for row, token_id in zip(pending.sample_rows, pending.sampled_host.tolist()):
                pending.states[row].token_ids.append(token_id)
                sampled_token_ids[row] = [token_id]
        logprobs = None
        if pending.logprobs_host is not None:
            first_rows = np.cumsum([0] + [len(t) for t in sampled_token_ids[:-1]]).tolist()
            logprobs = pending.logprobs_host.tolists(first_rows)
        return ModelRunnerOutput(
            req_ids=pending.req_ids,
            req_id_to_index={r: i for i, r in enumerate(pending.req_ids)},
            sampled_token_ids=sampled_token_ids,
            logprobs=logprobs,
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
    ) -> torch.Tensor:
        """Hidden states of each request's last token, ``[num_reqs, hidden_size]``."""
        num_reqs = inputs.seq_lens.shape[0]
        if (
            self._graphs
            and inputs.max_query_len == 1
            and num_reqs <= self.cudagraph_batch_sizes[-1]
        ):
            return self._replay_cuda_graph(inputs, late)
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
        return hidden_states[upload(inputs.logits_indices)]

    def _sample(
        self,
        logits: torch.Tensor,
        states: list[CachedRequestState],
        num_output_tokens: list[int],
    ) -> SamplerOutput:
        """Build the batch's ``SamplingMetadata`` and draw one token per row, left on the device
        (``get_output`` reads them back). ``num_output_tokens[row]`` counts the row's request's
        output so far, a token still in flight included (``min_tokens`` masks stops below it)."""
        params = [s.sampling_params for s in states]
        vocab_size = logits.shape[-1]
        asked = [p.logprobs for p in params if p.logprobs is not None]
        max_num_logprobs = max(vocab_size if k == -1 else k for k in asked) if asked else None
        stop_token_masks = {
            row: sorted(p.all_stop_token_ids)
            for row, (p, n) in enumerate(zip(params, num_output_tokens))
            if p.min_tokens and n < p.min_tokens and p.all_stop_token_ids
        }
        types = [p.sampling_type for p in params]
        if all(t == SamplingType.GREEDY for t in types):
            # The common offline case: an argmax needs none of the per-row tensors, whose
            # host-to-device copies would cost more than the argmax itself.
            metadata = SamplingMetadata(
                temperature=None, all_greedy=True, all_random=False, top_p=None, top_k=None,
                stop_token_masks=stop_token_masks, max_num_logprobs=max_num_logprobs,
            )  # fmt: skip
            return self.sampler(logits, metadata)
        top_k = [p.top_k if 0 < p.top_k < vocab_size else vocab_size for p in params]
        top_p = [p.top_p for p in params]
        metadata = SamplingMetadata(
            temperature=torch.tensor(
                [p.temperature for p in params], dtype=torch.float32, device=self.device
            ),
            all_greedy=False,
            all_random=all(t != SamplingType.GREEDY for t in types),
            top_p=None
            if all(v >= 1.0 for v in top_p)
            else torch.tensor(top_p, dtype=torch.float32, device=self.device),
            top_k=None
            if all(k == vocab_size for k in top_k)
            else torch.tensor(top_k, dtype=torch.long, device=self.device),
            generators={i: s.generator for i, s in enumerate(states) if s.generator is not None},
            default_generator=self.generator,
            stop_token_masks=stop_token_masks,
            max_num_logprobs=max_num_logprobs,
        )
        return self.sampler(logits, metadata)

    # ---------------------------------------------------------------- CUDA graphs

    @torch.inference_mode()
    def capture_model(self) -> None:
        """Capture decode steps in CUDA graphs, one per padded batch size (upstream's name).

        A decode step launches hundreds of small kernels whose launch cost exceeds their run
        time at small batch sizes; a graph replays them all with one launch. Graphs freeze
        shapes and addresses, so every input lives in a static buffer sized for the largest
        batch, a batch is padded up to the next captured size (padding tokens write to slot -1,
        i.e. nowhere, and read one token of the null block), and the block table is as wide as
        ``max_model_len`` needs. Only decode-only batches replay graphs; anything else runs eagerly.
        """
        if not self.use_cuda_graph or self.kv_cache is None:
            return
        max_bs = min(self.max_num_seqs, 256)
        sizes = sorted({s for s in [1, 2, 4, *range(8, max_bs + 1, 8)] if s <= max_bs} | {max_bs})
        device = self.device
        self._static = {
            "input_ids": torch.zeros(max_bs, dtype=torch.long, device=device),
            "positions": torch.zeros(max_bs, dtype=torch.long, device=device),
            "slot_mapping": torch.full((max_bs,), -1, dtype=torch.long, device=device),
            "block_tables": torch.zeros(
                (max_bs, self.max_num_blocks_per_req), dtype=torch.int32, device=device
            ),
            "seq_lens": torch.ones(max_bs, dtype=torch.int32, device=device),
            "query_start_loc": torch.arange(max_bs + 1, dtype=torch.int32, device=device),
        }
        # Pinned host twins of the static inputs: a step fills them, then copies them over
        # asynchronously (a copy from pageable memory would block the host on each of them).
        self._staging = {
            name: torch.zeros_like(t, device="cpu").pin_memory() for name, t in self._static.items()
        }
        # numpy views of the same memory: filling them costs a fraction of torch's per-op
        # dispatch, and the launch path fills five of them per step.
        self._staging_np = {name: t.numpy() for name, t in self._staging.items()}
        self._staging_free = torch.cuda.Event()
        pool = torch.cuda.graph_pool_handle()
        try:
            for bs in reversed(sizes):
                metadata = self._graph_metadata(bs)
                static = self._static
                for _ in range(2):  # warm up: Triton autotuning and lazy inits stay outside
                    self.model(
                        static["input_ids"][:bs], static["positions"][:bs], self.kv_caches, metadata
                    )
                torch.cuda.synchronize(device)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool):
                    out = self.model(
                        static["input_ids"][:bs],
                        static["positions"][:bs],
                        self.kv_caches,
                        metadata,
                    )
                self._graphs[bs] = graph
                self._graph_outputs[bs] = out
        except Exception as exc:  # never let an optimisation take the engine down
            logger.warning("CUDA graph capture failed (%s); running decode eagerly", exc)
            self._graphs.clear()
            self._graph_outputs.clear()
            return
        self.cudagraph_batch_sizes = sizes
        logger.info("captured CUDA graphs for decode batch sizes %s", sizes)

    def _graph_metadata(self, bs: int) -> AttentionMetadata:
        static = self._static
        return AttentionMetadata(
            slot_mapping=static["slot_mapping"][:bs],
            block_tables=static["block_tables"][:bs],
            query_start_loc=static["query_start_loc"][: bs + 1],
            seq_lens=static["seq_lens"][:bs],
            max_query_len=1,
            max_seq_len=self.max_model_len,
            use_triton=True,
        )

    def _replay_cuda_graph(
        self,
        inputs: ModelInputs,
        late: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        num_reqs = inputs.seq_lens.shape[0]
        bs = next(s for s in self.cudagraph_batch_sizes if s >= num_reqs)
        width = inputs.block_tables.shape[1]
        host = self._staging_np
        self._staging_free.synchronize()  # the previous step's copies have left the buffers
        # Padding rows embed token 0 at position 0 (any valid id: an id past the vocabulary
        # would trip the embedding's bounds check), write nowhere (slot -1) and read one token
        # of the null block. Table entries past a row's length are never read.
        for name, value, pad in (
            ("input_ids", inputs.input_ids, 0),
            ("positions", inputs.positions, 0),
            ("slot_mapping", inputs.slot_mapping, -1),
            ("seq_lens", inputs.seq_lens, 1),
        ):
            host[name][:num_reqs] = value.numpy()
            host[name][num_reqs:bs] = pad
        host["block_tables"][:num_reqs, :width] = inputs.block_tables.numpy()
        host["block_tables"][num_reqs:bs, 0] = 0
        for name in ("input_ids", "positions", "slot_mapping", "seq_lens", "block_tables"):
            self._static[name][:bs].copy_(self._staging[name][:bs], non_blocking=True)
        self._staging_free.record()
        self._forward_late_tokens(self._static["input_ids"], late)
        self._graphs[bs].replay()
        return self._graph_outputs[bs][:num_reqs]


# Upstream's name, for reading the two side by side.
GPUModelRunner = ModelRunner
