"""lab-09, part 1: one scheduler step flattened, checked tensor by tensor on hand-made batches.

The main batch mixes everything a step can hold, with ``block_size = 4``:

| req | known tokens | computed | scheduled | what it is | block ids |
|---|---|---|---|---|---|
| A | 100..109 (10) | 8 | 2 | a prompt whose first two blocks were prefix-cache hits | 11 12 13 |
| B | 200..211 (12) | 0 | 5 | the first chunk of a long prompt | 21 22 |
| C | 300..309 (10) | 5 | 5 | the second chunk of a chunked prompt | 31 32 33 |
| D | 400..407 (8) | 7 | 1 | a decode: 407 is the token sampled last step | 41 42 |
| E | 500..508 (9) | 8 | 1 | a decode whose token opens a new block | 51 52 53 |

Every expected tensor is written out below from the rules, never computed by the reference.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from grading.suite import graded, learner_module
from tests.labs.common import (
    GRADED_SETTINGS,
    assert_cost_does_not_grow,
    assert_value_error,
    best_time,
    describe,
    exception_name,
    judge_seconds,
    timed_call,
)
from tests.labs.lab_09.learner_side import TENSOR_FIELDS
from tests.labs.lab_09.support import runner

DOC = "phases/05-end-to-end/README.md"
BLOCK_SIZE = 4
TOKENS = [
    list(range(100, 110)),
    list(range(200, 212)),
    list(range(300, 310)),
    list(range(400, 408)),
    list(range(500, 509)),
]
COMPUTED = [8, 0, 5, 7, 8]
SCHEDULED = [2, 5, 5, 1, 1]
BLOCK_IDS = [[11, 12, 13], [21, 22], [31, 32, 33], [41, 42], [51, 52, 53]]


def mixed_batch(**kwargs: Any) -> Any:
    """The mixed batch (the lists themselves: the learner process gets copies of them)."""
    return runner("prepare_inputs").prepare_inputs(
        TOKENS, COMPUTED, SCHEDULED, BLOCK_IDS, BLOCK_SIZE, **kwargs
    )


def as_list(tensor: Any) -> list:
    return tensor.tolist() if hasattr(tensor, "tolist") else list(tensor)


def expect(inputs: Any, name: str, want: Any, setting: str) -> None:
    """``inputs.<name>`` (as a list, for a tensor) equals ``want``; the message says which."""
    value = getattr(inputs, name)
    got = value if isinstance(want, int) else as_list(value)
    assert got == want, f"{setting}: {name} should be {want}, got {got}"


# -- the helpers --------------------------------------------------------------------------------


@graded(
    2,
    "_get_cumsum_and_arange: [2, 5, 3] -> cumsum [2, 7, 10] and offsets "
    "[0, 1, 0, 1, 2, 3, 4, 0, 1, 2], each token's index inside its own request",
    f"{DOC}#tokens-and-positions",
)
def test_get_cumsum_and_arange():
    """The building block of positions and query_start_loc."""
    m = runner("_get_cumsum_and_arange")
    for counts, cumsum, arange in [
        ([2, 5, 3], [2, 7, 10], [0, 1, 0, 1, 2, 3, 4, 0, 1, 2]),
        ([1, 1, 1], [1, 2, 3], [0, 0, 0]),
        ([4], [4], [0, 1, 2, 3]),
        ([1, 3], [1, 4], [0, 0, 1, 2]),
    ]:
        got_cumsum, got_arange = m._get_cumsum_and_arange(np.array(counts))
        assert as_list(got_cumsum) == cumsum, (
            f"_get_cumsum_and_arange({counts}): cumulative counts should be {cumsum}, got "
            f"{as_list(got_cumsum)}"
        )
        assert as_list(got_arange) == arange, (
            f"_get_cumsum_and_arange({counts}): offsets should be {arange}, got "
            f"{as_list(got_arange)}"
        )
    # A long prompt in one step: a step holds any number of tokens, so no fixed-size table of
    # offsets made once at import (np.arange(total) at each call).
    counts = [70_000, 2]
    try:
        got_cumsum, got_arange = m._get_cumsum_and_arange(np.array(counts))
        got_cumsum, got_arange = as_list(got_cumsum), as_list(got_arange)
    except NotImplementedError:
        raise
    except Exception as exc:
        raise AssertionError(
            f"_get_cumsum_and_arange({counts}) (a 70,000-token prompt in one step) raised "
            f"{exception_name(exc)}: {exc}; a step may hold any number of tokens, so build "
            "the offsets for THIS step's total, not from a table of a fixed size"
        ) from None
    want = [*range(70_000), 0, 1]
    assert got_cumsum == [70_000, 70_002] and got_arange == want, (
        f"_get_cumsum_and_arange({counts}): cumulative counts should be [70000, 70002], got "
        f"{got_cumsum}; offsets should be [0, 1, 2, ..., 69999, 0, 1], got "
        f"{got_arange[:4]} ... {got_arange[-4:]} ({len(got_arange)} offsets)"
    )


@graded(
    2,
    "make_block_tables: rows padded to the width with 0, the null block (never a real "
    "block id, never -1), int32, and a row wider than the table is an error",
    f"{DOC}#block-tables-and-the-null-block",
)
def test_make_block_tables_pads_with_the_null_block():
    """Ragged block lists become one rectangle."""
    m = runner("make_block_tables")
    tables = m.make_block_tables([[7, 3], [5, 9, 2], [4]], 4)
    assert np.asarray(tables).tolist() == [[7, 3, 0, 0], [5, 9, 2, 0], [4, 0, 0, 0]], (
        f"expected [[7, 3, 0, 0], [5, 9, 2, 0], [4, 0, 0, 0]] (padding = block 0), got "
        f"{np.asarray(tables).tolist()}"
    )
    assert np.asarray(tables).dtype == np.int32, "block tables are int32, as the kernels read them"
    equal = np.asarray(m.make_block_tables([[7, 3], [5, 9]], 4)).tolist()
    assert equal == [[7, 3, 0, 0], [5, 9, 0, 0]], (
        "rows of one length are padded to the width too: make_block_tables([[7, 3], [5, 9]], 4) "
        f"should be [[7, 3, 0, 0], [5, 9, 0, 0]], got {equal}"
    )
    single = np.asarray(m.make_block_tables([[7, 3]], 4)).tolist()
    assert single == [[7, 3, 0, 0]], (
        "a single row is padded to the width too (a step of one request): "
        f"make_block_tables([[7, 3]], 4) should be [[7, 3, 0, 0]], got {single}"
    )
    try:
        full = np.asarray(m.make_block_tables([[7, 3], [5]], 2)).tolist()
    except ValueError as exc:
        raise AssertionError(
            f"a row exactly as wide as the table fits (only a WIDER row is an error): "
            f"make_block_tables([[7, 3], [5]], 2) raised ValueError: {exc}"
        ) from None
    assert full == [[7, 3], [5, 0]], (
        f"a row exactly as wide as the table fits: make_block_tables([[7, 3], [5]], 2) should be "
        f"[[7, 3], [5, 0]], got {full}"
    )
    with pytest.raises(ValueError):
        m.make_block_tables([[1, 2, 3]], 2)


@graded(
    3,
    "compute_slot_mapping: slot = block_tables[req, pos // block_size] * block_size + "
    "pos % block_size, looked up in each token's OWN request's row; int64",
    f"{DOC}#the-slot-mapping",
)
def test_compute_slot_mapping():
    """Five tokens of two requests, one of them crossing two block boundaries."""
    m = runner("compute_slot_mapping")
    tables = np.array([[7, 3, 0], [5, 9, 2]], dtype=np.int32)
    slots = m.compute_slot_mapping(tables, np.array([0, 0, 1, 1, 1]), np.array([4, 5, 0, 7, 8]), 4)
    # req 0: pos 4, 5 -> block 3 -> 12, 13; req 1: pos 0 -> 5*4 = 20, pos 7 -> 9*4+3 = 39,
    # pos 8 -> 2*4 = 8
    assert as_list(slots) == [12, 13, 20, 39, 8], (
        f"expected slots [12, 13, 20, 39, 8], got {as_list(slots)}"
    )
    assert np.asarray(slots).dtype == np.int64, (
        "slots are int64: block_id * block_size overflows int32 on a big cache"
    )
    big = 2**28  # a block id int32 holds, whose first slot (2**32 with 16-token blocks) it does not
    tables = np.array([[big, 0]], dtype=np.int32)
    slots = m.compute_slot_mapping(tables, np.array([0, 0]), np.array([0, 5]), 16)
    want = [big * 16, big * 16 + 5]
    assert as_list(slots) == want, (
        f"block {big} with 16-token blocks: slots should be {want}, got {as_list(slots)}; "
        f"convert the block ids to int64 BEFORE multiplying (int32 wraps around past 2**31)"
    )


# -- prepare_inputs on the mixed batch -----------------------------------------------------------


@graded(
    3,
    "input_ids: for each request, token_ids[computed : computed + scheduled], in "
    "request order: cached tokens (prefix hits, earlier chunks) are skipped, and a "
    "decode runs the token sampled last (the end of token_ids)",
    f"{DOC}#tokens-and-positions",
)
def test_input_ids_skip_cached_tokens():
    """Only the tokens this step computes."""
    got = as_list(mixed_batch().input_ids)
    expected = [108, 109, 200, 201, 202, 203, 204, 305, 306, 307, 308, 309, 407, 508]
    assert got == expected, f"input_ids should be {expected}, got {got}"


@graded(
    3,
    "positions = num_computed_tokens[req] + offset inside the step: a prefix hit or an "
    "earlier chunk shifts the positions; RoPE is applied at these positions",
    f"{DOC}#tokens-and-positions",
)
def test_positions_start_at_the_computed_offset():
    """A prefix-hit prompt starts at 8, a second chunk at 5, a decode at its last index."""
    got = as_list(mixed_batch().positions)
    expected = [8, 9, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 7, 8]
    assert got == expected, f"positions should be {expected}, got {got}"


@graded(
    4,
    "slot_mapping: each token's K/V goes to its own request's block "
    "block_ids[pos // block_size], at offset pos % block_size",
    f"{DOC}#the-slot-mapping",
)
def test_slot_mapping_of_the_mixed_batch():
    """A: 13*4+0, 13*4+1; B: 21*4+0..3, 22*4+0; C: 32*4+1..3, 33*4+0..1; D: 42*4+3; E: 53*4."""
    got = as_list(mixed_batch().slot_mapping)
    expected = [52, 53, 84, 85, 86, 87, 88, 129, 130, 131, 132, 133, 171, 212]
    assert got == expected, f"slot_mapping should be {expected}, got {got}"


@graded(
    3,
    "query_start_loc is the CUMULATIVE count of scheduled tokens, starting at 0 "
    "([R + 1] entries); logits_indices is each request's last token, qsl[1:] - 1",
    f"{DOC}#query-start-locations-and-sequence-lengths",
)
def test_query_start_loc_and_logits_indices():
    """Request i owns tokens qsl[i]:qsl[i+1]; its next token is predicted at qsl[i+1] - 1."""
    inputs = mixed_batch()
    assert as_list(inputs.query_start_loc) == [0, 2, 7, 12, 13, 14], (
        f"query_start_loc should be [0, 2, 7, 12, 13, 14], got {as_list(inputs.query_start_loc)}"
    )
    assert as_list(inputs.logits_indices) == [1, 6, 11, 12, 13], (
        f"logits_indices should be [1, 6, 11, 12, 13], got {as_list(inputs.logits_indices)}"
    )
    assert inputs.max_query_len == 5, f"max_query_len should be 5, got {inputs.max_query_len}"


@graded(
    3,
    "seq_lens = num_computed_tokens + num_scheduled_tokens: the context a request "
    "attends to includes its cached tokens, not only this step's",
    f"{DOC}#query-start-locations-and-sequence-lengths",
)
def test_seq_lens_include_the_context():
    """Attention reads seq_lens[i] tokens of request i through its block table."""
    inputs = mixed_batch()
    assert as_list(inputs.seq_lens) == [10, 5, 10, 8, 9], (
        f"seq_lens should be [10, 5, 10, 8, 9], got {as_list(inputs.seq_lens)}"
    )
    assert inputs.max_seq_len == 10, f"max_seq_len should be 10, got {inputs.max_seq_len}"


@graded(
    3,
    "block_tables: one row per request, as wide as the widest table (or "
    "max_num_blocks_per_req), padded with 0, the null block",
    f"{DOC}#block-tables-and-the-null-block",
)
def test_block_tables_of_the_mixed_batch():
    """Rows of 2 blocks are padded to 3 with block 0; a fixed width pads further."""
    got = as_list(mixed_batch().block_tables)
    expected = [[11, 12, 13], [21, 22, 0], [31, 32, 33], [41, 42, 0], [51, 52, 53]]
    assert got == expected, f"block_tables should be {expected}, got {got}"
    got = as_list(mixed_batch(max_num_blocks_per_req=5).block_tables)
    expected = [
        [11, 12, 13, 0, 0],
        [21, 22, 0, 0, 0],
        [31, 32, 33, 0, 0],
        [41, 42, 0, 0, 0],
        [51, 52, 53, 0, 0],
    ]
    assert got == expected, (
        f"with max_num_blocks_per_req=5, block_tables should be {expected}, got {got}"
    )
    # The fixed width holds in every step: a shortcut for a decode-only step pads to it too.
    setting = "a decode-only step (3 and 17 known tokens, blocks of 16), max_num_blocks_per_req=4"
    inputs = runner("prepare_inputs").prepare_inputs(
        [[5, 6, 7], [*range(16), 99]], [2, 16], [1, 1], [[3], [8, 2]], 16, max_num_blocks_per_req=4
    )
    expect(inputs, "block_tables", [[3, 0, 0, 0], [8, 2, 0, 0]], setting)
    # A table may hold more blocks than this step's tokens need (allocated ahead): the width is
    # the widest TABLE, and the extra block is kept, not refused.
    setting = "decodes at positions 4 and 1 (4-token blocks) with tables [7, 8, 9] and [5]"
    try:
        inputs = runner("prepare_inputs").prepare_inputs(
            [[1, 2, 3, 4, 5], [6, 7]], [4, 1], [1, 1], [[7, 8, 9], [5]], 4
        )
    except ValueError as exc:
        raise AssertionError(
            f"{setting}: a table may hold more blocks than the tokens need (only a table too "
            f"SHORT is refused), but prepare_inputs raised ValueError: {exc}"
        ) from None
    expect(inputs, "block_tables", [[7, 8, 9], [5, 0, 0]], setting)
    expect(inputs, "slot_mapping", [8 * 4 + 0, 5 * 4 + 1], setting)
    # Only the call itself may refuse: what it returned is read after the try, so that a
    # ValueError from reading the result (a block_tables that raises when read) is not taken
    # for prepare_inputs' refusal (tests/hostile/refuse_when_the_result_is_read.py).
    try:
        narrow_inputs = mixed_batch(max_num_blocks_per_req=2)
    except ValueError:
        narrow_inputs = None
    narrow = None if narrow_inputs is None else as_list(narrow_inputs.block_tables)
    assert narrow is None, (
        f"with max_num_blocks_per_req=2, the 3-block tables of the mixed batch do not fit: "
        f"prepare_inputs must raise ValueError (the width is fixed, never widened), got "
        f"block_tables {narrow}"
    )


@graded(
    1,
    "dtypes as the model and kernels read them: int64 input_ids, positions, "
    "slot_mapping, logits_indices; int32 block_tables, query_start_loc, seq_lens; torch "
    "tensors on the CPU; max_query_len and max_seq_len plain Python ints; in every step (a "
    "decode-only step and blocks of one token too, not only the mixed batch)",
    f"{DOC}#the-step-as-tensors",
)
def test_dtypes_and_shapes():
    """The mixed batch (five requests, 14 tokens), a decode-only step and a step with blocks of
    one token: a shortcut for a common case must return the same dtypes as the general path."""
    import torch

    m = runner("prepare_inputs")
    batches = [
        ("the mixed batch", mixed_batch(), 5, 14, 3),
        (
            "a decode-only step (2 requests)",
            m.prepare_inputs([[5, 6, 7], [*range(16), 99]], [2, 16], [1, 1], [[3], [8, 2]], 16),
            2,
            2,
            2,
        ),
        (
            "a step with block_size 1 (3 tokens)",
            m.prepare_inputs([[10, 11, 12, 13, 14]], [2], [3], [[5, 6, 9, 4, 7]], 1),
            1,
            3,
            5,
        ),
    ]
    for setting, inputs, reqs, tokens, width in batches:
        want = {
            "input_ids": (torch.int64, (tokens,)),
            "positions": (torch.int64, (tokens,)),
            "slot_mapping": (torch.int64, (tokens,)),
            "logits_indices": (torch.int64, (reqs,)),
            "block_tables": (torch.int32, (reqs, width)),
            "query_start_loc": (torch.int32, (reqs + 1,)),
            "seq_lens": (torch.int32, (reqs,)),
        }
        for name, (dtype, shape) in want.items():
            tensor = getattr(inputs, name)
            assert isinstance(tensor, torch.Tensor), f"{setting}: {name} should be a torch tensor"
            assert tensor.dtype == dtype and tuple(tensor.shape) == shape, (
                f"{setting}: {name} should be {dtype} of shape {shape}, got {tensor.dtype} "
                f"{tuple(tensor.shape)}"
            )
        for name in ("max_query_len", "max_seq_len"):
            value = getattr(inputs, name)
            assert type(value) is int, (
                f"{setting}: {name} should be a plain Python int (ModelInputs declares it int), "
                f"got {describe(value)}: a numpy maximum is a numpy scalar, convert it with "
                "int(...)"
            )


@graded(
    1,
    "prepare_inputs is a pure function: the lists it is given are left as they were (pad, "
    "trim or add up in copies, never in the caller's lists), and the tensors it returns are "
    "that call's own (no module-level buffer that the next call overwrites)",
    f"{DOC}#the-step-as-tensors",
)
def test_arguments_are_left_unchanged():
    """The mixed batch, then its four lists compared with what was passed in; the same step
    again, read at once; then two more steps (one of the same shapes, then a smaller one), the
    first step's tensors read after each and compared with the second's."""
    m = runner("prepare_inputs")
    before = [TOKENS, COMPUTED, SCHEDULED, BLOCK_IDS]
    first = m.prepare_inputs(TOKENS, COMPUTED, SCHEDULED, BLOCK_IDS, BLOCK_SIZE)

    def check_unchanged(after: Any, when: str) -> None:
        """The first call's lists, read in the learner process ``when``, are as they were."""
        if type(after) is not list or len(after) != 5:
            raise AssertionError(f"the arguments came back as {describe(after)}")
        names = ["token_ids", "num_computed_tokens", "num_scheduled_tokens", "block_ids"]
        for name, want, got in zip(names, before, after):
            got = [list(row) if isinstance(row, list | tuple) else row for row in got]
            if got == want:
                continue
            if name in ("token_ids", "block_ids"):
                i = next((i for i, (a, b) in enumerate(zip(want, got)) if a != b), len(want))
                shown = f"{name}[{i}] was {want[i] if i < len(want) else '-'} and is now "
                shown += f"{got[i] if i < len(got) else '-'}"
            else:
                shown = f"{name} was {want} and is now {got}"
            raise AssertionError(
                f"prepare_inputs changed the caller's lists ({when}): {shown} (the scheduler "
                "owns them, and may still hold them after the call); build the padded table, "
                "the sums and the slices in new arrays"
            )

    check_unchanged(m.last_arguments[0], "right after the call")
    # What the first call's tensors must still hold is read from a second call of the same
    # step, at once; the first call's own are read only after the later calls. Read at once,
    # an object that copies a field out of a shared buffer the first time it is read would
    # hold its copy by then (tests/hostile/keep_the_step_only_once_it_is_read.py).
    again = m.prepare_inputs(TOKENS, COMPUTED, SCHEDULED, BLOCK_IDS, BLOCK_SIZE)
    seen = {name: as_list(getattr(again, name)) for name in TENSOR_FIELDS}
    # A step of the first step's shapes (5 requests, 14 tokens, 3-block rows) with other values,
    # right after it (two decode steps of one batch look alike), then a smaller one: a buffer
    # reused for a later step, sliced, kept per shape or kept for the last shape, shows.
    later = [
        (
            "a later call, of the first call's shapes (5 requests, 14 tokens, 3-block rows),",
            (
                [[t + 1000 for t in tokens] for tokens in TOKENS],
                [9, 11, 0, 7, 3],
                [1, 1, 5, 1, 6],
                [[61, 62, 63], [71, 72, 73], [81, 82], [91, 92], [14, 15, 16]],
                BLOCK_SIZE,
            ),
        ),
        (
            "a later call of prepare_inputs (2 requests, 3 tokens)",
            ([[5, 6, 7], [8, 9]], [2, 0], [1, 2], [[3], [4]], 16),
        ),
    ]
    for back, (which, args) in enumerate(later, start=2):  # the first call, counted back
        m.prepare_inputs(*args)
        check_unchanged(
            learner_module("learner_side").given_arguments(back), f"after {which.rstrip(',')}"
        )
        for name in TENSOR_FIELDS:
            now = as_list(getattr(first, name))
            assert now == seen[name], (
                f"{which} changed the tensors the first call returned: its "
                f"{name} should still be {seen[name][:8]} (as the same step's, prepared again) and "
                f"is {now[:8]}; a caller may still hold a "
                "step's inputs while it prepares the next, so build each call's arrays anew "
                "instead of reusing a module-level buffer (one per size or shape included)"
            )
    # A caller may write into the tensors it was given (on a CPU device the runner writes a late
    # decode's sampled token into input_ids itself: _forward_late_tokens): the same step prepared
    # again must not come back with those writes (an array memoized by its contents).
    rewritten = learner_module("learner_side").prepare_after_writing(
        TOKENS, COMPUTED, SCHEDULED, BLOCK_IDS, BLOCK_SIZE
    )
    for name in TENSOR_FIELDS:
        now = as_list(getattr(rewritten, name))
        assert now == seen[name], (
            f"the caller overwrote every tensor of a step's inputs with -7, then prepared the "
            f"same step again: its {name} should be {seen[name][:8]} and is {now[:8]}; the "
            "second call returned an array of the first (memoized by the step's contents): "
            "every call builds arrays of its own, since a caller may write into the ones it got"
        )


