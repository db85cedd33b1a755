"""KV cache sizing per rank: bytes per block per rank, the block count every rank agrees on,
and the worked numbers of phases/07-tensor-parallel/README.md (checked here, so the guide
cannot drift from the formulas)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mini_vllm.distributed import sharding
from mini_vllm.executor.multiproc_executor import MultiprocExecutor
from mini_vllm.worker import kv_sizing

GiB, KiB = 2**30, 2**10


@pytest.mark.parametrize(("tp", "block_kib"), [(1, 720), (3, 240)])
def test_smollm2_block_bytes_per_rank_float32(tp: int, block_kib: int) -> None:
    assert kv_sizing.bytes_per_block_per_rank(16, 30, 3, 64, "float32", tp) == block_kib * KiB


def test_smollm2_cannot_replicate_its_kv_heads() -> None:
    """TP=9 would replicate SmolLM2's 3 KV heads, but its MLP (1,536) and its vocabulary
    (49,152) do not divide by 9: the guide's replication example is Llama-3-8B at TP=16."""
    smollm2 = SimpleNamespace(
        num_attention_heads=9, num_key_value_heads=3, intermediate_size=1536, vocab_size=49152
    )
    accepted = []
    for tp in range(1, 17):
        try:
            sharding.check_tensor_parallel_size(smollm2, tp)
            accepted.append(tp)
        except ValueError:
            pass
    assert accepted == [1, 3]
    with pytest.raises(ValueError, match="MLP width"):
        sharding.check_tensor_parallel_size(smollm2, 9)


def test_one_rank_is_the_single_process_formula() -> None:
    assert kv_sizing.bytes_per_block_per_rank(16, 32, 8, 128, 2, 1) == kv_sizing.bytes_per_block(
        16, 32, 8, 128, 2
    )


def test_every_rank_gets_the_smallest_block_count() -> None:
    assert kv_sizing.num_gpu_blocks_across_ranks([900, 850, 1000]) == 850
    with pytest.raises(ValueError, match="no rank"):
        kv_sizing.num_gpu_blocks_across_ranks([])
    with pytest.raises(ValueError, match="tensor_parallel_size must be positive"):
        kv_sizing.bytes_per_block_per_rank(16, 2, 2, 8, 4, 0)


def test_the_executor_sizes_every_rank_by_the_tightest(monkeypatch) -> None:
    """Ranks measure different budgets (another process on one GPU): all get the minimum."""
    executor = object.__new__(MultiprocExecutor)  # no processes: only the arithmetic
    executor.kv_cache_block_bytes = 1000
    executor.execute_timeout_s = 1.0
    monkeypatch.setattr(
        executor, "collective_rpc", lambda *a, **k: [10_500, 7_999, 12_000], raising=False
    )
    budget = executor.determine_available_memory(0.9, None)
    assert kv_sizing.num_gpu_blocks_from_budget(budget, 1000) == 7


def _concurrency(params: int, layers: int, kv: int, head_dim: int, other: int, tp: int):
    """The guide's model: an 80 GiB GPU at 0.9, bf16 weights split evenly, ``other`` bytes of
    activations and runtime per rank, 8192-token requests."""
    block = kv_sizing.bytes_per_block_per_rank(16, layers, kv, head_dim, "bfloat16", tp)
    budget = kv_sizing.available_kv_cache_memory(80 * GiB, 0.9, params * 2 // tp + other)
    blocks = kv_sizing.num_gpu_blocks_from_budget(budget, block)
    return block // KiB, blocks, round(kv_sizing.max_concurrency(blocks, 16, 8192), 1)


@pytest.mark.parametrize(
    ("tp", "expected"),
    [
        (1, (2048, 28181, 55.0)),
        (2, (1024, 64021, 125.0)),
        (8, (256, 279061, 545.0)),
        (16, (256, 282890, 552.5)),  # KV heads replicated: the block stops shrinking
    ],
)
def test_guide_numbers_llama3_8b(tp: int, expected: tuple[int, int, float]) -> None:
    assert _concurrency(8_030_261_248, 32, 8, 128, 2 * GiB, tp) == expected


@pytest.mark.parametrize(
    ("tp", "expected"),
    [(1, (360, 206072, 402.5)), (3, (120, 619677, 1210.3))],  # TP=9 is refused (see above)
)
def test_guide_numbers_smollm2(tp: int, expected: tuple[int, int, float]) -> None:
    assert _concurrency(134_515_008, 30, 3, 64, 1 * GiB, tp) == expected


@given(kv=st.integers(1, 64), tp=st.integers(1, 64))
def test_kv_sizing_uses_the_sharding_rule(kv: int, tp: int) -> None:
    heads = sharding.num_kv_heads_per_rank(kv, tp)
    assert kv_sizing.bytes_per_block_per_rank(16, 2, kv, 8, 2, tp) == 16 * 2 * 2 * heads * 8 * 2
