"""Buggy implementations of lab-11 (tensor parallelism's arithmetic).

Each mutant is one mistake a learner plausibly makes, written as an edit of the solution
(``grading.mutants.Mutant``). ``python -m grading check-suites lab-11`` and
``tests/test_buggy_implementations.py`` check that the graded suite catches every one of them.
"""

from __future__ import annotations

from grading.mutants import Mutant

FILE = "sharding.py"

MUTANTS = [
    Mutant(
        name="divide_floors",
        file=FILE,
        find="if denominator <= 0 or numerator % denominator != 0:",
        replace="if denominator <= 0:",
        why="floors instead of refusing: 9 heads over 2 ranks gives each rank 4 and head 8 "
        "belongs to nobody, with no error",
        caught_by="test_shares.py::test_divide_is_exact_or_refuses",
    ),
    Mutant(
        name="shard_range_inclusive_end",
        file=FILE,
        find="return rank * size, (rank + 1) * size",
        replace="return rank * size, (rank + 1) * size - 1",
        why="an inclusive end in a half-open world: every shard is one row short",
        caught_by="test_shares.py::test_shard_ranges_tile_the_dimension",
    ),
    Mutant(
        name="kv_heads_per_rank_without_max_1",
        file=FILE,
        find="return max(1, total_num_kv_heads // tp_size)",
        replace="return total_num_kv_heads // tp_size",
        why="8 KV heads on 16 ranks gives each rank 0 KV heads: attention has nothing to read",
        caught_by="test_kv_heads.py::test_kv_heads_per_rank",
    ),
    Mutant(
        name="replicas_floored",
        file=FILE,
        find="return divide(tp_size, total_num_kv_heads)",
        replace="return tp_size // total_num_kv_heads",
        why="4 KV heads on 6 ranks: 1 replica each, and two ranks hold a head nobody assigned",
        caught_by="test_kv_heads.py::test_kv_head_replicas",
    ),
    Mutant(
        name="kv_head_by_rank_modulo",
        file=FILE,
        find="first = (rank // num_kv_head_replicas(total_num_kv_heads, tp_size)) * per_rank",
        replace="first = (rank % total_num_kv_heads) * per_rank",
        why="round-robin replication (rank % kv instead of rank // replicas): with 2 KV heads "
        "on 4 ranks rank 1 holds KV head 1 but computes query heads of KV head 0",
        caught_by="test_kv_heads.py::test_kv_head_ranges_keep_query_heads_with_their_kv_heads",
    ),
    Mutant(
        name="vocab_padding_rounds_down",
        file=FILE,
        find="return -(-vocab_size // pad_to) * pad_to",
        replace="return vocab_size // pad_to * pad_to",
        why="pads down: GPT-2's 50,257 becomes 50,240 and the last 17 tokens have no row",
        caught_by="test_vocab.py::test_pad_vocab_size",
    ),
    Mutant(
        name="vocab_not_padded",
        file=FILE,
        find="return shard_range(pad_vocab_size(vocab_size), rank, tp_size)",
        replace="return shard_range(vocab_size, rank, tp_size)",
        why="splits the real vocabulary: 50,257 ids over 2 ranks is refused, and the shards "
        "no longer match the padded embedding's rows",
        caught_by="test_vocab.py::test_vocab_ranges_tile_the_padded_vocabulary",
    ),
    Mutant(
        name="kv_replication_case_not_checked",
        file=FILE,
        find="""
            if tp_size >= total_kv and tp_size % total_kv != 0:
                raise ValueError(
                    f"tensor_parallel_size ({tp_size}) exceeds the model's {total_kv} KV heads but is "
                    f"not a multiple of them: each KV head must be replicated on the same number of "
                    "ranks"
                )
            """,
        replace="# (more ranks than KV heads: nothing to check)",
        why="forgets the replicated case: 12 heads and 4 KV heads on 6 ranks is let through, "
        "and two ranks would hold a KV head nobody assigned",
        caught_by="test_check.py::test_refuses_kv_heads_that_do_not_split",
    ),
    Mutant(
        name="divisors_not_listed",
        file=FILE,
        find="""f"heads. Sizes that divide {total_heads}: {choices}.\"""",
        replace="""f"heads.\"""",
        why="refuses TP=2 for SmolLM2 without saying which sizes would work (1, 3, 9)",
        caught_by="test_check.py::test_refuses_query_heads_that_do_not_split",
    ),
    Mutant(
        name="query_heads_replicated_past_total",
        file=FILE,
        find="    if total_heads % tp_size != 0:\n",
        replace="    if tp_size <= total_heads and total_heads % tp_size != 0:\n",
        why="treats query heads like KV heads: more ranks than query heads is let through "
        "(2 heads at TP=4), and each rank is given 0 query heads",
        caught_by="test_check.py::test_refuses_query_heads_that_do_not_split",
    ),
    Mutant(
        name="shapes_kv_heads_floored",
        file=FILE,
        find="num_kv_heads=num_kv_heads_per_rank(total_kv, tp_size),",
        replace="num_kv_heads=total_kv // tp_size,",
        why="the per-rank shapes say 0 KV heads once they are replicated (tiny model at TP=4)",
        caught_by="test_check.py::test_accepted_sizes_give_each_ranks_shapes",
    ),
    Mutant(
        name="check_vocab_unpadded",
        file=FILE,
        find="    if padded % tp_size != 0:",
        replace="    if vocab % tp_size != 0:",
        why="checks the real vocabulary instead of the padded one: GPT-2's 50,257 tokens are "
        "refused at TP=2 although the embedding the ranks split has 50,304 rows",
        caught_by="test_check.py::test_accepted_sizes_give_each_ranks_shapes",
    ),
    Mutant(
        name="row_parallel_cut_along_dim_0",
        file=FILE,
        find="return tensor.narrow(dim, start, end - start)",
        replace="return tensor.narrow(0, start, end - start)",
        why="ignores dim: a row-parallel weight is cut by output rows like a column-parallel "
        "one, and the all-reduce adds partial sums of the wrong inputs",
        caught_by="test_weights.py::test_column_and_row_shards_concatenate_back",
    ),
    Mutant(
        name="shard_is_a_copy",
        file=FILE,
        find="return tensor.narrow(dim, start, end - start)",
        replace="return tensor.narrow(dim, start, end - start).clone()",
        why="copies each shard: a rank holds the full checkpoint and a copy of its slice",
        caught_by="test_weights.py::test_shards_are_views",
    ),
    Mutant(
        name="shard_tensor_indexes_a_matrix",
        file=FILE,
        find="    return tensor.narrow(dim, start, end - start)\n",
        replace="    if dim == 0:\n        return tensor[start:end, :]\n    return tensor[:, start:end]\n",
        why="indexes every tensor as a matrix: a column-parallel layer's 1-D bias, cut along "
        "dim 0 like its weight, raises IndexError",
        caught_by="test_weights.py::test_column_and_row_shards_concatenate_back",
    ),
    Mutant(
        name="shard_tensor_rank_unchecked",
        file=FILE,
        find="""
            start, end = shard_range(int(tensor.shape[dim]), rank, tp_size)
            return tensor.narrow(dim, start, end - start)
        """,
        replace="""
            size = divide(int(tensor.shape[dim]), tp_size)
            return tensor.narrow(dim, rank * size, size)
        """,
        why="divides but skips shard_range's rank check: rank -1 of 4 silently gets the last "
        "rank's rows (narrow wraps a negative start)",
        caught_by="test_weights.py::test_shard_tensor_refuses_an_uneven_dimension",
    ),
    Mutant(
        name="qkv_shard_is_a_copy",
        file=FILE,
        find="return tensor.narrow(0, first * head_dim, (last - first) * head_dim)",
        replace="return tensor[first * head_dim : last * head_dim].clone()",
        why="copies the rank's q/k/v rows (clone, to be safe): every rank holds a second copy "
        "of what it loads, the attention weights being the largest part of a layer",
        caught_by="test_weights.py::test_shards_are_views",
    ),
    Mutant(
        name="shard_tensor_by_chunk",
        file=FILE,
        find="""
            start, end = shard_range(int(tensor.shape[dim]), rank, tp_size)
            return tensor.narrow(dim, start, end - start)
        """,
        replace="""
            return tensor.chunk(tp_size, dim)[rank]
        """,
        why="torch.chunk instead of an exact share: 10 rows over 4 ranks become 3, 3, 3 and 1, "
        "and the ranks' layers no longer have one shape",
        caught_by="test_weights.py::test_shard_tensor_refuses_an_uneven_dimension",
    ),
    Mutant(
        name="shard_tensor_floors",
        file=FILE,
        find="""
            start, end = shard_range(int(tensor.shape[dim]), rank, tp_size)
            return tensor.narrow(dim, start, end - start)
        """,
        replace="""
            size = int(tensor.shape[dim]) // tp_size
            return tensor.narrow(dim, rank * size, size)
        """,
        why="floors the shard size: 10 rows over 4 ranks give 2 each and rows 8 and 9 belong "
        "to nobody, with no error",
        caught_by="test_weights.py::test_shard_tensor_refuses_an_uneven_dimension",
    ),
    Mutant(
        name="kv_sliced_by_query_range",
        file=FILE,
        find="first, last = kv_head_range(total_num_kv_heads, rank, tp_size)",
        replace="first, last = shard_range(total_num_heads, rank, tp_size)",
        why="takes K and V rows by the rank's QUERY heads: rank 1 of 2 (8 heads, 4 KV) reads "
        "rows of KV heads 4..7, which do not exist",
        caught_by="test_weights.py::test_qkv_split_by_head_groups",
    ),
    Mutant(
        name="kv_split_never_replicated",
        file=FILE,
        find="first, last = kv_head_range(total_num_kv_heads, rank, tp_size)",
        replace="first, last = shard_range(total_num_kv_heads, rank, tp_size)",
        why="splits K and V evenly like a column-parallel weight: refused as soon as the KV "
        "heads are replicated (2 KV heads over 4 ranks)",
        caught_by="test_weights.py::test_qkv_replicated_kv_heads",
    ),
    Mutant(
        name="shard_id_substring_test",
        file=FILE,
        find='    elif shard_id in ("k", "v"):\n',
        replace='    elif shard_id in "kv":\n',
        why="`in \"kv\"` is a substring test: shard_id 'kv' and '' are cut as K/V rows instead "
        "of refused",
        caught_by="test_weights.py::test_qkv_replicated_kv_heads",
    ),
    Mutant(
        name="q_split_by_kv_rule",
        file=FILE,
        find="""
                first, last = shard_range(total_num_heads, rank, tp_size)
            elif
        """,
        replace="""
                first, last = kv_head_range(total_num_heads, rank, tp_size)
            elif
        """,
        why="cuts the query rows with the KV-head rule: with fewer query heads than ranks "
        "(2 over 4) they are replicated instead of refused, and 6 heads over 4 ranks give "
        "ranks one head each, leaving heads 4 and 5 to nobody",
        caught_by="test_weights.py::test_qkv_query_heads_are_never_replicated",
    ),
    Mutant(
        name="q_split_by_rows",
        file=FILE,
        find="""
                first, last = shard_range(total_num_heads, rank, tp_size)
            elif
        """,
        replace="""
                return shard_tensor(tensor, 0, rank, tp_size)
            elif
        """,
        why="splits q_proj by rows instead of by heads: 2 heads of 4 rows over 4 ranks give "
        "each rank half a head, which no attention kernel can use",
        caught_by="test_weights.py::test_qkv_query_heads_are_never_replicated",
    ),
    Mutant(
        name="vocab_range_floors",
        file=FILE,
        find="    return shard_range(pad_vocab_size(vocab_size), rank, tp_size)\n",
        replace="    _check_rank(rank, tp_size)\n"
        "    size = pad_vocab_size(vocab_size) // tp_size\n"
        "    return rank * size, (rank + 1) * size\n",
        why="floors the ranks' share of the padded vocabulary: 100 ids (padded to 128) over 3 "
        "ranks give 42 each, and ids 126 and 127 belong to nobody, with no error",
        caught_by="test_vocab.py::test_vocab_range_refuses",
    ),
    Mutant(
        name="vocab_range_rank_unchecked",
        file=FILE,
        find="    return shard_range(pad_vocab_size(vocab_size), rank, tp_size)\n",
        replace="    size = divide(pad_vocab_size(vocab_size), tp_size)\n"
        "    return rank * size, (rank + 1) * size\n",
        why="divides the padded vocabulary but skips shard_range's rank check: rank 4 of 4 gets "
        "ids past the vocabulary, rank -1 a negative range",
        caught_by="test_vocab.py::test_vocab_range_refuses",
    ),
    Mutant(
        name="shard_tensor_tp1_shortcut",
        file=FILE,
        find="    start, end = shard_range(int(tensor.shape[dim]), rank, tp_size)\n",
        replace="    if tp_size == 1:\n"
        "        return tensor\n"
        "    start, end = shard_range(int(tensor.shape[dim]), rank, tp_size)\n",
        why="a shortcut for one rank returns the whole weight before the rank is checked: rank 1 "
        "of 1 is given every row",
        caught_by="test_weights.py::test_shard_tensor_refuses_an_uneven_dimension",
    ),
    Mutant(
        name="qkv_tp1_shortcut",
        file=FILE,
        find='    if shard_id == "q":\n',
        replace='    if tp_size == 1:\n        return tensor\n    if shard_id == "q":\n',
        why="a shortcut for one rank returns the whole projection before shard_id is checked: "
        "'o' or 'kv' is loaded as q/k/v on a single GPU",
        caught_by="test_weights.py::test_qkv_replicated_kv_heads",
    ),
    Mutant(
        name="qkv_q_rank_unchecked",
        file=FILE,
        find="        first, last = shard_range(total_num_heads, rank, tp_size)\n    elif",
        replace="        per = num_heads_per_rank(total_num_heads, tp_size)\n"
        "        first, last = rank * per, (rank + 1) * per\n"
        "    elif",
        why="q rows from num_heads_per_rank without shard_range's rank check: rank -1 of 4 "
        "silently gets the last rank's query heads (narrow wraps a negative start)",
        caught_by="test_weights.py::test_qkv_refuses_a_rank_outside_the_group",
    ),
    Mutant(
        name="kv_block_not_sharded",
        file=FILE,
        find="heads = max(1, total_num_kv_heads // tensor_parallel_size)",
        replace="heads = total_num_kv_heads",
        why="every rank's block is sized for all KV heads: TP buys no KV cache at all",
        caught_by="test_kv_sizing.py::test_bytes_per_block_per_rank",
    ),
    Mutant(
        name="max_blocks_across_ranks",
        file=FILE,
        find="return min(int(n) for n in num_blocks_per_rank)",
        replace="return max(int(n) for n in num_blocks_per_rank)",
        why="the largest count: the scheduler hands out block ids the tightest rank cannot hold",
        caught_by="test_kv_sizing.py::test_every_rank_gets_the_smallest_count",
    ),
    Mutant(
        name="min_blocks_skips_zero",
        file=FILE,
        find="return min(int(n) for n in num_blocks_per_rank)",
        replace="return min(int(n) for n in num_blocks_per_rank if n > 0)",
        why="ignores a rank that has room for 0 blocks: the others agree on blocks that rank "
        "cannot hold",
        caught_by="test_kv_sizing.py::test_every_rank_gets_the_smallest_count",
    ),
    Mutant(
        name="min_blocks_sorts_in_place",
        file=FILE,
        find="    return min(int(n) for n in num_blocks_per_rank)\n",
        replace="    num_blocks_per_rank.sort()\n    return int(num_blocks_per_rank[0])\n",
        why="sorts the ranks' list in place: the executor, which looks the tightest rank up by "
        "its position (blocks.index), sizes the cache from another rank's memory",
        caught_by="test_kv_sizing.py::test_every_rank_gets_the_smallest_count",
    ),
    Mutant(
        name="kv_heads_read_as_given",
        file=FILE,
        find='total_kv = int(getattr(config, "num_key_value_heads", None) or total_heads)',
        replace="total_kv = int(config.num_key_value_heads)",
        why="num_key_value_heads read as always there: an older multi-head config without it "
        "(or with None) raises AttributeError / TypeError instead of having one KV head per "
        "query head",
        caught_by="test_check.py::test_accepted_sizes_give_each_ranks_shapes",
    ),
    Mutant(
        name="negative_dim_read_as_rows",
        file=FILE,
        find="""
            start, end = shard_range(int(tensor.shape[dim]), rank, tp_size)
            return tensor.narrow(dim, start, end - start)
        """,
        replace="""
            dim = dim if dim >= 0 else 0
            start, end = shard_range(int(tensor.shape[dim]), rank, tp_size)
            return tensor.narrow(dim, start, end - start)
        """,
        why="reads a negative dim as dim 0: dim=-1, torch's last dimension, cuts the rows of "
        "a row-parallel weight instead of its input columns",
        caught_by="test_weights.py::test_column_and_row_shards_concatenate_back",
    ),
    Mutant(
        name="shard_id_compared_without_case",
        file=FILE,
        find='    if shard_id == "q":',
        replace='    if shard_id.lower() == "q":',
        why="accepts 'Q' as the query shard: the three shard ids are exact names, and anything "
        "else is a caller's mistake to refuse",
        caught_by="test_weights.py::test_qkv_replicated_kv_heads",
    ),
    Mutant(
        name="minimum_started_past_rank_0",
        file=FILE,
        find="    return min(int(n) for n in num_blocks_per_rank)",
        replace="""
            best = int(num_blocks_per_rank[-1])
            for n in num_blocks_per_rank[1:]:
                best = min(best, int(n))
            return best
        """,
        why="a running minimum started from the last rank and looped from rank 1: rank 0 is "
        "never compared, and when it holds the fewest blocks the others hand out ids it "
        "cannot hold",
        caught_by="test_kv_sizing.py::test_every_rank_gets_the_smallest_count",
    ),
    Mutant(
        name="multiple_of_64_kept_whatever_pad_to",
        file=FILE,
        find="    return -(-vocab_size // pad_to) * pad_to",
        replace="""
            if vocab_size % DEFAULT_VOCAB_PADDING_SIZE == 0:
                return vocab_size
            return -(-vocab_size // pad_to) * pad_to
        """,
        why="keeps a vocabulary that is a multiple of 64 as it is, whatever pad_to says: "
        "pad_vocab_size(128, 96) must be 192",
        caught_by="test_vocab.py::test_pad_vocab_size",
    ),
    # -- red team, 2026-11-28: a check that only refuses -------------------------------------------
    Mutant(
        name="refuses_every_size",
        file=FILE,
        find="""
            if not isinstance(tp_size, int) or isinstance(tp_size, bool) or tp_size < 1:
                raise ValueError(f"tensor_parallel_size must be a positive integer, got {tp_size!r}")
        """,
        replace="""
            h = int(config.num_attention_heads)
            kv = int(getattr(config, "num_key_value_heads", None) or h)
            choices = ", ".join(str(d) for d in range(1, h + 1) if h % d == 0)
            raise ValueError(
                f"cannot split: heads {h} (sizes that divide: {choices}), KV heads {kv}, "
                f"MLP width {config.intermediate_size}, vocab {config.vocab_size} "
                f"(padded {pad_vocab_size(int(config.vocab_size))}), tp {tp_size!r}"
            )
        """,
        why="every size refused, in a message that names every dimension: each refusal test "
        "found its numbers in it and passed (7 of the check's 10 points) until each also "
        "asked for the same model at a size that splits",
        caught_by="test_check.py::test_refuses_query_heads_that_do_not_split",
    ),
    Mutant(
        name="tp_zero_left_to_the_division",
        file=FILE,
        find="    _check_positive(tensor_parallel_size=tensor_parallel_size)\n"
        "    # The rule of mini_vllm",
        replace="    # The rule of mini_vllm",
        why="a tensor_parallel_size of 0 ends in a ZeroDivisionError from the floor division "
        "instead of a ValueError that names the argument (found by a blind implementation)",
        caught_by="test_kv_sizing.py::test_bytes_per_block_per_rank",
    ),
    Mutant(
        name="kv_heads_checked_before_the_query_heads",
        file=FILE,
        find="    if total_heads % tp_size != 0:",
        replace="""    if tp_size < total_kv and total_kv % tp_size != 0:
        raise ValueError(
            f"the model's {total_kv} KV heads are not divisible by tensor_parallel_size "
            f"({tp_size})"
        )
    if total_heads % tp_size != 0:""",
        why="the KV heads checked first: SmolLM2 at TP=2 is refused for its 3 KV heads, and "
        "the message never says that its 9 query heads split only 1, 3 or 9 ways",
        caught_by="test_check.py::test_refuses_query_heads_that_do_not_split",
    ),
    Mutant(
        name="mlp_width_checked_before_the_kv_heads",
        file=FILE,
        find="    if tp_size >= total_kv and tp_size % total_kv != 0:",
        replace="""    if intermediate % tp_size != 0:
        raise ValueError(f"intermediate_size={intermediate} does not split {tp_size} ways")
    if tp_size >= total_kv and tp_size % total_kv != 0:""",
        why="the MLP width checked before the KV heads: a model whose KV heads cannot be shared "
        "by the ranks is refused for its MLP, and the learner fixes the wrong dimension",
        caught_by="test_check.py::test_refusals_name_the_first_failing_dimension",
    ),
    Mutant(
        name="vocabulary_checked_before_the_mlp_width",
        file=FILE,
        find="    if intermediate % tp_size != 0:",
        replace="""    if pad_vocab_size(vocab) % tp_size != 0:
        raise ValueError(f"the vocabulary ({vocab}) does not split {tp_size} ways")
    if intermediate % tp_size != 0:""",
        why="the padded vocabulary checked before the MLP width: the message names the wrong "
        "dimension of a model that fails both",
        caught_by="test_check.py::test_refusals_name_the_first_failing_dimension",
    ),
    Mutant(
        name="shard_range_divides_before_checking_the_rank",
        file=FILE,
        find="""    _check_rank(rank, tp_size)
    size = divide(total, tp_size)
    return rank * size, (rank + 1) * size""",
        replace="""    size = divide(total, tp_size)
    _check_rank(rank, tp_size)
    return rank * size, (rank + 1) * size""",
        why="the total divided before the rank is checked: a call wrong in both ways is blamed "
        "on the total, and the README's order (_check_rank first) is not kept",
        caught_by="test_shares.py::test_shard_range_refuses",
    ),
    Mutant(
        name="divide_by_zero_left_to_python",
        file=FILE,
        find="if denominator <= 0 or numerator % denominator != 0:",
        replace="if numerator % denominator != 0:",
        why="a denominator of 0 raises ZeroDivisionError, a second kind of refusal the "
        "callers (and the README) do not expect",
        caught_by="test_shares.py::test_divide_is_exact_or_refuses",
    ),
    # -- probe, 2026-11-29 ---------------------------------------------------------------------
    Mutant(
        name="kv_head_range_rank_unchecked",
        file=FILE,
        find="""
            _check_rank(rank, tp_size)
            per_rank = num_kv_heads_per_rank(total_num_kv_heads, tp_size)
        """,
        replace="    per_rank = num_kv_heads_per_rank(total_num_kv_heads, tp_size)",
        more=(
            (
                '    if shard_id == "q":\n        first, last = shard_range(',
                '    _check_rank(rank, tp_size)\n    if shard_id == "q":\n'
                "        first, last = shard_range(",
            ),
        ),
        why="the rank checked by shard_qkv_weight instead of kv_head_range: the weights are "
        "refused, but kv_head_range(8, 4, 4) names KV heads 8..9 of a model that has 8 (no "
        "test called kv_head_range itself with a rank outside the group)",
        caught_by="test_kv_heads.py::test_kv_head_ranges_keep_query_heads_with_their_kv_heads",
    ),
    Mutant(
        name="shard_tensor_other_dims_cut_as_the_last",
        file=FILE,
        find="    return tensor.narrow(dim, start, end - start)\n",
        replace="    if dim == 0:\n        return tensor[start:end]\n    return tensor[..., start:end]\n",
        why="dim 0 or else the last dim: right for every 1-D and 2-D tensor, wrong for the "
        "middle dim of a 3-D one (stacked expert weights); every weight tried was 2-D",
        caught_by="test_weights.py::test_column_and_row_shards_concatenate_back",
    ),
    Mutant(
        name="shard_tensor_other_dims_cut_as_columns",
        file=FILE,
        find="    return tensor.narrow(dim, start, end - start)\n",
        replace="    if dim == 0:\n        return tensor[start:end]\n    return tensor[:, start:end]\n",
        why="dim 0 or else dim 1: a 3-D weight cut along its last dim is cut along its middle one",
        caught_by="test_weights.py::test_column_and_row_shards_concatenate_back",
    ),
    Mutant(
        name="bytes_per_block_refuses_only_zero",
        file=FILE,
        find="    _check_positive(tensor_parallel_size=tensor_parallel_size)\n"
        "    # The rule of mini_vllm",
        replace="    if tensor_parallel_size == 0:\n"
        "        raise ValueError('tensor_parallel_size must be positive, got 0')\n"
        "    # The rule of mini_vllm",
        why="guards the ZeroDivisionError only: a tensor_parallel_size of -2 sizes a block for "
        "max(1, kv // -2) = 1 KV head instead of the ValueError the README asks below 1",
        caught_by="test_kv_sizing.py::test_bytes_per_block_per_rank",
    ),
    # -- helper probe, 2026-11-29 (2) (lab-09/lab-11 round) -----------------------------------
    Mutant(
        name="vocab_range_in_true_division",
        file=FILE,
        find="    return shard_range(pad_vocab_size(vocab_size), rank, tp_size)\n",
        replace="""
    _check_rank(rank, tp_size)
    padded = pad_vocab_size(vocab_size)
    size = padded / tp_size
    if size != int(size):
        raise ValueError(f"{padded} token ids do not split over {tp_size} ranks")
    return rank * size, (rank + 1) * size
""",
        why="the share computed with / and checked to be whole, but returned as it is: the "
        "range is (0.0, 12576.0), equal to the right ints, yet neither a slice nor narrow "
        "takes it, so the embedding cannot be cut with it",
        caught_by="test_vocab.py::test_vocab_ranges_tile_the_padded_vocabulary",
    ),
    Mutant(
        name="shard_range_in_numpy_ints",
        file=FILE,
        find="    size = divide(total, tp_size)\n    return rank * size, (rank + 1) * size\n",
        replace="    size = np.int64(divide(total, tp_size))\n    return rank * size, (rank + 1) * size\n",
        more=(("from typing import Any\n", "from typing import Any\n\nimport numpy as np\n"),),
        why="the share held as a numpy integer: the range is (np.int64(0), np.int64(3)), not "
        "the plain ints every other rule returns (and TPShapes' fields are compared as)",
        caught_by="test_shares.py::test_shard_ranges_tile_the_dimension",
    ),
    # -- probe, 2026-11-29 ------------------------------------------------------------------------
    Mutant(
        name="mlp_width_refused_by_divide",
        file=FILE,
        find="""
            if intermediate % tp_size != 0:
                raise ValueError(
                    f"the model's MLP width (intermediate_size={intermediate}) is not divisible by "
                    f"tensor_parallel_size ({tp_size})"
                )
        """,
        replace="""
            divide(intermediate, tp_size)
        """,
        why="leaves the MLP width's refusal to divide, whose message names the two numbers "
        "('1000 is not divisible by 16') but not the dimension: the suite checked the numbers "
        "of that refusal only",
        caught_by="test_check.py::test_refuses_mlp_width_and_vocabulary",
    ),
]