# -- other batches -----------------------------------------------------------------------------


@graded(
    3,
    "a decode-only step (the common case): one token per request, the last known "
    "token at position len - 1, written to the right block",
    f"{DOC}#the-step-as-tensors",
)
def test_decode_only_batch():
    """Three decodes with 16-token blocks, one of them the first token of its second block."""
    m = runner("prepare_inputs")
    inputs = m.prepare_inputs(
        [[5, 6, 7], [*range(16), 99], [1] * 30 + [42]],
        [2, 16, 30],
        [1, 1, 1],
        [[3], [8, 2], [4, 6]],
        16,
    )
    setting = "three decodes (3, 17 and 31 known tokens, blocks of 16)"
    expect(inputs, "input_ids", [7, 99, 42], setting)
    expect(inputs, "positions", [2, 16, 30], setting)
    expect(inputs, "slot_mapping", [3 * 16 + 2, 2 * 16 + 0, 6 * 16 + 14], setting)
    expect(inputs, "query_start_loc", [0, 1, 2, 3], setting)
    expect(inputs, "seq_lens", [3, 17, 31], setting)
    expect(inputs, "logits_indices", [0, 1, 2], setting)
    expect(inputs, "block_tables", [[3, 0], [8, 2], [4, 6]], setting)
    expect(inputs, "max_query_len", 1, setting)
    expect(inputs, "max_seq_len", 31, setting)


