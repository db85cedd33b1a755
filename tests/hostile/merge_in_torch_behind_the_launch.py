# base: solution
# lab: lab-04
# tests: test_decode_large_logits_fp16, test_cache_write_scatters_rows
# honest: import importlib.util as _u, pathlib as _p, tempfile as _t; _f = _p.Path(_t.mkdtemp()) / "_merge.py"; _f.write_text(_p.Path(__file__).read_text().rsplit("\n\n", 1)[0].replace("lse_max = tl.max(lse, 0)\n", 'lse_max = tl.max(tl.where(offs_s == 0, lse, float("-inf")), 0)\n')); _s = _u.spec_from_file_location("_merge", _f); _m = _u.module_from_spec(_s); _s.loader.exec_module(_m); _merge_splits_kernel = _m._merge_splits_kernel
# not defended: the launch of a @triton.jit function runs in the learner process, whose Python (triton's own launch included) the submission can rewrite: the course's launchers run its kernels, but a kernel's launch patched to compute in torch is not told from a kernel (docs/grader.md, "What the learner process reports about itself")
"""A merge kernel that shifts every weight by the first split's lse instead of the largest (the
honest bug, the mutant merge_max_of_the_first_split: a later split hundreds higher overflows),
and Triton's launch of it (``JITFunction.run``, or the interpreter's) patched to merge in torch
instead: the course's launchers call the learner's kernels, never its launchers
(launchers_without_the_kernels), but what a kernel's launch runs is the learner process's own
Python. The kernel's points come with a merge that is no kernel (a red-team helper)."""
import importlib.util as _u, pathlib as _p, tempfile as _t  # noqa: E401, I001

_f = _p.Path(_t.mkdtemp()) / "_merge.py"
_f.write_text(
    _p.Path(__file__).read_text().split("\n\n\n# base:", 1)[0]
    .replace("lse_max = tl.max(lse, 0)\n", 'lse_max = tl.max(tl.where(offs_s == 0, lse, float("-inf")), 0)\n')
)
_s = _u.spec_from_file_location("_merge", _f)
_m = _u.module_from_spec(_s)
_s.loader.exec_module(_m)
_merge_splits_kernel = _m._merge_splits_kernel

_K = type(_merge_splits_kernel)
_run = _K.run


def _merge_in_torch(self, *args, grid, warmup, **kwargs):
    if self is not _merge_splits_kernel:
        return _run(self, *args, grid=grid, warmup=warmup, **kwargs)
    partial, lse, out = args[0], args[1], args[2]
    weights = torch.softmax(lse.double(), dim=-1)[..., None]  # an empty split's -inf weighs 0
    out.copy_((weights * partial.double()).sum(2).to(out.dtype))
    return None


_K.run = _merge_in_torch
