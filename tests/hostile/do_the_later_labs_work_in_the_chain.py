# base: solution
# lab: lab-07
# chain: lab-05
# tests: test_free_returns_blocks_tail_first, test_get_block_ids
# honest: KVCacheManager.free = lambda self, request: (self.block_pool.free_blocks(list(self.req_to_blocks.pop(request.request_id, []))), self.num_cached_block.pop(request.request_id, None))[0]
# not defended: under --chain the grade is the learner's stack's: an earlier lab's file may do the later lab's work
"""lab-07's ``free`` hands the pool the request's blocks head first (the honest bug: the shared
prefix is then evicted before the tail). Graded with ``--chain``, the learner's lab-05
``block_pool.py`` stands in for the reference pool, and this one (appended to lab-05's
solution, not to lab-07's file) reverses what a ``KVCacheManager`` method hands to
``free_blocks``: lab-07's work done in lab-05's file, which lab-05's own grade never sees (its
tests call ``free_blocks`` from no manager). lab-07 then scores 87/87 under ``--chain`` for an
honest 58/87 (a red-team helper). Nothing is forged: the judge grades what the learner's stack
does, and with ``--chain`` the stack includes the earlier labs. A lab's own grade is the one
without ``--chain`` (the reference under it), which Gradescope gives."""

import sys as _sys

_free_blocks = BlockPool.free_blocks


def _free_blocks_tail_first(self, ordered_blocks):
    caller = _sys._getframe(1)
    if type(caller.f_locals.get("self")).__name__ == "KVCacheManager":
        ordered_blocks = list(reversed(list(ordered_blocks)))
    return _free_blocks(self, ordered_blocks)


BlockPool.free_blocks = _free_blocks_tail_first
