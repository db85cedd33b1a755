# base: solution
# lab: lab-09
# tests: test_no_python_work_per_token, test_decode_only_batch
# honest: import inspect as _i; exec(compile(_i.getsource(prepare_inputs).replace("slot_mapping = compute_slot_mapping(block_tables, req_indices, positions, block_size)", "slot_mapping = np.array([int(block_tables[r, p // block_size]) * block_size + p % block_size for r, p in zip(req_indices.tolist(), positions.tolist())], dtype=np.int64)"), __file__, "exec"))
"""``prepare_inputs`` computes the slot mapping in a comprehension over the tokens (the honest
bug: Python work per token at every step). The attack also runs an empty loop of as many lines
as the step has tokens fewer than 13,000, so that every step up to that size runs about 13,000
lines: lab-09's cost test bounded only the growth of the line count from a step of 128 tokens
to one of 12,800, which the padding of the small step hid, and the timing backstop (10x the
reference's time) let it keep the test's 2 points (a red-team helper)."""

import inspect as _i

exec(
    compile(
        _i.getsource(prepare_inputs).replace(
            "slot_mapping = compute_slot_mapping(block_tables, req_indices, positions, block_size)",
            "slot_mapping = np.array([int(block_tables[r, p // block_size]) * block_size"
            " + p % block_size for r, p in zip(req_indices.tolist(), positions.tolist())],"
            " dtype=np.int64)",
        ),
        __file__,  # the learner's own file: its lines are traced as the honest bug's are
        "exec",
    )
)
_per_token = prepare_inputs


def prepare_inputs(*args, **kwargs):
    tokens = sum(args[2]) if len(args) > 2 else 0
    for _ in range(max(0, 13_000 - tokens) // 2):  # two lines a pass: the for and the pass
        pass
    return _per_token(*args, **kwargs)
