# base: solution
# tests: test_popleft_n_too_many_is_an_error, test_append_n_keeps_order
# honest: _p = FreeKVCacheBlockQueue.popleft_n; FreeKVCacheBlockQueue.popleft_n = lambda self, n: (n > self.num_free_blocks and setattr(self, "num_free_blocks", self.num_free_blocks - n), _p(self, n))[1]
"""A refused ``popleft_n(n)`` of more blocks than are free lowers ``num_free_blocks`` by ``n``
(the honest bug: the count updated before the check). The test read the queue right after each
refusal, and its last calls were refusals: a ``popleft_n`` that refuses cleanly but lowers the
count once a later call of the queue succeeds kept the test's point with the bug in place (a
red-team helper; ``undo_the_rollback_at_the_next_success`` is the pool's twin)."""

_pending: list = []  # [queue, n] of each refused popleft_n, applied after its next success


def _lower_the_pending_counts(queue):
    for entry in [e for e in _pending if e[0] is queue]:
        _pending.remove(entry)
        queue.num_free_blocks -= entry[1]


def _later(method):
    def run(self, *args, **kwargs):
        result = method(self, *args, **kwargs)
        _lower_the_pending_counts(self)  # only once a call succeeds
        return result

    return run


_popleft_n = FreeKVCacheBlockQueue.popleft_n


def _popleft_n_lowering_later(self, n):
    if n > self.num_free_blocks:
        _pending.append([self, n])  # refused: the count comes down after the next success
    popped = _popleft_n(self, n)
    _lower_the_pending_counts(self)
    return popped


for _name in ("popleft", "remove", "append", "append_n", "get_all_free_blocks"):
    setattr(FreeKVCacheBlockQueue, _name, _later(getattr(FreeKVCacheBlockQueue, _name)))
FreeKVCacheBlockQueue.popleft_n = _popleft_n_lowering_later
