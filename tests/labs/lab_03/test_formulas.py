"""lab-03, part 1: the sizing formulas, on the published configs of real models.

Standard library only: these tests run on any laptop, with no torch. Every expected number is
written out (and worked in the lab's README), never computed by calling the reference.

The learner's functions run in the learner process: a config is built there
(``learner_side.config``) from fields the test writes out, and every result comes back as plain
data, checked here for its value and, where the engine depends on it, its type: byte and block
counts are whole numbers (a ``float`` cannot size a tensor), the budget a plain ``int``.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from grading.suite import graded, learner_module, load_impl
from tests.labs.common import assert_value_error, describe
from tests.labs.lab_03.values import dims_of, whole

DOC = "labs/lab-03-kv-cache-sizing/README.md"
KiB, MiB, GiB = 2**10, 2**20, 2**30


def drawn(test: str, n: int = 25) -> Iterator[Callable[[int, int], int]]:
    """``n`` draws for the random cases of ``test``: sizes of every scale, from the rules alone.

    Seeded by the test's name, so every run grades the same numbers: the fixed cases teach,
    these make a table of the fixed cases' answers worth nothing."""
    rng = random.Random(f"lab-03 {test}")
    for _ in range(n):
        yield rng.randint


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def kv():
    return load_impl("kv_sizing")


def config(
    layers: int, hidden: int, heads: int, kv_heads: int | None = None, head_dim: int | None = None
) -> dict[str, int]:
    """A config's fields as transformers spells them; omitted ones stay absent, as in older
    files. :func:`learner_config` builds the object the learner's code reads."""
    fields = dict(num_hidden_layers=layers, hidden_size=hidden, num_attention_heads=heads)
    if kv_heads is not None:
        fields["num_key_value_heads"] = kv_heads
    if head_dim is not None:
        fields["head_dim"] = head_dim
    return fields


def learner_config(fields: dict[str, int]) -> Any:
    """A config object with exactly these attributes, built in the learner process."""
    return learner_module("learner_side").config(**fields)


# Published configs (config.json of each checkpoint).
MODELS = {
    # name: (config, dtype, expected (layers, kv_heads, head_dim), expected bytes per token)
    "Llama-2-7B (fp16, MHA, no num_key_value_heads)": (
        config(32, 4096, 32),
        "float16",
        (32, 32, 128),
        512 * KiB,
    ),
    "Llama-3-8B (bf16, GQA 32/8)": (config(32, 4096, 32, 8), "bfloat16", (32, 8, 128), 128 * KiB),
    "Llama-3-8B (fp8 cache)": (config(32, 4096, 32, 8), "fp8", (32, 8, 128), 64 * KiB),
    "Llama-3-70B (bf16, GQA 64/8)": (config(80, 8192, 64, 8), "bfloat16", (80, 8, 128), 320 * KiB),
    "Qwen2.5-7B (bf16, GQA 28/4)": (config(28, 3584, 28, 4), "bfloat16", (28, 4, 128), 56 * KiB),
    "Gemma-7B (bf16, head_dim 256 != 3072/16)": (
        config(28, 3072, 16, 16, head_dim=256),
        "bfloat16",
        (28, 16, 256),
        448 * KiB,
    ),
    "Llama-3.2-1B (bf16, head_dim 64)": (
        config(16, 2048, 32, 8, head_dim=64),
        "bfloat16",
        (16, 8, 64),
        32 * KiB,
    ),
    "SmolLM2-135M (fp32, as on our CPU)": (config(30, 576, 9, 3), "float32", (30, 3, 64), 46_080),
    "SmolLM2-135M (bf16, as on a GPU)": (
        config(30, 576, 9, 3),
        "torch.bfloat16",
        (30, 3, 64),
        23_040,
    ),
}


