# base: solution
# lab: lab-05
# tests: test_first_block_chains_from_none_hash, test_hash_is_the_documented_formula, test_hash_is_chained
# honest: import types as _t; kv_cache_utils = _t.SimpleNamespace(NONE_HASH=b"\0" * 32)
"""``hash_block_tokens`` chains a first block from a constant of its own (the honest bug: it
disagrees with every process that chains from the engine's ``NONE_HASH``, and ignores
``init_none_hash``). The suite read the seed it compared with from the learner process's
``kv_cache_utils.NONE_HASH``, which the submission rebinds to its constant at import: the
formula tests then agreed with it (52/53 for an honest 48/53; a red-team helper). The judge
now binds a seed of its own choosing before it hashes."""

from mini_vllm.core import kv_cache_utils as _kv_cache_utils

_SEED = b"\0" * 32
_kv_cache_utils.NONE_HASH = _SEED


def hash_block_tokens(hash_function, parent_block_hash, curr_block_token_ids, extra_keys=None):
    if parent_block_hash is None:
        parent_block_hash = _SEED
    return BlockHash(hash_function((parent_block_hash, tuple(curr_block_token_ids), extra_keys)))
