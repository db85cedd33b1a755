"""The arithmetic of tensor parallelism: who holds which heads, rows and columns, and how much KV.

Every rule a rank needs to find its slice of the model lives here as a small pure function, so
that it can be read, tested and graded apart from the processes and collectives that use it (the
parallel layers of ``mini_vllm/model/`` call them while loading weights; the KV cache sizing calls
them per rank); upstream spreads the same rules over four files. The three rules (query heads,
KV heads, vocabulary) and where upstream keeps them: docs/upstream-fidelity.md (module notes).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# Upstream's DEFAULT_VOCAB_PADDING_SIZE: vocabularies are padded to a multiple of this.
DEFAULT_VOCAB_PADDING_SIZE = 64


def divide(numerator: int, denominator: int) -> int:
    """``numerator / denominator`` when it is a whole number; a ValueError otherwise (0 too).

    Upstream's ``divide`` asserts; a sharding rule that silently floors would hand the last
    rank a short shard, and the model would compute garbage without an error.
    """
    if denominator <= 0 or numerator % denominator != 0:
        raise ValueError(f"{numerator} is not divisible by {denominator}")
    return numerator // denominator


def shard_range(total: int, rank: int, tp_size: int) -> tuple[int, int]:
    """``[start, end)`` of rank ``rank``'s equal share of ``total`` items (rows, columns, heads)."""
    _check_rank(rank, tp_size)
    size = divide(total, tp_size)
    return rank * size, (rank + 1) * size


def num_heads_per_rank(total_num_heads: int, tp_size: int) -> int:
    """Query heads each rank computes (upstream: ``ModelConfig.get_num_attention_heads``)."""
    return divide(total_num_heads, tp_size)


