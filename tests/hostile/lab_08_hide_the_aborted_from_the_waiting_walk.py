# base: solution
# lab: lab-08
# tests: test_finish_requests_aborts, test_abort_between_schedule_and_update, test_random_traces_with_aborts_match_the_reference, test_eos_stops
# honest: from mini_vllm.core.sched.request_queue import FCFSRequestQueue as _Q; _Q.remove_requests = lambda self, reqs: None; _s = Scheduler.schedule; Scheduler.schedule = lambda self: ([self.waiting.remove(r) for r in [r for r in self.waiting if r.is_finished()]] if isinstance(self.waiting, _Q) else None, _s(self))[1]
"""An abort leaves a waiting request in the waiting queue (the honest bug: ``finish_requests``
takes nothing out of an FCFS queue, and the next ``schedule`` clears the finished ones first,
so ``get_num_unfinished_requests`` and ``has_unfinished_requests`` count an aborted request
until then), with the scheduler's queue re-classed as an ``FCFSRequestQueue`` subclass whose
``__iter__`` leaves finished requests out: the suite's state read ``sched.waiting`` by the
queue's own iteration, while ``len`` and ``bool`` still counted them (a red-team helper)."""

from collections import deque as _deque

from mini_vllm.core.sched.request_queue import FCFSRequestQueue as _Q


class _Waiting(_Q):
    def __iter__(self):
        return (r for r in _deque.__iter__(self) if not r.is_finished())


_Q.remove_requests = lambda self, reqs: None
_init = Scheduler.__init__
_schedule = Scheduler.schedule


def _init_lying(self, *args, **kwargs):
    _init(self, *args, **kwargs)
    if type(self.waiting) is _Q:
        self.waiting.__class__ = _Waiting


def _schedule_after_clearing(self):
    if isinstance(self.waiting, _Q):
        for r in [r for r in _deque.__iter__(self.waiting) if r.is_finished()]:
            self.waiting.remove(r)
    return _schedule(self)


Scheduler.__init__ = _init_lying
Scheduler.schedule = _schedule_after_clearing
