"""Prompt logprobs: which prompt positions a step scores, scoring them, and handing them back.

Upstream's ``GPUModelRunner._get_prompt_logprobs_dict`` (``vllm/v1/worker/gpu_model_runner.py``).
A request that asks for ``prompt_logprobs`` reads no cached prefix, so each of its prefill
chunks computes hidden states for its prompt tokens; the logits at position ``p`` predict prompt
token ``p + 1``, and are scored as the sampler scores a sampled token (its logprob and rank, and
the best ``k``). The rows go to the host with the step's sampled tokens.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from mini_vllm.logprobs import LogprobsLists, LogprobsTensors
from mini_vllm.sample.sampler import Sampler
from mini_vllm.worker.input_batch import InputBatch
from mini_vllm.worker.model_inputs import ModelInputs


@dataclass
class PromptLogprobsChunk:
    """The prompt positions one step scores for one request: the logits at flattened positions
    ``flat_start ...`` predict its prompt tokens ``targets``, which start at prompt position
    ``first_position + 1`` (the first prompt token has no logprob)."""

    req_id: str
    num_logprobs: int  # -1: the whole vocabulary
    flat_start: int
    first_position: int
    targets: np.ndarray


def prompt_chunks(
    batch: InputBatch,
    req_ids: list[str],
    rows: np.ndarray,
    num_scheduled: np.ndarray,
    inputs: ModelInputs,
) -> list[PromptLogprobsChunk]:
    """The step's chunks: a request computing tokens ``[start, start + n)`` scores prompt tokens
    ``start + 1`` up to the prompt's last (none once its prompt is computed)."""
    if not batch.num_prompt_logprobs:
        return []
    chunks = []
    for i, row in enumerate(rows.tolist()):
        num_logprobs = batch.num_prompt_logprobs.get(row)
        if num_logprobs is None:
            continue
        start = int(batch.num_computed_tokens_cpu[row])
        end = min(start + int(num_scheduled[i]), int(batch.num_prompt_tokens[row]) - 1)
        if end > start:
            targets = batch.token_ids_cpu[row, start + 1 : end + 1].astype(np.int64)
            flat_start = int(inputs.query_start_loc[i])
            chunks.append(PromptLogprobsChunk(req_ids[i], num_logprobs, flat_start, start, targets))
    return chunks


def score_prompt_chunks(
    model: Any,
    hidden_states: torch.Tensor,
    chunks: list[PromptLogprobsChunk],
    upload: Callable[[torch.Tensor], torch.Tensor],
) -> LogprobsTensors:
    """One row per scored position, the chunks in order: the prompt token and the best ones,
    from ``hidden_states`` of every token of the step."""
    flat = np.concatenate([c.flat_start + np.arange(len(c.targets)) for c in chunks])
    targets = np.concatenate([c.targets for c in chunks])
    logits = model.compute_logits(hidden_states[upload(torch.from_numpy(flat))])
    vocab_size = logits.shape[-1]
    k = max(vocab_size if c.num_logprobs == -1 else c.num_logprobs for c in chunks)
    logprobs = Sampler.compute_logprobs(logits)
    return Sampler.gather_logprobs(logprobs, k, upload(torch.from_numpy(targets)))


def split_by_request(
    scored: LogprobsTensors, chunks: list[PromptLogprobsChunk]
) -> dict[str, tuple[int, LogprobsLists]]:
    """``request id -> (first position, its rows)``, from the host copy of the scored rows."""
    token_ids, values, ranks, _ = scored.tolists()
    out = {}
    first = 0
    for chunk in chunks:
        end = first + len(chunk.targets)
        rows = LogprobsLists(token_ids[first:end], values[first:end], ranks[first:end])
        out[chunk.req_id] = (chunk.first_position, rows)
        first = end
    return out
