"""The sharding arithmetic, and every rank's weight shards against the full model's weights.

Pure functions first (``mini_vllm.distributed.sharding``: ranges, the KV-head replication rule,
the divisibility checks), then the layers: a shard of each rank is built in this one process
(``model_parallel_state``), loaded from the same full checkpoint tensors as the one-rank model,
and the shards must put the full weights back together, in the layout the forward pass assumes.
"""

from __future__ import annotations

import itertools
from types import SimpleNamespace

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from mini_vllm.distributed import sharding
from mini_vllm.distributed.parallel_state import (
    get_tensor_model_parallel_rank,
    get_tensor_model_parallel_world_size,
    model_parallel_state,
)
from mini_vllm.model.llama import LlamaForCausalLM
from tests.tp.conftest import tiny_tp_config, tiny_tp_model


@given(total=st.integers(1, 64), tp=st.integers(1, 16))
def test_shard_ranges_tile_the_whole_dimension(total: int, tp: int) -> None:
    if total % tp:
        with pytest.raises(ValueError, match="not divisible"):
            sharding.shard_range(total, 0, tp)
        return
    ranges = [sharding.shard_range(total, r, tp) for r in range(tp)]
    assert ranges[0][0] == 0 and ranges[-1][1] == total
    assert all(a[1] == b[0] for a, b in itertools.pairwise(ranges))
    assert len({end - start for start, end in ranges}) == 1


@st.composite
def valid_shapes(draw: st.DrawFn) -> tuple[int, int, int]:
    """(total heads, total KV heads, tp size) that upstream accepts."""
    kv = draw(st.sampled_from([1, 2, 3, 4, 8]))
    if draw(st.booleans()):  # fewer ranks than KV heads: split
        tp = draw(st.sampled_from([d for d in range(1, kv + 1) if kv % d == 0]))
    else:  # at least as many ranks: replicate
        tp = kv * draw(st.integers(1, 4))
    group = draw(st.integers(1, 4))  # query heads per KV head
    heads = kv * group
    # the query heads must divide too
    while heads % tp:
        heads += kv * group
    return heads, kv, tp


@given(valid_shapes())
def test_every_query_head_sits_with_its_kv_head(shape: tuple[int, int, int]) -> None:
    heads, kv, tp = shape
    group = heads // kv
    replicas = sharding.num_kv_head_replicas(kv, tp)
    held_by: dict[int, list[int]] = {}
    for rank in range(tp):
        q_first, q_last = sharding.shard_range(heads, rank, tp)
        kv_first, kv_last = sharding.kv_head_range(kv, rank, tp)
        assert kv_last - kv_first == sharding.num_kv_heads_per_rank(kv, tp) >= 1
        # the KV head of each query head of this rank is among this rank's KV heads
        for q in range(q_first, q_last):
            assert kv_first <= q // group < kv_last
        for h in range(kv_first, kv_last):
            held_by.setdefault(h, []).append(rank)
    assert sorted(held_by) == list(range(kv))  # every KV head is somewhere
    assert all(len(ranks) == replicas for ranks in held_by.values())
    if tp <= kv:
        assert replicas == 1
    else:  # replicated on consecutive ranks
        for ranks in held_by.values():
            assert ranks == list(range(ranks[0], ranks[0] + replicas))


def _config(heads: int, kv: int, inter: int = 64, vocab: int = 100) -> SimpleNamespace:
    return SimpleNamespace(
        num_attention_heads=heads,
        num_key_value_heads=kv,
        intermediate_size=inter,
        vocab_size=vocab,
    )


def test_smollm2_splits_three_ways_and_refuses_two() -> None:
    smollm2 = _config(9, 3, 1536, 49152)
    shapes = sharding.check_tensor_parallel_size(smollm2, 3)
    assert (shapes.num_heads, shapes.num_kv_heads, shapes.num_kv_head_replicas) == (3, 1, 1)
    assert (shapes.intermediate_size, shapes.vocab_size_padded) == (512, 49152)
    with pytest.raises(ValueError) as excinfo:
        sharding.check_tensor_parallel_size(smollm2, 2)
    message = str(excinfo.value)
    # upstream's facts: the total number of attention heads, the size, divisibility
    assert "attention heads (9)" in message
    assert "tensor_parallel_size (2)" in message and "not divisible" in message
    assert "1, 3, 9" in message  # and what would work


@pytest.mark.parametrize(
    ("heads", "kv", "tp", "fragment"),
    [
        (12, 4, 6, "not a multiple"),  # replicating 4 KV heads over 6 ranks: uneven
        (24, 8, 3, "KV heads are not divisible"),  # splitting 8 KV heads 3 ways
        (8, 8, 0, "positive integer"),
    ],
)
def test_uneven_kv_heads_are_refused(heads: int, kv: int, tp: int, fragment: str) -> None:
    with pytest.raises(ValueError, match=fragment):
        sharding.check_tensor_parallel_size(_config(heads, kv), tp)


def test_mlp_and_vocabulary_must_divide() -> None:
    with pytest.raises(ValueError, match="intermediate_size=60"):
        sharding.check_tensor_parallel_size(_config(8, 8, inter=60), 8)
    # 100 is padded to 128: fine for 4 ranks (32 rows each), not for 6 heads' 6 ranks
    assert sharding.check_tensor_parallel_size(_config(4, 4, vocab=100), 4).vocab_size_padded == 128
    with pytest.raises(ValueError, match="vocabulary"):
        sharding.check_tensor_parallel_size(_config(6, 6, inter=60, vocab=100), 6)


def test_vocab_ranges_and_padding() -> None:
    assert sharding.pad_vocab_size(250) == 256 and sharding.pad_vocab_size(256) == 256
    assert [sharding.vocab_range(250, r, 4) for r in range(4)] == [
        (0, 64), (64, 128), (128, 192), (192, 256),
    ]  # fmt: skip
    with pytest.raises(ValueError, match="rank 4"):
        sharding.vocab_range(250, 4, 4)


