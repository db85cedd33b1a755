# base: solution
# lab: lab-04
# tests: test_decode_large_logits_fp16, test_cache_write_scatters_rows
# honest: import importlib.util as _u, pathlib as _p, tempfile as _t; _f = _p.Path(_t.mkdtemp()) / "_merge.py"; _f.write_text(_p.Path(__file__).read_text().rsplit("\n\n", 1)[0].replace("lse_max = tl.max(lse, 0)\n", 'lse_max = tl.max(tl.where(offs_s == 0, lse, float("-inf")), 0)\n')); _s = _u.spec_from_file_location("_merge", _f); _m = _u.module_from_spec(_s); _s.loader.exec_module(_m); _merge_splits_kernel = _m._merge_splits_kernel
"""A merge kernel that shifts every weight by the first split's lse instead of the largest (the
honest bug, the mutant merge_max_of_the_first_split), whose own ``run`` is replaced by one
that merges in torch: an attribute of the kernel object, the learner's own, set at import,
where ``merge_in_torch_behind_the_launch`` patches Triton's class (not defended). ``kernel[grid]``
calls ``self.run``, so the instance's attribute ran instead of the interpreter or the
compiler, and the kernel kept its points with the bug in place (a red-team helper). Defended
since: a kernel whose object holds anything but what ``@triton.jit`` gave it (its attributes'
names, and no callable but its function) is refused at each of its launches
(``learner_side._course_launchers``, at every call)."""

import importlib.util as _u
import pathlib as _p
import tempfile as _t

_f = _p.Path(_t.mkdtemp()) / "_merge_own_run.py"
_f.write_text(
    _p.Path(__file__)
    .read_text()
    .split("\n\n\n# base:", 1)[0]
    .replace(
        "lse_max = tl.max(lse, 0)\n",
        'lse_max = tl.max(tl.where(offs_s == 0, lse, float("-inf")), 0)\n',
    )
)
_s = _u.spec_from_file_location("_merge_own_run", _f)
_m = _u.module_from_spec(_s)
_s.loader.exec_module(_m)
_merge_splits_kernel = _m._merge_splits_kernel


def _merge_in_torch(*args, grid, warmup, **kwargs):
    partial, lse, out = args[0], args[1], args[2]
    weights = torch.softmax(lse.double(), dim=-1)[..., None]  # an empty split's -inf weighs 0
    out.copy_((weights * partial.double()).sum(2).to(out.dtype))


_merge_splits_kernel.run = _merge_in_torch
