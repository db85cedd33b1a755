# base: solution
# lab: lab-07
# tests: test_none_changes_nothing, test_usage
# honest: _g = KVCacheManager.get_num_blocks_to_allocate; KVCacheManager.get_num_blocks_to_allocate = lambda self, request_id, *a, **k: (self.req_to_blocks.setdefault(request_id, []), _g(self, request_id, *a, **k))[1]
"""A refused ``allocate_slots`` leaves the request an empty block table (the honest bug: the
capacity count creates it with ``setdefault``; a refused allocation must change nothing). The
test read the state right after the refusal, and its last refusal was the test's last call: an
``allocate_slots`` that leaves the empty table at the manager's next call instead, after that
read, kept the test's 4 points with the bug in place (a red-team helper)."""

_deferred: list = []


def _leave_the_deferred_tables(manager):
    while _deferred:
        manager.req_to_blocks.setdefault(_deferred.pop(), [])


def _later(method):
    def run(self, *args, **kwargs):
        _leave_the_deferred_tables(self)
        return method(self, *args, **kwargs)

    return run


_allocate_slots = KVCacheManager.allocate_slots


def _allocate_slots_leaving_a_table_later(self, request, *args, **kwargs):
    _leave_the_deferred_tables(self)
    new = _allocate_slots(self, request, *args, **kwargs)
    if new is None and request.request_id not in self.req_to_blocks:
        _deferred.append(request.request_id)
    return new


for _name in ("get_computed_blocks", "free", "cache_blocks", "get_block_ids"):
    setattr(KVCacheManager, _name, _later(getattr(KVCacheManager, _name)))
KVCacheManager.allocate_slots = _allocate_slots_leaving_a_table_later
