"""Imports fine; every method spins forever."""


class KVCacheBlock:
    def __init__(self, *args, **kwargs):
        while True:
            pass


class FreeKVCacheBlockQueue:
    def __init__(self, blocks):
        while True:
            pass


class BlockPool:
    def __init__(self, *args, **kwargs):
        while True:
            pass
