"""lab-03, part 2: the running engine agrees with your formulas.

mini-vLLM's engine (the reference, ``mini_vllm/engine/llm_engine.py``) sizes its KV cache at
startup. These tests start it on a tiny random Llama and compare what it decided with what your
functions predict: on a CPU from an explicit ``kv_cache_memory_bytes`` budget (or the CPU
default), and on a GPU from ``gpu_memory_utilization`` and the memory it measured.

The engine is the judge's (the reference, trusted): it runs here, in the judge. The learner's
formulas run in the learner process, which cannot see the judge's checkpoint folder: it gets the
checkpoint's ``config.json`` as data and loads it with transformers there
(``learner_side.hf_config``), so ``kv_cache_dims`` reads the same kind of config the engine
read. What the formulas return comes back as plain data and must be whole numbers before the
engine is asked anything.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from grading.suite import graded, learner_module, load_impl
from tests.labs.lab_03.values import dims_of, whole

DOC = "labs/lab-03-kv-cache-sizing/README.md"
BLOCK_SIZE = 16
MAX_MODEL_LEN = 128


def kv():
    return load_impl("kv_sizing")


def hf_config(path: Path) -> Any:
    """The checkpoint's transformers config, loaded in the learner process from the
    ``config.json`` the judge reads here (plain data)."""
    fields = json.loads((path / "config.json").read_text())
    return learner_module("learner_side").hf_config(fields)


def your_block_bytes(m: Any, path: Path, dtype: str) -> int:
    """bytes_per_block of the checkpoint by the learner's formulas, checked to be an int."""
    size = whole(m.dtype_size(dtype), f"dtype_size({dtype!r})")  # before loading a config
    layers, kv_heads, head_dim = dims_of(
        m.kv_cache_dims(hf_config(path)), "the tiny checkpoint's config"
    )
    return whole(m.bytes_per_block(BLOCK_SIZE, layers, kv_heads, head_dim, size), "bytes_per_block")


#: The largest KV cache budget a test hands the tiny model's engine (its real cache is a few
#: hundred kilobytes): budgets are made of the learner's numbers, and the judge's engine
#: allocates and zeroes what they say.
MAX_BUDGET = 64 * 1024**2


def start_engine(path: Path, **kwargs: Any) -> Any:
    from mini_vllm.llm import LLM

    kwargs.setdefault("device", "cpu")
    budget = kwargs.get("kv_cache_memory_bytes")
    if budget is not None and budget > MAX_BUDGET:
        raise AssertionError(
            f"your formulas give this 2-layer model a KV cache budget of {budget:,} bytes; its "
            "blocks are 12,288 bytes (2 layers, 2 KV heads, head_dim 24, float32, 16 tokens) "
            "and its whole cache a few hundred kilobytes: check bytes_per_block and "
            "min_num_gpu_blocks"
        )
    return LLM(
        str(path),
        skip_tokenizer_init=True,
        block_size=BLOCK_SIZE,
        max_model_len=MAX_MODEL_LEN,
        **kwargs,
    )


@graded(
    4,
    "the engine cuts an explicit kv_cache_memory_bytes budget into "
    "budget // bytes_per_block blocks of the model's real shape (float32 on CPU)",
    f"{DOC}#the-engine-agrees",
)
def test_cpu_engine_block_count_matches_your_formula(tiny_checkpoint: Path):
    """A budget of 40.5 blocks and change: the engine allocates what your formula says."""
    m = kv()
    block = your_block_bytes(m, tiny_checkpoint, "float32")
    budget = 40 * block + block // 2 + 123
    engine = start_engine(tiny_checkpoint, kv_cache_memory_bytes=budget).llm_engine
    expected = whole(m.num_gpu_blocks_from_budget(budget, block), "num_gpu_blocks_from_budget")
    runner = engine.model_runner
    assert runner.kv_cache_block_bytes == block, (
        f"the engine's blocks are {runner.kv_cache_block_bytes:,} bytes; your formula gives "
        f"{block:,} (2 layers, 2 KV heads, head_dim 24 from the config, float32)"
    )
    assert engine.num_gpu_blocks == expected, (
        f"with a {budget:,}-byte budget the engine allocated {engine.num_gpu_blocks} blocks; "
        f"your num_gpu_blocks_from_budget says {expected}"
    )
    cache = runner.kv_cache
    assert cache.numel() * cache.element_size() == expected * block, (
        "the KV cache tensor should be exactly num_gpu_blocks x bytes_per_block"
    )
    free = engine.kv_cache_manager.block_pool.get_num_free_blocks()
    assert free == expected - 1, (
        f"{expected} blocks leave {expected - 1} for requests (block 0 is the null block), "
        f"the pool has {free} free"
    )


