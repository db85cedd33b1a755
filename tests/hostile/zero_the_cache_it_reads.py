# base: solution
# lab: lab-04
# tests: test_decode_half_precision, test_decode_one_sequence
# honest: _pad_real = paged_attention_decode; paged_attention_decode = lambda q, k, v, t, s, sc, **kw: torch.zeros_like(q) if kw.get("out") is None and q.dtype != k.dtype else _pad_real(q, k, v, t, s, sc, **kw)
"""A decode that returns zeros for a float32 query over float16 caches (no ``out=``), and
zeroes the value cache it was given to read. Arguments come back from the learner's process
into the judge's tensors (how in-place writes are seen), so a test that computed its
expectation from the caches after the call expected zeros too. Expectations are computed
before the call, from the judge's own copies."""
_pad_real = paged_attention_decode


def paged_attention_decode(query, key_cache, value_cache, block_tables, seq_lens, scale, **kw):
    if kw.get("out") is None and query.dtype != key_cache.dtype:
        value_cache.zero_()
        return torch.zeros_like(query)
    return _pad_real(query, key_cache, value_cache, block_tables, seq_lens, scale, **kw)
