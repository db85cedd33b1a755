"""Dereferences a null pointer whenever a block is made: the test process dies of SIGSEGV."""
import ctypes


def _crash():
    ctypes.string_at(0)


class KVCacheBlock:
    def __init__(self, *args, **kwargs):
        _crash()


class FreeKVCacheBlockQueue:
    def __init__(self, blocks):
        _crash()


class BlockPool:
    def __init__(self, *args, **kwargs):
        _crash()
