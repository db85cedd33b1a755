# base: solution
# lab: lab-05
# tests: test_cache_full_blocks_refuses_bad_arguments, test_hash_is_chained
# honest: _c = BlockPool.cache_full_blocks; BlockPool.cache_full_blocks = lambda self, request, blocks, num_cached_blocks, num_full_blocks, *a, **k: _c(self, request, blocks, num_cached_blocks, min(num_full_blocks, len(blocks)), *a, **k)
"""``cache_full_blocks`` caches what it is given when fewer blocks than ``num_full_blocks`` come
(the honest bug: it never refuses them), and ``get_new_blocks`` returns a ``list`` subclass,
which the judge holds as a handle, whose ``[:1]`` raises ValueError. The suite built the short
argument inside the refusal it expected (``lambda: cache(req.obj, blocks[:1], 0, 2, ...)``), so
reading it, a request answered by the learner, passed for cache_full_blocks' refusal: full
marks for lab-05 with the check missing. Arguments are now read before the call, and a
ValueError counts as a refusal only when a call raised it (``assert_value_error``)."""
_c = BlockPool.cache_full_blocks
BlockPool.cache_full_blocks = lambda self, request, blocks, num_cached_blocks, num_full_blocks, *a, **k: _c(
    self, request, blocks, num_cached_blocks, min(num_full_blocks, len(blocks)), *a, **k
)


class _Blocks(list):
    def __getitem__(self, key):
        if isinstance(key, slice) and key == slice(None, 1, None):
            raise ValueError("refused")
        return list.__getitem__(self, key)


_g = BlockPool.get_new_blocks


def _new_blocks(self, num_blocks):
    return _Blocks(_g(self, num_blocks))


BlockPool.get_new_blocks = _new_blocks