@graded(
    2,
    "dtype_size: 4 bytes for float32, 2 for float16/bfloat16, 1 for fp8; accept "
    "'torch.'-prefixed names and plain ints; ValueError for an unknown name",
    f"{DOC}#bytes-per-token",
)
def test_dtype_size():
    """Element sizes of the cache dtypes, by name or as an int."""
    m = kv()
    cases = {
        "float32": 4,
        "float": 4,
        "float16": 2,
        "bfloat16": 2,
        "half": 2,
        "fp8": 1,
        "float8_e4m3fn": 1,
        "float8_e5m2": 1,
        "torch.float16": 2,
        "torch.bfloat16": 2,
        "torch.float32": 4,
        "torch.float": 4,
        "torch.half": 2,
        "torch.float8_e5m2": 1,
        2: 2,
        4: 4,
    }
    for dtype, size in cases.items():
        got = whole(m.dtype_size(dtype), f"dtype_size({dtype!r})")
        assert got == size, f"dtype_size({dtype!r}) should be {size} bytes, got {got}"
    for unknown in ("int3", "int8", "torch.int32", "float8_e4m3fnuz", "float64"):
        assert_value_error(
            f"dtype_size({unknown!r}) (no cache dtype of DTYPE_SIZES has that name: look the "
            "name up in the table, do not guess a size from the digits in it)",
            lambda unknown=unknown: m.dtype_size(unknown),
        )
    assert_value_error(
        "dtype_size('auto') ('auto', upstream's default kv_cache_dtype, stands for the model's "
        "own dtype, which dtype_size is not told: it is no name of DTYPE_SIZES, and no size)",
        lambda: m.dtype_size("auto"),
    )


@graded(
    4,
    "kv_cache_dims: the cache has one K and one V per *KV* head (num_key_value_heads, "
    "which defaults to num_attention_heads when absent or null); head_dim is the config's "
    "own when it has one (not null)",
    f"{DOC}#bytes-per-token",
)
def test_kv_cache_dims_reads_real_configs():
    """(layers, KV heads, head_dim) of MHA, GQA and explicit-head_dim configs."""
    m = kv()
    for name, (cfg, _, dims, _) in MODELS.items():
        got = dims_of(m.kv_cache_dims(learner_config(cfg)), name)
        assert got == dims, f"{name}: kv_cache_dims should be {dims}, got {got}"
    # A config.json may spell a field it does not set as null: the default applies, as if the
    # field were absent.
    for name, cfg, dims in (
        (
            "Llama-2-7B with num_key_value_heads: null (MHA)",
            {**config(32, 4096, 32), "num_key_value_heads": None},
            (32, 32, 128),
        ),
        (
            "Llama-3-8B with head_dim: null (hidden_size / heads)",
            {**config(32, 4096, 32, 8), "head_dim": None},
            (32, 8, 128),
        ),
        (
            "a config of hidden_size 200 and 3 heads (hidden_size // heads, floored, as HF)",
            config(2, 200, 3),
            (2, 3, 66),
        ),
    ):
        got = dims_of(m.kv_cache_dims(learner_config(cfg)), name)
        assert got == dims, f"{name}: kv_cache_dims should be {dims}, got {got}"


