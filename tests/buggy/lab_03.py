"""Buggy implementations of lab-03 (KV cache sizing).

Each mutant is one mistake a learner plausibly makes, written as an edit of the solution
(``grading.mutants.Mutant``). ``python -m grading check-suites lab-03`` and
``tests/test_buggy_implementations.py`` check that the graded suite catches every one of them.
"""

from __future__ import annotations

from grading.mutants import Mutant

FILE = "kv_sizing.py"

MUTANTS = [
    Mutant(
        name="k_and_v_factor_forgotten",
        file=FILE,
        find="return 2 * num_layers * num_kv_heads * head_dim * dtype_size(dtype_bytes)",
        replace="return num_layers * num_kv_heads * head_dim * dtype_size(dtype_bytes)",
        why="counts only keys (or only values): every size is half the truth, so the engine "
        "would allocate twice the blocks its memory holds",
        caught_by="test_formulas.py::test_bytes_per_token_of_real_models",
    ),
    Mutant(
        name="query_heads_instead_of_kv_heads",
        file=FILE,
        find='num_kv_heads = int(getattr(config, "num_key_value_heads", None) or num_heads)',
        replace="num_kv_heads = num_heads",
        why="sizes the cache by query heads: GQA models (Llama-3: 32 query, 8 KV heads) look 4x "
        "bigger than they are",
        caught_by="test_formulas.py::test_kv_cache_dims_reads_real_configs",
    ),
    Mutant(
        name="head_dim_always_hidden_over_heads",
        file=FILE,
        find='head_dim = int(getattr(config, "head_dim", None) or hidden_size // num_heads)',
        replace="head_dim = hidden_size // num_heads",
        why="ignores an explicit head_dim (Gemma-7B: 256, not 3072 / 16 = 192)",
        caught_by="test_formulas.py::test_kv_cache_dims_reads_real_configs",
    ),
    Mutant(
        name="dtype_bytes_assumed_two",
        file=FILE,
        find="return 2 * num_layers * num_kv_heads * head_dim * dtype_size(dtype_bytes)",
        replace="return 2 * num_layers * num_kv_heads * head_dim * 2",
        why="assumes a 16-bit cache: the float32 cache of the CPU engine (and an fp8 one) is "
        "sized wrong",
        caught_by="test_formulas.py::test_bytes_per_token_of_real_models",
    ),
    Mutant(
        name="dtype_torch_prefix_not_stripped",
        file=FILE,
        find='name = str(dtype).removeprefix("torch.")',
        replace="name = str(dtype)",
        why="str(torch.bfloat16) is 'torch.bfloat16': the engine's own dtype is refused",
        caught_by="test_formulas.py::test_dtype_size",
    ),
    Mutant(
        name="block_bytes_of_one_layer",
        file=FILE,
        find="return block_size * bytes_per_token(num_layers, num_kv_heads, head_dim, dtype_bytes)",
        replace="return block_size * bytes_per_token(1, num_kv_heads, head_dim, dtype_bytes)",
        why="upstream's page_size_bytes is per layer; a block id costs that in every layer",
        caught_by="test_formulas.py::test_bytes_per_block",
    ),
    Mutant(
        name="utilization_applied_to_memory_left_after_the_model",
        file=FILE,
        find="return math.ceil(total_memory * gpu_memory_utilization) - int(non_kv_cache_memory)",
        replace="return math.ceil((total_memory - int(non_kv_cache_memory)) * gpu_memory_utilization)",
        why="takes the utilization share of the memory left after the model instead of the whole "
        "device: 0.5 of 80 GiB with a 10 GiB model gives 35 GiB instead of 30",
        caught_by="test_formulas.py::test_available_kv_cache_memory",
    ),
    Mutant(
        name="budget_rounded_down",
        file=FILE,
        find="return math.ceil(total_memory * gpu_memory_utilization) - int(non_kv_cache_memory)",
        replace="return int(total_memory * gpu_memory_utilization) - int(non_kv_cache_memory)",
        why="truncates the requested share where upstream's request_memory rounds it up",
        caught_by="test_formulas.py::test_available_kv_cache_memory_rounds_up",
    ),
    Mutant(
        name="utilization_not_checked",
        file=FILE,
        find="""
            if not 0.0 < gpu_memory_utilization <= 1.0:
                raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {gpu_memory_utilization}")
        """,
        replace="",
        why="accepts a utilization of 1.5: the engine would plan for more memory than exists",
        caught_by="test_formulas.py::test_available_kv_cache_memory_rejects_bad_utilization",
    ),
    Mutant(
        name="blocks_rounded_up",
        file=FILE,
        find="return max(int(budget_bytes) // block_bytes, 0)",
        replace="return max(-(-int(budget_bytes) // block_bytes), 0)",
        why="ceil instead of floor: a partial block is counted, and the cache overruns its budget",
        caught_by="test_formulas.py::test_num_gpu_blocks_from_budget_floors",
    ),
    Mutant(
        name="negative_budget_gives_negative_blocks",
        file=FILE,
        find="return max(int(budget_bytes) // block_bytes, 0)",
        replace="return int(budget_bytes) // block_bytes",
        why="a model that does not fit gives a negative block count instead of 0",
        caught_by="test_formulas.py::test_num_gpu_blocks_from_budget_floors",
    ),
    Mutant(
        name="blocks_per_request_floored",
        file=FILE,
        find="return cdiv(num_tokens, block_size)",
        replace="return num_tokens // block_size",
        why="forgets the partly filled last block: 17 tokens in 16-token blocks need 2, not 1",
        caught_by="test_formulas.py::test_blocks_per_request_ceils",
    ),
    Mutant(
        name="null_block_not_counted",
        file=FILE,
        find="return num_requests * blocks_per_request(max_model_len, block_size) + 1",
        replace="return num_requests * blocks_per_request(max_model_len, block_size)",
        why="forgets block 0, the null block: a cache of exactly that size cannot hold the "
        "full-length request it was sized for",
        caught_by="test_formulas.py::test_min_num_gpu_blocks_counts_the_null_block_once",
    ),
    Mutant(
        name="null_block_per_request",
        file=FILE,
        find="return num_requests * blocks_per_request(max_model_len, block_size) + 1",
        replace="return num_requests * (blocks_per_request(max_model_len, block_size) + 1)",
        why="counts a null block per request; there is one per cache",
        caught_by="test_formulas.py::test_min_num_gpu_blocks_counts_the_null_block_once",
    ),
    Mutant(
        name="max_concurrency_without_the_null_block",
        file=FILE,
        find="return num_gpu_blocks / blocks_per_request(max_model_len, block_size)",
        replace="return (num_gpu_blocks - 1) / blocks_per_request(max_model_len, block_size)",
        why="off by one against upstream's figure, which divides all of the cache's blocks",
        caught_by="test_formulas.py::test_max_concurrency",
    ),
    Mutant(
        name="max_concurrency_integer_division",
        file=FILE,
        find="return num_gpu_blocks / blocks_per_request(max_model_len, block_size)",
        replace="return float(num_gpu_blocks // blocks_per_request(max_model_len, block_size))",
        why="rounds the concurrency down: upstream logs 54.50x, not 54x",
        caught_by="test_formulas.py::test_max_concurrency",
    ),
    Mutant(
        name="max_concurrency_counts_tokens_not_blocks",
        file=FILE,
        find="return num_gpu_blocks / blocks_per_request(max_model_len, block_size)",
        replace="return num_gpu_blocks * block_size / max_model_len",
        why="divides the cache's tokens by max_model_len: a request's partly filled last block "
        "still takes a whole block, so 10 blocks of 16 hold 5 requests of 17 tokens, not 9.4",
        caught_by="test_formulas.py::test_max_concurrency",
    ),
    Mutant(
        name="full_utilization_refused",
        file=FILE,
        find="if not 0.0 < gpu_memory_utilization <= 1.0:",
        replace="if not 0.0 < gpu_memory_utilization < 1.0:",
        why="refuses gpu_memory_utilization = 1.0, a valid setting (the whole device)",
        caught_by="test_formulas.py::test_available_kv_cache_memory",
    ),
    Mutant(
        name="blocks_per_request_numpy_ceil",
        file=FILE,
        find="return cdiv(num_tokens, block_size)",
        replace="""
            import numpy as np

            return np.ceil(num_tokens / block_size)
        """,
        why="np.ceil returns a numpy float: 2.0 blocks equals 2, but a block count that is a "
        "float cannot size the engine's tensors (and every count built on it is a float)",
        caught_by="test_formulas.py::test_blocks_per_request_ceils",
    ),
    Mutant(
        name="kv_heads_null_not_defaulted",
        file=FILE,
        find='num_kv_heads = int(getattr(config, "num_key_value_heads", None) or num_heads)',
        replace='num_kv_heads = getattr(config, "num_key_value_heads", num_heads)',
        why="the default applies only when the attribute is absent: a config.json with "
        '"num_key_value_heads": null gives None KV heads instead of one per query head',
        caught_by="test_formulas.py::test_kv_cache_dims_reads_real_configs",
    ),
    Mutant(
        name="head_dim_null_not_defaulted",
        file=FILE,
        find='head_dim = int(getattr(config, "head_dim", None) or hidden_size // num_heads)',
        replace='head_dim = getattr(config, "head_dim", hidden_size // num_heads)',
        why='the default applies only when the attribute is absent: "head_dim": null gives a '
        "None head_dim instead of hidden_size // num_attention_heads",
        caught_by="test_formulas.py::test_kv_cache_dims_reads_real_configs",
    ),
    Mutant(
        name="budget_rounded_to_nearest_byte",
        file=FILE,
        find="return math.ceil(total_memory * gpu_memory_utilization) - int(non_kv_cache_memory)",
        replace="return int(total_memory * gpu_memory_utilization + 0.5) - int(non_kv_cache_memory)",
        why="rounds the requested share to the nearest byte (x + 0.5) instead of up: "
        "ceil(250,000,000.25) is 250,000,001, not 250,000,000",
        caught_by="test_formulas.py::test_available_kv_cache_memory_rounds_up",
    ),
    Mutant(
        name="empty_sequence_given_a_block",
        file=FILE,
        find="return cdiv(num_tokens, block_size)",
        replace="return max(cdiv(num_tokens, block_size), 1)",
        why="gives a sequence of 0 tokens one block: ceil(0 / 16) is 0, and a request holds "
        "no block before its first token",
        caught_by="test_formulas.py::test_blocks_per_request_ceils",
    ),
    Mutant(
        name="bytes_per_block_multiplies_the_dtype_name",
        file=FILE,
        find="return block_size * bytes_per_token(num_layers, num_kv_heads, head_dim, dtype_bytes)",
        replace="return block_size * 2 * num_layers * num_kv_heads * head_dim * dtype_bytes",
        why="writes the formula out again instead of calling bytes_per_token, and forgets "
        "dtype_size: a dtype given by name ('float16') is repeated as a string, not sized",
        caught_by="test_formulas.py::test_bytes_per_block",
    ),
    Mutant(
        name="budget_rounded_up_by_adding_a_half",
        file=FILE,
        find="return math.ceil(total_memory * gpu_memory_utilization) - int(non_kv_cache_memory)",
        replace="return round(total_memory * gpu_memory_utilization + 0.5) - int(non_kv_cache_memory)",
        why="'round up' written as round(x + 0.5): Python rounds halves to even, so a whole "
        "odd product (1,001 x 1.0) gains a byte the device does not have",
        caught_by="test_formulas.py::test_available_kv_cache_memory_rounds_up",
    ),
    Mutant(
        name="dtype_name_looked_up_without_dtype_size",
        file=FILE,
        find="return 2 * num_layers * num_kv_heads * head_dim * dtype_size(dtype_bytes)",
        replace="return 2 * num_layers * num_kv_heads * head_dim * (dtype_bytes if "
        "isinstance(dtype_bytes, int) else DTYPE_SIZES[dtype_bytes])",
        why="sizes a named dtype from the table directly: the name the engine hands over, "
        "str(torch.bfloat16) = 'torch.bfloat16', is a KeyError",
        caught_by="test_formulas.py::test_bytes_per_token_of_real_models",
    ),
    Mutant(
        name="dtype_table_of_the_common_names_only",
        file=FILE,
        find="    if name not in DTYPE_SIZES:",
        replace='    if name not in DTYPE_SIZES or name in ("float", "float8_e5m2"):',
        why="a hand-written table without the aliases (float) and the second fp8 format "
        "(float8_e5m2): a cache dtype the engine accepts is refused",
        caught_by="test_formulas.py::test_dtype_size",
    ),
    Mutant(
        name="dtype_size_guessed_from_the_digits",
        file=FILE,
        find="""
            name = str(dtype).removeprefix("torch.")
            if name not in DTYPE_SIZES:
        """,
        replace="""
            name = str(dtype).removeprefix("torch.")
            if "8" in name:
                return 1
            if "16" in name:
                return 2
            if "32" in name:
                return 4
            if name not in DTYPE_SIZES:
        """,
        why="guesses the size from the bit width in the name: int8, int32 or float8_e4m3fnuz, "
        "no cache dtype of the table, get a size instead of a ValueError",
        caught_by="test_formulas.py::test_dtype_size",
    ),
    Mutant(
        name="utilization_rounded_to_a_whole_percent",
        file=FILE,
        find="    return math.ceil(total_memory * gpu_memory_utilization) - int(non_kv_cache_memory)",
        replace="""
            percent = round(gpu_memory_utilization * 100)
            return -(-total_memory * percent // 100) - int(non_kv_cache_memory)
        """,
        why="stays in integers by rounding the utilization to a whole percent: 0.875 becomes "
        "0.88, and 80 GiB x 0.925 is short by about 400 MiB",
        caught_by="test_formulas.py::test_available_kv_cache_memory_rounds_up",
    ),
    Mutant(
        name="head_dim_rounded_to_the_nearest",
        file=FILE,
        find="hidden_size // num_heads)",
        replace="round(hidden_size / num_heads))",
        why="derives head_dim as the nearest whole number of hidden_size / heads, where "
        "transformers floors it",
        caught_by="test_formulas.py::test_kv_cache_dims_reads_real_configs",
    ),
    Mutant(
        name="dtype_auto_read_as_two_bytes",
        file=FILE,
        find='name = str(dtype).removeprefix("torch.")',
        replace="""
            name = str(dtype).removeprefix("torch.")
            if name == "auto":
                return 2
        """,
        why="reads upstream's default kv_cache_dtype 'auto' as a 16-bit cache, where it stands "
        "for the model's dtype (float32 in the CPU engine): no unknown name tried was 'auto'",
        caught_by="test_formulas.py::test_dtype_size",
    ),
    Mutant(
        name="utilization_as_an_exact_decimal",
        file=FILE,
        find="    return math.ceil(total_memory * gpu_memory_utilization) - int(non_kv_cache_memory)",
        replace="""
            from decimal import Decimal

            share = math.ceil(total_memory * Decimal(repr(gpu_memory_utilization)))
            return share - int(non_kv_cache_memory)
        """,
        why="takes the ceiling of the exact decimal product where upstream takes it of the float: "
        "3e9 x 0.55 is 1,650,000,000.0000002 as a float, a byte more than the decimal "
        "(every total tried had given the same ceiling both ways)",
        caught_by="test_formulas.py::test_available_kv_cache_memory_rounds_up",
    ),
    Mutant(
        name="float_noise_rounded_off_before_the_ceiling",
        file=FILE,
        find="    return math.ceil(total_memory * gpu_memory_utilization) - int(non_kv_cache_memory)",
        replace="    return math.ceil(round(total_memory * gpu_memory_utilization, 6)) - "
        "int(non_kv_cache_memory)",
        why="rounds the float product to 6 places before the ceiling, to hide its noise: "
        "upstream's ceiling of 1,650,000,000.0000002 is 1,650,000,001",
        caught_by="test_formulas.py::test_available_kv_cache_memory_rounds_up",
    ),
    Mutant(
        name="utilization_int_refused",
        file=FILE,
        find="if not 0.0 < gpu_memory_utilization <= 1.0:",
        replace="if not isinstance(gpu_memory_utilization, float) or not 0.0 < "
        "gpu_memory_utilization <= 1.0:",
        why="checks the type as well as the range: gpu_memory_utilization=1, which upstream's "
        "config takes and mini-vLLM's LLM hands over as given, is refused",
        caught_by="test_formulas.py::test_available_kv_cache_memory_rejects_bad_utilization",
    ),
]
