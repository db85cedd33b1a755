# base: solution
# lab: lab-04
# tests: test_decode_large_logits_fp16, test_cache_write_scatters_rows
# honest: import importlib.util as _u, pathlib as _p, tempfile as _t; _f = _p.Path(_t.mkdtemp()) / "_merge.py"; _f.write_text(_p.Path(__file__).read_text().rsplit("\n\n", 1)[0].replace("lse_max = tl.max(lse, 0)\n", 'lse_max = tl.max(tl.where(offs_s == 0, lse, float("-inf")), 0)\n')); _s = _u.spec_from_file_location("_merge", _f); _m = _u.module_from_spec(_s); _s.loader.exec_module(_m); _merge_splits_kernel = _m._merge_splits_kernel
"""A merge kernel that shifts every weight by the first split's lse instead of the largest (the
honest bug, the mutant merge_max_of_the_first_split: a later split hundreds higher overflows),
with a pre-run hook on the kernel (``add_pre_run_hook``, Triton's public API: nothing patched)
that sorts each row's splits, partial outputs and lse alike, largest lse first, before the
kernel runs: the merge does not depend on the splits' order, and the first split's lse is then
the largest, so the buggy kernel merged right: 5/5 for an honest 3/5 on the tests attacked (a
red-team helper). Defended since: each launch of a kernel that has pre-run hooks is refused
(``learner_side._course_launchers`` looks at every call, on a GPU too, and the interpreter's
launch at every launch)."""

import importlib.util as _u
import pathlib as _p
import tempfile as _t

_f = _p.Path(_t.mkdtemp()) / "_merge_first_split.py"
_f.write_text(
    _p.Path(__file__)
    .read_text()
    .split("\n\n\n# base:", 1)[0]
    .replace(
        "lse_max = tl.max(lse, 0)\n",
        'lse_max = tl.max(tl.where(offs_s == 0, lse, float("-inf")), 0)\n',
    )
)
_s = _u.spec_from_file_location("_merge_first_split", _f)
_m = _u.module_from_spec(_s)
_s.loader.exec_module(_m)
_merge_splits_kernel = _m._merge_splits_kernel


def _largest_first(partial, lse, *args, **kwargs):
    order = torch.argsort(lse, dim=-1, descending=True)
    lse.copy_(torch.gather(lse, -1, order))
    partial.copy_(torch.gather(partial, 2, order[..., None].expand_as(partial)))


_merge_splits_kernel.add_pre_run_hook(_largest_first)
