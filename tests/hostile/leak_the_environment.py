# base: stub
"""Reads the environment and files it should not, and reports them in its messages."""
import os as _os

_SEEN = " ".join(f"{k}={v}" for k, v in sorted(_os.environ.items()))


def _init_queue(self, blocks):
    raise NotImplementedError(f"lab-01: env: {_SEEN}")


FreeKVCacheBlockQueue.__init__ = _init_queue
