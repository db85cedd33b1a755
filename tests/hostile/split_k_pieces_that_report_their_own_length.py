# base: solution
# lab: lab-06
# tests: test_split_k_decode_equals_dense, test_split_k_decode_float32
# honest: paged_attention_decode_split_k = lambda query, key_cache, value_cache, block_tables, seq_lens, scale, num_splits: paged_attention_decode(query, key_cache, value_cache, block_tables, seq_lens, scale)
"""A split-K decode that is a dense decode (the honest bug: the output alone cannot tell, so
only the pieces ``learner_side.split_k_pieces`` records catch it), which also calls
``attend_split`` once per expected range on a one-row key of its own, an ``ndarray`` subclass
whose ``__len__`` gives that range's size. The helper recorded ``len(key)``: the learner's
object answered for itself, and the dense decode kept the test's 3 points. A helper reads
what it reports through the library's own code (``np.ndarray.__len__``, ``np.shape``),
never through a method the learner's object may override."""
import numpy as _np


class _Sized(_np.ndarray):
    told = 0

    def __len__(self):
        return self.told


def paged_attention_decode_split_k(
    query, key_cache, value_cache, block_tables, seq_lens, scale, num_splits
):
    out = paged_attention_decode(query, key_cache, value_cache, block_tables, seq_lens, scale)
    num_kv_heads, head_dim = key_cache.shape[2], key_cache.shape[3]
    pieces = []
    for i, n in enumerate(_np.asarray(seq_lens).tolist()):
        per = -(-n // int(num_splits))
        for j in range(int(num_splits)):
            size = min(per, n - j * per)
            if size > 0:
                row = _np.zeros((1, num_kv_heads, head_dim), dtype=_np.float32).view(_Sized)
                row.told = size
                pieces.append(attend_split(query[i], row, row, scale))
    if pieces:
        merge_splits(_np.stack([p for p, _ in pieces[:1]]), _np.stack([m for _, m in pieces[:1]]))
    return out
