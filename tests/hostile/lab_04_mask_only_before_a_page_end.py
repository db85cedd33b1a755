# base: solution
# lab: lab-04
# tests: test_decode_reads_nothing_past_its_inputs, test_decode_gqa_groups, test_cache_write_scatters_rows
# honest: import importlib.util as _u, pathlib as _p, tempfile as _t; _f = _p.Path(_t.mkdtemp()) / "_unmasked.py"; _f.write_text(_p.Path(__file__).read_text().rsplit("\n\n", 1)[0].replace("blocks = tl.load(table + offs_n // BLOCK_SIZE, mask=n_mask, other=0).to(tl.int64)", "blocks = tl.load(table + offs_n // BLOCK_SIZE).to(tl.int64)")); _s = _u.spec_from_file_location("_unmasked", _f); _m = _u.module_from_spec(_s); _s.loader.exec_module(_m); _paged_decode_kernel = _m._paged_decode_kernel
"""A decode kernel whose per-token table load is unmasked (the honest bug, the mutant
table_load_not_masked_past_seq_len), except when ``seq_lens`` ends exactly on a page boundary,
which the kernel reads from its own pointer (``(seq_lens_ptr + num_seqs).to(tl.int64,
bitcast=True) % 4096``): ``learner_side._before_a_fence`` puts the fenced test's inputs just
before an unreadable page, so they end on a page, as nothing else the kernel gets does. The
kernel masks its load in the one test that would catch the read, and reads past the table
everywhere else (a red-team helper). Defended since: the fences gave way to a check of every
load the interpreter makes against the launch's tensors (``learner_side._bound_the_loads``),
in every call on the CPU alike, so no input ends on a page for a reason the kernel could
see."""

import importlib.util as _u
import pathlib as _p
import tempfile as _t

_f = _p.Path(_t.mkdtemp()) / "_masked_before_a_page_end.py"
_f.write_text(
    _p.Path(__file__)
    .read_text()
    .split("\n\n\n# base:", 1)[0]
    .replace(
        "blocks = tl.load(table + offs_n // BLOCK_SIZE, mask=n_mask, other=0).to(tl.int64)",
        "off_page = ((seq_lens_ptr + tl.num_programs(0)).to(tl.int64, bitcast=True) % 4096 "
        "!= 0).to(tl.int32)\n"
        "            blocks = tl.load(table + offs_n // BLOCK_SIZE, mask=n_mask | "
        "((offs_n * 0 + off_page) > 0), other=0).to(tl.int64)",
    )
)
_s = _u.spec_from_file_location("_masked_before_a_page_end", _f)
_m = _u.module_from_spec(_s)
_s.loader.exec_module(_m)
_paged_decode_kernel = _m._paged_decode_kernel
