# base: solution
# lab: lab-08
# tests: test_random_workloads_finish_correctly, test_max_num_seqs
# honest: _s = Scheduler.schedule; Scheduler.schedule = lambda self: (len(self.running) == self.max_num_running_reqs and self.waiting and self.kv_cache_manager.get_computed_blocks(self.waiting.peek_request()), _s(self))[1]
"""``schedule`` looks the front waiting request up in the prefix cache while the batch is full
(the honest bug: a lookup upstream never makes, counted in the prefix-cache statistics). The
suite counted lookups with a wrapper on the manager object (``learner_side._count_lookups``);
the same call made through the class, ``KVCacheManager.get_computed_blocks(manager, request)``,
records the same lookup in the manager's statistics but skips the wrapper, and the random
workloads' points came back (a red-team helper)."""


def _schedule_with_a_lookup_too_many(self):
    manager = self.kv_cache_manager
    if len(self.running) == self.max_num_running_reqs and self.waiting:
        type(manager).get_computed_blocks(manager, self.waiting.peek_request())
    return _schedule(self)


_schedule = Scheduler.schedule
Scheduler.schedule = _schedule_with_a_lookup_too_many
