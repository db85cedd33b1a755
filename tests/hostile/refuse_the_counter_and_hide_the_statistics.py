# base: solution
# lab: lab-08
# tests: test_random_workloads_finish_correctly, test_eos_stops
# honest: _s = Scheduler.schedule; Scheduler.schedule = lambda self: (len(self.running) == self.max_num_running_reqs and self.waiting and self.kv_cache_manager.get_computed_blocks(self.waiting.peek_request()), _s(self))[1]
"""``schedule`` looks the front waiting request up in the prefix cache while the batch is full
(the honest bug, as in ``look_up_through_the_class``). The suite compared the lookups and the
statistics only for a manager that took the counting wrapper and had a ``prefix_cache_stats``
when it was built, an exemption meant for a chained lab-07 manager that keeps them otherwise;
but the manager's class is in the learner process, and a scheduler that patched it at import
(a ``__setattr__`` that refuses the wrapper, an ``__init__`` that leaves the statistics to be
made later) switched both checks off and kept the workloads' points with the bug in place (a
red-team helper). The course's ``KVCacheManager`` (the reference, or a lab-07 file whose given
``__init__`` is kept) always takes both, so a manager without them now fails."""

import mini_vllm.core.kv_cache_manager as _managers

_Manager = _managers.KVCacheManager
_manager_init = _Manager.__init__


def _no_wrapper(self, name, value):
    if name == "get_computed_blocks":
        raise AttributeError("a manager with __slots__")
    object.__setattr__(self, name, value)


def _init_without_statistics(self, *args, **kwargs):
    _manager_init(self, *args, **kwargs)
    self._kept_statistics, self.prefix_cache_stats = self.prefix_cache_stats, None


_Manager.__setattr__ = _no_wrapper
_Manager.__init__ = _init_without_statistics
_schedule = Scheduler.schedule
_scheduler_init = Scheduler.__init__


def _init_with_the_statistics_back(self, kv_cache_manager, *args, **kwargs):
    kept = getattr(kv_cache_manager, "_kept_statistics", None)
    if kept is not None:
        kv_cache_manager.prefix_cache_stats = kept
    _scheduler_init(self, kv_cache_manager, *args, **kwargs)


def _schedule_with_a_lookup_too_many(self):
    if len(self.running) == self.max_num_running_reqs and self.waiting:
        self.kv_cache_manager.get_computed_blocks(self.waiting.peek_request())
    return _schedule(self)


Scheduler.__init__ = _init_with_the_statistics_back
Scheduler.schedule = _schedule_with_a_lookup_too_many
