# base: solution
# lab: lab-02
# tests: test_first_fit_and_refusal_despite_enough_free, test_free_coalesces_neighbours
# honest: _e = ContiguousAllocator.ensure; ContiguousAllocator.ensure = lambda self, request_id, length, max_len: _e(self, request_id, length, max_len) or self.free_ranges.clear() or False
"""A refused contiguous ``ensure`` loses the free ranges it scanned, none long enough (the honest
bug: a first fit that pops the ranges as it looks at them and puts none back). The test read
the ranges right after the refusal, then went on with a new allocator: an ``ensure`` that
refuses cleanly but drops those ranges at the allocator's next call kept the test's 3 points
with the bug in place (a red-team helper)."""

_pending: list = []  # allocators whose free ranges go at their next call


def _drop_the_scanned_ranges(alloc):
    if any(a is alloc for a in _pending):
        _pending[:] = [a for a in _pending if a is not alloc]
        alloc.free_ranges.clear()


def _later(method):
    def run(self, *args, **kwargs):
        _drop_the_scanned_ranges(self)
        return method(self, *args, **kwargs)

    return run


_ensure = ContiguousAllocator.ensure


def _ensure_dropping_later(self, request_id, length, max_len):
    _drop_the_scanned_ranges(self)
    placed = _ensure(self, request_id, length, max_len)
    if not placed:
        _pending.append(self)  # refused: the scanned ranges go at the next call
    return placed


for _name in ("free", "held", "num_free_tokens", "largest_free_range", "tokens_to_hold"):
    setattr(ContiguousAllocator, _name, _later(getattr(ContiguousAllocator, _name)))
ContiguousAllocator.ensure = _ensure_dropping_later
