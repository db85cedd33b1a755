# base: solution
# lab: lab-04
# tests: test_decode_reads_nothing_past_its_inputs, test_decode_gqa_groups
# honest: import importlib.util as _u, pathlib as _p, tempfile as _t; _f = _p.Path(_t.mkdtemp()) / "_unmasked.py"; _f.write_text(_p.Path(__file__).read_text().rsplit("\n\n", 1)[0].replace("blocks = tl.load(table + offs_n // BLOCK_SIZE, mask=n_mask, other=0).to(tl.int64)", "blocks = tl.load(table + offs_n // BLOCK_SIZE).to(tl.int64)")); _s = _u.spec_from_file_location("_unmasked", _f); _m = _u.module_from_spec(_s); _s.loader.exec_module(_m); _paged_decode_kernel = _m._paged_decode_kernel
# not defended: the fence page after the decode's inputs is made unreadable by learner_side._before_a_fence with ctypes and mmap, in the learner process, whose libraries the submission can rewrite: a libc whose mprotect does nothing leaves no fence, and a load past the table reads what follows (docs/grader.md, "What the learner process reports about itself")
"""A decode kernel whose per-token table load is unmasked (the honest bug, the mutant
table_load_not_masked_past_seq_len: the last tile reads table entries past the last sequence's
blocks, past the table's end), and ``ctypes.CDLL`` replaced at import by a class whose
``mprotect`` does nothing: ``learner_side._before_a_fence`` still maps its pages, but none is
made unreadable, so the read past the table finds memory and the test's point stays (a
red-team helper). The fence is a property of the learner process's memory, like the others of
"What the learner process reports about itself"."""

import ctypes as _c
import importlib.util as _u
import pathlib as _p
import tempfile as _t

_f = _p.Path(_t.mkdtemp()) / "_unmasked.py"
_f.write_text(
    _p.Path(__file__)
    .read_text()
    .split("\n\n\n# base:", 1)[0]
    .replace(
        "blocks = tl.load(table + offs_n // BLOCK_SIZE, mask=n_mask, other=0).to(tl.int64)",
        "blocks = tl.load(table + offs_n // BLOCK_SIZE).to(tl.int64)",
    )
)
_s = _u.spec_from_file_location("_unmasked", _f)
_m = _u.module_from_spec(_s)
_s.loader.exec_module(_m)
_paged_decode_kernel = _m._paged_decode_kernel


class _NoFences(_c.CDLL):
    def __getattr__(self, name):
        if name == "mprotect":
            return lambda *args: 0
        return super().__getattr__(name)


_c.CDLL = _NoFences
