# base: solution
# lab: lab-04
# tests: test_decode_reads_nothing_past_its_inputs, test_decode_gqa_groups, test_cache_write_scatters_rows
# honest: import importlib.util as _u, pathlib as _p, tempfile as _t; _f = _p.Path(_t.mkdtemp()) / "_unmasked.py"; _f.write_text(_p.Path(__file__).read_text().rsplit("\n\n", 1)[0].replace("blocks = tl.load(table + offs_n // BLOCK_SIZE, mask=n_mask, other=0).to(tl.int64)", "blocks = tl.load(table + offs_n // BLOCK_SIZE).to(tl.int64)")); _s = _u.spec_from_file_location("_unmasked", _f); _m = _u.module_from_spec(_s); _s.loader.exec_module(_m); _paged_decode_kernel = _m._paged_decode_kernel
"""A decode kernel whose per-token table load is unmasked (the honest bug, the mutant
table_load_not_masked_past_seq_len), written as ``tl.atomic_add(ptrs, 0)``: an atomic returns
the memory it changes, so adding 0 is a load, one that went through the interpreter's
``create_atomic_rmw`` instead of ``create_masked_load``, the only read that
``learner_side._bound_the_loads`` checked. It read past the last sequence's table entries
unchecked, and 31/31 for an honest 17/31 (a red-team helper). Defended since: the atomics are
checked like a load."""

import importlib.util as _u
import pathlib as _p
import tempfile as _t

_f = _p.Path(_t.mkdtemp()) / "_table_read_by_an_atomic.py"
_f.write_text(
    _p.Path(__file__)
    .read_text()
    .split("\n\n\n# base:", 1)[0]
    .replace(
        "blocks = tl.load(table + offs_n // BLOCK_SIZE, mask=n_mask, other=0).to(tl.int64)",
        "blocks = tl.atomic_add(table + offs_n // BLOCK_SIZE, 0).to(tl.int64)",
    )
)
_s = _u.spec_from_file_location("_table_read_by_an_atomic", _f)
_m = _u.module_from_spec(_s)
_s.loader.exec_module(_m)
_paged_decode_kernel = _m._paged_decode_kernel
