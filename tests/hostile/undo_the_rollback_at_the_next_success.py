# base: solution
# tests: test_double_free_is_an_error, test_usage
# honest: _f = BlockPool.free_blocks; _bad = lambda bl: next((i for i, b in enumerate(bl) if b.is_null or b.ref_cnt - sum(x is b for x in bl[:i]) <= 0), None); BlockPool.free_blocks = lambda self, ordered: (lambda bl, i: (i is not None and [setattr(b, "ref_cnt", b.ref_cnt - 1) for b in bl[:i]], _f(self, bl))[1])(*(lambda bl: (bl, _bad(bl)))(list(ordered)))
"""A refused ``free_blocks`` keeps the references it dropped before the bad entry (the honest
bug: the refused call half-happened). The test read the ref counts right after each refusal,
and its last calls were refusals: a ``free_blocks`` that rolls back at once but drops those
references again once a later call of the pool succeeds kept the test's 2 points with the bug
in place (a red-team helper; lab-07's ``leave_the_refusals_trace_one_call_later`` is its
twin)."""

_free_blocks = BlockPool.free_blocks
_pending: list = []


def _bad_entry(blocks):
    for i, b in enumerate(blocks):
        if b.is_null or b.ref_cnt - sum(x is b for x in blocks[:i]) <= 0:
            return i
    return None


def _drop_the_pending_references():
    while _pending:
        block = _pending.pop()
        block.ref_cnt -= 1


def _free_blocks_dropping_later(self, ordered_blocks):
    blocks = list(ordered_blocks)
    i = _bad_entry(blocks)
    if i is not None:
        _pending.extend(blocks[:i])  # refused: the drops come back at the next success
    _free_blocks(self, blocks)
    _drop_the_pending_references()


_get_new_blocks = BlockPool.get_new_blocks


def _get_new_blocks_then_drop(self, num_blocks):
    got = _get_new_blocks(self, num_blocks)
    _drop_the_pending_references()
    return got


BlockPool.free_blocks = _free_blocks_dropping_later
BlockPool.get_new_blocks = _get_new_blocks_then_drop
