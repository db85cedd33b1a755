# base: solution
# lab: lab-09
# tests: test_no_python_work_per_token, test_decode_only_batch
# honest: import inspect as _i; exec(compile(_i.getsource(prepare_inputs).replace("slot_mapping = compute_slot_mapping(block_tables, req_indices, positions, block_size)", "slot_mapping = np.array([int(block_tables[r, p // block_size]) * block_size + p % block_size for r, p in zip(req_indices.tolist(), positions.tolist())], dtype=np.int64)"), __file__, "exec"))
"""``prepare_inputs`` computes the slot mapping in Python per token (the honest bug: a
comprehension over the tokens), written as one expression of a term per token on a single
line: the text ``T[R[0]][P[0]//S]*S+P[0]%S, T[R[1]]...`` made by ``str.format`` mapped over a
range (C, no Python line), compiled once per token count into a lambda and cached. Every step
then runs its per-token bytecode on one line, and lab-09's cost test, which counted lines,
saw the same 128 lines for 128 tokens and for 12,800; the timing backstop (10x the
reference's time, at least 50 ms for 20 calls) let it keep the test's 2 points, 57/57 for an
honest 55/57 (a red-team helper). Defended since: ``learner_side.lines_run`` counts bytecode
instructions too, whose growth per token is bounded."""

import inspect as _i

exec(
    compile(
        _i.getsource(prepare_inputs).replace(
            "slot_mapping = compute_slot_mapping(block_tables, req_indices, positions, block_size)",
            "slot_mapping = np.array(_one_line(len(positions))(block_tables.tolist(),"
            " req_indices.tolist(), positions.tolist(), block_size), dtype=np.int64)",
        ),
        __file__,
        "exec",
    )
)
_codes = {}


def _one_line(n):
    """The slot formula unrolled into one expression of ``n`` terms, on one line."""
    code = _codes.get(n)
    if code is None:
        body = ",".join(map("T[R[{0}]][P[{0}]//S]*S+P[{0}]%S".format, range(n)))
        code = _codes[n] = eval("lambda T, R, P, S: [" + body + "]")
    return code
