# base: solution
# tests: test_popleft_takes_the_front, test_operations_are_constant_time
# honest: _r = FreeKVCacheBlockQueue.remove; FreeKVCacheBlockQueue.remove = lambda self, block: (sum(range(self.num_free_blocks // 2)), _r(self, block))[1]
"""Cheats an O(1) check by being slow on purpose: ``remove`` costs O(n) (a C-speed scan of
half the queue), and on a small queue it also waits, so that the small structure's batch takes
about as long as the big one's and their ratio looks constant. The honest twin is the same O(n)
``remove`` without the wait: it must lose the same points."""
import time as _time

_remove = FreeKVCacheBlockQueue.remove


def _slow_remove(self, block):
    n = self.num_free_blocks
    sum(range(n // 2))  # O(n), at C speed
    if n < 50_000:  # the small structure of a timing test: pad it up to the big one's time
        end = _time.perf_counter() + 0.0004
        while _time.perf_counter() < end:
            pass
    return _remove(self, block)


FreeKVCacheBlockQueue.remove = _slow_remove
