# base: solution
# honest: BlockPool.get_usage = lambda self: (_ for _ in ()).throw(ValueError("broken"))
"""Under-scoring: an exception whose str() raises must fail one test, not end the session."""


class _Unprintable(Exception):
    def __str__(self):
        raise KeyboardInterrupt

    __repr__ = __str__


def _get_usage(self):
    raise _Unprintable()


BlockPool.get_usage = _get_usage
