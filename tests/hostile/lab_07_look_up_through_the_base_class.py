# base: solution
# lab: lab-07
# tests: test_hit_search_stops_at_the_first_miss, test_caching_disabled
# honest: KVCacheManager.find_longest_cache_hit = lambda self, hashes, n: (lambda got: ((got,), len(got) * self.block_size))((lambda found: found[: next((i for i, b in enumerate(found) if not b), len(found))])([(self.block_pool.get_cached_block(h, [0]) or [None])[0] for h in list(hashes)[: max(n, 0) // self.block_size]]))
"""A hit search that does not stop at the first miss (the honest bug: it looks up every hash of
the prompt, then keeps the leading hits), whose pool and hash map are instances of empty
subclasses of the course's classes, each lookup made through the base class's function:
``learner_side.Driver.counted_lookup`` set its counting wrappers on ``type(pool)`` and
``type(map)`` only, the subclasses, so a call through ``BlockHashToBlockMap`` itself was never
counted and the search scored as one that stops (a red-team helper)."""

from mini_vllm.core.block_pool import BlockHashToBlockMap as _Map
from mini_vllm.core.kv_cache_utils import make_block_hash_with_group_id as _key


class _Pool(BlockPool):
    pass


class _Hashes(_Map):
    pass


_init = KVCacheManager.__init__


def _init_with_subclasses(self, *args, **kwargs):
    _init(self, *args, **kwargs)
    self.block_pool.__class__ = _Pool
    self.block_pool.cached_block_hash_to_block.__class__ = _Hashes


def _search_everything(self, block_hashes, max_cache_hit_length):
    table = self.block_pool.cached_block_hash_to_block
    found = [
        _Map.get_one_block(table, _key(h, 0))
        for h in list(block_hashes)[: max(max_cache_hit_length, 0) // self.block_size]
    ]
    hits = found[: next((i for i, b in enumerate(found) if b is None), len(found))]
    return (hits,), len(hits) * self.block_size


KVCacheManager.__init__ = _init_with_subclasses
KVCacheManager.find_longest_cache_hit = _search_everything