@graded(
    6,
    "bytes_per_token = 2 (K and V) x layers x KV heads x head_dim x dtype bytes; query "
    "heads do not appear",
    f"{DOC}#bytes-per-token",
)
def test_bytes_per_token_of_real_models():
    """Llama-2-7B is 512 KiB a token in fp16; GQA and small dtypes shrink it."""
    m = kv()
    for name, (_, dtype, (layers, kv_heads, head_dim), expected) in MODELS.items():
        got = whole(
            m.bytes_per_token(
                layers, kv_heads, head_dim, whole(m.dtype_size(dtype), f"dtype_size({dtype!r})")
            ),
            f"{name}: bytes_per_token",
        )
        assert got == expected, (
            f"{name}: {layers} layers x {kv_heads} KV heads x head_dim {head_dim} in {dtype} "
            f"should take {expected:,} bytes per token, got {got:,}"
        )
    for draw in drawn("bytes_per_token"):
        args = (draw(1, 128), draw(1, 64), draw(1, 512), draw(1, 8))
        got = whole(m.bytes_per_token(*args), f"bytes_per_token{args}")
        assert got == 2 * args[0] * args[1] * args[2] * args[3], (
            f"bytes_per_token{args} should be 2 x {' x '.join(map(str, args))} = "
            f"{2 * args[0] * args[1] * args[2] * args[3]:,}, got {got:,}"
        )
    # A dtype given by name works too.
    assert m.bytes_per_token(32, 32, 128, "float16") == 512 * KiB, (
        "bytes_per_token(32, 32, 128, 'float16') should be 524,288 bytes (Llama-2-7B)"
    )
    # ... in every spelling dtype_size accepts: the engine hands it str(torch.bfloat16).
    got = whole(m.bytes_per_token(32, 8, 128, "torch.bfloat16"), "bytes_per_token(...)")
    assert got == 128 * KiB, (
        "bytes_per_token(32, 8, 128, 'torch.bfloat16') should be 131,072 bytes (Llama-3-8B): a "
        f"dtype given by name is sized by dtype_size, 'torch.' prefix included, got {got:,}"
    )


@graded(
    3,
    "bytes_per_block = block_size x bytes_per_token, all layers included: one block id "
    "names the same slots in every layer",
    f"{DOC}#bytes-per-block",
)
def test_bytes_per_block():
    """A 16-token block of Llama-2-7B is 8 MiB; of SmolLM2 in fp32, 720 KiB."""
    m = kv()
    cases = [
        ((16, 32, 32, 128, 2), 8 * MiB, "Llama-2-7B fp16, block 16"),
        ((16, 32, 8, 128, 2), 2 * MiB, "Llama-3-8B bf16, block 16"),
        ((16, 30, 3, 64, 4), 737_280, "SmolLM2-135M fp32, block 16"),
        ((32, 30, 3, 64, 2), 737_280, "SmolLM2-135M bf16, block 32"),
        ((1, 2, 2, 16, 4), 512, "a tiny model, block 1"),
    ]
    for args, expected, name in cases:
        got = whole(m.bytes_per_block(*args), f"bytes_per_block{args}")
        assert got == expected, f"{name}: bytes_per_block{args} should be {expected:,}, got {got:,}"
    for draw in drawn("bytes_per_block"):
        args = (draw(1, 256), draw(1, 128), draw(1, 64), draw(1, 512), draw(1, 8))
        want = args[0] * 2 * args[1] * args[2] * args[3] * args[4]
        got = whole(m.bytes_per_block(*args), f"bytes_per_block{args}")
        assert got == want, f"bytes_per_block{args} should be {want:,}, got {got:,}"
    # A dtype given by name works too, as for bytes_per_token: block_size x bytes_per_token.
    got = whole(m.bytes_per_block(16, 32, 32, 128, "float16"), "bytes_per_block(..., 'float16')")
    assert got == 8 * MiB, (
        f"bytes_per_block(16, 32, 32, 128, 'float16') should be 8,388,608 bytes (Llama-2-7B, "
        f"a dtype given by name is sized by dtype_size), got {got:,}"
    )


