"""The embedding and LM head split by vocabulary (upstream: ``vocab_parallel_embedding.py``).

Both uses of the ``[vocab, hidden]`` matrix split it by vocabulary rows: the embedding looks up
each rank's token range and all-reduces, the LM head all-gathers each rank's logit slice; the
vocabulary is padded to a multiple of 64 first. On one rank nothing is padded or gathered: the
layers are ``nn.Embedding`` and a bias-free ``nn.Linear`` in all but name. Why the split works:
docs/upstream-fidelity.md (module notes).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from mini_vllm.distributed import sharding
from mini_vllm.distributed.communication_op import (
    tensor_model_parallel_all_gather,
    tensor_model_parallel_all_reduce,
)
from mini_vllm.distributed.parallel_state import (
    check_tensor_model_parallel_world_size,
    get_tensor_model_parallel_rank,
    get_tensor_model_parallel_world_size,
)


class VocabParallelEmbedding(nn.Module):
    """Token embedding whose rows are split across ranks by token id."""

    def __init__(self, num_embeddings: int, embedding_dim: int) -> None:
        super().__init__()
        self.tp_rank = get_tensor_model_parallel_rank()
        self.tp_size = get_tensor_model_parallel_world_size()
        self.org_vocab_size = num_embeddings
        self.embedding_dim = embedding_dim
        if self.tp_size == 1:
            # One rank: no padding, so logits keep the vocabulary's exact width.
            self.num_embeddings_padded = num_embeddings
            self.vocab_start_index, self.vocab_end_index = 0, num_embeddings
        else:
            self.num_embeddings_padded = sharding.pad_vocab_size(num_embeddings)
            self.vocab_start_index, self.vocab_end_index = sharding.vocab_range(
                num_embeddings, self.tp_rank, self.tp_size
            )
        self.num_embeddings_per_partition = self.vocab_end_index - self.vocab_start_index
        self.weight = nn.Parameter(torch.empty(self.num_embeddings_per_partition, embedding_dim))

    @property
    def num_org_vocab_in_partition(self) -> int:
        """Rows of this rank that are real tokens (the rest, on the last rank, are padding)."""
        return max(0, min(self.vocab_end_index, self.org_vocab_size) - self.vocab_start_index)

    def weight_loader(self, param: nn.Parameter, loaded_weight: torch.Tensor) -> None:
        """Copy this rank's rows of the full ``[vocab, hidden]`` matrix; zero the padding."""
        if loaded_weight.shape != (self.org_vocab_size, self.embedding_dim):
            raise ValueError(
                f"{type(self).__name__}: checkpoint shape {tuple(loaded_weight.shape)} != "
                f"{(self.org_vocab_size, self.embedding_dim)}"
            )
        n = self.num_org_vocab_in_partition
        with torch.no_grad():
            param[:n].copy_(loaded_weight.narrow(0, self.vocab_start_index, n))
            param[n:].zero_()

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self.tp_size == 1:
            return F.embedding(input_ids, self.weight)
        # Ids outside this rank's range look up row 0 and are then zeroed: the all-reduce
        # adds the one rank that does hold each id.
        outside = (input_ids < self.vocab_start_index) | (input_ids >= self.vocab_end_index)
        local_ids = (input_ids - self.vocab_start_index).masked_fill_(outside, 0)
        output = F.embedding(local_ids, self.weight)
        output.masked_fill_(outside.unsqueeze(-1), 0)
        check_tensor_model_parallel_world_size(self.tp_size)
        return tensor_model_parallel_all_reduce(output)


class ParallelLMHead(VocabParallelEmbedding):
    """The output projection, split by vocabulary like the embedding (and, when the model ties
    them, the very same tensor: each rank's head slice is its embedding slice)."""

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """``[rows, vocab]`` logits on every rank: this rank's slice, all-gathered."""
        logits = F.linear(hidden_states, self.weight)
        if self.tp_size == 1:
            return logits
        check_tensor_model_parallel_world_size(self.tp_size)
        logits = tensor_model_parallel_all_gather(logits, dim=-1)
        return logits[..., : self.org_vocab_size]
