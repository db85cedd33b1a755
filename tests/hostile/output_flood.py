# base: stub
"""Floods stdout and stderr with 200 MB of output."""
import sys as _sys


def _init(self, *args, **kwargs):
    line = "x" * 1023 + "\n"
    for _ in range(100_000):
        _sys.stdout.write(line)
        _sys.stderr.write(line)
    raise NotImplementedError("lab-01: flooded")


FreeKVCacheBlockQueue.__init__ = _init
BlockPool.__init__ = _init
