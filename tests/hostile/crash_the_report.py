# base: stub
"""Tries to crash the grader's report: rich markup, control characters, a huge message, a
value nested thousands of levels deep, and a message whose __str__ raises."""
_MARKUP = "[bold green]PASS[/] [link=file:///etc/passwd]x[/link] [/] \x1b[2J\x00 " * 40


class _Evil(Exception):
    def __str__(self):
        raise RuntimeError("no message for you")


def _deep():
    value = []
    for _ in range(5000):
        value = [value]
    return value


def _init_queue(self, blocks):
    raise NotImplementedError(_MARKUP * 20)


def _init_pool(self, *args, **kwargs):
    raise _Evil()


FreeKVCacheBlockQueue.__init__ = _init_queue
BlockPool.__init__ = _init_pool
KVCacheBlock.__repr__ = lambda self: _MARKUP
KVCacheBlock.deep = property(lambda self: _deep())
