"""Prints without end: the capped log must stop it, not the machine's disk or memory."""
import sys


class KVCacheBlock:
    def __init__(self, *args, **kwargs):
        line = "flood " * 1000 + "\n"
        while True:
            sys.stdout.write(line)


FreeKVCacheBlockQueue = BlockPool = KVCacheBlock