def num_kv_heads_per_rank(total_num_kv_heads: int, tp_size: int) -> int:
    """KV heads each rank stores: an even share, or one (replicated) when there are fewer KV
    heads than ranks. Upstream's ``ModelConfig.get_num_kv_heads``; the divisibility of each
    case is checked by ``check_tensor_parallel_size``."""
    return max(1, total_num_kv_heads // tp_size)


def num_kv_head_replicas(total_num_kv_heads: int, tp_size: int) -> int:
    """How many ranks hold a copy of each KV head: 1 unless ``tp_size > total_num_kv_heads``.

    ``QKVParallelLinear``'s ``num_kv_head_replicas``: with 2 KV heads on 4 ranks, ranks 0 and 1
    both hold KV head 0, ranks 2 and 3 both hold KV head 1.
    """
    if tp_size >= total_num_kv_heads:
        return divide(tp_size, total_num_kv_heads)
    return 1


def kv_head_range(total_num_kv_heads: int, rank: int, tp_size: int) -> tuple[int, int]:
    """``[start, end)`` of the KV heads rank ``rank`` holds (its K and V projection rows).

    Split: its even share. Replicated: the one head ``rank // replicas``, which is the KV head
    of every query head the rank holds (query head ``q`` reads KV head
    ``q // (total_heads / total_kv_heads)``, and ``q // (total_heads / tp_size)`` is the rank).
    """
    _check_rank(rank, tp_size)
    per_rank = num_kv_heads_per_rank(total_num_kv_heads, tp_size)
    first = (rank // num_kv_head_replicas(total_num_kv_heads, tp_size)) * per_rank
    return first, first + per_rank


def pad_vocab_size(vocab_size: int, pad_to: int = DEFAULT_VOCAB_PADDING_SIZE) -> int:
    """The vocabulary rounded up to a multiple of ``pad_to`` (upstream's ``pad_vocab_size``)."""
    return -(-vocab_size // pad_to) * pad_to


def vocab_range(vocab_size: int, rank: int, tp_size: int) -> tuple[int, int]:
    """``[start, end)`` of the token ids whose embedding rows rank ``rank`` holds.

    Ids are taken from the padded vocabulary (``pad_vocab_size``), so the last rank's range may
    run past the real vocabulary: those rows are padding, zero, never looked up.
    """
    return shard_range(pad_vocab_size(vocab_size), rank, tp_size)


@dataclass(frozen=True)
class TPShapes:
    """One rank's share of a Llama-family model: what its layers and its KV cache are sized by."""

    tp_size: int
    num_heads: int  # query heads per rank
    num_kv_heads: int  # KV heads per rank (one, replicated, when there are fewer than ranks)
    num_kv_head_replicas: int
    intermediate_size: int  # MLP width per rank
    vocab_size_padded: int  # whole padded vocabulary (every rank holds 1 / tp_size of it)


def check_tensor_parallel_size(config: Any, tp_size: int) -> TPShapes:
    """Refuse a ``tensor_parallel_size`` the model cannot be split by; return the per-rank shapes.

    The first check is upstream's ``ModelConfig.verify_with_parallel_config``: every rank must
    hold the same number of whole query heads. The others are the ``divide`` calls upstream
    makes while building the layers (KV heads, MLP width, padded vocabulary), checked here
    before any process starts so that the message says which dimension is at fault.
    """
    if not isinstance(tp_size, int) or isinstance(tp_size, bool) or tp_size < 1:
        raise ValueError(f"tensor_parallel_size must be a positive integer, got {tp_size!r}")
    total_heads = int(config.num_attention_heads)
    total_kv = int(getattr(config, "num_key_value_heads", None) or total_heads)
    intermediate = int(config.intermediate_size)
    vocab = int(config.vocab_size)
    if total_heads % tp_size != 0:
        choices = ", ".join(str(d) for d in range(1, total_heads + 1) if total_heads % d == 0)
        raise ValueError(
            f"the model's total number of attention heads ({total_heads}) is not divisible by "
            f"tensor_parallel_size ({tp_size}): every rank must hold the same number of whole "
            f"heads. Sizes that divide {total_heads}: {choices}."
        )
    if tp_size >= total_kv and tp_size % total_kv != 0:
        raise ValueError(
            f"tensor_parallel_size ({tp_size}) exceeds the model's {total_kv} KV heads but is "
            f"not a multiple of them: each KV head must be replicated on the same number of "
            "ranks"
        )
    if tp_size < total_kv and total_kv % tp_size != 0:
        raise ValueError(
            f"the model's {total_kv} KV heads are not divisible by tensor_parallel_size "
            f"({tp_size}): every rank must hold the same number of whole KV heads"
        )
    if intermediate % tp_size != 0:
        raise ValueError(
            f"the model's MLP width (intermediate_size={intermediate}) is not divisible by "
            f"tensor_parallel_size ({tp_size})"
        )
    padded = pad_vocab_size(vocab)
    if padded % tp_size != 0:
        raise ValueError(
            f"the model's vocabulary ({vocab}, padded to {padded}) is not divisible by "
            f"tensor_parallel_size ({tp_size})"
        )
    return TPShapes(
        tp_size=tp_size,
        num_heads=total_heads // tp_size,
        num_kv_heads=num_kv_heads_per_rank(total_kv, tp_size),
        num_kv_head_replicas=num_kv_head_replicas(total_kv, tp_size),
        intermediate_size=intermediate // tp_size,
        vocab_size_padded=padded,
    )


def shard_tensor(tensor: Any, dim: int, rank: int, tp_size: int) -> Any:
    """Rank ``rank``'s equal slice of ``tensor`` along ``dim`` (a view: nothing is copied).

    ``dim=0`` cuts output rows (column-parallel layers: each rank computes some outputs);
    ``dim=1`` cuts input columns (row-parallel layers: each rank sums over some inputs, and
    an all-reduce adds the partial sums).
    """
    start, end = shard_range(int(tensor.shape[dim]), rank, tp_size)
    return tensor.narrow(dim, start, end - start)


def shard_qkv_weight(
    tensor: Any,
    shard_id: str,
    head_dim: int,
    total_num_heads: int,
    total_num_kv_heads: int,
    rank: int,
    tp_size: int,
) -> Any:
    """Rank ``rank``'s rows of one of the checkpoint's ``q_proj``/``k_proj``/``v_proj`` tensors.

    ``tensor`` is the full projection (``[heads * head_dim, ...]``: weight or bias). Query rows
    are split by head; K and V rows follow ``kv_head_range``, so ranks that share a replicated
    KV head load the same rows.
    """
    if shard_id == "q":
        first, last = shard_range(total_num_heads, rank, tp_size)
    elif shard_id in ("k", "v"):
        first, last = kv_head_range(total_num_kv_heads, rank, tp_size)
    else:
        raise ValueError(f"shard_id must be 'q', 'k' or 'v', got {shard_id!r}")
    return tensor.narrow(0, first * head_dim, (last - first) * head_dim)


def _check_rank(rank: int, tp_size: int) -> None:
    if tp_size < 1 or not 0 <= rank < tp_size:
        raise ValueError(f"rank {rank} is not in a tensor-parallel group of size {tp_size}")
