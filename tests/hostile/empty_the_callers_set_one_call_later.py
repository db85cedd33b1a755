# base: solution
# lab: lab-05
# tests: test_evict_blocks_by_id, test_reset_prefix_cache
# honest: _e = BlockPool.evict_blocks; BlockPool.evict_blocks = lambda self, block_ids: (_e(self, set(block_ids)), block_ids.clear())[0]
"""``evict_blocks`` empties the caller's set of ids (the honest bug: the set belongs to the
caller). The suite's helper read the set right after the call
(``learner_side.evict_blocks_and_read_the_ids``, since then ``given_ids``); an ``evict_blocks`` that keeps the set and
empties it at the pool's next call, after that read, kept the test's points with the bug in
place (a red-team helper; lab-10's ``trim_the_abort_list_one_call_later`` is its twin)."""

_evict_blocks = BlockPool.evict_blocks
_kept_sets: list = []


def _empty_the_kept_sets():
    while _kept_sets:
        _kept_sets.pop().clear()


def _evict_blocks_keeping_the_set(self, block_ids):
    _empty_the_kept_sets()
    _evict_blocks(self, set(block_ids))
    _kept_sets.append(block_ids)


def _later(method):
    def run(self, *args, **kwargs):
        _empty_the_kept_sets()
        return method(self, *args, **kwargs)

    return run


for _name in ("get_new_blocks", "free_blocks", "touch", "cache_full_blocks", "get_cached_block"):
    setattr(BlockPool, _name, _later(getattr(BlockPool, _name)))
BlockPool.evict_blocks = _evict_blocks_keeping_the_set
