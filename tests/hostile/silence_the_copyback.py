# base: solution
# lab: lab-06
# tests: test_decode_single_sequence_equals_dense, test_slot_mapping_worked_example
# honest: _pad = paged_attention_decode; paged_attention_decode = lambda q, kc, vc, t, s, sc, *a, **k: (q.__imul__(q.dtype.type(sc)) if isinstance(q, np.ndarray) and q.flags.writeable and q.dtype.kind == "f" else None, _pad(q, kc, vc, t, s, 1.0 if isinstance(q, np.ndarray) and q.flags.writeable and q.dtype.kind == "f" else sc, *a, **k))[1]
# not defended: learner-process self-report (docs/grader.md, "What the learner process reports about itself")
"""The decode scales the caller's query in place (the honest bug), and the learner host, in the
same process, is patched to send back the arguments of nothing but the cache writes, so the
judge's check that a call leaves its arguments alone sees no change."""
_pad = paged_attention_decode


def paged_attention_decode(query, key_cache, value_cache, block_tables, seq_lens, scale, *a, **k):
    if isinstance(query, np.ndarray) and query.flags.writeable and query.dtype.kind == "f":
        query *= query.dtype.type(scale)
        return _pad(query, key_cache, value_cache, block_tables, seq_lens, 1.0, *a, **k)
    return _pad(query, key_cache, value_cache, block_tables, seq_lens, scale, *a, **k)


import sys as _sys  # noqa: E402

for _m in list(_sys.modules.values()):
    if hasattr(_m, "Host") and hasattr(_m, "wire") and hasattr(_m, "serve"):

        def _is_array(value, _orig=_m.wire.is_array):
            f = _sys._getframe(1)
            while f is not None and f.f_code.co_name != "handle":
                f = f.f_back
            target = f.f_locals.get("target") if f is not None else None
            if getattr(target, "__name__", "") not in ("reshape_and_cache", "write_interleaved"):
                return False
            return _orig(value)

        _m.wire.is_array = _is_array
