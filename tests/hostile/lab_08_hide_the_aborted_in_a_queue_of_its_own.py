# base: solution
# lab: lab-08
# tests: test_finish_requests_aborts, test_random_traces_with_aborts_match_the_reference, test_eos_stops
# honest: from mini_vllm.core.sched.request_queue import FCFSRequestQueue as _Q; _Q.remove_requests = lambda self, reqs: None; _s = Scheduler.schedule; Scheduler.schedule = lambda self: ([self.waiting.remove(r) for r in [r for r in self.waiting if r.is_finished()]] if isinstance(self.waiting, _Q) else None, _s(self))[1]
"""An abort leaves a waiting request in the waiting queue (the honest bug: ``finish_requests``
takes nothing out of an FCFS queue, and the next ``schedule`` clears the finished ones first),
with the scheduler's queue replaced by a class of the submission's own, neither a ``deque`` nor
a ``PriorityRequestQueue``, whose ``__iter__`` leaves finished requests out while ``len`` and
``bool`` still count them: ``learner_side._plain`` reads a ``deque`` by ``deque``'s own
iteration and a priority queue by ``PriorityRequestQueue``'s, "anything else by its own"
(a red-team helper): 7/12 for an honest 4/12 on the tests attacked. Now anything else is read
as the name of its type, which no test takes for a right answer (the queue of its own then
also loses ``test_abort_between_schedule_and_update``, which the honest bug passes: left out
of the tests compared)."""

from collections import deque as _deque


class _Waiting:
    def __init__(self, items=()):
        self._items = _deque(items)

    def add_request(self, request):
        self._items.append(request)

    def pop_request(self):
        return self._items.popleft()

    def peek_request(self):
        return self._items[0]

    def prepend_request(self, request):
        self._items.appendleft(request)

    def prepend_requests(self, requests):
        self._items.extendleft(requests)

    def remove_request(self, request):
        self._items.remove(request)

    def remove(self, request):
        self._items.remove(request)

    def remove_requests(self, requests):
        pass  # the honest bug: an aborted waiting request stays

    def __len__(self):
        return len(self._items)

    def __bool__(self):
        return bool(self._items)

    def __iter__(self):
        return (r for r in self._items if not r.is_finished())


_init = Scheduler.__init__
_schedule = Scheduler.schedule


def _init_lying(self, *args, **kwargs):
    _init(self, *args, **kwargs)
    if isinstance(self.waiting, _deque):
        self.waiting = _Waiting(self.waiting)


def _schedule_after_clearing(self):
    if isinstance(self.waiting, _Waiting):
        for r in [r for r in self.waiting._items if r.is_finished()]:
            self.waiting.remove(r)
    return _schedule(self)


Scheduler.__init__ = _init_lying
Scheduler.schedule = _schedule_after_clearing
