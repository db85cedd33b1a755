# base: solution
# lab: lab-04
# tests: test_decode_reads_nothing_past_its_inputs, test_decode_gqa_groups, test_cache_write_scatters_rows
# honest: import importlib.util as _u, pathlib as _p, tempfile as _t; _f = _p.Path(_t.mkdtemp()) / "_unmasked.py"; _f.write_text(_p.Path(__file__).read_text().rsplit("\n\n", 1)[0].replace("blocks = tl.load(table + offs_n // BLOCK_SIZE, mask=n_mask, other=0).to(tl.int64)", "blocks = tl.load(table + offs_n // BLOCK_SIZE).to(tl.int64)")); _s = _u.spec_from_file_location("_unmasked", _f); _m = _u.module_from_spec(_s); _s.loader.exec_module(_m); _paged_decode_kernel = _m._paged_decode_kernel
"""A decode kernel whose per-token table load is unmasked (the honest bug, the mutant
table_load_not_masked_past_seq_len), made by calling a Python function of the file from the
kernel's body: in Triton's interpreter a kernel is Python, and ``_peek`` reads the int32 at
each address of the pointer block with ``ctypes``, no load at all, so
``learner_side._bound_the_loads``, which checks the interpreter's loads, never saw it read past
the last sequence's table entries: 31/31 for an honest 17/31 (a red-team helper). No compiler
lets a kernel call Python. Defended since: at every launch the interpreter's kernel (the
bytecode that runs) may name only Triton, other ``@triton.jit`` functions, its arguments and
constants (``learner_side._only_triton``); the kernel is refused at every launch, here where
the honest bug's read is refused too."""

import ctypes as _ctypes
import importlib.util as _u
import pathlib as _p
import tempfile as _t

import numpy as _np


def _peek(ptrs):
    """The int32s at the addresses ``ptrs`` holds, read in Python."""
    from triton.runtime.interpreter import TensorHandle

    addrs = _np.asarray(ptrs.handle.data).astype(_np.uint64)
    vals = _np.array([_ctypes.c_int32.from_address(int(a)).value for a in addrs.ravel()])
    block = tl.block_type(tl.int32, list(addrs.shape))
    return tl.core.tensor(
        TensorHandle(vals.astype(_np.int32).reshape(addrs.shape), tl.int32), block
    )


_f = _p.Path(_t.mkdtemp()) / "_table_read_in_python.py"
_f.write_text(
    _p.Path(__file__)
    .read_text()
    .split("\n\n\n# base:", 1)[0]
    .replace(
        "blocks = tl.load(table + offs_n // BLOCK_SIZE, mask=n_mask, other=0).to(tl.int64)",
        "blocks = _peek(table + offs_n // BLOCK_SIZE).to(tl.int64)",
    )
)
_s = _u.spec_from_file_location("_table_read_in_python", _f)
_m = _u.module_from_spec(_s)
_m._peek = _peek
_s.loader.exec_module(_m)
_paged_decode_kernel = _m._paged_decode_kernel
