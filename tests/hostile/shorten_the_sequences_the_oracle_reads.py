# base: solution
# lab: lab-04
# tests: test_decode_large_logits_fp16, test_cache_write_scatters_rows
# honest: import importlib.util as _u, pathlib as _p, tempfile as _t; _f = _p.Path(_t.mkdtemp()) / "_merge.py"; _f.write_text(_p.Path(__file__).read_text().rsplit("\n\n", 1)[0].replace("lse_max = tl.max(lse, 0)\n", 'lse_max = tl.max(tl.where(offs_s == 0, lse, float("-inf")), 0)\n')); _s = _u.spec_from_file_location("_merge", _f); _m = _u.module_from_spec(_s); _s.loader.exec_module(_m); _merge_splits_kernel = _m._merge_splits_kernel
"""A merge that shifts every weight by the first split's lse instead of the largest (the honest
bug, tests/buggy/lab_04.py's merge_max_of_the_first_split: a later split hundreds higher
overflows). The suite's run_decode sends the case's block tables and sequence lengths as
tensors that share memory with the judge's numpy arrays (torch.from_numpy(...).to("cpu") is no
copy), every argument comes back into the judge's after the call, and the next run_decode of
the same case computes its expected output from those arrays. So a decode kernel whose last
program stores 1 into every sequence length (after every program has read its own) makes the
test's second call, three splits, a one-token decode for the oracle and the kernel alike: one
non-empty split, which any merge gets right (2/2 for an honest 0/2). The grader now copies
back only the arguments a call marks as outputs (``writes``) and fails a call that changed any
other: the lengths stay the judge's, and the store itself fails the test. (Every decode test
this kernel runs in now fails on that store, so only the attacked test and a cache-write test
are graded here.)"""
import importlib.util as _u, pathlib as _p, tempfile as _t  # noqa: E401, I001

_LAST = """tl.store(lse_ptrs, lse, mask=g_mask)
    last = (seq == tl.num_programs(0) - 1) & (kv_head == tl.num_programs(1) - 1)
    if last & (split == tl.num_programs(2) - 1):
        every = tl.arange(0, 64)
        tl.store(seq_lens_ptr + every, tl.zeros([64], dtype=tl.int32) + 1, mask=every < tl.num_programs(0))
"""
_f = _p.Path(_t.mkdtemp()) / "_merge.py"
_f.write_text(
    _p.Path(__file__).read_text().split("\n\n\n# base:", 1)[0]
    .replace("lse_max = tl.max(lse, 0)\n", 'lse_max = tl.max(tl.where(offs_s == 0, lse, float("-inf")), 0)\n')
    .replace("tl.store(lse_ptrs, lse, mask=g_mask)\n", _LAST)
)
_s = _u.spec_from_file_location("_merge", _f)
_m = _u.module_from_spec(_s)
_s.loader.exec_module(_m)
_merge_splits_kernel = _m._merge_splits_kernel
_paged_decode_kernel = _m._paged_decode_kernel
