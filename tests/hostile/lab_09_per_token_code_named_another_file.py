# base: solution
# lab: lab-09
# tests: test_no_python_work_per_token, test_decode_only_batch
# honest: import inspect as _i; exec(compile(_i.getsource(prepare_inputs).replace("slot_mapping = compute_slot_mapping(block_tables, req_indices, positions, block_size)", "slot_mapping = np.array([int(block_tables[r, p // block_size]) * block_size + p % block_size for r, p in zip(req_indices.tolist(), positions.tolist())], dtype=np.int64)"), __file__, "exec"))
"""``prepare_inputs`` computes the slot mapping in a comprehension over the tokens (the honest
bug: Python work per token at every step). The attack compiles the same function under numpy's
file name: lab-09's cost test counted only the lines of code whose ``co_filename`` was the
learner's file, so none of its per-token lines counted, and the timing backstop (10x the
reference's time; the bug costs about 5x) let it keep the test's 2 points (a red-team
helper)."""

import inspect as _i

exec(
    compile(
        _i.getsource(prepare_inputs).replace(
            "slot_mapping = compute_slot_mapping(block_tables, req_indices, positions, block_size)",
            "slot_mapping = np.array([int(block_tables[r, p // block_size]) * block_size"
            " + p % block_size for r, p in zip(req_indices.tolist(), positions.tolist())],"
            " dtype=np.int64)",
        ),
        np.__file__,  # a library's file name: not the learner's, so not traced
        "exec",
    )
)
