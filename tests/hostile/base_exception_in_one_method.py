# base: solution
# tests: test_null_block_is_reserved, test_usage, test_reused_block_loses_its_stale_hash, test_double_free_is_an_error
# honest: BlockPool.get_usage = lambda self: (_ for _ in ()).throw(ValueError("broken"))
"""Under-scoring: a KeyboardInterrupt in one method must cost the tests that call it, not
every test after it."""


def _get_usage(self):
    raise KeyboardInterrupt


BlockPool.get_usage = _get_usage
