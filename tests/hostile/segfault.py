# base: stub
"""Crashes the interpreter (SIGSEGV) in a test."""
import ctypes as _ctypes


def _init(self, *args, **kwargs):
    _ctypes.string_at(0)


FreeKVCacheBlockQueue.__init__ = _init
BlockPool.__init__ = _init