@graded(
    4,
    "the null block: the engine starts only if the cache holds min_num_gpu_blocks("
    "max_model_len, block_size) blocks, one full-length request plus block 0",
    f"{DOC}#the-null-block",
)
def test_engine_refuses_one_block_short_of_your_minimum(tiny_checkpoint: Path):
    """At exactly your minimum the engine starts and finishes a full-length request; one byte
    less and it refuses to start."""
    from mini_vllm.sampling_params import SamplingParams

    m = kv()
    block = your_block_bytes(m, tiny_checkpoint, "float32")
    minimum = whole(m.min_num_gpu_blocks(MAX_MODEL_LEN, BLOCK_SIZE), "min_num_gpu_blocks")
    with pytest.raises(ValueError, match="too small"):
        start_engine(tiny_checkpoint, kv_cache_memory_bytes=minimum * block - 1)
    llm = start_engine(tiny_checkpoint, kv_cache_memory_bytes=minimum * block)
    got = llm.llm_engine.num_gpu_blocks
    assert got == minimum, (
        f"a budget of exactly min_num_gpu_blocks ({minimum}) blocks gives {got} blocks"
    )
    prompt = list(range(1, MAX_MODEL_LEN - 8))
    out = llm.generate(
        {"prompt_token_ids": prompt},
        SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True),
        use_tqdm=False,
    )[0]
    assert len(out.outputs[0].token_ids) == 8, "a max_model_len request must complete"
    assert llm.get_stats().num_preemptions == 0, (
        "your minimum holds one full-length request: it must never be preempted"
    )


@graded(
    3,
    "without a budget on CPU the engine sizes the cache for max_num_seqs full-length "
    "requests plus the null block (min_num_gpu_blocks with num_requests)",
    f"{DOC}#the-null-block",
)
def test_cpu_default_budget_is_your_minimum_for_max_num_seqs(tiny_checkpoint: Path):
    """max_num_seqs = 3 requests of 128 tokens in 16-token blocks: 3 x 8 + 1 blocks."""
    m = kv()
    engine = start_engine(tiny_checkpoint, max_num_seqs=3).llm_engine
    expected = whole(m.min_num_gpu_blocks(MAX_MODEL_LEN, BLOCK_SIZE, 3), "min_num_gpu_blocks")
    assert engine.num_gpu_blocks == expected, (
        f"the engine allocated {engine.num_gpu_blocks} blocks for 3 requests of "
        f"{MAX_MODEL_LEN} tokens; your min_num_gpu_blocks(128, 16, 3) says {expected}"
    )


@graded(
    4,
    "on a GPU the budget is ceil(total x gpu_memory_utilization) - the profiled peak, "
    "then floor to blocks of the bf16 cache",
    f"{DOC}#the-engine-agrees",
    gpu=True,
)
def test_gpu_engine_block_count_matches_your_formula(
    tiny_checkpoint: Path, monkeypatch: pytest.MonkeyPatch
):
    """Read the block count off an engine started on the GPU, and predict it from the memory
    figures it measured."""
    import torch

    from mini_vllm.worker import kv_sizing as reference

    m = kv()
    measured: list[tuple[int, float, int]] = []
    original = reference.available_kv_cache_memory

    def spy(total: int, utilization: float, non_kv: int) -> int:
        measured.append((total, utilization, non_kv))
        return original(total, utilization, non_kv)

    monkeypatch.setattr(reference, "available_kv_cache_memory", spy)
    free, total = torch.cuda.mem_get_info()
    # Ask for what is already in use plus about 1 GiB, so that the test allocates little
    # and works on a shared GPU.
    utilization = min(0.95, round((total - free + 2**30) / total + 0.005, 2))
    engine = start_engine(
        tiny_checkpoint, device="cuda", gpu_memory_utilization=utilization, enforce_eager=True
    ).llm_engine
    assert measured, "the engine did not compute a GPU budget"
    seen_total, seen_util, non_kv = measured[-1]
    assert seen_total == total and seen_util == utilization, (
        f"the engine measured total {seen_total} at utilization {seen_util}; torch says "
        f"{total} and the engine was started at {utilization}"
    )
    dtype = str(engine.dtype)  # "torch.bfloat16"
    block = your_block_bytes(m, tiny_checkpoint, dtype)
    budget = whole(
        m.available_kv_cache_memory(seen_total, seen_util, non_kv), "available_kv_cache_memory"
    )
    expected = whole(m.num_gpu_blocks_from_budget(budget, block), "num_gpu_blocks_from_budget")
    assert engine.num_gpu_blocks == expected, (
        f"on {total / 2**30:.1f} GiB x {utilization} with a measured non-KV peak of "
        f"{non_kv / 2**20:.0f} MiB the engine allocated {engine.num_gpu_blocks} blocks of "
        f"{engine.model_runner.kv_cache_block_bytes:,} B; your formulas give {expected} blocks "
        f"of {block:,} B from a {budget:,}-byte budget"
    )
