# base: solution
# tests: test_null_block_is_reserved, test_usage, test_reused_block_loses_its_stale_hash, test_double_free_is_an_error
# honest: BlockPool.get_usage = lambda self: (_ for _ in ()).throw(ValueError("broken"))
"""Under-scoring: an exception whose str() raises must fail one test, not end the session."""


class _Unprintable(Exception):
    def __str__(self):
        raise KeyboardInterrupt

    __repr__ = __str__


def _get_usage(self):
    raise _Unprintable()


BlockPool.get_usage = _get_usage