def test_shard_tensor_is_a_view_of_rows_or_columns() -> None:
    w = torch.arange(24.0).reshape(4, 6)
    rows = sharding.shard_tensor(w, 0, 1, 2)
    cols = sharding.shard_tensor(w, 1, 2, 3)
    assert torch.equal(rows, w[2:4]) and torch.equal(cols, w[:, 4:6])
    assert rows.data_ptr() == w[2].data_ptr()  # no copy


# ---------------------------------------------------------------- the layers' shards


@pytest.fixture(scope="module")
def full_weights() -> dict[str, torch.Tensor]:
    hf = tiny_tp_model()  # random biases: a bias added on the wrong ranks must show
    return {k: v.detach().clone() for k, v in hf.state_dict().items()}


def _build(weights: dict[str, torch.Tensor], rank: int = 0, tp: int = 1) -> LlamaForCausalLM:
    with model_parallel_state(rank, tp):
        assert get_tensor_model_parallel_rank() == rank
        assert get_tensor_model_parallel_world_size() == tp
        model = LlamaForCausalLM(tiny_tp_config())
        model.load_weights(weights.items())
    return model


@pytest.mark.parametrize("tp", [2, 4])
def test_shards_concatenate_back_to_the_full_weights(full_weights, tp: int) -> None:
    full = _build(full_weights)
    shards = [_build(full_weights, r, tp) for r in range(tp)]
    cfg = tiny_tp_config()
    head_dim = cfg.hidden_size // cfg.num_attention_heads
    q_size, kv_size = cfg.num_attention_heads * head_dim, cfg.num_key_value_heads * head_dim
    replicas = sharding.num_kv_head_replicas(cfg.num_key_value_heads, tp)

    for i in range(cfg.num_hidden_layers):
        f_attn = full.model.layers[i].self_attn
        attns = [s.model.layers[i].self_attn for s in shards]
        for name in ("weight", "bias"):
            f_q, f_k, f_v = getattr(f_attn.qkv_proj, name).split([q_size, kv_size, kv_size])
            parts = [
                getattr(a.qkv_proj, name).split([a.q_size, a.kv_size, a.kv_size]) for a in attns
            ]
            # query heads: split, concatenated in rank order
            assert torch.equal(torch.cat([p[0] for p in parts]), f_q)
            # KV heads: split, or replicated on `replicas` consecutive ranks
            for kv_index, f_part in ((1, f_k), (2, f_v)):
                distinct = [parts[r][kv_index] for r in range(0, tp, replicas)]
                assert torch.equal(torch.cat(distinct), f_part)
                for r in range(tp):
                    assert torch.equal(parts[r][kv_index], distinct[r // replicas])
        # o_proj: split by input columns; its bias is whole on every rank
        o_weights = [a.o_proj.weight for a in attns]
        assert torch.equal(torch.cat(o_weights, dim=1), f_attn.o_proj.weight)
        assert all(torch.equal(a.o_proj.bias, f_attn.o_proj.bias) for a in attns)

        f_mlp = full.model.layers[i].mlp
        mlps = [s.model.layers[i].mlp for s in shards]
        f_gate, f_up = f_mlp.gate_up_proj.weight.chunk(2)
        # each rank holds [gate_r; up_r], so that SiluAndMul's halves stay gate and up
        assert torch.equal(torch.cat([m.gate_up_proj.weight.chunk(2)[0] for m in mlps]), f_gate)
        assert torch.equal(torch.cat([m.gate_up_proj.weight.chunk(2)[1] for m in mlps]), f_up)
        down = torch.cat([m.down_proj.weight for m in mlps], dim=1)
        assert torch.equal(down, f_mlp.down_proj.weight)
        norm = full.model.layers[i].input_layernorm.weight
        for s in shards:  # norms are replicated
            assert torch.equal(s.model.layers[i].input_layernorm.weight, norm)

    vocab = cfg.vocab_size
    for layer_name in ("model.embed_tokens", "lm_head"):
        f_w = full.get_submodule(layer_name).weight
        assert f_w.shape == (vocab, cfg.hidden_size)  # one rank: no padding
        rows = torch.cat([s.get_submodule(layer_name).weight for s in shards])
        assert rows.shape[0] == sharding.pad_vocab_size(vocab)
        assert torch.equal(rows[:vocab], f_w)
        assert not rows[vocab:].any()  # padding rows are zeros


def test_tp1_layers_are_plain_linear_shapes(full_weights) -> None:
    model = _build(full_weights)
    attn = model.model.layers[0].self_attn
    assert isinstance(attn.qkv_proj, torch.nn.Linear) and isinstance(attn.o_proj, torch.nn.Linear)
    assert attn.qkv_proj.weight.shape == (64 + 2 * 16, 64)
    assert (attn.num_heads, attn.num_kv_heads) == (8, 2)


def test_a_shard_cannot_run_without_a_process_group(full_weights) -> None:
    with model_parallel_state(1, 2):
        model = LlamaForCausalLM(tiny_tp_config())
        with pytest.raises(RuntimeError, match="without a process group"):
            model(torch.tensor([1, 2]), torch.tensor([0, 1]))


def test_a_shard_run_outside_its_group_is_refused(full_weights) -> None:
    """Outside its group a shard would skip its collectives and silently compute a fraction."""
    with model_parallel_state(0, 2):
        model = LlamaForCausalLM(tiny_tp_config())
    with pytest.raises(RuntimeError, match="built for 2 tensor-parallel ranks"):
        model(torch.tensor([1, 2]), torch.tensor([0, 1]))