@graded(
    2,
    "block_size 1: every position is its own block, slot = block_ids[pos]",
    f"{DOC}#the-slot-mapping",
)
def test_block_size_one():
    """A prefix hit of 2 tokens, then 3 tokens in blocks 9, 4, 7."""
    m = runner("prepare_inputs")
    inputs = m.prepare_inputs([[10, 11, 12, 13, 14]], [2], [3], [[5, 6, 9, 4, 7]], 1)
    setting = "block_size 1, tokens 2..4 of [10 .. 14] in blocks [5, 6, 9, 4, 7]"
    expect(inputs, "input_ids", [12, 13, 14], setting)
    expect(inputs, "positions", [2, 3, 4], setting)
    expect(inputs, "slot_mapping", [9, 4, 7], setting)


@graded(
    2,
    "an inconsistent step is refused with ValueError: per-request lists of different "
    "lengths, an empty batch, and in ANY request (not only the first, the last or all of "
    "them) no scheduled token, more tokens than known (a one-token decode too), or a block "
    "table too short for its computed + scheduled tokens (the positions reach seq_len - 1)",
    f"{DOC}#the-step-as-tensors",
)
def test_inconsistent_steps_are_refused():
    """Garbage in must not become a silent wrong slot."""
    m = runner("prepare_inputs")
    ok = dict(token_ids=[[1, 2, 3]], num_computed_tokens=[0], num_scheduled_tokens=[3])
    ok |= dict(block_ids=[[1, 2]], block_size=2)
    two = dict(token_ids=[[1, 2, 3], [4, 5, 6]], num_computed_tokens=[0, 0])
    two |= dict(num_scheduled_tokens=[3, 3], block_ids=[[1, 2], [3, 4]], block_size=2)
    cases = [
        ("no scheduled token", ok | dict(num_scheduled_tokens=[0])),
        (
            "2 computed + 2 scheduled of 3 known tokens",
            ok | dict(num_computed_tokens=[2], num_scheduled_tokens=[2]),
        ),
        ("3 tokens, 2-token blocks, a table of 1 block", ok | dict(block_ids=[[1]])),
        (
            "3 tokens, 2-token blocks, a table of 1 block, max_num_blocks_per_req=2 (the "
            "padded row is 2 wide, but position 2 would fall in its padding, the null block: "
            "check the request's own block_ids, not the width)",
            ok | dict(block_ids=[[1]], max_num_blocks_per_req=2),
        ),
        ("request 1 of 2 has no scheduled token", two | dict(num_scheduled_tokens=[3, 0])),
        ("request 0 of 2 has no scheduled token", two | dict(num_scheduled_tokens=[0, 3])),
        (
            "request 0 of 2: 2 computed + 3 scheduled of 3 known tokens",
            two | dict(num_computed_tokens=[2, 0]),
        ),
        (
            "request 0 of 2: 3 tokens, 2-token blocks, a table of 1 block",
            two | dict(block_ids=[[1], [3, 4]]),
        ),
        (
            "request 1 of 2: 2 computed + 3 scheduled of 3 known tokens",
            two | dict(num_computed_tokens=[0, 2]),
        ),
        (
            "request 1 of 2: 3 tokens, 2-token blocks, a table of 1 block",
            two | dict(block_ids=[[1, 2], [3]]),
        ),
        # A decode is not exempt: one scheduled token past the known ones (the token it would
        # run was never appended) is as inconsistent as a prefill chunk running past them.
        (
            "a decode past its tokens: 3 computed + 1 scheduled of 3 known tokens (the token "
            "it would run was never appended)",
            ok | dict(num_computed_tokens=[3], num_scheduled_tokens=[1]),
        ),
        (
            "request 1 of 2 is a decode past its tokens: 3 computed + 1 scheduled of 3 known",
            two | dict(num_computed_tokens=[0, 3], num_scheduled_tokens=[3, 1]),
        ),
        (
            "2 computed + 1 scheduled, 2-token blocks, a table of 1 block (position 2 is in "
            "block 1)",
            ok | dict(num_computed_tokens=[2], num_scheduled_tokens=[1], block_ids=[[1]]),
        ),
        (
            "request 1 of 2: 2 computed + 1 scheduled, 2-token blocks, a table of 1 block "
            "(position 2 is in block 1: padding would give it the null block's slot)",
            two
            | dict(
                num_computed_tokens=[0, 2], num_scheduled_tokens=[3, 1], block_ids=[[1, 2], [3]]
            ),
        ),
        (
            "token_ids has 2 requests, the other lists 1",
            ok | dict(token_ids=[[1, 2, 3], [4, 5, 6]]),
        ),
        ("block_ids has 2 requests, the other lists 1", ok | dict(block_ids=[[1, 2], [3, 4]])),
        (
            "num_computed_tokens has 2 requests, the other lists 1",
            ok | dict(num_computed_tokens=[0, 0]),
        ),
        (
            "num_scheduled_tokens has 2 requests, the other lists 1",
            ok | dict(num_scheduled_tokens=[1, 1]),
        ),
        (
            "num_scheduled_tokens has 1 request, the other lists 2",
            two | dict(num_scheduled_tokens=[1]),
        ),
        (
            "an empty batch",
            dict(ok, token_ids=[], num_computed_tokens=[], num_scheduled_tokens=[], block_ids=[]),
        ),
        (
            "an empty batch, max_num_blocks_per_req=4",
            dict(
                ok,
                token_ids=[],
                num_computed_tokens=[],
                num_scheduled_tokens=[],
                block_ids=[],
                max_num_blocks_per_req=4,
            ),
        ),
    ]
    # The controls: the two steps every case below spoils are accepted as they are.
    for what, args in (("one request", ok), ("two requests", two)):
        try:
            m.prepare_inputs(**args)
        except ValueError as exc:
            raise AssertionError(
                f"the consistent step of {what} {args} was refused: {exc}; refuse only an "
                "inconsistent step"
            ) from None
    for what, args in cases:
        assert_value_error(f"{what}: prepare_inputs", lambda args=args: m.prepare_inputs(**args))


