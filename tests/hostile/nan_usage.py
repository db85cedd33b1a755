# base: solution
# lab: lab-07
# tests: test_random_workload, test_usage, test_get_block_ids
# honest: KVCacheManager.usage = property(lambda self: self.block_pool.get_usage() + 0.5)
"""A NaN compares false with everything: a check written ``abs(got - want) > tol`` (fail if
too far) lets NaN through, where ``close_to`` (within tolerance, else fail) does not. Here usage
is wrong (NaN always); its honest twin is wrong by 0.5."""
KVCacheManager.usage = property(lambda self: float("nan"))
