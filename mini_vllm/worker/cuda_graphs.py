"""Decode steps replayed from CUDA graphs, one graph per padded batch size.

A decode step launches hundreds of small kernels whose launch cost exceeds their run time at
small batch sizes; a graph replays them all with one launch. Graphs freeze shapes and addresses,
so inputs live in static buffers and a decode-only batch is padded up to the next captured size;
anything else runs eagerly. Upstream's ``CudaGraphManager`` also captures piecewise graphs for
mixed batches (padding, tensor parallelism and that difference: docs/upstream-fidelity.md,
module notes).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from mini_vllm.model.attention import AttentionMetadata

if TYPE_CHECKING:
    from mini_vllm.model.llama import LlamaForCausalLM
    from mini_vllm.worker.model_inputs import ModelInputs

logger = logging.getLogger(__name__)

# Inputs a decode step reads, and what a padding row holds in each.
_PADDING = {"input_ids": 0, "positions": 0, "slot_mapping": -1, "seq_lens": 1}


class CudaGraphManager:
    """Captures the model's decode step at each batch size, then replays the right one."""

    def __init__(
        self,
        model: LlamaForCausalLM,
        kv_caches: list[torch.Tensor],
        device: torch.device,
        max_batch_size: int,
        max_num_blocks_per_req: int,
        max_model_len: int,
    ) -> None:
        self.model = model
        self.kv_caches = kv_caches
        self.device = device
        self.max_model_len = max_model_len
        self.batch_sizes = sorted(
            {s for s in [1, 2, 4, *range(8, max_batch_size + 1, 8)] if s <= max_batch_size}
            | {max_batch_size}
        )
        self._graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self._outputs: dict[int, torch.Tensor] = {}
        n = max_batch_size
        self._static = {
            "input_ids": torch.zeros(n, dtype=torch.long, device=device),
            "positions": torch.zeros(n, dtype=torch.long, device=device),
            "slot_mapping": torch.full((n,), -1, dtype=torch.long, device=device),
            "block_tables": torch.zeros(
                (n, max_num_blocks_per_req), dtype=torch.int32, device=device
            ),
            "seq_lens": torch.ones(n, dtype=torch.int32, device=device),
            "query_start_loc": torch.arange(n + 1, dtype=torch.int32, device=device),
        }
        # Pinned host twins of the static inputs: a step fills them, then copies them over
        # asynchronously (a copy from pageable memory would block the host on each of them).
        self._staging = {
            name: torch.zeros_like(t, device="cpu").pin_memory() for name, t in self._static.items()
        }
        # numpy views of the same memory: filling them costs a fraction of torch's per-op
        # dispatch, and every replay fills five of them.
        self._staging_np = {name: t.numpy() for name, t in self._staging.items()}
        self._staging_free = torch.cuda.Event()

    def _metadata(self, bs: int) -> AttentionMetadata:
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

    def _forward(self, bs: int) -> torch.Tensor:
        static = self._static
        return self.model(
            static["input_ids"][:bs], static["positions"][:bs], self.kv_caches, self._metadata(bs)
        )

    @torch.inference_mode()
    def capture(self) -> bool:
        """Capture every size, largest first (the smaller ones reuse its memory pool).

        Returns False, leaving nothing captured, if any capture fails: an optimisation must
        never take the engine down, and eager decode is always correct.
        """
        pool = torch.cuda.graph_pool_handle()
        try:
            for bs in reversed(self.batch_sizes):
                for _ in range(2):  # warm up: Triton autotuning and lazy inits stay outside
                    self._forward(bs)
                torch.cuda.synchronize(self.device)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool):
                    self._outputs[bs] = self._forward(bs)
                self._graphs[bs] = graph
        except Exception as exc:
            logger.warning("CUDA graph capture failed (%s); running decode eagerly", exc)
            self._graphs.clear()
            self._outputs.clear()
            return False
        logger.info("captured CUDA graphs for decode batch sizes %s", self.batch_sizes)
        return True

    def can_replay(self, inputs: ModelInputs) -> bool:
        """Decode-only (one token per request) and no larger than the largest graph."""
        return inputs.max_query_len == 1 and inputs.seq_lens.shape[0] <= self.batch_sizes[-1]

    def replay(
        self, inputs: ModelInputs, fill_late_tokens: Callable[[torch.Tensor], None]
    ) -> torch.Tensor:
        """Copy the step into the static inputs, padded to the next captured size, and replay.

        ``fill_late_tokens(input_ids)`` queues the copy of the tokens still being sampled by
        the step in flight into the static input ids, after the step's own copy.
        """
        num_reqs = inputs.seq_lens.shape[0]
        bs = next(s for s in self.batch_sizes if s >= num_reqs)
        width = inputs.block_tables.shape[1]
        host = self._staging_np
        self._staging_free.synchronize()  # the previous step's copies have left the buffers
        # Padding rows embed token 0 at position 0 (any valid id: an id past the vocabulary
        # would trip the embedding's bounds check), write nowhere (slot -1) and read one token
        # of the null block. Table entries past a row's length are never read.
        for name, pad in _PADDING.items():
            host[name][:num_reqs] = getattr(inputs, name).numpy()
            host[name][num_reqs:bs] = pad
        host["block_tables"][:num_reqs, :width] = inputs.block_tables.numpy()
        host["block_tables"][num_reqs:bs, 0] = 0
        for name in (*_PADDING, "block_tables"):
            self._static[name][:bs].copy_(self._staging[name][:bs], non_blocking=True)
        self._staging_free.record()
        fill_late_tokens(self._static["input_ids"])
        self._graphs[bs].replay()
        return self._outputs[bs][:num_reqs]