@graded(
    4,
    "the budget is ceil(total x gpu_memory_utilization) minus the measured non-KV peak "
    "(weights + activations): utilization applies to the device's TOTAL memory, before "
    "anything is subtracted",
    f"{DOC}#the-memory-budget",
)
def test_available_kv_cache_memory():
    """80 GiB x 0.9 - 14 GiB = 58 GiB for Llama-2-7B; a model that does not fit gives < 0."""
    m = kv()
    got = m.available_kv_cache_memory(80 * GiB, 0.9, 14 * GiB)
    assert got == 58 * GiB, (
        f"80 GiB x 0.9 - 14 GiB should be 58 GiB = {58 * GiB:,} bytes, got {got:,} bytes (the "
        "share is the float product math.ceil(total * utilization), as upstream computes it)"
    )
    got = m.available_kv_cache_memory(80 * GiB, 0.5, 10 * GiB)
    assert got == 30 * GiB, (
        f"80 GiB x 0.5 - 10 GiB should be 30 GiB, got {got / GiB:.4f} GiB (is the utilization "
        "applied after subtracting the model? It is a share of the whole device)"
    )
    got = m.available_kv_cache_memory(80 * GiB, 0.1, 10 * GiB)
    assert got == 8 * GiB - 10 * GiB, (
        f"80 GiB x 0.1 - 10 GiB should be -2 GiB (the model does not fit the share), got {got}"
    )
    got = m.available_kv_cache_memory(1000, 1.0, 0)
    assert got == 1000, f"all of 1,000 bytes with nothing else loaded is 1,000, got {got}"


@graded(
    1,
    "upstream rounds the requested share UP to a whole byte (request_memory uses "
    "math.ceil of the float product total x utilization, noise included); the result is an int",
    f"{DOC}#the-memory-budget",
)
def test_available_kv_cache_memory_rounds_up():
    """ceil(1,000,000,001 x 0.5) = 500,000,001 bytes."""
    m = kv()
    got = m.available_kv_cache_memory(10**9 + 1, 0.5, 1)
    assert type(got) is int, (
        f"the budget is a whole number of bytes, a plain int, got {describe(got)}"
    )
    assert got == 500_000_000, f"ceil(1,000,000,001 x 0.5) - 1 should be 500,000,000, got {got}"
    got = m.available_kv_cache_memory(10**9 + 1, 0.25, 0)
    assert got == 250_000_001, (
        f"ceil(1,000,000,001 x 0.25) = ceil(250,000,000.25) should be 250,000,001 (rounded UP, "
        f"not to the nearest byte), got {got}"
    )
    got = m.available_kv_cache_memory(1000, 0.875, 0)
    assert got == 875, (
        f"ceil(1,000 x 0.875) should be 875 (use the utilization as given, not rounded to a "
        f"whole percent), got {got}"
    )
    got = m.available_kv_cache_memory(1001, 1.0, 0)
    assert got == 1001, (
        f"ceil(1,001 x 1.0) should be 1,001 (a whole number is not rounded up again; "
        f"round(x + 0.5) rounds 1,001.5 to the even 1,002), got {got}"
    )
    # The float product, noise included: 3e9 x 0.55 is 1,650,000,000.0000002 as a float, so
    # upstream requests one byte more than the exact decimal product.
    got = m.available_kv_cache_memory(3 * 10**9, 0.55, 0)
    assert got == 1_650_000_001, (
        f"math.ceil(3,000,000,000 * 0.55) should be 1,650,000,001: the float product is "
        f"1,650,000,000.0000002 and upstream's request_memory takes its ceiling as it is; got "
        f"{got:,} (an exact decimal 0.55, or the float's noise rounded off before the ceiling, "
        "gives 1,650,000,000: see 'The memory budget', the product is a float)"
    )


@graded(
    1,
    "gpu_memory_utilization must be in (0, 1]: ValueError otherwise; any number inside, "
    "the int 1 included, is valid",
    f"{DOC}#the-memory-budget",
)
def test_available_kv_cache_memory_rejects_bad_utilization():
    """0, negative and > 1 utilizations are refused."""
    m = kv()
    for bad in (0.0, -0.5, 1.5):
        with pytest.raises(ValueError):
            m.available_kv_cache_memory(80 * GiB, bad, 0)
    # The control: the edge of the range is valid, written as an int too (upstream's config
    # takes gpu_memory_utilization=1, and mini-vLLM's LLM hands it over as given).
    for edge in (1.0, 1):
        try:
            got = m.available_kv_cache_memory(1000, edge, 0)
        except ValueError as exc:
            raise AssertionError(
                f"available_kv_cache_memory(1000, {edge!r}, 0) raised ValueError ({exc}): "
                f"{edge!r} is inside (0, 1], a valid utilization whatever its type (check the "
                "range, not isinstance(..., float): see 'The memory budget')"
            ) from None
        assert got == 1000, (
            f"available_kv_cache_memory(1000, {edge!r}, 0) is all 1,000 bytes, got {got!r}"
        )


