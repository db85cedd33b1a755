# base: solution
# lab: lab-04
# tests: test_decode_half_precision, test_decode_one_sequence
# honest: _K = type(_paged_decode_kernel); _run = _K.run; _K.run = lambda self, *a, grid, warmup, **kw: (a[5].zero_(), None)[1] if self is _paged_decode_kernel and a[5] is a[6] and a[5].dtype != a[1].dtype else _run(self, *a, grid=grid, warmup=warmup, **kw)
"""A decode kernel that, for a float32 query over float16 caches, writes zeros and zeroes the
value cache it was given to read (Triton's own launch is patched: the course's launchers run
the learner's kernels, not the learner's launchers). Arguments come back from the learner's
process into the judge's tensors (how in-place writes are seen), so a test that computed its
expectation from the caches after the call expected zeros too. Expectations are computed
before the call, from the judge's own copies."""
_K = type(_paged_decode_kernel)
_run = _K.run


def _zeroing_run(self, *args, grid, warmup, **kwargs):
    key_cache, value_cache, out = args[1], args[2], args[5]
    # One split (the output passed twice) into a float32 output: the launcher cast the float32
    # query to the caches' float16, and the output keeps the query's dtype.
    if self is _paged_decode_kernel and out is args[6] and out.dtype != key_cache.dtype:
        value_cache.zero_()
        out.zero_()
        return None
    return _run(self, *args, grid=grid, warmup=warmup, **kwargs)


_K.run = _zeroing_run
