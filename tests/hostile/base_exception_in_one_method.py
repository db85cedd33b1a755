# base: solution
# honest: BlockPool.get_usage = lambda self: (_ for _ in ()).throw(ValueError("broken"))
"""Under-scoring: a KeyboardInterrupt in one method must cost the tests that call it, not
every test after it."""


def _get_usage(self):
    raise KeyboardInterrupt


BlockPool.get_usage = _get_usage