@graded(
    4,
    "num_gpu_blocks = budget // bytes_per_block: whole blocks only (floor, never ceil: "
    "a partial block would overrun the budget), and 0 for a negative budget",
    f"{DOC}#blocks-from-the-budget",
)
def test_num_gpu_blocks_from_budget_floors():
    """58 GiB of 8 MiB blocks is 7,424; one byte short of a block does not make a block."""
    m = kv()
    cases = [
        ((58 * GiB, 8 * MiB), 7424, "58 GiB of Llama-2-7B blocks"),
        ((512 * MiB, 737_280), 728, "SmolLM2 fp32: the 512 MiB CPU default"),
        ((10 * 1000 + 999, 1000), 10, "10,999 bytes of 1,000-byte blocks"),
        ((999, 1000), 0, "less than one block"),
        ((1000, 1000), 1, "exactly one block"),
        ((-5 * GiB, 1000), 0, "a negative budget (the model does not fit)"),
    ]
    for args, expected, name in cases:
        got = whole(m.num_gpu_blocks_from_budget(*args), f"num_gpu_blocks_from_budget{args}")
        assert got == expected, (
            f"{name}: num_gpu_blocks_from_budget{args} should be {expected}, got {got}"
        )
    for draw in drawn("num_gpu_blocks_from_budget"):
        block = draw(1, 64 * MiB)
        args = (draw(-GiB, 200 * GiB), block)
        want = max(0, args[0] // block)
        got = whole(m.num_gpu_blocks_from_budget(*args), f"num_gpu_blocks_from_budget{args}")
        assert got == want, f"num_gpu_blocks_from_budget{args} should be {want}, got {got}"


@graded(
    3,
    "blocks_per_request = ceil(num_tokens / block_size): the last block may be partly "
    "empty, but it is a whole block",
    f"{DOC}#blocks-from-the-budget",
)
def test_blocks_per_request_ceils():
    """17 tokens in 16-token blocks take 2 blocks; 16 take 1; none take none."""
    m = kv()
    for tokens, bs, expected in [
        (17, 16, 2),
        (16, 16, 1),
        (1, 16, 1),
        (4096, 16, 256),
        (8192, 16, 512),
        (100, 7, 15),
        (5, 1, 5),
        (0, 16, 0),
    ]:
        got = whole(m.blocks_per_request(tokens, bs), f"blocks_per_request({tokens}, {bs})")
        assert got == expected, (
            f"blocks_per_request({tokens}, {bs}) should be {expected}, got {got}"
        )
    for draw in drawn("blocks_per_request"):
        tokens, bs = draw(0, 2**20), draw(1, 256)
        got = whole(m.blocks_per_request(tokens, bs), f"blocks_per_request({tokens}, {bs})")
        assert got == cdiv(tokens, bs), (
            f"blocks_per_request({tokens}, {bs}) should be {cdiv(tokens, bs)}, got {got}"
        )


@graded(
    4,
    "the null block: block 0 is reserved (padding of block tables) and never given to a "
    "request, so a cache must hold num_requests x ceil(max_model_len / block_size) + 1 "
    "blocks, the +1 once, not per request",
    f"{DOC}#the-null-block",
)
def test_min_num_gpu_blocks_counts_the_null_block_once():
    """One 2,048-token request needs 128 + 1 blocks; four need 4 x 128 + 1."""
    m = kv()
    for args, expected in [
        ((2048, 16), 129),
        ((2048, 16, 4), 513),
        ((17, 16), 3),
        ((16, 16, 1), 2),
        ((100, 7, 3), 46),
        ((8, 1, 2), 17),
    ]:
        got = whole(m.min_num_gpu_blocks(*args), f"min_num_gpu_blocks{args}")
        assert got == expected, f"min_num_gpu_blocks{args} should be {expected}, got {got}"
    for draw in drawn("min_num_gpu_blocks"):
        args = (draw(1, 2**17), draw(1, 256), draw(1, 512))
        want = args[2] * cdiv(args[0], args[1]) + 1
        got = whole(m.min_num_gpu_blocks(*args), f"min_num_gpu_blocks{args}")
        assert got == want, f"min_num_gpu_blocks{args} should be {want}, got {got}"


@graded(
    3,
    "max_concurrency = num_gpu_blocks / ceil(max_model_len / block_size), a float, over "
    "all the cache's blocks as upstream logs it",
    f"{DOC}#maximum-concurrency",
)
def test_max_concurrency():
    """7,424 blocks hold 29 Llama-2-7B requests of 4,096 tokens."""
    m = kv()
    for args, expected in [
        ((7424, 16, 4096), 29.0),
        ((27904, 16, 8192), 54.5),
        ((728, 16, 8192), 728 / 512),
        ((10, 16, 17), 5.0),
        ((3, 16, 16), 3.0),
    ]:
        got = m.max_concurrency(*args)
        assert isinstance(got, float), (
            f"max_concurrency{args} should be a float, got {describe(got)}"
        )
        assert got == pytest.approx(expected, rel=1e-12), (
            f"max_concurrency{args} should be {expected}, got {got}"
        )
    for draw in drawn("max_concurrency"):
        args = (draw(1, 2**20), draw(1, 256), draw(1, 2**17))
        want = args[0] / cdiv(args[2], args[1])
        got = m.max_concurrency(*args)
        assert isinstance(got, float) and got == pytest.approx(want, rel=1e-12), (
            f"max_concurrency{args} should be {want}, got {describe(got)}"
        )


@graded(
    4,
    "the whole startup computation: dims from the config, bytes per block, the budget "
    "from total x utilization - peak, floor to blocks, then the concurrency figure",
    f"{DOC}#the-startup-log-line",
)
def test_startup_log_line_of_llama3_8b():
    """Llama-3-8B in bf16 on an 80 GiB GPU at 0.9 with a 17.5 GiB peak: 27,904 blocks, 54.5x."""
    m = kv()
    layers, kv_heads, head_dim = dims_of(
        m.kv_cache_dims(learner_config(config(32, 4096, 32, 8))), "Llama-3-8B"
    )
    # Each size the judge sends on is a number it has read (whole), never a learner object
    # that the next function could read back as something else.
    size = whole(m.dtype_size("bfloat16"), "dtype_size('bfloat16')")
    block = whole(m.bytes_per_block(16, layers, kv_heads, head_dim, size), "bytes_per_block")
    budget = whole(
        m.available_kv_cache_memory(80 * GiB, 0.9, 17 * GiB + 512 * MiB),
        "available_kv_cache_memory",
    )
    blocks = whole(m.num_gpu_blocks_from_budget(budget, block), "num_gpu_blocks_from_budget")
    assert (block, budget, blocks) == (2 * MiB, 58_518_929_408, 27_904), (
        f"expected a 2 MiB block, a 54.5 GiB budget and 27,904 blocks; got block={block:,} B, "
        f"budget={budget:,} B, blocks={blocks:,}"
    )
    concurrency = m.max_concurrency(blocks, 16, 8192)
    assert isinstance(concurrency, float) and concurrency == pytest.approx(54.5), (
        f"27,904 blocks of 16 tokens hold 54.5 requests of 8,192 tokens, got "
        f"{describe(concurrency)}"
    )
    minimum = whole(m.min_num_gpu_blocks(8192, 16), "min_num_gpu_blocks(8192, 16)")
    assert minimum <= blocks, "one 8k request must fit"
