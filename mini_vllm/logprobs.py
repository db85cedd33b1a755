"""Log-probabilities of sampled tokens, from the sampler's tensors to what a user reads: mirrors
``vllm/logprobs.py`` and the transport forms of ``vllm/v1/outputs.py`` (upstream-fidelity.md)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:  # the front-end and lab-10 read these types without torch installed
    import torch


@dataclass
class Logprob:
    """One token's log-probability, its rank in the vocabulary (1 = most likely) and its text."""

    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


SampleLogprobs = list[dict[int, Logprob]]
"""One dict per generated token: token id -> ``Logprob``."""

PromptLogprobs = list[dict[int, Logprob] | None]
"""One dict per prompt token, None for the first (nothing precedes it to score it)."""


class LogprobsLists(NamedTuple):
    """One step's logprobs on the host, one row per sampled token: the sampled token, then the
    batch's ``max_num_logprobs`` best. ``cu_num_generated_tokens[i]``: request ``i``'s first row."""

    logprob_token_ids: list[list[int]]
    logprobs: list[list[float]]
    sampled_token_ranks: list[int]
    cu_num_generated_tokens: list[int] | None = None

    def slice_request(self, req_idx: int, num_positions: int) -> LogprobsLists:
        """The rows of the ``req_idx``-th request: its first ``num_positions`` tokens."""
        cu = self.cu_num_generated_tokens
        start = req_idx if cu is None else cu[req_idx]
        rows = slice(start, start + num_positions)
        return LogprobsLists(
            self.logprob_token_ids[rows], self.logprobs[rows], self.sampled_token_ranks[rows]
        )


class LogprobsTensors(NamedTuple):
    """One step's logprobs as the sampler leaves them on the device (see ``LogprobsLists``)."""

    logprob_token_ids: torch.Tensor  # [num_rows, max_num_logprobs + 1] int64
    logprobs: torch.Tensor  # [num_rows, max_num_logprobs + 1] float32
    selected_token_ranks: torch.Tensor  # [num_rows] int64

    def tolists(self, cu_num_generated_tokens: list[int] | None = None) -> LogprobsLists:
        token_ids, logprobs, ranks = (t.tolist() for t in self)
        return LogprobsLists(token_ids, logprobs, ranks, cu_num_generated_tokens)

    def to_cpu_nonblocking(self) -> LogprobsTensors:
        """Pinned host copies queued behind the step (read them after its event fired)."""
        if self.logprobs.device.type != "cuda":
            return self
        return LogprobsTensors(*(_pinned_copy(t) for t in self))


def _pinned_copy(tensor: torch.Tensor) -> torch.Tensor:
    import torch

    host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
    host.copy_(tensor, non_blocking=True)
    return host


def append_logprobs_for_next_position(
    request_logprobs: SampleLogprobs,
    token_ids: Sequence[int],
    logprobs: Sequence[float],
    decoded_tokens: Sequence[str | None],
    rank: int,
    num_logprobs: int,
) -> None:
    """Append one position's dict: the sampled token (its own rank) then ranks 1..num_logprobs.
    ``zip`` stops at the request's own ``num_logprobs + 1`` entries (a batch-mate may have asked
    for more); a sampled token also in the top ones is written twice, the same, so once."""
    ranks = [rank, *range(1, num_logprobs + 1)]
    request_logprobs.append(
        {
            token_id: Logprob(logprob=logprob, rank=token_rank, decoded_token=token)
            for token_id, logprob, token_rank, token in zip(
                token_ids, logprobs, ranks, decoded_tokens
            )
        }
    )