def _by_the_definition(tokens, computed, scheduled, block_ids, block_size):
    """The step, one token at a time, straight from the rules."""
    ids, pos, slots, starts = [], [], [], [0]
    for t, c, s, b in zip(tokens, computed, scheduled, block_ids):
        for p in range(c, c + s):
            ids.append(t[p])
            pos.append(p)
            slots.append(b[p // block_size] * block_size + p % block_size)
        starts.append(starts[-1] + s)
    return ids, pos, slots, starts, [c + s for c, s in zip(computed, scheduled)]


@st.composite
def steps(draw):
    block_size = draw(st.sampled_from([1, 2, 3, 4, 16]))
    num_reqs = draw(st.integers(1, 6))
    tokens, computed, scheduled, block_ids = [], [], [], []
    next_block = 1
    for _ in range(num_reqs):
        known = draw(st.integers(1, 40))
        done = draw(st.integers(0, known - 1))
        todo = draw(st.integers(1, known - done))
        tokens.append(draw(st.lists(st.integers(0, 1000), min_size=known, max_size=known)))
        computed.append(done)
        scheduled.append(todo)
        n = -(-(done + todo) // block_size)
        block_ids.append(list(range(next_block, next_block + n))[::-1])
        next_block += n
    return tokens, computed, scheduled, block_ids, block_size


@graded(
    3,
    "any batch: input_ids, positions, slot_mapping, query_start_loc and seq_lens equal "
    "a token-by-token application of the rules",
    f"{DOC}#the-step-as-tensors",
)
def test_random_batches_follow_the_rules():
    """Random mixes of prefills, chunks and decodes; any block size."""
    _random_batches_follow_the_rules(runner("prepare_inputs"))  # a stub stops here, at once


@GRADED_SETTINGS
@given(step=steps())
def _random_batches_follow_the_rules(mod: Any, step: Any) -> None:
    tokens, computed, scheduled, block_ids, block_size = step
    inputs = mod.prepare_inputs(tokens, computed, scheduled, block_ids, block_size)
    ids, pos, slots, qsl, lens = _by_the_definition(
        tokens, computed, scheduled, block_ids, block_size
    )
    assert as_list(inputs.input_ids) == ids, "input_ids differ from the rule"
    assert as_list(inputs.positions) == pos, "positions differ from the rule"
    assert as_list(inputs.slot_mapping) == slots, "slot_mapping differs from the rule"
    assert as_list(inputs.query_start_loc) == qsl, "query_start_loc differs from the rule"
    assert as_list(inputs.seq_lens) == lens, "seq_lens differ from the rule"
    assert as_list(inputs.logits_indices) == [q - 1 for q in qsl[1:]], (
        "logits_indices should be query_start_loc[1:] - 1"
    )


# -- cost ----------------------------------------------------------------------------------------

COST_REQS, COST_SMALL, COST_BIG, COST_CALLS = 8, 16, 1_600, 20
#: The most lines of Python the small cost step (8 requests of 16 tokens, one block each) may
#: run: the reference runs about 140; a loop per request or per block fits many times over.
#: Without a bound, lines run on the small step alone (an empty loop up to a fixed count) hid
#: the growth that the test measures (tests/hostile/lab_09_pad_the_small_steps_lines.py).
COST_SMALL_LINES = 2_000
#: The most bytecode instructions the small cost step may run (the reference runs about 780),
#: and how many more each more token may add: the steps hold one block per request
#: (``COST_BLOCK_SIZE``), so a loop per request or per block adds nothing as the tokens grow;
#: a comprehension over the tokens (about 20 a token) or an
#: expression of one term per token on a single line, which adds no line
#: (tests/hostile/lab_09_unroll_the_tokens_on_one_line.py), does not.
COST_SMALL_INSTRUCTIONS, COST_INSTRUCTIONS_PER_TOKEN = 10_000, 2.0


def _cost_summary(tokens_per_req: int) -> list[int]:
    """The cost step's token count, last position and last slot, from the rules: the last
    request's last token sits at 5 + tokens_per_req - 1, in its own blocks."""
    from tests.labs.lab_09.learner_side import COST_BLOCK_SIZE as size

    num_blocks = -(-(5 + tokens_per_req) // size)
    pos = 5 + tokens_per_req - 1
    block = 1 + (COST_REQS - 1) * num_blocks + pos // size
    return [COST_REQS * tokens_per_req, pos, block * size + pos % size]


@graded(
    2,
    "Cost: preparing a step runs no Python per token: the lines of Python that run grow "
    "with the requests (a loop per request is fine), not with their tokens; numpy does the "
    "per-token work (np.repeat, np.cumsum, fancy indexing, np.fromiter of itertools.chain: a "
    "generator expression over the tokens is Python per token too)",
    "labs/lab-09-engine/README.md#how-you-are-graded",
    timeout=30,
)
def test_no_python_work_per_token():
    """8 requests of 16 and of 1,600 scheduled tokens (128 and 12,800 in the step). The lines of
    Python that run in the call (a line trace of the calling thread, in the learner process,
    whatever file a line's code names: learner_side.lines_run) may grow by at most one for
    every 4 more tokens, which a loop per token or a comprehension over tokens exceeds and a
    loop per request or per block does not, from a small step of at most ``COST_SMALL_LINES``
    (lines spent on a small step alone cannot hide the growth); its bytecode instructions
    likewise, by at most two a token from ``COST_SMALL_INSTRUCTIONS`` (Python per token written
    on one line adds no line); the traced call's fields are read inside the trace and compared
    whole with the reference's. Then, the trace off, 20
    calls on each step are timed here, each call's fields read as it returns (exact tensors):
    the big step at most 60x the small one (the reference: about 12x of CPU), and under 10x
    what the reference takes in the judge for the same calls (CPU time, which nothing in the
    learner process can slow down)."""
    from mini_vllm.worker import model_inputs as reference
    from tests.labs.lab_09.learner_side import COST_BLOCK_SIZE, COST_FIELDS, cost_step

    runner("prepare_inputs")  # a stub stops here, NOT STARTED
    side = learner_module("learner_side")
    small, big = side.StepArgs(COST_REQS, COST_SMALL), side.StepArgs(COST_REQS, COST_BIG)
    lines, instructions = {}, {}
    for step, n in ((small, COST_SMALL), (big, COST_BIG)):
        # The traced call's fields, whole (read inside the trace: learner_side._fields).
        got = side.lines_run(step)
        ref = reference.prepare_inputs(*cost_step(COST_REQS, n))
        setting = (
            f"a step of {COST_REQS} requests of {n} scheduled tokens after 5 cached ones (blocks "
            f"of {COST_BLOCK_SIZE}, one a request)"
        )
        assert type(got) is list and len(got) == 2 + len(COST_FIELDS), (
            f"{setting}: {', '.join(COST_FIELDS)} should be torch tensors, got {str(got)[:200]}"
        )
        for name, value in zip(COST_FIELDS, got[2:]):
            want = getattr(ref, name).tolist()
            assert as_list(value) == want, (
                f"{setting}: {name} should be {want[:4]} ... {want[-4:]}, got "
                f"{str(as_list(value))[:200]}"
            )
        lines[n] = got[0]
        instructions[n] = got[1]
    assert lines[COST_SMALL] <= COST_SMALL_LINES, (
        f"prepare_inputs ran {lines[COST_SMALL]:,} lines of Python (your file's and any it "
        f"calls) for a step of {COST_REQS} requests of {COST_SMALL} tokens: at most "
        f"{COST_SMALL_LINES:,} (the reference runs about 140). The test compares this count "
        "with a big step's, so lines a small step runs for nothing would hide a cost per "
        "token; a loop per request is fine (README, 'How you are graded')"
    )
    more_tokens = COST_REQS * (COST_BIG - COST_SMALL)
    per_token = (lines[COST_BIG] - lines[COST_SMALL]) / more_tokens
    assert per_token <= 0.25, (
        f"prepare_inputs ran {lines[COST_BIG]:,} lines of Python (your file's and any it "
        f"calls) for a step of {COST_REQS * COST_BIG:,} tokens and {lines[COST_SMALL]:,} for "
        f"{COST_REQS * COST_SMALL:,} tokens (the same {COST_REQS} requests): {per_token:.2f} more "
        "for each more token. A Python loop per token (positions, slots or input ids built "
        "token by token, or a comprehension over the tokens) costs the engine at every step; "
        "build the per-token arrays with numpy (np.repeat, np.cumsum, fancy indexing, "
        "np.fromiter of itertools.chain, not of a generator expression over the tokens), as "
        "the README's 'How you are graded' says; a loop per request is fine"
    )
    assert instructions[COST_SMALL] <= COST_SMALL_INSTRUCTIONS, (
        f"prepare_inputs ran {instructions[COST_SMALL]:,} bytecode instructions for a step of "
        f"{COST_REQS} requests of {COST_SMALL} tokens: at most {COST_SMALL_INSTRUCTIONS:,} (the "
        "reference runs about 780); a loop per request is fine (README, 'How you are graded')"
    )
    per_token = (instructions[COST_BIG] - instructions[COST_SMALL]) / more_tokens
    assert per_token <= COST_INSTRUCTIONS_PER_TOKEN, (
        f"prepare_inputs ran {instructions[COST_BIG]:,} bytecode instructions for a step of "
        f"{COST_REQS * COST_BIG:,} tokens and {instructions[COST_SMALL]:,} for "
        f"{COST_REQS * COST_SMALL:,} tokens (the same {COST_REQS} requests): {per_token:.1f} "
        "more for each more token. Python runs per token even on one line (an expression with "
        "a term per token); build the per-token arrays with numpy (np.repeat, np.cumsum, fancy "
        "indexing), as the README's 'How you are graded' says; a loop per request is fine"
    )

    args = cost_step(COST_REQS, COST_BIG)
    yardstick = judge_seconds(lambda: [reference.prepare_inputs(*args) for _ in range(COST_CALLS)])
    times = {}
    for step, n in ((small, COST_SMALL), (big, COST_BIG)):

        def one_run(step=step, n=n) -> float:
            # Each call's fields are read as it returns (learner_side.run_steps).
            seconds, got = timed_call(side.run_steps, step, COST_CALLS)
            assert got == _cost_summary(n), (
                f"{COST_CALLS} calls on a step of {COST_REQS} requests of {n} tokens: the last "
                f"one's [tokens, last position, last slot] should be {_cost_summary(n)}, got "
                f"{str(got)[:200]}"
            )
            return seconds

        times[n] = best_time(one_run, repeat=5)
    t_small, t_big = times[COST_SMALL], times[COST_BIG]
    assert_cost_does_not_grow(
        t_small,
        t_big,
        lambda ratio, ceiling: (
            f"{COST_CALLS} calls of prepare_inputs took {t_big * 1e3:.1f} ms on a step of "
            f"{COST_REQS * COST_BIG:,} tokens vs {t_small * 1e3:.1f} ms on "
            f"{COST_REQS * COST_SMALL:,} tokens ({ratio:.0f}x; at most 60x, and "
            f"{ceiling * 1e3:.0f} ms on this machine, 10x the reference's time): Python work "
            "per token; build the per-token arrays with numpy (README, 'How you are graded')"
        ),
        max_ratio=60.0,
        ceiling=max(0.05, 10 * yardstick),
    )
